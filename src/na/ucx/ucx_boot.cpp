// The ucx transport's bootstrap in sockaddr mode ("ucx+tcp://host:port"): the port a server
// advertises is a plain TCP socket of ours, not UCX's listener. UCX 1.13's socket connection
// manager asserts on the first foreign bytes it parses (a 16-byte header claiming a huge
// private-data length aborts the process, 100 kB of random bytes leave its async thread
// spinning), so it must never face the network. A client connects to the port, sends a
// 16-byte request, reads an answer naming the server's context-0 worker, closes, and reaches
// that worker by its packed address (ucp_ep_create with REMOTE_ADDRESS) as in worker mode.
// A thread the transport owns (joined when it closes) serves the port: it reads exactly one
// request per connection, answers it, and closes; anything else is closed unanswered.
// With na::Options::auth both sides prove the shared secret here (challenge and response, as on
// tcp) before the server names its worker, and derive a session key that signs every hello
// between them (the worker's UCT ports are reachable by anyone who learns its address: an
// unsigned hello there starts no stream, so nothing a stranger sends reaches a context). Wire
// format: wire.hpp, docs/protocol.md (ucx bootstrap, hello).
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
    boot_reply_.resize(kBootFixedSize + worker.size());
    encode_boot_fixed(BootFixed{BootKind::answer, worker.size(), instance_}, boot_reply_.data());
    std::memcpy(boot_reply_.data() + kBootFixedSize, worker.data(), worker.size());
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
        SockAddr from;
        from.len = sizeof from.storage;
        int fd = ::accept4(boot_fd_, from.sa(), &from.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
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
        BootConn c;
        c.fd = fd;
        c.from = from;
        c.deadline = now + boot_timeout();
        boot_conns_.push_back(c);
    }
}

bool UcxTransport::boot_read(BootConn& c) {
    for (;;) {
        std::size_t want = kBootFixedSize;
        BootFixed f;
        if (c.got >= kBootFixedSize) {
            auto d = decode_boot_fixed(std::span<const std::byte>(c.buf, kBootFixedSize));
            const BootKind expect = c.challenged ? BootKind::response : BootKind::request;
            if (!d || d->kind != expect) {
                TALARIA_LOG(ucx, debug, "{}: closing a bootstrap connection: {}", scheme_,
                            d ? fmt::format("a frame of kind {} where a {} belongs",
                                            uint8_t(d->kind), c.challenged ? "response" : "request")
                              : d.error().describe());
                return true;
            }
            f = *d;
            want += f.length;  // within buf: decode bounds a request's and a response's body
        }
        if (c.got < want) {
            ssize_t n = ::recv(c.fd, c.buf + c.got, want - c.got, MSG_DONTWAIT);
            if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
            if (n == 0) {  // closed before a whole frame
                if (c.challenged)
                    boot_warn(
                        fmt::format("instance {:016x} closed its bootstrap after our "
                                    "challenge: it could not check our proof (it holds "
                                    "another secret for key '{}'?)",
                                    c.instance, opts_.auth.key_id));
                return true;
            }
            c.got += std::size_t(n);
            if (c.got < want) return false;
            continue;  // a whole fixed part: now its body
        }
        return boot_handle(c, f, std::span<const std::byte>(c.buf + kBootFixedSize, f.length));
    }
}

namespace {
/// Send a whole small frame on a fresh connection's empty send buffer (a few hundred bytes);
/// false if it did not go whole (the connection is then closed: the client's bootstrap fails
/// and a later send tries again).
bool send_whole(int fd, std::span<const std::byte> frame) {
    ssize_t w;
    do {
        w = ::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (w < 0 && errno == EINTR);
    return w == ssize_t(frame.size());
}
}  // namespace

bool UcxTransport::boot_handle(BootConn& c, const BootFixed& f, std::span<const std::byte> body) {
    const Auth& a = opts_.auth;
    if (f.kind == BootKind::request) {
        auto req = decode_boot_request_body(body);
        if (!req) {
            TALARIA_LOG(ucx, debug, "{}: closing a bootstrap connection: {}", scheme_,
                        req.error().describe());
            return true;
        }
        c.instance = f.instance;
        if (!a.enabled()) {
            if (!req->key_id.empty())
                return boot_refuse(c,
                                   "the client asked to authenticate, but this server has no "
                                   "shared secret (na::Options::auth): configure the same key "
                                   "id and secret on both sides");
            return boot_answer(c);
        }
        if (req->key_id.empty())
            return boot_refuse(c, fmt::format("this server admits only peers that authenticate "
                                              "with the secret of key '{}': set "
                                              "na::Options::auth on the client",
                                              a.key_id));
        if (req->key_id != a.key_id)
            // Escaped ({:?}): the peer's bytes go to our log and back to it.
            return boot_refuse(c, fmt::format("the client names key {:?}, this server holds key "
                                              "'{}'",
                                              req->key_id, a.key_id));
        auto nonce = auth::random_nonce();
        if (!nonce) {
            TALARIA_LOG(ucx, error, "{}: bootstrap challenge: {}", scheme_,
                        nonce.error().describe());
            return true;
        }
        c.own = *nonce;
        std::memcpy(c.peer.data(), req->nonce.data(), auth::kNonceSize);
        const auth::Proof proof =
            auth::prove(a.secret, auth::Role::acceptor, c.own, c.peer, a.key_id);
        std::byte out[kBootFixedSize + kBootNonceSize + kBootProofSize];
        encode_boot_fixed(
            BootFixed{BootKind::challenge, kBootNonceSize + kBootProofSize, boot_alias()}, out);
        std::memcpy(out + kBootFixedSize, c.own.data(), kBootNonceSize);
        std::memcpy(out + kBootFixedSize + kBootNonceSize, proof.data(), kBootProofSize);
        if (!send_whole(c.fd, out)) return true;
        c.challenged = true;
        c.got = 0;
        return false;
    }
    // The response to our challenge.
    if (f.instance != c.instance)
        return boot_refuse(c, "the response names another instance than the request");
    const auth::Proof expected =
        auth::prove(a.secret, auth::Role::connector, c.peer, c.own, a.key_id);
    if (!auth::matches(expected, body))
        return boot_refuse(c, fmt::format("the client's proof does not match the secret of key "
                                          "'{}' (a different secret)",
                                          a.key_id));
    Session s;
    s.instance = c.instance;
    s.id = detail::load_le(c.own.data(), 8);
    s.key = auth::prove(a.secret, auth::Role::session, c.peer, c.own, a.key_id);
    add_session(s);
    admit_host(c.from);  // before it learns our worker: its UCX connects next
    return boot_answer(c);
}

bool UcxTransport::boot_answer(BootConn& c) {
    if (!send_whole(c.fd, boot_reply_)) {
        TALARIA_LOG(ucx, debug, "{}: bootstrap answer to instance {:016x} not sent whole", scheme_,
                    c.instance);
        return true;
    }
    // Lane 0 may sleep with no endpoint at all: wake it, and keep it from sleeping long while
    // the client's wire-up comes (progress(), try_wait_for()). ucp_worker_signal may be called
    // from any thread.
    boot_answered_at_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    ucp_worker_signal(lane_at(0)->worker);
    return true;
}

void UcxTransport::boot_warn(const std::string& what) {
    // Strangers may knock as often as they like: one line a second at most.
    if (auto held = boot_log_.admit())
        TALARIA_LOG(ucx, warn, "{}: {}{}", scheme_, what, unlogged_note(std::size_t(*held)));
}

uint64_t UcxTransport::boot_alias() noexcept {
    // What a challenge or a refusal names as its sender: not our instance, which names our
    // streams in every message, and which only a peer that proved the secret learns (in the
    // answer).
    auto n = auth::random_nonce();
    uint64_t v = n ? detail::load_le(n->data(), 8) : 0;
    return v != 0 ? v : 1;
}

bool UcxTransport::boot_refuse(BootConn& c, const std::string& why) {
    note(LinkEvent::connect_failed);  // a peer's attempt, refused here
    boot_warn(fmt::format("refusing the bootstrap of instance {:016x}: {}", c.instance, why));
    std::string_view reason(why);
    if (reason.size() > kBootMaxReason) reason = reason.substr(0, kBootMaxReason);
    std::byte out[kBootFixedSize + kBootMaxReason];
    encode_boot_fixed(BootFixed{BootKind::refused, reason.size(), boot_alias()}, out);
    std::memcpy(out + kBootFixedSize, reason.data(), reason.size());
    (void)send_whole(c.fd, std::span<const std::byte>(out, kBootFixedSize + reason.size()));
    // Read what the client already sent, so that closing sends a FIN after the refusal rather
    // than a reset that could overtake it.
    std::byte sink[512];
    for (int i = 0; i < 4 && ::recv(c.fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
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
        check_listeners(now);
        TimePoint wake = boot_conns_.empty() ? TimePoint::max() : boot_conns_.front().deadline;
        if (boot_paused_) wake = std::min(wake, boot_paused_until_);
        wake = std::min(wake, next_listener_check());
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

Result<BootResult> UcxTransport::bootstrap(const UcxAddr& peer) {
    const Duration limit = boot_timeout();
    const TimePoint deadline = Clock::now() + limit;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limit).count();
    {
        std::lock_guard fg(peer.failure_mu);
        peer.failure.clear();  // a new attempt: an older failure no longer explains
    }
    auto fail = [&](Errc code, const std::string& why) {
        note(LinkEvent::connect_failed);  // called once, by the path that gives up
        {
            // Kept for the error of the operations that waited on this (peer_failure).
            std::lock_guard fg(peer.failure_mu);
            peer.failure = why;
        }
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
    if (err != 0) return fail(Errc::unreachable, connect_failure_text(peer.key, err));
    const Auth& a = opts_.auth;
    auth::Nonce own{};
    if (a.enabled()) {
        TALARIA_TRY(n, auth::random_nonce());
        own = n;
    }
    auto send_all = [&](std::span<const std::byte> frame) -> Result<void> {
        std::size_t sent = 0;
        while (sent < frame.size()) {
            ssize_t w =
                ::send(g.fd, frame.data() + sent, frame.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) {
                sent += std::size_t(w);
            } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
                if (wait_fd(g.fd, POLLOUT, deadline) != Errc::ok)
                    return fail(Errc::unreachable,
                                fmt::format("bootstrap request not sent within {} ms", ms));
            } else {
                return fail(Errc::disconnected, fmt::format("send: {}", std::strerror(errno)));
            }
        }
        return {};
    };
    std::vector<std::byte> in;
    auto read_to = [&](std::size_t want) -> Result<void> {
        std::size_t got = in.size();
        in.resize(want);
        while (got < want) {
            ssize_t r = ::recv(g.fd, in.data() + got, want - got, MSG_DONTWAIT);
            if (r > 0) {
                got += std::size_t(r);
            } else if (r == 0) {
                return fail(Errc::protocol_error,
                            "the peer closed the connection without a bootstrap answer: is it a "
                            "Talaria ucx+tcp server of this version (and not, say, a tcp:// "
                            "one)?");
            } else if (errno == EAGAIN || errno == EINTR) {
                if (wait_fd(g.fd, POLLIN, deadline) != Errc::ok)
                    return fail(Errc::unreachable,
                                fmt::format("no bootstrap answer within {} ms (na::Options::"
                                            "hello_timeout): is that process progressing its "
                                            "context 0?",
                                            ms));
            } else {
                return fail(Errc::disconnected, fmt::format("recv: {}", std::strerror(errno)));
            }
        }
        return {};
    };
    // One frame from the server: a refusal fails the bootstrap with its reason.
    auto read_frame = [&]() -> Result<BootFixed> {
        in.clear();
        TALARIA_CHECK(read_to(kBootFixedSize));
        auto f = decode_boot_fixed(in);
        if (!f) return fail(Errc::protocol_error, f.error().describe());
        TALARIA_CHECK(read_to(kBootFixedSize + f->length));
        if (f->kind == BootKind::refused) {
            auto why = decode_boot_refused(std::span<const std::byte>(in).subspan(kBootFixedSize));
            return fail(Errc::access_denied,
                        fmt::format("refused: {}; {}", why ? *why : why.error().describe(),
                                    auth::client_side(a)));
        }
        if (f->kind != BootKind::challenge && f->kind != BootKind::answer)
            return fail(
                Errc::protocol_error,
                fmt::format("a bootstrap frame of kind {} from the server", uint8_t(f->kind)));
        return f;
    };
    {
        std::byte req[kBootFixedSize + kBootMaxRequestBody];
        const std::size_t body = a.enabled() ? boot_request_body_size(a.key_id) : 0;
        encode_boot_fixed(BootFixed{BootKind::request, body, instance_}, req);
        if (a.enabled()) encode_boot_request_body(a.key_id, own, req + kBootFixedSize);
        TALARIA_CHECK(send_all(std::span<const std::byte>(req, kBootFixedSize + body)));
    }
    TALARIA_TRY(f, read_frame());
    std::optional<Session> session;
    if (a.enabled()) {
        if (f.kind != BootKind::challenge)
            return fail(Errc::access_denied,
                        fmt::format("the server answered without proving that it holds the "
                                    "secret of key '{}' (it runs without na::Options::auth?): "
                                    "configure the same key id and secret on both sides",
                                    a.key_id));
        auto body = std::span<const std::byte>(in).subspan(kBootFixedSize);
        auto nonce = body.first(kBootNonceSize);
        if (!auth::matches(auth::prove(a.secret, auth::Role::acceptor, nonce, own, a.key_id),
                           body.subspan(kBootNonceSize)))
            return fail(Errc::access_denied,
                        fmt::format("the server could not prove that it holds the secret of key "
                                    "'{}' (a different secret, or not the server meant); {}",
                                    a.key_id, auth::client_side(a)));
        Session sess;  // its instance is the answer's (the challenge does not name it)
        sess.id = detail::load_le(nonce.data(), 8);
        sess.key = auth::prove(a.secret, auth::Role::session, own, nonce, a.key_id);
        const auth::Proof proof =
            auth::prove(a.secret, auth::Role::connector, own, nonce, a.key_id);
        std::byte resp[kBootFixedSize + kBootProofSize];
        encode_boot_fixed(BootFixed{BootKind::response, kBootProofSize, instance_}, resp);
        std::memcpy(resp + kBootFixedSize, proof.data(), kBootProofSize);
        TALARIA_CHECK(send_all(resp));
        TALARIA_TRY(f2, read_frame());
        if (f2.kind != BootKind::answer)
            return fail(Errc::protocol_error, "the server's answer to our response is not one");
        f = f2;
        sess.instance = f.instance;
        session = sess;
    } else if (f.kind != BootKind::answer) {
        return fail(Errc::access_denied,
                    "the server asks to authenticate, but this transport has no shared secret "
                    "(na::Options::auth): configure the same key id and secret on both sides");
    }
    auto worker = std::span<const std::byte>(in).subspan(kBootFixedSize);
    TALARIA_LOG(ucx, debug,
                "{}: {} is instance {:016x}, its context 0 at a {}-byte worker address{}", scheme_,
                peer.str, f.instance, worker.size(), session ? " (authenticated)" : "");
    if (session) {
        add_session(*session);
        admit_host(peer.sa);  // the server's UCX may connect to our workers
    }
    BootResult out;
    out.worker.assign(worker.begin(), worker.end());
    out.instance = f.instance;
    out.session = session;
    return out;
}

// --- sessions (Options::auth)
// ---------------------------------------------------------------------

void UcxTransport::add_session(const Session& s) {
    std::lock_guard g(auth_mu_);
    std::size_t same = 0;
    for (const Session& o : sessions_)
        same += o.instance == s.instance;
    if (same >= kMaxSessionsPerPeer) {
        auto it = std::find_if(sessions_.begin(), sessions_.end(),
                               [&](const Session& o) { return o.instance == s.instance; });
        sessions_.erase(it);
    } else if (sessions_.size() >= kMaxSessions) {
        sessions_.erase(sessions_.begin());
    }
    sessions_.push_back(s);
}

std::optional<Session> UcxTransport::find_session(uint64_t instance, std::optional<uint64_t> id) {
    if (instance == instance_) {
        if (id && *id != self_session_.id) return std::nullopt;
        return self_session_;
    }
    std::lock_guard g(auth_mu_);
    for (auto it = sessions_.rbegin(); it != sessions_.rend(); ++it)
        if (it->instance == instance && (!id || it->id == *id)) return *it;
    return std::nullopt;
}

namespace {
auth::Proof hello_mac(const auth::Proof& key, std::span<const std::byte> header,
                      std::span<const std::byte> body, uint64_t id) {
    std::byte idb[8];
    detail::store_le(idb, id, 8);
    return auth::mac(key, {header, body, idb});
}
}  // namespace

void UcxTransport::sign_hello(const Session& s, Ep* e) const {
    std::span<std::byte> all(e->hello);
    std::span<const std::byte> body = all.first(all.size() - kHelloTailSize);
    std::byte* tail = all.data() + body.size();
    detail::store_le(tail, s.id, 8);
    const auth::Proof m = hello_mac(s.key, e->hello_hdr, body, s.id);
    std::memcpy(tail + 8, m.data(), m.size());
}

Result<void> UcxTransport::check_hello(const MsgHeader& h, const Hello& hello) {
    if (!(h.tag & kHelloSigned))
        return Error(Errc::access_denied,
                     "it is not signed (this transport has na::Options::auth: peers reach it "
                     "through its bootstrap port, where they prove the secret)");
    auto s = find_session(h.instance, hello.session);
    if (!s)
        return Error(Errc::access_denied,
                     fmt::format("no session {:016x} with instance {:016x} (it never proved the "
                                 "secret here, or its session was evicted)",
                                 hello.session, h.instance));
    std::byte hdr[kMsgHeaderSize];
    encode_msg_header(h, hdr);
    if (!auth::matches(hello_mac(s->key, hdr, hello.body, s->id), hello.mac))
        return Error(Errc::access_denied, "its signature does not match its session's key");
    return {};
}

PeerIdentity UcxTransport::peer_identity(const Addr& a) {
    PeerIdentity id;
    if (!a || a.impl()->transport() != this || !opts_.auth.enabled()) return id;
    // With a secret, only signed hellos start streams, and only peers that proved the secret
    // hold a session to sign them with; one secret per transport.
    id.key_id = opts_.auth.key_id;
    return id;
}

}  // namespace talaria::na::ucx
