// ObjectPool: fixed capacity, back-pressure by nullptr, slot reuse, owns().
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "talaria/util/pool.hpp"

namespace talaria {
namespace {

struct Tracked {
    static inline int live = 0;
    static inline int destroyed = 0;
    std::string name;
    int value;
    Tracked(std::string n, int v) : name(std::move(n)), value(v) { ++live; }
    ~Tracked() {
        --live;
        ++destroyed;
    }
};

TEST(ObjectPool, CapacityAndExhaustion) {
    ObjectPool<int> pool(3);
    EXPECT_EQ(pool.capacity(), 3u);
    EXPECT_EQ(pool.available(), 3u);
    int* a = pool.acquire(1);
    int* b = pool.acquire(2);
    int* c = pool.acquire(3);
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(pool.in_use(), 3u);
    EXPECT_EQ(pool.available(), 0u);
    EXPECT_EQ(pool.acquire(4), nullptr) << "exhausted pool must report back-pressure";
    EXPECT_EQ(pool.in_use(), 3u);
    EXPECT_EQ(*a + *b + *c, 6);
    std::set<int*> distinct{a, b, c};
    EXPECT_EQ(distinct.size(), 3u);
    pool.release(b);
    EXPECT_EQ(pool.available(), 1u);
    int* d = pool.acquire(5);
    EXPECT_EQ(d, b) << "the freed slot is reused";
    EXPECT_EQ(*d, 5);
    EXPECT_EQ(pool.acquire(6), nullptr);
    pool.release(a);
    pool.release(c);
    pool.release(d);
    EXPECT_EQ(pool.in_use(), 0u);
}

TEST(ObjectPool, AcquireDefaultRunsMemberInitializers) {
    struct WithInit {
        int a = 7;
        std::string s = "init";
        uint64_t raw;  // left indeterminate by acquire_default(): never read here
    };
    ObjectPool<WithInit> pool(2);
    WithInit* x = pool.acquire_default();
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(x->a, 7);
    EXPECT_EQ(x->s, "init");
    x->a = 1;
    x->s = "dirty";
    WithInit* y = pool.acquire_default();
    ASSERT_NE(y, nullptr);
    EXPECT_EQ(pool.acquire_default(), nullptr) << "exhausted pool must report back-pressure";
    pool.release(x);
    WithInit* z = pool.acquire_default();
    EXPECT_EQ(z, x) << "the freed slot is reused";
    EXPECT_EQ(z->a, 7) << "a reused slot is initialized afresh";
    EXPECT_EQ(z->s, "init");
    pool.release(y);
    pool.release(z);
    EXPECT_EQ(pool.in_use(), 0u);
}

TEST(ObjectPool, ZeroCapacity) {
    ObjectPool<int> pool(0);
    EXPECT_EQ(pool.acquire(1), nullptr);
    EXPECT_EQ(pool.available(), 0u);
    int x = 0;
    EXPECT_FALSE(pool.owns(&x));
}

TEST(ObjectPool, ConstructsAndDestroys) {
    Tracked::live = 0;
    Tracked::destroyed = 0;
    {
        ObjectPool<Tracked> pool(2);
        Tracked* t = pool.acquire("first", 7);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->name, "first");
        EXPECT_EQ(t->value, 7);
        EXPECT_EQ(Tracked::live, 1);
        pool.release(t);
        EXPECT_EQ(Tracked::live, 0);
        EXPECT_EQ(Tracked::destroyed, 1);
        // Reused slot gets a freshly constructed object (no stale state).
        Tracked* u = pool.acquire(std::string(64, 'x'), 9);
        EXPECT_EQ(u, t);
        EXPECT_EQ(u->name, std::string(64, 'x'));
        EXPECT_EQ(u->value, 9);
        pool.release(u);
    }
    EXPECT_EQ(Tracked::live, 0);
    EXPECT_EQ(Tracked::destroyed, 2);
}

TEST(ObjectPool, Owns) {
    ObjectPool<uint64_t> pool(4);
    ObjectPool<uint64_t> other(4);
    uint64_t* p = pool.acquire(1u);
    uint64_t* q = other.acquire(2u);
    EXPECT_TRUE(pool.owns(p));
    EXPECT_FALSE(pool.owns(q));
    EXPECT_TRUE(other.owns(q));
    uint64_t local = 0;
    EXPECT_FALSE(pool.owns(&local));
    EXPECT_FALSE(pool.owns(nullptr));
    // A pointer into the middle of a slot is not an object of the pool.
    auto* mid = reinterpret_cast<const uint64_t*>(reinterpret_cast<const unsigned char*>(p) + 1);
    EXPECT_FALSE(pool.owns(mid));
    // One past the last slot is not owned either.
    std::vector<uint64_t*> all{p};
    while (auto* r = pool.acquire(0u))
        all.push_back(r);
    uint64_t* hi = *std::max_element(all.begin(), all.end());
    EXPECT_TRUE(pool.owns(hi));
    EXPECT_FALSE(pool.owns(hi + 1));
    for (auto* r : all)
        pool.release(r);
    other.release(q);
}

TEST(ObjectPool, OverAlignedType) {
    struct alignas(64) Line {
        unsigned char bytes[64];
    };
    ObjectPool<Line> pool(5);
    std::vector<Line*> v;
    while (Line* l = pool.acquire())
        v.push_back(l);
    ASSERT_EQ(v.size(), 5u);
    for (Line* l : v) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(l) % 64, 0u);
        EXPECT_TRUE(pool.owns(l));
    }
    for (Line* l : v)
        pool.release(l);
}

TEST(ObjectPool, ChurnKeepsEveryObjectIntact) {
    constexpr std::size_t kCap = 64;
    ObjectPool<std::pair<uint64_t, uint64_t>> pool(kCap);
    std::vector<std::pair<uint64_t, uint64_t>*> held;
    uint64_t seq = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int round = 0; round < 20000; ++round) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if ((rng & 1) && !held.empty()) {
            std::size_t i = (rng >> 8) % held.size();
            auto* o = held[i];
            ASSERT_EQ(o->first, ~o->second) << "object overwritten while in use";
            pool.release(o);
            held[i] = held.back();
            held.pop_back();
        } else if (auto* o = pool.acquire(seq, ~seq)) {
            ++seq;
            held.push_back(o);
        } else {
            ASSERT_EQ(held.size(), kCap);
        }
        ASSERT_EQ(pool.in_use(), held.size());
    }
    for (auto* o : held)
        pool.release(o);
}

}  // namespace
}  // namespace talaria
