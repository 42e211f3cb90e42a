// Clock helpers: deadline_after (negative = never, no overflow for huge timeouts) and ms_until
// (rounded up, 0 when passed, -1 for never, clamped to int).
#include <chrono>
#include <climits>

#include <gtest/gtest.h>

#include "talaria/util/clock.hpp"

namespace talaria {
namespace {

using namespace std::chrono_literals;

TEST(Clock, NowNsIsSteadyClock) {
    uint64_t a = now_ns();
    auto b = uint64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count());
    uint64_t c = now_ns();
    EXPECT_LE(a, b);
    EXPECT_LE(b, c);
    EXPECT_LE(a, c);
}

TEST(Clock, DeadlineAfter) {
    EXPECT_EQ(deadline_after(-1ns), TimePoint::max());
    EXPECT_EQ(deadline_after(-1h), TimePoint::max());
    // Zero means "poll once", recognised without reading the clock.
    auto before = Clock::now();
    auto d0 = deadline_after(0ns);
    EXPECT_EQ(d0, kPollOnce);
    EXPECT_TRUE(deadline_passed(d0));
    EXPECT_EQ(ms_until(d0), 0);
    EXPECT_FALSE(deadline_passed(TimePoint::max()));
    EXPECT_FALSE(deadline_passed(deadline_after(1h)));
    EXPECT_TRUE(deadline_passed(before));
    auto d1 = deadline_after(1s);
    EXPECT_GE(d1, before + 1s);
    EXPECT_LE(d1, Clock::now() + 1s);
}

TEST(Clock, HugeTimeoutsDoNotWrapIntoThePast) {
    // "Wait practically forever" must never overflow into a deadline in the past (which would
    // turn a blocking progress() into a poll).
    auto now = Clock::now();
    EXPECT_GT(deadline_after(Duration::max()), now);
    EXPECT_EQ(deadline_after(Duration::max()), TimePoint::max());
    EXPECT_GT(deadline_after(std::chrono::duration_cast<Duration>(std::chrono::hours(2'000'000))),
              now);
    EXPECT_EQ(ms_until(deadline_after(Duration::max())), -1);
}

TEST(Clock, MsUntilSpecialValues) {
    EXPECT_EQ(ms_until(TimePoint::max()), -1);
    EXPECT_EQ(ms_until(Clock::now() - 1s), 0);
    EXPECT_EQ(ms_until(TimePoint::min()), 0);
    EXPECT_EQ(ms_until(Clock::now()), 0);
    // Far (but not infinite) deadlines clamp to INT_MAX ms without overflowing.
    EXPECT_EQ(ms_until(Clock::now() + std::chrono::hours(24 * 365)), INT_MAX);
    EXPECT_EQ(ms_until(TimePoint::max() - 1ns), INT_MAX);
    EXPECT_EQ(ms_until(TimePoint::max() - 1s), INT_MAX);
}

TEST(Clock, MsUntilRoundsUp) {
    for (int i = 0; i < 100; ++i) {
        // A deadline that has not passed must never yield 0 (epoll would spin).
        auto d = Clock::now() + 100us;
        int r = ms_until(d);
        auto after = Clock::now();
        if (r == 0) {
            EXPECT_GE(after, d) << "0 ms returned for a deadline still ahead";
        }
        EXPECT_LE(r, 1);

        auto start = Clock::now();
        d = start + 2500us;
        r = ms_until(d);
        auto spent = Clock::now() - start;
        EXPECT_GE(r, 1);
        EXPECT_LE(r, 3);
        if (spent < 400us) {
            EXPECT_EQ(r, 3) << "2.5 ms must round up to 3";
        }

        start = Clock::now();
        d = start + 7ms;
        r = ms_until(d);
        spent = Clock::now() - start;
        if (spent < 900us) {
            EXPECT_EQ(r, 7) << "exact milliseconds stay exact";
        }
    }
}

}  // namespace
}  // namespace talaria
