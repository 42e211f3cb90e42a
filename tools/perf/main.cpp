// talaria-perf: command line.
//   talaria-perf                                   the default set on sm and tcp (< 1 minute)
//   talaria-perf na --transport sm,tcp [options]   measure the na layer (starts its own server)
//   talaria-perf rpc [bulk] [options]              the rpc (and bulk) layers, one server
//   talaria-perf demo                              the RPC demo (rpc + bulk + api, mostly busy)
//   talaria-perf serve na --transport tcp --listen tcp://0.0.0.0:5000
//   talaria-perf na --transport tcp --connect tcp://10.0.0.2:5000 [--ctl 10.0.0.2:5001]
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "app.hpp"
#include "backend.hpp"
#include "talaria/config.hpp"
#include "talaria/version.hpp"
#if TALARIA_HAVE_OFI
#include "raw_ofi_rma.hpp"
#endif
#include "talaria/util/log.hpp"

int main(int argc, char** argv) {
    using namespace talaria::perf;
    // libfabric's rxm settings docs/transports.md recommends (read from the environment only;
    // the library does not set them). The user's values win; the spawned server inherits them.
    for (const auto& e : talaria::na::recommended_env())
        ::setenv(e.name, e.value, 0);
    CLI::App app{
        "talaria-perf: Talaria benchmarks with raw baselines measured in the same run.\n"
        "Without arguments: the default set on sm and tcp, against a server it starts itself."};
    app.require_subcommand(0, 0);  // several layers may be named: `rpc bulk`
    app.set_version_flag("--version",
                         std::string("talaria-perf ") + std::string(talaria::version().string));

    ClientOptions c;
    for (int i = 0; i < argc; ++i)
        c.command_line += (i ? " " : "") + std::string(argv[i]);
    std::string log_spec;
    unsigned rep_ms = 40;
    std::string pvm_iov = "0";

    // Client options live on the top-level app; each layer subcommand falls through to them.
    app.add_option("--transport,-t", c.transports,
                   "Transports to measure: sm, tcp, ofi+<provider> (ofi+tcp, ofi+shm), "
                   "ucx+<transports> (ucx+tcp, ucx+sm), where built (default: sm,tcp)")
        ->delimiter(',');
    app.add_option("--pattern,-p", c.patterns,
                   "na: pingpong, blast, put, get; rpc: pingpong, rate, first; bulk: pull, push; "
                   "api: pingpong, rate "
                   "(default: the layer's, first on tcp only)")
        ->delimiter(',');
    app.add_option("--mode,-m", c.modes, "busy (progress(0) loop), block (long progress timeout)")
        ->delimiter(',');
    app.add_option("--size,-s", c.sizes,
                   "Sizes, e.g. 8,4K,1M,16M (default: 8 pingpong; 8,4K blast; put/get 1M,16M on "
                   "sm, 16M on tcp; rpc: 0 (empty arguments); pull/push 4K,64K,1M,16M)")
        ->delimiter(',');
    app.add_option("--inflight,-n", c.inflight, "Messages in flight for blast")
        ->capture_default_str();
    app.add_option("--rma-inflight", c.rma_inflight,
                   "Operations in flight for put/get and transfers for pull/push")
        ->capture_default_str();
    app.add_option("--rate-inflight", c.rate_inflight,
                   "Calls in flight for rpc rate (default 1,16)")
        ->delimiter(',');
    app.add_option("--contexts,-k", c.contexts,
                   "api: server contexts = client threads, each on its own context pair "
                   "(default 1), e.g. 1,2,4")
        ->delimiter(',')
        ->check(CLI::Range(1u, 64u));
    app.add_option("--procs", c.procs,
                   "api: client processes, each with --contexts threads; the server gets "
                   "contexts x procs contexts (default 1), e.g. 1,2")
        ->delimiter(',')
        ->check(CLI::Range(1u, 64u));
    app.add_option("--consume", c.consume,
                   "api: how a caller takes results: get, then, coawait (default: all)")
        ->delimiter(',');
    app.add_option("--reps,-r", c.repeat.reps, "Repetitions of each measurement")
        ->capture_default_str()
        ->check(CLI::Range(1u, 101u));
    app.add_option("--iters,-i", c.repeat.fixed_iters,
                   "Iterations per repetition (default: calibrated to --rep-ms)");
    app.add_option("--rep-ms", rep_ms, "Target duration of one repetition")
        ->capture_default_str()
        ->check(CLI::Range(1u, 60000u));
    app.add_option("--json", c.json_path, "Write the results as a JSON array to this file");
    app.add_option("--csv", c.csv_path,
                   "Write the results as CSV to this file (the JSON fields, one line each)");
    app.add_flag("--no-goals", c.no_goals,
                 "Leave the project's goal column out of the table (JSON and CSV keep it)");
    app.add_option("--connect", c.connect,
                   "Measure against a server started separately (its address=), e.g. "
                   "tcp://10.0.0.2:5000");
    app.add_option("--ctl", c.ctl,
                   "That server's control address (its ctl=; default for tcp: host:port+1)");
    app.add_option("--url", c.url, "Address the client opens its transport with");
    app.add_option("--client-cpu", c.client_cpu, "Pin the client to this CPU (-1: do not pin)");
    app.add_option("--server-cpu", c.server_cpu, "Pin the spawned server to this CPU");
    app.add_option("--pvm-iov", pvm_iov,
                   "process_vm_* baseline iovec size (0: one iovec per transfer)");
    unsigned block_spin_us = 30;
    app.add_option("--block-spin-us", block_spin_us,
                   "Block-mode shm baselines spin this long before FUTEX_WAIT (0: sleep at once)")
        ->capture_default_str()
        ->check(CLI::Range(0u, 1000000u));
    bool single = false;
    app.add_flag("--single-thread", single,
                 "Open transports with thread_safe=false (default: the library default, true)");
    app.add_option("--realtime", c.realtime,
                   "Run client and spawned server SCHED_FIFO at this priority, so that other "
                   "work on a shared host does not preempt busy polling (it starves that work "
                   "meanwhile: use for short runs)")
        ->check(CLI::Range(1, 99));
    app.add_flag(
        "--no-stats", [&c](std::int64_t) { c.api_stats = false; },
        "The api layer's engines (client and server) keep no per-procedure statistics "
        "(EngineOptions::core.stats off): measures what they cost");
    app.add_flag("--no-baseline", c.no_baseline,
                 "Skip the raw baselines (to profile the layer alone)");
    app.add_option("--log", log_spec, "Log levels, like TALARIA_LOG (e.g. warn,perf=info)");
    app.add_option("--auth-secret-file", c.auth_file,
                   "Authenticate peers with this secret (na::Options::auth on tcp, ofi and "
                   "ucx+tcp host:port, key id "
                   "'talaria-perf'; a file of 16+ bytes only its owner can read), on both sides");
    app.add_option("--protect", c.protect,
                   "With --auth-secret-file on tcp: protect every record after the handshake "
                   "(na::Auth::protect): none, integrity or encryption")
        ->check(CLI::IsMember({"none", "integrity", "encryption"}));

    std::vector<CLI::App*> layer_cmds;
    for (const auto& layer : layers()) {
        auto* sub = app.add_subcommand(std::string(layer.name),
                                       fmt::format("Measure the {} layer", layer.name));
        sub->fallthrough();
        layer_cmds.push_back(sub);
    }
    auto* demo = app.add_subcommand(
        "demo",
        "The RPC demo: rpc ping-pong (busy and block), rate (1 and 16 in flight) and first call "
        "(tcp), bulk pull/push 4K..16M, and the api layer (get, then, coawait) against the core "
        "layer, on sm and tcp, with the raw baselines");
    demo->fallthrough();

    ServeOptions s;
    auto* serve = app.add_subcommand("serve", "Run the server side (prints its addresses)");
    serve->require_subcommand(1);
    serve
        ->add_option("--transport,-t", s.transport,
                     "The transport to serve (sm, tcp, ofi+<provider>, ucx+<transports>)")
        ->required();
    serve->add_option("--listen", s.listen,
                      "Address to open the transport with (default <scheme>:// for shared "
                      "memory, <scheme>://127.0.0.1:0 otherwise)");
    serve->add_option("--ctl-listen", s.ctl_listen,
                      "Control address (default: tcp port + 1, or an ephemeral loopback port)");
    serve->add_option("--cpu", s.cpu, "Pin the server to this CPU");
    serve->add_flag("--once", s.once, "Exit after one client session");
    serve->add_option("--realtime", s.realtime, "Run SCHED_FIFO at this priority")
        ->check(CLI::Range(1, 99));
    bool serve_single = false;
    serve->add_flag("--single-thread", serve_single, "Open the transport with thread_safe=false");
    serve->add_option("--log", log_spec, "Log levels, like TALARIA_LOG");
    serve->add_option("--auth-secret-file", s.auth_file, "As for the client");
    serve->add_option("--protect", s.protect, "As for the client");
    std::vector<CLI::App*> serve_layers;
    for (const auto& layer : layers()) {
        auto* sub = serve->add_subcommand(std::string(layer.name),
                                          fmt::format("Serve the {} layer", layer.name));
        sub->fallthrough();
        serve_layers.push_back(sub);
    }

#if TALARIA_HAVE_OFI
    // The raw libfabric RMA baseline's two halves (spawned by the ofi baseline; hidden).
    RawOfiRmaOptions rma;
    std::string rma_role;
    auto* raw_rma = app.add_subcommand("raw-ofi-rma", "")->group("");
    raw_rma->add_option("role", rma_role, "server or client")
        ->required()
        ->check(CLI::IsMember({"server", "client"}));
    raw_rma->add_option("--provider", rma.provider)->required();
    raw_rma->add_option("--node", rma.node);
    raw_rma->add_option("--host", rma.host);
    raw_rma->add_option("--port", rma.port)->required();
    std::string rma_dir = "read";
    raw_rma->add_option("--op", rma_dir)->check(CLI::IsMember({"read", "write"}));
    std::string rma_size = "1M";
    raw_rma->add_option("--size", rma_size);
    raw_rma->add_option("--inflight", rma.inflight);
    raw_rma->add_option("--iters", rma.iters);
    raw_rma->add_option("--warmup", rma.warmup);
    raw_rma->add_option("--timeout-s", rma.timeout_s);
#endif

    // One extra client process of `api --procs P` (spawned by the api layer; hidden).
    ApiWorkerOptions worker;
    auto* api_worker = app.add_subcommand("api-worker", "")->group("");
    api_worker->add_option("--url", worker.url)->required();
    api_worker->add_option("--server", worker.server)->required();
    api_worker->add_option("--contexts", worker.contexts)->check(CLI::Range(1u, 64u));
    api_worker->add_option("--first", worker.first)->check(CLI::Range(0u, 63u));
    api_worker->add_option("--auth-secret-file", worker.auth_file);
    api_worker->add_option("--protect", worker.protect);
    api_worker->add_flag("--no-stats", [&worker](std::int64_t) { worker.stats = false; });

    OverloadOptions ov;
    auto* overload = app.add_subcommand(
        "overload",
        "A server under a flood: a good client's p50/p99 alone and while --flooders threads "
        "call as fast as they can; the flood's answers and busy refusals; the server's RSS");
    overload->add_option("--transport,-t", ov.transport, "sm, tcp, ofi+tcp, ucx+tcp, ...")
        ->capture_default_str();
    overload->add_option("--flooders", ov.flooders, "Flooding threads (one engine)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 1024u));
    overload->add_option("--flood-inflight", ov.flood_inflight, "Calls each flooder keeps going")
        ->capture_default_str()
        ->check(CLI::Range(1u, 4096u));
    overload->add_option("--seconds", ov.seconds, "Length of each good-client measurement")
        ->capture_default_str()
        ->check(CLI::Range(1u, 600u));
    overload
        ->add_option("--hold-us", ov.hold_us,
                     "The server keeps each request this long before answering (0: inline)")
        ->capture_default_str();
    overload->add_option("--max-requests", ov.max_requests, "Server: core::Options::max_requests")
        ->capture_default_str();
    overload
        ->add_option("--max-per-peer", ov.max_per_peer,
                     "Server: core::Options::max_requests_per_peer")
        ->capture_default_str();
    overload->add_option("--window", ov.window, "Flooders' core::Options::peer_window (0: none)")
        ->capture_default_str();
    overload
        ->add_option("--flood-nice", ov.flood_nice,
                     "Niceness of the flooding engine's threads (19: they take only idle cycles, "
                     "standing for clients on other hosts on a machine with few cores)")
        ->capture_default_str()
        ->check(CLI::Range(0, 19));
    unsigned good_retries = 0;
    overload->add_option("--good-retries", good_retries, "The good client's retry_busy attempts")
        ->capture_default_str()
        ->check(CLI::Range(0u, 255u));

    GroupBenchOptions gb;
    auto* group = app.add_subcommand(
        "group",
        "Collective calls over N ranks of this machine (rank 0 here, the others child "
        "processes): broadcast + reduce latency against ceil(log_k N) x the round trip of the "
        "same run; with --detect, SWIM failure detection under load and after a SIGKILL");
    group->add_option("--transport,-t", gb.transport, "tcp, sm, ofi+tcp, ucx+tcp, ...")
        ->capture_default_str();
    group->add_option("--ranks", gb.ranks, "Group sizes (comma-separated)")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::Range(1u, 256u));
    group->add_option("-k", gb.k, "Tree radixes (comma-separated)")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::Range(2u, 64u));
    group->add_option("--calls", gb.calls, "Timed calls per point")
        ->capture_default_str()
        ->check(CLI::Range(10u, 10000000u));
    group->add_flag("--detect", gb.detect, "Measure failure detection on the largest group");
    group->add_option("--period-ms", gb.period_ms, "SWIM period")->capture_default_str();
    group->add_option("--suspicion-ms", gb.suspicion_ms, "SWIM suspicion time")
        ->capture_default_str();
    group
        ->add_option("--load-inflight", gb.load_inflight,
                     "Calls each rank keeps in flight while detection runs (0: none)")
        ->capture_default_str();
    group->add_option("--load-seconds", gb.load_seconds, "How long the load runs before the kill")
        ->capture_default_str();
    group
        ->add_option("--hosts", gb.hosts,
                     "Ranks on H hosts emulated by scripts/hosts (run 'scripts/hosts up H' first, "
                     "as root): rank r in talaria-h<r % H>, over tcp-like transports")
        ->check(CLI::Range(0u, 250u));

    CLI11_PARSE(app, argc, argv);
    std::signal(SIGPIPE, SIG_IGN);  // a peer that dies shows up as an error, not a signal

    if (!log_spec.empty()) {
        if (!talaria::log::configure(log_spec)) {
            fmt::print(stderr, "talaria-perf: bad --log spec '{}'\n", log_spec);
            return 2;
        }
        ::setenv("TALARIA_LOG", log_spec.c_str(), 1);  // the spawned server inherits it
    }

#if TALARIA_HAVE_OFI
    if (raw_rma->parsed()) {
        auto sz = parse_size(rma_size);
        if (!sz) {
            fmt::print(stderr, "talaria-perf raw-ofi-rma: --size: {}\n", sz.error().describe());
            return 2;
        }
        rma.size = *sz;
        rma.server = rma_role == "server";
        rma.write = rma_dir == "write";
        return run_raw_ofi_rma(rma);
    }
#endif
    if (api_worker->parsed()) return run_api_worker(worker);
    if (group->parsed()) return run_group_bench(gb);
    if (overload->parsed()) {
        ov.good_retries = uint8_t(good_retries);
        return run_overload(ov);
    }
    if (serve->parsed()) {
        for (std::size_t i = 0; i < serve_layers.size(); ++i)
            if (serve_layers[i]->parsed()) s.layer = serve_layers[i]->get_name();
        s.thread_safe = !serve_single;
        return run_serve(s);
    }
    for (auto* sub : app.get_subcommands())  // in command-line order
        for (auto* l : layer_cmds)
            if (sub == l) c.layers.push_back(l->get_name());
    if (demo->parsed()) {
        c.demo = true;
        c.layers = {"rpc", "bulk", "api"};
    }
    c.thread_safe = !single;
    c.repeat.rep_time = std::chrono::milliseconds(rep_ms);
    auto iov = parse_size(pvm_iov);
    if (!iov) {
        fmt::print(stderr, "talaria-perf: --pvm-iov: {}\n", iov.error().describe());
        return 2;
    }
    c.baseline.pvm_iov_bytes = *iov;
    c.baseline.block_spin = std::chrono::microseconds(block_spin_us);
    return run_client(c);
}
