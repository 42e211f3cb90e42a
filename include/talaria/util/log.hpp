// Logging by subsystem and level, configured from the environment:
//   TALARIA_LOG=warn,na=debug,tcp=trace     (default: warn everywhere)
//   TALARIA_LOG_FILE=/path                  (default: stderr)
// A disabled log statement costs one relaxed atomic load and a compare; its arguments are
// not evaluated.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace talaria::log {

enum class Level : uint8_t { off = 0, error, warn, info, debug, trace };

/// Subsystems, one per layer and transport. Keep subsys_name() in log.cpp in step.
enum class Subsys : uint8_t {
    util,
    na,
    inproc,
    sm,
    tcp,
    ofi,
    ucx,
    core,
    bulk,
    proc,
    api,
    perf,
    rpc,  ///< each call on both sides, at trace (procedure, peer, sequence, sizes, status, time)
    count
};

std::string_view level_name(Level l) noexcept;
std::string_view subsys_name(Subsys s) noexcept;

namespace detail {
extern std::atomic<uint8_t> g_levels[static_cast<int>(Subsys::count)];
void write(Subsys s, Level l, const char* file, int line, std::string_view msg) noexcept;
}  // namespace detail

inline bool enabled(Subsys s, Level l) noexcept {
    return detail::g_levels[static_cast<int>(s)].load(std::memory_order_relaxed) >=
           static_cast<uint8_t>(l);
}

/// One log message, as a sink receives it.
struct Record {
    Subsys subsys;
    Level level;
    std::string_view file;  ///< the source file's name, without its directories
    int line;
    std::string_view message;
    int64_t unix_ns;  ///< CLOCK_REALTIME when it was written
};
/// Where messages go instead of the default writer (TALARIA_LOG_FILE or stderr): called for
/// every enabled message, from the thread that logs it, one call at a time (under the log's
/// lock, so a sink must not log; a warning may come from code that holds one of Talaria's
/// locks, so it should not call into Talaria either: hand the record to your logger). The
/// views are valid during the call only.
using Sink = std::function<void(const Record&)>;
/// Replace the writer with `sink` (an empty one restores the default). The logger is the
/// process's, as TALARIA_LOG is: a library that sets a sink sets it for its whole process.
void set_sink(Sink sink);

/// Parse a TALARIA_LOG-style spec ("warn,na=debug,tcp=trace") and apply it.
/// Returns false (and applies nothing) when the spec has an unknown name.
bool configure(std::string_view spec) noexcept;
void set_level(Subsys s, Level l) noexcept;

/// At most one line a second from one place that a peer can make log (a malformed message, a
/// call it should not make): each owner (a context, a transport) keeps its own. Lock-free.
///   if (auto held = limiter.admit())
///       TALARIA_LOG(core, warn, "...{}", ..., log::held_back(*held));
class Limiter {
  public:
    /// Not now: nullopt (the line is counted as held back). Now: how many were held back since
    /// the last line let through.
    std::optional<uint64_t> admit() noexcept;

  private:
    std::atomic<int64_t> next_ns_{0};
    std::atomic<uint64_t> held_{0};
};
/// " (N more since the last such line, not logged)", or nothing for 0.
std::string held_back(uint64_t n);

}  // namespace talaria::log

/// TALARIA_LOG(tcp, debug, "connected to {} fd={}", addr, fd);
#define TALARIA_LOG(subsys, level, ...)                                                            \
    do {                                                                                           \
        if (::talaria::log::enabled(::talaria::log::Subsys::subsys, ::talaria::log::Level::level)) \
            [[unlikely]] {                                                                         \
            ::talaria::log::detail::write(::talaria::log::Subsys::subsys,                          \
                                          ::talaria::log::Level::level, __FILE__, __LINE__,        \
                                          ::fmt::format(__VA_ARGS__));                             \
        }                                                                                          \
    } while (0)

#pragma GCC visibility pop
