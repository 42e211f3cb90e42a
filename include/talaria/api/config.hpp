// An engine's configuration as JSON, as Margo reads and dumps its own: a service reads its
// settings from a file, and an operator asks a running engine what it runs with
// (Engine::config_json()). Every key is optional; what is absent keeps its default.
//
//   {
//     "address": "tcp://0.0.0.0:7000",   "listen": true,
//     "progress": "background",           "wait": "block",        (or "manual"; "busy")
//     "contexts": 4,  "checksum": false,  "default_timeout_ms": 0,  "handler_threads": 4,
//     "core": { "recv_depth": 16, "max_inflight": 4096, "ack_linger_ms": 60000,
//               "eager_limit": 0, "max_payload": 1073741824, "large_budget": 2147483648,
//               "pull_timeout_ms": 60000, "max_requests": 16384, "max_requests_per_peer": 4096,
//               "peer_window": 0, "busy_retry_after_ms": 0, "stats": true,
//               "stats_timing_gap_ms": 0.01 },
//     "na": { "thread_safe": true, "max_ops": 4096, "max_contexts": 16,
//             "hello_timeout_ms": 10000, "sm_group": -1,
//             "auth": { "key_id": "svc", "secret_file": "/etc/svc/secret", "protect": "none" } }
//   }
//
// The keys are the fields of EngineOptions, core::Options and na::Options (their comments say
// what each does); durations are in milliseconds (fractions allowed, 0 to 100 years); comments
// (// and /* */) are allowed. core.contexts, core.checksum and na.listen are not keys:
// "contexts", "checksum" and "listen" set them. A secret never appears in JSON: "secret_file"
// names the file it is read from (na::read_secret_file), and a dump says "secret": "set" or
// "none" in its place.
#pragma once

#include <string>
#include <string_view>

#include "talaria/api/engine.hpp"

#pragma GCC visibility push(default)

namespace talaria {

/// What an engine is opened with: its address, whether it listens, and its options.
struct EngineConfig {
    std::string address;
    bool listen = false;
    EngineOptions options{};
    /// Where options.core.na.auth.secret was read from ("" when none was, or it was set in
    /// code): a dump names it, never the secret.
    std::string secret_file;

    /// Parse `json`. Throws talaria::Exception (invalid_argument) naming the key, what it must
    /// be and what it was, e.g. "core.recv_depth: must be an unsigned integer (at most
    /// 4294967295), not "16"", or an unknown key with the keys known at its level; a
    /// secret_file that cannot be read fails as na::read_secret_file says.
    static EngineConfig from_json(std::string_view json);
    /// Non-throwing twin of from_json.
    static Result<EngineConfig> parse(std::string_view json);
    /// Every key, with its value (defaults included), as from_json reads it back; `indent` < 0
    /// gives one line.
    [[nodiscard]] std::string to_json(int indent = 2) const;
};

}  // namespace talaria

#pragma GCC visibility pop
