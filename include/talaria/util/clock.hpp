// Monotonic clock helpers. Durations are std::chrono; deadlines are steady_clock time points.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <chrono>
#include <cstdint>
#include <ctime>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

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

/// A cycle counter for timing hot paths (per-procedure latencies): the TSC on x86-64, the
/// virtual counter on AArch64, else now_ns(). About 11 ns on this project's VMs where
/// clock_gettime takes 26. Units are the counter's: convert differences with a TickScale.
/// x86-64 assumes an invariant TSC (constant_tsc and nonstop_tsc in /proc/cpuinfo: every x86
/// server CPU of the last decade), as Seastar's and DPDK's timers do.
inline uint64_t ticks() noexcept {
#if defined(__x86_64__)
    return __rdtsc();
#elif defined(__aarch64__)
    uint64_t v;
    asm volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return now_ns();
#endif
}

/// Ticks from `t` to now; 0 if the counter reads lower now (two CPUs' counters a little apart).
inline uint64_t ticks_since(uint64_t t) noexcept {
    const uint64_t now = ticks();
    return now > t ? now - t : 0;
}

/// Nanoseconds per tick, measured between two readings of both clocks: the first taken when
/// its owner starts (an engine's open), the second when a value is converted (statistics are
/// read). A reading less than kMinNs after the first waits for kMinNs. Each reading of
/// ns_per_tick() and of the constructor is the tightest of a few brackets (CLOCK_MONOTONIC,
/// counter, CLOCK_MONOTONIC), so a thread preempted between the two clocks does not skew the ratio.
class TickScale {
  public:
    static constexpr uint64_t kMinNs = 2'000'000;
    TickScale() noexcept { paired(ticks0_, ns0_); }
    [[nodiscard]] double ns_per_tick() const noexcept {
        uint64_t t = 0, ns = 0;
        paired(t, ns);
        while (ns - ns0_ < kMinNs)
            paired(t, ns);
        return t > ticks0_ ? double(ns - ns0_) / double(t - ticks0_) : 1.0;
    }
    /// The same without waiting and from one plain reading (it sizes the timing gap, where a
    /// skew is harmless): 0 while less than kMinNs passed since the first reading.
    [[nodiscard]] double ns_per_tick_if_ready() const noexcept {
        const uint64_t t = ticks(), ns = now_ns();
        if (ns - ns0_ < kMinNs || t <= ticks0_) return 0.0;
        return double(ns - ns0_) / double(t - ticks0_);
    }

  private:
    /// The counter read between two clock readings, the pair with the least time between them
    /// of kTries; `ns` is their midpoint.
    static void paired(uint64_t& t, uint64_t& ns) noexcept {
        constexpr int kTries = 4;
        uint64_t best = UINT64_MAX;
        for (int i = 0; i < kTries; ++i) {
            const uint64_t a = now_ns(), c = ticks(), b = now_ns();
            if (b - a < best) {
                best = b - a;
                t = c;
                ns = a + (b - a) / 2;
            }
        }
    }

    uint64_t ticks0_ = 0;
    uint64_t ns0_ = 0;
};

/// The deadline that means "poll once": progress(0) passes it, so the busy-poll path reads no
/// clock (clock_gettime is tens of nanoseconds on a VM: half a busy round trip).
inline constexpr TimePoint kPollOnce = TimePoint::min();

/// Has `deadline` passed? Reads the clock only for a real deadline (not kPollOnce, not "never").
inline bool deadline_passed(TimePoint deadline) noexcept {
    if (deadline == kPollOnce) return true;
    if (deadline == TimePoint::max()) return false;
    return Clock::now() >= deadline;
}

/// A deadline `timeout` from now; a negative timeout means "never", zero means kPollOnce. Saturates
/// (a huge timeout such as Duration::max() means "never" too, instead of wrapping into the past).
inline TimePoint deadline_after(Duration timeout) noexcept {
    if (timeout < Duration::zero()) return TimePoint::max();
    if (timeout == Duration::zero()) return kPollOnce;
    auto now = Clock::now();
    if (timeout >= TimePoint::max() - now) return TimePoint::max();
    return now + timeout;
}

/// Milliseconds left until `deadline`, rounded up, for epoll_wait: 0 if passed, -1 if never.
inline int ms_until(TimePoint deadline) noexcept {
    if (deadline == TimePoint::max()) return -1;
    if (deadline == kPollOnce) return 0;
    auto now = Clock::now();
    if (deadline <= now) return 0;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    int64_t ms = ns / 1000000 + (ns % 1000000 != 0);  // rounded up, cannot overflow
    return ms > 0x7fffffff ? 0x7fffffff : int(ms);
}

}  // namespace talaria

#pragma GCC visibility pop
