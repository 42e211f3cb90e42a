// Helpers every transport calls, kept apart from the transport table and the contexts: they are
// linked into libtalaria and into each transport plugin (libfabric, UCX), which cannot reach the
// library's hidden symbols.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <string_view>

#include "na/base/op.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {

bool process_gone(pid_t pid) noexcept {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    char path[32];
    std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;  // no /proc here: kill's answer is all we have
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    if (n <= 0) return false;
    // "pid (name) S ...": the name may hold any byte, so the state follows the last ')'.
    std::string_view stat(buf, std::size_t(n));
    const auto close = stat.rfind(')');
    if (close == std::string_view::npos || close + 2 >= stat.size()) return false;
    const char state = stat[close + 2];
    return state == 'Z' || state == 'X';
}

Error ops_exhausted(std::string_view who, std::size_t max_ops) {
    return Error{Errc::again,
                 fmt::format("{}: {} operations already in flight (Options::max_ops): progress and "
                             "trigger to complete some, then retry, or raise max_ops",
                             who, max_ops)};
}

Result<void> check_rma_args(const Transport* t, std::string_view scheme, std::string_view what,
                            const Context& ctx, const MemHandle& local, std::size_t local_off,
                            const MemHandle& remote, std::size_t len, const Addr& remote_addr) {
    if (&ctx.transport() != t)
        return Error(Errc::invalid_argument,
                     fmt::format("{} {}: the context belongs to another transport", scheme, what));
    if (!remote_addr || remote_addr.impl()->transport() != t)
        return Error(
            Errc::invalid_argument,
            fmt::format("{} {}: remote_addr is not an address of this transport", scheme, what));
    if (!local || local->transport() != t || !local->local())
        return Error(Errc::invalid_argument,
                     fmt::format("{} {}: the local handle is not a registration of this endpoint",
                                 scheme, what));
    if (!remote || remote->transport() != t)
        return Error(Errc::invalid_argument,
                     fmt::format("{} {}: the remote handle is not a handle of this endpoint "
                                 "(deserialize it here)",
                                 scheme, what));
    if (local_off > local->length() || len > local->length() - local_off)
        return Error(Errc::out_of_range,
                     fmt::format("{} {}: local range [{}, +{}) is outside the {}-byte registration",
                                 scheme, what, local_off, len, local->length()));
    return ok();
}

}  // namespace talaria::na
