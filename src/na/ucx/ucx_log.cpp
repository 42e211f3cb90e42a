// UCX's log messages, into Talaria's log. Apart from the rest of the transport because UCX's
// logging header defines macros (ucs_error, ucs_warn, ...) that clash with its names.
// ucx.hpp first: log_def.h's macros would rewrite its declarations.
#include "na/ucx/ucx.hpp"
// clang-format off
#include <ucs/debug/log_def.h>
// clang-format on

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "talaria/util/log.hpp"

namespace talaria::na::ucx {

namespace {

/// UCX's own messages (a transport or device it cannot use, a configuration it rejects, an
/// endpoint error) go to Talaria's log, subsystem ucx, instead of UCX's default handler, which
/// prints them on stdout, mixed into the application's output (talaria-info --json was not JSON
/// where UCX warned). UCX filters by its own level first (UCX_LOG_LEVEL, warn by default); a
/// message that passes is logged at the matching Talaria level, so TALARIA_LOG=ucx=... decides
/// whether it is written, and where (TALARIA_LOG_FILE).
ucs_log_func_rc_t forward_ucx_log(const char* file, unsigned line, const char* function,
                                  ucs_log_level_t level, const ucs_log_component_config_t*,
                                  const char* format, va_list ap) {
    // UCS_LOG_LEVEL_PRINT is what the user asked UCX to print (UCX_LOG_PRINT_ENABLE): shown
    // like a warning.
    log::Level l = level <= UCS_LOG_LEVEL_ERROR   ? log::Level::error
                   : level == UCS_LOG_LEVEL_WARN  ? log::Level::warn
                   : level == UCS_LOG_LEVEL_PRINT ? log::Level::warn
                   : level <= UCS_LOG_LEVEL_INFO  ? log::Level::info
                   : level <= UCS_LOG_LEVEL_DEBUG ? log::Level::debug
                                                  : log::Level::trace;
    if (log::enabled(log::Subsys::ucx, l)) {
        char text[1024];
        int n = std::vsnprintf(text, sizeof text, format, ap);
        const char* base = std::strrchr(file, '/');
        log::detail::write(log::Subsys::ucx, l, base ? base + 1 : file, int(line),
                           fmt::format("UCX: {}{} ({})", text,
                                       n >= int(sizeof text) ? "... (cut)" : "", function));
    }
    return UCS_LOG_FUNC_RC_STOP;  // UCX's default handler (stdout) is not called
}

}  // namespace

/// Hooks forward_ucx_log into UCX's logger, once per process: that logger, like UCX's
/// configuration, is process-wide, and so is this (a second hook would log every message
/// twice). A program that uses UCX itself as well finds UCX's messages in Talaria's log.
/// A user who set UCX_LOG_FILE asked for UCX's messages in that file: then UCX keeps them.
void route_ucx_log() {
    static const bool hooked = [] {  // NOLINT: process-wide by necessity (see above)
        if (const char* f = std::getenv("UCX_LOG_FILE"); f && *f) return false;
        ucs_log_push_handler(&forward_ucx_log);
        return true;
    }();
    (void)hooked;
}

}  // namespace talaria::na::ucx
