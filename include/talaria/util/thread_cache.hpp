// Per-thread caches of small blocks, for objects made and dropped once per call (the api's call
// states): after warm-up a call takes its block from the calling thread's cache and gives it
// back to the cache of whichever thread drops it, so the call path makes no malloc/free and
// touches no cache line another thread writes. Memory moves between threads with the objects
// (a block freed on thread B joins B's cache); each cache keeps at most kMaxPerClass blocks per
// size class and frees the rest, so a one-way flow costs a free per block, never unbounded
// growth. A thread's cache is released when the thread exits. No lock, no process-wide state.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cstddef>
#include <new>

namespace talaria {

namespace thread_cache {
inline constexpr std::size_t kGranule = 64;       ///< size classes: 64, 128, ... bytes
inline constexpr std::size_t kClasses = 8;        ///< up to 512 bytes; larger: operator new
inline constexpr std::size_t kMaxPerClass = 512;  ///< blocks kept per class and thread

/// A block of at least `n` bytes (aligned for any object up to alignof(max_align_t)).
void* allocate(std::size_t n);
/// Give back a block from allocate(n) (same n), on any thread.
void deallocate(void* p, std::size_t n) noexcept;
/// Blocks cached by the calling thread (all classes), for tests.
std::size_t cached() noexcept;
}  // namespace thread_cache

/// An allocator over thread_cache, for std::allocate_shared.
template <class T>
struct ThreadCacheAllocator {
    using value_type = T;
    ThreadCacheAllocator() noexcept = default;
    template <class U>
    ThreadCacheAllocator(const ThreadCacheAllocator<U>&) noexcept {}  // NOLINT: rebind
    T* allocate(std::size_t n) {
        static_assert(alignof(T) <= alignof(std::max_align_t), "over-aligned type");
        return static_cast<T*>(thread_cache::allocate(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t n) noexcept { thread_cache::deallocate(p, n * sizeof(T)); }
    template <class U>
    bool operator==(const ThreadCacheAllocator<U>&) const noexcept {
        return true;
    }
};

}  // namespace talaria

#pragma GCC visibility pop
