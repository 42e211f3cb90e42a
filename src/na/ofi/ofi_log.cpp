// libfabric's log messages, into Talaria's log (fi_import_log, libfabric >= 1.13's interface for
// an application's logger; rdma/fi_ext.h).
#include <rdma/fabric.h>
#include <rdma/fi_ext.h>

#include <chrono>
#include <string_view>

#include <fmt/format.h>

#include "na/ofi/ofi.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ofi {

namespace {

log::Level level_of(fi_log_level l) noexcept {
    switch (l) {
        case FI_LOG_WARN:
            return log::Level::warn;
        case FI_LOG_INFO:
            return log::Level::info;
        case FI_LOG_DEBUG:
            return log::Level::debug;
        default:  // FI_LOG_TRACE sits between warn and info in libfabric's order: ours is finest
            return log::Level::trace;
    }
}

/// libfabric's own filter (FI_LOG_LEVEL, FI_LOG_PROV, FI_LOG_SUBSYS: by default nothing),
/// saved before ours replaces it: a message is written when the user asked libfabric for it
/// and Talaria's log takes its level for the ofi subsystem.
using EnabledFn = int (*)(const fi_provider*, fi_log_level, fi_log_subsys, uint64_t);
EnabledFn g_libfabric_enabled = nullptr;  // set once, before libfabric can call the hooks

int enabled(const fi_provider* prov, fi_log_level level, fi_log_subsys subsys, uint64_t flags) {
    return log::enabled(log::Subsys::ofi, level_of(level)) && g_libfabric_enabled &&
           g_libfabric_enabled(prov, level, subsys, flags);
}

/// FI_WARN_SPARSE and the like: at most one message per call site every 2 s, as libfabric's own.
int ready(const fi_provider* prov, fi_log_level level, fi_log_subsys subsys, uint64_t flags,
          uint64_t* showtime) {
    if (!enabled(prov, level, subsys, flags)) return 0;
    auto now = uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count());
    if (now < *showtime) return 0;
    *showtime = now + 2000;
    return 1;
}

void write(const fi_provider* prov, fi_log_level level, fi_log_subsys, const char* func, int line,
           const char* msg) {
    std::string_view text = msg ? msg : "";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
        text.remove_suffix(1);
    log::detail::write(
        log::Subsys::ofi, level_of(level), func ? func : "libfabric", line,
        fmt::format("libfabric {}: {}", prov && prov->name ? prov->name : "core", text));
}

}  // namespace

void route_ofi_log() {
    // libfabric's logger is process-wide and takes one import (a second is refused with
    // -FI_EALREADY), so this acts once per process. The messages libfabric writes while it
    // first initialises (fi_open below loads its providers) still go to stderr its own way.
    static const bool hooked = [] {  // NOLINT: process-wide by necessity (see above)
        fid* opened = nullptr;
        int rc = fi_open(FI_VERSION(1, 13), "logging", nullptr, 0, 0, &opened, nullptr);
        if (rc != 0) {
            TALARIA_LOG(ofi, debug, "libfabric's log stays its own: fi_open(logging): {}",
                        fi_strerror(-rc));
            return false;
        }
        g_libfabric_enabled = reinterpret_cast<fid_logging*>(opened)->ops->enabled;
        static fi_ops_log ops{sizeof(fi_ops_log), &enabled, &ready, &write};
        static fid_logging ours{};
        ours.fid.fclass = FI_CLASS_LOG;
        ours.ops = &ops;
        rc = fi_import_fid(opened, &ours.fid, 0);
        fi_close(opened);
        if (rc != 0) {
            TALARIA_LOG(ofi, debug, "libfabric's log stays its own: fi_import_fid: {}",
                        fi_strerror(-rc));
            return false;
        }
        return true;
    }();
    (void)hooked;
}

}  // namespace talaria::na::ofi
