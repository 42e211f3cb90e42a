// inproc address interning is weak: addresses nobody holds are freed, so a long-running
// endpoint (or a peer feeding it ever new serialized addresses) does not grow.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "na/inproc/inproc.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;

struct Endpoint {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Context> ctx;
    inproc::InprocTransport* it = nullptr;
    explicit Endpoint(const std::string& address) {
        auto r = open(address);
        EXPECT_TRUE(r) << r.error().describe();
        if (!r) return;
        t = std::move(*r);
        it = dynamic_cast<inproc::InprocTransport*>(t.get());
        EXPECT_NE(it, nullptr);
        auto c = t->context_create(0);
        EXPECT_TRUE(c);
        if (c) ctx = std::move(*c);
    }
    ~Endpoint() {
        ctx.reset();
        t.reset();
    }
};

std::vector<std::byte> serialized(Transport& t, const Addr& a) {
    std::vector<std::byte> b(t.addr_serialize_size(a));
    auto n = t.addr_serialize(a, b);
    EXPECT_TRUE(n);
    return b;
}

TEST(InprocAddrIntern, DistinctAddressesDoNotAccumulate) {
    Endpoint a("inproc://addr-intern-a");
    Endpoint feeder("inproc://addr-intern-feeder");
    ASSERT_TRUE(a.it && feeder.it);
    const std::size_t base = a.it->live_addrs();
    const std::size_t feeder_base = feeder.it->live_addrs();
    std::size_t most = 0;
    for (int i = 0; i < 10000; ++i) {
        std::vector<std::byte> blob;
        {
            auto f = feeder.t->addr_lookup(fmt::format("inproc://peer-{}", i));
            ASSERT_TRUE(f);
            blob = serialized(*feeder.t, *f);
        }
        auto d = a.t->addr_deserialize(blob);
        ASSERT_TRUE(d) << d.error().describe();
        auto l = a.t->addr_lookup(fmt::format("inproc://peer-{}", i));
        ASSERT_TRUE(l);
        EXPECT_EQ(*d, *l);  // interned while held
        most = std::max(most, a.it->live_addrs());
    }
    EXPECT_LE(most, base + 1);
    EXPECT_EQ(a.it->live_addrs(), base);
    EXPECT_EQ(feeder.it->live_addrs(), feeder_base);
}

TEST(InprocAddrIntern, SameAddressWhileHeldAndFreedAfter) {
    Endpoint a("inproc://addr-intern-held");
    ASSERT_TRUE(a.it);
    const std::size_t base = a.it->live_addrs();
    {
        auto x = a.t->addr_lookup("inproc://someone");
        ASSERT_TRUE(x);
        EXPECT_EQ(a.it->live_addrs(), base + 1);
        auto y = a.t->addr_lookup("inproc://someone");
        ASSERT_TRUE(y);
        EXPECT_EQ(*x, *y);
        auto z = a.t->addr_deserialize(serialized(*a.t, *x));
        ASSERT_TRUE(z);
        EXPECT_EQ(*x, *z);
        Addr self = a.t->addr_self();
        auto self2 = a.t->addr_lookup("inproc://addr-intern-held");
        ASSERT_TRUE(self2);
        EXPECT_EQ(self, *self2);
        EXPECT_EQ(a.it->live_addrs(), base + 2);
    }
    EXPECT_EQ(a.it->live_addrs(), base);
    // Looked up again after it was freed: a new, working address.
    auto again = a.t->addr_lookup("inproc://someone");
    ASSERT_TRUE(again);
    EXPECT_EQ(a.t->addr_to_string(*again), "inproc://someone");
}

TEST(InprocAddrIntern, QueuedMessagesKeepTheirSourceAndReleaseItWhenReceived) {
    Endpoint a("inproc://addr-intern-rx");
    Endpoint b("inproc://addr-intern-tx");
    ASSERT_TRUE(a.it && b.it);
    const std::size_t base = a.it->live_addrs();
    {
        auto dest = b.t->addr_lookup("inproc://addr-intern-rx");
        ASSERT_TRUE(dest);
        auto m = b.t->msg_buf_alloc(8);
        ASSERT_TRUE(m);
        bool sent = false;
        ASSERT_TRUE(b.t->post_send_unexpected(
            *b.ctx, [&](const Completion& c) { sent = c.status == Errc::ok; }, *m, 8, *dest, 0, 7));
        auto end = Clock::now() + 5s;
        while (!sent && Clock::now() < end) {
            (void)b.ctx->progress(1ms);
            b.ctx->trigger();
        }
        ASSERT_TRUE(sent);
    }
    // The queued message holds its source on the receiver.
    EXPECT_EQ(a.it->live_addrs(), base + 1);
    auto r = a.t->msg_buf_alloc(8);
    ASSERT_TRUE(r);
    Addr source;
    ASSERT_TRUE(a.t->post_recv_unexpected(
        *a.ctx, [&](const Completion& c) { source = c.source; }, *r));
    auto end = Clock::now() + 5s;
    while (!source && Clock::now() < end) {
        (void)a.ctx->progress(1ms);
        a.ctx->trigger();
    }
    ASSERT_TRUE(source);
    auto l = a.t->addr_lookup("inproc://addr-intern-tx");
    ASSERT_TRUE(l);
    EXPECT_EQ(source, *l);
    source.reset();
    l->reset();
    EXPECT_EQ(a.it->live_addrs(), base);
}

TEST(InprocAddrIntern, ThreadsLookUpAndDropConcurrently) {
    Endpoint a("inproc://addr-intern-threads");
    ASSERT_TRUE(a.it);
    const std::size_t base = a.it->live_addrs();
    // Few names, many threads: lookups race with the destruction of the last reference, so a
    // lookup often finds a dying address and must replace it.
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 3000; ++i) {
                const std::string name = fmt::format("inproc://racer-{}", (i + t) % 5);
                auto x = a.t->addr_lookup(name);
                auto y = a.t->addr_lookup(name);
                if (!x || !y || *x != *y || a.t->addr_to_string(*x) != name) ++mismatches;
            }
        });
    for (auto& th : threads)
        th.join();
    EXPECT_EQ(mismatches.load(), 0);
    EXPECT_EQ(a.it->live_addrs(), base);
}

}  // namespace
}  // namespace talaria::na
