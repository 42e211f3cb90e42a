// inproc-specific tests: naming, closed and unknown peers, memory-handle validation, and the
// fault-injection API. The behaviour every transport shares is in tests/na/conformance.
#include <poll.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness.hpp"
#include "na/inproc/inproc_faults.hpp"

namespace talaria::na::test {
namespace {

struct Ep {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Context> ctx;
    explicit Ep(const std::string& address = "inproc://") {
        auto r = na::open(address);
        EXPECT_TRUE(r) << r.error().describe();
        if (!r) return;
        t = std::move(*r);
        auto c = t->context_create(0);
        EXPECT_TRUE(c) << c.error().describe();
        if (c) ctx = std::move(*c);
    }
    Ep(Ep&&) = default;
    ~Ep() { close(); }
    void close() {
        ctx.reset();
        t.reset();
    }
    [[nodiscard]] std::string name() const { return t->addr_to_string(t->addr_self()); }
    Addr lookup(const Ep& other) const {
        auto r = t->addr_lookup(other.name());
        EXPECT_TRUE(r);
        return r ? *r : Addr{};
    }
};

Errc finish(std::initializer_list<Context*> ctxs, Result<OpId> id, Recorder& r,
            Duration timeout = 5s) {
    if (!id) return id.code();
    if (!progress_until(
            ctxs, [&] { return r.done(); }, timeout))
        return Errc::timeout;
    return r.last.status;
}

TEST(Inproc, OpenNamesAndDuplicates) {
    Ep a("inproc://inproc-test-a");
    ASSERT_TRUE(a.t);
    EXPECT_EQ(a.name(), "inproc://inproc-test-a");
    auto dup = na::open("inproc://inproc-test-a");
    ASSERT_FALSE(dup);
    EXPECT_EQ(dup.error().code(), Errc::address_in_use);
    EXPECT_FALSE(na::open("inproc://bad name"));
    EXPECT_FALSE(na::open("inproc://" + std::string(129, 'x')));
    Ep anon1, anon2;
    EXPECT_NE(anon1.name(), anon2.name());
    // A closed name can be opened again.
    a.close();
    Ep again("inproc://inproc-test-a");
    EXPECT_TRUE(again.t);
    // Context ids.
    EXPECT_EQ(again.t->context_create(16).code(), Errc::invalid_argument);
    EXPECT_EQ(again.t->context_create(0).code(), Errc::already_exists);
}

TEST(Inproc, UnknownNameFailsAtFirstUseWithUnreachable) {
    Ep a;
    auto nobody = a.t->addr_lookup("inproc://nobody-is-here");
    ASSERT_TRUE(nobody) << "lookup must not fail for a well-formed name";
    MsgBuffer b = alloc_buf(*a.t, 8);
    Recorder r1, r2, r3;
    EXPECT_EQ(finish({a.ctx.get()},
                     a.t->post_send_unexpected(*a.ctx, record(r1), b, 8, *nobody, 0, 1), r1),
              Errc::unreachable);
    EXPECT_EQ(finish({a.ctx.get()}, a.t->post_recv_expected(*a.ctx, record(r2), b, *nobody, 1), r2),
              Errc::unreachable);
    std::vector<std::byte> mem(64);
    auto lh = a.t->mem_register(mem.data(), mem.size(), Access::read_write);
    ASSERT_TRUE(lh);
    EXPECT_EQ(
        finish({a.ctx.get()}, a.t->post_put(*a.ctx, record(r3), *lh, 0, *lh, 0, 8, *nobody), r3),
        Errc::unreachable);
}

TEST(Inproc, ClosedPeerFailsPendingReceiveWithDisconnected) {
    Ep a;
    auto b = std::make_unique<Ep>();
    Addr ab = a.lookup(*b);
    MsgBuffer buf = alloc_buf(*a.t, 8);
    // Talk once, so that a knows b.
    Recorder s0;
    ASSERT_EQ(
        finish({a.ctx.get()}, a.t->post_send_unexpected(*a.ctx, record(s0), buf, 8, ab, 0, 1), s0),
        Errc::ok);
    Recorder rr;
    auto id = a.t->post_recv_expected(*a.ctx, record(rr), buf, ab, 5);
    ASSERT_TRUE(id);
    progress_for({a.ctx.get()}, 10ms);
    EXPECT_FALSE(rr.done());
    b.reset();  // the peer goes away
    ASSERT_TRUE(progress_until(
        {a.ctx.get()}, [&] { return rr.done(); }, 2s));
    EXPECT_EQ(rr.last.status, Errc::disconnected);
    Recorder s1, r2;
    EXPECT_EQ(
        finish({a.ctx.get()}, a.t->post_send_unexpected(*a.ctx, record(s1), buf, 8, ab, 0, 1), s1),
        Errc::disconnected);
    EXPECT_EQ(finish({a.ctx.get()}, a.t->post_recv_expected(*a.ctx, record(r2), buf, ab, 5), r2),
              Errc::disconnected);
}

TEST(Inproc, MessageToMissingContextGoesToLowestContext) {
    Ep a, b;
    Addr ab = a.lookup(b);
    MsgBuffer s = alloc_buf(*a.t, 8), r = alloc_buf(*b.t, 8), r2 = alloc_buf(*b.t, 8);
    Recorder s1, s2, rr, rr2;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr), r));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(s1), s, 8, ab, 3, 1));  // no context 3
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(s2), s, 8, ab, 0, 2));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()},
                               [&] { return s1.done() && s2.done() && rr.done(); }));
    // Context 0 takes it, and the completion names the context the sender asked for.
    EXPECT_EQ(rr.last.tag, 1u);
    EXPECT_EQ(rr.last.context_id, 3u);
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr2), r2));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return rr2.done(); }));
    EXPECT_EQ(rr2.last.tag, 2u);
    EXPECT_EQ(rr2.last.context_id, 0u);
}

TEST(Inproc, MemoryHandleValidation) {
    Ep a, b;
    Addr ab = a.lookup(b);
    Addr aa = a.t->addr_self();
    std::vector<std::byte> target(256), local(256);
    fill_pattern(target, 4);
    auto th = b.t->mem_register(target.data(), target.size(), Access::read_write);
    auto lh = a.t->mem_register(local.data(), local.size(), Access::read_write);
    ASSERT_TRUE(th && lh);
    std::vector<std::byte> ser(b.t->mem_serialize_size(*th));
    ASSERT_EQ(ser.size(), 48u);
    ASSERT_TRUE(b.t->mem_serialize(*th, ser));
    auto rh = a.t->mem_deserialize(ser);
    ASSERT_TRUE(rh) << rh.error().describe();

    auto get = [&](const MemHandle& remote, const Addr& at) {
        Recorder r;
        return finish({a.ctx.get()}, a.t->post_get(*a.ctx, record(r), *lh, 0, remote, 0, 16, at),
                      r);
    };
    EXPECT_EQ(get(*rh, ab), Errc::ok);
    // The handle names b's region: using it against another endpoint is refused.
    EXPECT_EQ(get(*rh, aa), Errc::invalid_argument);
    // A forged registration id, a changed length, or a field that breaks the format.
    auto forged = ser;
    forged[25] ^= std::byte{1};  // registration id += 256: exists nowhere
    auto fh = a.t->mem_deserialize(forged);
    ASSERT_TRUE(fh);
    EXPECT_EQ(get(*fh, ab), Errc::invalid_argument);
    auto longer = ser;
    longer[41] = std::byte{0x10};  // length += 4096: claims more than was registered
    auto lgh = a.t->mem_deserialize(longer);
    ASSERT_TRUE(lgh);
    EXPECT_EQ(get(*lgh, ab), Errc::invalid_argument);
    for (std::size_t off : {0u, 3u, 4u, 5u, 8u, 12u}) {
        auto bad = ser;
        bad[off] ^= std::byte{0x40};
        EXPECT_FALSE(a.t->mem_deserialize(bad)) << "byte " << off << " changed, still accepted";
    }
    EXPECT_FALSE(a.t->mem_deserialize(std::span(ser.data(), 47)));
    std::vector<std::byte> longer_input(ser);
    longer_input.push_back(std::byte{0});
    EXPECT_FALSE(a.t->mem_deserialize(longer_input));
    // After deregistration the handle is dead.
    th->reset();
    EXPECT_EQ(get(*rh, ab), Errc::invalid_argument);
    EXPECT_FALSE(pattern_mismatch(target, 4));
}

TEST(Inproc, AddressBytesValidation) {
    Ep a;
    Addr self = a.t->addr_self();
    std::vector<std::byte> ser(a.t->addr_serialize_size(self));
    ASSERT_TRUE(a.t->addr_serialize(self, ser));
    auto back = a.t->addr_deserialize(ser);
    ASSERT_TRUE(back);
    EXPECT_TRUE(*back == self);
    auto bad_len = ser;
    bad_len[4] = std::byte{0xff};
    EXPECT_EQ(a.t->addr_deserialize(bad_len).code(), Errc::address_invalid);
    auto bad_char = ser;
    bad_char[6] = std::byte{' '};
    EXPECT_EQ(a.t->addr_deserialize(bad_char).code(), Errc::address_invalid);
    auto extra = ser;
    extra.push_back(std::byte{'x'});
    EXPECT_EQ(a.t->addr_deserialize(extra).code(), Errc::address_invalid);
    auto bad_ver = ser;
    bad_ver[3] = std::byte{2};
    EXPECT_EQ(a.t->addr_deserialize(bad_ver).code(), Errc::address_invalid);
}

TEST(InprocFaults, DropNextMessages) {
    Ep a, b;
    Addr ab = a.lookup(b);
    ASSERT_TRUE(inproc::drop_next_messages(*a.t, 2));
    MsgBuffer s = alloc_buf(*a.t, 4), r = alloc_buf(*b.t, 4);
    Recorder rr;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr), r));
    for (Tag tag : {1u, 2u, 3u}) {
        Recorder sr;
        EXPECT_EQ(finish({a.ctx.get()},
                         a.t->post_send_unexpected(*a.ctx, record(sr), s, 4, ab, 0, tag), sr),
                  Errc::ok);
    }
    ASSERT_TRUE(progress_until(
        {b.ctx.get()}, [&] { return rr.done(); }, 1s));
    EXPECT_EQ(rr.last.tag, 3u) << "the first two messages should have been dropped";
}

TEST(InprocFaults, FailNextOps) {
    Ep a;
    Addr self = a.t->addr_self();
    ASSERT_TRUE(inproc::fail_next_ops(*a.t, Errc::io_error, 2));
    MsgBuffer s = alloc_buf(*a.t, 4), r = alloc_buf(*a.t, 4);
    Recorder r1, r2, r3, s3;
    EXPECT_EQ(finish({a.ctx.get()}, a.t->post_recv_unexpected(*a.ctx, record(r1), r), r1),
              Errc::io_error);
    EXPECT_EQ(
        finish({a.ctx.get()}, a.t->post_send_unexpected(*a.ctx, record(r2), s, 4, self, 0, 1), r2),
        Errc::io_error);
    ASSERT_TRUE(a.t->post_recv_unexpected(*a.ctx, record(r3), r));
    EXPECT_EQ(
        finish({a.ctx.get()}, a.t->post_send_unexpected(*a.ctx, record(s3), s, 4, self, 0, 1), s3),
        Errc::ok);
    ASSERT_TRUE(progress_until({a.ctx.get()}, [&] { return r3.done(); }));
    EXPECT_EQ(r3.last.status, Errc::ok);
    EXPECT_FALSE(inproc::fail_next_ops(*a.t, Errc::ok));
}

TEST(InprocFaults, DelayDeliveryKeepsOrderAndWakesBlockedSender) {
    Ep a, b;
    Addr ab = a.lookup(b);
    MsgBuffer s1 = alloc_buf(*a.t, 4), s2 = alloc_buf(*a.t, 4);
    MsgBuffer r1 = alloc_buf(*b.t, 4), r2 = alloc_buf(*b.t, 4);
    std::vector<Tag> order;
    auto on_recv = [&](const Completion& c) { order.push_back(c.tag); };
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, on_recv, r1));
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, on_recv, r2));
    ASSERT_TRUE(inproc::set_delivery_delay(*a.t, 200ms));
    Recorder sr1, sr2;
    auto t0 = Clock::now();
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(sr1), s1, 4, ab, 0, 1));
    ASSERT_TRUE(inproc::set_delivery_delay(*a.t, Duration::zero()));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(sr2), s2, 4, ab, 0, 2));
    EXPECT_TRUE(a.t->try_wait()) << "nothing is due yet";
    progress_for({b.ctx.get()}, 50ms);
    EXPECT_TRUE(order.empty()) << "a delayed message arrived early (or was overtaken)";
    // The sender blocks in progress; the due time must wake it (timerfd in progress_fd).
    auto r = a.ctx->progress(10s);
    EXPECT_TRUE(r) << r.error().describe();
    auto waited = Clock::now() - t0;
    EXPECT_GE(waited, 190ms);
    EXPECT_LT(waited, 3s);
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()},
                               [&] { return sr1.done() && sr2.done() && order.size() == 2; }));
    EXPECT_EQ(order, (std::vector<Tag>{1, 2}));
}

TEST(InprocFaults, DelayedSendCanBeCanceledAndProgressFdWakes) {
    Ep a, b;
    Addr ab = a.lookup(b);
    MsgBuffer s = alloc_buf(*a.t, 4), r = alloc_buf(*b.t, 4);
    ASSERT_TRUE(inproc::set_delivery_delay(*a.t, 100ms));
    Recorder sr, sr2, rr;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr), r));
    auto id = a.t->post_send_unexpected(*a.ctx, record(sr), s, 4, ab, 0, 1);
    ASSERT_TRUE(id);
    ASSERT_TRUE(a.t->cancel(*id));
    ASSERT_TRUE(progress_until({a.ctx.get()}, [&] { return sr.done(); }));
    EXPECT_EQ(sr.last.status, Errc::canceled);
    // Another delayed send: progress_fd() becomes readable when it is due.
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(sr2), s, 4, ab, 0, 2));
    pollfd p{a.t->progress_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 3000), 1) << "progress_fd() did not become readable";
    EXPECT_FALSE(a.t->try_wait()) << "a due delivery is pending";
    ASSERT_TRUE(
        progress_until({a.ctx.get(), b.ctx.get()}, [&] { return sr2.done() && rr.done(); }));
    EXPECT_EQ(rr.last.tag, 2u) << "the canceled message was delivered";
}

TEST(InprocFaults, DisconnectFailsPendingOpsOnBothSides) {
    Ep a, b;
    Addr ab = a.lookup(b), ba = b.lookup(a);
    MsgBuffer ra = alloc_buf(*a.t, 4), rb = alloc_buf(*b.t, 4), s = alloc_buf(*a.t, 4);
    Recorder r1, r2, r3;
    ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(r1), ra, ab, 1));
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(r2), rb, ba, 1));
    ASSERT_TRUE(inproc::set_delivery_delay(*a.t, 10s));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(r3), s, 4, ab, 0, 1));
    ASSERT_TRUE(inproc::disconnect(*a.t, ab));
    ASSERT_TRUE(progress_until(
        {a.ctx.get(), b.ctx.get()}, [&] { return r1.done() && r2.done() && r3.done(); }, 2s));
    EXPECT_EQ(r1.last.status, Errc::disconnected);
    EXPECT_EQ(r2.last.status, Errc::disconnected);
    EXPECT_EQ(r3.last.status, Errc::disconnected);
    // The link comes back for new operations.
    ASSERT_TRUE(inproc::set_delivery_delay(*a.t, Duration::zero()));
    Recorder r4, s4;
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(r4), rb, ba, 2));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(s4), s, 4, ab, 0, 2));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return r4.done() && s4.done(); }));
    EXPECT_EQ(r4.last.status, Errc::ok);
}

TEST(Inproc, ContextDestroyedWithPostedOpsDoesNotLeakOrCrash) {
    Ep a;
    auto c1 = a.t->context_create(1);
    ASSERT_TRUE(c1);
    MsgBuffer b1 = alloc_buf(*a.t, 8), b2 = alloc_buf(*a.t, 8);
    Addr self = a.t->addr_self();
    ASSERT_TRUE(a.t->post_recv_unexpected(**c1, nullptr, b1));
    ASSERT_TRUE(a.t->post_recv_expected(**c1, nullptr, b2, self, 1));
    c1->reset();
    // Messages for the gone context go to context 0 (naming context 1); the transport keeps
    // working.
    Recorder s, r;
    ASSERT_TRUE(a.t->post_recv_unexpected(*a.ctx, record(r), b2));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(s), b1, 8, self, 1, 1));
    ASSERT_TRUE(progress_until({a.ctx.get()}, [&] { return r.done(); }));
    EXPECT_EQ(r.last.tag, 1u);
    EXPECT_EQ(r.last.context_id, 1u);
    progress_for({a.ctx.get()}, 5ms);
}

TEST(Inproc, ManyThreadsSendToOneBlockedReceiver) {
    Ep server;
    constexpr int kThreads = 4, kPer = 200;
    std::vector<MsgBuffer> bufs;
    int received = 0;
    std::vector<OpId> ids;
    for (int i = 0; i < kThreads * kPer; ++i) {
        bufs.push_back(alloc_buf(*server.t, 8));
        auto r = server.t->post_recv_unexpected(
            *server.ctx, [&](const Completion& c) { received += c.status == Errc::ok; },
            bufs.back());
        ASSERT_TRUE(r);
    }
    {
        std::vector<std::jthread> senders;
        for (int t = 0; t < kThreads; ++t)
            senders.emplace_back([&] {
                Ep c;
                Addr to = c.lookup(server);
                MsgBuffer b = alloc_buf(*c.t, 8);
                int done = 0;
                for (int i = 0; i < kPer; ++i) {
                    auto r = c.t->post_send_unexpected(
                        *c.ctx, [&](const Completion&) { ++done; }, b, 8, to, 0, 1);
                    if (!r) return;
                    (void)progress_until({c.ctx.get()}, [&] { return done == i + 1; });
                }
            });
        EXPECT_TRUE(progress_until(
            {server.ctx.get()}, [&] { return received == kThreads * kPer; }, 30s));
    }
    EXPECT_EQ(received, kThreads * kPer);
}

TEST(InprocFaults, DelayedSendToClosingPeerFailsWithDisconnected) {
    Ep a;
    auto b = std::make_unique<Ep>();
    Addr ab = a.lookup(*b);
    MsgBuffer s = alloc_buf(*a.t, 4);
    ASSERT_TRUE(inproc::set_delivery_delay(*a.t, 10s));
    Recorder sr;
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(sr), s, 4, ab, 0, 1));
    b.reset();
    ASSERT_TRUE(progress_until(
        {a.ctx.get()}, [&] { return sr.done(); }, 2s));
    EXPECT_EQ(sr.last.status, Errc::disconnected);
}

TEST(InprocFaults, OtherTransportsAreRefused) {
    for (const char* address : {"tcp://127.0.0.1:0", "sm://"}) {
        auto t = na::open(address);
        if (!t) continue;  // not built here
        EXPECT_EQ(inproc::drop_next_messages(**t, 1).code(), Errc::invalid_argument) << address;
        EXPECT_EQ(inproc::set_delivery_delay(**t, 1ms).code(), Errc::invalid_argument);
        EXPECT_EQ(inproc::fail_next_ops(**t, Errc::io_error).code(), Errc::invalid_argument);
        EXPECT_EQ(inproc::disconnect(**t, (*t)->addr_self()).code(), Errc::invalid_argument);
    }
    Ep a, b;
    // An address of another endpoint is not an address of this one.
    EXPECT_EQ(inproc::disconnect(*a.t, b.t->addr_self()).code(), Errc::invalid_argument);
}

TEST(Inproc, TwoContextsBlockedInTwoThreadsWakeIndependently) {
    Ep server, client;
    auto c1 = server.t->context_create(1);
    ASSERT_TRUE(c1);
    std::unique_ptr<Context> ctx1 = std::move(*c1);
    Addr to = client.lookup(server);
    MsgBuffer r0 = alloc_buf(*server.t, 8), r1 = alloc_buf(*server.t, 8);
    MsgBuffer s = alloc_buf(*client.t, 8);
    Recorder rec0, rec1;
    auto id0 = server.t->post_recv_unexpected(*server.ctx, record(rec0), r0);
    ASSERT_TRUE(id0);
    ASSERT_TRUE(server.t->post_recv_unexpected(*ctx1, record(rec1), r1));
    std::atomic<bool> woke0{false}, woke1{false};
    Duration waited1{};
    {
        std::jthread th0([&] {
            auto r = server.ctx->progress(1500ms);
            woke0 = bool(r);
        });
        std::jthread th1([&] {
            auto t0 = Clock::now();
            auto r = ctx1->progress(20s);
            waited1 = Clock::now() - t0;
            woke1 = bool(r);
        });
        std::this_thread::sleep_for(100ms);
        Recorder sr;
        ASSERT_TRUE(client.t->post_send_unexpected(*client.ctx, record(sr), s, 8, to, 1, 5));
        ASSERT_TRUE(progress_until({client.ctx.get()}, [&] { return sr.done(); }));
    }
    EXPECT_TRUE(woke1) << "context 1 did not wake for its message";
    EXPECT_LT(waited1, 5s);
    EXPECT_FALSE(woke0) << "context 0 woke without a completion of its own";
    ctx1->trigger();
    EXPECT_TRUE(rec1.done());
    EXPECT_EQ(rec1.last.tag, 5u);
    (void)server.t->cancel(*id0);
    EXPECT_TRUE(progress_until({server.ctx.get()}, [&] { return rec0.done(); }));
    EXPECT_EQ(rec0.last.status, Errc::canceled);
}

}  // namespace
}  // namespace talaria::na::test
