// The software matcher shared by tcp, ofi and ucx (src/na/base/matcher.hpp): order, routing of
// unexpected messages, expected matching on (source, tag), cancel, a context leaving, a dead
// peer, message storage reuse. The transports' own suites check it end to end.
#include "na/base/matcher.hpp"

#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

namespace talaria::na {
namespace {

struct TestOp : Op {
    std::byte* buf = nullptr;
    std::size_t cap = 0;
    Addr match_source;
    Tag match_tag = 0;
};

struct TestAddr final : AddrImpl {
    TestAddr() : AddrImpl(nullptr) {}
};

std::span<const std::byte> bytes(const std::string& s) {
    return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
std::string text(const QueuedMsg& m) {
    return {reinterpret_cast<const char*>(m.data.data()), m.data.size()};
}

class MatcherTest : public ::testing::Test {
  protected:
    void SetUp() override {
        auto t = open("inproc://matcher-test");
        ASSERT_TRUE(t) << t.error().describe();
        tp = std::move(*t);
        for (uint8_t id : {0, 1}) {
            auto c = tp->context_create(id);
            ASSERT_TRUE(c);
            ctx[id] = std::move(*c);
        }
        // Context 2 only moves bulk data: it takes no unexpected messages.
        auto c = tp->context_create(2, ContextOptions{.unexpected = false});
        ASSERT_TRUE(c);
        ctx[2] = std::move(*c);
        for (auto& c2 : ctx)
            m.attach(c2.get());
    }
    TestOp* op(uint8_t ctx_id, OpType type) {
        ops.push_back(std::make_unique<TestOp>());
        TestOp* o = ops.back().get();
        o->ctx = ctx[ctx_id].get();
        o->completion.type = type;
        return o;
    }
    void deliver(bool expected, uint8_t ctx_id, const Addr& src, Tag tag, const std::string& s) {
        bool none = false;
        TestOp* o = m.match(expected, ctx_id, src, tag, &none);
        ASSERT_FALSE(none);
        ASSERT_EQ(o, nullptr);
        ASSERT_EQ(m.queue_copy(expected, ctx_id, src, tag, bytes(s)), Queued::ok);
    }

    std::unique_ptr<Transport> tp;
    std::array<std::unique_ptr<Context>, 3> ctx;
    std::vector<std::unique_ptr<TestOp>> ops;  // outlives the matcher that links them
    Matcher<TestOp> m{4};
    Addr a{new TestAddr};
    Addr b{new TestAddr};
};

TEST_F(MatcherTest, UnexpectedMessagesWaitInArrivalOrderPerContext) {
    deliver(false, 0, a, 7, "first");
    deliver(false, 1, b, 8, "for ctx 1");
    deliver(false, 0, b, 9, "second");
    EXPECT_EQ(m.queued(), 3u);
    QueuedMsg* q = m.post_unexpected(0, op(0, OpType::recv_unexpected));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(text(*q), "first");
    EXPECT_EQ(q->source, a);
    EXPECT_EQ(q->tag, 7u);
    m.msg_free(q);
    q = m.post_unexpected(0, op(0, OpType::recv_unexpected));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(text(*q), "second");
    m.msg_free(q);
    // Context 0 has nothing more: its next receive waits; context 1's message is still there.
    TestOp* w = op(0, OpType::recv_unexpected);
    EXPECT_EQ(m.post_unexpected(0, w), nullptr);
    EXPECT_EQ(m.waiting(), 1u);
    q = m.post_unexpected(1, op(1, OpType::recv_unexpected));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(text(*q), "for ctx 1");
    m.msg_free(q);
}

TEST_F(MatcherTest, ReceivesPostedFirstTakeMessagesInPostOrder) {
    TestOp* r1 = op(1, OpType::recv_unexpected);
    TestOp* r2 = op(1, OpType::recv_unexpected);
    EXPECT_EQ(m.post_unexpected(1, r1), nullptr);
    EXPECT_EQ(m.post_unexpected(1, r2), nullptr);
    bool none = true;
    EXPECT_EQ(m.match(false, 0, a, 1, &none), nullptr);  // context 0 has none posted
    EXPECT_FALSE(none);
    EXPECT_EQ(m.match(false, 1, a, 1, &none), r1);
    EXPECT_EQ(m.match(false, 1, a, 1, &none), r2);
    EXPECT_EQ(m.match(false, 1, a, 1, &none), nullptr);
    EXPECT_EQ(m.waiting(), 0u);
}

TEST_F(MatcherTest, UnexpectedMessagesForMissingOrBulkContextsGoToTheLowestThatTakesThem) {
    TestOp* r0 = op(0, OpType::recv_unexpected);
    EXPECT_EQ(m.post_unexpected(0, r0), nullptr);
    bool none = true;
    // Context 9 does not exist: routed to 0, the message still names 9.
    EXPECT_EQ(m.match(false, 9, a, 1, &none), r0);
    EXPECT_FALSE(none);
    deliver(false, 2, a, 2, "for the bulk context");
    QueuedMsg* q = m.post_unexpected(0, op(0, OpType::recv_unexpected));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->context_id, 2u);
    m.msg_free(q);
    // Once no context takes unexpected messages, they are refused, not queued.
    m.detach(0, [](TestOp*) {});
    m.detach(1, [](TestOp*) {});
    EXPECT_EQ(m.match(false, 0, a, 1, &none), nullptr);
    EXPECT_TRUE(none);
    EXPECT_EQ(m.queue_copy(false, 0, a, 1, bytes("x")), Queued::no_context);
    EXPECT_EQ(m.refusal(Queued::no_context), "no context here takes unexpected messages");
    EXPECT_EQ(m.queued(), 0u);
}

TEST_F(MatcherTest, ExpectedMessagesMatchSourceAndTag) {
    TestOp* ra = op(0, OpType::recv_expected);
    TestOp* rb = op(1, OpType::recv_expected);
    EXPECT_EQ(m.post_expected(ra, a, 5), nullptr);
    EXPECT_EQ(m.post_expected(rb, b, 5), nullptr);
    EXPECT_EQ(ra->match_source, a);
    bool none = true;
    EXPECT_EQ(m.match(true, 0, a, 6, &none), nullptr);  // wrong tag
    EXPECT_FALSE(none);
    EXPECT_EQ(m.match(true, 0, b, 5, &none), rb);  // the context id plays no part
    EXPECT_EQ(m.match(true, 3, a, 5, &none), ra);
    // Early ones: a receive takes the first from its source with its tag.
    deliver(true, 0, a, 1, "a1");
    deliver(true, 0, b, 1, "b1");
    deliver(true, 0, a, 1, "a1 again");
    QueuedMsg* q = m.post_expected(op(0, OpType::recv_expected), b, 1);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(text(*q), "b1");
    m.msg_free(q);
    q = m.post_expected(op(0, OpType::recv_expected), a, 1);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(text(*q), "a1");
    m.msg_free(q);
    EXPECT_EQ(m.queued(), 1u);
}

TEST_F(MatcherTest, WithdrawRepostAndDeadPeers) {
    TestOp* u = op(0, OpType::recv_unexpected);
    TestOp* e1 = op(0, OpType::recv_expected);
    TestOp* e2 = op(1, OpType::recv_expected);
    TestOp* e3 = op(1, OpType::recv_expected);
    m.post_unexpected(0, u);
    m.post_expected(e1, a, 1);
    m.post_expected(e2, b, 1);
    m.post_expected(e3, a, 2);
    m.withdraw(u);
    m.withdraw(e1);
    EXPECT_EQ(m.waiting(), 2u);
    std::vector<TestOp*> failed;
    m.take_expected_from(a, [&](TestOp* o) { failed.push_back(o); });
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0], e3);
    // A receive that lost its message goes back first in line.
    TestOp* later = op(0, OpType::recv_unexpected);
    m.post_unexpected(0, later);
    EXPECT_TRUE(m.repost_front(u));
    bool none = false;
    EXPECT_EQ(m.match(false, 0, a, 1, &none), u);
    EXPECT_EQ(m.match(false, 0, a, 1, &none), later);
}

TEST_F(MatcherTest, DetachHandsBackTheContextsReceivesAndDropsItsMessages) {
    TestOp* u0 = op(0, OpType::recv_unexpected);
    TestOp* e0 = op(0, OpType::recv_expected);
    TestOp* e1 = op(1, OpType::recv_expected);
    m.post_unexpected(0, u0);
    m.post_expected(e0, a, 1);
    m.post_expected(e1, a, 1);
    deliver(false, 1, a, 3, "for 1");
    std::vector<TestOp*> back;
    m.detach(0, [&](TestOp* o) { back.push_back(o); });
    EXPECT_EQ(back, (std::vector<TestOp*>{u0, e0}));
    EXPECT_EQ(m.context(0), nullptr);
    EXPECT_FALSE(m.repost_front(u0));
    back.clear();
    m.detach(1, [&](TestOp* o) { back.push_back(o); });
    EXPECT_EQ(back, (std::vector<TestOp*>{e1}));
    EXPECT_EQ(m.queued(), 0u);
    EXPECT_EQ(m.waiting(), 0u);
}

TEST_F(MatcherTest, MessageStorageIsReusedAndReleasesItsSource) {
    deliver(false, 0, a, 1, "payload");
    EXPECT_EQ(a.impl()->ref_count(), 2u);
    QueuedMsg* first = m.post_unexpected(0, op(0, OpType::recv_unexpected));
    ASSERT_NE(first, nullptr);
    m.msg_free(first);
    EXPECT_EQ(a.impl()->ref_count(), 1u);
    deliver(false, 0, b, 1, "x");
    QueuedMsg* again = m.post_unexpected(0, op(0, OpType::recv_unexpected));
    EXPECT_EQ(again, first);  // from the free list: no allocation once warm
    m.msg_free(again);
}

TEST_F(MatcherTest, UnexpectedBacklogIsCountedAndChargesArePaidBack) {
    // The transport bounds what waits (tcp stops reading a connection): the matcher counts it,
    // and a message charged to its sender pays the charge back whichever way it leaves.
    std::atomic<std::size_t> charged{0};
    auto queue_charged = [&](uint8_t ctx_id, const std::string& s) {
        QueuedMsg* q = m.msg_alloc();
        q->source = a;
        q->context_id = ctx_id;
        auto payload = bytes(s);
        q->data.assign(payload.begin(), payload.end());
        Queued how = Queued::ok;
        ASSERT_EQ(m.match_or_queue(q, &how), nullptr);
        ASSERT_EQ(how, Queued::ok);
        q->charge = &charged;
        charged += s.size();
    };
    queue_charged(0, "abc");
    queue_charged(1, "defgh");
    deliver(false, 0, b, 1, "uncharged");
    deliver(true, 0, b, 2, "expected: not counted");
    EXPECT_EQ(m.unexpected_count(), 3u);
    EXPECT_EQ(m.unexpected_bytes(), 3u + 5u + 9u);
    EXPECT_EQ(charged.load(), 8u);
    // Taken by a receive: counted out at once, the charge paid back when freed.
    QueuedMsg* q = m.post_unexpected(0, op(0, OpType::recv_unexpected));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(m.unexpected_count(), 2u);
    EXPECT_EQ(m.unexpected_bytes(), 5u + 9u);
    m.msg_free(q);
    EXPECT_EQ(charged.load(), 5u);
    // Dropped with its context.
    m.detach(1, [](TestOp*) {});
    EXPECT_EQ(charged.load(), 0u);
    EXPECT_EQ(m.unexpected_count(), 1u);
    EXPECT_EQ(m.unexpected_bytes(), 9u);
    m.clear();
    EXPECT_EQ(m.unexpected_count(), 0u);
    EXPECT_EQ(m.unexpected_bytes(), 0u);
}

TEST_F(MatcherTest, EarlyExpectedMessagesAreBoundedByCountAndBytes) {
    // A peer sending expected messages nobody asked for cannot make the matcher hold memory
    // without a bound: past kMaxEarlyExpected messages the newest are refused.
    for (std::size_t i = 0; i < kMaxEarlyExpected; ++i)
        ASSERT_EQ(m.queue_copy(true, 0, a, Tag(i), bytes("x")), Queued::ok) << i;
    EXPECT_EQ(m.queue_copy(true, 0, a, 1, bytes("x")), Queued::full);
    EXPECT_NE(m.refusal(Queued::full).find("4096 early expected messages"), std::string::npos)
        << m.refusal(Queued::full);
    // Unexpected ones are not counted against it, and a receive taking one makes room.
    EXPECT_EQ(m.queue_copy(false, 0, a, 1, bytes("x")), Queued::ok);
    QueuedMsg* q = m.post_expected(op(0, OpType::recv_expected), a, 7);
    ASSERT_NE(q, nullptr);
    m.msg_free(q);
    EXPECT_EQ(m.queue_copy(true, 0, a, 7, bytes("x")), Queued::ok);
    m.clear();
    // By bytes: 64 KiB messages reach kMaxEarlyExpectedBytes first.
    std::string big(64 << 10, 'b');
    std::size_t n = 0;
    while (m.queue_copy(true, 0, b, Tag(n), bytes(big)) == Queued::ok)
        ++n;
    EXPECT_EQ(n, kMaxEarlyExpectedBytes / big.size());
    // A message read into storage first (tcp) is refused the same way, and freed.
    QueuedMsg* read = m.msg_alloc();
    read->source = b;
    read->expected = true;
    read->data.assign(big.size(), std::byte{1});
    Queued how = Queued::ok;
    EXPECT_EQ(m.match_or_queue(read, &how), nullptr);
    EXPECT_EQ(how, Queued::full);
}

TEST(CopyMessage, RefusesWhatDoesNotFit) {
    std::array<std::byte, 4> buf{};
    std::string s = "12345";
    EXPECT_EQ(copy_message(bytes(s).data(), 5, buf.data(), buf.size()), Errc::message_too_large);
    EXPECT_EQ(buf[0], std::byte{0});
    EXPECT_EQ(copy_message(bytes(s).data(), 4, buf.data(), buf.size()), Errc::ok);
    EXPECT_EQ(buf[3], std::byte{'4'});
    EXPECT_EQ(copy_message(nullptr, 0, nullptr, 0), Errc::ok);
}

TEST_F(MatcherTest, QueuedUnexpectedMessagesAreBoundedPerContextAndPerSender) {
    // ofi and ucx cannot hold a sender back: what they queue through queue_copy is bounded, by
    // count and bytes for all senders, and per sender through its charge, so that one peer's
    // flood drops its own messages and leaves room for the others'.
    std::atomic<std::size_t> from_a{0}, from_b{0};
    const std::string big(64 << 10, 'u');
    std::size_t n = 0;
    while (m.queue_copy(false, 0, a, 1, bytes(big), &from_a) == Queued::ok)
        ++n;
    EXPECT_EQ(n, kMaxQueuedUnexpectedPerPeer / big.size());
    EXPECT_EQ(from_a.load(), n * big.size());
    EXPECT_EQ(m.queue_copy(false, 0, a, 1, bytes(big), &from_a), Queued::peer_full);
    EXPECT_NE(m.refusal(Queued::peer_full).find("for one peer"), std::string::npos)
        << m.refusal(Queued::peer_full);
    // Another sender still gets in; a receive taking one of a's makes room for a again.
    EXPECT_EQ(m.queue_copy(false, 0, b, 1, bytes(big), &from_b), Queued::ok);
    QueuedMsg* q = m.post_unexpected(0, op(0, OpType::recv_unexpected));
    ASSERT_NE(q, nullptr);
    m.msg_free(q);
    EXPECT_EQ(m.queue_copy(false, 0, a, 1, bytes(big), &from_a), Queued::ok);
    m.clear();
    EXPECT_EQ(from_a.load(), 0u);
    EXPECT_EQ(from_b.load(), 0u);
    // By count, whoever sends: past kMaxQueuedUnexpected the newest are refused.
    for (std::size_t i = 0; i < kMaxQueuedUnexpected; ++i)
        ASSERT_EQ(m.queue_copy(false, 0, b, Tag(i), bytes("x")), Queued::ok) << i;
    EXPECT_EQ(m.queue_copy(false, 0, b, 1, bytes("x")), Queued::unexpected_full);
    EXPECT_NE(m.refusal(Queued::unexpected_full).find("8192 unexpected messages"),
              std::string::npos)
        << m.refusal(Queued::unexpected_full);
    EXPECT_EQ(m.unexpected_count(), kMaxQueuedUnexpected);
}

}  // namespace
}  // namespace talaria::na
