// The ucx transport's bootstrap in sockaddr mode ("ucx+tcp://host:port"): the port a server
// advertises is a plain TCP socket of ours, not UCX's listener. UCX 1.13's socket connection
// manager asserts on the first foreign bytes it parses (a 16-byte header claiming a huge
// private-data length aborts the process, 100 kB of random bytes leave its async thread
// spinning), so it must never face the network. A client connects to the port, sends a
// 16-byte request, reads a reply naming the server's context-0 worker, closes, and reaches
// that worker by its packed address (ucp_ep_create with REMOTE_ADDRESS) as in worker mode.
// A thread the transport owns (joined when it closes) serves the port: it reads exactly one
// request per connection, answers it, and closes; anything else is closed unanswered. Wire format:
// wire.hpp, docs/protocol.md (ucx bootstrap).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "na/base/epoll_set.hpp"
#include "na/ucx/ucx.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ucx {

namespace {

/// Closes a descriptor on every path out of the client's bootstrap.
struct FdGuard {
    int fd;
    ~FdGuard() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

Duration UcxTransport::boot_timeout() const noexcept {
    return opts_.hello_timeout > Duration::zero() ? opts_.hello_timeout : kBootDefaultTimeout;
}

Result<void> UcxTransport::init_bootstrap() {
    TALARIA_TRY(sa, parse_host_port(spec_.host, true));
    boot_fd_ = ::socket(sa.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (boot_fd_ < 0)
        return Error(Errc::io_error, fmt::format("{}: socket: {}", scheme_, std::strerror(errno)));
    int one = 1;
    ::setsockopt(boot_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(boot_fd_, sa.sa(), sa.len) < 0) {
        int e = errno;
        return Error(e == EADDRINUSE ? Errc::address_in_use : Errc::io_error,
                     fmt::format("{}: bind {}: {}{}", scheme_, sa.to_string(), std::strerror(e),
                                 e == EADDRINUSE ? "; use port 0 to pick a free port" : ""));
    }
    if (::listen(boot_fd_, 128) < 0)
        return Error(Errc::io_error, fmt::format("{}: listen on {}: {}", scheme_, sa.to_string(),
                                                 std::strerror(errno)));
    SockAddr bound;
    bound.len = sizeof bound.storage;
    if (::getsockname(boot_fd_, bound.sa(), &bound.len) < 0)
        return Error(Errc::io_error,
                     fmt::format("{}: getsockname: {}", scheme_, std::strerror(errno)));
    boot_stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (boot_stop_fd_ < 0)
        return Error(Errc::io_error, fmt::format("{}: eventfd: {}", scheme_, std::strerror(errno)));
    boot_epfd_ = epoll_set_of({boot_fd_, boot_stop_fd_});
    if (boot_epfd_ < 0)
        return Error(Errc::io_error, fmt::format("{}: the bootstrap listener's epoll set: {}",
                                                 scheme_, std::strerror(errno)));
    // A wildcard bind is advertised as the loopback address, as for tcp.
    const SockAddr adv = advertised(bound);
    {
        std::lock_guard gi(intern_mu_);
        Addr self = intern_locked(adv.to_string());
        self.as<UcxAddr>()->sa = adv;
        self_ = self;
    }
    // A thread of its own answers the port (the answer, made here once, and lane 0's worker,
    // which it wakes, are all it reads): a client's bootstrap then never waits for this
    // process's progress, which may be the very thread that is waiting (two engines in one
    // thread).
    const std::vector<std::byte>& worker = lane_at(0)->worker_addr;
    boot_reply_.resize(boot_reply_size(worker.size()));
    encode_boot_reply(BootReply{instance_, worker}, boot_reply_.data());
    boot_pid_ = ::getpid();
    try {
        boot_thread_ = std::thread([this] { boot_run(); });
    } catch (const std::system_error& e) {
        return Error(Errc::io_error,
                     fmt::format("{}: starting the bootstrap thread: {}", scheme_, e.what()));
    }
    return ok();
}

void UcxTransport::close_bootstrap() noexcept {
    if (boot_thread_.joinable()) {
        if (::getpid() == boot_pid_) {
            uint64_t one = 1;
            (void)!::write(boot_stop_fd_, &one, sizeof one);
            boot_thread_.join();
        } else {
            // A child across fork(): the thread is its parent's, and the descriptors are
            // shared with the parent; leave both alone.
            new std::thread(std::move(boot_thread_));  // never joined, never destroyed
            return;
        }
    }
    for (BootConn& c : boot_conns_)
        ::close(c.fd);
    boot_conns_.clear();
    for (int* fd : {&boot_epfd_, &boot_fd_, &boot_stop_fd_}) {
        if (*fd >= 0) ::close(*fd);
        *fd = -1;
    }
}

void UcxTransport::boot_accept(TimePoint now) {
    for (int i = 0; i < kBootAcceptBurst; ++i) {
        int fd = ::accept4(boot_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            if (e == EINTR || e == ECONNABORTED || e == EPROTO) continue;
            // Out of descriptors or memory: stop watching the listener for a while (it would
            // stay readable and the thread would spin), and say why once per pause.
            ::epoll_ctl(boot_epfd_, EPOLL_CTL_DEL, boot_fd_, nullptr);
            boot_paused_ = true;
            boot_paused_until_ = now + kBootPause;
            TALARIA_LOG(ucx, warn,
                        "{}: accepting a bootstrap connection failed: {}; not accepting for {} "
                        "ms (raise `ulimit -n` if this is the descriptor limit)",
                        scheme_, std::strerror(e),
                        std::chrono::duration_cast<std::chrono::milliseconds>(kBootPause).count());
            return;
        }
        if (boot_conns_.size() >= kMaxBootConns) {
            // The oldest is the likeliest to be one that never sends: it goes, so that a
            // crowd of silent connections cannot lock out the next good client.
            ::close(boot_conns_.front().fd);
            boot_conns_.erase(boot_conns_.begin());
        }
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        if (::epoll_ctl(boot_epfd_, EPOLL_CTL_ADD, fd, &ev) < 0) {
            ::close(fd);
            continue;
        }
        boot_conns_.push_back(BootConn{fd, now + boot_timeout(), 0, {}});
    }
}

bool UcxTransport::boot_read(BootConn& c) {
    ssize_t n = ::recv(c.fd, c.buf + c.got, sizeof c.buf - c.got, MSG_DONTWAIT);
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    if (n == 0) return true;  // closed before a whole request
    c.got += std::size_t(n);
    if (c.got < sizeof c.buf) return false;
    auto req = decode_boot_request(std::span<const std::byte>(c.buf, sizeof c.buf));
    if (!req) {
        TALARIA_LOG(ucx, debug, "{}: closing a bootstrap connection: {}", scheme_,
                    req.error().describe());
        return true;
    }
    // A fresh connection's send buffer takes a reply of a few hundred bytes whole; one that
    // does not is closed (the client's bootstrap then fails and a later send tries again).
    ssize_t w = ::send(c.fd, boot_reply_.data(), boot_reply_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w != ssize_t(boot_reply_.size())) {
        TALARIA_LOG(ucx, debug, "{}: bootstrap reply to instance {:016x} not sent whole", scheme_,
                    *req);
        return true;
    }
    // Lane 0 may sleep with no endpoint at all: wake it, and keep it from sleeping long while
    // the client's wire-up comes (progress(), try_wait_for()). ucp_worker_signal may be called
    // from any thread.
    boot_answered_at_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    ucp_worker_signal(lane_at(0)->worker);
    return true;
}

void UcxTransport::boot_run() noexcept {
    for (;;) {
        auto now = Clock::now();
        std::erase_if(boot_conns_, [&](const BootConn& c) {
            if (now < c.deadline) return false;
            ::close(c.fd);
            return true;
        });
        if (boot_paused_ && now >= boot_paused_until_) {
            epoll_event ev{};
            ev.events = EPOLLIN;
            ev.data.fd = boot_fd_;
            if (::epoll_ctl(boot_epfd_, EPOLL_CTL_ADD, boot_fd_, &ev) == 0 || errno == EEXIST)
                boot_paused_ = false;
            else
                boot_paused_until_ = now + kBootPause;
        }
        // Sleep until something arrives, the oldest connection's deadline, or the pause's end.
        // (Connections are in deadline order: each gets the same time from when it came.)
        TimePoint wake = boot_conns_.empty() ? TimePoint::max() : boot_conns_.front().deadline;
        if (boot_paused_) wake = std::min(wake, boot_paused_until_);
        epoll_event evs[16];
        int n = ::epoll_wait(boot_epfd_, evs, 16, ms_until(wake));
        if (n < 0 && errno != EINTR) {
            TALARIA_LOG(ucx, error, "{}: the bootstrap thread's epoll_wait: {}; it stops", scheme_,
                        std::strerror(errno));
            return;
        }
        now = Clock::now();
        for (int i = 0; i < n; ++i) {
            int fd = evs[i].data.fd;
            if (fd == boot_stop_fd_) return;
            if (fd == boot_fd_) {
                boot_accept(now);
                continue;
            }
            auto it = std::find_if(boot_conns_.begin(), boot_conns_.end(),
                                   [fd](const BootConn& c) { return c.fd == fd; });
            if (it == boot_conns_.end()) continue;
            if (boot_read(*it)) {
                ::close(it->fd);
                boot_conns_.erase(it);
            }
        }
    }
}

namespace {

/// Wait until `fd` is ready for `events` or `deadline` passes (timeout).
Errc wait_fd(int fd, short events, TimePoint deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        int r = ::poll(&p, 1, ms_until(deadline));
        if (r > 0) return Errc::ok;
        if (r == 0) return Errc::timeout;
        if (errno != EINTR) return Errc::io_error;
    }
}

}  // namespace

Result<std::vector<std::byte>> UcxTransport::bootstrap(const UcxAddr& peer) {
    const Duration limit = boot_timeout();
    const TimePoint deadline = Clock::now() + limit;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limit).count();
    auto fail = [&](Errc code, const std::string& why) {
        return Error(code, fmt::format("{}: reaching {}: {}", scheme_, peer.str, why));
    };
    FdGuard g{::socket(peer.sa.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
    if (g.fd < 0) return fail(Errc::io_error, fmt::format("socket: {}", std::strerror(errno)));
    int one = 1;
    ::setsockopt(g.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int err = 0;
    if (::connect(g.fd, peer.sa.sa(), peer.sa.len) < 0) {
        if (errno != EINPROGRESS) {
            err = errno;
        } else if (Errc w = wait_fd(g.fd, POLLOUT, deadline); w != Errc::ok) {
            return fail(Errc::unreachable,
                        w == Errc::timeout
                            ? fmt::format("no connection within {} ms (na::Options::"
                                          "hello_timeout): is the host up and the port open?",
                                          ms)
                            : fmt::format("poll: {}", std::strerror(errno)));
        } else {
            socklen_t len = sizeof err;
            ::getsockopt(g.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
    }
    if (err != 0)
        return fail(Errc::unreachable,
                    err == ECONNREFUSED
                        ? std::string("connection refused: nothing listens there (is the server "
                                      "up, and is this the address it printed?)")
                        : fmt::format("connect: {}", std::strerror(err)));
    std::byte req[kBootRequestSize];
    encode_boot_request(instance_, req);
    std::size_t sent = 0;
    while (sent < sizeof req) {
        ssize_t w = ::send(g.fd, req + sent, sizeof req - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            sent += std::size_t(w);
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(g.fd, POLLOUT, deadline) != Errc::ok)
                return fail(Errc::unreachable, fmt::format("request not sent within {} ms", ms));
        } else {
            return fail(Errc::disconnected, fmt::format("send: {}", std::strerror(errno)));
        }
    }
    std::vector<std::byte> reply(kBootReplyFixedSize);
    std::size_t got = 0;
    auto read_to = [&](std::size_t want) -> Result<void> {
        while (got < want) {
            ssize_t r = ::recv(g.fd, reply.data() + got, want - got, MSG_DONTWAIT);
            if (r > 0) {
                got += std::size_t(r);
            } else if (r == 0) {
                return fail(Errc::protocol_error,
                            "the peer closed the connection without a bootstrap reply: is it a "
                            "Talaria ucx+tcp server of this version (and not, say, a tcp:// "
                            "one)?");
            } else if (errno == EAGAIN || errno == EINTR) {
                if (wait_fd(g.fd, POLLIN, deadline) != Errc::ok)
                    return fail(Errc::unreachable,
                                fmt::format("no bootstrap reply within {} ms (na::Options::"
                                            "hello_timeout): is that process progressing its "
                                            "context 0?",
                                            ms));
            } else {
                return fail(Errc::disconnected, fmt::format("recv: {}", std::strerror(errno)));
            }
        }
        return {};
    };
    TALARIA_CHECK(read_to(kBootReplyFixedSize));
    auto wlen = decode_boot_reply_fixed(reply);
    if (!wlen) return fail(Errc::protocol_error, wlen.error().describe());
    reply.resize(kBootReplyFixedSize + *wlen);
    TALARIA_CHECK(read_to(reply.size()));
    auto r = decode_boot_reply(reply);
    if (!r) return fail(Errc::protocol_error, r.error().describe());
    TALARIA_LOG(ucx, debug, "{}: {} is instance {:016x}, its context 0 at a {}-byte worker address",
                scheme_, peer.str, r->instance, r->worker.size());
    return std::vector<std::byte>(r->worker.begin(), r->worker.end());
}

}  // namespace talaria::na::ucx
