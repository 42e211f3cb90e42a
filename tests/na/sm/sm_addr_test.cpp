// sm address interning is weak: peers nobody uses are freed (by the amortized sweep), so a
// long-running endpoint fed ever new names does not grow, while a peer with an open
// connection stays.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "na/sm/sm_transport.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;

struct Endpoint {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Context> ctx;
    sm::SmTransport* st = nullptr;
    Endpoint() {
        auto r = open("sm://");
        EXPECT_TRUE(r) << r.error().describe();
        if (!r) return;
        t = std::move(*r);
        st = dynamic_cast<sm::SmTransport*>(t.get());
        EXPECT_NE(st, nullptr);
        auto c = t->context_create(0);
        EXPECT_TRUE(c);
        if (c) ctx = std::move(*c);
    }
    ~Endpoint() {
        ctx.reset();
        t.reset();
    }
    [[nodiscard]] std::string self() const { return t->addr_to_string(t->addr_self()); }
};

std::vector<std::byte> serialized(Transport& t, const Addr& a) {
    std::vector<std::byte> b(t.addr_serialize_size(a));
    auto n = t.addr_serialize(a, b);
    EXPECT_TRUE(n);
    return b;
}

// Unused peers are freed at the latest when the pinned set doubles (plus a floor of 64).
constexpr std::size_t kSlack = 2 * 64 + 2;

TEST(SmAddrIntern, DistinctAddressesDoNotAccumulate) {
    Endpoint a, feeder;
    ASSERT_TRUE(a.st && feeder.st);
    const std::size_t base = a.st->live_addrs();
    std::size_t most = 0, feeder_most = 0;
    for (int i = 0; i < 10000; ++i) {
        const std::string name = fmt::format("sm://intern-peer-{}", i);
        std::vector<std::byte> blob;
        {
            auto f = feeder.t->addr_lookup(name);
            ASSERT_TRUE(f) << f.error().describe();
            blob = serialized(*feeder.t, *f);
        }
        auto d = a.t->addr_deserialize(blob);
        ASSERT_TRUE(d) << d.error().describe();
        auto l = a.t->addr_lookup(name);
        ASSERT_TRUE(l);
        EXPECT_EQ(*d, *l);  // interned while held
        most = std::max(most, a.st->live_addrs());
        feeder_most = std::max(feeder_most, feeder.st->live_addrs());
    }
    EXPECT_LE(most, base + kSlack);
    EXPECT_LE(feeder_most, base + kSlack);
}

TEST(SmAddrIntern, SameAddressWhileHeld) {
    Endpoint a;
    ASSERT_TRUE(a.st);
    auto x = a.t->addr_lookup("sm://held-peer");
    ASSERT_TRUE(x);
    // Enough other lookups to run several sweeps: the held one must stay the same.
    for (int i = 0; i < 1000; ++i) {
        auto o = a.t->addr_lookup(fmt::format("sm://other-{}", i));
        ASSERT_TRUE(o);
    }
    auto y = a.t->addr_lookup("sm://held-peer");
    ASSERT_TRUE(y);
    EXPECT_EQ(*x, *y);
    auto z = a.t->addr_deserialize(serialized(*a.t, *x));
    ASSERT_TRUE(z);
    EXPECT_EQ(*x, *z);
    auto self = a.t->addr_lookup(a.self());
    ASSERT_TRUE(self);
    EXPECT_EQ(*self, a.t->addr_self());
    EXPECT_LE(a.st->live_addrs(), 3 + kSlack);
}

bool exchange(Endpoint& from, Endpoint& to, const Addr& dest, Tag tag, Addr* source) {
    auto m = from.t->msg_buf_alloc(8);
    auto r = to.t->msg_buf_alloc(8);
    if (!m || !r) return false;
    bool got = false, sent = false;
    if (!to.t->post_recv_unexpected(
            *to.ctx,
            [&](const Completion& c) {
                got = c.status == Errc::ok && c.tag == tag;
                *source = c.source;
            },
            *r))
        return false;
    if (!from.t->post_send_unexpected(
            *from.ctx, [&](const Completion& c) { sent = c.status == Errc::ok; }, *m, 8, dest, 0,
            tag))
        return false;
    auto end = Clock::now() + 10s;
    while (!(got && sent) && Clock::now() < end) {
        (void)from.ctx->progress(Duration::zero());
        from.ctx->trigger();
        (void)to.ctx->progress(Duration::zero());
        to.ctx->trigger();
    }
    return got && sent;
}

TEST(SmAddrIntern, ConnectedPeersSurviveSweepsAndStillWork) {
    Endpoint a, b;
    ASSERT_TRUE(a.st && b.st);
    Addr src;
    AddrImpl* b_at_a = nullptr;
    {
        auto dest = a.t->addr_lookup(b.self());
        ASSERT_TRUE(dest);
        b_at_a = dest->impl();
        ASSERT_TRUE(exchange(a, b, *dest, 1, &src));
    }
    auto a_at_b = b.t->addr_lookup(a.self());
    ASSERT_TRUE(a_at_b);
    EXPECT_EQ(src, *a_at_b);
    src.reset();
    a_at_b->reset();
    // Nobody holds b's address at a any more, but a's connection to b is open: sweeps keep it.
    for (int i = 0; i < 2000; ++i) {
        ASSERT_TRUE(a.t->addr_lookup(fmt::format("sm://sweep-{}", i)));
        ASSERT_TRUE(b.t->addr_lookup(fmt::format("sm://sweep-{}", i)));
    }
    auto dest = a.t->addr_lookup(b.self());
    ASSERT_TRUE(dest);
    EXPECT_EQ(dest->impl(), b_at_a);
    ASSERT_TRUE(exchange(a, b, *dest, 2, &src));
    auto again = b.t->addr_lookup(a.self());
    ASSERT_TRUE(again);
    EXPECT_EQ(src, *again);
    EXPECT_LE(a.st->live_addrs(), 3 + kSlack);
    EXPECT_LE(b.st->live_addrs(), 3 + kSlack);
}

TEST(SmAddrIntern, APostedExpectedReceiveKeepsItsSourceWithoutTheUsersAddr) {
    Endpoint a, b;
    ASSERT_TRUE(a.st && b.st);
    auto r = a.t->msg_buf_alloc(8);
    ASSERT_TRUE(r);
    Errc status = Errc::timeout;
    Addr source;
    {
        // Not connected yet: only the posted receive refers to b's address at a.
        auto from_b = a.t->addr_lookup(b.self());
        ASSERT_TRUE(from_b);
        ASSERT_TRUE(a.t->post_recv_expected(
            *a.ctx,
            [&](const Completion& c) {
                status = c.status;
                source = c.source;
            },
            *r, *from_b, 77));
    }
    for (int i = 0; i < 2000; ++i)  // several sweeps
        ASSERT_TRUE(a.t->addr_lookup(fmt::format("sm://sweep-x-{}", i)));
    auto to_a = b.t->addr_lookup(a.self());
    ASSERT_TRUE(to_a);
    auto m = b.t->msg_buf_alloc(8);
    ASSERT_TRUE(m);
    bool sent = false;
    ASSERT_TRUE(b.t->post_send_expected(
        *b.ctx, [&](const Completion& c) { sent = c.status == Errc::ok; }, *m, 8, *to_a, 0, 77));
    auto end = Clock::now() + 10s;
    while (!(sent && status != Errc::timeout) && Clock::now() < end) {
        (void)b.ctx->progress(Duration::zero());
        b.ctx->trigger();
        (void)a.ctx->progress(Duration::zero());
        a.ctx->trigger();
    }
    ASSERT_TRUE(sent);
    EXPECT_EQ(status, Errc::ok);
    auto again = a.t->addr_lookup(b.self());
    ASSERT_TRUE(again);
    EXPECT_EQ(source, *again);
}

TEST(SmAddrIntern, ThreadsLookUpAndDropConcurrently) {
    Endpoint a;
    ASSERT_TRUE(a.st);
    const std::size_t base = a.st->live_addrs();
    // Few names, many threads: lookups race with the destruction of the last reference, so a
    // lookup often finds a dying address and must replace it.
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 3000; ++i) {
                const std::string name = fmt::format("sm://racer-{}", (i + t) % 5);
                auto x = a.t->addr_lookup(name);
                auto y = a.t->addr_lookup(name);
                if (!x || !y || *x != *y || a.t->addr_to_string(*x) != name) ++mismatches;
            }
        });
    for (auto& th : threads)
        th.join();
    EXPECT_EQ(mismatches.load(), 0);
    EXPECT_LE(a.st->live_addrs(), base + kSlack);
}

}  // namespace
}  // namespace talaria::na
