// talaria/util/thread_cache.hpp: one cache per thread, a singly linked free list per class.
#include "talaria/util/thread_cache.hpp"

#include <cstdint>

namespace talaria::thread_cache {

namespace {

struct Block {
    Block* next;
};

struct Cache {
    Block* head[kClasses] = {};
    uint32_t count[kClasses] = {};
    ~Cache();
};

// `dead` is trivially destructible, so it stays readable after `cache` is destroyed at thread
// exit: blocks freed later by the thread's other thread_local destructors go to the heap.
thread_local bool dead = false;
thread_local Cache cache;

Cache::~Cache() {
    dead = true;
    for (std::size_t c = 0; c < kClasses; ++c)
        while (Block* b = head[c]) {
            head[c] = b->next;
            ::operator delete(b);
        }
}

/// The class of a block of `n` bytes, or kClasses when it is too large to cache.
constexpr std::size_t class_of(std::size_t n) noexcept {
    return n == 0 ? 0 : (n - 1) / kGranule;
}

}  // namespace

void* allocate(std::size_t n) {
    std::size_t c = class_of(n);
    if (c < kClasses && !dead) {
        Cache& k = cache;
        if (Block* b = k.head[c]) {
            k.head[c] = b->next;
            --k.count[c];
            return b;
        }
        return ::operator new((c + 1) * kGranule);
    }
    return ::operator new(n);
}

void deallocate(void* p, std::size_t n) noexcept {
    std::size_t c = class_of(n);
    if (c < kClasses && !dead) {
        Cache& k = cache;
        if (k.count[c] < kMaxPerClass) {
            auto* b = static_cast<Block*>(p);
            b->next = k.head[c];
            k.head[c] = b;
            ++k.count[c];
            return;
        }
    }
    ::operator delete(p);
}

std::size_t cached() noexcept {
    if (dead) return 0;
    std::size_t n = 0;
    for (uint32_t x : cache.count)
        n += x;
    return n;
}

}  // namespace talaria::thread_cache
