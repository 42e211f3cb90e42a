// ucx transport setup: the address string, our own UCX configuration, context, worker and
// listener, contexts, addresses, endpoints and memory registration.
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "na/base/epoll_set.hpp"
#include "na/base/transports.hpp"
#include "na/ucx/ucx.hpp"
#include "na/ucx/ucx_diag.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

Result<std::unique_ptr<Transport>> open_ucx(std::string_view sub, std::string_view rest,
                                            const Options& o) {
    auto t = std::make_unique<ucx::UcxTransport>(o);
    TALARIA_CHECK(t->init(sub, rest));
    return std::unique_ptr<Transport>(std::move(t));
}

namespace ucx {

namespace {

/// Transports of this process whose UCX context is live, and the process that opened them.
///
/// The one piece of process-wide state in Talaria, and it mirrors UCX's own: UCX starts one
/// async thread per process (its socket connection manager and its tcp interfaces take their
/// connection events there) while any worker lives, and keeps that in globals we cannot reach.
/// A child forked while one of its parent's ucx transports was open inherits those globals
/// without the thread: its connection events then go to an epoll set shared with the parent's
/// thread and are never handled, and its calls over ucx+tcp never complete. So a child refuses
/// to open ucx transports that connect through sockets while its parent's were live (ucx+sm,
/// which addresses workers directly, works in a child).
struct UcxProcessUse {
    std::mutex mu;
    int live = 0;       ///< transports `owner` has open
    pid_t owner = 0;    ///< the process that counted `live`
    int inherited = 0;  ///< transports that ancestors had open when they forked
};
UcxProcessUse& process_use() {
    static UcxProcessUse u;  // NOLINT: process-wide by necessity (see above)
    return u;
}

/// UCX keepalive interval we configure (UCX 1.13's default is 20 s: far above the 5 s in which
/// a dead peer must fail its operations).
constexpr const char* kKeepaliveInterval = "1s";

uint64_t random_u64() {
    uint64_t v = 0;
    while (v == 0) {
        if (::getrandom(&v, sizeof v, 0) != ssize_t(sizeof v))
            v ^= now_ns() * 0x9e3779b97f4a7c15ull;
    }
    return v;
}

std::string to_hex(const void* p, std::size_t n) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string s(2 * n, '0');
    auto* b = static_cast<const uint8_t*>(p);
    for (std::size_t i = 0; i < n; ++i) {
        s[2 * i] = kDigits[b[i] >> 4];
        s[2 * i + 1] = kDigits[b[i] & 15];
    }
    return s;
}

std::vector<std::byte> from_hex(std::string_view s) {
    auto val = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    std::vector<std::byte> out(s.size() / 2);
    for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = std::byte(uint8_t(val(s[2 * i]) << 4 | val(s[2 * i + 1])));
    return out;
}

bool valid_list(std::string_view s, std::string_view extra) {
    if (s.empty()) return false;
    for (char c : s)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              extra.find(c) != std::string_view::npos))
            return false;
    return true;
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

void ep_error_cb(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* e = static_cast<Ep*>(arg);
    e->lane->t->on_ep_error(e, status);
}

ucs_status_t am_cb(void* arg, const void* header, size_t header_len, void* data, size_t len,
                   const ucp_am_recv_param_t* param) {
    auto* l = static_cast<Lane*>(arg);
    return l->t->on_am(*l, header, header_len, data, len, param);
}

/// Completion of a hello send: nothing waits for it.
void hello_sent_cb(void* req, ucs_status_t, void*) {
    ucp_request_free(req);
}

}  // namespace

std::optional<std::size_t> live_addrs(Transport& t) {
    auto* u = dynamic_cast<UcxTransport*>(&t);
    if (!u) return std::nullopt;
    return u->live_addrs();
}

Errc errc_of(ucs_status_t st) noexcept {
    switch (st) {
        case UCS_OK:
            return Errc::ok;
        case UCS_ERR_CANCELED:
            return Errc::canceled;
        case UCS_ERR_UNREACHABLE:
        case UCS_ERR_REJECTED:
        case UCS_ERR_NOT_CONNECTED:
        case UCS_ERR_INVALID_ADDR:
        case UCS_ERR_NO_DEVICE:
            return Errc::unreachable;
        case UCS_ERR_NO_MEMORY:
            return Errc::no_memory;
        case UCS_ERR_MESSAGE_TRUNCATED:
            return Errc::message_too_large;
        default:
            return Errc::disconnected;
    }
}

Result<Spec> parse_spec(std::string_view sub, std::string_view rest) {
    Spec s;
    if (!valid_list(sub, "_,"))
        return Error(Errc::address_invalid,
                     fmt::format("'ucx+{}': the UCX transport list must be names like tcp, sm, "
                                 "all, rc, ud, dc (comma-separated)",
                                 sub));
    s.sub = std::string(sub);
    // "sm" is UCX's alias for every shared-memory transport (posix, sysv, cma, knem, xpmem);
    // "self" adds the loopback transport for an endpoint's own worker.
    if (sub == "sm")
        s.tls = "sm,self";
    else
        s.tls = std::string(sub);
    std::string_view host = rest;
    if (auto slash = rest.find('/'); slash != std::string_view::npos) {
        std::string_view dev = rest.substr(0, slash);
        host = rest.substr(slash + 1);
        if (!valid_list(dev, "_:.,-"))
            return Error(Errc::address_invalid,
                         fmt::format("'ucx+{}://{}': '{}' is not a UCX device list (e.g. "
                                     "mlx5_0:1 or eth0,mlx5_1:1)",
                                     sub, rest, dev));
        s.devices = std::string(dev);
    }
    if (host.find('/') != std::string_view::npos)
        return Error(Errc::address_invalid,
                     fmt::format("'ucx+{}://{}': expected [devices/][host[:port]]", sub, rest));
    if (sub == "sm") {
        if (!host.empty())
            return Error(Errc::address_invalid,
                         fmt::format("'ucx+sm://{}': shared memory has no host or port; use "
                                     "ucx+sm://",
                                     rest));
        s.mode = Mode::worker;
    } else {
        s.mode = host.empty() ? Mode::worker : Mode::sockaddr;
        s.host = std::string(host);
    }
    return s;
}

bool serves_rma(const Spec& s) {
    if (s.sub == "sm") return false;
    // Only a list made of RDMA transports alone (rc, dc: the NIC checks remote keys) keeps
    // UCP's RMA; any other entry (tcp, ud, sm, cuda, ...) would carry UCX's emulated put/get.
    std::string_view rest = s.tls;
    bool any = false;
    while (!rest.empty()) {
        auto comma = rest.find(',');
        std::string_view tl = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        if (tl.substr(0, 2) != "rc" && tl.substr(0, 2) != "dc") return true;
        any = true;
    }
    return !any;
}

Error UcxTransport::ucs_error(Errc code, std::string_view call, ucs_status_t st,
                              std::string_view detail) const {
    return Error(code, fmt::format("{}: {} failed: {}{}{}", scheme_, call, ucs_status_string(st),
                                   detail.empty() ? "" : " ", detail));
}

// --- lanes and contexts -------------------------------------------------------------------------

Lane::Lane(UcxTransport* tr, uint8_t i, const Options& o)
    : t(tr), id(i), mu(o.thread_safe), ops(o.max_ops, o.thread_safe), match(o.max_contexts) {}

Lane::~Lane() {
    if (listen_epfd >= 0) ::close(listen_epfd);
}

Result<Lane*> UcxTransport::lane_create_locked(uint8_t id) {
    if (Lane* l = lane_at(id)) return l;
    auto l = std::make_unique<Lane>(this, id, opts_);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Every call into a worker is made under its lane's lock (or by one thread without
    // thread_safe).
    wp.thread_mode = opts_.thread_safe ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_SINGLE;
    // The worker's tcp interfaces listen on ports of their own (ucx_guard.cpp).
    const std::vector<UctListener> before = listening_sockets();
    ucs_status_t st = ucp_worker_create(context_, &wp, &l->worker);
    if (st != UCS_OK) {
        l->worker = nullptr;
        return ucs_error(Errc::io_error, "ucp_worker_create", st, fmt::format("(context {})", id));
    }
    // From here on the lane owns a worker: keep it in lanes_ so that teardown destroys it.
    Lane* lp = l.get();
    lanes_.push_back(std::move(l));
    // UCX accepts a peer's connection to them on its async thread, which does not always
    // signal the worker's fd: the lane watches them itself (Lane::listen_epfd).
    if (const std::vector<int> fds = guard_new_listeners(before, id); !fds.empty()) {
        lp->listen_epfd = ::epoll_create1(EPOLL_CLOEXEC);
        for (int fd : fds) {
            epoll_event ev{};
            ev.events = EPOLLIN | EPOLLET;  // one wake per connection, whoever accepts it
            ev.data.fd = fd;
            if (lp->listen_epfd >= 0 && ::epoll_ctl(lp->listen_epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
                TALARIA_LOG(ucx, warn,
                            "{}: context {}: cannot watch UCX's listener (descriptor {}: {}): a "
                            "peer's first connection may wait for the next wake",
                            scheme_, id, fd, std::strerror(errno));
        }
    }
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = kAmId;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &am_cb;
    hp.arg = lp;
    st = ucp_worker_set_am_recv_handler(lp->worker, &hp);
    if (st != UCS_OK) return ucs_error(Errc::io_error, "ucp_worker_set_am_recv_handler", st);
    st = ucp_worker_get_efd(lp->worker, &lp->efd);
    if (st != UCS_OK) return ucs_error(Errc::io_error, "ucp_worker_get_efd", st);
    ucp_address_t* wa = nullptr;
    std::size_t wlen = 0;
    st = ucp_worker_get_address(lp->worker, &wa, &wlen);
    if (st != UCS_OK) return ucs_error(Errc::io_error, "ucp_worker_get_address", st);
    auto* wb = reinterpret_cast<const std::byte*>(wa);
    lp->worker_addr.assign(wb, wb + wlen);
    ucp_worker_release_address(lp->worker, wa);
    if (wlen > kMaxWorkerAddr)
        return Error(Errc::not_supported,
                     fmt::format("{}: the packed worker address is {} bytes, more than the {} a "
                                 "hello may carry (name fewer transports)",
                                 scheme_, wlen, kMaxWorkerAddr));
    lane_ptr_[id].store(lp, std::memory_order_release);
    return lp;
}

uint8_t UcxTransport::serving_lane(uint8_t ctx, bool unexpected) {
    // Lock-free (a lane's `serves` flag): called from a lane's progress, which must not wait
    // for another lane.
    std::vector<Lane*> by_id(opts_.max_contexts, nullptr);
    for (std::size_t i = 0; i < opts_.max_contexts; ++i)
        by_id[i] = lane_at(uint8_t(i));
    auto serves = [&](std::size_t i) {
        return by_id[i] != nullptr && by_id[i]->serves.load(std::memory_order_acquire);
    };
    if (!unexpected)
        return ctx < by_id.size() && by_id[ctx] &&
                       by_id[ctx]->attached.load(std::memory_order_acquire)
                   ? ctx
                   : 0;
    if (ctx < by_id.size() && serves(ctx)) return ctx;
    for (std::size_t i = 0; i < by_id.size(); ++i)
        if (serves(i)) return uint8_t(i);
    return 0;
}

UcxContext::UcxContext(UcxTransport* t, uint8_t id, bool thread_safe, Lane* lane)
    : Context(t, id, thread_safe), ut_(t), lane_(lane) {
    block_epfd_ = lane->listen_epfd >= 0 ? epoll_set_of({lane->efd, event_fd(), lane->listen_epfd})
                                         : epoll_set_of({lane->efd, event_fd()});
    if (block_epfd_ < 0)
        TALARIA_LOG(ucx, error, "context {}: its epoll set: {}", id, std::strerror(errno));
}

UcxContext::~UcxContext() {
    if (attached) ut_->context_destroyed(this);
    if (block_epfd_ >= 0) ::close(block_epfd_);
}

Result<std::unique_ptr<Context>> UcxTransport::context_create(uint8_t id,
                                                              const ContextOptions& opts) {
    if (id >= opts_.max_contexts)
        return Error(Errc::invalid_argument,
                     fmt::format("context id {} out of range: this {} transport has "
                                 "Options::max_contexts = {}",
                                 id, scheme_, opts_.max_contexts));
    std::lock_guard g(setup_mu_);
    TALARIA_TRY(l, lane_create_locked(id));
    // Lock order: setup lock, then a lane's (a lane never takes the setup lock).
    {
        std::lock_guard gl(l->mu);
        if (l->ctx)
            return Error(
                Errc::already_exists,
                fmt::format("context {} already exists: destroy it first or use another id", id));
    }
    auto ctx = std::make_unique<UcxContext>(this, id, opts_.thread_safe, l);
    ctx->set_takes_unexpected(opts.unexpected);
    if (ctx->block_fd() < 0)
        return Error(Errc::io_error, fmt::format("context {}: {}", id, kEpollSetRemedy));
    if (!ctx->watch_fd(l->efd))
        return Error(Errc::io_error, fmt::format("context {}: epoll_ctl(its worker's fd) failed: "
                                                 "{}",
                                                 id, std::strerror(errno)));
    if (l->listen_epfd >= 0 && !ctx->watch_fd(l->listen_epfd))
        return Error(Errc::io_error, fmt::format("context {}: epoll_ctl(UCX's listeners) failed: "
                                                 "{}",
                                                 id, std::strerror(errno)));
    std::lock_guard gl(l->mu);
    l->match.attach(ctx.get());
    l->ctx = ctx.get();
    l->serves.store(opts.unexpected, std::memory_order_release);
    l->attached.store(true, std::memory_order_release);
    ctx->attached = true;
    return std::unique_ptr<Context>(std::move(ctx));
}

void UcxTransport::context_destroyed(UcxContext* ctx) noexcept {
    Lane& l = ctx->lane();
    std::lock_guard gs(setup_mu_);
    std::lock_guard g(l.mu);
    // The caller should have canceled and drained; release receives still posted on it and
    // sends still waiting for a route, and orphan UCX operations still in flight (their
    // completion then only frees them).
    auto release = [](UcxOp* op) {
        op->state = OpState::idle;
        op->match_source.reset();
        op->route = nullptr;
        op->releaser->release(op);
    };
    l.match.detach(ctx->id(), release);
    for (auto& entry : l.routes) {
        auto& waiting = entry.second.waiting;  // clang 14 captures no structured binding
        waiting.for_each_safe([&](UcxOp& op) {
            if (op.ctx != ctx) return;
            waiting.erase(op);
            release(&op);
        });
    }
    for (UcxOp& op : l.inflight)
        if (op.ctx == ctx) op.ctx = nullptr;
    // Served put/get: orphaned too, released once UCX holds none of their sends.
    for (auto& xp : l.xfers)
        if (xp->op && xp->op->ctx == ctx) {
            xp->op->ctx = nullptr;
            rma_fail_locked(l, *xp, Errc::canceled, "its context was destroyed");
        }
    l.ctx = nullptr;
    l.serves.store(false, std::memory_order_release);
    l.attached.store(false, std::memory_order_release);
}

// --- transport lifetime -------------------------------------------------------------------------

UcxTransport::UcxTransport(const Options& o)
    : addrs_(o.thread_safe),
      opts_(o),
      regions_mu_(o.thread_safe),
      setup_mu_(o.thread_safe),
      intern_mu_(o.thread_safe),
      lane_ptr_(std::make_unique<std::atomic<Lane*>[]>(o.max_contexts)) {
    for (std::size_t i = 0; i < o.max_contexts; ++i)
        lane_ptr_[i].store(nullptr, std::memory_order_relaxed);
}

void UcxTransport::lane_close(Lane& l) noexcept {
    std::lock_guard g(l.mu);
    if (!l.inflight.empty()) {
        std::string what;
        for (UcxOp& op : l.inflight)
            what += fmt::format(" {}", op_type_name(op.completion.type));
        TALARIA_LOG(ucx, debug, "{} context {} closing with UCX operations in flight:{}", scheme_,
                    l.id, what);
    }
    // Operations still in flight: their callbacks free the UCX requests and release the ops
    // (closing_), when the endpoints below are force-closed.
    while (Ep* e = l.eps.pop_front()) {
        l.closing_eps.push_back(*e);
        if (!e->closing) {
            e->closing = true;
            ucp_request_param_t p{};
            p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = UCP_EP_CLOSE_FLAG_FORCE;
            ucs_status_ptr_t r = ucp_ep_close_nbx(e->h, &p);
            e->close_req = UCS_PTR_IS_PTR(r) ? r : nullptr;
        }
    }
    l.failed.clear();
    l.byes.clear();
    l.last_route = nullptr;
    l.last_stream = nullptr;
    // Sends still waiting for a route: their contexts are gone by now (the caller drained).
    for (auto& [key, r] : l.routes)
        while (UcxOp* op = r.waiting.pop_front()) {
            op->state = OpState::idle;
            op->releaser->release(op);
        }
    l.routes.clear();
    l.locating = 0;
    l.streams.clear();
    // Bounded: a forced close completes locally.
    auto deadline = deadline_after(std::chrono::seconds(2));
    while (!l.closing_eps.empty() && !deadline_passed(deadline)) {
        ucp_worker_progress(l.worker);
        reap_closed_locked(l);
    }
    while (Ep* e = l.closing_eps.pop_front()) {
        if (e->close_req) ucp_request_free(e->close_req);
        delete e;
    }
    l.match.clear();
    while (UcxMsg* m = l.held.pop_front())
        l.match.msg_free(m);
    l.held_count = 0;
    // Requests UCX never completed: cancel them. Their callback frees them (now, if the cancel
    // runs it, or when UCX completes them); an op left over is not ours to touch.
    while (UcxOp* op = l.inflight.pop_front()) {
        void* r = op->req;
        op->req = nullptr;
        if (r) ucp_request_cancel(l.worker, r);
    }
}

UcxTransport::~UcxTransport() {
    if (counted_) {
        UcxProcessUse& u = process_use();
        std::lock_guard g(u.mu);
        if (u.owner == ::getpid()) --u.live;
    }
    closing_.store(true, std::memory_order_release);
    // Byes first, on every lane, while every endpoint still stands; then the bootstrap
    // listener, then the endpoints.
    for (auto& l : lanes_) {
        if (!l->worker) continue;
        std::lock_guard g(l->mu);
        say_bye_locked(*l);
    }
    close_bootstrap();
    for (auto& l : lanes_)
        if (l->worker) lane_close(*l);
    self_.reset();
    for (auto& l : lanes_) {
        if (l->worker) ucp_worker_destroy(l->worker);
        l->worker = nullptr;
    }
    lanes_.clear();
    if (context_) ucp_cleanup(context_);
    if (pfd_ >= 0) ::close(pfd_);
}

Result<void> UcxTransport::init_context() {
    route_ucx_log();
    ucp_config_t* cfg = nullptr;
    // User UCX_* environment variables still apply underneath (ucp_config_read reads them);
    // the keys below, which this transport's contract depends on, are always ours.
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
    if (st != UCS_OK) return ucs_error(Errc::io_error, "ucp_config_read", st);
    settings_.clear();
    settings_.emplace_back("TLS", spec_.tls);
    if (!spec_.devices.empty()) settings_.emplace_back("NET_DEVICES", spec_.devices);
    // openucx/ucx#8477: without these, UCX 1.13 does not select posix/sysv for endpoints that
    // ask for peer error handling (every endpoint here does), and ucx+sm would have no
    // transport at all (or silently use tcp under ucx+all).
    // (ucp_config_modify hands keys it does not know to every UCT interface's table, without
    // the per-transport prefix: "MM_" is the table posix and sysv share, so this key sets
    // UCX_POSIX_ERROR_HANDLING and UCX_SYSV_ERROR_HANDLING both.)
    if (spec_.tls.find("sm") != std::string::npos || spec_.tls.find("posix") != std::string::npos ||
        spec_.tls.find("sysv") != std::string::npos || spec_.tls.find("all") != std::string::npos)
        settings_.emplace_back("MM_ERROR_HANDLING", "y");
    settings_.emplace_back("KEEPALIVE_INTERVAL", kKeepaliveInterval);
    for (const auto& [k, v] : settings_) {
        st = ucp_config_modify(cfg, k.c_str(), v.c_str());
        if (st != UCS_OK) {
            ucp_config_release(cfg);
            return ucs_error(Errc::invalid_argument, fmt::format("ucp_config_modify({}={})", k, v),
                             st);
        }
    }
    ucp_params_t p{};
    p.field_mask =
        UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
    // Served RMA leaves UCP's RMA feature off: UCX then installs no handler for its emulated
    // put/get, which would write wherever a peer's message says (serves_rma()).
    p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (served_rma_ ? 0 : UCP_FEATURE_RMA);
    // One worker per context, driven by different threads: the context's own state (memory
    // registration, its caches) is then shared by them and must be thread safe.
    p.mt_workers_shared = opts_.thread_safe ? 1 : 0;
    p.name = "talaria";
    st = ucp_init(&p, cfg, &context_);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        context_ = nullptr;
        return ucs_error(
            st == UCS_ERR_NO_DEVICE || st == UCS_ERR_NO_ELEM ? Errc::not_supported : Errc::io_error,
            "ucp_init", st,
            fmt::format("(UCX_TLS={}{}{}: is that transport present here? see "
                        "ucx_info -d)",
                        spec_.tls,
                        spec_.devices.empty() ? "" : " UCX_NET_DEVICES=", spec_.devices));
    }
    return ok();
}

Result<void> UcxTransport::init(std::string_view sub, std::string_view rest) {
    scheme_ = fmt::format("ucx+{}", sub);
    TALARIA_TRY(spec, parse_spec(sub, rest));
    spec_ = std::move(spec);
    served_rma_ = serves_rma(spec_);
    {
        UcxProcessUse& u = process_use();
        std::lock_guard g(u.mu);
        const pid_t me = ::getpid();
        if (u.owner != me) {  // the first open in this process: what was open is inherited
            u.inherited += u.live;
            u.live = 0;
            u.owner = me;
        }
        if (u.inherited > 0 && spec_.mode == Mode::sockaddr)
            return Error(Errc::not_supported,
                         fmt::format("{}: this process was forked (parent {}) while {} ucx "
                                     "transport(s) were open; UCX keeps its async thread, which "
                                     "handles socket connections, in process-wide state that a "
                                     "child inherits without the thread, so connections from "
                                     "here would never complete. A child can open {} only if "
                                     "its parent had no ucx transport open when it forked: fork "
                                     "earlier, or exec a fresh program (ucx+sm and the other "
                                     "transports work in a child)",
                                     scheme_, ::getppid(), u.inherited, scheme_));
        ++u.live;
        counted_ = true;
    }
    if (opts_.auth.enabled() && spec_.mode != Mode::sockaddr)
        return Error(Errc::not_supported,
                     fmt::format("{}: na::Options::auth needs a host:port address "
                                 "(ucx+tcp://host:port), where peers prove the secret through "
                                 "this transport's bootstrap port; a worker address ({}) has no "
                                 "set-up to prove it in, so this transport refuses to open rather "
                                 "than accept strangers (on one host, sm admits only this user)",
                                 scheme_, spec_.sub == "sm" ? "ucx+sm://" : "no host"));
    instance_ = random_u64();
    token_salt_ = random_u64();
    if (opts_.auth.enabled()) {
        // Hellos to ourselves are signed too (with a key nobody else holds).
        TALARIA_TRY(k, auth::random_nonce());
        self_session_.instance = instance_;
        self_session_.id = random_u64();
        std::memcpy(self_session_.key.data(), k.data(), k.size());
    }
    pfd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pfd_ < 0) return Error(Errc::io_error, fmt::format("eventfd: {}", std::strerror(errno)));
    TALARIA_CHECK(init_context());
    // UCX's own listeners admit only hosts that proved the secret (ucx_guard.cpp).
    filter_listeners_ = opts_.auth.enabled() && spec_.mode == Mode::sockaddr;
    std::lock_guard g(setup_mu_);
    TALARIA_TRY(l0, lane_create_locked(0));
    if (spec_.mode == Mode::sockaddr) {
        if (opts_.listen) {
            TALARIA_CHECK(init_bootstrap());
        } else {
            // A client: validate the host part but do not listen; identify by instance id.
            TALARIA_CHECK(parse_host_port(spec_.host, true));
            std::lock_guard gi(intern_mu_);
            self_ = intern_locked(fmt::format("~{:016x}", instance_), true);
        }
    } else {
        std::string hex = to_hex(l0->worker_addr.data(), l0->worker_addr.size());
        // The intern lock is never held around UCX calls: a lane's progress takes it inside
        // UCX's callbacks (a hello).
        std::lock_guard gi(intern_mu_);
        Addr self = intern_locked(hex);
        self.as<UcxAddr>()->worker_addr = l0->worker_addr;
        self_ = self;
    }
    self_.as<UcxAddr>()->instance.store(instance_, std::memory_order_relaxed);
    if (spec_.sub == "sm") init_direct_rma();
    TALARIA_LOG(ucx, debug, "{} open as {} (instance {:016x}, UCX_TLS={}, direct put/get {})",
                scheme_, self_.as<UcxAddr>()->str, instance_, spec_.tls,
                direct_rma() ? "on" : "off");
    return ok();
}

void UcxTransport::init_direct_rma() noexcept {
    // ucx+sm peers are on this host by construction (shared memory only). UCX 1.13 selects RMA
    // lanes only among transports with put_short/put_bcopy/get_bcopy: posix/sysv have them,
    // but only for memory UCX allocated itself, and cma (zero-copy only) never qualifies; so
    // ucp_put/get on user memory run as active-message emulation (~1 GB/s). We copy with
    // process_vm_readv/writev (what cma does) when the peer shares our pid namespace, and say
    // so in our handles. Probe on ourselves first: seccomp or a policy may forbid it.
    struct stat sb {};
    if (::stat("/proc/self/ns/pid", &sb) != 0 || uint32_t(sb.st_ino) == 0) {
        TALARIA_LOG(ucx, debug,
                    "{}: no pid namespace id ({}): put/get stay with UCX, and peers watch this "
                    "process by UCX's keepalive alone",
                    scheme_, std::strerror(errno));
        return;
    }
    // Peers in this namespace watch our process by its pid (kHelloProcess).
    hello_pid_ = uint32_t(::getpid());
    hello_pidns_ = uint32_t(sb.st_ino);
    uint64_t probe_src = 0x5441, probe_dst = 0;
    std::string why;
    Errc e = copy_direct(false, uint32_t(::getpid()), &probe_dst,
                         reinterpret_cast<uintptr_t>(&probe_src), sizeof probe_src, why);
    if (e != Errc::ok || probe_dst != probe_src) {
        TALARIA_LOG(ucx, info,
                    "{}: process_vm_readv is not usable here ({}): put/get stay with UCX", scheme_,
                    why);
        return;
    }
    pid_ = uint32_t(::getpid());
    pidns_ = uint32_t(sb.st_ino);
}

// --- addresses ----------------------------------------------------------------------------------

UcxAddr::UcxAddr(UcxTransport* t, std::string s, std::string k, bool thread_safe)
    : AddrImpl(t), str(std::move(s)), key(std::move(k)), dmu(thread_safe), ut_(t) {}

UcxAddr::~UcxAddr() {
    // No lane lock here (we may be running under one): only the table's leaf lock.
    ut_->addr_destroyed(this);
}

void UcxTransport::addr_destroyed(UcxAddr* a) noexcept {
    addrs_.remove(a->key, a);
}

Addr UcxTransport::intern_locked(const std::string& key, bool anonymous) {
    if (Addr a = addrs_.find(key)) return a;
    auto* a = new UcxAddr(this, fmt::format("{}://{}", scheme_, key), key, opts_.thread_safe);
    a->anonymous = anonymous;
    Addr out(a);
    addrs_.add(key, a);
    return out;
}

Result<Addr> UcxTransport::lookup_locked(std::string_view address, bool from_wire) {
    // Any ucx+<transports>:// scheme names the same peer: what differs is only which UCX
    // transports each side enabled.
    std::string_view rest = address;
    if (auto p = address.find("://"); p != std::string_view::npos) {
        std::string_view scheme = address.substr(0, p);
        if (scheme == "tcp" || scheme == "sm" || scheme == "inproc" || scheme.starts_with("ofi+"))
            return Error(Errc::unreachable,
                         fmt::format("'{}' is an address of the {} transport, which a {} "
                                     "transport cannot reach",
                                     address, scheme, scheme_));
        if (!address.starts_with("ucx+") || p <= 4)
            return Error(
                Errc::address_invalid,
                fmt::format("'{}' is not a ucx address (expected {}://{})", address, scheme_,
                            spec_.mode == Mode::worker ? "<worker address hex>" : "host:port"));
        rest = address.substr(p + 3);
    } else if (address.empty()) {
        return Error(Errc::address_invalid, "empty ucx address");
    }
    if (spec_.mode == Mode::worker) {
        if (rest.size() > kMaxAddrString || !is_hex(rest))
            return Error(Errc::address_invalid,
                         fmt::format("'{}': a {} address is the packed UCP worker address in "
                                     "lower-case hex (up to {} characters), as addr_to_string "
                                     "of the peer's addr_self() gives it",
                                     address.substr(0, 100), scheme_, kMaxAddrString));
        std::string key(rest);
        if (Addr a = addrs_.find(key)) return a;
        Addr out = intern_locked(key);
        out.as<UcxAddr>()->worker_addr = from_hex(key);
        return out;
    }
    std::string key(rest);
    if (Addr a = addrs_.find(key)) return a;
    if (!rest.empty() && rest.front() == '~')
        return Error(Errc::unreachable,
                     fmt::format("'{}' names a client that does not listen and is not connected "
                                 "to this endpoint",
                                 address));
    Result<SockAddr> sa = from_wire ? parse_numeric(rest) : parse_host_port(rest, false);
    if (!sa) return std::move(sa).error();
    if (sa->port() == 0)
        return Error(Errc::address_invalid,
                     fmt::format("'{}' has port 0, which names no peer: use the address the "
                                 "server reports (Engine::self_address(), or "
                                 "addr_to_string(addr_self()) at the na layer)",
                                 address));
    Addr out = intern_locked(sa->to_string());
    out.as<UcxAddr>()->sa = *sa;
    return out;
}

Result<Addr> UcxTransport::addr_lookup(std::string_view address) {
    std::lock_guard g(intern_mu_);
    return lookup_locked(address, false);
}

Addr UcxTransport::addr_alias(const Addr& a) {
    if (!a || a.impl()->transport() != this) return a;
    return alias_of(this, a);
}

std::string UcxTransport::addr_to_string(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    return ucx_addr(a)->str;
}

std::string UcxTransport::peer_failure(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    UcxAddr* p = ucx_addr(a);
    std::lock_guard g(p->failure_mu);
    return p->failure;
}

std::size_t UcxTransport::addr_serialize_size(const Addr& a) {
    if (!a || a.impl()->transport() != this) return 0;
    return 2 + ucx_addr(a)->str.size();
}

Result<std::size_t> UcxTransport::addr_serialize(const Addr& a, std::span<std::byte> out) {
    if (!a || a.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("addr_serialize: not an address of this {} transport", scheme_));
    const std::string& s = ucx_addr(a)->str;
    if (out.size() < 2 + s.size())
        return Error(
            Errc::invalid_argument,
            fmt::format("addr_serialize: needs {} bytes, buffer has {}", 2 + s.size(), out.size()));
    detail::store_le(out.data(), s.size(), 2);
    std::memcpy(out.data() + 2, s.data(), s.size());
    return 2 + s.size();
}

Result<Addr> UcxTransport::addr_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(s, decode_addr_blob(in));
    std::lock_guard g(intern_mu_);
    return lookup_locked(s, true);
}

// --- endpoints ----------------------------------------------------------------------------------

Result<Ep*> UcxTransport::ep_create_locked(Lane& l, const ucp_ep_params_t& params_in,
                                           const std::string& who) {
    auto* e = new Ep;
    e->lane = &l;
    e->serial = ep_serial_.fetch_add(1, std::memory_order_relaxed) + 1;
    ucp_ep_params_t params = params_in;
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &ep_error_cb;
    params.err_handler.arg = e;
    ucs_status_t st = ucp_ep_create(l.worker, &params, &e->h);
    if (st != UCS_OK) {
        note(LinkEvent::connect_failed);
        delete e;
        return ucs_error(errc_of(st) == Errc::disconnected ? Errc::unreachable : errc_of(st),
                         "ucp_ep_create", st, fmt::format("(to {})", who));
    }
    e->created = Clock::now();
    l.eps.push_back(*e);
    return e;
}

void UcxTransport::send_hello_locked(Lane& l, Ep* e, const Session* session) {
    const std::string& me = self_.as<UcxAddr>()->str;
    MsgHeader h;
    h.kind = MsgKind::hello;
    h.context_id = e->peer_lane;
    h.source_ctx = l.id;
    h.instance = instance_;
    h.stream = e->stream_id();
    h.tag = l.serves.load(std::memory_order_acquire) ? kHelloTakesUnexpected : 0;
    if (session) h.tag |= kHelloSigned;
    const bool process = hello_pidns_ != 0;
    if (process) h.tag |= kHelloProcess;
    encode_msg_header(h, e->hello_hdr);
    e->hello.resize(hello_size(me, l.worker_addr.size(), process) + (session ? kHelloTailSize : 0));
    encode_hello(me, l.worker_addr, e->hello.data(), hello_pid_, hello_pidns_);
    if (session) sign_hello(*session, e);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = &hello_sent_cb;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r = ucp_am_send_nbx(e->h, kAmId, e->hello_hdr, kMsgHeaderSize, e->hello.data(),
                                         e->hello.size(), &p);
    if (UCS_PTR_IS_ERR(r))
        TALARIA_LOG(ucx, debug, "hello to {} failed: {}",
                    e->peer ? ucx_addr(e->peer)->str : std::string("a new peer"),
                    ucs_status_string(UCS_PTR_STATUS(r)));
}

Ep* UcxTransport::find_ep_locked(Lane& l, const UcxAddr* peer, uint8_t peer_lane) {
    for (Ep& e : l.eps)
        if (!e.failed && !e.closing && e.peer_lane == peer_lane && ucx_addr(e.peer) == peer)
            return &e;
    return nullptr;
}

Result<Ep*> UcxTransport::ep_to_locked(Lane& l, UcxAddr* peer, uint8_t peer_lane,
                                       std::span<const std::byte> worker) {
    if (Ep* e = find_ep_locked(l, peer, peer_lane)) return e;
    ucp_ep_params_t params{};
    std::vector<std::byte> wa;
    // With Options::auth our hello is signed with a session we hold with that peer instance:
    // from a bootstrap (made here if it is needed anyway, or if none is held), or the one that
    // signs hellos to ourselves.
    std::optional<Session> session;
    const bool must_sign = opts_.auth.enabled();
    if (must_sign && (!worker.empty() || peer->anonymous || spec_.mode != Mode::sockaddr)) {
        if (uint64_t inst = peer->instance.load(std::memory_order_relaxed); inst != 0)
            session = find_session(inst);
        if (!session && (peer->anonymous || spec_.mode != Mode::sockaddr))
            return Error(Errc::access_denied,
                         fmt::format("{}: no authenticated session with {} (it never proved the "
                                     "shared secret to this process, or its session was "
                                     "evicted): it must call here first",
                                     scheme_, peer->str));
        if (!session) {
            TALARIA_TRY(b, bootstrap(*peer));
            session = b.session;
        }
    }
    if (!worker.empty()) {
        wa.assign(worker.begin(), worker.end());
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        params.address = reinterpret_cast<const ucp_address_t*>(wa.data());
    } else if (peer->anonymous) {
        return Error(Errc::disconnected,
                     fmt::format("{} is a client that does not listen, and none of its contexts "
                                 "has introduced itself to context {} here",
                                 peer->str, l.id));
    } else if (spec_.mode == Mode::sockaddr) {
        // Its context 0's worker, from its bootstrap port (ucx_boot.cpp): UCX's own listener
        // never faces the network.
        TALARIA_TRY(b, bootstrap(*peer));
        wa = std::move(b.worker);
        session = b.session;
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        params.address = reinterpret_cast<const ucp_address_t*>(wa.data());
    } else {
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        params.address = reinterpret_cast<const ucp_address_t*>(peer->worker_addr.data());
    }
    TALARIA_TRY(e,
                ep_create_locked(l, params, fmt::format("context {} of {}", peer_lane, peer->str)));
    e->peer = Addr(peer);
    e->peer_lane = peer_lane;
    // That peer context already said hello to this lane (we are connecting back to it): its
    // worker is up, so a blocked progress need not spin for this endpoint.
    for (const auto& [key, s] : l.streams)
        if (s.peer == peer && s.source_ctx == peer_lane) e->established = true;
    if (peer == self_.as<UcxAddr>()) e->established = true;  // our own worker: no hello back
    send_hello_locked(l, e, session ? &*session : nullptr);
    TALARIA_LOG(ucx, debug, "context {}: endpoint to context {} of {}", l.id, peer_lane, peer->str);
    return e;
}

void UcxTransport::close_ep_locked(Lane& l, Ep* e) {
    if (e->closing) return;
    e->closing = true;
    // Routes that send on it go with it (a later send makes a new one). They have no sends
    // waiting: only a route without an endpoint has.
    for (auto it = l.routes.begin(); it != l.routes.end();) {
        if (it->second.ep != e) {
            ++it;
            continue;
        }
        if (l.last_route == &it->second) l.last_route = nullptr;
        it = l.routes.erase(it);
    }
    l.eps.erase(*e);
    l.closing_eps.push_back(*e);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(e->h, &p);
    e->close_req = UCS_PTR_IS_PTR(r) ? r : nullptr;
}

void UcxTransport::reap_closed_locked(Lane& l) {
    l.closing_eps.for_each_safe([&](Ep& e) {
        if (e.close_req) {
            if (ucp_request_check_status(e.close_req) == UCS_INPROGRESS) return;
            ucp_request_free(e.close_req);
            e.close_req = nullptr;
        }
        l.closing_eps.erase(e);
        delete &e;  // drops its peer reference
    });
}

std::string UcxTransport::ep_info(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    Lane* l = lane_at(0);
    std::lock_guard g(l->mu);
    Ep* e = find_ep_locked(*l, ucx_addr(a), 0);
    if (!e) return {};
    char* buf = nullptr;
    std::size_t len = 0;
    FILE* f = ::open_memstream(&buf, &len);
    if (!f) return {};
    ucp_ep_print_info(e->h, f);
    std::fclose(f);
    std::string s(buf, len);
    std::free(buf);
    return s;
}

// --- memory -------------------------------------------------------------------------------------

UcxMem::UcxMem(UcxTransport* t, uint64_t base, uint64_t length, Access access, bool local,
               bool thread_safe)
    : MemImpl(t, base, length, access, local), ut(t), rk_mu(thread_safe) {}

UcxMem::~UcxMem() {
    ut->mem_release(this);
}

void UcxTransport::mem_release(UcxMem* m) noexcept {
    if (m->key != 0 && m->local()) {
        // Served: once erased, no request touches the region again (they copy under the lock).
        std::lock_guard g(regions_mu_);
        regions_.erase(m->key);
    }
    // Remote keys go on the lane they were unpacked on (the worker's pools hold them).
    std::vector<RkeyOnEp> rkeys;
    {
        std::lock_guard g(m->rk_mu);
        rkeys.swap(m->rkeys);
    }
    for (RkeyOnEp& k : rkeys) {
        std::lock_guard g(k.lane->mu);
        ucp_rkey_destroy(k.h);
    }
    // ucp_mem_unmap on the context (thread safe: mt_workers_shared).
    if (m->memh) ucp_mem_unmap(context_, m->memh);
    m->memh = nullptr;
    m->owner_addr.reset();
}

Result<MemHandle> UcxTransport::mem_register(void* buf, std::size_t len, Access access) {
    if (!buf && len > 0)
        return Error(Errc::invalid_argument, "mem_register: null buffer with a nonzero length");
    if (access != Access::read_only && access != Access::write_only && access != Access::read_write)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_register: invalid access mode {}", int(access)));
    auto m = std::make_unique<UcxMem>(this, reinterpret_cast<uintptr_t>(buf), len, access, true,
                                      opts_.thread_safe);
    if (len == 0) return MemHandle(std::move(m));  // nothing to map: no rkey, no put/get bytes
    if (served_rma_) {
        // Served: peers name it by a key we check; UCX never sees it.
        std::lock_guard g(regions_mu_);
        uint64_t key = random_u64();
        while (key == 0 || regions_.count(key))
            key = random_u64();
        m->key = key;
        regions_.emplace(key, m.get());
        return MemHandle(std::move(m));
    }
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = buf;
    mp.length = len;
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
    if (uint8_t(access) & uint8_t(Access::read_only)) mp.prot |= UCP_MEM_MAP_PROT_REMOTE_READ;
    if (uint8_t(access) & uint8_t(Access::write_only)) mp.prot |= UCP_MEM_MAP_PROT_REMOTE_WRITE;
    ucs_status_t st = ucp_mem_map(context_, &mp, &m->memh);
    if (st != UCS_OK) {
        m->memh = nullptr;
        return ucs_error(Errc::io_error, "ucp_mem_map", st, fmt::format("({} bytes)", len));
    }
    void* packed = nullptr;
    std::size_t packed_len = 0;
    st = ucp_rkey_pack(context_, m->memh, &packed, &packed_len);
    if (st != UCS_OK) return ucs_error(Errc::io_error, "ucp_rkey_pack", st);
    if (packed_len == 0 || packed_len > kMaxRkeySize) {
        ucp_rkey_buffer_release(packed);
        return Error(Errc::not_supported,
                     fmt::format("{}: packed remote key of {} bytes (limit {})", scheme_,
                                 packed_len, kMaxRkeySize));
    }
    auto* pb = static_cast<const std::byte*>(packed);
    m->rkey.assign(pb, pb + packed_len);
    ucp_rkey_buffer_release(packed);
    return MemHandle(std::move(m));
}

std::size_t UcxTransport::mem_serialize_size(const MemHandle& h) {
    if (!h || h->transport() != this) return 0;
    auto* m = h.as<UcxMem>();
    return mem_blob_size(m->rkey.size(),
                         m->local() ? self_.as<UcxAddr>()->str.size() : m->owner.size());
}

Result<std::size_t> UcxTransport::mem_serialize(const MemHandle& h, std::span<std::byte> out) {
    if (!h || h->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_serialize: not a handle of this {} transport", scheme_));
    auto* m = h.as<UcxMem>();
    MemBlob b;
    b.base = m->base();
    b.length = m->length();
    b.access = uint8_t(m->access());
    b.rkey = m->rkey;
    b.key = m->key;
    b.owner = m->local() ? std::string_view(self_.as<UcxAddr>()->str) : m->owner;
    b.pid = m->local() ? pid_ : m->pid;
    b.pidns = m->local() ? pidns_ : m->pidns;
    if (b.pid == 0) b.pidns = 0;
    std::size_t need = mem_blob_size(b.rkey.size(), b.owner.size());
    if (out.size() < need)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_serialize: needs {} bytes, buffer has {}", need, out.size()));
    encode_mem_blob(b, out.data());
    return need;
}

Result<MemHandle> UcxTransport::mem_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(b, decode_mem_blob(in));
    std::lock_guard g(intern_mu_);
    // The owner must be a well-formed peer address of this transport (put/get go there). An
    // anonymous client's name that is not connected to us is kept unresolved.
    auto owner = lookup_locked(b.owner, true);
    if (!owner && owner.code() != Errc::unreachable) return std::move(owner).error();
    auto m = std::make_unique<UcxMem>(this, b.base, b.length, Access(b.access), false,
                                      opts_.thread_safe);
    m->rkey.assign(b.rkey.begin(), b.rkey.end());
    m->key = b.key;
    m->owner = std::string(b.owner);
    if (owner) m->owner_addr = *owner;
    // Direct copies only between ucx+sm transports in one pid namespace.
    if (pidns_ != 0 && b.pidns == pidns_) {
        m->pid = b.pid;
        m->pidns = b.pidns;
    }
    return MemHandle(std::move(m));
}

}  // namespace ucx
}  // namespace talaria::na
