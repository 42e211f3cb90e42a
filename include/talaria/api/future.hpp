// Future<T>: the result of a call or a bulk transfer, completed once from a progress thread.
//
// Shared state: one allocation per call (std::make_shared of State<T>): the caller's Future and
// the completion callback registered with the layer below each hold a reference. The result is
// decoded when the response arrives (on the progress thread), so no response buffer is kept.
// The hand-off between the completing thread and the consumer is one atomic word (see
// StateBase): no mutex, no condition variable. get() on a background engine drives the call's
// context itself while it waits (the progress thread steps aside: Driver::wait_ready); where
// another thread drives it, get() spins briefly, then sleeps on a futex.
//
// Consuming a Future: get() / try_get() (block; on a manual-progress engine they drive the
// engine's progress themselves), then(callback) (runs on the completing thread), or co_await
// (the coroutine resumes on the completing thread). Exactly one of them, once.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>

#include "talaria/api/error.hpp"
#include "talaria/util/clock.hpp"
#include "talaria/util/cpu.hpp"
#include "talaria/util/result.hpp"

namespace talaria {

template <class T>
class Future;

namespace detail {

class StateBase;

/// Drives the progress of a manual-progress engine on behalf of a thread that waits for a
/// result (Future::get, sync_wait). Implemented by the engine; futures hold it weakly so that a
/// destroyed engine is noticed instead of touched.
class Driver {
  public:
    virtual ~Driver() = default;
    /// Progress then trigger context `ctx` (kBulkContext: the engine's transfer context),
    /// waiting at most `d` for something to happen (manual engines).
    virtual void drive(uint8_t ctx, Duration d) = 0;
    /// Wait until `s` is ready or `deadline` passes; true if ready. A background engine's
    /// context seat (src/api/engine.cpp) takes its context over from the progress thread and
    /// drives it on the waiting thread; manual engines are driven by StateBase itself.
    virtual bool wait_ready(StateBase& s, TimePoint deadline) = 0;
    /// Why nothing can complete the states of this driver in this process (its engine was
    /// inherited across fork: Errc::invalid_state), or ok.
    [[nodiscard]] virtual Result<void> usable() const { return ok(); }
    /// Cancel the call `seq` (core::CallId) of context `ctx` (the seat's own context for a
    /// background engine): true if it was still outstanding. Safe against the engine shutting
    /// down on another thread (then false: shutdown completes the call itself).
    virtual bool cancel_call(uint8_t ctx, uint32_t seq) = 0;
};

/// What cancels an operation that is not one core call (Future::cancel of a state that has a
/// canceler, StateBase::set_canceler): a collective whose root runs in the caller's process.
class Canceler {
  public:
    virtual ~Canceler() = default;
    /// True if the operation was outstanding and now completes with Errc::canceled.
    virtual bool cancel() = 0;
};

/// The context id a Driver understands as "the engine's bulk transfer context".
inline constexpr uint8_t kBulkContext = 0xFF;

/// Where a coroutine chain started by sync_wait() learns which manual engine to drive: a Task
/// awaiting a Future of a manual engine records that engine's driver here.
class DriveSlot {
  public:
    void set(const std::weak_ptr<Driver>& d, uint8_t ctx) {
        std::lock_guard g(mu_);
        driver_ = d;
        ctx_ = ctx;
    }
    /// The driver last recorded (empty if none) and its context.
    std::pair<std::shared_ptr<Driver>, uint8_t> get() const {
        std::lock_guard g(mu_);
        return {driver_.lock(), ctx_};
    }

  private:
    mutable std::mutex mu_;
    std::weak_ptr<Driver> driver_;
    uint8_t ctx_ = 0;
};

/// Base of Task promises (task.hpp), so a Future awaited in a Task can find the DriveSlot.
struct TaskPromiseBase {
    DriveSlot* slot = nullptr;
};

/// A continuation stored until the state completes (move-only, type-erased).
struct Continuation {
    virtual ~Continuation() = default;
    virtual void run() = 0;
};

/// Waits on a 32-bit word with the Linux futex (no mutex, no condition variable): the calls
/// behind a completion handing its result to a sleeping thread. Out of line (future.cpp).
void futex_wait(const std::atomic<uint32_t>& word, uint32_t expected, TimePoint deadline) noexcept;
void futex_wake_all(const std::atomic<uint32_t>& word) noexcept;

/// Completion state shared by a Future and the callback that completes it.
///
/// One atomic word carries the hand-off (no lock): the completing thread stores the result,
/// then sets kReady; a consumer registers a continuation or coroutine (kLinked) or announces a
/// sleep (kSleeper) with one read-modify-write each, so exactly one side sees the other's bit.
/// A thread waiting in get() spins briefly (kSpin) before it sleeps on the futex,
/// and the completing thread makes the wake-up system call only when a sleeper announced itself.
class StateBase {
  public:
    static constexpr uint32_t kReady = 1, kLinked = 2, kSleeper = 4;
    /// How long get() polls before it sleeps: a round trip on shared memory is about a
    /// microsecond, and a sleep costs a few; longer spins only steal a core from the thread
    /// that completes the call where threads outnumber cores.
    static constexpr Duration kSpin = std::chrono::microseconds(3);

    [[nodiscard]] bool ready() const noexcept {
        return (word_.load(std::memory_order_acquire) & kReady) != 0;
    }

    /// Block until ready or `deadline`; drives the engine when it is a manual one, and on a
    /// background engine takes the context over from its progress thread (Driver::wait_ready).
    bool wait_until(TimePoint deadline) {
        if (ready()) return true;
        if (mode_ == Mode::seat) {
            if (auto d = driver_.lock()) return d->usable() && d->wait_ready(*this, deadline);
            return ready();  // the engine is gone: nothing will complete this state any more
        }
        if (mode_ == Mode::manual) {
            // Nobody else progresses a manual engine: this thread does, in slices of at most
            // 10 ms so the deadline is kept.
            while (!ready()) {
                auto d = driver_.lock();
                if (!d) return ready();            // the engine is gone (it failed its calls first)
                if (!d->usable()) return ready();  // inherited across fork: nobody drives it
                if (deadline_passed(deadline)) return false;
                Duration slice = std::chrono::milliseconds(10);
                if (deadline != TimePoint::max())
                    slice = std::min<Duration>(slice, deadline - Clock::now());
                d->drive(ctx_, std::max<Duration>(slice, Duration(0)));
            }
            return true;
        }
        return sleep_until(deadline);
    }

    /// Wait for another thread to complete this state: poll for kSpin, then sleep on the futex
    /// until ready or `deadline`; true if ready. Drives nothing.
    bool sleep_until(TimePoint deadline) {
        // Work is near (a round trip is microseconds): poll before paying for a sleep.
        for (TimePoint end = Clock::now() + kSpin;;) {
            for (unsigned i = 0; i < 16; ++i) {
                if (ready()) return true;
                cpu_relax();
            }
            if (Clock::now() >= end) break;
        }
        for (;;) {
            uint32_t w = word_.fetch_or(kSleeper, std::memory_order_acq_rel);
            if (w & kReady) return true;
            if (deadline != TimePoint::max() && deadline_passed(deadline)) return ready();
            futex_wait(word_, w | kSleeper, deadline);
        }
    }

    /// Record the manual engine that must be driven to complete this state.
    void set_driver(std::weak_ptr<Driver> d, uint8_t ctx) {
        driver_ = std::move(d);
        ctx_ = ctx;
        mode_ = Mode::manual;
    }
    /// Record the seat of the background engine's context that completes this state: a thread
    /// waiting in get() drives that context itself (Driver::wait_ready).
    void set_seat(std::weak_ptr<Driver> d) {
        driver_ = std::move(d);
        mode_ = Mode::seat;
    }
    /// A manual engine's driver was recorded (set_driver).
    [[nodiscard]] bool manual() const noexcept { return mode_ == Mode::manual; }
    /// Sleep once on the futex word until the state completes, a spurious wake-up or
    /// `deadline` (Driver::wait_ready, while another thread drives the context).
    void sleep_once(TimePoint deadline) {
        uint32_t w = word_.fetch_or(kSleeper, std::memory_order_acq_rel);
        if (!(w & kReady)) futex_wait(word_, w | kSleeper, deadline);
    }
    [[nodiscard]] const std::weak_ptr<Driver>& driver() const noexcept { return driver_; }
    /// Why wait_until() gave up without a result: the engine was inherited across fork
    /// (invalid_state), or it is gone (shutdown).
    [[nodiscard]] Error unavailable() const {
        if (auto d = driver_.lock())
            if (auto u = d->usable(); !u) return u.error();
        return Error(Errc::shutdown, "the engine that would complete this future is gone");
    }
    [[nodiscard]] uint8_t driver_context() const noexcept { return ctx_; }

    /// Ask the operation behind this state to stop (Future::cancel): true if it was still
    /// outstanding and now completes with Errc::canceled. States of operations that cannot be
    /// canceled (a transfer, a ready-made result) answer false.
    bool cancel() {
        if (ready()) return false;
        if (auto c = canceler_.lock()) return c->cancel();
        if (call_seq_ == 0) return false;
        if (auto d = driver_.lock()) return d->cancel_call(ctx_, call_seq_);
        return false;
    }
    /// Record what cancels this state's operation when it is not one core call (held weakly:
    /// once it is gone, the operation has completed).
    void set_canceler(std::weak_ptr<Canceler> c) noexcept { canceler_ = std::move(c); }
    /// Record the core call this state completes (made by Procedure::operator()).
    void set_call(uint32_t seq) noexcept { call_seq_ = seq; }

    /// Store the coroutine to resume on completion; false if already complete (do not suspend).
    bool suspend(std::coroutine_handle<> h) {
        waiter_ = h;
        return (word_.fetch_or(kLinked, std::memory_order_acq_rel) & kReady) == 0;
    }
    /// Store a continuation; runs it at once (on this thread) if already complete.
    void set_continuation(std::unique_ptr<Continuation> c) {
        cont_ = std::move(c);
        if (word_.fetch_or(kLinked, std::memory_order_acq_rel) & kReady) run_linked();
    }

    /// then() callbacks up to this size (with what they capture) are kept in the state itself,
    /// so a call consumed with then() allocates nothing for it; larger ones go to the heap.
    static constexpr std::size_t kInlineContinuation = 48;
    template <class Fn>
    static constexpr bool inline_continuation_fits() noexcept {
        return sizeof(Fn) <= kInlineContinuation && alignof(Fn) <= alignof(std::max_align_t) &&
               std::is_nothrow_move_constructible_v<Fn>;
    }
    /// What runs (run = true: moves the callback out of `buf` and calls it with the result) or
    /// only destroys (false: the state dies uncompleted) an inline continuation.
    using InlineOp = void (*)(StateBase& self, void* buf, bool run);
    /// Store `f` in the state, run by `op` on completion; at once (on this thread) if complete.
    template <class Fn>
    void set_inline_continuation(Fn&& f, InlineOp op) {
        static_assert(inline_continuation_fits<std::decay_t<Fn>>());
        ::new (static_cast<void*>(inline_buf_)) std::decay_t<Fn>(std::forward<Fn>(f));
        inline_op_ = op;
        if (word_.fetch_or(kLinked, std::memory_order_acq_rel) & kReady) run_linked();
    }

    StateBase() = default;
    StateBase(const StateBase&) = delete;
    StateBase& operator=(const StateBase&) = delete;
    ~StateBase() {
        if (inline_op_) inline_op_(*this, inline_buf_, false);
    }

  protected:
    /// Publish the result (already stored by the derived class) and wake/resume the consumer.
    /// Called once, by the completing thread.
    void publish() {
        uint32_t w = word_.fetch_or(kReady, std::memory_order_acq_rel);
        if (w & kSleeper) futex_wake_all(word_);
        if (w & kLinked) run_linked();
    }

  private:
    void run_linked() {
        // All out first: the continuation may hold the last reference to this state (an
        // inline one is moved out of the state before it runs).
        auto cont = std::move(cont_);
        auto h = std::exchange(waiter_, nullptr);
        if (InlineOp op = std::exchange(inline_op_, nullptr)) op(*this, inline_buf_, true);
        if (cont) cont->run();
        if (h) h.resume();
    }
    std::atomic<uint32_t> word_{0};
    std::coroutine_handle<> waiter_;
    std::unique_ptr<Continuation> cont_;
    InlineOp inline_op_ = nullptr;
    alignas(std::max_align_t) std::byte inline_buf_[kInlineContinuation];
    enum class Mode : uint8_t { none, manual, seat };
    std::weak_ptr<Driver> driver_;
    std::weak_ptr<Canceler> canceler_;  ///< set_canceler
    uint32_t call_seq_ = 0;  ///< the core call completing this state (0: none, or not a call)
    uint8_t ctx_ = 0;
    Mode mode_ = Mode::none;
};

template <class T>
class State : public StateBase {
  public:
    /// Complete with `r`, once.
    void set(Result<T>&& r) {
        result_.emplace(std::move(r));
        publish();
    }
    /// The result, moved out (only after ready()).
    Result<T> take() { return std::move(*result_); }

  private:
    std::optional<Result<T>> result_;
};

}  // namespace detail

/// The result of an asynchronous operation of this layer. Move-only; consume it once with get(),
/// try_get(), then() or co_await.
template <class T>
class [[nodiscard]] Future {
  public:
    using value_type = T;

    Future() = default;
    explicit Future(std::shared_ptr<detail::State<T>> s) noexcept : state_(std::move(s)) {}
    /// A Future already complete with `r` (e.g. an operation that failed before it started).
    static Future ready_with(Result<T> r) {
        auto s = std::make_shared<detail::State<T>>();
        s->set(std::move(r));
        return Future(std::move(s));
    }

    Future(Future&&) noexcept = default;
    Future& operator=(Future&&) noexcept = default;
    Future(const Future&) = delete;
    Future& operator=(const Future&) = delete;

    [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
    /// True once the result is there (never blocks, never drives progress).
    [[nodiscard]] bool ready() const noexcept { return state_ && state_->ready(); }

    /// Cancel the call behind this Future: if it is still outstanding it completes with
    /// Errc::canceled (a response that arrives later is dropped) and true is returned; false if
    /// it was already complete, or the Future is empty or not a call's (a transfer's, a
    /// when_all's). Any thread. A call that was sent is signalled to the server (a cancel
    /// message): its handler sees Request::cancelled(), and transfers the handler started for
    /// it fail with canceled; a handler that does not ask runs on, and its answer is dropped.
    /// The Future is still consumed as usual (get, then, co_await).
    bool cancel() const { return state_ && state_->cancel(); }

    /// Wait up to `d` (driving progress on a manual engine); true if ready.
    bool wait_for(Duration d) const {
        if (!state_) return false;
        return state_->wait_until(deadline_after(d));
    }

    /// Wait for the result; the error as a value. Consumes the Future.
    Result<T> try_get() {
        if (!state_) return Error(Errc::invalid_argument, "Future::try_get on an empty future");
        auto s = std::move(state_);
        if (!s->wait_until(TimePoint::max())) return s->unavailable();
        return s->take();
    }
    /// Wait for the result; throws talaria::Exception on error. Consumes the Future.
    T get() { return detail::value_or_throw(try_get()); }

    /// Run `f(Result<T>&&)` when the result arrives, on the thread that completes it (a progress
    /// thread), or at once on this thread if it is already there. Consumes the Future.
    template <class F>
    requires std::is_invocable_v<F&, Result<T> &&> void then(F&& f) && {
        struct Cont final : detail::Continuation {
            Cont(std::shared_ptr<detail::State<T>> st, std::decay_t<F> fn)
                : s(std::move(st)), f(std::move(fn)) {}
            void run() override { f(s->take()); }
            std::shared_ptr<detail::State<T>> s;
            std::decay_t<F> f;
        };
        using Fn = std::decay_t<F>;
        auto s = std::move(state_);
        if (!s) return;
        auto* raw = s.get();
        if constexpr (detail::StateBase::inline_continuation_fits<Fn>()) {
            // Kept in the state (no allocation): whoever completes the state holds it while
            // the callback runs, and `s` holds it until the callback is linked.
            raw->set_inline_continuation(std::forward<F>(f),
                                         [](detail::StateBase& st, void* buf, bool run) {
                                             Fn* p = std::launder(static_cast<Fn*>(buf));
                                             if (!run) {
                                                 p->~Fn();
                                                 return;
                                             }
                                             Fn fn(std::move(*p));
                                             p->~Fn();
                                             fn(static_cast<detail::State<T>&>(st).take());
                                         });
        } else {
            // The continuation keeps the state alive only while it waits: it is moved out and
            // run (and destroyed) by publish(), which breaks the cycle.
            raw->set_continuation(std::make_unique<Cont>(std::move(s), std::forward<F>(f)));
        }
    }

    // --- co_await ------------------------------------------------------------------------------
    /// Awaiting yields the value or throws talaria::Exception.
    struct Awaiter {
        std::shared_ptr<detail::State<T>> s;
        bool await_ready() const noexcept { return s->ready(); }
        template <class P>
        bool await_suspend(std::coroutine_handle<P> h) {
            note_driver(h);
            return s->suspend(h);
        }
        T await_resume() { return detail::value_or_throw(s->take()); }

        template <class P>
        void note_driver(std::coroutine_handle<P> h) {
            if constexpr (std::is_base_of_v<detail::TaskPromiseBase, P>) {
                if (h.promise().slot && s->manual() && !s->driver().expired())
                    h.promise().slot->set(s->driver(), s->driver_context());
            }
        }
    };
    /// Awaiting yields the Result (no exception).
    struct ResultAwaiter : Awaiter {
        Result<T> await_resume() { return this->s->take(); }
    };

    Awaiter operator co_await() && { return Awaiter{checked()}; }
    /// `co_await f.as_result()`: the non-throwing twin of `co_await f`.
    ResultAwaiter as_result() && { return ResultAwaiter{{checked()}}; }

    /// The shared state (for layers that complete it).
    [[nodiscard]] const std::shared_ptr<detail::State<T>>& state() const noexcept { return state_; }

  private:
    std::shared_ptr<detail::State<T>> checked() {
        if (!state_) {
            auto s = std::make_shared<detail::State<T>>();
            s->set(Error(Errc::invalid_argument, "co_await on an empty future"));
            return s;
        }
        return std::move(state_);
    }
    std::shared_ptr<detail::State<T>> state_;
};

}  // namespace talaria

#pragma GCC visibility pop
