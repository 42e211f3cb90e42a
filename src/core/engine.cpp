// core::Engine: opening, the procedure registry, counters, and orderly shutdown.
#include <fmt/format.h>
#include <unistd.h>

#include "core/core_impl.hpp"
#include "talaria/util/log.hpp"

namespace talaria::core {

using namespace std::chrono_literals;

// --- registry ---------------------------------------------------------------------------------

namespace {
inline std::size_t slot_of(RpcId id, uint16_t provider, std::size_t mask) noexcept {
    // Ids are hashes already; spread them anyway, and the providers of one id apart.
    return ((id ^ (uint32_t(provider) * 0x85EBCA6Bu)) * 0x9E3779B1u) & mask;
}
std::string provider_suffix(uint16_t provider) {
    return provider ? fmt::format(" for provider {}", provider) : std::string();
}
}  // namespace

Registry::Registry() : table_(new std::atomic<RpcEntry*>[kCapacity]) {
    for (std::size_t i = 0; i < kCapacity; ++i)
        table_[i].store(nullptr, std::memory_order_relaxed);
}

RpcEntry* Registry::find(RpcId id, uint16_t provider) const noexcept {
    const std::size_t mask = kCapacity - 1;
    for (std::size_t n = 0, i = slot_of(id, provider, mask); n < kCapacity;
         ++n, i = (i + 1) & mask) {
        RpcEntry* e = table_[i].load(std::memory_order_acquire);
        if (!e) return nullptr;
        if (e->id == id && e->provider == provider)
            return e->live.load(std::memory_order_acquire) ? e : nullptr;
    }
    return nullptr;
}

Result<void> Registry::add(RpcId id, std::string_view name, Handler h, const Registration& reg) {
    if (!h) return Error{Errc::invalid_argument, fmt::format("register '{}': no handler", name)};
    std::lock_guard g(mu_);
    const std::size_t mask = kCapacity - 1;
    for (std::size_t n = 0, i = slot_of(id, reg.provider, mask); n < kCapacity;
         ++n, i = (i + 1) & mask) {
        RpcEntry* e = table_[i].load(std::memory_order_relaxed);
        if (e && (e->id != id || e->provider != reg.provider)) continue;
        if (e && e->live.load(std::memory_order_relaxed))
            return Error{Errc::already_exists,
                         e->name == name
                             ? fmt::format("RPC '{}' is already registered{}", name,
                                           provider_suffix(reg.provider))
                             : fmt::format("RPC '{}' has the id {:#010x} of the registered RPC "
                                           "'{}'{}; rename one of them",
                                           name, id, e->name, provider_suffix(reg.provider))};
        auto fresh = std::make_unique<RpcEntry>();
        fresh->id = id;
        fresh->provider = reg.provider;
        fresh->name = std::string(name);
        fresh->handler = std::move(h);
        fresh->signature = reg.signature;
        fresh->signature_text = reg.signature_text;
        table_[i].store(fresh.get(), std::memory_order_release);  // replaces a dead entry
        all_.push_back(std::move(fresh));
        return ok();
    }
    return Error{Errc::no_memory,
                 fmt::format("register '{}': the registry is full ({} RPCs)", name, kCapacity)};
}

Result<void> Registry::remove(RpcId id, uint16_t provider) {
    std::lock_guard g(mu_);
    RpcEntry* e = find(id, provider);
    if (!e)
        return Error{Errc::not_found, fmt::format("{} {:#010x} is registered{}", kNoRpcMessage, id,
                                                  provider_suffix(provider))};
    e->live.store(false, std::memory_order_release);
    return ok();
}

// --- Engine -----------------------------------------------------------------------------------

Result<std::unique_ptr<Engine>> Engine::open(std::string_view address, const Options& opts) {
    if (opts.contexts == 0 || opts.contexts > opts.na.max_contexts)
        return Error{Errc::invalid_argument,
                     fmt::format("Options::contexts must be 1..{} (na.max_contexts), not {}",
                                 opts.na.max_contexts, opts.contexts)};
    TALARIA_TRY(t, na::open(address, opts.na));
    na::Transport* raw = t.get();
    return open_on(std::move(t), *raw, opts);
}

Result<std::unique_ptr<Engine>> Engine::open(na::Transport& transport, const Options& opts) {
    if (opts.contexts == 0)
        return Error{Errc::invalid_argument, "Options::contexts must be at least 1, not 0"};
    if (transport.inherited())
        return Error{Errc::invalid_state,
                     fmt::format("{}: transport inherited across fork (opened by process {}); "
                                 "open one in this process",
                                 transport.name(), transport.opened_by())};
    return open_on(nullptr, transport, opts);
}

Result<std::unique_ptr<Engine>> Engine::open_on(std::unique_ptr<na::Transport> owned,
                                                na::Transport& transport, const Options& opts) {
    if (opts.max_inflight == 0 || opts.max_inflight > 32768)
        return Error{
            Errc::invalid_argument,
            fmt::format("Options::max_inflight must be 1..32768, not {}", opts.max_inflight)};
    if (opts.recv_depth == 0)
        return Error{Errc::invalid_argument, "Options::recv_depth must be at least 1"};
    if (opts.large_budget < opts.max_payload)
        return Error{Errc::invalid_argument,
                     fmt::format("Options::large_budget ({} bytes) must be at least "
                                 "Options::max_payload ({} bytes): a call that large could never "
                                 "be admitted",
                                 opts.large_budget, opts.max_payload)};
    if (opts.pull_timeout <= Duration::zero())
        return Error{Errc::invalid_argument, "Options::pull_timeout must be positive"};

    std::unique_ptr<Engine> e(new Engine);
    e->impl_ = std::make_unique<Impl>();
    Impl& im = *e->impl_;
    im.opts = opts;
    im.owned = std::move(owned);
    im.transport = &transport;
    std::size_t max = im.transport->max_unexpected_size();
    if (max <= wire::kHeaderSize + 64)
        return Error{Errc::not_supported,
                     fmt::format("{}: messages of {} bytes are too small for RPCs",
                                 im.transport->name(), max)};
    im.eager = max - wire::kHeaderSize;
    if (opts.eager_limit != 0 && opts.eager_limit < im.eager) im.eager = opts.eager_limit;
    im.self = im.transport->addr_self();
    im.self_string = im.transport->addr_to_string(im.self);

    for (uint8_t i = 0; i < opts.contexts; ++i) {
        TALARIA_TRY(nctx, im.transport->context_create(i));
        auto ci = std::make_unique<Context::Impl>(&im, std::move(nctx));
        Context::Impl* raw = ci.get();
        im.contexts.push_back(std::unique_ptr<Context>(new Context(e.get(), std::move(ci))));
        if (auto r = raw->start(opts.recv_depth, opts.max_inflight); !r) return r.error();
    }
    TALARIA_LOG(core, debug, "engine at {}: {} contexts, eager size {}", im.self_string,
                opts.contexts, im.eager);
    return e;
}

bool Engine::inherited() const noexcept {
    return impl_->transport && impl_->transport->inherited();  // none: open() failed
}

Error Engine::inherited_error(std::string_view what) const {
    return Error{Errc::invalid_state,
                 fmt::format("{}: engine inherited across fork (opened by process {}, used in "
                             "process {}); the child must open an engine of its own (it may "
                             "destroy this one, which leaves the parent's resources alone)",
                             what, impl_->transport->opened_by(), ::getpid())};
}

void Engine::shutdown() {
    if (!impl_ || impl_->shut || inherited()) return;
    impl_->shut = true;
    for (auto& c : impl_->contexts)
        c->impl_->begin_shutdown();
}

Engine::~Engine() {
    if (!impl_) return;
    if (inherited()) {
        // A child across fork(): the parent's progress threads are not here, its locks may be
        // held forever, and its sockets, rings and files are shared with the parent, so any
        // teardown (a cancel, a shutdown(), an unlink, a goodbye to a peer) would act on the
        // parent's resources. The child leaves everything allocated and open instead.
        (void)impl_.release();
        return;
    }
    Impl& im = *impl_;
    shutdown();
    // Drain: every operation posted on the transport completes (canceled) before the buffers
    // and contexts it refers to are freed.
    auto until = Clock::now() + 5s;
    for (;;) {
        bool all = true;
        for (auto& c : im.contexts) {
            (void)c->impl_->na->progress(Duration::zero());
            c->impl_->na->trigger();
            c->impl_->run_deferred();
            all = all && c->impl_->drained();
        }
        if (all) break;
        if (Clock::now() > until) {
            TALARIA_LOG(core, warn, "engine at {}: operations still pending after 5 s at close",
                        im.self_string);
            break;
        }
    }
    im.contexts.clear();
    im.self.reset();
}

na::Transport& Engine::transport() const noexcept {
    return *impl_->transport;
}
uint8_t Engine::context_count() const noexcept {
    return static_cast<uint8_t>(impl_->contexts.size());
}
Context& Engine::context(uint8_t i) const noexcept {
    return *impl_->contexts[i];
}

Result<void> Engine::register_rpc(RpcId id, std::string_view name, Handler handler,
                                  const Registration& reg) {
    if (inherited()) [[unlikely]]
        return inherited_error(fmt::format("register '{}'", name));
    return impl_->registry.add(id, name, std::move(handler), reg);
}
Result<void> Engine::deregister_rpc(RpcId id, uint16_t provider) {
    return impl_->registry.remove(id, provider);
}
std::string Engine::rpc_name(RpcId id, uint16_t provider) const {
    RpcEntry* e = impl_->registry.find(id, provider);
    return e ? e->name : std::string();
}

Result<na::Addr> Engine::lookup(std::string_view address) {
    if (inherited()) [[unlikely]]
        return inherited_error(fmt::format("lookup '{}'", address));
    return impl_->transport->addr_lookup(address);
}
na::Addr Engine::self() const {
    return impl_->self;
}
std::string Engine::self_string() const {
    return impl_->self_string;
}
std::size_t Engine::eager_size() const noexcept {
    return impl_->eager;
}
const Options& Engine::options() const noexcept {
    return impl_->opts;
}

Counters Engine::counters() const {
    Counters s;
    auto rd = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    for (auto& c : impl_->contexts) {
        const CtxCounters& k = c->impl_->counters;
        s.rpcs_sent += rd(k.rpcs_sent);
        s.rpcs_received += rd(k.rpcs_received);
        s.responses_sent += rd(k.responses_sent);
        s.responses_received += rd(k.responses_received);
        s.bytes_sent += rd(k.bytes_sent);
        s.bytes_received += rd(k.bytes_received);
        s.bulk_ops += rd(k.bulk_ops);
        s.bulk_bytes += rd(k.bulk_bytes);
        s.timeouts += rd(k.timeouts);
        s.canceled += rd(k.canceled);
        s.errors += rd(k.errors);
        s.busy_refused += rd(k.busy_refused);
        s.busy_retries += rd(k.busy_retries);
        s.held += c->impl_->held_requests.load(std::memory_order_relaxed);
        s.in_flight += c->in_flight();
    }
    s.bulk_ops += rd(impl_->bulk_ops);
    s.bulk_bytes += rd(impl_->bulk_bytes);
    s.errors += rd(impl_->bulk_errors);
    return s;
}

std::string Engine::counters_json() const {
    Counters c = counters();
    return fmt::format(
        R"({{"address":"{}","rpcs_sent":{},"rpcs_received":{},"responses_sent":{},)"
        R"("responses_received":{},"bytes_sent":{},"bytes_received":{},"bulk_ops":{},)"
        R"("bulk_bytes":{},"timeouts":{},"canceled":{},"errors":{},"in_flight":{},)"
        R"("busy_refused":{},"busy_retries":{},"held":{}}})",
        impl_->self_string, c.rpcs_sent, c.rpcs_received, c.responses_sent, c.responses_received,
        c.bytes_sent, c.bytes_received, c.bulk_ops, c.bulk_bytes, c.timeouts, c.canceled, c.errors,
        c.in_flight, c.busy_refused, c.busy_retries, c.held);
}

void Engine::note_bulk(uint64_t ops, uint64_t bytes, bool success) noexcept {
    impl_->bulk_ops.fetch_add(ops, std::memory_order_relaxed);
    if (success)
        impl_->bulk_bytes.fetch_add(bytes, std::memory_order_relaxed);
    else
        impl_->bulk_errors.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace talaria::core
