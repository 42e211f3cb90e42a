#include "talaria/util/log.hpp"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>

namespace talaria::log {

namespace {
constexpr int kCount = static_cast<int>(Subsys::count);
constexpr std::array<std::string_view, kCount> kSubsysNames = {
    "util", "na",   "inproc", "sm",  "tcp",  "ofi", "ucx",
    "core", "bulk", "proc",   "api", "perf", "rpc"};
constexpr std::array<std::string_view, 6> kLevelNames = {"off",  "error", "warn",
                                                         "info", "debug", "trace"};

bool parse_level(std::string_view s, Level& out) {
    for (std::size_t i = 0; i < kLevelNames.size(); ++i)
        if (kLevelNames[i] == s) {
            out = static_cast<Level>(i);
            return true;
        }
    return false;
}

// nullptr means stderr. Constant-initialized, so a log statement in another translation unit's
// static initializer (which may run before this one's) cannot see an unset stream.
FILE* g_out = nullptr;
std::mutex g_write_mu;
std::unique_ptr<Sink> g_sink;  // under g_write_mu; constant-initialized, as g_out

// Reads TALARIA_LOG and TALARIA_LOG_FILE once, before main().
struct EnvInit {
    EnvInit() {
        if (const char* f = std::getenv("TALARIA_LOG_FILE"); f && *f) {
            if (FILE* fp = std::fopen(f, "a")) g_out = fp;
        }
        if (const char* spec = std::getenv("TALARIA_LOG"); spec && *spec) {
            if (!configure(spec))
                std::fprintf(stderr,
                             "talaria: ignoring bad TALARIA_LOG='%s' "
                             "(expected e.g. warn,na=debug,tcp=trace)\n",
                             spec);
        }
    }
};
}  // namespace

namespace detail {
std::atomic<uint8_t> g_levels[kCount] = {
#define W static_cast<uint8_t>(Level::warn)
    W, W, W, W, W, W, W,
    W, W, W, W, W, W
#undef W
};
static_assert(kCount == 13, "update g_levels' initializer");

void write(Subsys s, Level l, const char* file, int line, std::string_view msg) noexcept {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    std::string_view f(file);
    if (auto p = f.rfind('/'); p != std::string_view::npos) f.remove_prefix(p + 1);
    std::lock_guard g(g_write_mu);
    if (g_sink) {
        try {
            (*g_sink)(Record{s, l, f, line, msg, int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec});
        } catch (...) {
            // A sink that throws loses its message, not the program.
        }
        return;
    }
    FILE* out = g_out ? g_out : stderr;
    // UTC, to the microsecond: "2026-11-29T02:51:59.123456Z".
    tm utc;
    gmtime_r(&ts.tv_sec, &utc);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
    std::fprintf(out, "%s.%06ldZ %d %.*s %.*s %.*s:%d: %.*s\n", when, long(ts.tv_nsec / 1000),
                 int(::getpid()), int(level_name(l).size()), level_name(l).data(),
                 int(subsys_name(s).size()), subsys_name(s).data(), int(f.size()), f.data(), line,
                 int(msg.size()), msg.data());
    std::fflush(out);
}
}  // namespace detail

std::string_view level_name(Level l) noexcept {
    auto i = static_cast<std::size_t>(l);
    return i < kLevelNames.size() ? kLevelNames[i] : "?";
}

std::string_view subsys_name(Subsys s) noexcept {
    auto i = static_cast<std::size_t>(s);
    return i < kSubsysNames.size() ? kSubsysNames[i] : "?";
}

void set_sink(Sink sink) {
    auto fresh = sink ? std::make_unique<Sink>(std::move(sink)) : nullptr;
    std::lock_guard g(g_write_mu);
    g_sink.swap(fresh);  // the old one is destroyed after the lock is released
}

void set_level(Subsys s, Level l) noexcept {
    detail::g_levels[static_cast<int>(s)].store(static_cast<uint8_t>(l), std::memory_order_relaxed);
}

bool configure(std::string_view spec) noexcept {
    std::array<Level, kCount> levels;
    for (int i = 0; i < kCount; ++i)
        levels[i] = static_cast<Level>(detail::g_levels[i].load());
    while (!spec.empty()) {
        auto comma = spec.find(',');
        std::string_view item = spec.substr(0, comma);
        spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
        if (item.empty()) continue;
        auto eq = item.find('=');
        Level l;
        if (eq == std::string_view::npos) {  // a bare level applies to every subsystem
            if (!parse_level(item, l)) return false;
            levels.fill(l);
            continue;
        }
        if (!parse_level(item.substr(eq + 1), l)) return false;
        auto name = item.substr(0, eq);
        bool found = false;
        for (int i = 0; i < kCount; ++i)
            if (kSubsysNames[i] == name) {
                levels[i] = l;
                found = true;
            }
        if (!found) return false;
    }
    for (int i = 0; i < kCount; ++i)
        set_level(static_cast<Subsys>(i), levels[i]);
    return true;
}

std::optional<uint64_t> Limiter::admit() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    const int64_t now = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    int64_t next = next_ns_.load(std::memory_order_relaxed);
    if (now < next ||
        !next_ns_.compare_exchange_strong(next, now + 1000000000, std::memory_order_relaxed)) {
        held_.fetch_add(1, std::memory_order_relaxed);
        return std::nullopt;
    }
    return held_.exchange(0, std::memory_order_relaxed);
}

std::string held_back(uint64_t n) {
    if (n == 0) return {};
    return fmt::format(" ({} more since the last such line, not logged)", n);
}

namespace {
EnvInit g_env_init;
}

}  // namespace talaria::log
