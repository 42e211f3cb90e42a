// talaria-perf: the two roles of the executable. The client builds the list of measurements,
// starts (or connects to) one server per transport, and measures each spec with the layer's
// back end and with the raw baseline; `serve` is the other process.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "baseline.hpp"
#include "driver.hpp"

namespace talaria::perf {

struct ClientOptions {
    std::vector<std::string> layers;      ///< empty: na; several must share a server (rpc, bulk)
    bool demo = false;                    ///< the RPC demo: busy mode except block ping-pong
    std::vector<std::string> transports;  ///< empty: sm and tcp
    std::vector<std::string> patterns;    ///< empty: the default set
    std::vector<std::string> modes;       ///< empty: busy and block
    std::vector<std::string> sizes;       ///< empty: per pattern defaults
    unsigned inflight = 32;               ///< blast
    unsigned rma_inflight = 1;            ///< put/get, pull/push
    std::vector<unsigned> rate_inflight;  ///< rpc rate; empty: 1 and 16
    std::vector<unsigned> contexts;       ///< api: contexts (= client threads); empty: 1
    std::vector<unsigned> procs;          ///< api: client processes; empty: 1
    std::vector<std::string> consume;     ///< api: get, then, coawait; empty: all three
    RepeatOptions repeat;
    std::string json_path;
    std::string csv_path;   ///< --csv: the records as CSV too
    bool no_goals = false;  ///< --no-goals: the table without the project's goal column
    std::string connect;    ///< server's layer address: do not start a server
    std::string ctl;        ///< server's control address (host:port)
    std::string url;        ///< address the client opens its transport with
    int client_cpu = -2;    ///< -2: automatic, -1: do not pin
    int server_cpu = -2;
    bool thread_safe = true;
    bool no_baseline = false;  ///< measure the layer only (for profiling one side)
    bool api_stats = true;     ///< --no-stats: the api engines keep no per-procedure statistics
    int realtime = 0;          ///< SCHED_FIFO priority for client and spawned server (0: off)
    std::string auth_file;     ///< --auth-secret-file: na::Options::auth on both sides
    std::string protect;       ///< --protect: na::Auth::protect on both sides
    BaselineOptions baseline;
    std::string command_line;  ///< for the report
};

struct ServeOptions {
    std::string layer = "na";
    std::string transport;
    std::string listen;      ///< layer address to open ("" = default for the transport)
    std::string ctl_listen;  ///< control listen address ("" = derived)
    int cpu = -1;
    int realtime = 0;   ///< SCHED_FIFO priority (0: off)
    bool once = false;  ///< exit after one client session (used for the spawned server)
    bool thread_safe = true;
    std::string auth_file;  ///< --auth-secret-file
    std::string protect;    ///< --protect
};

/// Returns the process exit code.
int run_client(const ClientOptions& opt);
int run_serve(const ServeOptions& opt);

/// One extra client process of `talaria-perf api --procs P` (hidden subcommand api-worker):
/// an Engine at `url` with `contexts` contexts calling the server's contexts first.. on
/// commands read from stdin (backend_api.cpp).
struct ApiWorkerOptions {
    std::string url;
    std::string server;
    unsigned contexts = 1;
    unsigned first = 0;
    bool stats = true;  ///< --no-stats
    std::string auth_file;
    std::string protect;
};
int run_api_worker(const ApiWorkerOptions& opt);

/// `talaria-perf overload` (overload.cpp): a good client's latency alone and under a flood.
struct OverloadOptions {
    std::string transport = "tcp";
    unsigned flooders = 64;        ///< threads of the flooding engine
    unsigned flood_inflight = 16;  ///< calls each keeps in flight
    unsigned seconds = 3;          ///< each measurement of the good client
    unsigned hold_us = 200;        ///< the server keeps each request this long (0: answers inline)
    uint32_t max_requests = 16384;
    uint32_t max_per_peer = 256;
    uint32_t window = 0;       ///< the flooding engine's core::Options::peer_window
    uint8_t good_retries = 0;  ///< the good client's retry_busy
    int flood_nice = 0;        ///< niceness of the flooding threads (they stand for other hosts)
};
int run_overload(const OverloadOptions& opt);

/// `talaria-perf group` (group.cpp): collective calls over N ranks of this machine, and
/// failure detection under load.
struct GroupBenchOptions {
    std::string transport = "tcp";
    std::vector<uint32_t> ranks{2, 4, 8};
    std::vector<uint32_t> k{2};
    unsigned calls = 2000;  ///< timed calls per point (and a tenth more to warm up)
    bool detect = false;
    unsigned period_ms = 200, suspicion_ms = 1000;
    unsigned load_inflight = 64;  ///< calls each rank keeps in flight during detection
    unsigned load_seconds = 10;
    /// Emulated hosts (scripts/hosts up H): rank r runs in network namespace talaria-h<r % H>
    /// and listens on its address; 0: every rank on this host's loopback.
    unsigned hosts = 0;
};
int run_group_bench(const GroupBenchOptions& opt);

/// One line from the pipe `fd`, without its newline; none at its end or on an error. (The
/// limit is checked between reads: a read blocks until a byte comes or the writer closes.)
std::optional<std::string> read_line(int fd, Duration limit);

/// The address an engine listens on for `transport` ("tcp", "sm", "ofi+tcp", ...).
inline std::string listen_url(const std::string& transport) {
    if (transport == "sm" || transport.ends_with("+sm") || transport.ends_with("+shm"))
        return transport + "://";
    return transport + "://127.0.0.1:0";
}

}  // namespace talaria::perf
