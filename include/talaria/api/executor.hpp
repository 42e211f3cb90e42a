// Where handlers run. By default a handler runs on the progress thread of the context that
// received its call: the fastest path, but a handler that computes, sleeps or blocks stalls every
// other call of that context meanwhile, and the context cannot hear of a cancel of the call it
// runs. A handler bound to an Executor (Engine::define(name, f, executor), or a Provider's
// executor) runs there instead: its arguments are decoded on the progress thread, then the call
// is queued to the executor and the progress thread goes on at once.
//
//   talaria::ThreadPool pool(4);                    // or the engine's own: engine.handler_pool()
//   server.define("compress", compress, pool);
//
// Cost: one allocation per call (the queued job), a hand-off between threads, and the Request
// counts as held until answered (core::Options::max_requests bounds how many queue up).
//
// Lifetime: an executor given to Engine::define must outlive the engine. Closing the engine
// waits until every call it gave to an executor has run or been dropped.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace talaria {

/// A move-only job for an Executor (it may own a Request, which is move-only).
class Job {
  public:
    Job() noexcept = default;
    template <class F>
    requires(!std::is_same_v<std::decay_t<F>, Job> && std::is_invocable_v<std::decay_t<F>&>)
        Job(F&& f)  // NOLINT: implicit, like std::function
        : p_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(f))) {}
    Job(Job&&) noexcept = default;
    Job& operator=(Job&&) noexcept = default;
    void operator()() { p_->run(); }
    explicit operator bool() const noexcept { return p_ != nullptr; }

  private:
    struct Base {
        virtual ~Base() = default;
        virtual void run() = 0;
    };
    template <class F>
    struct Impl final : Base {
        explicit Impl(F&& fn) : f(std::move(fn)) {}
        explicit Impl(const F& fn) : f(fn) {}
        void run() override { f(); }
        F f;
    };
    std::unique_ptr<Base> p_;
};

/// Runs jobs on threads of its own. Implement it to run handlers on a pool an application
/// already has. post() may be called from any thread, a progress thread included, and must not
/// run the job inline there (that is what binding to an executor avoids). A job dropped without
/// running destroys what it owns: a Request then answers its caller `internal`, so nobody hangs.
class Executor {
  public:
    virtual ~Executor() = default;
    virtual void post(Job job) = 0;
};

/// A fixed set of threads taking jobs in order from one queue. stop() (and the destructor)
/// runs the jobs already queued, then joins the threads; a post() after it began drops the job.
class ThreadPool final : public Executor {
  public:
    explicit ThreadPool(unsigned threads);
    ~ThreadPool() override { stop(); }
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    void post(Job job) override;
    /// Take no more jobs, run those queued, join the threads. Idempotent; not from a job.
    void stop() noexcept;
    [[nodiscard]] unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()); }
    /// Jobs queued and not started (a snapshot).
    [[nodiscard]] std::size_t queued() const;

  private:
    void run() noexcept;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace talaria

#pragma GCC visibility pop
