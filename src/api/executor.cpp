// ThreadPool: the Executor the engine owns for handlers (Engine::handler_pool()) and that users
// may create for their own.
#include "talaria/api/executor.hpp"

#include <exception>

#include "talaria/util/log.hpp"

namespace talaria {

ThreadPool::ThreadPool(unsigned threads) {
    if (threads == 0) threads = 1;
    threads_.reserve(threads);
    for (unsigned i = 0; i < threads; ++i)
        threads_.emplace_back([this] { run(); });
}

void ThreadPool::stop() noexcept {
    {
        std::lock_guard g(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
}

void ThreadPool::post(Job job) {
    {
        std::lock_guard g(mu_);
        if (stopping_) {
            TALARIA_LOG(api, warn, "a job posted to a thread pool that is stopping was dropped");
            return;  // destroyed here, outside nothing: a Request it owns answers internal
        }
        jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
}

std::size_t ThreadPool::queued() const {
    std::lock_guard g(mu_);
    return jobs_.size();
}

void ThreadPool::run() noexcept {
    for (;;) {
        Job job;
        {
            std::unique_lock g(mu_);
            cv_.wait(g, [this] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // stopping, and everything queued has run
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        try {
            job();
        } catch (const std::exception& e) {
            TALARIA_LOG(api, error, "a thread pool job threw: {}", e.what());
        } catch (...) {
            TALARIA_LOG(api, error, "a thread pool job threw a non-standard exception");
        }
    }
}

}  // namespace talaria
