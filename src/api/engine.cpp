// The api Engine: owns the core engine, the bulk transfer context and the progress threads.
#include "talaria/api/engine.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "talaria/util/cpu.hpp"
#include "talaria/util/log.hpp"

namespace talaria {
namespace detail {

namespace {

// Block mode: how long a thread keeps polling after the last piece of work before it sleeps in
// the transport, and how long one sleep lasts at most (it is woken early by any completion,
// by Context::post, and by call deadlines).
constexpr Duration kSpinWindow = std::chrono::microseconds(50);
constexpr Duration kSleepSlice = std::chrono::milliseconds(100);
// Busy mode: a context with nothing to do for this long sleeps like a blocking one, so that the
// idle threads of a busy engine (the bulk context with no transfer, contexts with no traffic)
// leave the cores to the busy ones. Work keeps it polling.
constexpr Duration kBusyIdle = std::chrono::milliseconds(2);

}  // namespace

class ManualDriver;

/// Everything an Engine owns. Lives behind a pointer so Endpoint / Procedure / Request can
/// keep a stable pointer to it across moves of the Engine.
class EngineState {
  public:
    // Declared first, destroyed last: calls completing during shutdown still name theirs.
    /// Interned ProcInfo records: lock-free lookups by id in `slots` (open addressing, a few
    /// probes), inserts under `procs_mu` (remote() of a new name, not a call path).
    static constexpr std::size_t kProcSlots = 1024;  // power of two
    std::unique_ptr<std::atomic<const ProcInfo*>[]> proc_slots {
        new std::atomic<const ProcInfo*>[ kProcSlots ]()
    };
    std::mutex procs_mu;
    std::unordered_map<std::string, std::unique_ptr<ProcInfo>> procs;

    EngineOptions opts;
    std::unique_ptr<core::Engine> core;
    /// The context bulk transfers of this layer run on (na id = opts.contexts), and the
    /// transfers on it (destroyed first: it cancels and drains what is in flight).
    std::unique_ptr<na::Context> bulk_ctx;
    std::unique_ptr<bulk::Context> bulk;
    std::shared_ptr<ManualDriver> driver;  ///< manual mode only

    std::atomic<bool> stop{false};
    std::atomic<WaitMode> wait{WaitMode::block};  ///< opts.wait, changed by set_wait_mode()
    std::vector<std::thread> threads;             ///< one per core context, then one for bulk_ctx

    ~EngineState() { shutdown(); }

    void start_threads();
    void shutdown() noexcept;
};

class ManualDriver final : public Driver {
  public:
    explicit ManualDriver(EngineState* e) noexcept : e_(e) {}
    void drive(uint8_t ctx, Duration d) override {
        if (ctx == kBulkContext) {
            (void)e_->bulk_ctx->progress(d);
            e_->bulk_ctx->trigger();
        } else {
            auto& c = e_->core->context(ctx);
            (void)c.progress(d);
            c.trigger();
        }
    }

  private:
    EngineState* e_;
};

namespace {

/// The loop of a background thread: progress + trigger until stop, polling while work keeps
/// coming, sleeping in the transport once idle for the mode's window (block: kSpinWindow,
/// busy: kBusyIdle). No sched_yield: an idle thread sleeps instead of competing for a core.
template <class Ctx>
void run_progress(Ctx& ctx, const std::atomic<bool>& stop, const std::atomic<WaitMode>& wait) {
    TimePoint last_work = Clock::now();
    while (!stop.load(std::memory_order_acquire)) {
        bool got = ctx.progress(Duration(0)).has_value();
        unsigned n = ctx.trigger();
        if (got || n > 0) {
            last_work = Clock::now();
            continue;
        }
        cpu_relax();
        Duration window =
            wait.load(std::memory_order_relaxed) == WaitMode::busy ? kBusyIdle : kSpinWindow;
        if (Clock::now() - last_work < window) continue;
        // Idle: sleep until woken. A sleep that ends with nothing to do goes straight back to
        // sleep (after one poll), rather than spinning through another window.
        bool woke = ctx.progress(kSleepSlice).has_value();
        if (ctx.trigger() > 0 || woke) last_work = Clock::now();
    }
}

}  // namespace

void EngineState::start_threads() {
    for (uint8_t i = 0; i < core->context_count(); ++i)
        threads.emplace_back([this, i] { run_progress(core->context(i), stop, wait); });
    threads.emplace_back([this] { run_progress(*bulk_ctx, stop, wait); });
}

void EngineState::shutdown() noexcept {
    if (!core) return;
    stop.store(true, std::memory_order_release);
    // Wake sleeping threads. The RPC contexts go first: a handler blocked on a transfer needs
    // the bulk thread to finish it.
    for (uint8_t i = 0; i < core->context_count(); ++i)
        (void)core->context(i).na_context().post([](const na::Completion&) {});
    for (std::size_t i = 0; i + 1 < threads.size(); ++i)
        threads[i].join();
    if (bulk_ctx) (void)bulk_ctx->post([](const na::Completion&) {});
    if (!threads.empty()) threads.back().join();
    threads.clear();
    // Run what the wake-ups left queued (a thread may have stopped before its wake-up arrived).
    for (uint8_t i = 0; i < core->context_count(); ++i)
        core->context(i).trigger();
    // Fail the calls still in flight while the engine is whole: their continuations may call
    // it again (they get shutdown) or start transfers (canceled below).
    core->shutdown();

    // Cancels the transfers still in flight and drives bulk_ctx until they have completed.
    bulk.reset();
    if (bulk_ctx) {
        bulk_ctx->trigger();
        bulk_ctx.reset();
    }
    driver.reset();
    // Fails every call still in flight with shutdown (their futures complete here).
    core.reset();
}

core::Engine& core_engine(EngineState& e) noexcept {
    return *e.core;
}

std::weak_ptr<Driver> manual_driver(EngineState& e) noexcept {
    if (!e.driver) return {};
    return std::weak_ptr<Driver>(std::static_pointer_cast<Driver>(e.driver));
}

const ProcInfo* proc_info(EngineState& e, std::string_view name) {
    constexpr std::size_t kProbes = 8;
    const core::RpcId id = core::rpc_id(name);
    const std::size_t mask = EngineState::kProcSlots - 1;
    for (std::size_t i = 0; i < kProbes; ++i) {
        const ProcInfo* p = e.proc_slots[(id + i) & mask].load(std::memory_order_acquire);
        if (!p) break;
        if (p->id == id && p->name == name) return p;
    }
    std::lock_guard g(e.procs_mu);
    auto& rec = e.procs[std::string(name)];
    if (rec) return rec.get();  // in the table but not in the probed slots (they were full)
    rec = std::make_unique<ProcInfo>(ProcInfo{std::string(name), id});
    for (std::size_t i = 0; i < kProbes; ++i) {
        auto& slot = e.proc_slots[(id + i) & mask];
        if (!slot.load(std::memory_order_relaxed)) {
            slot.store(rec.get(), std::memory_order_release);  // inserts are under procs_mu
            break;
        }
    }
    return rec.get();
}

Duration default_timeout(EngineState& e) noexcept {
    return e.opts.default_timeout;
}

std::vector<std::byte>& scratch_buffer() noexcept {
    thread_local std::vector<std::byte> buf;
    return buf;
}

Future<void> start_transfer(EngineState& e, bulk::Direction dir, const na::Addr& peer,
                            const Bulk& remote, std::size_t remote_off, const Bulk& local,
                            std::size_t local_off, std::size_t len) {
    const char* what = dir == bulk::Direction::pull ? "pull" : "push";
    if (!e.bulk)
        return Future<void>::ready_with(
            Error(Errc::shutdown, fmt::format("bulk {}: the engine is shutting down", what)));
    if (!peer.valid())
        return Future<void>::ready_with(Error(
            Errc::invalid_argument,
            fmt::format("bulk {}: no peer (the remote handle names no owner; pass an endpoint)",
                        what)));
    auto st = std::make_shared<State<void>>();
    if (e.driver) st->set_driver(manual_driver(e), kBulkContext);
    Future<void> fut(st);
    auto id = e.bulk->transfer(dir, peer, remote, remote_off, local, local_off, len,
                               [es = &e, s = std::move(st), len](Result<void>&& r) {
                                   es->core->note_bulk(1, r ? len : 0, r.has_value());
                                   s->set(std::move(r));
                               });
    if (!id) return Future<void>::ready_with(std::move(id).error());
    return fut;
}

Error call_error(std::string_view name, core::RpcId id, const na::Addr& peer, Error e) {
    std::string where =
        peer.valid() ? peer.impl()->transport()->addr_to_string(peer) : std::string("?");
    std::string detail = e.message().empty() ? std::string() : ": " + e.message();
    switch (e.code()) {
        case Errc::not_found:
            return Error(Errc::not_found, fmt::format("no procedure '{}' (id {:#010x}) at {}{}",
                                                      name, id, where, detail));
        case Errc::timeout:
            return Error(Errc::timeout,
                         fmt::format("rpc '{}' to {} timed out{}", name, where, detail));
        default:
            return Error(e.code(), fmt::format("rpc '{}' to {}{}", name, where, detail));
    }
}

Result<void> register_handler(EngineState& e, std::string_view name, core::Handler h) {
    auto r = e.core->register_rpc(core::rpc_id(name), name, std::move(h));
    if (!r && r.code() == Errc::already_exists) {
        std::string other = e.core->rpc_name(core::rpc_id(name));
        return Error(Errc::already_exists,
                     other == name
                         ? fmt::format("procedure '{}' is already defined", name)
                         : fmt::format("procedure '{}' has the same id as '{}'", name, other));
    }
    return r;
}

void respond_decode_error(core::Request& req, const HandlerInfo& info, const Error& e) noexcept {
    TALARIA_LOG(api, debug, "rpc '{}': arguments do not decode: {}", info.name, e.describe());
    if (req.one_way()) return;
    (void)req.respond_error(Errc::protocol_error,
                            fmt::format("rpc '{}': the arguments do not decode as {}: {}",
                                        info.name, info.signature, e.describe()));
}

void respond_current_exception(Request& req, const HandlerInfo& info) noexcept {
    Errc code = Errc::internal;
    std::string msg;
    try {
        throw;
    } catch (const Exception& ex) {
        code = ex.code();
        msg = ex.what();
    } catch (const std::exception& ex) {
        msg = fmt::format("handler '{}' threw: {}", info.name, ex.what());
    } catch (...) {
        msg = fmt::format("handler '{}' threw a non-standard exception", info.name);
    }
    TALARIA_LOG(api, debug, "{}", msg);
    // A handler that moved its Request out (async) no longer holds it: whoever does answers,
    // or its destructor answers internal.
    if (!req.valid() || req.one_way() || req.responded()) return;
    (void)req.try_respond_error(code, msg);
}

}  // namespace detail

// --- Engine ------------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<detail::EngineState> s) noexcept : state_(std::move(s)) {}

Engine::Engine(std::string_view address, EngineOptions opts)
    : Engine(detail::value_or_throw(open(address, false, std::move(opts)))) {}

Engine::Engine(std::string_view address, Listen, EngineOptions opts)
    : Engine(detail::value_or_throw(open(address, true, std::move(opts)))) {}

Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

Result<Engine> Engine::open(std::string_view address, bool accept, EngineOptions opts) {
    if (opts.contexts == 0)
        return Error(Errc::invalid_argument, "EngineOptions::contexts must be at least 1");
    core::Options co = opts.core;
    co.contexts = opts.contexts;
    co.checksum = opts.checksum;
    co.na.listen = accept;
    // One more na context than the core uses: the bulk transfer context.
    if (co.na.max_contexts <= opts.contexts) {
        if (opts.contexts == UINT8_MAX)
            return Error(Errc::invalid_argument, "EngineOptions::contexts: at most 254");
        co.na.max_contexts = static_cast<uint8_t>(opts.contexts + 1);
    }
    auto st = std::make_unique<detail::EngineState>();
    st->opts = opts;
    st->wait.store(opts.wait, std::memory_order_relaxed);
    TALARIA_TRY(ce, core::Engine::open(address, co));
    st->core = std::move(ce);
    // The bulk context takes no calls: one aimed at its id is answered like one aimed at a
    // context that does not exist (not_found), by the lowest RPC context.
    na::ContextOptions bco;
    bco.unexpected = false;
    TALARIA_TRY(bc, st->core->transport().context_create(opts.contexts, bco));
    st->bulk_ctx = std::move(bc);
    st->bulk = std::make_unique<bulk::Context>(*st->bulk_ctx);
    if (opts.progress == ProgressMode::manual)
        st->driver = std::make_shared<detail::ManualDriver>(st.get());
    else
        st->start_threads();
    TALARIA_LOG(api, debug, "engine {} open ({} contexts, {} progress)", st->core->self_string(),
                opts.contexts, opts.progress == ProgressMode::manual ? "manual" : "background");
    return Engine(std::move(st));
}

std::string Engine::self_address() const {
    return state_->core->self_string();
}

Endpoint Engine::self() const {
    return Endpoint(state_.get(), state_->core->self());
}

Result<Endpoint> Engine::try_lookup(std::string_view address) {
    TALARIA_TRY(a, state_->core->lookup(address));
    return Endpoint(state_.get(), std::move(a));
}

Endpoint Engine::lookup(std::string_view address) {
    return detail::value_or_throw(try_lookup(address));
}

Result<void> Engine::try_undefine(std::string_view name) {
    return state_->core->deregister_rpc(core::rpc_id(name));
}

Result<Bulk> Engine::try_expose(Segment segment, Access access) {
    return bulk::Handle::create(state_->core->transport(), std::span<const Segment>(&segment, 1),
                                access);
}

Result<Bulk> Engine::try_expose(const std::vector<Segment>& segments, Access access) {
    return bulk::Handle::create(state_->core->transport(), segments, access);
}

Bulk Engine::expose(Segment segment, Access access) {
    return detail::value_or_throw(try_expose(segment, access));
}

Bulk Engine::expose(const std::vector<Segment>& segments, Access access) {
    return detail::value_or_throw(try_expose(segments, access));
}

Future<void> Engine::pull(const Bulk& remote, std::size_t remote_off, const Bulk& local,
                          std::size_t local_off, std::size_t len, const Endpoint& peer) {
    return detail::start_transfer(*state_, bulk::Direction::pull,
                                  peer.valid() ? peer.addr() : remote.owner(), remote, remote_off,
                                  local, local_off, len);
}

Future<void> Engine::push(const Bulk& remote, std::size_t remote_off, const Bulk& local,
                          std::size_t local_off, std::size_t len, const Endpoint& peer) {
    return detail::start_transfer(*state_, bulk::Direction::push,
                                  peer.valid() ? peer.addr() : remote.owner(), remote, remote_off,
                                  local, local_off, len);
}

bool Engine::progress(Duration timeout, uint8_t ctx) {
    if (ctx >= context_count()) return false;
    return state_->core->context(ctx).progress(timeout).has_value();
}

unsigned Engine::trigger(uint8_t ctx) {
    if (ctx >= context_count()) return 0;
    return state_->core->context(ctx).trigger();
}

unsigned Engine::poll() {
    unsigned n = 0;
    for (uint8_t i = 0; i < context_count(); ++i) {
        (void)state_->core->context(i).progress(Duration(0));
        n += state_->core->context(i).trigger();
    }
    (void)state_->bulk_ctx->progress(Duration(0));
    n += state_->bulk_ctx->trigger();
    return n;
}

core::Counters Engine::counters() const {
    return state_->core->counters();
}

std::string Engine::counters_json() const {
    return state_->core->counters_json();
}

uint8_t Engine::context_count() const noexcept {
    return state_->core->context_count();
}

void Engine::set_wait_mode(WaitMode w) noexcept {
    state_->wait.store(w, std::memory_order_relaxed);
}

WaitMode Engine::wait_mode() const noexcept {
    return state_->wait.load(std::memory_order_relaxed);
}

const EngineOptions& Engine::options() const noexcept {
    return state_->opts;
}

core::Engine& Engine::core() const noexcept {
    return *state_->core;
}

}  // namespace talaria
