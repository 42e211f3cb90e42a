// Context: the completion queue every transport delivers into, and the blocking glue.
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <new>
#include <vector>

#include "na/base/op.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

// Cost per completion matters (several per message on a busy-polled round trip), so:
//  - `mu` is a spin lock (critical sections are a few pointer updates), absent when !thread_safe;
//  - `ready` (ops on cq) and `waiting` are written only under `mu`, with plain atomic stores:
//    enqueue() and prepare_block() both run under `mu`, so one of them sees the other's write
//    (the Dekker handshake that seq_cst read-modify-writes used to carry costs nothing extra);
//  - `waiting` counts the threads that may be asleep: each blocking progress() between its
//    prepare_block() and end_block(), plus one for a successful try_wait() (the program then
//    sleeps on wait_fd() itself), which the next progress() takes back (`try_armed`): the
//    program is awake again, and a completion no longer costs an eventfd write;
//  - trigger() takes the lock once per batch of completions, not once per completion.
/// An op queued by Context::post(): heap-allocated, freed when released.
struct UserOp final : Op, OpReleaser {
    void release(Op* op) noexcept override { delete static_cast<UserOp*>(op); }
};

namespace {
/// A completed user op for `ctx` carrying `cb`, or nullptr when out of memory.
Op* new_user_op(Context* ctx, Callback&& cb) noexcept {
    auto* op = new (std::nothrow) UserOp;
    if (!op) return nullptr;
    op->cb = std::move(cb);
    op->completion.type = OpType::user;
    op->ctx = ctx;
    op->releaser = op;
    op->completed = true;
    return op;
}
}  // namespace

struct Context::Impl {
    explicit Impl(bool thread_safe) : mu(thread_safe) {}
    MaybeSpinLock mu;
    IntrusiveList<Op> cq;
    std::atomic<std::size_t> ready{0};  ///< ops on cq (written under mu; read anywhere)
    std::atomic<std::size_t> batch{0};  ///< ops taken by trigger() whose callbacks have not run
    /// op_counts(), by OpType: written by the triggering thread only (one at a time, the
    /// Context's contract), so plain relaxed stores; read from any thread.
    struct Counted {
        std::atomic<uint64_t> ok{0}, failed{0}, canceled{0}, bytes{0};
    };
    std::array<Counted, OpCounts::kTypes> counted{};
    std::atomic<uint32_t> waiting{0};    ///< threads that may sleep (written under mu)
    std::atomic<bool> try_armed{false};  ///< try_wait() counted in `waiting` (under mu)
    int evfd = -1;
    int wait_epfd = -1;  // epoll over evfd, tfd and the transport's progress fd, for wait_fd()

    // Timers (post_at): a min-heap on `due` under mu. `next_due` mirrors its front (ns of
    // Clock, INT64_MAX when empty), so that progress() pays one load when there is none.
    struct Timer {
        int64_t due;
        Op* op;
    };
    static bool later(const Timer& a, const Timer& b) noexcept { return a.due > b.due; }
    std::vector<Timer> timers;
    std::atomic<int64_t> next_due{INT64_MAX};
    // Until when the thread now in a blocking progress() may sleep (ns of Clock; INT64_MIN when
    // none is). Set under mu before that thread reads next_due, read by post_at() under mu: a
    // timer posted earlier than it is either seen by progress() or nudges it awake.
    std::atomic<int64_t> sleep_until{INT64_MIN};
    int tfd = -1;  // a timerfd armed at next_due, in wait_epfd, for threads blocked in epoll

    /// Under mu: withdraw the sleeper a successful try_wait() counted, if it still counts.
    void drop_try_arm_locked() noexcept {
        if (!try_armed.load(std::memory_order_relaxed)) return;
        try_armed.store(false, std::memory_order_relaxed);
        waiting.store(waiting.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    }

    /// Under mu: publish the heap's front and arm the timerfd for it.
    void rearm_locked() noexcept {
        int64_t due = timers.empty() ? INT64_MAX : timers.front().due;
        next_due.store(due, std::memory_order_release);
        if (tfd < 0) return;
        itimerspec its{};
        if (due != INT64_MAX) {
            // 0 would disarm: a time already passed is armed as 1 ns (fires at once).
            int64_t at = due > 0 ? due : 1;
            its.it_value.tv_sec = at / 1000000000;
            its.it_value.tv_nsec = at % 1000000000;
        }
        ::timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, nullptr);
    }

    /// Queue the timers whose time has come; true if any was. The context's progressing thread
    /// calls it (no wake-up needed: that thread is awake).
    bool fire_due() noexcept {
        int64_t now = std::chrono::duration_cast<Duration>(Clock::now().time_since_epoch()).count();
        if (next_due.load(std::memory_order_acquire) > now) return false;
        bool any = false;
        {
            std::lock_guard g(mu);
            while (!timers.empty() && timers.front().due <= now) {
                std::pop_heap(timers.begin(), timers.end(), later);
                cq.push_back(*timers.back().op);
                timers.pop_back();
                any = true;
            }
            ready.store(cq.size(), std::memory_order_release);
            rearm_locked();
        }
        if (tfd >= 0) {
            uint64_t ticks;
            [[maybe_unused]] ssize_t r = ::read(tfd, &ticks, sizeof ticks);  // level: clear it
        }
        return any;
    }
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
    impl_->tfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (impl_->tfd < 0) {
        // post_at() still works for threads in progress(); only wait_fd() misses the timers.
        TALARIA_LOG(na, warn, "context {}: timerfd_create failed: errno {}", id, errno);
    } else {
        ev.data.fd = impl_->tfd;
        ::epoll_ctl(impl_->wait_epfd, EPOLL_CTL_ADD, impl_->tfd, &ev);
    }
}

Context::~Context() {
    // Completions never triggered and timers never due: release their ops without running
    // callbacks.
    while (Op* op = impl_->cq.pop_front())
        op->releaser->release(op);
    for (auto& t : impl_->timers)
        t.op->releaser->release(t.op);
    if (impl_->evfd >= 0) ::close(impl_->evfd);
    if (impl_->tfd >= 0) ::close(impl_->tfd);
    if (impl_->wait_epfd >= 0) ::close(impl_->wait_epfd);
}

Result<void> Context::progress(Duration timeout) {
    Impl& im = *impl_;
    if (im.try_armed.load(std::memory_order_relaxed)) [[unlikely]] {
        // The program that slept on wait_fd() after try_wait() is progressing: it is awake.
        {
            std::lock_guard g(im.mu);
            im.drop_try_arm_locked();
        }
        drain_event_fd();
    }
    if (has_completions()) return ok();
    if (timeout == Duration::zero()) [[likely]] {
        // Poll once (the busy-poll path): nothing sleeps, so no timer can be missed. With no
        // timer this costs one load (fire_due() would read the clock).
        if (im.next_due.load(std::memory_order_acquire) != INT64_MAX && im.fire_due()) return ok();
        return transport_->progress(*this, kPollOnce);
    }
    // May sleep. The transport's loop does not look at timers, so a timer posted from another
    // thread after we read next_due must wake us: publish our limit first, under the lock
    // post_at() holds (it nudges when its timer is due before the limit).
    TimePoint dl = deadline_after(timeout);
    int64_t due;
    {
        std::lock_guard g(im.mu);
        im.sleep_until.store(dl == TimePoint::max() ? INT64_MAX : dl.time_since_epoch().count(),
                             std::memory_order_relaxed);
        due = im.next_due.load(std::memory_order_relaxed);
    }
    struct Clear {
        Impl& im;
        ~Clear() { im.sleep_until.store(INT64_MIN, std::memory_order_relaxed); }
    } clear{im};
    if (due == INT64_MAX) return transport_->progress(*this, dl);
    // A timer is waiting: queue it if due, else sleep no later than its time.
    if (im.fire_due()) return ok();
    TimePoint at{Duration(due)};
    bool capped = at < dl;
    auto r = transport_->progress(*this, capped ? at : dl);
    if (!r && r.code() == Errc::timeout && capped) {
        im.fire_due();
        return ok();
    }
    return r;
}

namespace {

/// One writer: a relaxed load and store, no read-modify-write.
void bump(std::atomic<uint64_t>& v, uint64_t n) noexcept {
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

/// Count a completion in its context's op_counts() (`Im` is Context::Impl).
template <class Im>
void count(Im& im, const Completion& c) noexcept {
    auto& k = im.counted[std::size_t(c.type) < OpCounts::kTypes ? std::size_t(c.type)
                                                                : OpCounts::kTypes - 1];
    if (c.status == Errc::ok) {
        bump(k.ok, 1);
        bump(k.bytes, c.size);
    } else if (c.status == Errc::canceled) {
        bump(k.canceled, 1);
    } else {
        bump(k.failed, 1);
    }
}

/// Context::trigger() once something is queued (kept out of line: an idle busy-poll loop calls
/// trigger() between polls, and should pay one load for it). `Im` is Context::Impl.
template <class Im>
[[gnu::noinline]] unsigned run_completions(Im& im, unsigned max) {
    unsigned n = 0;
    IntrusiveList<Op> batch;
    // If a callback throws, the ops not yet run go back to the front of the queue, in order.
    struct Restore {
        Im& im;
        IntrusiveList<Op>& batch;
        ~Restore() {
            if (batch.empty()) return;
            std::lock_guard g(im.mu);
            batch.splice_back(im.cq);
            im.cq.splice_back(batch);
            im.ready.store(im.cq.size(), std::memory_order_release);
            im.batch.store(0, std::memory_order_relaxed);
        }
    } restore{im, batch};
    while (n < max) {
        if (im.ready.load(std::memory_order_acquire) == 0) break;
        // Take up to `max - n` completions under one lock (callbacks that complete further
        // operations add to the queue, and the next round takes those).
        {
            std::lock_guard g(im.mu);
            std::size_t k = std::min<std::size_t>(im.cq.size(), max - n);
            if (k == 0) break;  // another thread triggered it empty (outside the contract)
            if (k == im.cq.size()) {
                batch.splice_back(im.cq);
            } else {
                for (std::size_t i = 0; i < k; ++i)
                    batch.push_back(*im.cq.pop_front());
            }
            im.batch.store(k, std::memory_order_relaxed);
            im.ready.store(im.cq.size(), std::memory_order_relaxed);
        }
        while (Op* op = batch.pop_front()) {
            im.batch.store(batch.size(), std::memory_order_relaxed);
            // Move what the callback needs out of the op, give the op back, then call: the
            // callback may post new operations and reuse the slot.
            Callback cb = std::move(op->cb);
            Completion c = std::move(op->completion);
            op->releaser->release(op);
            count(im, c);
            if (cb) cb(c);
            ++n;
        }
    }
    return n;
}

}  // namespace

unsigned Context::trigger(unsigned max) {
    // The busy-poll loop calls this between polls: nothing queued costs one load.
    if (impl_->ready.load(std::memory_order_acquire) == 0 || max == 0) [[likely]]
        return 0;
    return run_completions(*impl_, max);
}

int Context::wait_fd() const noexcept {
    return impl_->wait_epfd;
}

bool Context::try_wait() {
    if (!prepare_block()) return false;
    if (impl_->next_due.load(std::memory_order_acquire) <=
        std::chrono::duration_cast<Duration>(Clock::now().time_since_epoch()).count()) {
        end_block();  // a timer is due: progress() queues it
        return false;
    }
    if (!transport_->try_wait_for(*this)) {
        end_block();
        return false;
    }
    // prepare_block() counted this caller; a try_wait() not yet taken back by a progress()
    // counted it already, so it counts once however often the program asks.
    Impl& im = *impl_;
    std::lock_guard g(im.mu);
    im.drop_try_arm_locked();
    im.try_armed.store(true, std::memory_order_relaxed);
    return true;
}

Result<void> Context::post(Callback cb) {
    Op* op = new_user_op(this, std::move(cb));
    if (!op) return Error{Errc::no_memory, "Context::post: out of memory"};
    enqueue(op);
    return ok();
}

Result<void> Context::post_at(TimePoint due, Callback cb) {
    Op* op = new_user_op(this, std::move(cb));
    if (!op) return Error{Errc::no_memory, "Context::post_at: out of memory"};
    int64_t at = std::chrono::duration_cast<Duration>(due.time_since_epoch()).count();
    Impl& im = *impl_;
    bool wake;
    {
        std::lock_guard g(im.mu);
        try {
            im.timers.push_back({at, op});
        } catch (const std::bad_alloc&) {
            op->releaser->release(op);
            return Error{Errc::no_memory, "Context::post_at: out of memory"};
        }
        std::push_heap(im.timers.begin(), im.timers.end(), Impl::later);
        bool front = im.timers.front().op == op;
        if (front) im.rearm_locked();
        // A thread in progress() chose how long to sleep before this timer existed (it may be
        // asleep already, or about to be: its transport loop does not look at timers).
        wake = front && at < im.sleep_until.load(std::memory_order_relaxed);
    }
    if (wake) {
        // Transports go back to sleep after a bare eventfd wake-up with nothing queued, so
        // queue an empty callback: progress() returns, and the next one sleeps until `due`.
        if (Op* nudge = new_user_op(this, Callback())) enqueue(nudge);
    }
    return ok();
}

std::size_t Context::timers_pending() const noexcept {
    std::lock_guard g(impl_->mu);
    return impl_->timers.size();
}

OpCounts Context::op_counts() const noexcept {
    OpCounts o;
    for (std::size_t i = 0; i < OpCounts::kTypes; ++i) {
        o.ok[i] = impl_->counted[i].ok.load(std::memory_order_relaxed);
        o.failed[i] = impl_->counted[i].failed.load(std::memory_order_relaxed);
        o.canceled[i] = impl_->counted[i].canceled.load(std::memory_order_relaxed);
        o.bytes[i] = impl_->counted[i].bytes.load(std::memory_order_relaxed);
    }
    return o;
}

bool Context::has_completions() const noexcept {
    return impl_->ready.load(std::memory_order_acquire) != 0 ||
           impl_->batch.load(std::memory_order_relaxed) != 0;
}

std::size_t Context::completion_count() const noexcept {
    return impl_->ready.load(std::memory_order_acquire) +
           impl_->batch.load(std::memory_order_relaxed);
}

void Context::enqueue(Op* op) noexcept {
    Impl& im = *impl_;
    bool wake;
    {
        std::lock_guard g(im.mu);
        im.cq.push_back(*op);
        im.ready.store(im.cq.size(), std::memory_order_release);
        wake = im.waiting.load(std::memory_order_relaxed) != 0;
    }
    if (wake) [[unlikely]] {
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
    // Under the lock enqueue() holds: either it ran first (we see its completion) or it runs
    // after us (it sees `waiting` and signals the eventfd).
    Impl& im = *impl_;
    std::lock_guard g(im.mu);
    if (im.ready.load(std::memory_order_relaxed) != 0) return false;
    im.waiting.store(im.waiting.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return true;
}

bool Context::watch_fd(int fd) noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return ::epoll_ctl(impl_->wait_epfd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

void Context::end_block() noexcept {
    Impl& im = *impl_;
    std::lock_guard g(im.mu);
    const uint32_t n = im.waiting.load(std::memory_order_relaxed);
    if (n != 0) im.waiting.store(n - 1, std::memory_order_relaxed);
}

}  // namespace talaria::na
