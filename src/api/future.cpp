// The futex calls behind Future's hand-off (talaria/api/future.hpp, StateBase).
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

#include "talaria/api/future.hpp"

namespace talaria::detail {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

void futex_wait(const std::atomic<uint32_t>& word, uint32_t expected, TimePoint deadline) noexcept {
    timespec ts{};
    timespec* tp = nullptr;
    if (deadline != TimePoint::max()) {
        auto left = deadline - Clock::now();
        if (left <= Duration::zero()) return;
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        ts.tv_sec = static_cast<time_t>(ns / 1000000000);
        ts.tv_nsec = static_cast<long>(ns % 1000000000);
        tp = &ts;
    }
    // Returns at once when the word no longer holds `expected` (EAGAIN), on a wake-up, a
    // signal or the timeout: the caller re-checks the word in every case.
    ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, tp,
              nullptr, 0);
}

void futex_wake_all(const std::atomic<uint32_t>& word) noexcept {
    ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX,
              nullptr, nullptr, 0);
}

}  // namespace talaria::detail
