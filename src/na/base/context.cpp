// Context: the completion queue every transport delivers into, and the blocking glue.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "na/base/op.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

struct Context::Impl {
    explicit Impl(bool thread_safe) : mu(thread_safe) {}
    MaybeMutex mu;
    IntrusiveList<Op> cq;
    std::atomic<std::size_t> ready{0};
    std::atomic<bool> waiting{false};
    int evfd = -1;
    int wait_epfd = -1;  // epoll over evfd + the transport's progress fd, for wait_fd()
};

Context::Context(Transport* t, uint8_t id, bool thread_safe)
    : transport_(t), id_(id), impl_(std::make_unique<Impl>(thread_safe)) {
    impl_->evfd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    impl_->wait_epfd = ::epoll_create1(EPOLL_CLOEXEC);
    if (impl_->evfd < 0 || impl_->wait_epfd < 0) {
        TALARIA_LOG(na, error, "context {}: eventfd/epoll_create1 failed: errno {}", id, errno);
        return;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = impl_->evfd;
    ::epoll_ctl(impl_->wait_epfd, EPOLL_CTL_ADD, impl_->evfd, &ev);
    int pfd = t->progress_fd();
    if (pfd >= 0) {
        ev.data.fd = pfd;
        ::epoll_ctl(impl_->wait_epfd, EPOLL_CTL_ADD, pfd, &ev);
    }
}

Context::~Context() {
    // Completions never triggered: release their ops without running callbacks.
    while (Op* op = impl_->cq.pop_front())
        op->releaser->release(op);
    if (impl_->evfd >= 0) ::close(impl_->evfd);
    if (impl_->wait_epfd >= 0) ::close(impl_->wait_epfd);
}

Result<void> Context::progress(Duration timeout) {
    if (has_completions()) return ok();
    return transport_->progress(*this, deadline_after(timeout));
}

unsigned Context::trigger(unsigned max) {
    unsigned n = 0;
    while (n < max) {
        if (impl_->ready.load(std::memory_order_acquire) == 0) break;
        impl_->mu.lock();
        Op* op = impl_->cq.pop_front();
        if (op) impl_->ready.fetch_sub(1, std::memory_order_relaxed);
        impl_->mu.unlock();
        if (!op) break;
        // Move what the callback needs out of the op, give the op back, then call: the callback
        // may post new operations and reuse the slot.
        Callback cb = std::move(op->cb);
        Completion c = std::move(op->completion);
        op->releaser->release(op);
        if (cb) cb(c);
        ++n;
    }
    return n;
}

int Context::wait_fd() const noexcept {
    return impl_->wait_epfd;
}

bool Context::try_wait() {
    if (!prepare_block()) return false;
    if (!transport_->try_wait()) {
        end_block();
        return false;
    }
    return true;
}

bool Context::has_completions() const noexcept {
    return impl_->ready.load(std::memory_order_acquire) != 0;
}

void Context::enqueue(Op* op) noexcept {
    impl_->mu.lock();
    impl_->cq.push_back(*op);
    impl_->ready.fetch_add(1, std::memory_order_seq_cst);
    impl_->mu.unlock();
    if (impl_->waiting.load(std::memory_order_seq_cst)) {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t r = ::write(impl_->evfd, &one, sizeof one);
    }
}

int Context::event_fd() const noexcept {
    return impl_->evfd;
}

void Context::drain_event_fd() noexcept {
    uint64_t v;
    while (::read(impl_->evfd, &v, sizeof v) > 0) {
    }
}

bool Context::prepare_block() noexcept {
    impl_->waiting.store(true, std::memory_order_seq_cst);
    if (impl_->ready.load(std::memory_order_seq_cst) != 0) {
        impl_->waiting.store(false, std::memory_order_relaxed);
        return false;
    }
    return true;
}

void Context::end_block() noexcept {
    impl_->waiting.store(false, std::memory_order_relaxed);
}

}  // namespace talaria::na
