// Locks that lock only when enabled: one code path for the thread-safe and single-threaded
// modes of the na transports and the RPC core.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <sched.h>

#include <atomic>
#include <mutex>

#include "talaria/util/cpu.hpp"
#include "talaria/util/touch_trace.hpp"

namespace talaria {

/// A mutex that locks only when the owner is thread-safe.
class MaybeMutex {
  public:
    explicit MaybeMutex(bool enabled) noexcept : enabled_(enabled) {}
    void lock() {
        touch::note(this);
        if (enabled_) m_.lock();
    }
    void unlock() {
        if (enabled_) m_.unlock();
    }
    bool try_lock() {
        touch::note(this);
        return enabled_ ? m_.try_lock() : true;
    }
    [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  private:
    std::mutex m_;
    bool enabled_;
};

/// A spin lock that locks only when enabled, for critical sections of a few dozen instructions
/// that never block (completion queues, op pools, ring bookkeeping). Uncontended, lock() is one
/// atomic exchange and unlock() a plain release store: half the atomic read-modify-writes of a
/// std::mutex pair, which matters on a path taken several times per message. A waiter spins
/// briefly, then yields its CPU, so a holder preempted on a loaded machine still gets to run.
class MaybeSpinLock {
  public:
    explicit MaybeSpinLock(bool enabled) noexcept : enabled_(enabled) {}
    MaybeSpinLock(const MaybeSpinLock&) = delete;
    MaybeSpinLock& operator=(const MaybeSpinLock&) = delete;
    void lock() noexcept {
        touch::note(this);
        if (!enabled_) return;
        if (!locked_.exchange(true, std::memory_order_acquire)) [[likely]]
            return;
        lock_contended();
    }
    void unlock() noexcept {
        if (enabled_) locked_.store(false, std::memory_order_release);
    }
    bool try_lock() noexcept {
        touch::note(this);
        if (!enabled_) return true;
        return !locked_.load(std::memory_order_relaxed) &&
               !locked_.exchange(true, std::memory_order_acquire);
    }
    [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  private:
    void lock_contended() noexcept {
        for (unsigned spins = 0;; ++spins) {
            // Test before test-and-set: wait on a shared copy of the line, not by bouncing it.
            while (locked_.load(std::memory_order_relaxed)) {
                if (++spins < 128) {
                    cpu_relax();
                } else {
                    ::sched_yield();
                }
            }
            if (!locked_.exchange(true, std::memory_order_acquire)) return;
        }
    }

    std::atomic<bool> locked_{false};
    bool enabled_;
};

}  // namespace talaria

#pragma GCC visibility pop
