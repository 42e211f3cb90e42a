// inproc address interning is weak: addresses nobody holds are freed. What is specific to
// inproc: a queued message holds its source until it is received, and a receiving context
// keeps the senders it heard from (its lane's source aliases, as a connection would) until the
// sender's endpoint closes. The transport-independent
// part (distinct addresses do not accumulate, same Addr while held, concurrent lookups) is in
// tests/na/conformance/addr_lifetime_test.cpp.
#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "endpoint.hpp"
#include "harness.hpp"
#include "na/inproc/inproc.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;

using Endpoint = test::TransportEndpoint<inproc::InprocTransport>;

TEST(InprocAddrIntern, QueuedMessagesKeepTheirSourceAndTheSenderGoesWhenItCloses) {
    Endpoint a("inproc://addr-intern-rx");
    auto b = std::make_unique<Endpoint>("inproc://addr-intern-tx");
    ASSERT_TRUE(a.impl && b->impl);
    const std::size_t base = a.impl->live_addrs();
    {
        auto dest = b->t->addr_lookup("inproc://addr-intern-rx");
        ASSERT_TRUE(dest);
        auto m = b->t->msg_buf_alloc(8);
        ASSERT_TRUE(m);
        bool sent = false;
        ASSERT_TRUE(b->t->post_send_unexpected(
            *b->ctx, [&](const Completion& c) { sent = c.status == Errc::ok; }, *m, 8, *dest, 0,
            7));
        ASSERT_TRUE(test::progress_until(
            {b->ctx.get()}, [&] { return sent; }, 5s));
    }
    // The queued message holds its source on the receiver.
    EXPECT_EQ(a.impl->live_addrs(), base + 1);
    auto r = a.t->msg_buf_alloc(8);
    ASSERT_TRUE(r);
    Addr source;
    ASSERT_TRUE(a.t->post_recv_unexpected(
        *a.ctx, [&](const Completion& c) { source = c.source; }, *r));
    ASSERT_TRUE(test::progress_until(
        {a.ctx.get()}, [&] { return static_cast<bool>(source); }, 5s));
    auto l = a.t->addr_lookup("inproc://addr-intern-tx");
    ASSERT_TRUE(l);
    EXPECT_EQ(source, *l);
    source.reset();
    l->reset();
    // The receiving context still knows the sender (it would deliver its next message with the
    // same source) until the sender closes.
    EXPECT_EQ(a.impl->live_addrs(), base + 1);
    b.reset();
    EXPECT_EQ(a.impl->live_addrs(), base);
}

}  // namespace
}  // namespace talaria::na
