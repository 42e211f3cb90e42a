// talaria-perf client: builds the measurement list, runs one server per transport, measures the
// layer and the raw baseline of every spec, prints the table and writes --json.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "app.hpp"
#include "backend.hpp"
#include "control.hpp"
#include "perf_commit.hpp"
#include "talaria/util/log.hpp"
#include "talaria/version.hpp"
#include "transports.hpp"

namespace talaria::perf {

namespace {

constexpr std::size_t kKi = 1024, kMi = 1024 * 1024;
constexpr uint64_t kFirstMaxIters = 40;

std::vector<std::size_t> default_sizes(std::string_view layer, Pattern p,
                                       std::string_view transport) {
    switch (p) {
        case Pattern::pingpong:
            return {layer == "rpc" ? 0u : 8u};  // rpc: empty arguments and result
        case Pattern::rate:
            return {layer == "api" || layer == "hg" ? 8u : 0u};  // api, hg: echo(uint64_t)
        case Pattern::first:
            return {0};
        case Pattern::blast:
            return {8, 4 * kKi};
        case Pattern::put:
        case Pattern::get:
            if (is_shared_memory(transport)) return {1 * kMi, 16 * kMi};
            return {16 * kMi};
        case Pattern::pull:
        case Pattern::push:
            if (layer == "hg") return {1 * kMi, 16 * kMi};
            return {4 * kKi, 64 * kKi, 1 * kMi, 16 * kMi};
    }
    return {8};
}

/// The layer's patterns a run measures when --pattern is not given. The first call to a new
/// peer is a measurement of the transports over IP (connection set-up: tcp, ofi+tcp,
/// ucx+tcp); ask for it explicitly on shared memory.
bool default_pattern(Pattern p, std::string_view transport) {
    return p != Pattern::first || is_ip_transport(transport);
}

Result<std::vector<Spec>> build_specs(const ClientOptions& o) {
    std::vector<std::string> transports = o.transports;
    if (transports.empty()) transports = {"sm", "tcp"};
    std::vector<std::string> layer_names = o.layers;
    if (layer_names.empty()) layer_names = {"na"};
    std::vector<const Layer*> layer_list;
    for (const auto& n : layer_names) {
        const Layer* l = find_layer(n);
        if (!l) return Error(Errc::invalid_argument, fmt::format("unknown layer '{}'", n));
        if (!layer_list.empty() && !shares_server(*layer_list.front(), *l))
            return Error(Errc::invalid_argument,
                         fmt::format("layers '{}' and '{}' need different servers: measure them "
                                     "in separate runs",
                                     layer_list.front()->name, n));
        layer_list.push_back(l);
    }
    std::vector<Pattern> patterns;
    for (const auto& p : o.patterns) {
        TALARIA_TRY(v, parse_pattern(p));
        patterns.push_back(v);
    }
    std::vector<Mode> modes;
    for (const auto& m : o.modes) {
        TALARIA_TRY(v, parse_mode(m));
        modes.push_back(v);
    }
    std::vector<unsigned> rate_inflight = o.rate_inflight;
    if (rate_inflight.empty()) rate_inflight = {1, 16};
    for (unsigned& n : rate_inflight)
        n = std::max(1u, n);
    std::vector<std::size_t> sizes;
    for (const auto& s : o.sizes) {
        TALARIA_TRY(v, parse_size(s));
        sizes.push_back(v);
    }
    std::vector<Spec> specs;
    for (const auto& t : transports) {
        TALARIA_TRY(family, transport_family(t));
        (void)family;
        for (const Layer* layer : layer_list) {
            std::vector<Pattern> lp;
            for (Pattern p : layer->patterns) {
                // The demo measures the api layer's calls; its transfers are the bulk layer's
                // with a future each, measured when asked for (talaria-perf api -p pull,push).
                if (o.demo && layer->name == "api" && (p == Pattern::pull || p == Pattern::push))
                    continue;
                if (patterns.empty()
                        ? default_pattern(p, t)
                        : std::find(patterns.begin(), patterns.end(), p) != patterns.end())
                    lp.push_back(p);
            }
            for (Pattern p : lp) {
                for (std::size_t size : sizes.empty() ? default_sizes(layer->name, p, t) : sizes) {
                    // rpc calls may carry no arguments; everything else moves at least a byte.
                    // With several layers a size 0 is the rpc layer's, and the others skip it.
                    if (size == 0 && layer->name != "rpc" && layer_list.size() > 1) continue;
                    if (size == 0 && layer->name != "rpc")
                        return Error(Errc::invalid_argument,
                                     "--size 0: sizes start at 1 byte (a raw TCP baseline cannot "
                                     "wait for 0 bytes, and put/get of nothing moves nothing); "
                                     "only the rpc layer takes empty arguments");
                    std::vector<unsigned> inflights{1};
                    if (p == Pattern::blast) inflights = {std::max(1u, o.inflight)};
                    if (p == Pattern::put || p == Pattern::get || p == Pattern::pull ||
                        p == Pattern::push)
                        inflights = {std::max(1u, o.rma_inflight)};
                    if (p == Pattern::rate) inflights = rate_inflight;
                    std::vector<Mode> pm = modes;
                    if (pm.empty()) {
                        // The demo: busy everywhere, and the ping-pong blocking as well.
                        pm.push_back(Mode::busy);
                        if (!o.demo || p == Pattern::pingpong) pm.push_back(Mode::block);
                    }
                    // api: every contexts count x way of consuming results.
                    std::vector<unsigned> ks{1};
                    std::vector<unsigned> ps{1};
                    std::vector<Consume> cs{Consume::none};
                    const bool transfer = p == Pattern::pull || p == Pattern::push;
                    if (layer->name == "hg") {
                        // Its baseline, the C++ API (api back end), takes results with get(),
                        // on one context in one process, as the C program does.
                        cs = {Consume::get};
                        if (!transfer && size != 8)
                            return Error(Errc::invalid_argument,
                                         fmt::format("--size {}: the hg layer calls an 8-byte "
                                                     "echo; pass --size 8, or give sizes to "
                                                     "pull and push only",
                                                     size));
                    } else if (layer->name == "api" && transfer) {
                        cs = {Consume::get};  // pull and push: futures taken with get()
                    } else if (layer->name == "api") {
                        if (!o.contexts.empty()) ks = o.contexts;
                        if (!o.procs.empty()) ps = o.procs;
                        cs.clear();
                        for (const auto& c : o.consume) {
                            TALARIA_TRY(v, parse_consume(c));
                            cs.push_back(v);
                        }
                        if (cs.empty()) cs = {Consume::get, Consume::then, Consume::coawait};
                        if (size != 8)
                            return Error(Errc::invalid_argument,
                                         fmt::format("--size {}: the api layer measures an "
                                                     "8-byte echo (uint64_t echo(uint64_t)) "
                                                     "only; pass --size 8, or run the api "
                                                     "layer on its own",
                                                     size));
                    }
                    for (unsigned k : ks)
                        for (unsigned procs : ps)
                            for (Consume c : cs)
                                for (unsigned n : inflights)
                                    for (Mode m : pm) {
                                        Spec s;
                                        s.layer = layer->name;
                                        s.transport = t;
                                        s.pattern = p;
                                        s.mode = m;
                                        s.size = size;
                                        s.inflight = n;
                                        s.contexts = k;
                                        s.procs = procs;
                                        s.consume = c;
                                        specs.push_back(s);
                                    }
                }
            }
        }
    }
    if (specs.empty())
        return Error(Errc::invalid_argument,
                     "nothing to measure: no pattern given belongs to the layers measured");
    return specs;
}

/// key=value fields of the server's ready line; "error" takes the rest of the line.
std::map<std::string, std::string> parse_ready_line(const std::string& line) {
    std::map<std::string, std::string> kv;
    std::size_t pos = 0;
    while (pos < line.size()) {
        std::size_t end = line.find(' ', pos);
        if (end == std::string::npos) end = line.size();
        std::string field = line.substr(pos, end - pos);
        auto eq = field.find('=');
        if (eq != std::string::npos) {
            std::string key = field.substr(0, eq);
            if (key == "error") {
                kv[key] = line.substr(pos + eq + 1);
                break;
            }
            kv[key] = field.substr(eq + 1);
        }
        pos = end + 1;
    }
    return kv;
}

/// A runner that enters its phase around each repetition (resume, run, suspend), so that it
/// can be paired as a baseline with a layer that does the same.
std::unique_ptr<Runner> phased_runner(Runner& inner) {
    struct Phased final : Runner {
        explicit Phased(Runner& r) : in(r) {}
        std::string describe(const Spec& s) const override { return in.describe(s); }
        Result<void> prepare(const Spec& s) override {
            TALARIA_CHECK(in.prepare(s));
            return in.suspend(s);
        }
        Result<Duration> run(const Spec& s, uint64_t iters) override {
            TALARIA_CHECK(in.resume(s));
            TALARIA_TRY(d, in.run(s, iters));
            TALARIA_CHECK(in.suspend(s));
            return d;
        }
        Result<void> finish(const Spec& s) override {
            TALARIA_CHECK(in.resume(s));
            return in.finish(s);
        }
        Runner& in;
    };
    return std::make_unique<Phased>(inner);
}

bool session_breaking(Errc e) {
    return e == Errc::timeout || e == Errc::disconnected || e == Errc::protocol_error ||
           e == Errc::io_error;
}

struct Placement {
    int client = -1;
    int server = -1;
};

Placement place(const ClientOptions& o) {
    Placement p;
    auto cpus = allowed_cpus();
    // With --connect the server was placed by whoever started it: pin nothing by default.
    // The api and hg layers run threads on both sides (contexts, progress): nothing pinned
    // either.
    bool api = std::find(o.layers.begin(), o.layers.end(), "api") != o.layers.end() ||
               std::find(o.layers.begin(), o.layers.end(), "hg") != o.layers.end();
    if (cpus.size() >= 2 && o.connect.empty() && !api) {
        p.client = cpus[0];
        p.server = cpus[1];
    }
    if (o.client_cpu != -2) p.client = o.client_cpu;
    if (o.server_cpu != -2) p.server = o.server_cpu;
    return p;
}

/// Everything measured against one server (one transport).
class TransportRun {
  public:
    TransportRun(const ClientOptions& o, std::string transport, Placement pl)
        : o_(o), transport_(std::move(transport)), pl_(pl) {}

    /// Start or reach the server and open the control connection.
    Result<void> connect() {
        std::string ctl = o_.ctl;
        if (o_.connect.empty()) {
            std::vector<std::string> args{"serve", server_layer(), "--transport", transport_,
                                          "--once"};
            if (!o_.thread_safe) args.push_back("--single-thread");
            push_auth_args(args, o_.auth_file, o_.protect);
            if (o_.realtime > 0) {
                args.push_back("--realtime");
                args.push_back(std::to_string(o_.realtime));
            }
            TALARIA_CHECK(proc_.start(args, pl_.server));
            TALARIA_TRY(line, proc_.read_line(std::chrono::seconds(15)));
            auto kv = parse_ready_line(line);
            if (!kv.count("ctl") || !kv.count("address"))
                return Error(Errc::protocol_error,
                             fmt::format("unexpected line from the server: '{}'", line));
            ctl = kv["ctl"];
            address_ = kv["address"];
            if (kv.count("error")) layer_error_ = kv["error"];
        } else {
            address_ = o_.connect;
            if (ctl.empty()) {
                if (!is_ip_transport(transport_))
                    return Error(Errc::invalid_argument,
                                 fmt::format("--connect to a {} server needs --ctl HOST:PORT (the "
                                             "ctl= field the server printed)",
                                             transport_));
                TALARIA_TRY(hp, host_port_of_url(o_.connect));
                ctl = fmt::format(
                    "{}:{}", hp.host.find(':') != std::string::npos ? "[" + hp.host + "]" : hp.host,
                    hp.port + 1);
            }
        }
        TALARIA_TRY(hp, parse_host_port(ctl));
        TALARIA_TRY(fd, tcp_connect(hp, std::chrono::seconds(10)));
        fd_ = std::move(fd);
        TALARIA_CHECK(tune_socket(fd_.get(), kPeerTimeout));
        CtlRequest hello;
        hello.cmd = uint32_t(Cmd::hello);
        TALARIA_TRY(reply, ctl_call(fd_.get(), hello));
        TALARIA_LOG(perf, info, "connected to server: {}",
                    fixed_text(reply.text, sizeof reply.text));
        BaselineOptions bo = o_.baseline;
        bo.client_cpu = pl_.client;
        bo.server_cpu = pl_.server;
        bo.thread_safe = o_.thread_safe;
        bo.local = o_.connect.empty();
        TALARIA_TRY(b, make_baseline(transport_, fd_.get(), bo));
        baseline_ = std::move(b);
        if (layer_error_.empty()) {
            LayerOptions lo;
            lo.thread_safe = o_.thread_safe;
            lo.url = o_.url;
            lo.api_stats = o_.api_stats;
            TALARIA_TRY(auth, perf_auth(o_.auth_file, o_.protect));
            lo.auth = std::move(auth);
            lo.auth_file = o_.auth_file;
            lo.protect = o_.protect;
            if (lo.url.empty() && is_ip_transport(transport_) && !o_.connect.empty()) {
                auto shp = host_port_of_url(o_.connect);
                bool loop = shp && (shp->host == "127.0.0.1" || shp->host == "localhost" ||
                                    shp->host == "::1");
                lo.url = fmt::format("{}://{}:0", transport_, loop ? "127.0.0.1" : "0.0.0.0");
            }
            auto names = layer_names();
            auto has = [&](std::string_view n) {
                return std::find(names.begin(), names.end(), n) != names.end();
            };
            // The hg layer's baseline is the api layer, the api layer's the core layer (rpc
            // for calls, bulk for transfers): make their clients too.
            if (has("hg") && !has("api")) names.push_back("api");
            if (has("api") && !has("rpc")) names.push_back("rpc");
            if (has("api") && !has("bulk")) names.push_back("bulk");
            for (const auto& name : names) {
                const Layer* layer = find_layer(name);
                if (auto c = layer->make_client(transport_, address_, fd_.get(), lo); c)
                    clients_[name] = std::move(*c);
                else
                    client_errors_[name] = c.error().describe();
            }
        }
        return ok();
    }

    void measure_spec(const Spec& s, Record& rec) {
        rec.thread_safe = o_.thread_safe;
        if (!broken_.empty()) {
            rec.error = broken_;
            return;
        }
        rec.baseline_name = baseline_->describe(s);
        std::string no_baseline = o_.no_baseline ? std::string() : baseline_->unavailable(s);
        if (!no_baseline.empty()) {
            rec.no_baseline = true;
            rec.baseline_name = "no baseline: " + no_baseline;
        }
        Runner* client = nullptr;
        std::string layer_error = layer_error_;
        if (auto it = clients_.find(s.layer); it != clients_.end()) {
            client = it->second.get();
        } else if (layer_error.empty()) {
            auto e = client_errors_.find(s.layer);
            layer_error = e != client_errors_.end() ? e->second : "no client";
        }
        if (!client) {
            rec.error = fmt::format("{} over {} unavailable: {}", s.layer, transport_, layer_error);
            if (rec.no_baseline) return;
            // The baseline alone, so the table still shows what the hardware gives.
            auto b = measure(*baseline_, s, o_.repeat);
            if (b) rec.baseline = *b;
            if (!b) {
                rec.error += "; baseline: " + b.error().describe();
                if (baseline_->uses_control() && session_breaking(b.code()))
                    broken_ = "session lost: " + rec.error;
            }
            return;
        }
        if (o_.no_baseline || rec.no_baseline) {
            if (o_.no_baseline) rec.baseline_name = "(skipped)";
            auto v = measure(*client, s, repeat_for(s));
            if (v)
                rec.value = *v;
            else {
                rec.error = v.error().describe();
                if (session_breaking(v.code())) broken_ = "session lost: " + rec.error;
            }
            return;
        }
        // The api layer's baseline is the core layer (the rpc back end, one context), in phases
        // of its own around each repetition, like the layer's.
        Runner* base = baseline_.get();
        std::unique_ptr<Runner> phased;
        // The hg layer's is the C++ API (the api back end, same calls or transfers in flight).
        const bool transfer = s.pattern == Pattern::pull || s.pattern == Pattern::push;
        if (s.layer == "api" || s.layer == "hg") {
            const char* under = s.layer == "hg" ? "api" : transfer ? "bulk" : "rpc";
            auto it = clients_.find(under);
            if (it == clients_.end()) {
                rec.error =
                    fmt::format("{}: the {} layer's client (its baseline) is unavailable: {}",
                                s.layer, under, client_errors_[under]);
                return;
            }
            phased = phased_runner(*it->second);
            base = phased.get();
            rec.baseline_name =
                s.layer == "hg" ? "C++ API (api layer: talaria::Engine, get(), same in flight)"
                : transfer      ? "core layer (bulk::Context::transfer, same in flight)"
                                : "core layer (rpc, 1 context, same in flight per thread)";
        }
        auto pr = measure_pair(*base, *client, s, repeat_for(s));
        if (pr.baseline) rec.baseline = *pr.baseline;
        if (pr.value) rec.value = *pr.value;
        rec.skipped = !pr.value && pr.value.code() == Errc::message_too_large;
        std::vector<std::string> errs;
        if (!pr.value) errs.push_back(pr.value.error().describe());
        if (!pr.baseline) errs.push_back("baseline: " + pr.baseline.error().describe());
        for (const auto& e : errs)
            rec.error += (rec.error.empty() ? "" : "; ") + e;
        if ((!pr.value && session_breaking(pr.value.code())) ||
            (!pr.baseline && baseline_->uses_control() && session_breaking(pr.baseline.code())))
            broken_ = "session lost: " + rec.error;
    }

    void close() {
        clients_.clear();  // before the server goes away
        if (fd_.valid() && broken_.empty()) {
            CtlRequest q;
            q.cmd = uint32_t(Cmd::quit);
            (void)ctl_call(fd_.get(), q);
        }
        fd_ = Fd();
        proc_.stop(std::chrono::seconds(2));
    }

    ~TransportRun() { close(); }

  private:
    const ClientOptions& o_;
    std::string transport_;
    Placement pl_;
    ServerProcess proc_;
    Fd fd_;
    std::string address_;
    std::string layer_error_;
    std::string broken_;
    std::unique_ptr<Runner> baseline_;
    std::map<std::string, std::unique_ptr<Runner>> clients_;  ///< by layer name
    std::map<std::string, std::string> client_errors_;

    [[nodiscard]] std::vector<std::string> layer_names() const {
        return o_.layers.empty() ? std::vector<std::string>{"na"} : o_.layers;
    }
    [[nodiscard]] std::string server_layer() const { return layer_names().front(); }

    /// The first-call pattern opens and closes an engine per iteration outside the timed
    /// region: cap its iterations so a repetition stays short in wall-clock time.
    [[nodiscard]] RepeatOptions repeat_for(const Spec& s) const {
        RepeatOptions r = o_.repeat;
        if (s.pattern == Pattern::first)
            r.max_iters = std::min<uint64_t>(r.max_iters, kFirstMaxIters);
        return r;
    }
};

}  // namespace

/// What every record of this run carries (--json, --csv).
RunInfo run_info(const ClientOptions& o) {
    RunInfo r;
    r.version = std::string(version().string);
    r.commit = TALARIA_PERF_COMMIT;
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) r.host = host;
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&now, &tm);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    r.date = date;
    r.command = o.command_line;
    return r;
}

int run_client(const ClientOptions& o) {
    auto specs = build_specs(o);
    if (!specs) {
        fmt::print(stderr, "talaria-perf: {}\n", specs.error().describe());
        return 2;
    }
    if (!o.connect.empty()) {
        std::size_t n = 0;
        for (std::size_t i = 0; i < specs->size(); ++i)
            if (i == 0 || (*specs)[i].transport != (*specs)[i - 1].transport) ++n;
        if (n != 1) {
            fmt::print(stderr, "talaria-perf: --connect needs exactly one --transport\n");
            return 2;
        }
    }
    if (o.realtime > 0)
        for (const auto& sp : *specs)
            if (auto f = transport_family(sp.transport); f && *f == Family::ucx) {
                // UCX's own progress thread (connection set-up over tcp, keepalive) inherits
                // SCHED_FIFO and our CPU, and never runs while the main thread spins there.
                fmt::print(stderr,
                           "talaria-perf: --realtime cannot be used with {}: UCX's progress "
                           "thread would never run next to a SCHED_FIFO busy-polling thread "
                           "(seen over ucx+tcp: connection set-up hangs)\n",
                           sp.transport);
                return 2;
            }
    std::size_t ncpu = allowed_cpus().size();  // before we pin ourselves to one
    Placement pl = place(o);
    if (pl.client >= 0) {
        if (auto p = pin_to_cpu(pl.client); !p)
            fmt::print(stderr, "talaria-perf: {}\n", p.error().describe());
    }
    if (o.realtime > 0) {
        if (auto p = set_realtime(o.realtime); !p)
            fmt::print(stderr, "talaria-perf: {}\n", p.error().describe());
    }
    fmt::print(
        "# {}\n# client CPU {}, server CPU {}; {} repetitions of ~{} ms each; "
        "thread_safe={}{}{}\n",
        o.command_line, pl.client, o.connect.empty() ? std::to_string(pl.server) : "remote",
        o.repeat.reps,
        std::chrono::duration_cast<std::chrono::milliseconds>(o.repeat.rep_time).count(),
        o.thread_safe, o.realtime > 0 ? fmt::format("; SCHED_FIFO priority {}", o.realtime) : "",
        o.api_stats ? "" : "; api statistics off (--no-stats)");
    double load = load_average();
    if (load > double(ncpu) - 1.5 && o.realtime == 0)
        fmt::print(
            "# load average {:.1f} on {} CPUs: other work competes for the CPUs; busy-poll "
            "numbers (both processes spinning) suffer most. Ratios compare interleaved "
            "repetitions, so they hold up better than absolute numbers.\n",
            load, ncpu);
    std::fflush(stdout);

    std::vector<Record> records;
    std::size_t i = 0;
    auto t0 = Clock::now();
    while (i < specs->size()) {
        std::string transport = (*specs)[i].transport;
        std::size_t end = i;
        while (end < specs->size() && (*specs)[end].transport == transport)
            ++end;
        TransportRun run(o, transport, pl);
        auto c = run.connect();
        for (; i < end; ++i) {
            Record rec;
            rec.spec = (*specs)[i];
            rec.load_avg = load_average();
            if (!c)
                rec.error = fmt::format("server for {}: {}", transport, c.error().describe());
            else
                run.measure_spec(rec.spec, rec);
            // Progress: [n/N] and the time left at the pace so far.
            const double spent = std::chrono::duration<double>(Clock::now() - t0).count();
            const double left = spent / double(i + 1) * double(specs->size() - i - 1);
            fmt::print(stderr, "  [{}/{}, {}] {} {} {} {} {}: {}\n", i + 1, specs->size(),
                       i + 1 == specs->size() ? std::string("done")
                       : left < 90            ? fmt::format("~{:.0f} s left", left)
                                              : fmt::format("~{:.0f} min left", left / 60),
                       transport, pattern_name(rec.spec.pattern), mode_name(rec.spec.mode),
                       size_label(rec.spec.size),
                       rec.value     ? "done"
                       : rec.skipped ? "skipped"
                                     : "failed",
                       rec.error.empty() ? "ok" : rec.error);
            records.push_back(std::move(rec));
        }
    }
    auto secs = std::chrono::duration<double>(Clock::now() - t0).count();
    fmt::print("{}", format_table(records, !o.no_goals));
    fmt::print("# {} measurements in {:.1f} s; load average {:.1f} at the end\n", records.size(),
               secs, load_average());
    const RunInfo info = run_info(o);
    auto write = [](const std::string& path, const std::string& text) {
        if (path.empty()) return true;
        std::ofstream f(path);
        f << text;
        if (!f) fmt::print(stderr, "talaria-perf: cannot write {}\n", path);
        return bool(f);
    };
    if (!write(o.json_path, format_json(records, info)) ||
        !write(o.csv_path, format_csv(records, info)))
        return 1;
    for (const auto& r : records)
        if ((!r.value && !r.skipped) || (!o.no_baseline && !r.no_baseline && !r.baseline)) return 1;
    return 0;
}

}  // namespace talaria::perf
