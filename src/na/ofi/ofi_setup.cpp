// ofi transport setup: opening a provider (fabric, domain, completion queue, address vector,
// endpoint), contexts, addresses, memory registration, the message-buffer pool, teardown.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

#include <fmt/format.h>

#include "na/base/epoll_set.hpp"
#include "na/base/signals.hpp"
#include "na/base/transports.hpp"
#include "na/base/url.hpp"
#include "na/ofi/ofi.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

Result<std::unique_ptr<Transport>> open_ofi(std::string_view sub, std::string_view rest,
                                            const Options& o) {
    ofi::route_ofi_log();
    auto t = std::make_unique<ofi::OfiTransport>(o, "ofi+" + std::string(sub));
    TALARIA_CHECK(t->init(sub, rest));
    return std::unique_ptr<Transport>(std::move(t));
}

namespace ofi {

namespace {

/// The shm endpoints open in this process, by name (see shm_local_peer_ok_locked).
std::mutex g_shm_mu;
using NameSet = std::unordered_set<std::string, RawHash, std::equal_to<>>;
NameSet& shm_live() {
    static auto* s = new NameSet;
    return *s;
}

/// Receive buffers: with FI_MULTI_RECV a few large ones, each holding many messages...
constexpr std::size_t kMultiRecvBuffers = 4;
constexpr std::size_t kMultiRecvSize = std::size_t(1) << 20;
/// ...without it, this many buffers of one maximal message each.
constexpr std::size_t kPlainRecvBuffers = 64;
constexpr std::size_t kPlainRecvSize = kHeaderRoom + kMaxMessageSize;

/// Capabilities the transport needs, and what each is for (named in errors).
struct Cap {
    uint64_t bit;
    const char* name;
    const char* why;
};
constexpr Cap kNeededCaps[] = {
    {FI_MSG, "FI_MSG", "messages"},
    {FI_RMA, "FI_RMA", "put/get"},
    {FI_READ, "FI_READ", "get"},
    {FI_WRITE, "FI_WRITE", "put"},
    {FI_REMOTE_READ, "FI_REMOTE_READ", "peers' get from registered memory"},
    {FI_REMOTE_WRITE, "FI_REMOTE_WRITE", "peers' put into registered memory"},
};
constexpr uint64_t kCaps =
    FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
/// The MR mode bits this transport honours.
/// Not FI_MR_ENDPOINT: a registration bound to one endpoint would serve one lane only.
constexpr uint64_t kMrModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;

uint64_t random_u64() {
    uint64_t v = 0;
    while (v == 0)
        if (::getrandom(&v, sizeof v, 0) != ssize_t(sizeof v))
            v ^= now_ns() * 0x9e3779b97f4a7c15ull;
    return v;
}

std::string fi_err(std::string_view call, ssize_t rc) {
    return fmt::format("{} failed: {} ({})", call, fi_strerror(int(-rc)), rc);
}

/// "tcp" -> "tcp;ofi_rxm": libfabric 1.17's tcp provider offers FI_EP_RDM only through the
/// rxm utility provider (its own RDM endpoint arrived later), and verbs always needs rxm for RDM.
std::string provider_of(std::string_view sub) {
    if (sub == "tcp" || sub == "verbs") return std::string(sub) + ";ofi_rxm";
    return std::string(sub);
}

bool valid_sub(std::string_view s) {
    if (s.empty() || s.size() > 32) return false;
    for (char c : s)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == ';'))
            return false;
    return true;
}

bool valid_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.' || c == ':';
}

std::string caps_missing(uint64_t have) {
    std::string s;
    for (const Cap& c : kNeededCaps)
        if (!(have & c.bit))
            s += fmt::format("{}{} (for {})", s.empty() ? "" : ", ", c.name, c.why);
    return s;
}

bool is_ip_literal(std::string_view host) {
    std::string h(host);
    in_addr a4;
    in6_addr a6;
    return inet_pton(AF_INET, h.c_str(), &a4) == 1 || inet_pton(AF_INET6, h.c_str(), &a6) == 1;
}

}  // namespace

int shm_pid_of(std::string_view raw) noexcept {
    // "[fi_shm://]<prefix>-<pid>-<instance>[.<lane>]": the pid of a peer we can watch
    // (process_gone).
    if (auto sep = raw.find("://"); sep != std::string_view::npos) raw.remove_prefix(sep + 3);
    auto last = raw.rfind('-');
    if (last == std::string_view::npos || last == 0) return 0;
    auto prev = raw.rfind('-', last - 1);
    if (prev == std::string_view::npos || last - prev - 1 == 0 || last - prev - 1 > 9) return 0;
    int pid = 0;
    for (std::size_t i = prev + 1; i < last; ++i) {
        if (raw[i] < '0' || raw[i] > '9') return 0;
        pid = pid * 10 + (raw[i] - '0');
    }
    return pid;
}

// --- contexts and lanes -------------------------------------------------------------------------

OfiLane::OfiLane(OfiTransport* tr, uint8_t i, const Options& o)
    : t(tr), id(i), mu(o.thread_safe), ops(o.max_ops, o.thread_safe), match(o.max_contexts) {
    token_salt = random_u64();
}

OfiContext::OfiContext(OfiTransport* t, uint8_t id, bool thread_safe, OfiLane* lane)
    : Context(t, id, thread_safe), ot_(t), lane_(lane) {
    block_epfd_ = epoll_set_of({lane->pfd, event_fd()});
    if (block_epfd_ < 0)
        TALARIA_LOG(ofi, error, "context {}: its epoll set: {}", id, std::strerror(errno));
}

OfiContext::~OfiContext() {
    if (attached) ot_->context_destroyed(this);
    if (block_epfd_ >= 0) ::close(block_epfd_);
}

Result<std::unique_ptr<Context>> OfiTransport::context_create(uint8_t id,
                                                              const ContextOptions& opts) {
    if (id >= opts_.max_contexts)
        return Error(Errc::invalid_argument,
                     fmt::format("context id {} out of range: this {} transport has "
                                 "Options::max_contexts = {}",
                                 id, scheme_, opts_.max_contexts));
    std::lock_guard g(setup_mu_);
    TALARIA_TRY(l, lane_create_locked(id));
    {
        std::lock_guard lg(l->mu);
        if (l->ctx)
            return Error(Errc::already_exists,
                         fmt::format("context {} already exists: destroy it first or use "
                                     "another id",
                                     id));
    }
    auto ctx = std::make_unique<OfiContext>(this, id, opts_.thread_safe, l);
    ctx->set_takes_unexpected(opts.unexpected);
    if (ctx->block_fd() < 0 || !ctx->watch_fd(l->pfd))
        return Error(Errc::io_error, fmt::format("context {}: {}", id, kEpollSetRemedy));
    std::lock_guard lg(l->mu);
    l->match.attach(ctx.get());
    l->ctx = ctx.get();
    l->serves.store(opts.unexpected, std::memory_order_release);
    l->attached.store(true, std::memory_order_release);
    ctx->attached = true;
    return std::unique_ptr<Context>(std::move(ctx));
}

void OfiTransport::context_destroyed(OfiContext* c) noexcept {
    OfiLane& l = c->lane();
    std::lock_guard g(l.mu);
    l.attached.store(false, std::memory_order_release);
    l.serves.store(false, std::memory_order_release);
    l.ctx = nullptr;
    // The caller should have canceled and drained; release receives still posted on it.
    // The caller should have canceled and drained: release receives still posted on it, sends
    // still waiting for a route and posts deferred, and orphan operations the provider holds
    // (their completion then only frees them: op_finished).
    auto release = [&](OfiOp* op) {
        if (op->counted) watch_dec(l, op->rem);
        if (op->bounce) bounce_free(op->bounce);
        op->bounce = nullptr;
        op->counted = false;
        op->rem = nullptr;
        op->route = nullptr;
        op->peer.reset();
        op->state = OpState::idle;
        op->releaser->release(op);
    };
    l.match.detach(l.id, release);
    for (auto& entry : l.routes) {
        auto& waiting = entry.second.waiting;  // clang 14 captures no structured binding
        waiting.for_each_safe([&](OfiOp& op) {
            if (op.ctx != c) return;
            waiting.erase(op);
            release(&op);
        });
    }
    l.deferred.for_each_safe([&](OfiOp& op) {
        if (op.ctx != c) return;
        if (op.fragments > 0) {
            op.ctx = nullptr;  // its fragments in the provider finish (and free) it
            return;
        }
        l.deferred.erase(op);
        --op.rem->deferred;
        release(&op);
    });
    for (OfiOp& op : l.inflight)
        if (op.ctx == c) op.ctx = nullptr;
}

Result<OfiLane*> OfiTransport::lane_create_locked(uint8_t id) {
    if (OfiLane* l = lane_at(id)) return l;
    auto l = std::make_unique<OfiLane>(this, id, opts_);
    if (auto r = lane_open(*l); !r) {
        lane_close(*l);
        return std::move(r).error();
    }
    OfiLane* p = l.get();
    lanes_.push_back(std::move(l));
    lane_ptr_[id].store(p, std::memory_order_release);
    return p;
}

Result<void> OfiTransport::lane_open(OfiLane& l) {
    const std::string& sub = prov_.prov_name;
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.size = 0;
    cq_attr.wait_obj = prov_.wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
    int rc = fi_cq_open(domain_, &cq_attr, &l.cq, nullptr);
    if (rc != 0 && l.id == 0 && prov_.wait_fd) {
        // shm has no wait objects: poll-sleep instead (see progress()).
        prov_.wait_fd = false;
        cq_attr.wait_obj = FI_WAIT_NONE;
        rc = fi_cq_open(domain_, &cq_attr, &l.cq, nullptr);
    }
    if (rc != 0)
        return Error(Errc::io_error,
                     fmt::format("{}: {} for context {}", sub, fi_err("fi_cq_open", rc), l.id));
    if (prov_.wait_fd && (rc = fi_control(&l.cq->fid, FI_GETWAIT, &l.cq_fd)) != 0) {
        if (l.id != 0)
            return Error(Errc::io_error, fmt::format("{}: {} for context {}", sub,
                                                     fi_err("fi_control(FI_GETWAIT)", rc), l.id));
        TALARIA_LOG(ofi, info, "{}: completion queue wait fd unavailable ({}); polling",
                    prov_.prov_name, fi_strerror(-rc));
        prov_.wait_fd = false;
        l.cq_fd = -1;
    }
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((rc = fi_av_open(domain_, &av_attr, &l.av, nullptr)) != 0)
        return Error(Errc::io_error,
                     fmt::format("{}: {} for context {}", sub, fi_err("fi_av_open", rc), l.id));
    // Lane 0 listens where the address asked (its endpoint is the transport's address); the
    // others, and every put/get endpoint (rma_ep), on the same interface, at a port of the
    // system's choosing.
    const bool rma_ep = prov_.prov_name.find("ofi_rxm") != std::string::npos;
    struct FreeInfo {
        fi_info* i = nullptr;
        ~FreeInfo() {
            if (i) fi_freeinfo(i);
        }
    } any_port;
    if ((l.id != 0 || rma_ep) && info_->src_addr &&
        (prov_.addr_format == FI_SOCKADDR_IN || prov_.addr_format == FI_SOCKADDR_IN6)) {
        any_port.i = fi_dupinfo(info_);
        if (!any_port.i) return Error(Errc::no_memory, "ofi: fi_dupinfo failed");
        if (prov_.addr_format == FI_SOCKADDR_IN)
            static_cast<sockaddr_in*>(any_port.i->src_addr)->sin_port = 0;
        else
            static_cast<sockaddr_in6*>(any_port.i->src_addr)->sin6_port = 0;
    }
    fi_info* const info = l.id != 0 && any_port.i ? any_port.i : info_;
    if ((rc = fi_endpoint(domain_, info, &l.ep, nullptr)) != 0)
        return Error(Errc::io_error,
                     fmt::format("{}: {} for context {}", sub, fi_err("fi_endpoint", rc), l.id));
    if ((rc = fi_ep_bind(l.ep, &l.cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
        (rc = fi_ep_bind(l.ep, &l.av->fid, 0)) != 0)
        return Error(Errc::io_error,
                     fmt::format("{}: {} for context {}", sub, fi_err("fi_ep_bind", rc), l.id));
    if (!shm_base_.empty()) {
        l.shm_name = l.id == 0 ? shm_base_ : fmt::format("{}.{}", shm_base_, l.id);
        std::string n = "fi_shm://" + l.shm_name;
        if ((rc = fi_setname(&l.ep->fid, n.data(), n.size() + 1)) != 0)
            return Error(Errc::io_error,
                         fmt::format("ofi+shm: {} for '{}'", fi_err("fi_setname", rc), n));
    }
    if ((rc = fi_enable(l.ep)) != 0)
        return Error(Errc::io_error,
                     fmt::format("{}: {} for context {}", sub, fi_err("fi_enable", rc), l.id));
    // After fi_enable: shm (1.17) dereferences its receive queue in fi_setopt, which exists
    // only once the endpoint is enabled.
    if (prov_.multi_recv) {
        std::size_t min = kHeaderRoom + kMaxMessageSize;
        rc = fi_setopt(&l.ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof min);
        if (rc != 0) {
            if (l.id != 0)
                return Error(Errc::io_error,
                             fmt::format("{}: {} for context {}", sub,
                                         fi_err("FI_OPT_MIN_MULTI_RECV", rc), l.id));
            TALARIA_LOG(ofi, info, "{}: FI_OPT_MIN_MULTI_RECV not settable ({}): posted buffers",
                        prov_.prov_name, fi_strerror(-rc));
            prov_.multi_recv = false;
        }
    }
    char name[256];
    std::size_t len = sizeof name;
    rc = fi_getname(&l.ep->fid, name, &len);
    if (rc != 0) return Error(Errc::io_error, fi_err("ofi: fi_getname", rc));
    if (prov_.addr_format == FI_ADDR_STR) len = ::strnlen(name, len);
    if (len == 0 || len > kMaxRawAddr)
        return Error(Errc::not_supported,
                     fmt::format("{}: provider {} has a {}-byte endpoint address; this "
                                 "transport carries at most {}",
                                 scheme_, prov_.prov_name, len, kMaxRawAddr));
    l.raw.assign(name, len);
    if (rma_ep) {
        // Put/get on a connection of their own (OfiLane::rma_ep).
        fi_info* const rinfo = any_port.i ? any_port.i : info_;
        if ((rc = fi_cq_open(domain_, &cq_attr, &l.rma_cq, nullptr)) != 0 ||
            (prov_.wait_fd && (rc = fi_control(&l.rma_cq->fid, FI_GETWAIT, &l.rma_cq_fd)) != 0))
            return Error(Errc::io_error,
                         fmt::format("{}: {} for the put/get endpoint of context {}", sub,
                                     fi_err("fi_cq_open/fi_control(FI_GETWAIT)", rc), l.id));
        if ((rc = fi_endpoint(domain_, rinfo, &l.rma_ep, nullptr)) != 0 ||
            (rc = fi_ep_bind(l.rma_ep, &l.rma_cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
            (rc = fi_ep_bind(l.rma_ep, &l.av->fid, 0)) != 0 || (rc = fi_enable(l.rma_ep)) != 0)
            return Error(Errc::io_error,
                         fmt::format("{}: {} for the put/get endpoint of context {}", sub,
                                     fi_err("fi_endpoint/fi_ep_bind/fi_enable", rc), l.id));
    }
    if (l.id == 0 && prov_.addr_format == FI_ADDR_STR && l.raw.find("://") != std::string::npos)
        raw_prefix_ = l.raw.substr(0, l.raw.find("://") + 3);

    l.timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (l.timer_fd < 0) return errno_error("ofi: timerfd_create", errno);
    l.pfd = l.cq_fd < 0       ? epoll_set_of({l.timer_fd})
            : l.rma_cq_fd < 0 ? epoll_set_of({l.timer_fd, l.cq_fd})
                              : epoll_set_of({l.timer_fd, l.cq_fd, l.rma_cq_fd});
    if (l.pfd < 0)
        return Error(Errc::io_error, fmt::format("ofi: context {}: {}", l.id, kEpollSetRemedy));

    // The header template: our transport address (lane 0's), and this lane's when it differs.
    const std::string& self_raw = l.id == 0 ? l.raw : lane_at(0)->raw;
    MsgHeader h;
    h.kind = MsgKind::probe;
    h.instance = instance_;
    h.source_ctx = l.id;
    h.raw_addr = std::as_bytes(std::span(self_raw));
    if (l.id != 0) h.lane_addr = std::as_bytes(std::span(l.raw));
    // With Options::auth every message carries its session's token (stamped per send).
    if (opts_.auth.enabled()) h.flags = kFlagToken;
    l.header_size = encode_msg_header(h, l.header);

    TALARIA_CHECK(post_rx_buffers(l));
    if (!l.shm_name.empty()) {
        std::lock_guard g(g_shm_mu);
        shm_live().insert(l.shm_name);
    }
    return ok();
}

// --- transport lifetime -------------------------------------------------------------------------

OfiTransport::OfiTransport(const Options& o, std::string scheme)
    : addrs_(o.thread_safe),
      opts_(o),
      scheme_(std::move(scheme)),
      setup_mu_(o.thread_safe),
      intern_mu_(o.thread_safe),
      reg_mu_(o.thread_safe),
      lane_ptr_(new std::atomic<OfiLane*>[o.max_contexts]),
      buf_mu_(o.thread_safe) {
    for (std::size_t i = 0; i < o.max_contexts; ++i)
        lane_ptr_[i].store(nullptr, std::memory_order_relaxed);
    heap_slab_.owner = this;
}

OfiTransport::~OfiTransport() {
    close_all();
    guard_close();
}

namespace {
void close_fid(fid* f, const char* what, const std::string& prov) {
    if (!f) return;
    int rc = fi_close(f);
    if (rc != 0)
        TALARIA_LOG(ofi, error, "{}: fi_close({}) failed: {}", prov, what, fi_strerror(-rc));
}
void note_missing_provider_env(std::string_view prov);  // below, with what it says
}  // namespace

void OfiTransport::lane_close(OfiLane& l) noexcept {
    if (!l.shm_name.empty()) {
        std::lock_guard g(g_shm_mu);
        shm_live().erase(l.shm_name);
    }
    // shm peers killed without a chance to remove their regions: remove them for them (their
    // names carry their pids; a region whose pid is gone is used by nobody).
    if (prov_.prov_name == "shm") {
        for (const auto& [raw, r] : l.remotes) {
            int pid = shm_pid_of(raw);
            if (pid > 0 && pid != ::getpid() && process_gone(pid))
                ::shm_unlink(raw.substr(raw.find("://") + 3).c_str());
        }
    }
    // The endpoints first: they stop using every buffer posted to them and every peer.
    close_fid(l.rma_ep ? &l.rma_ep->fid : nullptr, "put/get endpoint", prov_.prov_name);
    l.rma_ep = nullptr;
    close_fid(l.ep ? &l.ep->fid : nullptr, "endpoint", prov_.prov_name);
    l.ep = nullptr;
    // Ops still posted, held by the provider, routing or deferred never complete (destroying
    // a transport completes nothing): what they point to goes now, and each goes back to the
    // pool.
    auto drop = [this](OfiOp* op) {
        if (op->bounce) bounce_free(op->bounce);
        op->bounce = nullptr;
        op->peer.reset();
        op->rem = nullptr;
        op->route = nullptr;
        op->counted = false;
        op->state = OpState::idle;
        op->releaser->release(op);
    };
    l.match.detach(l.id, drop);
    l.watched.clear();
    for (OfiOp* op : l.orphans)  // already off every list and count
        op->releaser->release(op);
    l.orphans.clear();
    for (auto* list : {&l.inflight, &l.deferred})
        while (OfiOp* op = list->pop_front())
            drop(op);
    for (auto& [k, r] : l.routes)
        while (OfiOp* op = r.waiting.pop_front())
            drop(op);
    l.match.clear();
    l.routes.clear();
    l.sources.clear();
    l.last_route = nullptr;
    l.last_source = nullptr;
    l.remotes.clear();
    l.ctls.clear();
    close_fid(l.rx_mr ? &l.rx_mr->fid : nullptr, "receive buffers' mr", prov_.prov_name);
    l.rx_mr = nullptr;
    close_fid(l.av ? &l.av->fid : nullptr, "address vector", prov_.prov_name);
    l.av = nullptr;
    close_fid(l.rma_cq ? &l.rma_cq->fid : nullptr, "put/get completion queue", prov_.prov_name);
    l.rma_cq = nullptr;
    l.rma_cq_fd = -1;
    l.rma_inflight = 0;
    close_fid(l.cq ? &l.cq->fid : nullptr, "completion queue", prov_.prov_name);
    l.cq = nullptr;
    if (l.pfd >= 0) ::close(l.pfd);
    if (l.timer_fd >= 0) ::close(l.timer_fd);
    l.pfd = l.timer_fd = -1;
}

void OfiTransport::close_all() noexcept {
    for (std::size_t i = 0; i < opts_.max_contexts; ++i)
        lane_ptr_[i].store(nullptr, std::memory_order_relaxed);
    for (auto& l : lanes_)
        lane_close(*l);
    self_.reset();
    lanes_.clear();
    for (auto& s : slabs_) {
        close_fid(s->mr ? &s->mr->fid : nullptr, "message buffers' mr", prov_.prov_name);
        s->mr = nullptr;
    }
    close_fid(domain_ ? &domain_->fid : nullptr, "domain", prov_.prov_name);
    domain_ = nullptr;
    close_fid(fabric_ ? &fabric_->fid : nullptr, "fabric", prov_.prov_name);
    fabric_ = nullptr;
    if (info_) fi_freeinfo(info_);
    info_ = nullptr;
    if (pfd_ >= 0) ::close(pfd_);
    pfd_ = -1;
}

Result<void> OfiTransport::init(std::string_view sub, std::string_view rest) {
    if (!valid_sub(sub))
        return Error(Errc::address_invalid,
                     fmt::format("'{}': not a libfabric provider name (expected e.g. ofi+tcp, "
                                 "ofi+shm, ofi+verbs)",
                                 sub));
    instance_ = random_u64();
    // libinfinipath's handlers come as libfabric loads (the plugin loader puts them back, and
    // a static build loads it before main); libfabric initialises its providers at the first
    // fi_getinfo, and a provider may take signals there or as it opens a device: put back.
    KeepSignals keep_signals(fmt::format("opening ofi+{} (libfabric's providers)", sub));
    TALARIA_CHECK(open_provider(sub, rest));
    pfd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pfd_ < 0) return errno_error("ofi: eventfd", errno);

    OfiLane* l0;
    {
        std::lock_guard g(setup_mu_);
        auto l = lane_create_locked(0);
        if (!l) return Error(l.error().code(), fmt::format("ofi+{}: {}", sub, l.error().message()));
        l0 = *l;
    }
    std::string canonical = canonical_of(std::as_bytes(std::span(l0->raw)));
    if (canonical.empty())
        return Error(Errc::not_supported,
                     fmt::format("ofi+{}: cannot name provider {}'s address (format {})", sub,
                                 prov_.prov_name, prov_.addr_format));
    {
        std::lock_guard g(intern_mu_);
        self_ = intern_locked(canonical, l0->raw);
        ofi_addr(self_)->instance.store(instance_, std::memory_order_relaxed);
        // Our own messages need no proof (Options::auth), only a token nobody else knows.
        OfiAddr* me = ofi_addr(self_);
        me->proved.store(true, std::memory_order_relaxed);
        me->auth.store(AuthState::admitted, std::memory_order_relaxed);
        uint64_t t = 0;
        while (t == 0)
            t = random_u64();
        me->send_token.store(t, std::memory_order_relaxed);
        me->recv_token.store(t, std::memory_order_relaxed);
    }
    note_missing_provider_env(prov_.prov_name);
    guard_open();
    TALARIA_LOG(ofi, debug, "{} open on {} (fabric {}, domain {}, mr_mode 0x{:x}, inject {}, {})",
                ofi_addr(self_)->str, prov_.prov_name, prov_.fabric, prov_.domain, prov_.mr_mode,
                prov_.inject_size, prov_.multi_recv ? "multi-recv" : "posted receive buffers");
    return ok();
}

namespace {
/// Provider parameters libfabric reads only from the environment, once per process, when
/// fi_getinfo first loads the providers. The library does not set them (no setenv: the
/// environment belongs to the application); open() warns, naming what to set, when one that
/// matters to the provider opened is missing. recommended_env() (na.cpp) holds them.
///  * FI_OFI_RXM_CM_PROGRESS_INTERVAL=100 (µs; default 10000): rxm looks at connection
///    management only that often while the CQ is polled, so every connection setup handshake
///    step waited up to 10 ms: the first call to a new ofi+tcp peer took ~20 ms, ~3 ms with 100.
///  * FI_OFI_RXM_ENABLE_DYN_RBUF=0 (default 1): with dynamic receive buffers the tcp provider
///    reads a message straight into the posted buffer, and in 1.17 a message larger than that
///    buffer (FI_ETRUNC, our message_too_large) breaks the connection: later sends to and from
///    that peer fail. Without them rxm receives into its own buffers and truncates cleanly.

/// Say which rxm settings the environment lacks (only rxm-based providers, once one opened):
/// tuning advice at info (talaria-info --doctor checks it and says what to set); an open that
/// fails says only why it failed.
void note_missing_provider_env(std::string_view prov) {
    if (prov.find("ofi_rxm") == std::string_view::npos) return;
    for (const EnvSetting& e : recommended_env())
        if (std::string_view(e.name).starts_with("FI_OFI_RXM_") && ::getenv(e.name) == nullptr)
            TALARIA_LOG(ofi, info,
                        "ofi+{}: {} is not set: {}. Set {}={} in the environment before the "
                        "process opens its first ofi transport (libfabric reads it only there "
                        "and only once; Talaria does not change the environment)",
                        prov.substr(0, prov.find(';')), e.name, e.why, e.name, e.value);
}
}  // namespace

Result<void> OfiTransport::open_provider(std::string_view sub, std::string_view rest) {
    const std::string prov = provider_of(sub);
    prov_.prov_name = prov;
    fi_info* hints = fi_allocinfo();
    if (!hints) return Error(Errc::no_memory, "ofi: fi_allocinfo failed");
    struct FreeHints {
        fi_info* h;
        ~FreeHints() { fi_freeinfo(h); }
    } free_hints{hints};
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = kCaps;
    hints->mode = 0;  // no FI_CONTEXT/FI_CONTEXT2/FI_MSG_PREFIX: we pass plain op pointers
    hints->domain_attr->mr_mode = int(kMrModes);
    // Each lane serializes its endpoint, CQ and AV under its own lock; the provider serializes
    // what the lanes share (the domain's registrations).
    hints->domain_attr->threading = FI_THREAD_COMPLETION;
    hints->fabric_attr->prov_name = ::strdup(prov.c_str());
    hints->tx_attr->op_flags = 0;

    std::string node, service;
    uint64_t flags = 0;
    const bool shm = prov == "shm";
    if (shm) {
        // Our region's name carries our pid, so peers can tell that we died (process_gone).
        if (!rest.empty() && (rest.size() > 24 ||
                              !std::all_of(rest.begin(), rest.end(),
                                           [](char c) { return valid_name_char(c) && c != ':'; })))
            return Error(Errc::address_invalid,
                         fmt::format("'ofi+shm://{}': an shm name prefix is 1..24 characters of "
                                     "[A-Za-z0-9._-]",
                                     rest));
        shm_base_ = fmt::format("{}-{}-{:08x}", rest.empty() ? "talaria" : rest, ::getpid(),
                                uint32_t(instance_));
    } else if (!rest.empty()) {
        // "host[:port]" (an IP literal or, with a port, a host name) selects the interface we
        // bind; a bare word that is not an IP ("mlx5_0") names the domain (device).
        std::string_view host = rest;
        bool bracket = !rest.empty() && rest.front() == '[';
        auto colon = rest.rfind(':');
        bool has_port = bracket ? rest.find("]:") != std::string_view::npos
                                : (colon != std::string_view::npos &&
                                   rest.find(':') == colon);  // one ':' (not a bare IPv6)
        if (has_port || is_ip_literal(rest) || bracket || rest == "localhost") {
            TALARIA_TRY(sa, parse_host_port(rest, false));
            char buf[INET6_ADDRSTRLEN] = {};
            if (sa.family() == AF_INET)
                inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa.sa())->sin_addr, buf,
                          sizeof buf);
            else
                inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa.sa())->sin6_addr, buf,
                          sizeof buf);
            node = buf;
            service = std::to_string(sa.port());
            flags = FI_SOURCE;
            hints->addr_format = sa.family() == AF_INET ? FI_SOCKADDR_IN : FI_SOCKADDR_IN6;
        } else {
            if (!std::all_of(host.begin(), host.end(), valid_name_char))
                return Error(
                    Errc::address_invalid,
                    fmt::format("'{}+://{}': not a host[:port] or a device name", sub, rest));
            hints->domain_attr->name = ::strdup(std::string(rest).c_str());
        }
    }

    auto getinfo = [&](fi_info* h, fi_info** out) {
        return fi_getinfo(FI_VERSION(1, 17), node.empty() ? nullptr : node.c_str(),
                          service.empty() ? nullptr : service.c_str(), flags, h, out);
    };
    // Multi-recv (unexpected messages) where the provider has it; without it, a pool of
    // posted buffers.
    const uint64_t tries[] = {kCaps | FI_MULTI_RECV, kCaps};
    int rc = -FI_ENODATA;
    for (uint64_t caps : tries) {
        hints->caps = caps;
        rc = getinfo(hints, &info_);
        if (rc != -FI_ENODATA) break;
    }
    if (rc != 0) {
        // Say why: no such provider, a capability it lacks, or a mode we do not support.
        fi_info* loose = fi_allocinfo();
        loose->ep_attr->type = FI_EP_RDM;
        loose->fabric_attr->prov_name = ::strdup(prov.c_str());
        loose->mode = ~0ull;
        loose->domain_attr->mr_mode = ~0;
        fi_info* any = nullptr;
        int rc2 = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, loose, &any);
        fi_freeinfo(loose);
        std::string why;
        if (rc2 != 0 || !any) {
            why = fmt::format(
                "libfabric {}.{} has no provider '{}' with reliable datagram "
                "(FI_EP_RDM) endpoints here (fi_info -l lists the providers)",
                FI_MAJOR(fi_version()), FI_MINOR(fi_version()), prov);
        } else {
            std::string missing = caps_missing(any->caps);
            if (!missing.empty())
                why = fmt::format("provider '{}' lacks capabilities this transport needs: {}", prov,
                                  missing);
            else if (any->mode != 0 || (uint64_t(any->domain_attr->mr_mode) & ~kMrModes))
                why = fmt::format(
                    "provider '{}' requires mode bits 0x{:x} or MR mode bits "
                    "0x{:x} this transport does not support (it supports no mode "
                    "bits and MR modes FI_MR_LOCAL, FI_MR_VIRT_ADDR, "
                    "FI_MR_ALLOCATED, FI_MR_PROV_KEY; not FI_MR_ENDPOINT, as every context has an "
                    "endpoint of its own)",
                    prov, any->mode, uint64_t(any->domain_attr->mr_mode));
            else
                why = fmt::format("provider '{}' matches nothing for '{}' ({})", prov, rest,
                                  fi_strerror(-rc));
            fi_freeinfo(any);
        }
        return Error(rc == -FI_ENODATA ? Errc::not_supported : Errc::io_error,
                     fmt::format("ofi+{}: fi_getinfo: {}", sub, why));
    }
    fi_info* info = info_;
    prov_.prov_name = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : prov;
    prov_.shm = prov_.prov_name == "shm";
    prov_.fabric = info->fabric_attr->name ? info->fabric_attr->name : "";
    prov_.domain = info->domain_attr->name ? info->domain_attr->name : "";
    prov_.addr_format = info->addr_format;
    prov_.tcp_listener = prov_.prov_name.starts_with("tcp");
    prov_.mr_mode = uint64_t(info->domain_attr->mr_mode);
    prov_.inject_size = info->tx_attr->inject_size;
    prov_.max_msg_size = info->ep_attr->max_msg_size;
    prov_.multi_recv = (info->caps & FI_MULTI_RECV) != 0;
    prov_.wait_fd = true;  // until lane 0's completion queue says otherwise (lane_open)
    if (prov_.max_msg_size < kHeaderRoom + kMaxMessageSize)
        return Error(
            Errc::not_supported,
            fmt::format("ofi+{}: provider {} sends at most {} bytes per message; this "
                        "transport needs {}",
                        sub, prov_.prov_name, prov_.max_msg_size, kHeaderRoom + kMaxMessageSize));

    if ((rc = fi_fabric(info->fabric_attr, &fabric_, nullptr)) != 0)
        return Error(Errc::io_error, fmt::format("ofi+{}: {}", sub, fi_err("fi_fabric", rc)));
    if ((rc = fi_domain(fabric_, info, &domain_, nullptr)) != 0)
        return Error(Errc::io_error, fmt::format("ofi+{}: {} on provider {}", sub,
                                                 fi_err("fi_domain", rc), prov_.prov_name));
    return ok();
}

uint64_t OfiTransport::next_key_locked() noexcept {
    return (prov_.mr_mode & FI_MR_PROV_KEY) ? 0 : next_key_++;
}

Result<void> OfiTransport::post_rx_buffers(OfiLane& l) {
    std::lock_guard g(l.mu);
    const std::size_t n = prov_.multi_recv ? kMultiRecvBuffers : kPlainRecvBuffers;
    const std::size_t size = prov_.multi_recv ? kMultiRecvSize : kPlainRecvSize;
    l.rx_mem.reset(new (std::nothrow) std::byte[n * size]);
    if (!l.rx_mem) return Error(Errc::no_memory, "ofi: receive buffers");
    int rc;
    {
        std::lock_guard r(reg_mu_);
        rc = fi_mr_reg(domain_, l.rx_mem.get(), n * size, FI_RECV, 0, next_key_locked(), 0,
                       &l.rx_mr, nullptr);
    }
    if (rc != 0)
        return Error(Errc::io_error, fmt::format("ofi: {} for the receive buffers on {}",
                                                 fi_err("fi_mr_reg", rc), prov_.prov_name));
    l.rx_desc = fi_mr_desc(l.rx_mr);
    for (std::size_t i = 0; i < n; ++i) {
        auto rb = std::make_unique<RxBuf>();
        rb->fi_kind = FiCtx::Kind::rx;
        rb->data = l.rx_mem.get() + i * size;
        rb->size = size;
        l.rx.push_back(std::move(rb));
        repost_rx(l, l.rx.back().get());
        if (!l.rx.back()->posted)
            return Error(Errc::io_error,
                         fmt::format("ofi: posting receive buffers on {} failed", prov_.prov_name));
    }
    return ok();
}

// --- addresses ----------------------------------------------------------------------------------

bool OfiTransport::shm_local_peer_ok_locked(OfiLane& l, Remote* r) {
    OfiAddr* a = ofi_addr(r->peer);
    const bool dead = a->dead.load(std::memory_order_relaxed);
    // (pid 0: not an shm peer.)
    if (r->pid == 0 || shm_base_.empty() || r->pid != self_pid_) return !dead;
    if (dead) return false;
    std::string_view name(r->raw);
    name.remove_prefix(std::min(name.size(), name.find("://") + 3));
    bool alive;
    {
        std::lock_guard g(g_shm_mu);
        alive = shm_live().find(name) != shm_live().end();
    }
    if (!alive) defer_death_locked(l, a, Errc::disconnected, "its endpoint in this process closed");
    return alive;
}

OfiAddr::OfiAddr(OfiTransport* t, std::string s) : AddrImpl(t), str(std::move(s)), owner_(t) {}

OfiAddr::~OfiAddr() {
    // No transport lock here (we may be running under a lane's): only the table's leaf lock.
    // The AV entries stay (see OfiLane::remotes).
    AddrTable& table = owner_->addrs_;
    for (const std::string& s : aliases)
        table.unlink(s, this);
    if (raw_alias) {
        std::string key = "\x01" + raw;
        table.unlink(key, this);
    }
    table.remove(str, this);
}

bool OfiTransport::shm_peer_gone(std::string_view raw) const {
    std::string_view name(raw);
    auto sep = name.find("://");
    if (sep == std::string_view::npos) return false;
    name.remove_prefix(sep + 3);
    if (name.empty()) return false;
    std::string n(name);
    // Ours and still open in this process: not gone (checked before the file: a closed
    // in-process peer's file is gone as well, but its mapping is what matters).
    {
        std::lock_guard g(g_shm_mu);
        if (shm_live().count(n) != 0) return false;
    }
    // The region file: shm removes it when the endpoint closes; we remove the file of a killed
    // peer when we notice its death (peer_failed_locked, lane_close).
    std::string path = "/dev/shm/" + n;
    if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return true;
    return false;
}

std::optional<SockAddr> OfiTransport::sock_addr_of(std::span<const std::byte> raw) const {
    SockAddr sa;
    const bool v4 = prov_.addr_format == FI_SOCKADDR_IN;
    if (!v4 && prov_.addr_format != FI_SOCKADDR_IN6) return std::nullopt;
    if (raw.size() != (v4 ? sizeof(sockaddr_in) : sizeof(sockaddr_in6))) return std::nullopt;
    std::memcpy(&sa.storage, raw.data(), raw.size());
    sa.len = socklen_t(raw.size());
    if (sa.family() != (v4 ? AF_INET : AF_INET6) || sa.port() == 0) return std::nullopt;
    return sa;
}

std::string OfiTransport::canonical_of(std::span<const std::byte> raw) const {
    std::string prefix = scheme_ + "://";
    switch (prov_.addr_format) {
        case FI_SOCKADDR_IN:
        case FI_SOCKADDR_IN6: {
            auto sa = sock_addr_of(raw);
            return sa ? prefix + sa->to_string() : std::string{};
        }
        case FI_ADDR_STR: {
            std::string_view s(reinterpret_cast<const char*>(raw.data()), raw.size());
            auto sep = s.find("://");
            if (sep == std::string_view::npos || sep + 3 >= s.size()) return {};
            std::string_view name = s.substr(sep + 3);
            if (!std::all_of(name.begin(), name.end(), valid_name_char)) return {};
            // Other providers' strings (fi_ns://, another fi_shm spelling) are not ours.
            if (!raw_prefix_.empty() && s.substr(0, sep + 3) != raw_prefix_) return {};
            return prefix + std::string(name);
        }
        default: {
            std::string out = prefix + "x";
            for (std::byte b : raw)
                out += fmt::format("{:02x}", uint8_t(b));
            return out;
        }
    }
}

Result<std::string> OfiTransport::raw_of(std::string_view rest, bool from_wire) const {
    auto bad = [&](std::string_view why) {
        return Error(Errc::address_invalid, fmt::format("'{}://{}' is not a valid {} address: {}",
                                                        scheme_, rest, scheme_, why));
    };
    switch (prov_.addr_format) {
        case FI_SOCKADDR_IN:
        case FI_SOCKADDR_IN6: {
            if (rest.empty()) return bad("no host:port");
            if (from_wire) {
                // Strings from the wire never trigger a (blocking) name lookup.
                std::string_view host = rest.front() == '[' ? rest.substr(1, rest.find(']') - 1)
                                                            : rest.substr(0, rest.rfind(':'));
                if (!is_ip_literal(host)) return bad("not a numeric IP address");
            }
            auto sa = parse_host_port(rest, false);
            if (!sa) return bad(sa.error().message());
            if (sa->port() == 0)
                return bad(
                    "port 0 names no peer: use the address the server reports "
                    "(Engine::self_address(), or addr_to_string(addr_self()) at the na "
                    "layer)");
            int want = prov_.addr_format == FI_SOCKADDR_IN ? AF_INET : AF_INET6;
            if (sa->family() != want)
                return bad(want == AF_INET ? "this endpoint speaks IPv4"
                                           : "this endpoint speaks IPv6");
            return std::string(reinterpret_cast<const char*>(sa->sa()), sa->len);
        }
        case FI_ADDR_STR: {
            const std::string& prefix = raw_prefix_;
            if (rest.empty() || prefix.size() + rest.size() > kMaxRawAddr)
                return bad(fmt::format("a name of 1..{} characters", kMaxRawAddr - prefix.size()));
            if (!std::all_of(rest.begin(), rest.end(), valid_name_char))
                return bad("characters outside [A-Za-z0-9._:-]");
            return prefix + std::string(rest);
        }
        default: {
            if (rest.size() < 3 || rest[0] != 'x' || rest.size() % 2 != 1 ||
                (rest.size() - 1) / 2 > kMaxRawAddr)
                return bad("expected x<hex bytes>");
            std::string out;
            for (std::size_t i = 1; i < rest.size(); i += 2) {
                auto hex = [](char c) -> int {
                    if (c >= '0' && c <= '9') return c - '0';
                    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
                    return -1;
                };
                int hi = hex(rest[i]), lo = hex(rest[i + 1]);
                if (hi < 0 || lo < 0) return bad("expected x<lowercase hex bytes>");
                out.push_back(char(hi * 16 + lo));
            }
            return out;
        }
    }
}

Addr OfiTransport::intern_locked(const std::string& canonical, std::string raw) {
    if (Addr a = addrs_.find(canonical)) return a;
    auto* a = new OfiAddr(this, canonical);
    Addr out(a);
    a->raw = std::move(raw);
    if (prov_.prov_name == "shm") a->pid = shm_pid_of(a->raw);
    addrs_.add(canonical, a);
    std::string key = "\x01" + a->raw;
    addrs_.alias(key, a);
    a->raw_alias = true;
    return out;
}

Result<Addr> OfiTransport::lookup_locked(std::string_view address, bool from_wire) {
    const std::string prefix = scheme_ + "://";
    if (!address.starts_with(prefix))
        return Error(
            Errc::address_invalid,
            fmt::format("'{}' is not an {} address (expected {}...)", address, scheme_, prefix));
    if (Addr a = addrs_.find(address)) return a;
    std::string_view rest = address.substr(prefix.size());
    TALARIA_TRY(raw, raw_of(rest, from_wire));
    std::string canonical = canonical_of(std::as_bytes(std::span(raw)));
    if (canonical.empty())
        return Error(Errc::address_invalid,
                     fmt::format("'{}' does not name an {} endpoint", address, scheme_));
    Addr out = intern_locked(canonical, std::move(raw));
    auto* a = ofi_addr(out);
    // Nothing goes into an address vector here: each lane inserts a peer's endpoints on first
    // use (shm's AV holds at most 256 peers and entries cannot be removed, so lookups alone
    // must not fill it).
    if (address != canonical && a->aliases.size() < 4 &&
        std::find(a->aliases.begin(), a->aliases.end(), address) == a->aliases.end()) {
        addrs_.alias(address, a);
        a->aliases.emplace_back(address);
    }
    return out;
}

Result<Addr> OfiTransport::addr_lookup(std::string_view address) {
    std::lock_guard g(intern_mu_);
    return lookup_locked(address, false);
}

Addr OfiTransport::addr_alias(const Addr& a) {
    if (!a || a.impl()->transport() != this) return a;
    return alias_of(this, a);
}

std::string OfiTransport::addr_to_string(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    return ofi_addr(a)->str;
}

std::string OfiTransport::peer_failure(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    OfiAddr* p = ofi_addr(a);
    std::lock_guard g(p->failure_mu);
    return p->failure;
}

std::size_t OfiTransport::addr_serialize_size(const Addr& a) {
    if (!a || a.impl()->transport() != this) return 0;
    return addr_blob_size(ofi_addr(a)->str);
}

Result<std::size_t> OfiTransport::addr_serialize(const Addr& a, std::span<std::byte> out) {
    if (!a || a.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("addr_serialize: not an address of this {} transport", scheme_));
    const std::string& s = ofi_addr(a)->str;
    if (out.size() < addr_blob_size(s))
        return Error(Errc::invalid_argument,
                     fmt::format("addr_serialize: needs {} bytes, buffer has {}", addr_blob_size(s),
                                 out.size()));
    encode_addr_blob(s, out.data());
    return addr_blob_size(s);
}

Result<Addr> OfiTransport::addr_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(s, decode_addr_blob(in));
    std::lock_guard g(intern_mu_);
    return lookup_locked(s, true);
}

// --- memory -------------------------------------------------------------------------------------

OfiMem::OfiMem(OfiTransport* t, uint64_t base, uint64_t length, Access access, bool local)
    : MemImpl(t, base, length, access, local), owner_transport(t) {}

OfiMem::~OfiMem() {
    if (local()) owner_transport->mem_unregister(this);
}

void OfiTransport::mem_unregister(OfiMem* m) noexcept {
    if (!m->mr) return;
    std::lock_guard g(reg_mu_);
    if (auto it = regs_.find(m->key); it != regs_.end() && it->second == m) regs_.erase(it);
    int rc = fi_close(&m->mr->fid);
    if (rc != 0)
        TALARIA_LOG(ofi, error, "{}: fi_close(mr) failed: {}", prov_.prov_name, fi_strerror(-rc));
    m->mr = nullptr;
}

Result<MemHandle> OfiTransport::mem_register(void* buf, std::size_t len, Access access) {
    if (!buf && len > 0)
        return Error(Errc::invalid_argument, "mem_register: null buffer with a nonzero length");
    if (access != Access::read_only && access != Access::write_only && access != Access::read_write)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_register: invalid access mode {}", int(access)));
    auto m = std::make_unique<OfiMem>(this, reinterpret_cast<uintptr_t>(buf), len, access, true);
    m->virt = (prov_.mr_mode & FI_MR_VIRT_ADDR) != 0;
    if (len == 0) return MemHandle(std::move(m));  // nothing to register; RMA of 0 bytes only
    uint64_t acc = FI_READ | FI_WRITE;             // our own put (source) and get (destination)
    if (uint8_t(access) & uint8_t(Access::read_only)) acc |= FI_REMOTE_READ;
    if (uint8_t(access) & uint8_t(Access::write_only)) acc |= FI_REMOTE_WRITE;
    int rc;
    {
        std::lock_guard g(reg_mu_);
        rc = fi_mr_reg(domain_, buf, len, acc, 0, next_key_locked(), 0, &m->mr, nullptr);
        if (rc == 0) {
            m->key = fi_mr_key(m->mr);
            m->desc = fi_mr_desc(m->mr);
            regs_[m->key] = m.get();
        }
    }
    if (rc != 0)
        return Error(rc == -FI_ENOMEM ? Errc::no_memory : Errc::io_error,
                     fmt::format("mem_register of {} bytes: {} on {}", len, fi_err("fi_mr_reg", rc),
                                 prov_.prov_name));
    return MemHandle(std::move(m));
}

std::size_t OfiTransport::mem_serialize_size(const MemHandle& h) {
    if (!h || h->transport() != this) return 0;
    auto* m = h.as<OfiMem>();
    return mem_blob_size(m->local() ? ofi_addr(self_)->str : m->owner);
}

Result<std::size_t> OfiTransport::mem_serialize(const MemHandle& h, std::span<std::byte> out) {
    if (!h || h->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_serialize: not a handle of this {} transport", scheme_));
    auto* m = h.as<OfiMem>();
    MemBlob b;
    b.access = uint8_t(m->access());
    b.flags = m->virt ? kMemVirtAddr : 0;
    b.base = m->base();
    b.length = m->length();
    b.key = m->key;
    b.owner = m->local() ? std::string_view(ofi_addr(self_)->str) : m->owner;
    std::size_t need = mem_blob_size(b.owner);
    if (out.size() < need)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_serialize: needs {} bytes, buffer has {}", need, out.size()));
    encode_mem_blob(b, out.data());
    return need;
}

Result<MemHandle> OfiTransport::mem_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(b, decode_mem_blob(in));
    auto m = std::make_unique<OfiMem>(this, b.base, b.length, Access(b.access), false);
    m->key = b.key;
    m->virt = (b.flags & kMemVirtAddr) != 0;
    m->owner = std::string(b.owner);
    std::lock_guard g(intern_mu_);
    TALARIA_TRY(owner, lookup_locked(m->owner, true));
    m->owner_addr = owner;
    return MemHandle(std::move(m));
}

// --- message buffers ----------------------------------------------------------------------------

Result<Slab*> OfiTransport::slab_grow(uint8_t size_class) {
    auto s = std::make_unique<Slab>();
    s->owner = this;
    s->size_class = size_class;
    const std::size_t slot = kHeaderRoom + kSizeClass[size_class];
    s->mem.reset(new (std::nothrow) std::byte[slot * kSlabSlots]);
    if (!s->mem) return Error(Errc::no_memory, "ofi: message buffer slab allocation failed");
    int rc;
    {
        std::lock_guard g(reg_mu_);
        rc = fi_mr_reg(domain_, s->mem.get(), slot * kSlabSlots, FI_SEND | FI_RECV, 0,
                       next_key_locked(), 0, &s->mr, nullptr);
    }
    if (rc != 0)
        return Error(Errc::io_error, fmt::format("ofi: {} for message buffers on {}",
                                                 fi_err("fi_mr_reg", rc), prov_.prov_name));
    s->desc = fi_mr_desc(s->mr);
    Slab* p = s.get();
    {
        std::lock_guard g(buf_mu_);
        slabs_.push_back(std::move(s));
        for (std::size_t i = 0; i < kSlabSlots; ++i)
            free_slots_[size_class].push_back(p->mem.get() + i * slot);
    }
    return p;
}

Result<MsgBuffer> OfiTransport::msg_buf_alloc(std::size_t size) {
    if (size > kMaxMessageSize)
        return Error(Errc::message_too_large,
                     fmt::format("message buffer of {} bytes exceeds the {} transport's maximum "
                                 "of {} bytes",
                                 size, scheme_, kMaxMessageSize));
    if (!(prov_.mr_mode & FI_MR_LOCAL)) {
        // The provider needs no descriptor for local buffers (tcp;ofi_rxm, shm): the heap, with
        // the header room in front, and no lock shared by the contexts' threads.
        std::size_t cap = (kHeaderRoom + std::max<std::size_t>(size, 1) + 63) & ~std::size_t(63);
        void* p = std::aligned_alloc(64, cap);
        if (!p) return Error(Errc::no_memory, "ofi: message buffer allocation failed");
        return MsgBuffer(this, static_cast<std::byte*>(p) + kHeaderRoom, size, &heap_slab_);
    }
    const uint8_t cls = size <= kSizeClass[0] ? 0 : 1;
    for (;;) {
        {
            std::lock_guard g(buf_mu_);
            if (!free_slots_[cls].empty()) {
                std::byte* slot = free_slots_[cls].back();
                free_slots_[cls].pop_back();
                // Which slab: the few slabs are searched (allocation is not per message).
                Slab* owner = nullptr;
                for (auto& s : slabs_)
                    if (s->size_class == cls && slot >= s->mem.get() &&
                        slot < s->mem.get() + (kHeaderRoom + kSizeClass[cls]) * kSlabSlots)
                        owner = s.get();
                return MsgBuffer(this, slot + kHeaderRoom, size, owner);
            }
        }
        // Registration happens here, when the pool grows: never on a post.
        auto s = slab_grow(cls);
        if (!s) return std::move(s).error();
    }
}

void OfiTransport::msg_buf_free(MsgBuffer& buf) noexcept {
    auto* s = static_cast<Slab*>(buf.priv());
    if (!s) return;
    if (s == &heap_slab_) {
        std::free(buf.data() - kHeaderRoom);
        return;
    }
    std::lock_guard g(buf_mu_);
    free_slots_[s->size_class].push_back(buf.data() - kHeaderRoom);
}

std::byte* OfiTransport::bounce_alloc(void** desc) noexcept {
    for (int attempt = 0; attempt < 2; ++attempt) {
        {
            std::lock_guard g(buf_mu_);
            if (!free_slots_[1].empty()) {
                std::byte* p = free_slots_[1].back();
                free_slots_[1].pop_back();
                for (auto& s : slabs_)
                    if (s->size_class == 1 && p >= s->mem.get() &&
                        p < s->mem.get() + (kHeaderRoom + kSizeClass[1]) * kSlabSlots)
                        *desc = s->desc;
                return p;
            }
        }
        if (!slab_grow(1)) return nullptr;
    }
    return nullptr;
}

void OfiTransport::bounce_free(std::byte* p) noexcept {
    std::lock_guard g(buf_mu_);
    free_slots_[1].push_back(p);
}

}  // namespace ofi
}  // namespace talaria::na
