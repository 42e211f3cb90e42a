// inproc set-up: the endpoint registry, open/close, contexts, addresses, memory registration
// and the fault-injection API. The data path is in inproc_datapath.cpp.
#include "na/inproc/inproc.hpp"

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "na/base/transports.hpp"
#include "na/inproc/inproc_faults.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {
namespace inproc {

namespace {

// Serialized forms (see docs/protocol.md (inproc)). Little-endian.
constexpr uint8_t kAddrMagic[3] = {'T', 'I', 'A'};
constexpr uint8_t kMemMagic[3] = {'T', 'I', 'M'};
constexpr uint8_t kVersion = 1;
constexpr std::size_t kAddrHeader = 6;  // magic[3], version u8, name_len u16
constexpr std::size_t kMemSize = 48;

struct Registry {
    std::mutex mu;
    std::unordered_map<std::string, std::weak_ptr<Port>> ports;
};

// Leaked on purpose: transports destroyed during static destruction may still unregister.
Registry& registry() {
    static Registry* r = new Registry;
    return *r;
}

std::atomic<uint64_t> g_next_uid{1};
std::atomic<uint64_t> g_next_reg{1};
std::atomic<uint64_t> g_next_anon{1};

void put_u16(std::byte* p, uint16_t v) {
    p[0] = std::byte(v & 0xff);
    p[1] = std::byte(v >> 8);
}
void put_u32(std::byte* p, uint32_t v) {
    for (int i = 0; i < 4; ++i)
        p[i] = std::byte((v >> (8 * i)) & 0xff);
}
void put_u64(std::byte* p, uint64_t v) {
    for (int i = 0; i < 8; ++i)
        p[i] = std::byte((v >> (8 * i)) & 0xff);
}
uint16_t get_u16(const std::byte* p) {
    return uint16_t(uint16_t(p[0]) | uint16_t(uint16_t(p[1]) << 8));
}
uint32_t get_u32(const std::byte* p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
        v |= uint32_t(p[i]) << (8 * i);
    return v;
}
uint64_t get_u64(const std::byte* p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
        v |= uint64_t(p[i]) << (8 * i);
    return v;
}

InprocTransport* as_inproc(Transport& t) {
    return t.name() == "inproc" ? static_cast<InprocTransport*>(&t) : nullptr;
}

}  // namespace

bool valid_name(std::string_view name) noexcept {
    if (name.empty() || name.size() > kMaxNameLen) return false;
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok) return false;
    }
    return true;
}

std::shared_ptr<Port> registry_find(std::string_view name) {
    auto& r = registry();
    std::lock_guard g(r.mu);
    auto it = r.ports.find(std::string(name));
    if (it == r.ports.end()) return nullptr;
    auto p = it->second.lock();
    if (p && !p->open.load(std::memory_order_acquire)) return nullptr;
    return p;
}

// --- memory handles ------------------------------------------------------------------------------

InprocMem::InprocMem(InprocTransport* t, uint64_t base, uint64_t length, Access access, bool local,
                     uint64_t owner, uint64_t reg) noexcept
    : MemImpl(t, base, length, access, local), owner_uid(owner), reg_id(reg) {}

InprocMem::~InprocMem() {
    if (local()) static_cast<InprocTransport*>(transport())->deregister(reg_id);
}

// --- ports and contexts --------------------------------------------------------------------------

Port::Port(bool thread_safe, uint64_t id, std::string n, std::size_t max_ctx)
    : mu(thread_safe),
      uid(id),
      name(std::move(n)),
      max_contexts(max_ctx),
      lanes(new std::atomic<Lane*>[max_ctx]) {
    for (std::size_t i = 0; i < max_ctx; ++i)
        lanes[i].store(nullptr, std::memory_order_relaxed);
}

Port::~Port() {
    for (std::size_t i = 0; i < max_contexts; ++i)
        delete lanes[i].load(std::memory_order_relaxed);
}

InprocContext::InprocContext(InprocTransport* t, uint8_t id, bool thread_safe, Lane* lane)
    : Context(t, id, thread_safe), t_(t), lane_(lane) {}

InprocContext::~InprocContext() {
    t_->context_closing(*this);
}

// --- transport set-up ----------------------------------------------------------------------------

InprocTransport::InprocTransport(std::string name, const Options& o, int epfd, int timerfd)
    : addrs_(o.thread_safe),
      name_(std::move(name)),
      opts_(o),
      epfd_(epfd),
      timerfd_(timerfd),
      intern_mu_(o.thread_safe),
      port_(std::make_shared<Port>(o.thread_safe, g_next_uid.fetch_add(1), name_, o.max_contexts)) {
    port_->t = this;
}

InprocTransport::~InprocTransport() {
    // Leave the registry first, so no new sender finds us, then detach from the port that
    // senders may still hold, then tell every other endpoint we are gone.
    {
        auto& r = registry();
        std::lock_guard g(r.mu);
        auto it = r.ports.find(name_);
        if (it != r.ports.end() && it->second.lock() == port_) r.ports.erase(it);
        port_->open.store(false, std::memory_order_release);
    }
    {
        std::lock_guard g(port_->mu);
        port_->t = nullptr;
        // Senders may still hold the port and reach a lane: they find it closed. What the
        // lanes hold of this endpoint (addresses, other ports) goes now.
        for (unsigned i = 0; i < opts_.max_contexts; ++i) {
            Lane* l = port_->lane(uint8_t(i));
            if (!l) continue;
            std::lock_guard lg(l->mu);
            if (l->ctx)
                TALARIA_LOG(inproc, error,
                            "endpoint '{}' closed before its context {}: destroy contexts first",
                            name_, i);
            l->t = nullptr;
            l->ctx = nullptr;
            l->queued.clear();
            l->expected_queued.clear();
            l->sources.clear();
            l->routes.clear();
        }
    }
    std::vector<std::shared_ptr<Port>> peers;
    {
        auto& r = registry();
        std::lock_guard g(r.mu);
        for (auto& [n, w] : r.ports)
            if (auto p = w.lock()) peers.push_back(std::move(p));
    }
    for (auto& p : peers) {
        std::lock_guard g(p->mu);
        if (p->t) p->t->peer_lost_locked(name_);
    }
    ::close(timerfd_);
    ::close(epfd_);
    TALARIA_LOG(inproc, debug, "endpoint '{}' closed", name_);
}

Result<std::unique_ptr<Context>> InprocTransport::context_create(uint8_t id,
                                                                 const ContextOptions& opts) {
    if (id >= opts_.max_contexts)
        return Error(Errc::invalid_argument,
                     fmt::format("inproc '{}': context id {} is out of range (max_contexts {})",
                                 name_, id, opts_.max_contexts));
    Lane* l = nullptr;
    {
        std::lock_guard g(port_->mu);
        l = port_->lane(id);
        if (!l) {
            l = new Lane(opts_.thread_safe, id, opts_.max_ops);
            l->t = this;
            port_->lanes[id].store(l, std::memory_order_release);
        }
    }
    auto ctx = std::make_unique<InprocContext>(this, id, opts_.thread_safe, l);
    ctx->set_takes_unexpected(opts.unexpected);
    if (ctx->wait_fd() < 0 || ctx->event_fd() < 0)
        return Error(Errc::io_error, "inproc: the context could not create its eventfd/epoll fd");
    std::lock_guard g(l->mu);
    if (l->ctx) {
        // `ctx` was never registered: its destructor leaves the existing context alone.
        return Error(Errc::already_exists,
                     fmt::format("inproc '{}': context {} already exists", name_, id));
    }
    l->ctx = ctx.get();
    l->takes_unexpected = opts.unexpected;
    return std::unique_ptr<Context>(std::move(ctx));
}

void InprocTransport::context_closing(InprocContext& ctx) noexcept {
    Lane& l = ctx.lane();
    // Ops still posted on this context would dangle: give them back without completing
    // (the contract says to cancel and drain first; say so when someone did not).
    std::size_t dropped = 0;
    auto drop = [&](IntrusiveList<InprocOp>& list) {
        list.for_each_safe([&](InprocOp& op) {
            if (op.ctx != &ctx) return;
            list.erase(op);
            op.where = InprocOp::Where::none;
            op.releaser->release(&op);
            ++dropped;
        });
    };
    {
        std::lock_guard g(l.mu);
        if (l.ctx != &ctx) return;
        l.ctx = nullptr;
        l.takes_unexpected = false;
        l.queued.clear();
        l.expected_queued.clear();
        drop(l.recvs);
        drop(l.expected_recvs);
        l.sources.clear();
        l.routes.clear();
    }
    {
        std::lock_guard g(port_->mu);
        drop(delayed_);
        arm_timer_locked();
        refresh_faulty_locked();
    }
    if (dropped)
        TALARIA_LOG(inproc, warn,
                    "inproc '{}': context {} destroyed with {} operation(s) still posted; they "
                    "were dropped without completing (cancel and drain before destroying)",
                    name_, ctx.id(), dropped);
}

// --- addresses -----------------------------------------------------------------------------------

Addr InprocTransport::intern(std::string_view name) {
    std::lock_guard g(intern_mu_);
    if (Addr a = addrs_.find(name)) return a;
    auto* p = new InprocAddr(this, &addrs_, std::string(name));
    Addr a(p);
    if (name == name_) p->port = port_;
    addrs_.add(name, p);
    return a;
}

Result<Addr> InprocTransport::addr_lookup(std::string_view address) {
    if (address.substr(0, kScheme.size()) != kScheme)
        return Error(
            Errc::address_invalid,
            fmt::format("'{}' is not an inproc address (expected inproc://name)", address));
    auto n = address.substr(kScheme.size());
    if (!valid_name(n))
        return Error(Errc::address_invalid,
                     fmt::format("'{}': an inproc name is 1..{} characters of [A-Za-z0-9._:-]",
                                 address, kMaxNameLen));
    return intern(n);
}

Addr InprocTransport::addr_self() {
    return intern(name_);
}

Addr InprocTransport::addr_alias(const Addr& a) {
    if (!a || a.impl()->transport() != this) return a;
    return alias_of(this, a);
}

std::string InprocTransport::addr_to_string(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    return fmt::format("{}{}", kScheme, peer_of(a)->name);
}

std::size_t InprocTransport::addr_serialize_size(const Addr& a) {
    if (!a || a.impl()->transport() != this) return 0;
    return kAddrHeader + peer_of(a)->name.size();
}

// Layout: 'T' 'I' 'A' version(u8) name_len(u16) name[name_len].
Result<std::size_t> InprocTransport::addr_serialize(const Addr& a, std::span<std::byte> out) {
    TALARIA_TRY(ia, check_addr(a, "addr_serialize"));
    std::size_t need = kAddrHeader + ia->name.size();
    if (out.size() < need)
        return Error(
            Errc::invalid_argument,
            fmt::format("addr_serialize: buffer of {} bytes, {} needed", out.size(), need));
    std::memcpy(out.data(), kAddrMagic, 3);
    out[3] = std::byte(kVersion);
    put_u16(out.data() + 4, uint16_t(ia->name.size()));
    std::memcpy(out.data() + kAddrHeader, ia->name.data(), ia->name.size());
    return need;
}

Result<Addr> InprocTransport::addr_deserialize(std::span<const std::byte> in) {
    if (in.size() < kAddrHeader)
        return Error(Errc::address_invalid,
                     fmt::format("inproc address: {} bytes is shorter than the {}-byte header",
                                 in.size(), kAddrHeader));
    if (std::memcmp(in.data(), kAddrMagic, 3) != 0)
        return Error(Errc::address_invalid, "inproc address: bad magic (not an inproc address)");
    if (uint8_t(in[3]) != kVersion)
        return Error(Errc::address_invalid,
                     fmt::format("inproc address: version {} (this build reads {})",
                                 unsigned(in[3]), kVersion));
    std::size_t n = get_u16(in.data() + 4);
    if (n == 0 || n > kMaxNameLen || in.size() != kAddrHeader + n)
        return Error(Errc::address_invalid,
                     fmt::format("inproc address: name length {} does not fit {} bytes (max {})", n,
                                 in.size(), kMaxNameLen));
    std::string_view name(reinterpret_cast<const char*>(in.data() + kAddrHeader), n);
    if (!valid_name(name))
        return Error(Errc::address_invalid, "inproc address: name has invalid characters");
    return intern(name);
}

// --- memory --------------------------------------------------------------------------------------

Result<MemHandle> InprocTransport::mem_register(void* buf, std::size_t len, Access access) {
    if (!buf && len)
        return Error(Errc::invalid_argument, "mem_register: null buffer with non-zero length");
    if (access != Access::read_only && access != Access::write_only && access != Access::read_write)
        return Error(Errc::invalid_argument,
                     fmt::format("mem_register: invalid access value {}", unsigned(access)));
    uint64_t base = reinterpret_cast<uintptr_t>(buf);
    if (len > UINT64_MAX - base)
        return Error(Errc::invalid_argument, "mem_register: region wraps the address space");
    uint64_t id = g_next_reg.fetch_add(1);
    {
        std::lock_guard g(port_->mu);
        regs_.emplace(id, Reg{base, len, access});
    }
    return MemHandle(std::make_unique<InprocMem>(this, base, len, access, true, port_->uid, id));
}

void InprocTransport::deregister(uint64_t reg_id) noexcept {
    std::lock_guard g(port_->mu);
    regs_.erase(reg_id);
}

std::size_t InprocTransport::mem_serialize_size(const MemHandle& h) {
    if (!h || h->transport() != this) return 0;
    return kMemSize;
}

// Layout (48 bytes): 'T' 'I' 'M' version(u8) access(u8) reserved(u8)=0 reserved(u16)=0
// pid(u32) reserved(u32)=0 owner_uid(u64) reg_id(u64) base(u64) length(u64).
Result<std::size_t> InprocTransport::mem_serialize(const MemHandle& h, std::span<std::byte> out) {
    if (!h || h->transport() != this)
        return Error(Errc::invalid_argument, "mem_serialize: not an inproc memory handle");
    if (out.size() < kMemSize)
        return Error(
            Errc::invalid_argument,
            fmt::format("mem_serialize: buffer of {} bytes, {} needed", out.size(), kMemSize));
    auto* m = h.as<InprocMem>();
    std::memset(out.data(), 0, kMemSize);
    std::memcpy(out.data(), kMemMagic, 3);
    out[3] = std::byte(kVersion);
    out[4] = std::byte(m->access());
    put_u32(out.data() + 8, uint32_t(::getpid()));
    put_u64(out.data() + 16, m->owner_uid);
    put_u64(out.data() + 24, m->reg_id);
    put_u64(out.data() + 32, m->base());
    put_u64(out.data() + 40, m->length());
    return kMemSize;
}

Result<MemHandle> InprocTransport::mem_deserialize(std::span<const std::byte> in) {
    if (in.size() != kMemSize)
        return Error(
            Errc::invalid_argument,
            fmt::format("inproc memory handle: {} bytes, expected {}", in.size(), kMemSize));
    if (std::memcmp(in.data(), kMemMagic, 3) != 0 || uint8_t(in[3]) != kVersion)
        return Error(Errc::invalid_argument,
                     "inproc memory handle: bad magic or version (not an inproc handle)");
    auto access = Access(uint8_t(in[4]));
    if (access != Access::read_only && access != Access::write_only && access != Access::read_write)
        return Error(Errc::invalid_argument,
                     fmt::format("inproc memory handle: invalid access {}", unsigned(in[4])));
    if (in[5] != std::byte{0} || get_u16(in.data() + 6) != 0 || get_u32(in.data() + 12) != 0)
        return Error(Errc::invalid_argument, "inproc memory handle: reserved bytes are not zero");
    if (get_u32(in.data() + 8) != uint32_t(::getpid()))
        return Error(Errc::invalid_argument,
                     "inproc memory handle: made by another process (inproc is one process)");
    uint64_t owner = get_u64(in.data() + 16);
    uint64_t reg = get_u64(in.data() + 24);
    uint64_t base = get_u64(in.data() + 32);
    uint64_t len = get_u64(in.data() + 40);
    if (owner == 0 || reg == 0 || len > UINT64_MAX - base)
        return Error(Errc::invalid_argument, "inproc memory handle: invalid id or extent");
    // The fields are not trusted: every put/get is checked against the owner's table.
    return MemHandle(std::make_unique<InprocMem>(this, base, len, access, false, owner, reg));
}

}  // namespace inproc

// --- opening -------------------------------------------------------------------------------------

Result<std::unique_ptr<Transport>> open_inproc(std::string_view rest, const Options& o) {
    using namespace inproc;
    if (o.max_contexts == 0)
        return Error(Errc::invalid_argument, "inproc: Options::max_contexts must be at least 1");
    if (o.max_ops == 0)
        return Error(Errc::invalid_argument, "inproc: Options::max_ops must be at least 1");
    if (!rest.empty() && !valid_name(rest))
        return Error(Errc::address_invalid,
                     fmt::format("inproc://{}: a name is 1..{} characters of [A-Za-z0-9._:-]", rest,
                                 kMaxNameLen));
    int epfd = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) return errno_error("inproc: epoll_create1", errno);
    int tfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tfd < 0) {
        int e = errno;
        ::close(epfd);
        return errno_error("inproc: timerfd_create", e);
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = tfd;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, tfd, &ev) < 0) {
        int e = errno;
        ::close(tfd);
        ::close(epfd);
        return errno_error("inproc: epoll_ctl(timerfd)", e);
    }
    auto& r = registry();
    std::lock_guard g(r.mu);
    std::string name(rest);
    auto taken = [&](const std::string& n) {
        auto it = r.ports.find(n);
        return it != r.ports.end() && !it->second.expired();
    };
    if (name.empty()) {
        do {
            name = fmt::format("anon-{}-{}", ::getpid(), g_next_anon.fetch_add(1));
        } while (taken(name));
    } else if (taken(name)) {
        ::close(tfd);
        ::close(epfd);
        return Error(Errc::address_in_use,
                     fmt::format("inproc://{} is already open in this process", name));
    }
    auto t = std::make_unique<InprocTransport>(name, o, epfd, tfd);
    r.ports[name] = t->port_shared();
    TALARIA_LOG(inproc, debug, "endpoint inproc://{} open", name);
    return std::unique_ptr<Transport>(std::move(t));
}

// --- fault injection -----------------------------------------------------------------------------

namespace inproc {

namespace {
Result<InprocTransport*> fault_target(Transport& t, std::string_view what) {
    auto* it = as_inproc(t);
    if (!it)
        return Error(
            Errc::invalid_argument,
            fmt::format("{}: fault injection needs an inproc transport, not '{}'", what, t.name()));
    return it;
}
}  // namespace

Result<void> drop_next_messages(Transport& t, unsigned n) {
    TALARIA_TRY(it, fault_target(t, "drop_next_messages"));
    std::lock_guard g(it->port().mu);
    it->faults().drop_next = n;
    it->refresh_faulty_locked();
    return ok();
}

Result<void> set_delivery_delay(Transport& t, Duration delay) {
    TALARIA_TRY(it, fault_target(t, "set_delivery_delay"));
    if (delay < Duration::zero())
        return Error(Errc::invalid_argument, "set_delivery_delay: negative delay");
    std::lock_guard g(it->port().mu);
    it->faults().delay = delay;
    it->refresh_faulty_locked();
    return ok();
}

Result<void> fail_next_ops(Transport& t, Errc code, unsigned n) {
    TALARIA_TRY(it, fault_target(t, "fail_next_ops"));
    if (code == Errc::ok)
        return Error(Errc::invalid_argument, "fail_next_ops: code must not be ok");
    std::lock_guard g(it->port().mu);
    it->faults().fail_next = n;
    it->faults().fail_code = code;
    it->refresh_faulty_locked();
    return ok();
}

Result<void> disconnect(Transport& t, const Addr& peer) {
    TALARIA_TRY(it, fault_target(t, "disconnect"));
    if (!peer || peer.impl()->transport() != it)
        return Error(Errc::invalid_argument, "disconnect: peer is not an address of this endpoint");
    const std::string& peer_name = peer_of(peer)->name;
    {
        std::lock_guard g(it->port().mu);
        it->peer_lost_locked(peer_name);
    }
    if (peer_name == it->endpoint_name()) return ok();
    if (auto p = registry_find(peer_name)) {
        std::lock_guard g(p->mu);
        if (p->t) p->t->peer_lost_locked(it->endpoint_name());
    }
    TALARIA_LOG(inproc, info, "fault: link {} <-> {} broken", it->endpoint_name(), peer_name);
    return ok();
}

}  // namespace inproc
}  // namespace talaria::na
