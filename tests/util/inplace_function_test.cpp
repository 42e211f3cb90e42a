// InplaceFunction: move-only captures, exactly-once destruction, move construction and
// assignment, reset, reference and move-only arguments.
#include <array>
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "talaria/util/inplace_function.hpp"

namespace talaria {
namespace {

// Counts every live instance; each instance must be destroyed exactly once.
struct Probe {
    static inline int live = 0;
    static inline int destroyed = 0;
    bool alive = true;
    Probe() { ++live; }
    Probe(const Probe&) = delete;
    Probe(Probe&& o) noexcept {
        EXPECT_TRUE(o.alive) << "moved from a destroyed Probe";
        ++live;
    }
    ~Probe() {
        EXPECT_TRUE(alive) << "Probe destroyed twice";
        alive = false;
        --live;
        ++destroyed;
    }
    static void reset_counts() {
        live = 0;
        destroyed = 0;
    }
};

TEST(InplaceFunction, EmptyAndNull) {
    InplaceFunction<int()> f;
    EXPECT_FALSE(f);
    InplaceFunction<int()> g = nullptr;
    EXPECT_FALSE(g);
    InplaceFunction<int()> h = [] { return 3; };
    EXPECT_TRUE(h);
    EXPECT_EQ(h(), 3);
    h.reset();
    EXPECT_FALSE(h);
    h.reset();  // twice is fine
    EXPECT_FALSE(h);
}

TEST(InplaceFunction, MoveOnlyCapture) {
    auto p = std::make_unique<int>(41);
    InplaceFunction<int(int)> f = [q = std::move(p)](int x) { return *q + x; };
    EXPECT_EQ(f(1), 42);
    InplaceFunction<int(int)> g = std::move(f);
    EXPECT_FALSE(f);  // NOLINT: moved-from is specified empty
    EXPECT_EQ(g(2), 43);
    // State captured by value persists across calls (the callable is not copied per call).
    InplaceFunction<int()> counter = [n = 0]() mutable { return ++n; };
    EXPECT_EQ(counter(), 1);
    EXPECT_EQ(counter(), 2);
    InplaceFunction<int()> moved = std::move(counter);
    EXPECT_EQ(moved(), 3);
}

TEST(InplaceFunction, DestructionRunsExactlyOnce) {
    Probe::reset_counts();
    {
        InplaceFunction<void()> f = [p = Probe()] { (void)p; };
        EXPECT_EQ(Probe::live, 1);
        InplaceFunction<void()> g = std::move(f);
        EXPECT_EQ(Probe::live, 1) << "move must destroy the source callable";
        InplaceFunction<void()> h(std::move(g));
        EXPECT_EQ(Probe::live, 1);
        h();
    }
    EXPECT_EQ(Probe::live, 0);

    Probe::reset_counts();
    {
        InplaceFunction<void()> f = [p = Probe()] { (void)p; };
        int before = Probe::destroyed;
        f.reset();
        EXPECT_EQ(Probe::live, 0);
        EXPECT_EQ(Probe::destroyed, before + 1);
    }
    EXPECT_EQ(Probe::live, 0);
}

TEST(InplaceFunction, MoveAssignment) {
    Probe::reset_counts();
    int which = 0;
    {
        InplaceFunction<void()> a = [p = Probe(), &which] {
            (void)p;
            which = 1;
        };
        InplaceFunction<void()> b = [p = Probe(), &which] {
            (void)p;
            which = 2;
        };
        EXPECT_EQ(Probe::live, 2);
        a = std::move(b);  // a's old target destroyed, b's moved in
        EXPECT_EQ(Probe::live, 1);
        EXPECT_FALSE(b);  // NOLINT
        a();
        EXPECT_EQ(which, 2);

        // Self-move-assignment keeps the target.
        auto& alias = a;
        a = std::move(alias);
        EXPECT_TRUE(a);
        EXPECT_EQ(Probe::live, 1);
        a();
        EXPECT_EQ(which, 2);

        // Assigning an empty function empties the target and destroys its callable.
        InplaceFunction<void()> empty;
        a = std::move(empty);
        EXPECT_FALSE(a);
        EXPECT_EQ(Probe::live, 0);

        // Assigning a lambda directly.
        a = [&which] { which = 3; };
        a();
        EXPECT_EQ(which, 3);
    }
    EXPECT_EQ(Probe::live, 0);
}

TEST(InplaceFunction, ArgumentsAndReturn) {
    InplaceFunction<void(int&)> inc = [](int& x) { ++x; };
    int v = 1;
    inc(v);
    EXPECT_EQ(v, 2) << "reference arguments are passed by reference";

    InplaceFunction<std::string(const std::string&, std::string&&)> cat =
        [](const std::string& a, std::string&& b) { return a + std::move(b); };
    EXPECT_EQ(cat("ab", std::string("cd")), "abcd");

    InplaceFunction<int(std::unique_ptr<int>)> take = [](std::unique_ptr<int> p) { return *p; };
    EXPECT_EQ(take(std::make_unique<int>(9)), 9);

    // A plain function pointer works too.
    InplaceFunction<int(int)> fp = +[](int x) { return x * 3; };
    EXPECT_EQ(fp(5), 15);
}

TEST(InplaceFunction, CallableOfExactlyCapacityBytes) {
    std::array<unsigned char, 48> big{};
    big[47] = 7;
    InplaceFunction<int(), 48> f = [big] { return int(big[47]); };
    static_assert(sizeof(big) == 48);
    EXPECT_EQ(f(), 7);
    InplaceFunction<int(), 48> g = std::move(f);
    EXPECT_EQ(g(), 7);
}

}  // namespace
}  // namespace talaria
