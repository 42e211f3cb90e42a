// The epoll set a transport's context blocks on (its wait fds, level-triggered), shared by the
// transports that keep one per context (tcp, ofi, ucx).
#pragma once

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <initializer_list>

namespace talaria::na {

/// A close-on-exec epoll set watching `fds` for input; -1 with errno set when it cannot be
/// made (epoll_create1 or an epoll_ctl failed: usually the file-descriptor limit).
inline int epoll_set_of(std::initializer_list<int> fds) noexcept {
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return -1;
    for (int fd : fds) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            int err = errno;
            ::close(ep);
            errno = err;
            return -1;
        }
    }
    return ep;
}

/// What context_create() says when a context's epoll set could not be made.
inline constexpr const char* kEpollSetRemedy =
    "could not make the epoll set it blocks on (see the log for the system error; at the "
    "file-descriptor limit, raise `ulimit -n` or close contexts and transports)";

}  // namespace talaria::na
