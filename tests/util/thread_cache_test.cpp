// thread_cache: blocks are reused by size class on the thread that freed them, capped per class.
#include "talaria/util/thread_cache.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

namespace talaria {
namespace {

TEST(ThreadCache, ReusesAFreedBlockOfTheSameClass) {
    void* a = thread_cache::allocate(40);
    thread_cache::deallocate(a, 40);
    std::size_t before = thread_cache::cached();
    EXPECT_GE(before, 1u);
    void* b = thread_cache::allocate(64);  // same class (<= 64 bytes)
    EXPECT_EQ(a, b);
    EXPECT_EQ(thread_cache::cached(), before - 1);
    void* c = thread_cache::allocate(65);  // the next class: not that block
    EXPECT_NE(c, b);
    thread_cache::deallocate(b, 64);
    thread_cache::deallocate(c, 65);
}

TEST(ThreadCache, LargeBlocksAreNotCached) {
    std::size_t before = thread_cache::cached();
    void* p = thread_cache::allocate(4096);
    thread_cache::deallocate(p, 4096);
    EXPECT_EQ(thread_cache::cached(), before);
}

TEST(ThreadCache, KeepsAtMostTheCapPerClass) {
    // On a fresh thread (an empty cache): the blocks beyond the cap go back to the heap.
    std::size_t kept = 0;
    std::thread t([&] {
        std::vector<void*> v;
        for (std::size_t i = 0; i < thread_cache::kMaxPerClass + 100; ++i)
            v.push_back(thread_cache::allocate(200));
        for (void* p : v)
            thread_cache::deallocate(p, 200);
        kept = thread_cache::cached();
    });
    t.join();
    EXPECT_EQ(kept, thread_cache::kMaxPerClass);
}

TEST(ThreadCache, BlockFreedOnAnotherThreadJoinsThatThreadsCache) {
    void* p = thread_cache::allocate(100);
    std::size_t here = thread_cache::cached();
    std::size_t there = 0;
    void* again = nullptr;
    std::thread t([&] {
        thread_cache::deallocate(p, 100);
        there = thread_cache::cached();
        again = thread_cache::allocate(100);
        thread_cache::deallocate(again, 100);
    });
    t.join();  // the thread's cache is released at its exit (LeakSanitizer checks it)
    EXPECT_EQ(there, 1u);
    EXPECT_EQ(again, p);
    EXPECT_EQ(thread_cache::cached(), here);
}

TEST(ThreadCache, AllocateSharedThroughTheAllocator) {
    struct Obj {
        int x[10];
    };
    std::weak_ptr<Obj> w;
    {
        auto s = std::allocate_shared<Obj>(ThreadCacheAllocator<Obj>{});
        s->x[9] = 7;
        w = s;
    }
    EXPECT_TRUE(w.expired());
    auto s2 = std::allocate_shared<Obj>(ThreadCacheAllocator<Obj>{});
    EXPECT_EQ(s2.use_count(), 1);
}

}  // namespace
}  // namespace talaria
