// PollSet: fd readiness with cookies, wake() from another thread, timeouts, remove/modify,
// nesting its fd in another epoll, and error reporting.
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "talaria/util/clock.hpp"
#include "talaria/util/poll_set.hpp"

namespace talaria {
namespace {

using namespace std::chrono_literals;

struct Pipe {
    int r = -1, w = -1;
    Pipe() {
        int fds[2];
        EXPECT_EQ(::pipe2(fds, O_NONBLOCK | O_CLOEXEC), 0);
        r = fds[0];
        w = fds[1];
    }
    ~Pipe() {
        if (r >= 0) ::close(r);
        if (w >= 0) ::close(w);
    }
    void put() const { ASSERT_EQ(::write(w, "x", 1), 1); }
    void take() const {
        char c;
        ASSERT_EQ(::read(r, &c, 1), 1);
    }
};

PollSet make() {
    auto ps = PollSet::create();
    EXPECT_TRUE(ps) << ps.error().describe();
    return std::move(ps).value();
}

TEST(PollSet, ReadinessWithCookie) {
    PollSet ps = make();
    Pipe a, b;
    int ca = 1, cb = 2;
    ASSERT_TRUE(ps.add(a.r, EPOLLIN, &ca));
    ASSERT_TRUE(ps.add(b.r, EPOLLIN, &cb));
    std::array<PollSet::Event, 8> ev;

    auto n = ps.wait(ev, 0);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, 0) << "nothing ready yet";

    b.put();
    n = ps.wait(ev, 5000);
    ASSERT_TRUE(n);
    ASSERT_EQ(*n, 1);
    EXPECT_EQ(ev[0].cookie, &cb);
    EXPECT_TRUE(ev[0].events & EPOLLIN);

    a.put();
    n = ps.wait(ev, 5000);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, 2) << "level-triggered: b is still readable";
    b.take();
    a.take();
    n = ps.wait(ev, 0);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, 0);
}

TEST(PollSet, SmallOutputSpan) {
    PollSet ps = make();
    Pipe a, b;
    int ca = 1, cb = 2;
    ASSERT_TRUE(ps.add(a.r, EPOLLIN, &ca));
    ASSERT_TRUE(ps.add(b.r, EPOLLIN, &cb));
    a.put();
    b.put();
    std::array<PollSet::Event, 1> one;
    auto n = ps.wait(one, 1000);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, 1) << "never writes past the span";
    EXPECT_TRUE(one[0].cookie == &ca || one[0].cookie == &cb);
    std::span<PollSet::Event> none;
    EXPECT_EQ(ps.wait(none, 0).code(), Errc::invalid_argument);
}

TEST(PollSet, TimeoutHonoured) {
    PollSet ps = make();
    std::array<PollSet::Event, 4> ev;
    auto t0 = Clock::now();
    auto n = ps.wait(ev, 100);
    auto elapsed = Clock::now() - t0;
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, 0);
    EXPECT_GE(elapsed, 95ms) << "returned before its timeout";
    EXPECT_LT(elapsed, 10s);

    t0 = Clock::now();
    n = ps.wait(ev, 0);
    ASSERT_TRUE(n);
    EXPECT_LT(Clock::now() - t0, 1s) << "timeout 0 must poll, not block";
}

TEST(PollSet, WakeFromAnotherThreadUnblocksWait) {
    PollSet ps = make();
    std::array<PollSet::Event, 4> ev;
    std::atomic<bool> woke{false};
    auto t0 = Clock::now();
    std::thread waker([&] {
        std::this_thread::sleep_for(50ms);
        woke.store(true);
        ps.wake();
    });
    // Waits "forever": only wake() can end it (the test timeout catches a hang). Spurious
    // returns are allowed, so loop until the waker has run.
    Result<int> n = 0;
    do {
        n = ps.wait(ev, -1);
        ASSERT_TRUE(n);
        EXPECT_EQ(*n, 0) << "a wake-up is not an fd event";
    } while (!woke.load());
    waker.join();
    EXPECT_LT(Clock::now() - t0, 10s);

    // The wake-up was consumed: the next wait times out.
    t0 = Clock::now();
    n = ps.wait(ev, 50);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, 0);
    EXPECT_GE(Clock::now() - t0, 45ms) << "stale wake-up not consumed";
}

TEST(PollSet, WakesCoalesceAndMixWithEvents) {
    PollSet ps = make();
    Pipe p;
    int c = 0;
    ASSERT_TRUE(ps.add(p.r, EPOLLIN, &c));
    ps.wake();
    ps.wake();
    ps.wake();
    p.put();
    std::array<PollSet::Event, 4> ev;
    auto n = ps.wait(ev, 1000);
    ASSERT_TRUE(n);
    ASSERT_EQ(*n, 1) << "the fd event is reported next to the wake-up";
    EXPECT_EQ(ev[0].cookie, &c);
    p.take();
    auto t0 = Clock::now();
    n = ps.wait(ev, 50);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, 0);
    EXPECT_GE(Clock::now() - t0, 45ms) << "wake-ups were not all consumed";
}

TEST(PollSet, RemoveAndModify) {
    PollSet ps = make();
    Pipe p;
    int c = 0, c2 = 0;
    ASSERT_TRUE(ps.add(p.r, EPOLLIN, &c));
    p.put();
    std::array<PollSet::Event, 4> ev;
    ASSERT_EQ(*ps.wait(ev, 1000), 1);
    ASSERT_TRUE(ps.remove(p.r));
    EXPECT_EQ(*ps.wait(ev, 0), 0) << "a removed fd reports nothing";
    EXPECT_EQ(ps.remove(p.r).code(), Errc::unreachable) << "ENOENT: not in the set";

    // The write end is writable: watch it, then switch its cookie and events.
    ASSERT_TRUE(ps.add(p.w, EPOLLOUT, &c));
    ASSERT_EQ(*ps.wait(ev, 1000), 1);
    EXPECT_EQ(ev[0].cookie, &c);
    EXPECT_TRUE(ev[0].events & EPOLLOUT);
    ASSERT_TRUE(ps.modify(p.w, EPOLLOUT, &c2));
    ASSERT_EQ(*ps.wait(ev, 1000), 1);
    EXPECT_EQ(ev[0].cookie, &c2);
    ASSERT_TRUE(ps.modify(p.w, 0, &c2));
    EXPECT_EQ(*ps.wait(ev, 0), 0);
}

TEST(PollSet, Errors) {
    PollSet ps = make();
    Pipe p;
    int c = 0;
    auto r = ps.add(p.r, EPOLLIN, nullptr);
    EXPECT_EQ(r.code(), Errc::invalid_argument) << "nullptr cookie is reserved";
    EXPECT_EQ(ps.modify(p.r, EPOLLIN, nullptr).code(), Errc::invalid_argument);
    ASSERT_TRUE(ps.add(p.r, EPOLLIN, &c));
    auto dup = ps.add(p.r, EPOLLIN, &c);
    EXPECT_EQ(dup.code(), Errc::already_exists);
    EXPECT_NE(dup.error().message().find("epoll_ctl(ADD)"), std::string::npos)
        << dup.error().message();
    EXPECT_FALSE(ps.add(-1, EPOLLIN, &c));
    EXPECT_EQ(ps.modify(p.w, EPOLLOUT, &c).code(), Errc::unreachable);
}

TEST(PollSet, NestedFdAndMove) {
    PollSet ps = make();
    Pipe p;
    int c = 0;
    ASSERT_TRUE(ps.add(p.r, EPOLLIN, &c));
    int outer = ::epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(outer, 0);
    epoll_event e{};
    e.events = EPOLLIN;
    ASSERT_EQ(::epoll_ctl(outer, EPOLL_CTL_ADD, ps.fd(), &e), 0);
    epoll_event got{};
    EXPECT_EQ(::epoll_wait(outer, &got, 1, 0), 0);
    p.put();
    EXPECT_EQ(::epoll_wait(outer, &got, 1, 1000), 1) << "fd() readable when a watched fd is";
    ::close(outer);

    int fd = ps.fd();
    PollSet moved(std::move(ps));
    EXPECT_EQ(moved.fd(), fd);
    EXPECT_EQ(ps.fd(), -1);  // NOLINT: moved-from
    std::array<PollSet::Event, 4> ev;
    ASSERT_EQ(*moved.wait(ev, 1000), 1);
    EXPECT_EQ(ev[0].cookie, &c);
    moved.wake();  // the wake-up eventfd moved too

    PollSet other = make();
    int replaced = other.fd();
    other = std::move(moved);
    EXPECT_EQ(other.fd(), fd);
    EXPECT_EQ(::fcntl(replaced, F_GETFD), -1) << "move assignment leaked the old epoll fd";
    ASSERT_EQ(*other.wait(ev, 1000), 1);
}

}  // namespace
}  // namespace talaria
