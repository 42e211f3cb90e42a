// talaria-info -c: every environment variable and configuration key Talaria reads, with its
// default (the defaults are read from EngineConfig's own dump, so they cannot drift) and what
// it does, like ucx_info -c and fi_info -e.
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "info.hpp"
#include "talaria/api/config.hpp"

namespace talaria::info {

namespace {

struct Meaning {
    const char* name;
    const char* meaning;
};

// The environment: read by the library (util/log.cpp, na/base/plugin_load.cpp, the ucx and
// ofi transports). Defaults are what applies when the variable is not set.
constexpr Meaning kEnv[] = {
    {"TALARIA_LOG",
     "log levels by subsystem: a level (off error warn info debug trace) for all, then "
     "name=level (util na inproc sm tcp ofi ucx core bulk proc api perf rpc); rpc=trace logs "
     "every call on both sides"},
    {"TALARIA_LOG_FILE", "append the log to this file instead of stderr"},
    {"TALARIA_PLUGIN_DIR",
     "where the ofi and ucx transport plugins are loaded from (default: talaria/ beside the "
     "library); ignored in set-uid programs"},
    {"UCX_LOG_FILE",
     "UCX's own: when set, UCX writes its messages there and Talaria does not take them into "
     "its log (ucx)"},
    {"FI_OFI_RXM_*",
     "libfabric's own rxm settings: Talaria sets none of them where the user set one "
     "(docs/architecture.md, the ofi transport)"},
};

// The configuration keys (EngineConfig JSON; the fields of EngineOptions, core::Options and
// na::Options). Every key of the default dump must be here (a test checks it).
constexpr Meaning kKeys[] = {
    {"address", "the address the engine opens (tcp://HOST:PORT, sm://, ofi+tcp://..., ...)"},
    {"listen", "accept connections from engines this one did not call"},
    {"progress", "background: the engine's threads drive progress; manual: the program does"},
    {"wait", "how background threads wait for work: block (sleep) or busy (poll)"},
    {"contexts", "RPC contexts (progress domains, one thread each in background mode)"},
    {"checksum", "crc32c over every message sent"},
    {"default_timeout_ms", "deadline of calls that set none (0: no deadline)"},
    {"handler_threads", "threads of Engine::handler_pool(), made on first use"},
    {"core.recv_depth", "unexpected receives kept posted per context"},
    {"core.max_inflight", "outgoing calls in flight per context (at most 32768)"},
    {"core.ack_linger_ms", "how long a large result waits for its caller to pull it"},
    {"core.eager_limit", "cap the eager (inline) size below the transport's (0: none)"},
    {"core.max_payload", "largest argument or result accepted from a peer"},
    {"core.large_budget",
     "bytes of large arguments held at once, over all contexts; past it calls are answered "
     "busy"},
    {"core.pull_timeout_ms", "how long pulling a peer's large payload may take"},
    {"core.max_requests",
     "requests one context holds unanswered; past it calls are answered busy (0: no limit)"},
    {"core.max_requests_per_peer", "the same, for one calling peer (0: no limit)"},
    {"core.peer_window", "calls one context keeps sent to one peer; the rest wait (0: no window)"},
    {"core.busy_retry_after_ms", "the retry-after hint sent with busy answers (0: none)"},
    {"core.stats",
     "per-procedure statistics: calls, outcomes, bytes, latency histograms (talaria-info "
     "--attach)"},
    {"core.stats_timing_gap_ms",
     "time every call while calls come this far apart, a sample when faster (0: every call)"},
    {"na.thread_safe", "any thread may use the transport (off: one thread per context)"},
    {"na.max_ops", "operations in flight per transport context"},
    {"na.max_contexts", "transport contexts an engine may open"},
    {"na.hello_timeout_ms", "how long a new connection may take to say who it is"},
    {"na.sm_group", "sm: the group allowed to connect besides the owner (-1: the owner's only)"},
    {"na.auth.key_id", "the name of the shared secret (sent in clear)"},
    {"na.auth.secret_file", "the file the shared secret is read from (never printed)"},
    {"na.auth.secret", "in a dump: set or none (the secret itself never appears)"},
    {"na.auth.protect", "tcp: none, integrity or encryption of what follows the handshake"},
};

void flatten(const nlohmann::ordered_json& j, const std::string& prefix,
             std::map<std::string, std::string>& out, std::vector<std::string>& order) {
    for (const auto& [k, v] : j.items()) {
        const std::string name = prefix.empty() ? k : prefix + "." + k;
        if (v.is_object()) {
            flatten(v, name, out, order);
        } else {
            out[name] = v.is_string() ? v.get<std::string>() : v.dump();
            order.push_back(name);
        }
    }
}

}  // namespace

Section variables_section() {
    Section s;
    s.key = "variables";
    s.title = "Environment variables and configuration keys Talaria reads";
    for (const auto& e : kEnv) {
        Row r;
        r.add("name", e.name);
        r.add("kind", "environment");
        const char* now = std::getenv(e.name);
        if (std::string_view(e.name) == "UCX_LOG_FILE" && std::getenv("TALARIA_INFO_UCX_LOG_FILE"))
            now = nullptr;  // set by talaria-info itself (main.cpp), not by the user
        r.add("default", "unset");
        r.add("value here", now ? now : "-");
        r.add("meaning", e.meaning);
        s.rows.push_back(std::move(r));
    }
    std::map<std::string, std::string> defaults;
    std::vector<std::string> order;
    flatten(nlohmann::ordered_json::parse(EngineConfig{}.to_json()), "", defaults, order);
    for (const auto& name : order) {
        Row r;
        r.add("name", name);
        r.add("kind", "config");
        r.add("default", defaults[name].empty() ? "\"\"" : defaults[name]);
        r.add("value here", "-");
        std::string meaning;
        for (const auto& k : kKeys)
            if (name == k.name) meaning = k.meaning;
        if (meaning.empty()) s.notes.push_back("no description of " + name + " (a bug)");
        r.add("meaning", meaning.empty() ? "-" : meaning);
        s.rows.push_back(std::move(r));
    }
    s.notes.push_back(
        "config keys are read by EngineConfig::from_json (include/talaria/api/config.hpp) and "
        "dumped by Engine::config_json(); durations in milliseconds");
    return s;
}

}  // namespace talaria::info
