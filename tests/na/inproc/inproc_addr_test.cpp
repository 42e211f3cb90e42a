// inproc address interning is weak: addresses nobody holds are freed. What is specific to
// inproc: a queued message holds its source until it is received. The transport-independent
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

TEST(InprocAddrIntern, QueuedMessagesKeepTheirSourceAndReleaseItWhenReceived) {
    Endpoint a("inproc://addr-intern-rx");
    Endpoint b("inproc://addr-intern-tx");
    ASSERT_TRUE(a.impl && b.impl);
    const std::size_t base = a.impl->live_addrs();
    {
        auto dest = b.t->addr_lookup("inproc://addr-intern-rx");
        ASSERT_TRUE(dest);
        auto m = b.t->msg_buf_alloc(8);
        ASSERT_TRUE(m);
        bool sent = false;
        ASSERT_TRUE(b.t->post_send_unexpected(
            *b.ctx, [&](const Completion& c) { sent = c.status == Errc::ok; }, *m, 8, *dest, 0, 7));
        ASSERT_TRUE(test::progress_until(
            {b.ctx.get()}, [&] { return sent; }, 5s));
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
    EXPECT_EQ(a.impl->live_addrs(), base);
}

}  // namespace
}  // namespace talaria::na
