// sm address interning is weak: peers nobody uses are freed (by the amortized sweep), while a
// peer with an open connection or a posted receive stays. The transport-independent part
// (distinct addresses do not accumulate, same Addr while held, concurrent lookups) is in
// tests/na/conformance/addr_lifetime_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "endpoint.hpp"
#include "harness.hpp"
#include "na/sm/sm_transport.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;

using Endpoint = test::TransportEndpoint<sm::SmTransport>;

// Unused peers are freed at the latest when the pinned set doubles (plus a floor of 64).
constexpr std::size_t kSlack = 2 * 64 + 2;

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
    return test::progress_until({from.ctx.get(), to.ctx.get()}, [&] { return got && sent; });
}

TEST(SmAddrIntern, ConnectedPeersSurviveSweepsAndStillWork) {
    Endpoint a("sm://"), b("sm://");
    ASSERT_TRUE(a.impl && b.impl);
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
    EXPECT_LE(a.impl->live_addrs(), 3 + kSlack);
    EXPECT_LE(b.impl->live_addrs(), 3 + kSlack);
}

TEST(SmAddrIntern, APostedExpectedReceiveKeepsItsSourceWithoutTheUsersAddr) {
    Endpoint a("sm://"), b("sm://");
    ASSERT_TRUE(a.impl && b.impl);
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
    ASSERT_TRUE(test::progress_until({b.ctx.get(), a.ctx.get()},
                                     [&] { return sent && status != Errc::timeout; }));
    EXPECT_EQ(status, Errc::ok);
    auto again = a.t->addr_lookup(b.self());
    ASSERT_TRUE(again);
    EXPECT_EQ(source, *again);
}

}  // namespace
}  // namespace talaria::na
