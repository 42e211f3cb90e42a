// Task<T>: a minimal coroutine type for user code that co_awaits Futures and other Tasks.
//
// Lazy: a Task starts when it is awaited (co_await task) or run (sync_wait(task) / task.get()).
// Awaiting a Task transfers control symmetrically (no stack growth over long chains). A Task
// awaiting a Future is resumed on the thread that completes the Future (a progress thread of
// the engine, or the thread driving a manual engine); sync_wait() blocks until the whole chain
// is done, driving a manual engine's progress itself when the chain waits on one.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <condition_variable>
#include <coroutine>
#include <exception>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "talaria/api/future.hpp"

namespace talaria {

template <class T = void>
class Task;

namespace detail {

/// What sync_wait() blocks on: the end of the chain, plus the slot naming the manual engine.
class SyncWaiter {
  public:
    void signal() {
        std::lock_guard g(mu_);
        done_ = true;
        // Notified under the lock: the waiter may destroy this object as soon as it sees done_.
        cv_.notify_all();
    }
    void wait() {
        std::unique_lock g(mu_);
        while (!done_) {
            auto [driver, ctx] = slot.get();
            if (driver) {
                g.unlock();
                driver->drive(ctx, std::chrono::milliseconds(10));
                g.lock();
            } else {
                // Bounded slices: a manual engine recorded later is noticed.
                cv_.wait_for(g, std::chrono::milliseconds(10));
            }
        }
    }
    DriveSlot slot;

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
};

template <class T>
struct TaskPromiseStorage {
    std::optional<T> value;
    template <class U>
    void return_value(U&& v) {
        value.emplace(std::forward<U>(v));
    }
    T take() { return std::move(*value); }
};
template <>
struct TaskPromiseStorage<void> {
    void return_void() noexcept {}
    void take() noexcept {}
};

template <class T>
struct TaskPromise : TaskPromiseBase, TaskPromiseStorage<T> {
    std::coroutine_handle<> continuation;
    SyncWaiter* sync = nullptr;
    std::exception_ptr error;

    Task<T> get_return_object() noexcept;
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwaiter {
        bool await_ready() const noexcept { return false; }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<TaskPromise> h) noexcept {
            auto& p = h.promise();
            if (p.continuation) return p.continuation;
            if (auto* s = p.sync) s->signal();  // may free the frame's owner: touch nothing after
            return std::noop_coroutine();
        }
        void await_resume() const noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    void unhandled_exception() noexcept { error = std::current_exception(); }

    decltype(auto) result() {
        if (error) std::rethrow_exception(error);
        return this->take();
    }
};

}  // namespace detail

/// A lazily started coroutine producing a T (exceptions propagate to the awaiter). Move-only;
/// the frame is destroyed with the Task.
template <class T>
class [[nodiscard]] Task {
  public:
    using promise_type = detail::TaskPromise<T>;
    using Handle = std::coroutine_handle<promise_type>;

    Task() = default;
    explicit Task(Handle h) noexcept : h_(h) {}
    Task(Task&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Task& operator=(Task&& o) noexcept {
        if (this != &o) {
            if (h_) h_.destroy();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Task() {
        if (h_) h_.destroy();
    }

    [[nodiscard]] bool valid() const noexcept { return h_ != nullptr; }

    struct Awaiter {
        Handle h;
        bool await_ready() const noexcept { return !h || h.done(); }
        template <class P>
        std::coroutine_handle<> await_suspend(std::coroutine_handle<P> parent) noexcept {
            h.promise().continuation = parent;
            if constexpr (std::is_base_of_v<detail::TaskPromiseBase, P>)
                h.promise().slot = parent.promise().slot;
            return h;
        }
        T await_resume() {
            if (!h) throw Exception(Errc::invalid_argument, "co_await on an empty Task");
            return h.promise().result();
        }
    };
    /// Start the task (if not started) and resume the awaiter when it finishes.
    Awaiter operator co_await() & noexcept { return Awaiter{h_}; }
    Awaiter operator co_await() && noexcept { return Awaiter{h_}; }

    /// Run to completion on this thread's watch (see sync_wait) and return the result.
    T get() &&;

  private:
    template <class U>
    friend U sync_wait(Task<U>&& task);
    Handle h_;
};

template <class T>
Task<T> detail::TaskPromise<T>::get_return_object() noexcept {
    return Task<T>(std::coroutine_handle<TaskPromise>::from_promise(*this));
}

/// Start `task` and block until it finishes; returns its value or rethrows its exception. When
/// the chain waits on a Future of a manual-progress engine, this thread drives that engine.
template <class T>
T sync_wait(Task<T>&& task) {
    Task<T> t = std::move(task);
    if (!t.h_) throw Exception(Errc::invalid_argument, "sync_wait on an empty Task");
    if (t.h_.done()) return t.h_.promise().result();
    detail::SyncWaiter w;
    auto& p = t.h_.promise();
    p.sync = &w;
    p.slot = &w.slot;
    t.h_.resume();
    w.wait();
    return p.result();
}

template <class T>
T Task<T>::get() && {
    return sync_wait(std::move(*this));
}

}  // namespace talaria

#pragma GCC visibility pop
