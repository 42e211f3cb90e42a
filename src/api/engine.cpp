// The api Engine: owns the core engine, the bulk transfer context and the progress threads.
#include "talaria/api/engine.hpp"
#include "talaria/api/config.hpp"
#include "talaria/api/provider.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "api/introspection.hpp"
#include "api/state_access.hpp"
#include "talaria/util/cpu.hpp"
#include "talaria/util/log.hpp"
#include "talaria/version.hpp"

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

/// Whether a driving loop (run_progress, Seat::drive_until) has found nothing for its mode's
/// window, the clock read only once a step finds nothing (none per productive step).
class IdleWindow {
  public:
    void worked() noexcept { idle_ = false; }
    /// After a step that found nothing: true once nothing was done for the mode's window;
    /// `now` gets the time read.
    bool passed(WaitMode m, TimePoint& now) noexcept {
        now = Clock::now();
        if (!idle_) {
            idle_ = true;
            since_ = now;
        }
        return now - since_ >= (m == WaitMode::busy ? kBusyIdle : kSpinWindow);
    }

  private:
    bool idle_ = false;
    TimePoint since_{};
};

}  // namespace

class ManualDriver;

/// A background context's seat: who drives the context (progress + trigger) right now, its
/// progress thread or a thread waiting in Future::get() on a call of that context. One per
/// context (the bulk context included), shared with the futures of its calls (weakly).
///
/// A waiting thread announces itself (a count in `word_`), taking the seat in the same step
/// when it is free; the progress thread, which keeps the seat across its iterations, sees the
/// count before its next one, gives the seat up and parks; the waiter takes the seat (kHeld)
/// and drives the context until its result is there, so the result needs no hand-off between
/// threads, and where threads outnumber cores the progress thread does not compete with the
/// caller. A parked progress thread looks again after kParkCheck (busy) or kParkCheckBlock on
/// its own, doubling while waiters keep coming (up to kParkCheckMax), and resumes after a
/// whole check with no waiter and no arrival, so that a caller calling get() in a loop pays no
/// wake-up system call per call.
class Seat final : public Driver {
  public:
    static constexpr uint32_t kWaiters = 0xFFFF;    ///< the count of waiting threads
    static constexpr uint32_t kHeld = 1u << 16;     ///< someone drives the context now
    static constexpr uint32_t kParked = 1u << 17;   ///< the progress thread is parked
    static constexpr uint32_t kStop = 1u << 18;     ///< the engine shuts down: nobody drives
    static constexpr uint32_t kNapping = 1u << 19;  ///< the holder sleeps in the transport
    /// A wrapping count of waiters' arrivals (bits 21..31): a parked thread resumes only after
    /// a whole check with no waiter and no arrival, not in the gap between two get() calls.
    static constexpr int kArrivalShift = 21;
    static constexpr uint32_t kArrival = 1u << kArrivalShift;
    /// Busy mode: how often a parked progress thread looks whether the waiters are gone.
    static constexpr Duration kParkCheck = std::chrono::microseconds(100);
    /// The same in block mode (fewer wake-ups of a parked thread while a get() waits long).
    static constexpr Duration kParkCheckBlock = std::chrono::microseconds(250);
    /// While waiters keep coming, each look doubles the next, up to this: a loop of get()
    /// calls then wakes the parked thread about a thousand times a second, not ten thousand
    /// (each wake-up takes a core from a caller or a peer where every core is busy), and the
    /// thread resumes within two of these after the last get().
    static constexpr Duration kParkCheckMax = std::chrono::milliseconds(1);
    /// How long a waiter polls for the seat before it sleeps in slices: the progress thread
    /// gives it up before its next iteration (a microsecond or so).
    static constexpr Duration kHoldSpin = std::chrono::microseconds(20);

    Seat(core::Context* c, na::Context* n, WaitMode mode) noexcept
        : core_(c), na_(c ? &c->na_context() : n), mode_(mode) {}

    void drive(uint8_t, Duration) override {}  // background contexts are never driven by slot
    bool wait_ready(StateBase& s, TimePoint deadline) override;
    /// Counted as a waiter while it cancels, so that shutdown (which waits for the waiters to
    /// leave before it fails the calls and frees the context) cannot free the context under it.
    bool cancel_call(uint8_t, uint32_t seq) override {
        if (!core_) return false;  // the bulk context's seat: transfers are not calls
        uint32_t w = word_.load(std::memory_order_relaxed);
        do {
            if (w & kStop) return false;  // shutting down: it fails the call itself
        } while (!word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                              std::memory_order_relaxed));
        bool canceled = core_->cancel(core::CallId{seq}).has_value();
        word_.fetch_sub(1, std::memory_order_release);
        return canceled;
    }
    [[nodiscard]] Result<void> usable() const override {
        if (na_->transport().inherited()) [[unlikely]] {
            if (core_) return core_->engine().inherited_error("wait for a result");
            return Error(Errc::invalid_state,
                         "wait for a transfer: engine inherited across fork; the child must "
                         "open an engine of its own");
        }
        return ok();
    }

    /// One progress + trigger of the context: true if it did something.
    bool step(Duration d) {
        if (core_) {
            bool got = core_->progress(d).has_value();
            return core_->trigger() > 0 || got;
        }
        bool got = na_->progress(d).has_value();
        return na_->trigger() > 0 || got;
    }
    /// Sleep in the transport for at most `d` (woken by completions and posts), marked so
    /// that a waiter wakes the sleeper instead of waiting for the sleep to end.
    bool nap(Duration d) {
        word_.fetch_or(kNapping);
        bool got = step(d);
        word_.fetch_and(~kNapping);
        return got;
    }
    bool try_hold() noexcept { return !(word_.fetch_or(kHeld) & kHeld); }
    void release() noexcept { word_.fetch_and(~kHeld, std::memory_order_release); }
    [[nodiscard]] bool waiters() const noexcept {
        return (word_.load(std::memory_order_acquire) & kWaiters) != 0;
    }
    [[nodiscard]] bool stopping() const noexcept { return (word_.load() & kStop) != 0; }
    /// The progress thread: sleep while waiters drive the context (or until stop).
    void park();
    /// Stop: no waiter takes the seat any more (they wait for the engine to fail their
    /// calls), and a parked progress thread wakes.
    void begin_stop() noexcept;
    /// After begin_stop and the progress thread's join: returns once no waiter holds the seat
    /// (each leaves at its next step), so that the context may be driven or destroyed.
    void wait_unheld() const noexcept;
    /// The seats the calling thread drives now (its progress thread's, and those it took over
    /// while waiting, nested), to refuse taking over a context from itself.
    struct Held {
        static constexpr int kMax = 8;
        Seat* seats[kMax] = {};
        int n = 0;
        [[nodiscard]] bool has(const Seat* s) const noexcept {
            for (int i = 0; i < n; ++i)
                if (seats[i] == s) return true;
            return false;
        }
        /// Only below kMax (a waiter nested deeper waits instead of driving).
        void push(Seat* s) noexcept { seats[n++] = s; }
        void pop() noexcept { --n; }
    };
    static thread_local Held tl_held;
    /// Switch modes; a parked progress thread looks again at once (it parked for the old one).
    void set_mode(WaitMode m) noexcept {
        mode_.store(m, std::memory_order_relaxed);
        wake_parked();
    }
    [[nodiscard]] WaitMode mode() const noexcept { return mode_.load(std::memory_order_relaxed); }

  private:
    /// Drive the context on the waiting thread (holding the seat) until `s` is ready, the
    /// deadline passes or the engine stops; true if ready.
    bool drive_until(StateBase& s, TimePoint deadline);
    /// Wake the parked progress thread (it looks at word_ and the mode again).
    void wake_parked() noexcept;

    core::Context* core_;
    na::Context* na_;  ///< the na context below core_, or the bulk context (core_ null)
    std::atomic<WaitMode> mode_;
    alignas(64) std::atomic<uint32_t> word_{0};
    /// What the parked progress thread sleeps on: bumped (and woken) by stop and set_mode only.
    std::atomic<uint32_t> park_gen_{0};
};

/// Everything an Engine owns. Lives behind a pointer so Endpoint / Procedure / Request can
/// keep a stable pointer to it across moves of the Engine.
struct TransferWatch;

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
    /// Rate limit of the warnings handler exceptions write (respond_current_exception).
    log::Limiter handler_errors_log;
    const TimePoint opened = Clock::now();  ///< health_json's uptime
    bool listens = false;                   ///< opened to accept connections
    std::string secret_file;  ///< where opts' secret came from, if known (config_json)
    std::unique_ptr<core::Engine> core;
    /// The context bulk transfers of this layer run on (na id = opts.contexts), and the
    /// transfers on it (destroyed first: it cancels and drains what is in flight).
    std::unique_ptr<na::Context> bulk_ctx;
    std::unique_ptr<bulk::Context> bulk;
    /// Opened over a transport that had no context id free for bulk_ctx (Engine::open over a
    /// borrowed transport): why pull and push answer not_supported. Empty otherwise.
    std::string no_bulk;
    /// The transfers handlers started for their calls (Request::pull/push), looked at by one
    /// timer of bulk_ctx every kWatchPeriod while any is listed (watch_transfer()). Under
    /// watch_mu: a handler thread adds, the bulk context's thread scans.
    std::mutex watch_mu;
    std::vector<std::shared_ptr<TransferWatch>> watches;
    bool watch_armed = false;              ///< the periodic scan is posted
    std::shared_ptr<ManualDriver> driver;  ///< manual mode only
    /// Background mode: the seat of each core context, then of the bulk context.
    std::vector<std::shared_ptr<Seat>> seats;

    std::atomic<bool> stop{false};
    std::atomic<WaitMode> wait{WaitMode::block};  ///< opts.wait, changed by set_wait_mode()

    // Lifecycle (Engine::shutdown, wait_for_shutdown, on_shutdown): on no call path.
    mutable std::mutex life_mu;
    std::condition_variable life_cv;
    bool shutdown_asked = false;                     ///< under life_mu
    std::vector<std::function<void()>> on_shutdown;  ///< under life_mu; run once, last first
    void request_shutdown() {
        {
            std::lock_guard g(life_mu);
            shutdown_asked = true;
        }
        life_cv.notify_all();
    }
    /// Run the shutdown callbacks not run yet, last added first; one that throws is logged.
    void run_on_shutdown() noexcept {
        std::vector<std::function<void()>> fns;
        {
            std::lock_guard g(life_mu);
            fns.swap(on_shutdown);
        }
        for (auto it = fns.rbegin(); it != fns.rend(); ++it) {
            try {
                (*it)();
            } catch (const std::exception& e) {
                TALARIA_LOG(api, error, "a shutdown callback threw: {}", e.what());
            } catch (...) {
                TALARIA_LOG(api, error, "a shutdown callback threw a non-standard exception");
            }
        }
    }
    std::vector<std::thread> threads;  ///< one per core context, then one for bulk_ctx
    /// write_stats_every / serve_prometheus (made on first use, under life_mu): stopped before
    /// the engine's own shutdown, the file written a last time.
    std::unique_ptr<StatsExporter> exporter;

    /// Engine::handler_pool(), made on first use (under pool_mu). Stopped (its queued handlers
    /// run, while the engine still works) before the engine stops; the object stays until the
    /// progress threads that post to it are gone.
    std::mutex pool_mu;
    std::unique_ptr<ThreadPool> pool;
    /// Calls queued on or running on an executor (QueuedCount): the destructor waits for them.
    std::atomic<int> queued_calls{0};
    void wait_queued_calls() noexcept {
        const TimePoint start = Clock::now();
        TimePoint next_note = start + std::chrono::seconds(5);
        while (queued_calls.load(std::memory_order_acquire) != 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            if (Clock::now() >= next_note) {
                next_note += std::chrono::seconds(5);
                TALARIA_LOG(api, warn,
                            "closing the engine waits for {} calls still queued or running on "
                            "an executor (it must run or drop them; it was given to "
                            "Engine::define)",
                            queued_calls.load(std::memory_order_relaxed));
            }
        }
    }

    ~EngineState() {
        if (core && core->inherited()) {
            (void)exporter.release();  // its threads are the parent's: nothing to join here
            abandon();                 // the parent's callbacks are not the child's to run
        } else {
            run_on_shutdown();  // nobody waited in wait_for_shutdown(): they run here
            {
                // The statistics' last word, the engine whole; nothing starts again after it.
                std::lock_guard g(life_mu);
                if (exporter) exporter->stop();
            }
            {
                std::lock_guard g(pool_mu);
                if (pool) pool->stop();
            }
            wait_queued_calls();  // on executors of the application's own
            shutdown();
        }
    }

    void start_threads();
    /// In a child across fork(): leave everything as it is (core::Engine::inherited). The
    /// progress threads do not exist here (their std::thread objects are kept, never joined),
    /// and the engine, its transfers and its transport are not torn down.
    void shutdown() noexcept;
    void abandon() noexcept {
        (void)new (std::nothrow) std::vector<std::thread>(std::move(threads));
        (void)pool.release();  // its threads are the parent's too
        (void)bulk.release();
        (void)bulk_ctx.release();
        (void)core.release();
    }
};

class ManualDriver final : public Driver {
  public:
    explicit ManualDriver(EngineState* e) noexcept : e_(e) {}
    void drive(uint8_t ctx, Duration d) override {
        if (ctx == kBulkContext) {
            if (!e_->bulk_ctx) return;
            (void)e_->bulk_ctx->progress(d);
            e_->bulk_ctx->trigger();
        } else if (e_->opts.drive) {
            e_->opts.drive(ctx, d);  // the program's loop progresses this context too
        } else {
            auto& c = e_->core->context(ctx);
            (void)c.progress(d);
            c.trigger();
        }
    }
    bool wait_ready(StateBase& s, TimePoint deadline) override { return s.wait_until(deadline); }
    [[nodiscard]] Result<void> usable() const override {
        if (e_->core && e_->core->inherited()) [[unlikely]]
            return e_->core->inherited_error("wait for a result");
        return ok();
    }
    /// Under mu_, which shutdown takes (close) before it fails the calls and frees the engine.
    bool cancel_call(uint8_t ctx, uint32_t seq) override {
        std::lock_guard g(mu_);
        if (closed_ || !e_->core || ctx >= e_->core->context_count()) return false;
        return e_->core->context(ctx).cancel(core::CallId{seq}).has_value();
    }
    void close() noexcept {
        std::lock_guard g(mu_);
        closed_ = true;
    }

  private:
    EngineState* e_;
    std::mutex mu_;
    bool closed_ = false;
};

namespace {

/// The loop of a background thread: progress + trigger until stop, polling while work keeps
/// coming, sleeping in the transport once idle for the mode's window (block: kSpinWindow,
/// busy: kBusyIdle). No sched_yield: an idle thread sleeps instead of competing for a core.
/// While threads waiting in get() drive the context (Seat), the thread parks.
void run_progress(Seat& seat, const std::atomic<bool>& stop) {
    Seat::tl_held.push(&seat);
    // The seat is kept across iterations (no read-modify-write per step) and given up only
    // to a waiter, and the clock is read only while idle (none per productive step).
    bool held = false;
    IdleWindow idle;
    while (!stop.load(std::memory_order_acquire)) {
        if (seat.waiters()) {
            if (held) seat.release();
            held = false;
            seat.park();
            idle.worked();
            continue;
        }
        if (!held) {
            if (!seat.try_hold()) {  // a waiter took it just now: it parks us next time round
                cpu_relax();
                continue;
            }
            held = true;
        }
        if (seat.step(Duration(0))) {
            idle.worked();
            continue;
        }
        cpu_relax();
        TimePoint now;
        if (!idle.passed(seat.mode(), now)) continue;
        // Idle: sleep until woken. A sleep that ends with nothing to do goes straight back to
        // sleep (after one poll), rather than spinning through another window.
        if (seat.nap(kSleepSlice)) idle.worked();
    }
    if (held) seat.release();
}

}  // namespace

void Seat::park() {
    // Look again every kParkCheck (busy) or kParkCheckBlock: no waiter makes a wake-up call
    // when it leaves, so a loop of get() calls pays no system call per call for the parked
    // thread, and the thread resumes after a whole check with no waiter and no arrival. It
    // sleeps on its own word (park_gen_), not on word_: word_ changes with every get(), and a
    // futex wait on it would return at once and spin, taking a core from the callers.
    uint32_t w = word_.fetch_or(kParked) | kParked;
    uint32_t seen = w >> kArrivalShift;
    WaitMode m = mode();
    Duration check = m == WaitMode::busy ? kParkCheck : kParkCheckBlock;
    TimePoint quiet_since = Clock::now();
    while (!(w & kStop)) {
        // The mode is read again on every pass (set_mode wakes us to do so).
        if (WaitMode now_mode = mode(); now_mode != m) {
            m = now_mode;
            check = m == WaitMode::busy ? kParkCheck : kParkCheckBlock;
        }
        const TimePoint now = Clock::now();
        if ((w & kWaiters) || (w >> kArrivalShift) != seen) {
            if (now - quiet_since >= check) check = std::min<Duration>(check * 2, kParkCheckMax);
            seen = w >> kArrivalShift;
            quiet_since = now;
        } else if (now - quiet_since >= check) {
            break;
        }
        const uint32_t gen = park_gen_.load(std::memory_order_acquire);
        if (word_.load() & kStop) break;  // begin_stop bumps park_gen_ after setting kStop
        futex_wait(park_gen_, gen, now + check);
        w = word_.load();
    }
    word_.fetch_and(~kParked);
}

void Seat::wake_parked() noexcept {
    park_gen_.fetch_add(1, std::memory_order_release);
    futex_wake_all(park_gen_);
}

thread_local Seat::Held Seat::tl_held;

void Seat::begin_stop() noexcept {
    word_.fetch_or(kStop);
    wake_parked();
}

void Seat::wait_unheld() const noexcept {
    // A waiter that holds the seat leaves it at its next step (it checks kStop before each;
    // one sleeping in the transport is woken by the engine's posted no-ops); one that waits
    // for the seat sees kStop within a 50 us slice. Waiting for the count too means no waiter
    // is left that could still post to the context.
    while (word_.load() & (kHeld | kWaiters))
        std::this_thread::yield();
}

bool Seat::drive_until(StateBase& s, TimePoint deadline) {
    IdleWindow idle;
    while (!s.ready()) {
        if (stopping()) return s.ready();
        // One step before the deadline is looked at: a short wait still drives the context.
        if (step(Duration(0))) {
            idle.worked();
            continue;
        }
        if (deadline_passed(deadline)) return s.ready();
        cpu_relax();
        TimePoint now;
        if (!idle.passed(mode(), now)) continue;
        // Nothing for a while: sleep in the transport (a completion ends the sleep).
        Duration d = kSleepSlice;
        if (deadline != TimePoint::max()) d = std::min<Duration>(d, deadline - now);
        if (nap(std::max<Duration>(d, Duration(0)))) idle.worked();
    }
    return true;
}

bool Seat::wait_ready(StateBase& s, TimePoint deadline) {
    // This thread drives this context already (a handler or continuation waiting on a call
    // of its own context): it cannot step in for itself; it waits as before.
    if (tl_held.has(this)) {
        // Only this thread could complete the call (nobody else may drive the context, and
        // its deadline fires from this context's own trigger): it waits until someone else
        // completes it, if anyone does.
        TALARIA_LOG(api, warn,
                    "get() on a call of the context this thread drives (a handler or "
                    "continuation of that context) cannot complete: call .from() another "
                    "context, or use then()/co_await");
        return s.sleep_until(deadline);
    }
    if (tl_held.n == Held::kMax) return s.sleep_until(deadline);
    // A poll (wait_for(0)) must not announce itself: the progress thread would park for a
    // whole check with nobody driving.
    if (deadline_passed(deadline)) return s.ready();
    // Arrive, and take the seat in the same step where nobody holds it (one read-modify-write
    // for both; the progress thread sees the count and parks).
    uint32_t w = word_.load(std::memory_order_relaxed);
    uint32_t add;
    do {
        add = 1 + kArrival + ((w & (kHeld | kStop)) ? 0 : kHeld);
    } while (!word_.compare_exchange_weak(w, w + add, std::memory_order_acq_rel,
                                          std::memory_order_relaxed));
    bool held = (add & kHeld) != 0;
    bool done = false;
    bool woke_napper = false;
    TimePoint spin_end{};  // read once the seat is found taken
    while (!(w & kStop)) {
        if (s.ready()) {
            done = true;
            break;
        }
        if (deadline_passed(deadline)) break;
        if (held || try_hold()) {
            held = true;
            tl_held.push(this);
            done = drive_until(s, deadline);
            tl_held.pop();
            if (done) break;  // leave and release at once, below
            release();
            held = false;
            if (stopping() || deadline_passed(deadline)) break;
            continue;
        }
        // Another thread drives: the progress thread (it parks after its iteration; woken at
        // once if it sleeps in the transport) or another waiter (its progress completes ours
        // too; we look for the seat again every 50 us in case it leaves first).
        w = word_.load();
        if (w & kStop) break;
        if ((w & kNapping) && !woke_napper) {
            woke_napper = true;
            (void)na_->post([](const na::Completion&) {});
        }
        const TimePoint now = Clock::now();
        if (spin_end == TimePoint{}) spin_end = now + kHoldSpin;
        if (now < spin_end) {
            cpu_relax();
            continue;
        }
        TimePoint until = now + std::chrono::microseconds(50);
        s.sleep_once(deadline < until ? deadline : until);
    }
    word_.fetch_sub(held ? 1 + kHeld : 1, std::memory_order_release);
    if (done) return true;
    // Stopping (the engine fails its calls) or the deadline passed.
    return s.ready() || (stopping() && s.sleep_until(deadline));
}

void EngineState::start_threads() {
    for (uint8_t i = 0; i < core->context_count(); ++i)
        seats.push_back(std::make_shared<Seat>(&core->context(i), nullptr, opts.wait));
    if (bulk_ctx) seats.push_back(std::make_shared<Seat>(nullptr, bulk_ctx.get(), opts.wait));
    for (auto& seat : seats)
        threads.emplace_back([this, st = seat.get()] { run_progress(*st, stop); });
}

void EngineState::shutdown() noexcept {
    if (!core) return;
    stop.store(true, std::memory_order_release);
    // Wake sleeping threads. The RPC contexts go first: a handler blocked on a transfer needs
    // the bulk context driven to finish it (by the bulk thread, or by the handler's own thread
    // through the bulk seat, which stays open until the RPC threads are joined).
    const std::size_t rpc = core->context_count();
    for (std::size_t i = 0; i < rpc && i < seats.size(); ++i)
        seats[i]->begin_stop();
    for (uint8_t i = 0; i < core->context_count(); ++i)
        (void)core->context(i).na_context().post([](const na::Completion&) {});
    // The RPC contexts' threads, then (if there is one) the bulk context's, the last.
    const std::size_t rpc_threads = threads.size() - (bulk_ctx && !threads.empty() ? 1 : 0);
    for (std::size_t i = 0; i < rpc_threads; ++i)
        threads[i].join();
    for (std::size_t i = 0; i < rpc && i < seats.size(); ++i)
        seats[i]->wait_unheld();
    // Handlers posted to an executor by the progress threads' last rounds (the bulk context
    // still runs: they may be waiting on a transfer).
    wait_queued_calls();
    if (seats.size() > rpc) seats[rpc]->begin_stop();
    if (bulk_ctx) (void)bulk_ctx->post([](const na::Completion&) {});
    if (threads.size() > rpc_threads) threads.back().join();
    threads.clear();
    if (seats.size() > rpc) seats[rpc]->wait_unheld();
    // Run what the wake-ups left queued (a thread may have stopped before its wake-up arrived).
    for (uint8_t i = 0; i < core->context_count(); ++i)
        core->context(i).trigger();
    // No Future::cancel reaches a manual engine's contexts from here on (the seats of a
    // background one refuse it since begin_stop, and wait_unheld waited for those in progress).
    if (driver) driver->close();
    // Fail the calls still in flight while the engine is whole: their continuations may call
    // it again (they get shutdown) or start transfers (canceled below).
    core->shutdown();

    // Cancels the transfers still in flight and drives bulk_ctx until they have completed.
    bulk.reset();
    if (bulk_ctx) {
        bulk_ctx->trigger();
        bulk_ctx.reset();
    }
    {
        // Their transfers are done; what they hold of the calls (addresses) goes before core.
        std::lock_guard g(watch_mu);
        watches.clear();
    }
    driver.reset();
    // Fails every call still in flight with shutdown (their futures complete here).
    core.reset();
}

namespace {
/// Record in `st` who completes it (see CallSite); kBulkContext: the engine's bulk context.
void attach_driver(EngineState& e, StateBase& st, uint8_t ctx) noexcept {
    if (e.driver) {
        st.set_driver(std::weak_ptr<Driver>(std::static_pointer_cast<Driver>(e.driver)), ctx);
        return;
    }
    std::size_t i = ctx == kBulkContext ? e.seats.size() - 1 : ctx;
    if (i < e.seats.size()) st.set_seat(std::weak_ptr<Driver>(e.seats[i]));
}
}  // namespace

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
    e.core->name_rpc(id, name);  // its statistics carry the name where it is only called
    for (std::size_t i = 0; i < kProbes; ++i) {
        auto& slot = e.proc_slots[(id + i) & mask];
        if (!slot.load(std::memory_order_relaxed)) {
            slot.store(rec.get(), std::memory_order_release);  // inserts are under procs_mu
            break;
        }
    }
    return rec.get();
}

CallSite call_site(EngineState& e, uint8_t from, StateBase& st) noexcept {
    CallSite site;
    site.count = e.core->context_count();
    if (from >= site.count) return site;
    site.ctx = &e.core->context(from);
    site.default_timeout = e.opts.default_timeout;
    attach_driver(e, st, from);
    return site;
}

std::vector<std::byte>& scratch_buffer() noexcept {
    thread_local std::vector<std::byte> buf;
    return buf;
}

/// A transfer a handler started for its call (Request::pull/push): the engine's watch scan
/// asks about every kWatchPeriod (and at the call's deadline, if sooner) whether the call's
/// caller canceled it or its deadline passed, and cancels the transfer then; the completion
/// says which.
struct TransferWatch {
    core::CancelRef call;
    bulk::TransferId id;
    std::atomic<bool> done{false};
    std::shared_ptr<State<void>> state;  ///< the Future's
    std::size_t len = 0;
    const char* what = "";
};

namespace {
constexpr auto kWatchPeriod = std::chrono::milliseconds(10);

void post_scan(EngineState& e, TimePoint due, bool periodic);

/// Drop the watches whose transfer completed, cancel those whose call ended; on the thread
/// that drives bulk_ctx. One timer serves every transfer in flight, so the cost per transfer
/// is a push under watch_mu, not a timer and a wake-up of that thread each.
void scan_watches(EngineState& e, bool periodic) {
    if (!e.bulk) return;  // the engine is stopping: its transfers are canceled with it
    std::vector<bulk::TransferId> ended;
    {
        std::lock_guard g(e.watch_mu);
        std::erase_if(e.watches, [&](const std::shared_ptr<TransferWatch>& w) {
            if (w->done.load(std::memory_order_acquire)) return true;
            if (!w->call.cancelled()) return false;
            ended.push_back(w->id);
            return true;
        });
        if (periodic) {
            e.watch_armed = !e.watches.empty();
            if (e.watch_armed) post_scan(e, Clock::now() + kWatchPeriod, true);
        }
    }
    for (const auto& id : ended)
        (void)e.bulk->cancel(id);  // completes it with canceled (read by its callback)
}

void post_scan(EngineState& e, TimePoint due, bool periodic) {
    (void)e.bulk_ctx->post_at(
        due, [es = &e, periodic](const na::Completion&) { scan_watches(*es, periodic); });
}

void watch_transfer(EngineState& e, std::shared_ptr<TransferWatch> w) {
    const TimePoint now = Clock::now();
    const TimePoint deadline = w->call.deadline();
    std::lock_guard g(e.watch_mu);
    e.watches.push_back(std::move(w));
    if (!e.watch_armed) {
        e.watch_armed = true;
        post_scan(e, now + kWatchPeriod, true);
    }
    // A deadline before the next scan could come: one more look, then (rare: calls of less
    // than the period).
    if (deadline < now + kWatchPeriod) post_scan(e, deadline, false);
}

/// A transfer of a call that ended: why.
Error call_ended(const core::CancelRef& call, const char* what) {
    if (call.expired())
        return Error(Errc::timeout,
                     fmt::format("bulk {}: the call it serves reached its deadline", what));
    return Error(Errc::canceled,
                 fmt::format("bulk {}: the caller canceled the call it serves", what));
}
}  // namespace

Future<void> start_transfer(EngineState& e, bulk::Direction dir, const na::Addr& peer,
                            const Bulk& remote, std::size_t remote_off, const Bulk& local,
                            std::size_t local_off, std::size_t len, const core::Request* from) {
    const char* what = dir == bulk::Direction::pull ? "pull" : "push";
    if (!e.no_bulk.empty())
        return Future<void>::ready_with(
            Error(Errc::not_supported, fmt::format("bulk {}: {}", what, e.no_bulk)));
    if (!e.bulk)
        return Future<void>::ready_with(
            Error(Errc::shutdown, fmt::format("bulk {}: the engine is shutting down", what)));
    if (!peer.valid() && !remote.owner_unreachable())  // the bulk layer says why, then
        return Future<void>::ready_with(Error(
            Errc::invalid_argument,
            fmt::format("bulk {}: no peer (the remote handle names no owner; pass an endpoint)",
                        what)));
    std::shared_ptr<TransferWatch> watch;
    if (from && from->valid() && !from->one_way()) {
        watch = std::make_shared<TransferWatch>();
        watch->call = from->cancel_ref();
        if (watch->call.cancelled()) return Future<void>::ready_with(call_ended(watch->call, what));
    }
    auto st = std::make_shared<State<void>>();
    attach_driver(e, *st, kBulkContext);
    Future<void> fut(st);
    Result<bulk::TransferId> id = Error(Errc::internal, "");
    const uint64_t t0 = ticks();  // the transfer's time, in the statistics
    const bool pull = dir == bulk::Direction::pull;
    if (!watch) {
        id =
            e.bulk->transfer(dir, peer, remote, remote_off, local, local_off, len,
                             [es = &e, s = std::move(st), len, t0, pull](Result<void>&& r) {
                                 es->core->note_bulk(1, r ? len : 0, r.has_value());
                                 es->core->note_transfer(pull, len, r.has_value(), ticks_since(t0));
                                 s->set(std::move(r));
                             });
    } else {
        watch->state = std::move(st);
        watch->len = len;
        watch->what = what;
        id = e.bulk->transfer(dir, peer, remote, remote_off, local, local_off, len,
                              [es = &e, w = watch, t0, pull](Result<void>&& r) {
                                  es->core->note_bulk(1, r ? w->len : 0, r.has_value());
                                  es->core->note_transfer(pull, w->len, r.has_value(),
                                                          ticks_since(t0));
                                  w->done.store(true, std::memory_order_release);
                                  if (!r && r.code() == Errc::canceled && w->call.cancelled())
                                      r = call_ended(w->call, w->what);
                                  std::exchange(w->state, nullptr)->set(std::move(r));
                              });
    }
    if (!id) return Future<void>::ready_with(std::move(id).error());
    if (watch) {
        watch->id = *id;
        watch_transfer(e, std::move(watch));
    }
    return fut;
}

Error call_error(std::string_view name, core::RpcId id, const na::Addr& peer, Error e,
                 std::string (*signature)()) {
    std::string where =
        peer.valid() ? peer.impl()->transport()->addr_to_string(peer) : std::string("?");
    std::string detail = e.message().empty() ? std::string() : ": " + e.message();
    switch (e.code()) {
        case Errc::not_found:
            // The peer's core answers an id it does not know with "no RPC with id ... is
            // registered at ...": say that once, with the name the caller used. Any other
            // not_found (a context the peer lacks, a handler's own) keeps the peer's words.
            if (e.message().starts_with(core::kNoRpcMessage)) {
                // "... for provider N" when the call named one.
                const auto p = e.message().rfind(" for provider ");
                return Error(
                    Errc::not_found,
                    fmt::format(
                        "no procedure '{}' (id {:#010x}) is registered at {}{}", name, id, where,
                        p == std::string::npos ? std::string_view() : e.message().substr(p)));
            }
            return Error(Errc::not_found, fmt::format("rpc '{}' to {}{}", name, where, detail));
        case Errc::timeout:
            return Error(Errc::timeout,
                         fmt::format("rpc '{}' to {} timed out{}", name, where, detail));
        case Errc::invalid_argument:
            // The target's core refused the call's signature hash: say what to do about it.
            if (e.message().starts_with(core::kSignatureMessage))
                return Error(Errc::invalid_argument,
                             fmt::format("rpc '{}' to {}{}{}; declare the call with those types "
                                         "(remote<R(Args...)>), or make it .unchecked() if the "
                                         "two spellings encode the same bytes",
                                         name, where, detail,
                                         signature ? "; this call is " + signature() : ""));
            return Error(e.code(), fmt::format("rpc '{}' to {}{}", name, where, detail));
        default:
            return Error(e.code(), fmt::format("rpc '{}' to {}{}", name, where, detail));
    }
}

Result<void> register_handler(EngineState& e, std::string_view name, core::Handler h,
                              core::Registration reg) {
    auto r = e.core->register_rpc(core::rpc_id(name), name, std::move(h), reg);
    if (!r && r.code() == Errc::already_exists) {
        std::string other = e.core->rpc_name(core::rpc_id(name), reg.provider);
        std::string of = reg.provider ? fmt::format(" for provider {}", reg.provider) : "";
        return Error(Errc::already_exists,
                     other == name ? fmt::format("procedure '{}' is already defined{}", name, of)
                                   : fmt::format("procedure '{}' has the same id as '{}'{}", name,
                                                 other, of));
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
    // The server's operator sees what its handlers throw (rate-limited: a caller can make a
    // handler throw at will).
    if (auto held = info.engine->handler_errors_log.admit()) {
        const na::Addr& from = req.core().source();
        TALARIA_LOG(api, warn, "rpc '{}' from {}: {} ({}){}", info.name,
                    from.valid() ? from.impl()->transport()->addr_describe(from) : "?", msg,
                    errc_name(code), log::held_back(*held));
    }
    // A handler that moved its Request out (async) no longer holds it: whoever does answers,
    // or its destructor answers internal.
    if (!req.valid() || req.one_way() || req.responded()) return;
    (void)req.try_respond_error(code, msg);
}

}  // namespace detail

namespace detail {
QueuedCount::QueuedCount(EngineState& e) noexcept : e_(&e) {
    e_->queued_calls.fetch_add(1, std::memory_order_relaxed);
}
QueuedCount::~QueuedCount() {
    e_->queued_calls.fetch_sub(1, std::memory_order_release);
}
}  // namespace detail

// --- Provider ----------------------------------------------------------------------------------

void Provider::undefine_all() noexcept {
    state_->closed.store(true);
    for (const std::string& n : names_)
        (void)engine_->try_undefine(n, id_);
    names_.clear();
    // A handler that found its entry before it went may still be running: wait for it.
    while (state_->running.load() != 0)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
}

std::string Provider::gone_message(uint16_t id) {
    return fmt::format("provider {} is being destroyed", id);
}

// --- Engine ------------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<detail::EngineState> s) noexcept : state_(std::move(s)) {}

Engine::Engine(std::string_view address, EngineOptions opts)
    : Engine(detail::value_or_throw(open(address, false, std::move(opts)))) {}

Engine::Engine(std::string_view address, Listen, EngineOptions opts)
    : Engine(detail::value_or_throw(open(address, true, std::move(opts)))) {}

Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

namespace {
/// The transfer context (id opts.contexts) of a new engine's state; `optional`: a transport
/// without that id free leaves the engine without one (pull and push answer not_supported).
Result<void> open_bulk_context(detail::EngineState& st, bool optional) {
    // The bulk context takes no calls: one aimed at its id is answered like one aimed at a
    // context that does not exist (not_found), by the lowest RPC context.
    na::ContextOptions bco;
    bco.unexpected = false;
    auto bc = st.core->transport().context_create(st.opts.contexts, bco);
    if (!bc) {
        if (!optional) return std::move(bc).error();
        st.no_bulk = fmt::format(
            "this engine has no transfer context: it was opened over a transport whose context "
            "id {} is not free ({}); open the transport with at least {} contexts",
            st.opts.contexts, bc.error().describe(), st.opts.contexts + 1);
        TALARIA_LOG(api, info, "engine {}: {}", st.core->self_string(), st.no_bulk);
        return ok();
    }
    st.bulk_ctx = std::move(*bc);
    st.bulk = std::make_unique<bulk::Context>(*st.bulk_ctx);
    return ok();
}
}  // namespace

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
    st->listens = accept;
    st->wait.store(opts.wait, std::memory_order_relaxed);
    TALARIA_TRY(ce, core::Engine::open(address, co));
    st->core = std::move(ce);
    TALARIA_CHECK(open_bulk_context(*st, false));
    return finish_open(std::move(st));
}

Result<Engine> Engine::open(na::Transport& transport, EngineOptions opts) {
    if (opts.contexts == 0)
        return Error(Errc::invalid_argument, "EngineOptions::contexts must be at least 1");
    core::Options co = opts.core;
    co.contexts = opts.contexts;
    co.checksum = opts.checksum;
    auto st = std::make_unique<detail::EngineState>();
    st->opts = opts;
    st->listens = transport.listens();
    st->wait.store(opts.wait, std::memory_order_relaxed);
    TALARIA_TRY(ce, core::Engine::open(transport, co));
    st->core = std::move(ce);
    TALARIA_CHECK(open_bulk_context(*st, true));
    return finish_open(std::move(st));
}

Result<Engine> Engine::finish_open(std::unique_ptr<detail::EngineState> st) {
    const EngineOptions& opts = st->opts;
    if (opts.progress == ProgressMode::manual)
        st->driver = std::make_shared<detail::ManualDriver>(st.get());
    else
        st->start_threads();
    TALARIA_LOG(api, debug, "engine {} open ({} contexts, {} progress)", st->core->self_string(),
                opts.contexts, opts.progress == ProgressMode::manual ? "manual" : "background");
    return Engine(std::move(st));
}

Engine::Engine(const EngineConfig& config)
    : Engine(detail::value_or_throw(open(config.address, config.listen, config.options))) {
    state_->secret_file = config.secret_file;
}

namespace {

std::string config_json_of(const detail::EngineState& st, int indent) {
    EngineConfig c;
    c.address = st.core->self_string();
    c.listen = st.listens;
    c.options = st.opts;
    c.options.wait = st.wait.load(std::memory_order_relaxed);
    c.secret_file = st.secret_file;
    return c.to_json(indent);
}

std::string health_json_of(const detail::EngineState& st) {
    bool asked;
    {
        std::lock_guard g(st.life_mu);
        asked = st.shutdown_asked;
    }
    const auto up = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - st.opened);
    return detail::health_json_text(asked ? "shutting_down" : "serving", st.core->self_string(),
                                    uint64_t(up.count()), st.core->context_count());
}

}  // namespace

std::string Engine::config_json(int indent) const {
    return config_json_of(*state_, indent);
}

std::string Engine::stats_json(int indent) const {
    return detail::stats_json_of(*state_->core, indent, state_->bulk_ctx.get());
}

std::string Engine::stats_prometheus() const {
    return detail::stats_prometheus_of(*state_->core, state_->bulk_ctx.get());
}

std::string Engine::health_json() const {
    return health_json_of(*state_);
}

std::string Engine::self_address() const {
    return state_->core->self_string();
}

Endpoint Engine::self() const {
    return Endpoint(state_.get(), state_->core->self());
}

Result<Endpoint> detail::lookup_through(EngineState* state, std::string_view address) {
    TALARIA_TRY(a, state->core->lookup(address));
    return Endpoint(state, std::move(a));
}

Result<Endpoint> Engine::try_lookup(std::string_view address) {
    return detail::lookup_through(state_.get(), address);
}

Endpoint Engine::lookup(std::string_view address) {
    return detail::value_or_throw(try_lookup(address));
}

Executor& Engine::handler_pool() {
    std::lock_guard g(state_->pool_mu);
    if (!state_->pool) state_->pool = std::make_unique<ThreadPool>(state_->opts.handler_threads);
    return *state_->pool;
}

bool detail::listens(const EngineState& state) noexcept {
    return state.listens;
}

Result<void> detail::undefine_through(EngineState* state, std::string_view name) {
    return state->core->deregister_rpc(core::rpc_id(name), 0);
}

Result<void> Engine::try_undefine(std::string_view name, uint16_t provider) {
    return state_->core->deregister_rpc(core::rpc_id(name), provider);
}

Result<Bulk> Engine::try_expose(Segment segment, Access access) {
    return bulk::Handle::create(state_->core->transport(), std::span<const Segment>(&segment, 1),
                                access);
}

Result<Bulk> Engine::try_expose(const std::vector<Segment>& segments, Access access) {
    return bulk::Handle::create(state_->core->transport(), segments, access);
}

void Engine::shutdown() noexcept {
    state_->request_shutdown();
}

bool Engine::shutdown_requested() const noexcept {
    std::lock_guard g(state_->life_mu);
    return state_->shutdown_asked;
}

void Engine::wait_for_shutdown() {
    {
        std::unique_lock g(state_->life_mu);
        state_->life_cv.wait(g, [&] { return state_->shutdown_asked; });
    }
    state_->run_on_shutdown();
}

bool Engine::wait_for_shutdown(Duration d) {
    {
        std::unique_lock g(state_->life_mu);
        if (!state_->life_cv.wait_for(g, d, [&] { return state_->shutdown_asked; })) return false;
    }
    state_->run_on_shutdown();
    return true;
}

void Engine::on_shutdown(std::function<void()> fn) {
    if (!fn) return;
    std::lock_guard g(state_->life_mu);
    state_->on_shutdown.push_back(std::move(fn));
}

void Engine::enable_remote_shutdown() {
    detail::EngineState* st = state_.get();
    define(kShutdownProcedure, [st] { st->request_shutdown(); });
}

namespace {
/// Under life_mu (the caller's): the engine's exporter, made on first use.
detail::StatsExporter& exporter_of(detail::EngineState& st) {
    if (!st.exporter)
        st.exporter = std::make_unique<detail::StatsExporter>(*st.core, st.bulk_ctx.get());
    return *st.exporter;
}
}  // namespace

Result<void> Engine::try_write_stats_every(Duration period, std::string path) {
    std::lock_guard g(state_->life_mu);
    return exporter_of(*state_).write_every(period, std::move(path));
}

void Engine::write_stats_every(Duration period, std::string path) {
    detail::value_or_throw(try_write_stats_every(period, std::move(path)));
}

Result<std::string> Engine::try_serve_prometheus(std::string_view address) {
    std::lock_guard g(state_->life_mu);
    return exporter_of(*state_).serve_http(address);
}

std::string Engine::serve_prometheus(std::string_view address) {
    return detail::value_or_throw(try_serve_prometheus(address));
}

void Engine::enable_introspection() {
    // The engine's state, not `this`: an Engine may be moved; its state stays.
    const detail::EngineState* st = state_.get();
    // Each takes its request: it is held while it runs, and not counted as a held request.
    define(kStatsProcedure, [st](const Request& req) {
        return detail::stats_json_of(*st->core, -1, st->bulk_ctx.get(), &req.core());
    });
    define(kPrometheusProcedure, [st](const Request& req) {
        return detail::stats_prometheus_of(*st->core, st->bulk_ctx.get(), &req.core());
    });
    define(kConfigProcedure, [st] { return config_json_of(*st, -1); });
    define(kHealthProcedure, [st] { return health_json_of(*st); });
    define(kInFlightProcedure, [st](const Request& req) {
        return detail::calls_in_flight_json_of(*st->core, &req.core());
    });
}

Future<void> Engine::shutdown_remote(const Endpoint& ep) {
    return remote<void()>(kShutdownProcedure).on(ep).one_way()();
}

Result<Bulk> Engine::try_expose(Segment segment, Access access, BindOwner) {
    // bulk::Handle::create refuses an engine that does not listen, saying why.
    return bulk::Handle::create(state_->core->transport(), std::span<const Segment>(&segment, 1),
                                access, true);
}

Result<Bulk> Engine::try_expose(const std::vector<Segment>& segments, Access access, BindOwner) {
    return bulk::Handle::create(state_->core->transport(), segments, access, true);
}

Bulk Engine::expose(Segment segment, Access access, BindOwner b) {
    return detail::value_or_throw(try_expose(segment, access, b));
}

Bulk Engine::expose(const std::vector<Segment>& segments, Access access, BindOwner b) {
    return detail::value_or_throw(try_expose(segments, access, b));
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
    if (state_->core->inherited()) [[unlikely]]
        return 0;  // a child across fork(): nothing here is its to drive
    unsigned n = 0;
    for (uint8_t i = 0; i < context_count(); ++i) {
        (void)state_->core->context(i).progress(Duration(0));
        n += state_->core->context(i).trigger();
    }
    if (state_->bulk_ctx) {
        (void)state_->bulk_ctx->progress(Duration(0));
        n += state_->bulk_ctx->trigger();
    }
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
    for (auto& seat : state_->seats)
        seat->set_mode(w);
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
