// tcp transport setup: opening, contexts, addresses, memory registration, sockets.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>

#include <fmt/format.h>

#include "na/base/epoll_set.hpp"
#include "na/base/transports.hpp"
#include "na/tcp/tcp.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

Result<std::unique_ptr<Transport>> open_tcp(std::string_view rest, const Options& o) {
    auto t = std::make_unique<tcp::TcpTransport>(o);
    TALARIA_CHECK(t->init(rest));
    return std::unique_ptr<Transport>(std::move(t));
}

namespace tcp {

namespace {

constexpr std::string_view kScheme = "tcp://";

uint64_t random_u64() {
    uint64_t v = 0;
    while (v == 0) {
        if (::getrandom(&v, sizeof v, 0) != ssize_t(sizeof v)) {
            // getrandom cannot fail for 8 bytes once the pool is initialised; mix the clock in
            // as a fallback all the same.
            v ^= now_ns() * 0x9e3779b97f4a7c15ull;
        }
    }
    return v;
}

/// Parse host:port only if host is a numeric IPv4/IPv6 literal: strings from the wire must
/// never trigger a (blocking) name lookup.
Result<SockAddr> parse_numeric(std::string_view s) {
    std::string host;
    if (!s.empty() && s.front() == '[') {
        auto close = s.find(']');
        if (close == std::string_view::npos)
            return Error(Errc::address_invalid, fmt::format("'{}': missing ']'", s));
        host = std::string(s.substr(1, close - 1));
        in6_addr a6;
        if (inet_pton(AF_INET6, host.c_str(), &a6) != 1)
            return Error(Errc::address_invalid, fmt::format("'{}': not an IPv6 literal", s));
    } else {
        host = std::string(s.substr(0, s.rfind(':')));
        in_addr a4;
        if (inet_pton(AF_INET, host.c_str(), &a4) != 1)
            return Error(Errc::address_invalid, fmt::format("'{}': not an IPv4 literal", s));
    }
    return parse_host_port(s, false);
}

/// Options on every connection: no Nagle delay (messages are latency-bound), and a dead peer
/// on another host is noticed within about a minute even when it cannot send a FIN/RST:
/// keep-alive probes on idle connections, TCP_USER_TIMEOUT on unacknowledged data, and fewer
/// SYN retries for a connect that gets no answer (about 15 s instead of about 2 min).
void tune_socket(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = 30, intvl = 5, cnt = 4, syncnt = 3;
    unsigned user_timeout_ms = 60000;
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
    ::setsockopt(fd, IPPROTO_TCP, TCP_SYNCNT, &syncnt, sizeof syncnt);
}

}  // namespace

// --- contexts -----------------------------------------------------------------------------------

Lane::Lane(uint8_t lane_id, const Options& o)
    : mu(o.thread_safe),
      id(lane_id),
      ops(o.max_ops, o.thread_safe, &releaser),
      match(o.max_contexts) {
    epfd = ::epoll_create1(EPOLL_CLOEXEC);
    bell_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epfd < 0 || bell_fd < 0) return;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &bell_fd;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, bell_fd, &ev) < 0) {
        ::close(bell_fd);
        bell_fd = -1;
    }
}

void Lane::Releaser::release(Op* op) noexcept {
    if (static_cast<TcpOp*>(op)->borrowed) l->borrowed.fetch_sub(1, std::memory_order_relaxed);
    l->ops.release(op);
}

Lane::~Lane() {
    if (bell_fd >= 0) ::close(bell_fd);
    if (epfd >= 0) ::close(epfd);
}

TcpContext::TcpContext(TcpTransport* t, uint8_t id, bool thread_safe, Lane* lane)
    : Context(t, id, thread_safe), tt_(t), lane_(lane) {
    block_epfd_ = epoll_set_of({lane->epfd, t->progress_fd(), event_fd()});
    if (block_epfd_ < 0)
        TALARIA_LOG(tcp, error, "context {}: its epoll set: {}", id, std::strerror(errno));
}

TcpContext::~TcpContext() {
    if (attached) tt_->context_destroyed(this);
    if (block_epfd_ >= 0) ::close(block_epfd_);
}

Lane& TcpTransport::lane_of(Context& ctx) noexcept {
    return static_cast<TcpContext&>(ctx).lane();
}

Result<std::unique_ptr<Context>> TcpTransport::context_create(uint8_t id,
                                                              const ContextOptions& opts) {
    if (id >= opts_.max_contexts)
        return Error(Errc::invalid_argument,
                     fmt::format("context id {} out of range: this tcp transport has "
                                 "Options::max_contexts = {}",
                                 id, opts_.max_contexts));
    std::lock_guard g(setup_mu_);
    Lane* l = lanes_[id].get();
    if (l && l->ctx)
        return Error(Errc::already_exists,
                     fmt::format("context {} already exists on this tcp endpoint: destroy it "
                                 "first, or pick another id",
                                 id));
    if (!l) {
        auto nl = std::make_unique<Lane>(id, opts_);
        if (nl->epfd < 0 || nl->bell_fd < 0)
            return errno_error("tcp: epoll_create1/eventfd (a context's set and bell)", errno);
        l = nl.get();
        lanes_[id] = std::move(nl);
        lane_ptr_[id].store(l, std::memory_order_release);
    }
    auto ctx = std::make_unique<TcpContext>(this, id, opts_.thread_safe, l);
    ctx->set_takes_unexpected(opts.unexpected);
    if (ctx->block_fd() < 0)
        return Error(Errc::io_error, fmt::format("context {}: {}", id, kEpollSetRemedy));
    if (!ctx->watch_fd(l->epfd)) return errno_error("tcp: epoll_ctl(a context's set)", errno);
    {
        std::lock_guard lg(l->mu);
        l->match.attach(ctx.get());
        std::lock_guard rg(route_mu_);
        l->ctx = ctx.get();
    }
    ctx->attached = true;
    return std::unique_ptr<Context>(std::move(ctx));
}

void TcpTransport::context_destroyed(TcpContext* ctx) noexcept {
    Lane& l = ctx->lane();
    std::lock_guard g(setup_mu_);
    withdraw_borrowed_locked(l, ctx);
    std::lock_guard lg(l.mu);
    if (l.ctx != ctx) return;
    // Its connections go with it: peers see them close and reconnect to the contexts left
    // (the lowest one answers for a context that is gone).
    close_lane_locked(l, Errc::canceled, fmt::format("context {} is destroyed", l.id));
    // The caller should have canceled and drained; release receives still posted on it so
    // that nothing refers to the dead context.
    l.match.detach(l.id, [](TcpOp* op) {
        op->state = OpState::idle;
        op->match_source.reset();
        op->releaser->release(op);
    });
    l.match.clear();  // early expected messages answered receives of the context that went
    {
        std::lock_guard rg(route_mu_);
        l.ctx = nullptr;
        l.inbox.clear();
        l.inbox_bytes = 0;
        l.has_inbox.store(false, std::memory_order_relaxed);
    }
    reap_dead(l);
}

// --- transport lifetime -------------------------------------------------------------------------

TcpTransport::TcpTransport(const Options& o)
    : addrs_(o.thread_safe),
      opts_(o),
      setup_mu_(o.thread_safe),
      route_mu_(o.thread_safe),
      regions_mu_(o.thread_safe),
      lanes_(o.max_contexts),
      lane_ptr_(new std::atomic<Lane*>[o.max_contexts]) {
    for (std::size_t i = 0; i < o.max_contexts; ++i)
        lane_ptr_[i].store(nullptr, std::memory_order_relaxed);
}

TcpTransport::~TcpTransport() {
    auto drop = [](Lane* l, Conn* c) {
        if (c->fd >= 0) ::close(c->fd);
        while (SendItem* it = c->sendq.pop_front()) {
            if (it->kind == SendItem::Kind::control) {
                auto* ctl = static_cast<Control*>(it);
                ctl->owned.reset();
                if (l) l->free_controls.push_back(ctl);
            }
        }
        c->rma_wait.clear();
        if (c->rx_msg && l) l->match.msg_free(c->rx_msg);
        delete c;
    };
    for (auto& l : lanes_) {
        if (!l) continue;
        while (Conn* c = l->conns.pop_front())
            drop(l.get(), c);
        for (Conn* c : l->dead)
            delete c;
        l->dead.clear();
        l->routes.clear();
        l->match.clear();
    }
    while (Conn* c = pending_.pop_front())
        drop(nullptr, c);
    for (Conn* c : pending_dead_)
        delete c;
    pending_dead_.clear();
    lanes_.clear();
    // Every connection is gone (each dropped its peer reference), so no address points at one.
    self_.reset();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (spare_fd_ >= 0) ::close(spare_fd_);
    if (setup_epfd_ >= 0) ::close(setup_epfd_);
}

Result<void> TcpTransport::init(std::string_view rest) {
    instance_ = random_u64();
    setup_epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (setup_epfd_ < 0) return errno_error("tcp: epoll_create1", errno);

    if (!opts_.listen) {
        // A client: validate the host part but do not bind; identify by instance id.
        if (!rest.empty()) TALARIA_CHECK(parse_host_port(rest, true));
        auto* self = new TcpAddr(this, &addrs_, fmt::format("tcp://~{:016x}", instance_), true);
        self_ = Addr(self);
        addrs_.add(self->str, self);
        return ok();
    }

    TALARIA_TRY(sa, parse_host_port(rest, true));
    SockAddr bind_sa = sa;
    listen_fd_ = ::socket(sa.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return errno_error("tcp: socket", errno);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_fd_, bind_sa.sa(), bind_sa.len) < 0) {
        int e = errno;
        return Error(e == EADDRINUSE ? Errc::address_in_use : Errc::io_error,
                     fmt::format("tcp: cannot bind {}: {}{}", bind_sa.to_string(), std::strerror(e),
                                 e == EADDRINUSE ? " (use port 0 to pick a free port)" : ""));
    }
    if (::listen(listen_fd_, SOMAXCONN) < 0) return errno_error("tcp: listen", errno);
    spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    SockAddr bound;
    bound.len = sizeof bound.storage;
    if (::getsockname(listen_fd_, bound.sa(), &bound.len) < 0)
        return errno_error("tcp: getsockname", errno);
    // Advertise a connectable host (a wildcard bind as the loopback address).
    const SockAddr adv = advertised(bound);
    auto* self = new TcpAddr(this, &addrs_, std::string(kScheme) + adv.to_string(), false);
    self->sa = adv;
    self_ = Addr(self);
    addrs_.add(self->str, self);

    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_fd_;
    if (::epoll_ctl(setup_epfd_, EPOLL_CTL_ADD, listen_fd_, &ev) < 0)
        return errno_error("tcp: epoll_ctl(listen)", errno);
    TALARIA_LOG(tcp, debug, "listening on {} (instance {:016x})", self->str, instance_);
    return ok();
}

// --- addresses ----------------------------------------------------------------------------------

TcpAddr::~TcpAddr() {
    // No lock of the transport here (we may be running under it): only the table's leaf lock.
    for (const std::string& s : aliases)
        table_->unlink(s, this);
    table_->remove(str, this);
}

Addr TcpTransport::intern_locked(const std::string& canonical, bool anonymous,
                                 const SockAddr* from) {
    if (Addr a = addrs_.find(canonical)) return a;
    auto* a = new TcpAddr(this, &addrs_, canonical, anonymous);
    if (from) a->sa = *from;
    Addr out(a);
    addrs_.add(canonical, a);
    return out;
}

Result<Addr> TcpTransport::lookup_locked(std::string_view address, bool numeric_only) {
    std::string_view rest = address;
    if (rest.starts_with(kScheme)) {
        rest.remove_prefix(kScheme.size());
    } else if (rest.find("://") != std::string_view::npos) {
        return Error(Errc::address_invalid,
                     fmt::format("'{}' is not a tcp address (expected tcp://host:port)", address));
    }
    std::string full = std::string(kScheme) + std::string(rest);
    if (Addr a = addrs_.find(full)) return a;
    if (!rest.empty() && rest.front() == '~')
        return Error(Errc::unreachable,
                     fmt::format("'{}' names a client that does not listen and is not connected "
                                 "to this endpoint",
                                 address));
    Result<SockAddr> sa = numeric_only ? parse_numeric(rest) : parse_host_port(rest, false);
    if (!sa) return std::move(sa).error();
    if (sa->port() == 0)
        return Error(Errc::address_invalid,
                     fmt::format("'{}' has port 0, which names no peer: use the address the "
                                 "server reports (Engine::self_address(), or "
                                 "addr_to_string(addr_self()) at the na layer)",
                                 address));
    std::string canonical = std::string(kScheme) + sa->to_string();
    Addr out = intern_locked(canonical, false);
    auto* a = out.as<TcpAddr>();
    // Written once, before any other thread can see the address (connect() reads it).
    if (a->sa.len == 0) a->sa = *sa;
    // Remember a name under which it was looked up, so that the next lookup of the same string
    // does not resolve again (a few per address: the table must not grow without bound).
    if (full != canonical && a->aliases.size() < kMaxAliases &&
        std::find(a->aliases.begin(), a->aliases.end(), full) == a->aliases.end()) {
        addrs_.alias(full, a);
        a->aliases.push_back(std::move(full));
    }
    return out;
}

Result<Addr> TcpTransport::addr_lookup(std::string_view address) {
    std::lock_guard g(setup_mu_);
    return lookup_locked(address, false);
}

Addr TcpTransport::addr_alias(const Addr& a) {
    if (!a || a.impl()->transport() != this) return a;
    return alias_of(this, a);
}

std::string TcpTransport::addr_to_string(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    return peer_of(a)->str;
}

std::string TcpTransport::addr_describe(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    const TcpAddr* p = peer_of(a);
    if (!p->anonymous || p->sa.len == 0) return p->str;
    return fmt::format("{} (from {})", p->str, p->sa.to_string());
}

PeerIdentity TcpTransport::peer_identity(const Addr& a) {
    PeerIdentity id;
    if (!a || a.impl()->transport() != this || !opts_.auth.enabled()) return id;
    // With a secret, no frame of a peer reaches a context before it proved it holds that
    // secret (auth_hello, auth_frame), and there is one secret per transport.
    id.key_id = opts_.auth.key_id;
    return id;
}

std::string TcpTransport::peer_failure(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    TcpAddr* p = peer_of(a);
    std::lock_guard g(p->failure_mu);
    return p->failure;
}

std::string connect_failure(TcpAddr* peer, int err) {
    std::string_view where = peer->str;
    if (where.starts_with(kScheme)) where.remove_prefix(kScheme.size());
    std::string why = connect_failure_text(where, err);
    std::lock_guard g(peer->failure_mu);
    peer->failure = why;
    return why;
}

std::size_t TcpTransport::addr_serialize_size(const Addr& a) {
    if (!a || a.impl()->transport() != this) return 0;
    return 2 + peer_of(a)->str.size();
}

Result<std::size_t> TcpTransport::addr_serialize(const Addr& a, std::span<std::byte> out) {
    if (!a || a.impl()->transport() != this)
        return Error(Errc::invalid_argument, "addr_serialize: not a tcp address of this transport");
    const std::string& s = peer_of(a)->str;
    if (out.size() < 2 + s.size())
        return Error(
            Errc::invalid_argument,
            fmt::format("addr_serialize: needs {} bytes, buffer has {}", 2 + s.size(), out.size()));
    detail::store_le(out.data(), s.size(), 2);
    std::memcpy(out.data() + 2, s.data(), s.size());
    return 2 + s.size();
}

Result<Addr> TcpTransport::addr_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(s, decode_addr_blob(in));
    std::lock_guard g(setup_mu_);
    return lookup_locked(s, true);
}

// --- memory -------------------------------------------------------------------------------------

TcpMem::TcpMem(TcpTransport* t, uint64_t base, uint64_t length, Access access, bool local,
               uint64_t key_)
    : MemImpl(t, base, length, access, local), owner_transport(t), key(key_) {}

TcpMem::~TcpMem() {
    if (local()) owner_transport->mem_unregister(key);
}

void TcpTransport::mem_unregister(uint64_t key) noexcept {
    uint64_t lo = 0, hi = 0;
    {
        std::lock_guard rg(regions_mu_);
        auto it = regions_.find(key);
        if (it == regions_.end()) return;
        lo = it->second->base();
        hi = lo + it->second->length();
        regions_.erase(it);
    }
    if (lo == hi) return;
    auto inside = [&](const void* p) {
        auto a = reinterpret_cast<uintptr_t>(p);
        return a >= lo && a < hi;
    };
    // Peers cannot know when we deregister, so a put or get they started may still use the
    // region: never touch it again. A put being received is discarded and reported failed; a
    // get response not started is turned into a failure, one half sent gets a private copy.
    // The target side checked the region under regions_mu_ and then holds its lane's lock
    // while it uses it: once erased above, each lane in turn is made to let go.
    std::lock_guard sg(setup_mu_);
    for (auto& lane : lanes_) {
        if (!lane) continue;
        std::lock_guard lg(lane->mu);
        lane->conns.for_each_safe([&](Conn& c) {
            if (c.in_payload && c.sink == Conn::Sink::put && c.dest && inside(c.dest)) {
                c.dest = nullptr;
                c.rx_status = Errc::invalid_argument;
            }
            for (SendItem& item : c.sendq) {
                if (item.kind != SendItem::Kind::control || item.iovcnt < 2) continue;
                auto& ctl = static_cast<Control&>(item);
                if (!ctl.reply || !inside(ctl.iov[1].iov_base)) continue;
                if (ctl.sent == 0) {
                    FrameHeader h;
                    h.type = FrameType::get_resp;
                    h.cookie = detail::load_le(ctl.header + 24, 8);
                    h.status = Errc::invalid_argument;
                    encode_frame_header(h, ctl.header);
                    c.queued_bytes -= ctl.iov[1].iov_len;
                    ctl.total -= ctl.iov[1].iov_len;
                    ctl.iov[1].iov_len = 0;
                    ctl.iovcnt = 1;
                } else {
                    ctl.owned.reset(new (std::nothrow) std::byte[ctl.iov[1].iov_len]);
                    if (ctl.owned) {
                        std::memcpy(ctl.owned.get(), ctl.iov[1].iov_base, ctl.iov[1].iov_len);
                        ctl.iov[1].iov_base = ctl.owned.get();
                    } else {
                        TALARIA_LOG(tcp, error,
                                    "deregistering a region a peer is reading: no memory "
                                    "for a private copy; the connection is dropped");
                        close_conn(&c, Errc::no_memory, "out of memory while deregistering");
                        return;
                    }
                }
            }
        });
    }
}

Result<MemHandle> TcpTransport::mem_register(void* buf, std::size_t len, Access access) {
    if (!buf && len > 0)
        return Error(Errc::invalid_argument, "mem_register: null buffer with a nonzero length");
    if (access != Access::read_only && access != Access::write_only && access != Access::read_write)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_register: invalid access mode {}", int(access)));
    std::lock_guard g(regions_mu_);
    uint64_t key = random_u64();
    while (regions_.count(key))
        key = random_u64();
    auto m =
        std::make_unique<TcpMem>(this, reinterpret_cast<uintptr_t>(buf), len, access, true, key);
    regions_.emplace(key, m.get());
    return MemHandle(std::move(m));
}

std::size_t TcpTransport::mem_serialize_size(const MemHandle& h) {
    if (!h || h->transport() != this) return 0;
    auto* m = h.as<TcpMem>();
    return mem_blob_size(m->local() ? peer_of(self_)->str : m->owner);
}

Result<std::size_t> TcpTransport::mem_serialize(const MemHandle& h, std::span<std::byte> out) {
    if (!h || h->transport() != this)
        return Error(Errc::invalid_argument, "mem_serialize: not a tcp handle of this transport");
    auto* m = h.as<TcpMem>();
    MemBlob b;
    b.base = m->base();
    b.length = m->length();
    b.key = m->key;
    b.access = uint8_t(m->access());
    b.owner = m->local() ? std::string_view(peer_of(self_)->str) : m->owner;
    std::size_t need = mem_blob_size(b.owner);
    if (out.size() < need)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_serialize: needs {} bytes, buffer has {}", need, out.size()));
    encode_mem_blob(b, out.data());
    return need;
}

Result<MemHandle> TcpTransport::mem_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(b, decode_mem_blob(in));
    auto m = std::make_unique<TcpMem>(this, b.base, b.length, Access(b.access), false, b.key);
    m->owner = std::string(b.owner);
    {
        std::lock_guard g(setup_mu_);
        // The owner identifies the target; an unknown anonymous owner is left unset (the
        // target's key check still protects it).
        if (auto a = lookup_locked(m->owner, true)) m->owner_addr = *a;
    }
    return MemHandle(std::move(m));
}

// --- sockets ------------------------------------------------------------------------------------

Conn* TcpTransport::new_conn(int fd, bool outgoing) {
    auto* c = new Conn;
    c->fd = fd;
    c->outgoing = outgoing;
    // Not zero-filled: only [rx_pos, rx_len) is ever read.
    c->rx_cap = outgoing ? kRxBufferSize : kSetupRxSize;
    c->rx.reset(new std::byte[c->rx_cap]);
    return c;
}

Result<void> TcpTransport::watch(Conn* c, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = c;
    int op = c->in_set ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    int epfd = c->lane ? c->lane->epfd : setup_epfd_;
    if (::epoll_ctl(epfd, op, c->fd, &ev) < 0) return errno_error("tcp: epoll_ctl", errno);
    c->events = events;
    c->in_set = true;
    return ok();
}

void TcpTransport::add_route(Lane& l, Conn* c) {
    l.routes.try_emplace(Lane::key(peer_of(c->peer), c->remote_ctx), c);
}

void TcpTransport::drop_route(Lane& l, Conn* c) {
    auto it = l.routes.find(Lane::key(peer_of(c->peer), c->remote_ctx));
    if (it == l.routes.end() || it->second != c) return;
    l.routes.erase(it);
    // Keep talking over another connection of the lane to that context if there is one.
    for (Conn& o : l.conns)
        if (&o != c && o.state == Conn::State::open && o.peer == c->peer &&
            o.remote_ctx == c->remote_ctx) {
            l.routes.emplace(Lane::key(peer_of(o.peer), o.remote_ctx), &o);
            break;
        }
}

Result<Conn*> TcpTransport::connect(Lane& l, TcpAddr* peer, uint8_t remote_ctx) {
    int fd = ::socket(peer->sa.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno_error("tcp: socket", errno);
    tune_socket(fd);
    int rc = ::connect(fd, peer->sa.sa(), peer->sa.len);
    if (rc < 0 && errno != EINPROGRESS) {
        int e = errno;
        ::close(fd);
        note(LinkEvent::connect_failed);
        return Error(Errc::unreachable, "tcp: " + connect_failure(peer, e));
    }
    Conn* c = new_conn(fd, true);
    c->lane = &l;
    l.conns.push_back(*c);
    c->state = rc == 0 ? Conn::State::open : Conn::State::connecting;
    set_peer(c, Addr(peer));
    c->remote_ctx = remote_ctx;
    add_route(l, c);
    if (auto w = watch(c, rc == 0 ? EPOLLIN : EPOLLIN | EPOLLOUT); !w) {
        close_conn(c, Errc::unreachable, w.error().describe());
        return Error(Errc::unreachable, w.error().describe());
    }
    // The hello goes first: it tells the peer who we are, and which of its contexts this
    // connection joins (header context_id) from which of ours (header tag).
    Control* h = control_alloc(l);
    h->setup = true;
    std::string_view me = opts_.listen ? std::string_view(peer_of(self_)->str) : "";
    Hello hello{instance_, me};
    if (opts_.auth.enabled()) {
        // Our nonce goes in the hello; nothing but the hello goes out until the peer proved
        // itself (its challenge) and we answered.
        auto nonce = auth::random_nonce();
        if (!nonce) {
            close_conn(c, Errc::io_error, nonce.error().describe());
            return nonce.error();
        }
        c->own_nonce = *nonce;
        c->auth_wait = true;
        hello.auth = true;
        hello.key_id = opts_.auth.key_id;
        hello.nonce = c->own_nonce.data();
    }
    if (rc == 0 && !c->auth_wait) note(LinkEvent::connected);  // else once authenticated
    FrameHeader fh;
    fh.type = FrameType::hello;
    fh.context_id = remote_ctx;
    fh.tag = l.id;
    fh.length = hello_size(me, hello.auth, hello.key_id);
    encode_frame_header(fh, h->header);
    encode_hello(hello, h->payload);
    h->iov[0] = {h->header, kFrameHeaderSize};
    h->iov[1] = {h->payload, std::size_t(fh.length)};
    h->iovcnt = 2;
    h->total = kFrameHeaderSize + fh.length;
    enqueue_send(c, h, false);
    TALARIA_LOG(tcp, debug, "context {} connecting to context {} of {} fd={}", l.id, remote_ctx,
                peer->str, fd);
    return c;
}

void TcpTransport::accept_ready_locked() {
    for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            const int e = errno;
            if (e == EINTR || e == ECONNABORTED) continue;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            if ((e == EMFILE || e == ENFILE) && refuse_one_locked()) continue;
            // No descriptor and no spare (or another failure): stop watching the listener for
            // a while, or level-triggered epoll would call us back at once, for ever.
            TALARIA_LOG(tcp, warn, "accept failed: {}; not accepting for 100 ms", std::strerror(e));
            ::epoll_ctl(setup_epfd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
            accept_paused_ = true;
            accept_resume_ = Clock::now() + std::chrono::milliseconds(100);
            return;
        }
        tune_socket(fd);
        Conn* c = new_conn(fd, false);
        pending_.push_back(*c);
        c->state = Conn::State::await_hello;
        c->accepted_at = Clock::now();
        if (auto w = watch(c, EPOLLIN); !w) close_conn(c, Errc::io_error, w.error().describe());
        TALARIA_LOG(tcp, debug, "accepted a connection fd={}", fd);
    }
}

bool TcpTransport::refuse_one_locked() {
    if (spare_fd_ < 0) return false;
    ::close(spare_fd_);
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    const bool refused = fd >= 0;
    if (refused) ::close(fd);
    spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (!refused) return false;
    ++refused_;
    auto now = Clock::now();
    if (now >= next_fd_warning_) {
        TALARIA_LOG(tcp, warn,
                    "out of file descriptors: refused {} connection(s) to {}; raise the limit "
                    "(ulimit -n) or serve fewer peers",
                    refused_, peer_of(self_)->str);
        refused_ = 0;
        next_fd_warning_ = now + std::chrono::seconds(1);
    }
    return true;
}

void TcpTransport::expire_setup_locked() {
    if (pending_.empty() && !accept_paused_) return;
    const auto now = Clock::now();
    if (accept_paused_ && now >= accept_resume_) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.ptr = &listen_fd_;
        if (::epoll_ctl(setup_epfd_, EPOLL_CTL_ADD, listen_fd_, &ev) == 0) accept_paused_ = false;
    }
    // pending_ is in accept order: the oldest first.
    while (Conn* c = pending_.front()) {
        if (c->state != Conn::State::await_hello || now - c->accepted_at < opts_.hello_timeout)
            break;
        close_conn(
            c, Errc::timeout,
            fmt::format("no hello within {} ms of the connection (Options::hello_timeout)",
                        std::chrono::duration_cast<std::chrono::milliseconds>(opts_.hello_timeout)
                            .count()));
    }
}

void TcpTransport::adopt_locked(Conn* c) {
    Lane* to = nullptr;
    {
        std::lock_guard rg(route_mu_);
        // The context asked for if it exists, else the one that takes unexpected messages for
        // it (it answers for the missing context), else any.
        Lane* asked = c->asked_ctx < opts_.max_contexts
                          ? lane_ptr_[c->asked_ctx].load(std::memory_order_acquire)
                          : nullptr;
        to = asked && asked->ctx ? asked : route_target_locked(c->asked_ctx, false);
        for (std::size_t i = 0; !to && i < opts_.max_contexts; ++i) {
            Lane* l = lane_ptr_[i].load(std::memory_order_acquire);
            if (l && l->ctx) to = l;
        }
    }
    if (!to) {
        close_conn(c, Errc::not_found,
                   fmt::format("no context exists here (asked for context {}): create one "
                               "before peers connect",
                               c->asked_ctx));
        return;
    }
    ::epoll_ctl(setup_epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
    c->events = 0;
    c->in_set = false;
    pending_.erase(*c);
    if (c->rx_cap < kRxBufferSize) {
        // Its hello is read: the full receive buffer, with what followed the hello.
        auto rx = std::unique_ptr<std::byte[]>(new std::byte[kRxBufferSize]);
        std::memcpy(rx.get(), c->rx.get() + c->rx_pos, c->rx_len - c->rx_pos);
        c->rx_len -= c->rx_pos;
        c->rx_pos = 0;
        c->rx = std::move(rx);
        c->rx_cap = kRxBufferSize;
    }
    std::lock_guard lg(to->mu);
    c->lane = to;
    to->conns.push_back(*c);
    add_route(*to, c);
    if (auto w = watch(c, EPOLLIN); !w) {
        close_conn(c, Errc::io_error, w.error().describe());
        return;
    }
    TALARIA_LOG(tcp, debug, "connection fd={} from context {} of {} joins context {}", c->fd,
                c->remote_ctx, peer_of(c->peer)->str, to->id);
    // What followed the hello in the same read is the lane's to parse now (on a protected
    // connection: records, read past the handshake).
    if (!(c->seal_rx ? open_records(c) : process_rx(c))) return;
    if (c->state == Conn::State::open && !c->sendq.empty()) flush(c);
}

void TcpTransport::poll_setup(bool wait) {
    touch::Pause off_call_path;  // every 100 µs, or on a new connection: not per message
    std::unique_lock g(setup_mu_, std::defer_lock);
    if (wait)
        g.lock();
    else if (!g.try_lock())
        return;
    epoll_event evs[64];
    int n = ::epoll_wait(setup_epfd_, evs, 64, 0);
    for (int i = 0; i < n; ++i) {
        if (evs[i].data.ptr == &listen_fd_) {
            accept_ready_locked();
            continue;
        }
        auto* c = static_cast<Conn*>(evs[i].data.ptr);
        if (c->state != Conn::State::await_hello) continue;
        read_ready(c);
        if (c->state == Conn::State::open && c->lane == nullptr) adopt_locked(c);
    }
    expire_setup_locked();
    for (Conn* c : pending_dead_)
        delete c;
    pending_dead_.clear();
}

Control* TcpTransport::control_alloc(Lane& l) {
    if (l.free_controls.empty()) {
        l.controls.push_back(std::make_unique<Control>());
        l.free_controls.push_back(l.controls.back().get());
    }
    Control* c = l.free_controls.back();
    l.free_controls.pop_back();
    c->kind = SendItem::Kind::control;
    c->sent = 0;
    c->reply = false;
    c->setup = false;
    c->owned.reset();
    return c;
}

void TcpTransport::control_free(Lane& l, Control* c) noexcept {
    c->owned.reset();
    l.free_controls.push_back(c);
}

}  // namespace tcp
}  // namespace talaria::na

// --- authentication (Options::auth; docs/protocol.md, tcp "auth") -------------------------------

namespace talaria::na {
namespace tcp {

bool TcpTransport::send_auth_direct(Conn* c, AuthStep step, Errc status,
                                    std::span<const std::byte> payload) {
    std::byte frame[kFrameHeaderSize + kMaxAuthReason];
    FrameHeader fh;
    fh.type = FrameType::auth;
    fh.context_id = uint8_t(step);
    fh.status = status;
    fh.length = payload.size();
    encode_frame_header(fh, frame);
    if (!payload.empty()) std::memcpy(frame + kFrameHeaderSize, payload.data(), payload.size());
    const std::size_t total = kFrameHeaderSize + payload.size();
    // Set-up only: nothing else is queued or half sent on the socket, and a frame this small
    // fits an empty socket buffer whole.
    ssize_t w;
    do {
        w = ::send(c->fd, frame, total, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    return w == ssize_t(total);
}

void TcpTransport::refuse_conn(Conn* c, const std::string& why) {
    std::string who = c->peer ? addr_describe(c->peer) : fmt::format("fd {}", c->fd);
    TALARIA_LOG(tcp, warn, "refusing the connection {} {}: {}", c->outgoing ? "to" : "from", who,
                why);
    std::string_view reason(why);
    if (reason.size() > kMaxAuthReason) reason = reason.substr(0, kMaxAuthReason);
    (void)send_auth_direct(c, AuthStep::refused, Errc::access_denied,
                           {reinterpret_cast<const std::byte*>(reason.data()), reason.size()});
    // Read what the peer already sent, so that closing sends a FIN after our refusal rather
    // than a reset that could overtake it.
    std::byte sink[4096];
    for (int i = 0; i < 16 && ::recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
    close_conn(c, Errc::access_denied, why);
}

void TcpTransport::refuse_protect_mismatch(Conn* c) {
    const Protect mine = opts_.auth.protect;
    refuse_conn(c, mine == Protect::none
                       ? std::string("this server does not protect its stream "
                                     "(na::Auth::protect none) and the client sent protected "
                                     "records: set the same na::Auth::protect on both sides")
                       : fmt::format("this server protects its stream (na::Auth::protect {}) and "
                                     "the client sent plain frames: set the same "
                                     "na::Auth::protect on both sides",
                                     mine == Protect::integrity ? "integrity" : "encryption"));
}

bool TcpTransport::auth_hello(Conn* c, const Hello& hello) {
    const Auth& a = opts_.auth;
    if (!a.enabled() && !hello.auth) return true;
    if (!a.enabled()) {
        refuse_conn(c,
                    "the client asked to authenticate, but this server has no shared secret "
                    "(na::Options::auth): configure the same key id and secret on both sides");
        return false;
    }
    if (!hello.auth) {
        refuse_conn(c, fmt::format("this server admits only peers that authenticate with the "
                                   "secret of key '{}': set na::Options::auth on the client",
                                   a.key_id));
        return false;
    }
    if (hello.key_id != a.key_id) {
        // The peer's key id is escaped ({:?}): its bytes go to our log and back to it.
        refuse_conn(c, fmt::format("the client names key {:?}, this server holds key '{}'",
                                   hello.key_id, a.key_id));
        return false;
    }
    auto nonce = auth::random_nonce();
    if (!nonce) {
        close_conn(c, Errc::io_error, nonce.error().describe());
        return false;
    }
    c->own_nonce = *nonce;
    std::memcpy(c->peer_nonce.data(), hello.nonce, auth::kNonceSize);
    auth::Proof proof =
        auth::prove(a.secret, auth::Role::acceptor, c->own_nonce, c->peer_nonce, a.key_id);
    std::byte payload[kAuthNonceSize + kAuthProofSize];
    std::memcpy(payload, c->own_nonce.data(), kAuthNonceSize);
    std::memcpy(payload + kAuthNonceSize, proof.data(), kAuthProofSize);
    if (!send_auth_direct(c, AuthStep::challenge, Errc::ok, payload)) {
        close_conn(c, Errc::disconnected, "could not send the authentication challenge");
        return false;
    }
    c->auth_wait = true;  // await_hello until the response (and hello_timeout with it)
    return true;
}

bool TcpTransport::auth_frame(Conn* c) {
    const FrameHeader& h = c->hdr;
    const auto step = AuthStep(h.context_id);
    std::span<const std::byte> body(c->hello_buf, std::size_t(h.length));
    const Auth& a = opts_.auth;
    std::string who = c->peer ? peer_of(c->peer)->str : std::string("the peer");
    if (step == AuthStep::refused) {
        std::string_view reason(reinterpret_cast<const char*>(body.data()), body.size());
        // The peer's bytes, on their way to our log and the caller's error: printable only.
        std::string why = fmt::format("{} refused this connection: {}; {}", who,
                                      auth::printable(reason), auth::client_side(a));
        TALARIA_LOG(tcp, warn, "{}", why);
        close_conn(c, Errc::access_denied, why);
        return false;
    }
    if (step == AuthStep::challenge) {  // outgoing: the acceptor's nonce and proof
        std::memcpy(c->peer_nonce.data(), body.data(), kAuthNonceSize);
        auth::Proof want =
            auth::prove(a.secret, auth::Role::acceptor, c->peer_nonce, c->own_nonce, a.key_id);
        if (!auth::matches(want, body.subspan(kAuthNonceSize))) {
            std::string why = fmt::format(
                "{} could not prove that it holds the secret of key '{}' (a different secret, "
                "or not the server we meant): not talking to it; {}",
                who, a.key_id, auth::client_side(a));
            TALARIA_LOG(tcp, warn, "{}", why);
            close_conn(c, Errc::access_denied, why);
            return false;
        }
        auth::Proof mine =
            auth::prove(a.secret, auth::Role::connector, c->own_nonce, c->peer_nonce, a.key_id);
        if (!send_auth_direct(c, AuthStep::response, Errc::ok, mine)) {
            close_conn(c, Errc::disconnected, "could not send the authentication response");
            return false;
        }
        c->auth_wait = false;  // what waited behind the hello goes out (process_rx flushes)
        note(LinkEvent::connected);
        if (a.protect != Protect::none && !start_protection(c)) return false;
        TALARIA_LOG(tcp, debug, "authenticated {} (key '{}'{})", who, a.key_id,
                    a.protect == Protect::none ? "" : ", protected");
        return true;
    }
    // Accepted: the connector's proof.
    auth::Proof want =
        auth::prove(a.secret, auth::Role::connector, c->peer_nonce, c->own_nonce, a.key_id);
    if (!auth::matches(want, body)) {
        refuse_conn(c, fmt::format("the client's proof does not match: it does not hold the "
                                   "secret of key '{}'",
                                   a.key_id));
        return false;
    }
    c->auth_wait = false;
    c->state = Conn::State::open;  // poll_setup() hands it to its lane now
    note(LinkEvent::accepted);
    if (a.protect != Protect::none && !start_protection(c)) return false;
    TALARIA_LOG(tcp, debug, "authenticated a connection from {} (key '{}'{})", who, a.key_id,
                a.protect == Protect::none ? "" : ", protected");
    return true;
}

}  // namespace tcp
}  // namespace talaria::na
