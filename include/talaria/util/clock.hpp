// Monotonic clock helpers. Durations are std::chrono; deadlines are steady_clock time points.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

namespace talaria {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::nanoseconds;
using TimePoint = Clock::time_point;

/// Monotonic nanoseconds (CLOCK_MONOTONIC), cheap (vDSO).
inline uint64_t now_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

/// A deadline `timeout` from now; a negative timeout means "never".
inline TimePoint deadline_after(Duration timeout) noexcept {
    if (timeout < Duration::zero()) return TimePoint::max();
    return Clock::now() + timeout;
}

/// Milliseconds left until `deadline`, rounded up, for epoll_wait: 0 if passed, -1 if never.
inline int ms_until(TimePoint deadline) noexcept {
    if (deadline == TimePoint::max()) return -1;
    auto now = Clock::now();
    if (deadline <= now) return 0;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    int64_t ms = (ns + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : int(ms);
}

}  // namespace talaria
