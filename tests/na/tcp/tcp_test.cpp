// tcp transport tests: addressing, ordering, queues, put/get validated at the target, garbage
// clients, disconnects (close, SIGKILL, refused), simultaneous connects, threads.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "harness.hpp"
#include "na/tcp/frame.hpp"
#include "na/tcp/tcp.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;

struct Peer {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Context> ctx;
    [[nodiscard]] std::string self() const { return t->addr_to_string(t->addr_self()); }
};

Peer make_peer(std::string_view address, Options o = {}) {
    Peer p;
    auto t = open(address, o);
    EXPECT_TRUE(t) << (t ? "" : t.error().describe());
    if (!t) return p;
    p.t = std::move(*t);
    auto c = p.t->context_create(0);
    EXPECT_TRUE(c);
    if (c) p.ctx = std::move(*c);
    return p;
}

/// Progress and trigger every context until done() or the time limit.
bool drive(std::initializer_list<Context*> ctxs, const std::function<bool()>& done,
           std::chrono::milliseconds limit = 10s) {
    auto end = Clock::now() + limit;
    while (!done()) {
        for (Context* c : ctxs) {
            (void)c->progress(Duration::zero());
            c->trigger();
        }
        if (Clock::now() > end) return false;
    }
    return true;
}

MsgBuffer buf_with(Transport& t, std::string_view s, std::size_t size = 0) {
    auto b = t.msg_buf_alloc(std::max(size, s.size()));
    EXPECT_TRUE(b);
    if (!s.empty()) std::memcpy(b->data(), s.data(), s.size());
    return std::move(*b);
}

std::string as_string(const MsgBuffer& b, std::size_t n) {
    return std::string(reinterpret_cast<const char*>(b.data()), n);
}

Addr lookup(Transport& t, const std::string& s) {
    auto a = t.addr_lookup(s);
    EXPECT_TRUE(a) << s << ": " << (a ? "" : a.error().describe());
    return a ? *a : Addr();
}

// --- addresses
// ------------------------------------------------------------------------------------

TEST(Tcp, Port0ReportsRealPortAndAddressesAreInterned) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    std::string self = s.self();
    EXPECT_TRUE(self.starts_with("tcp://127.0.0.1:")) << self;
    EXPECT_FALSE(self.ends_with(":0")) << self;
    Addr a = lookup(*s.t, self);
    Addr b = lookup(*s.t, self);
    EXPECT_TRUE(a == s.t->addr_self());
    EXPECT_TRUE(a == b);
    EXPECT_TRUE(lookup(*s.t, self.substr(6)) == a);  // the scheme is optional

    std::vector<std::byte> ser(s.t->addr_serialize_size(a));
    ASSERT_TRUE(s.t->addr_serialize(a, ser));
    auto d = s.t->addr_deserialize(ser);
    ASSERT_TRUE(d);
    EXPECT_TRUE(*d == a);
    ser[0] = std::byte{0xff};  // length beyond the buffer
    EXPECT_FALSE(s.t->addr_deserialize(ser));

    EXPECT_EQ(s.t->addr_lookup("tcp://127.0.0.1:0").code(), Errc::address_invalid);
    EXPECT_EQ(s.t->addr_lookup("sm://x").code(), Errc::address_invalid);
    EXPECT_EQ(s.t->addr_lookup("tcp://~0123456789abcdef").code(), Errc::unreachable);
}

TEST(Tcp, Ipv6) {
    auto t = open("tcp://[::1]:0");
    if (!t) GTEST_SKIP() << "no IPv6 loopback: " << t.error().describe();
    auto ctx = (*t)->context_create(0);
    ASSERT_TRUE(ctx);
    std::string self = (*t)->addr_to_string((*t)->addr_self());
    EXPECT_TRUE(self.starts_with("tcp://[::1]:")) << self;
    Peer c = make_peer("tcp://[::1]", Options{.listen = false});
    Addr dest = lookup(*c.t, self);
    auto sb = buf_with(*c.t, "v6");
    bool sent = false, got = false;
    auto rb = buf_with(**t, "", 16);
    ASSERT_TRUE((*t)->post_recv_unexpected(
        **ctx,
        [&](const Completion& cp) {
            EXPECT_EQ(cp.status, Errc::ok);
            EXPECT_EQ(cp.size, 2u);
            got = true;
        },
        rb));
    ASSERT_TRUE(c.t->post_send_unexpected(
        *c.ctx,
        [&](const Completion& cp) {
            EXPECT_EQ(cp.status, Errc::ok);
            sent = true;
        },
        sb, 2, dest, 0, 1));
    EXPECT_TRUE(drive({c.ctx.get(), ctx->get()}, [&] { return sent && got; }));
    EXPECT_EQ(as_string(rb, 2), "v6");
    ctx->reset();
}

// --- messages
// -------------------------------------------------------------------------------------

TEST(Tcp, ClientThatDoesNotListenGetsRepliesOverItsConnection) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    Peer c = make_peer("tcp://", Options{.listen = false});
    EXPECT_TRUE(c.self().starts_with("tcp://~")) << c.self();
    Addr server = lookup(*c.t, s.self());

    auto req = buf_with(*c.t, "ping");
    auto rep = buf_with(*c.t, "", 64);
    auto srv_in = buf_with(*s.t, "", 64);
    auto srv_out = buf_with(*s.t, "pong!");
    Addr client_src;
    bool c_sent = false, c_got = false, s_got = false, s_sent = false;

    ASSERT_TRUE(s.t->post_recv_unexpected(
        *s.ctx,
        [&](const Completion& cp) {
            ASSERT_EQ(cp.status, Errc::ok);
            EXPECT_EQ(cp.tag, 5u);
            EXPECT_EQ(cp.context_id, 0);
            EXPECT_EQ(cp.size, 4u);
            client_src = cp.source;
            s_got = true;
            ASSERT_TRUE(s.t->post_send_expected(
                *s.ctx,
                [&](const Completion& c2) {
                    EXPECT_EQ(c2.status, Errc::ok);
                    s_sent = true;
                },
                srv_out, 5, cp.source, 0, 6));
        },
        srv_in));
    ASSERT_TRUE(c.t->post_recv_expected(
        *c.ctx,
        [&](const Completion& cp) {
            EXPECT_EQ(cp.status, Errc::ok);
            EXPECT_EQ(cp.size, 5u);
            EXPECT_TRUE(cp.source == server);
            c_got = true;
        },
        rep, server, 6));
    ASSERT_TRUE(c.t->post_send_unexpected(
        *c.ctx,
        [&](const Completion& cp) {
            EXPECT_EQ(cp.status, Errc::ok);
            c_sent = true;
        },
        req, 4, server, 0, 5));
    ASSERT_TRUE(
        drive({c.ctx.get(), s.ctx.get()}, [&] { return c_sent && c_got && s_got && s_sent; }));
    EXPECT_EQ(as_string(srv_in, 4), "ping");
    EXPECT_EQ(as_string(rep, 5), "pong!");
    // The server names the anonymous client by the string it reports itself.
    EXPECT_EQ(s.t->addr_to_string(client_src), c.self());
    EXPECT_TRUE(lookup(*s.t, c.self()) == client_src);
}

TEST(Tcp, OrderedThousandInFlightQueuedThenPosted) {
    Peer a = make_peer("tcp://127.0.0.1:0");
    Peer b = make_peer("tcp://127.0.0.1:0");
    Addr to_b = lookup(*a.t, b.self());
    Addr a_at_b = lookup(*b.t, a.self());
    constexpr int kN = 1000;
    for (int phase = 0; phase < 2; ++phase) {
        std::vector<MsgBuffer> out, in;
        for (int i = 0; i < kN; ++i) {
            out.push_back(buf_with(*a.t, std::to_string(i)));
            in.push_back(buf_with(*b.t, "", 16));
        }
        int sent = 0;
        std::vector<int> order;
        auto post_recvs = [&] {
            for (int i = 0; i < kN; ++i)
                ASSERT_TRUE(b.t->post_recv_unexpected(
                    *b.ctx,
                    [&, i](const Completion& cp) {
                        ASSERT_EQ(cp.status, Errc::ok);
                        EXPECT_TRUE(cp.source == a_at_b);
                        EXPECT_EQ(cp.tag, 77u);
                        order.push_back(std::stoi(as_string(in[i], cp.size)));
                    },
                    in[i]));
        };
        if (phase == 1) post_recvs();  // receives first: data lands in the posted buffers
        for (int i = 0; i < kN; ++i)
            ASSERT_TRUE(a.t->post_send_unexpected(
                *a.ctx,
                [&](const Completion& cp) {
                    EXPECT_EQ(cp.status, Errc::ok);
                    ++sent;
                },
                out[i], std::to_string(i).size(), to_b, 0, 77));
        if (phase == 0) {
            // Messages arrive before any receive: queued, never lost.
            ASSERT_TRUE(drive({a.ctx.get(), b.ctx.get()}, [&] { return sent == kN; }));
            for (int i = 0; i < 20; ++i)
                (void)b.ctx->progress(1ms);
            post_recvs();
        }
        ASSERT_TRUE(drive({a.ctx.get(), b.ctx.get()},
                          [&] { return sent == kN && int(order.size()) == kN; }));
        for (int i = 0; i < kN; ++i)
            ASSERT_EQ(order[i], i) << "phase " << phase;
    }
}

TEST(Tcp, ExpectedMatchingAndMessageTooLarge) {
    Peer a = make_peer("tcp://127.0.0.1:0");
    Peer b = make_peer("tcp://127.0.0.1:0");
    Addr to_b = lookup(*a.t, b.self());
    Addr a_at_b = lookup(*b.t, a.self());
    auto m1 = buf_with(*a.t, "tag-one");
    auto m2 = buf_with(*a.t, "tag-two-long-message");
    int sent = 0;
    auto count = [&](const Completion& cp) {
        EXPECT_EQ(cp.status, Errc::ok);
        ++sent;
    };
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, count, m1, 7, to_b, 0, 1));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, count, m2, 20, to_b, 0, 2));
    ASSERT_TRUE(drive({a.ctx.get(), b.ctx.get()}, [&] { return sent == 2; }));
    for (int i = 0; i < 10; ++i)
        (void)b.ctx->progress(1ms);

    auto small = buf_with(*b.t, "", 8);
    auto r1 = buf_with(*b.t, "", 64);
    Errc st2 = Errc::internal, st1 = Errc::internal;
    std::size_t size1 = 0;
    // Tag 2 first although tag 1 arrived first; tag 2's buffer is too small.
    ASSERT_TRUE(b.t->post_recv_expected(
        *b.ctx, [&](const Completion& cp) { st2 = cp.status; }, small, a_at_b, 2));
    ASSERT_TRUE(b.t->post_recv_expected(
        *b.ctx,
        [&](const Completion& cp) {
            st1 = cp.status;
            size1 = cp.size;
        },
        r1, a_at_b, 1));
    ASSERT_TRUE(
        drive({b.ctx.get()}, [&] { return st1 != Errc::internal && st2 != Errc::internal; }));
    EXPECT_EQ(st2, Errc::message_too_large);
    EXPECT_EQ(st1, Errc::ok);
    EXPECT_EQ(as_string(r1, size1), "tag-one");

    // Too large while the receive is posted (payload discarded, stream stays in sync).
    Errc st3 = Errc::internal, st4 = Errc::internal;
    auto r4 = buf_with(*b.t, "", 64);
    ASSERT_TRUE(b.t->post_recv_expected(
        *b.ctx, [&](const Completion& cp) { st3 = cp.status; }, small, a_at_b, 3));
    ASSERT_TRUE(b.t->post_recv_expected(
        *b.ctx, [&](const Completion& cp) { st4 = cp.status; }, r4, a_at_b, 4));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, count, m2, 20, to_b, 0, 3));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, count, m1, 7, to_b, 0, 4));
    ASSERT_TRUE(drive({a.ctx.get(), b.ctx.get()},
                      [&] { return st3 != Errc::internal && st4 != Errc::internal; }));
    EXPECT_EQ(st3, Errc::message_too_large);
    EXPECT_EQ(st4, Errc::ok);
    EXPECT_EQ(as_string(r4, 7), "tag-one");
    // Oversized sends are refused at once.
    auto big = a.t->msg_buf_alloc(a.t->max_unexpected_size());
    ASSERT_TRUE(big);
    EXPECT_EQ(a.t->max_unexpected_size(), 64u * 1024);
    EXPECT_EQ(a.t->post_send_unexpected(*a.ctx, {}, *big, big->size() + 1, to_b, 0, 0).code(),
              Errc::message_too_large);
}

TEST(Tcp, UnknownContextGoesToLowestContextAndStreamContinues) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    Peer c = make_peer("tcp://", Options{.listen = false});
    Addr dest = lookup(*c.t, s.self());
    auto m = buf_with(*c.t, "x");
    int sent = 0;
    ASSERT_TRUE(c.t->post_send_unexpected(
        *c.ctx, [&](const Completion&) { ++sent; }, m, 1, dest, 9, 0));
    ASSERT_TRUE(c.t->post_send_unexpected(
        *c.ctx, [&](const Completion&) { ++sent; }, m, 1, dest, 0, 42));
    // Context 9 does not exist: context 0 takes the message, naming context 9.
    auto r1 = buf_with(*s.t, "", 8);
    auto r2 = buf_with(*s.t, "", 8);
    std::vector<std::pair<Tag, uint8_t>> got;
    auto rec = [&](const Completion& cp) { got.emplace_back(cp.tag, cp.context_id); };
    ASSERT_TRUE(s.t->post_recv_unexpected(*s.ctx, rec, r1));
    ASSERT_TRUE(s.t->post_recv_unexpected(*s.ctx, rec, r2));
    ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return sent == 2 && got.size() == 2; }));
    EXPECT_EQ(got[0], std::make_pair(Tag{0}, uint8_t{9}));
    EXPECT_EQ(got[1], std::make_pair(Tag{42}, uint8_t{0}));
}

TEST(Tcp, CancelAndStaleId) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    auto r = buf_with(*s.t, "", 8);
    Errc st = Errc::internal;
    auto id = s.t->post_recv_unexpected(
        *s.ctx, [&](const Completion& cp) { st = cp.status; }, r);
    ASSERT_TRUE(id);
    EXPECT_TRUE(s.t->cancel(*id));
    EXPECT_EQ(s.ctx->trigger(), 1u);
    EXPECT_EQ(st, Errc::canceled);
    EXPECT_EQ(s.t->cancel(*id).code(), Errc::not_found);
}

TEST(Tcp, BlockingProgressTimesOutAndWakesOnData) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    auto t0 = Clock::now();
    EXPECT_EQ(s.ctx->progress(50ms).code(), Errc::timeout);
    EXPECT_GE(Clock::now() - t0, 45ms);
    EXPECT_EQ(s.ctx->progress(Duration::zero()).code(), Errc::timeout);

    auto r = buf_with(*s.t, "", 8);
    bool got = false;
    ASSERT_TRUE(s.t->post_recv_unexpected(
        *s.ctx, [&](const Completion&) { got = true; }, r));
    std::string addr = s.self();
    std::thread sender([addr] {
        std::this_thread::sleep_for(50ms);
        Peer c = make_peer("tcp://", Options{.listen = false});
        Addr d = lookup(*c.t, addr);
        auto m = buf_with(*c.t, "wake");
        bool done = false;
        ASSERT_TRUE(c.t->post_send_unexpected(
            *c.ctx, [&](const Completion&) { done = true; }, m, 4, d, 0, 1));
        while (!done) {
            (void)c.ctx->progress(100ms);
            c.ctx->trigger();
        }
    });
    t0 = Clock::now();
    EXPECT_TRUE(s.ctx->progress(5s));
    EXPECT_LT(Clock::now() - t0, 4s);
    s.ctx->trigger();
    EXPECT_TRUE(got);
    sender.join();
}

// --- put / get
// ------------------------------------------------------------------------------------

/// `h`, registered on `from`, as `to` sees it (serialized there and back).
/// Client `c`'s context 0 sends one unexpected message to `server` (`s`'s context 0): the
/// source the server sees (empty if it never arrived).
Addr first_contact(Peer& c, Peer& s, const Addr& server) {
    auto rb = buf_with(*s.t, "", 64);
    Addr client;
    if (!s.t->post_recv_unexpected(
            *s.ctx, [&](const Completion& cp) { client = cp.source; }, rb))
        return {};
    auto m = buf_with(*c.t, "hi");
    if (!c.t->post_send_unexpected(*c.ctx, {}, m, 2, server, 0, 1)) return {};
    if (!drive({c.ctx.get(), s.ctx.get()}, [&] { return static_cast<bool>(client); })) return {};
    return client;
}

MemHandle ship(Transport& from, const MemHandle& h, Transport& to) {
    std::vector<std::byte> b(from.mem_serialize_size(h));
    EXPECT_TRUE(from.mem_serialize(h, b));
    auto r = to.mem_deserialize(b);
    EXPECT_TRUE(r) << (r ? "" : r.error().describe());
    return r ? std::move(*r) : MemHandle();
}

struct RmaPair {
    explicit RmaPair(Options so = {}, Options co = Options{.listen = false})
        : s(make_peer("tcp://127.0.0.1:0", so)), c(make_peer("tcp://", co)) {
        server = lookup(*c.t, s.self());
    }
    Peer s;
    Peer c;
    Addr server;

    /// Serialize `h` at the server, let `edit` forge bytes, deserialize at the client.
    MemHandle ship(const MemHandle& h,
                   const std::function<void(std::vector<std::byte>&)>& edit = {}) {
        std::vector<std::byte> b(s.t->mem_serialize_size(h));
        EXPECT_TRUE(s.t->mem_serialize(h, b));
        if (edit) edit(b);
        auto r = c.t->mem_deserialize(b);
        EXPECT_TRUE(r);
        return r ? std::move(*r) : MemHandle();
    }
    Errc run(bool put, const MemHandle& local, std::size_t loff, const MemHandle& remote,
             std::size_t roff, std::size_t len, std::size_t* moved = nullptr) {
        Errc st = Errc::internal;
        auto cb = [&](const Completion& cp) {
            st = cp.status;
            if (moved) *moved = cp.size;
        };
        auto r = put ? c.t->post_put(*c.ctx, cb, local, loff, remote, roff, len, server)
                     : c.t->post_get(*c.ctx, cb, local, loff, remote, roff, len, server);
        if (!r) return r.code();
        EXPECT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return st != Errc::internal; }));
        return st;
    }
};

void set_u64(std::vector<std::byte>& b, std::size_t off, uint64_t v) {
    for (int i = 0; i < 8; ++i)
        b[off + i] = std::byte(uint8_t(v >> (8 * i)));
}

void put_get_large(RmaPair& p) {
    constexpr std::size_t kLen = 8u << 20;
    std::vector<uint8_t> target(kLen, 0), src(kLen), dst(kLen, 0);
    for (std::size_t i = 0; i < kLen; ++i)
        src[i] = uint8_t(i * 7 + 3);
    auto th = p.s.t->mem_register(target.data(), kLen, Access::read_write);
    auto sh = p.c.t->mem_register(src.data(), kLen, Access::read_only);
    auto dh = p.c.t->mem_register(dst.data(), kLen, Access::write_only);
    ASSERT_TRUE(th && sh && dh);
    MemHandle remote = p.ship(*th);
    std::size_t moved = 0;
    EXPECT_EQ(p.run(true, *sh, 0, remote, 0, kLen, &moved), Errc::ok);
    EXPECT_EQ(moved, kLen);
    EXPECT_TRUE(target == src);
    EXPECT_EQ(p.run(false, *dh, 16, remote, 32, kLen - 64, &moved), Errc::ok);
    EXPECT_EQ(moved, kLen - 64);
    EXPECT_TRUE(std::equal(dst.begin() + 16, dst.begin() + 16 + (kLen - 64), src.begin() + 32));
    EXPECT_EQ(dst[0], 0);
    // Zero-length transfers complete too.
    EXPECT_EQ(p.run(true, *sh, 0, remote, kLen, 0), Errc::ok);
}

TEST(Tcp, PutGetLarge) {
    RmaPair p;
    put_get_large(p);
}

TEST(Tcp, OriginChecksWhatTheHandleSays) {
    RmaPair p;
    std::vector<uint8_t> target(4096, 0xaa), local(8192, 0x55);
    auto ro = p.s.t->mem_register(target.data(), 4096, Access::read_only);
    auto lh = p.c.t->mem_register(local.data(), local.size(), Access::read_write);
    ASSERT_TRUE(ro && lh);
    MemHandle remote = p.ship(*ro);
    EXPECT_EQ(p.run(true, *lh, 0, remote, 0, 16), Errc::access_denied);
    EXPECT_EQ(p.run(false, *lh, 0, remote, 4000, 200), Errc::out_of_range);
    EXPECT_EQ(p.run(false, *lh, 8000, remote, 0, 200), Errc::out_of_range);  // local range
    EXPECT_EQ(p.run(false, *lh, 0, remote, 0, 4096), Errc::ok);
    EXPECT_EQ(local[0], 0xaa);
    // A handle of this server used with another address is refused.
    Peer other = make_peer("tcp://127.0.0.1:0");
    Addr wrong = lookup(*p.c.t, other.self());
    Errc st = Errc::internal;
    ASSERT_TRUE(p.c.t->post_get(
        *p.c.ctx, [&](const Completion& cp) { st = cp.status; }, *lh, 0, remote, 0, 16, wrong));
    ASSERT_TRUE(drive({p.c.ctx.get()}, [&] { return st != Errc::internal; }));
    EXPECT_EQ(st, Errc::invalid_argument);
}

TEST(Tcp, TargetRejectsForgedHandlesAndChangesNothing) {
    RmaPair p;
    std::vector<uint8_t> ro_mem(4096, 0xaa), rw_mem(8192, 0xbb), local(16384, 0x11);
    auto ro = p.s.t->mem_register(ro_mem.data(), 4096, Access::read_only);
    auto wo = p.s.t->mem_register(rw_mem.data(), 4096, Access::write_only);  // first half only
    auto lh = p.c.t->mem_register(local.data(), local.size(), Access::read_write);
    ASSERT_TRUE(ro && wo && lh);

    // Forged access: the origin believes read_write, the target knows better.
    MemHandle forged_ro = p.ship(*ro, [](auto& b) { b[5] = std::byte{3}; });
    EXPECT_EQ(p.run(true, *lh, 0, forged_ro, 0, 4096), Errc::access_denied);
    EXPECT_TRUE(std::all_of(ro_mem.begin(), ro_mem.end(), [](uint8_t v) { return v == 0xaa; }));
    MemHandle forged_wo = p.ship(*wo, [](auto& b) { b[5] = std::byte{3}; });
    EXPECT_EQ(p.run(false, *lh, 0, forged_wo, 0, 64), Errc::access_denied);
    EXPECT_EQ(local[0], 0x11);

    // Forged length: past the end of the real registration.
    MemHandle forged_len = p.ship(*wo, [](auto& b) { set_u64(b, 16, 8192); });
    EXPECT_EQ(p.run(true, *lh, 0, forged_len, 4000, 200), Errc::out_of_range);
    EXPECT_EQ(p.run(true, *lh, 0, forged_len, 4096, 8), Errc::out_of_range);
    EXPECT_TRUE(std::all_of(rw_mem.begin(), rw_mem.end(), [](uint8_t v) { return v == 0xbb; }));
    // Forged base below the region.
    MemHandle forged_base = p.ship(
        *wo, [&](auto& b) { set_u64(b, 8, reinterpret_cast<uintptr_t>(rw_mem.data()) - 64); });
    EXPECT_EQ(p.run(true, *lh, 0, forged_base, 0, 128), Errc::out_of_range);
    // Forged key: no such registration.
    MemHandle forged_key = p.ship(*wo, [](auto& b) { b[24] = std::byte(uint8_t(b[24]) ^ 1); });
    EXPECT_EQ(p.run(true, *lh, 0, forged_key, 0, 16), Errc::invalid_argument);
    EXPECT_TRUE(std::all_of(rw_mem.begin(), rw_mem.end(), [](uint8_t v) { return v == 0xbb; }));

    // After all the rejections the connection is still in sync: a legal put works.
    MemHandle good = p.ship(*wo);
    EXPECT_EQ(p.run(true, *lh, 0, good, 100, 50), Errc::ok);
    EXPECT_EQ(rw_mem[99], 0xbb);
    EXPECT_EQ(rw_mem[100], 0x11);
    EXPECT_EQ(rw_mem[149], 0x11);
    EXPECT_EQ(rw_mem[150], 0xbb);
    // Deregistered: the key is gone at the target.
    wo->reset();
    EXPECT_EQ(p.run(true, *lh, 0, good, 0, 16), Errc::invalid_argument);
}

TEST(Tcp, DeregisteringAtTheTargetNeverTouchesTheRegionAgain) {
    RmaPair p;
    constexpr std::size_t kLen = 32u << 20;
    auto mem = std::make_unique<std::vector<uint8_t>>(kLen);
    for (std::size_t i = 0; i < kLen; ++i)
        (*mem)[i] = uint8_t(i * 13 + 1);
    std::vector<uint8_t> expect = *mem, local(kLen, 0);
    auto th = p.s.t->mem_register(mem->data(), kLen, Access::read_write);
    auto lh = p.c.t->mem_register(local.data(), kLen, Access::read_write);
    ASSERT_TRUE(th && lh);
    MemHandle remote = p.ship(*th);
    Errc st = Errc::internal;
    ASSERT_TRUE(p.c.t->post_get(
        *p.c.ctx, [&](const Completion& cp) { st = cp.status; }, *lh, 0, remote, 0, kLen,
        p.server));
    // The server reads the request and starts answering; the client does not read yet, so
    // the response stays half sent.
    for (int i = 0; i < 20; ++i)
        (void)p.s.ctx->progress(1ms);
    th->reset();
    std::fill(mem->begin(), mem->end(), 0xee);  // the application reuses the memory...
    mem.reset();                                // ...or frees it
    ASSERT_TRUE(drive({p.c.ctx.get(), p.s.ctx.get()}, [&] { return st != Errc::internal; }));
    // Either the response had not started (failed) or it finishes from a private copy.
    if (st == Errc::ok)
        EXPECT_TRUE(local == expect);
    else
        EXPECT_EQ(st, Errc::invalid_argument);
}

// --- failures
// -------------------------------------------------------------------------------------

TEST(Tcp, ConnectRefusedFailsOps) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    socklen_t len = sizeof sa;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    ::close(fd);  // nobody listens on that port now
    Peer c = make_peer("tcp://", Options{.listen = false});
    Addr dead = lookup(*c.t, "tcp://127.0.0.1:" + std::to_string(ntohs(sa.sin_port)));
    auto m = buf_with(*c.t, "x");
    std::vector<Errc> st;
    for (int i = 0; i < 3; ++i)
        ASSERT_TRUE(c.t->post_send_unexpected(
            *c.ctx, [&](const Completion& cp) { st.push_back(cp.status); }, m, 1, dead, 0, 0));
    ASSERT_TRUE(drive({c.ctx.get()}, [&] { return st.size() == 3; }));
    for (Errc e : st)
        EXPECT_TRUE(e == Errc::unreachable || e == Errc::disconnected) << errc_name(e);
}

TEST(Tcp, PeerCloseFailsPendingOps) {
    Peer c = make_peer("tcp://", Options{.listen = false});
    std::vector<uint8_t> local(1 << 20);
    auto lh = c.t->mem_register(local.data(), local.size(), Access::read_write);
    ASSERT_TRUE(lh);
    Errc get_st = Errc::internal, recv_st = Errc::internal;
    {
        Peer s = make_peer("tcp://127.0.0.1:0");
        std::vector<uint8_t> mem(1 << 20);
        auto th = s.t->mem_register(mem.data(), mem.size(), Access::read_write);
        ASSERT_TRUE(th);
        MemHandle remote = ship(*s.t, *th, *c.t);
        ASSERT_TRUE(remote);
        Addr server = lookup(*c.t, s.self());
        auto rb = buf_with(*c.t, "", 16);
        ASSERT_TRUE(c.t->post_recv_expected(
            *c.ctx, [&](const Completion& cp) { recv_st = cp.status; }, rb, server, 1));
        // The server never progresses, so the get waits for a response that never comes.
        ASSERT_TRUE(c.t->post_get(
            *c.ctx, [&](const Completion& cp) { get_st = cp.status; }, *lh, 0, remote, 0,
            local.size(), server));
        for (int i = 0; i < 20; ++i) {
            (void)c.ctx->progress(1ms);
            c.ctx->trigger();
        }
        EXPECT_EQ(get_st, Errc::internal);
        th->reset();
        s.ctx.reset();
    }  // server transport closes its sockets
    ASSERT_TRUE(drive(
        {c.ctx.get()}, [&] { return get_st != Errc::internal && recv_st != Errc::internal; }, 5s));
    EXPECT_EQ(get_st, Errc::disconnected);
    EXPECT_EQ(recv_st, Errc::disconnected);
}

TEST(Tcp, SigkilledPeerFailsPendingOpsPromptly) {
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::close(pipefd[0]);
        auto t = open("tcp://127.0.0.1:0");
        if (!t) ::_exit(1);
        auto ctx = (*t)->context_create(0);
        if (!ctx) ::_exit(1);
        std::string self = (*t)->addr_to_string((*t)->addr_self());
        self.push_back('\n');
        if (::write(pipefd[1], self.data(), self.size()) < 0) ::_exit(1);
        for (;;) {
            (void)(*ctx)->progress(std::chrono::milliseconds(100));
            (*ctx)->trigger();
        }
    }
    ::close(pipefd[1]);
    std::string addr;
    char ch;
    while (::read(pipefd[0], &ch, 1) == 1 && ch != '\n')
        addr.push_back(ch);
    ::close(pipefd[0]);
    ASSERT_FALSE(addr.empty());

    Peer c = make_peer("tcp://", Options{.listen = false});
    Addr child = lookup(*c.t, addr);
    auto m = buf_with(*c.t, "hi");
    auto rb = buf_with(*c.t, "", 16);
    Errc send_st = Errc::internal, recv_st = Errc::internal;
    ASSERT_TRUE(c.t->post_recv_expected(
        *c.ctx, [&](const Completion& cp) { recv_st = cp.status; }, rb, child, 9));
    ASSERT_TRUE(c.t->post_send_unexpected(
        *c.ctx, [&](const Completion& cp) { send_st = cp.status; }, m, 2, child, 0, 1));
    ASSERT_TRUE(drive({c.ctx.get()}, [&] { return send_st != Errc::internal; }));
    EXPECT_EQ(send_st, Errc::ok);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    auto t0 = Clock::now();
    ASSERT_TRUE(drive(
        {c.ctx.get()}, [&] { return recv_st != Errc::internal; }, 5s));
    EXPECT_EQ(recv_st, Errc::disconnected);
    EXPECT_LT(Clock::now() - t0, 2s);
    // The next send reconnects, is refused, and fails instead of hanging.
    Errc again_st = Errc::internal;
    ASSERT_TRUE(c.t->post_send_unexpected(
        *c.ctx, [&](const Completion& cp) { again_st = cp.status; }, m, 2, child, 0, 1));
    ASSERT_TRUE(drive(
        {c.ctx.get()}, [&] { return again_st != Errc::internal; }, 5s));
    EXPECT_TRUE(again_st == Errc::unreachable || again_st == Errc::disconnected);
}

/// A raw TCP client that speaks bytes, not the protocol.
struct RawClient {
    int fd = -1;
    explicit RawClient(const std::string& addr) {
        auto colon = addr.rfind(':');
        int port = std::stoi(addr.substr(colon + 1));
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(uint16_t(port));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    }
    ~RawClient() {
        if (fd >= 0) ::close(fd);
    }
    void send_bytes(const std::vector<std::byte>& b) const {
        EXPECT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size()));
    }
    /// Wait (while `ctx` progresses) until the server closes this socket.
    bool closed_by_peer(Context& ctx) const {
        auto end = Clock::now() + 5s;
        while (Clock::now() < end) {
            (void)ctx.progress(Duration::zero());
            char c;
            ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
            std::this_thread::sleep_for(1ms);
        }
        return false;
    }
};

std::vector<std::byte> frame(const tcp::FrameHeader& h, std::size_t payload = 0) {
    std::vector<std::byte> b(tcp::kFrameHeaderSize + payload);
    tcp::encode_frame_header(h, b.data());
    return b;
}

/// An unexpected-message frame claiming `length` payload bytes, with `payload` of them present.
std::vector<std::byte> message_frame(uint64_t length, std::size_t payload) {
    tcp::FrameHeader h;
    h.type = tcp::FrameType::msg_unexpected;
    h.length = length;
    return frame(h, payload);
}

std::vector<std::byte> hello_frame(std::string_view addr = "") {
    tcp::FrameHeader h;
    h.type = tcp::FrameType::hello;
    h.length = tcp::hello_size(addr);
    auto b = frame(h, h.length);
    tcp::encode_hello(tcp::Hello{0x1234, addr}, b.data() + tcp::kFrameHeaderSize);
    return b;
}

TEST(Tcp, GarbageClientsDoNotHurtTheListener) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    std::string addr = s.self();
    auto recv_ok_from_normal_client = [&](Tag tag) {
        Peer c = make_peer("tcp://", Options{.listen = false});
        Addr dest = lookup(*c.t, addr);
        auto m = buf_with(*c.t, "ok");
        auto r = buf_with(*s.t, "", 8);
        Tag got = 0;
        ASSERT_TRUE(s.t->post_recv_unexpected(
            *s.ctx,
            [&](const Completion& cp) {
                EXPECT_EQ(cp.status, Errc::ok);
                got = cp.tag;
            },
            r));
        ASSERT_TRUE(c.t->post_send_unexpected(*c.ctx, {}, m, 2, dest, 0, tag));
        ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return got != 0; }));
        EXPECT_EQ(got, tag);
    };

    {  // junk bytes
        RawClient r(addr);
        std::vector<std::byte> junk(1000);
        for (std::size_t i = 0; i < junk.size(); ++i)
            junk[i] = std::byte(uint8_t(i * 37 + 11));
        r.send_bytes(junk);
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    recv_ok_from_normal_client(1);
    {  // a truncated header, then the client goes away
        RawClient r(addr);
        auto h = hello_frame();
        h.resize(20);
        r.send_bytes(h);
    }
    for (int i = 0; i < 10; ++i)
        (void)s.ctx->progress(1ms);
    recv_ok_from_normal_client(2);
    {  // data before the hello
        RawClient r(addr);
        r.send_bytes(message_frame(4, 4));
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    {  // a huge length after a valid hello
        RawClient r(addr);
        r.send_bytes(hello_frame());
        r.send_bytes(message_frame(uint64_t(1) << 62, 0));
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    {  // half a payload, then close
        RawClient r(addr);
        r.send_bytes(hello_frame());
        r.send_bytes(message_frame(1000, 500));
    }
    for (int i = 0; i < 10; ++i)
        (void)s.ctx->progress(1ms);
    {  // a 1 TiB put with a made-up key: rejected, the data would be discarded; then close
        RawClient r(addr);
        r.send_bytes(hello_frame());
        tcp::FrameHeader h;
        h.type = tcp::FrameType::put_req;
        h.key = 12345;
        h.address = 0x1000;
        h.length = h.rma_length = tcp::kMaxRmaLength;
        r.send_bytes(frame(h, 4096));
    }
    {  // a response nobody asked for
        RawClient r(addr);
        r.send_bytes(hello_frame());
        tcp::FrameHeader h;
        h.type = tcp::FrameType::get_resp;
        h.cookie = 99;
        h.length = 8;
        r.send_bytes(frame(h, 8));
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    {  // a hello naming a bogus address, and a second hello
        RawClient r(addr);
        r.send_bytes(hello_frame("tcp://not-a-number:1"));
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
        RawClient r2(addr);
        r2.send_bytes(hello_frame());
        r2.send_bytes(hello_frame());
        EXPECT_TRUE(r2.closed_by_peer(*s.ctx));
    }
    RawClient idle(addr);  // connected, silent, stays open meanwhile
    for (int i = 0; i < 10; ++i)
        (void)s.ctx->progress(1ms);
    recv_ok_from_normal_client(3);
}

TEST(Tcp, SimultaneousConnects) {
    Peer a = make_peer("tcp://127.0.0.1:0");
    Peer b = make_peer("tcp://127.0.0.1:0");
    Addr to_b = lookup(*a.t, b.self());
    Addr to_a = lookup(*b.t, a.self());
    constexpr int kN = 50;
    std::vector<MsgBuffer> ma, mb, ra, rb;
    std::vector<int> got_a, got_b;
    for (int i = 0; i < kN; ++i) {
        ma.push_back(buf_with(*a.t, std::to_string(i)));
        mb.push_back(buf_with(*b.t, std::to_string(i)));
        ra.push_back(buf_with(*a.t, "", 8));
        rb.push_back(buf_with(*b.t, "", 8));
    }
    // Both sides connect to each other before either progresses.
    for (int i = 0; i < kN; ++i) {
        ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, {}, ma[i], ma[i].size(), to_b, 0, 1));
        ASSERT_TRUE(b.t->post_send_unexpected(*b.ctx, {}, mb[i], mb[i].size(), to_a, 0, 1));
    }
    for (int i = 0; i < kN; ++i) {
        ASSERT_TRUE(a.t->post_recv_unexpected(
            *a.ctx,
            [&, i](const Completion& cp) {
                EXPECT_TRUE(cp.source == to_b);
                got_a.push_back(std::stoi(as_string(ra[i], cp.size)));
            },
            ra[i]));
        ASSERT_TRUE(b.t->post_recv_unexpected(
            *b.ctx,
            [&, i](const Completion& cp) {
                EXPECT_TRUE(cp.source == to_a);
                got_b.push_back(std::stoi(as_string(rb[i], cp.size)));
            },
            rb[i]));
    }
    ASSERT_TRUE(drive({a.ctx.get(), b.ctx.get()},
                      [&] { return int(got_a.size()) == kN && int(got_b.size()) == kN; }));
    for (int i = 0; i < kN; ++i) {
        EXPECT_EQ(got_a[i], i);
        EXPECT_EQ(got_b[i], i);
    }
}

// Issue 9, back-pressure below the caller: a peer that does not read makes our sends wait on the
// connection's send queue (far past what the socket buffers hold) instead of returning again;
// only the op pool bounds them, and everything drains once the peer reads.
TEST(Tcp, BackPressureQueuesBelowTheCallerThenDrains) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    Peer c = make_peer("tcp://", Options{.listen = false, .max_ops = 2100});
    Addr dest = lookup(*c.t, s.self());
    auto m = buf_with(*c.t, "", c.t->max_unexpected_size());
    int posted = 0, sent = 0;
    auto post = [&] {
        return c.t->post_send_unexpected(
            *c.ctx,
            [&](const Completion& cp) {
                EXPECT_EQ(cp.status, Errc::ok);
                ++sent;
            },
            m, m.size(), dest, 0, 1);
    };
    // 2000 x 64 KiB = 125 MiB: more than any socket buffer, all accepted.
    for (; posted < 2000; ++posted) {
        auto r = post();
        ASSERT_TRUE(r) << "post " << posted << ": " << r.error().describe();
        (void)c.ctx->progress(Duration::zero());
        c.ctx->trigger();
    }
    EXPECT_LT(sent, posted) << "the peer does not read: some sends must still wait";
    // The op pool is the one bound: past it, again.
    Result<OpId> r = post();
    int extra = 0;
    for (; r && extra < 200; r = post())
        ++extra;
    ASSERT_FALSE(r) << "never pushed back at max_ops";
    EXPECT_EQ(r.code(), Errc::again) << r.error().describe();
    posted += extra;
    auto rb = buf_with(*s.t, "", s.t->max_unexpected_size());
    int received = 0;
    std::function<void(const Completion&)> again = [&](const Completion& cp) {
        EXPECT_EQ(cp.status, Errc::ok);
        ++received;
        if (received < posted) {
            ASSERT_TRUE(s.t->post_recv_unexpected(
                *s.ctx, [&](const Completion& c2) { again(c2); }, rb));
        }
    };
    ASSERT_TRUE(s.t->post_recv_unexpected(
        *s.ctx, [&](const Completion& cp) { again(cp); }, rb));
    ASSERT_TRUE(drive(
        {c.ctx.get(), s.ctx.get()}, [&] { return sent == posted && received == posted; }, 30s));
}

// Issue 10, item 5: a context that posts no receives while a peer sends it 3000 unexpected
// messages of 64 KiB (188 MiB). Before, the receiver read them all into its queue (RSS grew by
// as much). Now it reads up to its bounds (tcp::kMaxUnexpected*), then stops reading that
// connection: TCP's flow control holds the sender back, whose sends wait on its side. Another
// peer still gets through (the bound per peer is below the one per context), and once the
// receiver posts receives every message arrives, whole and in order.
TEST(Tcp, UnexpectedBacklogStopsReadingTheSenderAndLosesNothing) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    Peer flood = make_peer("tcp://", Options{.listen = false, .max_ops = 4096});
    Peer other = make_peer("tcp://", Options{.listen = false});
    Addr dest = lookup(*flood.t, s.self());
    const std::size_t size = flood.t->max_unexpected_size();
    constexpr int kN = 3000;
    std::vector<MsgBuffer> out;
    for (int i = 0; i < kN; ++i) {
        out.push_back(buf_with(*flood.t, "", size));
        test::fill_flood({out.back().data(), size}, i);
    }
    test::SendCount sent;
    ASSERT_TRUE(test::post_counted_sends(*flood.t, *flood.ctx, out, size, dest, kN, test::kFloodTag,
                                         true, &sent));
    // Both sides progress (the receiver posts nothing) until the sender stops making headway.
    int last = -1;
    auto still = Clock::now();
    ASSERT_TRUE(drive(
        {flood.ctx.get(), s.ctx.get()},
        [&] {
            if (sent.done != last) {
                last = sent.done;
                still = Clock::now();
            }
            return sent.done == kN || Clock::now() - still > 500ms;
        },
        20s));
    // What left the sender: the receiver's backlog (at most the bound per peer and one more
    // message) and the two kernels' socket buffers (a few MiB each on loopback).
    const std::size_t slack = std::size_t{24} << 20;
    std::printf("%d of %d messages of %zu bytes left the sender while nobody received\n", sent.done,
                kN, size);
    EXPECT_LT(std::size_t(sent.done) * size, tcp::kMaxUnexpectedPerPeer + slack)
        << "the receiver read far past its backlog bound";

    // Another peer is not held up by the first one's backlog.
    Addr dest2 = lookup(*other.t, s.self());
    auto m2 = buf_with(*other.t, "other", 64);
    test::SendCount sent2;
    ASSERT_TRUE(
        test::post_counted_sends(*other.t, *other.ctx, {&m2, 1}, 5, dest2, 4, 7, false, &sent2));
    EXPECT_TRUE(drive(
        {other.ctx.get(), s.ctx.get(), flood.ctx.get()}, [&] { return sent2.done == 4; }, 5s))
        << "a second peer was held up by the first one's backlog";

    // Receive everything: the flood whole and in order, and the other peer's four.
    auto rb = buf_with(*s.t, "", size);
    test::FloodOrder order;
    int others = 0, received = 0;
    std::function<void(const Completion&)> on_recv = [&](const Completion& cp) {
        ASSERT_EQ(cp.status, Errc::ok);
        ++received;
        if (cp.tag == 7)
            ++others;
        else
            ASSERT_EQ(order.take(cp, {rb.data(), size}), "");
        if (received < kN + 4) {
            ASSERT_TRUE(s.t->post_recv_unexpected(
                *s.ctx, [&](const Completion& c2) { on_recv(c2); }, rb));
        }
    };
    ASSERT_TRUE(s.t->post_recv_unexpected(
        *s.ctx, [&](const Completion& cp) { on_recv(cp); }, rb));
    ASSERT_TRUE(drive(
        {flood.ctx.get(), s.ctx.get(), other.ctx.get()},
        [&] { return sent.done == kN && received == kN + 4; }, 60s))
        << sent.done << " sent, " << order.next << " of the flood and " << others
        << " others received";
    EXPECT_EQ(order.next, kN);
    EXPECT_EQ(others, 4);
    EXPECT_EQ(sent.failed + sent2.failed, 0) << "sends failed";
}

TEST(Tcp, ThreadSafeEchoWithBlockingProgress) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    std::atomic<bool> stop{false};
    std::thread server([&] {
        std::vector<MsgBuffer> bufs;
        for (int i = 0; i < 8; ++i)
            bufs.push_back(buf_with(*s.t, "", 64));
        std::function<void(int)> post = [&](int i) {
            ASSERT_TRUE(s.t->post_recv_unexpected(
                *s.ctx,
                [&, i](const Completion& cp) {
                    if (cp.status != Errc::ok) return;
                    // Echo from the receive buffer, then re-post once it went out.
                    ASSERT_TRUE(s.t->post_send_expected(
                        *s.ctx, [&, i](const Completion&) { post(i); }, bufs[i], cp.size, cp.source,
                        0, cp.tag));
                },
                bufs[i]));
        };
        for (int i = 0; i < 8; ++i)
            post(i);
        while (!stop.load()) {
            (void)s.ctx->progress(20ms);
            s.ctx->trigger();
        }
    });
    auto client = [&](int who) {
        Peer c = make_peer("tcp://", Options{.listen = false});
        Addr dest = lookup(*c.t, s.self());
        for (int i = 0; i < 200; ++i) {
            std::string text = fmt::format("{}:{}", who, i);
            auto m = buf_with(*c.t, text);
            auto r = buf_with(*c.t, "", 64);
            bool got = false;
            std::size_t size = 0;
            Tag tag = Tag(who * 1000 + i);
            ASSERT_TRUE(c.t->post_recv_expected(
                *c.ctx,
                [&](const Completion& cp) {
                    EXPECT_EQ(cp.status, Errc::ok);
                    size = cp.size;
                    got = true;
                },
                r, dest, tag));
            ASSERT_TRUE(c.t->post_send_unexpected(*c.ctx, {}, m, text.size(), dest, 0, tag));
            auto end = Clock::now() + 10s;
            while (!got && Clock::now() < end) {
                (void)c.ctx->progress(100ms);
                c.ctx->trigger();
            }
            ASSERT_TRUE(got);
            EXPECT_EQ(as_string(r, size), text);
        }
    };
    std::thread c1(client, 1), c2(client, 2);
    client(3);
    c1.join();
    c2.join();
    stop = true;
    server.join();
}

// A server context with no connection to a client that does not listen reaches it over another
// context's connection (a borrowed op: the engine's bulk context pulling from a client). Both
// work, and destroying the borrowing context while its get is on the wire withdraws it (the
// lending connection closes) instead of leaving an op that would later complete into the
// destroyed context; the other context goes on serving.
TEST(Tcp, BorrowedGetFromAnonymousClientAndItsContextDestroyed) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    auto s1r = s.t->context_create(1);
    ASSERT_TRUE(s1r);
    std::unique_ptr<Context> s1 = std::move(*s1r);
    Peer c = make_peer("tcp://", Options{.listen = false});
    Addr server = lookup(*c.t, s.self());
    std::vector<std::byte> data(1 << 20, std::byte{0x5a}), got(1 << 20);
    auto reg = c.t->mem_register(data.data(), data.size(), Access::read_only);
    ASSERT_TRUE(reg);
    auto mine = s.t->mem_register(got.data(), got.size(), Access::write_only);
    ASSERT_TRUE(mine);
    MemHandle remote = ship(*c.t, *reg, *s.t);
    ASSERT_TRUE(remote);
    // The client's first message connects it to server context 0; its source is the client.
    Addr client = first_contact(c, s, server);
    ASSERT_TRUE(client);
    // Context 1 gets from the client's memory over context 0's connection.
    Errc st = Errc::internal;
    ASSERT_TRUE(s.t->post_get(
        *s1, [&](const Completion& cp) { st = cp.status; }, *mine, 0, remote, 0, data.size(),
        client));
    ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get(), s1.get()}, [&] { return st != Errc::internal; }));
    EXPECT_EQ(st, Errc::ok);
    EXPECT_EQ(got, data);
    // Again, but the client does not serve it yet: the get waits on the wire when context 1 goes.
    st = Errc::internal;
    auto id = s.t->post_get(
        *s1, [&](const Completion& cp) { st = cp.status; }, *mine, 0, remote, 0, data.size(),
        client);
    ASSERT_TRUE(id);
    (void)s1->progress(Duration::zero());
    (void)s.ctx->progress(Duration::zero());
    s1.reset();
    // The client now answers (or finds the connection gone); nothing may complete into the
    // destroyed context, and context 0 goes on serving a new message.
    auto rb = buf_with(*s.t, "", 64);
    auto m = buf_with(*c.t, "hi");
    std::string text;
    ASSERT_TRUE(s.t->post_recv_unexpected(
        *s.ctx,
        [&](const Completion& cp) {
            if (cp.status == Errc::ok) text = as_string(rb, cp.size);
        },
        rb));
    // The client's connection may still look open to it for a moment (a send then dies with
    // it): send again every 20 ms until one arrives.
    auto end = Clock::now() + 10s;
    auto next_send = Clock::now();
    while (text.empty() && Clock::now() < end) {
        for (Context* x : {c.ctx.get(), s.ctx.get()}) {
            (void)x->progress(Duration::zero());
            x->trigger();
        }
        if (Clock::now() >= next_send) {
            (void)c.t->post_send_unexpected(*c.ctx, {}, m, 2, server, 0, 2);
            next_send = Clock::now() + 20ms;
        }
    }
    EXPECT_EQ(text, "hi");
}

// A get whose request went out but whose response has not come (a target that does not serve it,
// e.g. one not progressing) can be canceled: it completes with canceled at once, its buffer is
// never written, and the response that comes later is read and dropped, so the next get on the
// same connection gets its own data.
TEST(Tcp, CanceledGetAwaitingItsResponseDropsTheLateResponse) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    Peer c = make_peer("tcp://", Options{.listen = false});
    Addr server = lookup(*c.t, s.self());
    std::vector<std::byte> data(1 << 16), first(data.size(), std::byte{0xaa}), second(data.size());
    test::fill_pattern(data, 7);
    auto reg = s.t->mem_register(data.data(), data.size(), Access::read_only);
    ASSERT_TRUE(reg);
    MemHandle remote = ship(*s.t, *reg, *c.t);
    ASSERT_TRUE(remote);
    auto h1 = c.t->mem_register(first.data(), first.size(), Access::write_only);
    auto h2 = c.t->mem_register(second.data(), second.size(), Access::write_only);
    ASSERT_TRUE(h1 && h2);
    Errc st1 = Errc::internal, st2 = Errc::internal;
    auto id = c.t->post_get(
        *c.ctx, [&](const Completion& cp) { st1 = cp.status; }, *h1, 0, remote, 0, data.size(),
        server);
    ASSERT_TRUE(id);
    // Only the client progresses: the request goes out, the server does not answer yet.
    auto until = Clock::now() + 100ms;
    while (Clock::now() < until) {
        (void)c.ctx->progress(Duration::zero());
        c.ctx->trigger();
    }
    ASSERT_EQ(st1, Errc::internal) << "the get completed without the server's progress";
    ASSERT_TRUE(c.t->cancel(*id));
    ASSERT_TRUE(drive(
        {c.ctx.get()}, [&] { return st1 != Errc::internal; }, 2s))
        << "a get waiting for its response did not complete when canceled";
    EXPECT_EQ(st1, Errc::canceled);
    ASSERT_TRUE(c.t->post_get(
        *c.ctx, [&](const Completion& cp) { st2 = cp.status; }, *h2, 0, remote, 0, data.size(),
        server));
    ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return st2 != Errc::internal; }));
    EXPECT_EQ(st2, Errc::ok);
    EXPECT_FALSE(test::pattern_mismatch(second, 7)) << "the second get got wrong bytes";
    EXPECT_TRUE(std::all_of(first.begin(), first.end(), [](std::byte b) {
        return b == std::byte{0xaa};
    })) << "the canceled get's buffer was written";
}

// A message for one context that arrives on a connection of another (a server answering a
// client that does not listen on the connection its other context opened) is handed to the
// right context, whose sleeping thread its bell wakes at once.
TEST(Tcp, MessageOnAnotherContextsConnectionWakesItsContext) {
    Peer s = make_peer("tcp://127.0.0.1:0");
    Peer c = make_peer("tcp://", Options{.listen = false});
    auto c1r = c.t->context_create(1);
    ASSERT_TRUE(c1r);
    std::unique_ptr<Context> c1 = std::move(*c1r);
    Addr server = lookup(*c.t, s.self());
    // Client context 0 connects; the server learns the client from its message.
    Addr client = first_contact(c, s, server);
    ASSERT_TRUE(client);
    // Client context 1 sleeps in progress; the server sends to it over that connection.
    auto cb = buf_with(*c.t, "", 64);
    std::atomic<bool> got{false};
    Completion seen;
    ASSERT_TRUE(c.t->post_recv_unexpected(
        *c1,
        [&](const Completion& cp) {
            seen = cp;
            got = true;
        },
        cb));
    std::atomic<bool> sleeping{false};
    std::thread sleeper([&] {
        auto end = Clock::now() + 10s;
        while (!got.load() && Clock::now() < end) {
            sleeping = true;
            (void)c1->progress(5s);
            c1->trigger();
        }
    });
    while (!sleeping.load())
        std::this_thread::yield();
    std::this_thread::sleep_for(20ms);  // let it block
    auto sent_at = Clock::now();
    auto msg = buf_with(*s.t, "to-one");
    ASSERT_TRUE(s.t->post_send_unexpected(*s.ctx, {}, msg, 6, client, 1, 9));
    // Client context 0 must progress to read the connection and hand the message over.
    while (!got.load() && Clock::now() - sent_at < 5s) {
        for (Context* x : {c.ctx.get(), s.ctx.get()}) {
            (void)x->progress(Duration::zero());
            x->trigger();
        }
    }
    auto took = Clock::now() - sent_at;
    sleeper.join();
    ASSERT_TRUE(got.load());
    EXPECT_EQ(seen.status, Errc::ok);
    EXPECT_EQ(seen.context_id, 1);
    EXPECT_EQ(as_string(cb, seen.size), "to-one");
    EXPECT_LT(took, 1s) << "the sleeping context was not woken by the hand-over";
    c1.reset();
}

TEST(Tcp, SingleThreadedMode) {
    Options o;
    o.thread_safe = false;
    Peer a = make_peer("tcp://127.0.0.1:0", o);
    Peer b = make_peer("tcp://127.0.0.1:0", o);
    Addr to_b = lookup(*a.t, b.self());
    auto m = buf_with(*a.t, "st");
    auto r = buf_with(*b.t, "", 8);
    bool got = false;
    ASSERT_TRUE(b.t->post_recv_unexpected(
        *b.ctx,
        [&](const Completion& cp) {
            EXPECT_EQ(cp.status, Errc::ok);
            got = true;
        },
        r));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, {}, m, 2, to_b, 0, 3));
    ASSERT_TRUE(drive({a.ctx.get(), b.ctx.get()}, [&] { return got; }));
    EXPECT_EQ(as_string(r, 2), "st");
}

// --- authentication (Options::auth)
// ---------------------------------------------------------------

Auth auth_with(std::string key, char fill) {
    Auth a;
    a.key_id = std::move(key);
    a.secret.assign(32, std::byte(fill));
    return a;
}

/// A client sends one unexpected message to a server; each side's Options::auth as given. The
/// send's status, and whether the server received it.
struct AuthOutcome {
    Errc sent = Errc::internal;
    bool received = false;
};
AuthOutcome send_with_auth(const Auth& server_auth, const Auth& client_auth) {
    AuthOutcome out;
    Options so;
    so.auth = server_auth;
    Peer s = make_peer("tcp://127.0.0.1:0", so);
    Options co;
    co.listen = false;
    co.auth = client_auth;
    Peer c = make_peer("tcp://", co);
    if (!s.t || !c.t) return out;
    Addr dest = lookup(*c.t, s.self());
    auto m = buf_with(*c.t, "hi");
    auto r = buf_with(*s.t, "", 8);
    bool sent = false;
    EXPECT_TRUE(s.t->post_recv_unexpected(
        *s.ctx, [&](const Completion& cp) { out.received = cp.status == Errc::ok; }, r));
    EXPECT_TRUE(c.t->post_send_unexpected(
        *c.ctx,
        [&](const Completion& cp) {
            out.sent = cp.status;
            sent = true;
        },
        m, 2, dest, 0, 7));
    EXPECT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return sent; }));
    drive(
        {c.ctx.get(), s.ctx.get()}, [&] { return out.received; }, 300ms);
    return out;
}

TEST(TcpAuth, PeersWithTheSameSecretTalkBothWays) {
    Options so;
    so.auth = auth_with("cluster-1", 'k');
    Peer s = make_peer("tcp://127.0.0.1:0", so);
    Options co;
    co.listen = false;
    co.auth = so.auth;
    Peer c = make_peer("tcp://", co);
    Addr dest = lookup(*c.t, s.self());
    auto m = buf_with(*c.t, "ping");
    auto r = buf_with(*s.t, "", 8);
    Addr from;
    std::size_t got = 0;
    ASSERT_TRUE(s.t->post_recv_unexpected(
        *s.ctx,
        [&](const Completion& cp) {
            ASSERT_EQ(cp.status, Errc::ok);
            from = cp.source;
            got = cp.size;
        },
        r));
    // Several messages queued before the set-up finished: they wait for it, in order.
    for (int i = 0; i < 3; ++i)
        ASSERT_TRUE(c.t->post_send_unexpected(*c.ctx, {}, m, 4, dest, 0, 1));
    ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return got != 0; }));
    EXPECT_EQ(as_string(r, got), "ping");
    // The reply goes back over the authenticated connection.
    auto back = buf_with(*s.t, "pong");
    auto cr = buf_with(*c.t, "", 8);
    std::size_t back_got = 0;
    ASSERT_TRUE(c.t->post_recv_unexpected(
        *c.ctx, [&](const Completion& cp) { back_got = cp.status == Errc::ok ? cp.size : 1; }, cr));
    ASSERT_TRUE(s.t->post_send_unexpected(*s.ctx, {}, back, 4, from, 0, 2));
    ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return back_got != 0; }));
    EXPECT_EQ(as_string(cr, back_got), "pong");
}

TEST(TcpAuth, StrangersAreRefusedWithAccessDenied) {
    {
        SCOPED_TRACE("a different secret");
        auto o = send_with_auth(auth_with("k", 'a'), auth_with("k", 'b'));
        EXPECT_EQ(o.sent, Errc::access_denied) << errc_name(o.sent);
        EXPECT_FALSE(o.received);
    }
    {
        SCOPED_TRACE("another key id");
        auto o = send_with_auth(auth_with("k", 'a'), auth_with("other", 'a'));
        EXPECT_EQ(o.sent, Errc::access_denied) << errc_name(o.sent);
        EXPECT_FALSE(o.received);
    }
    {
        // It does not wait for the set-up (it has nothing to prove): its send may complete
        // once written, before the refusal comes back; the server takes nothing from it.
        SCOPED_TRACE("a client without a secret");
        auto o = send_with_auth(auth_with("k", 'a'), Auth{});
        EXPECT_FALSE(o.received);
    }
    {
        SCOPED_TRACE("a server without a secret");
        auto o = send_with_auth(Auth{}, auth_with("k", 'a'));
        EXPECT_EQ(o.sent, Errc::access_denied) << errc_name(o.sent);
        EXPECT_FALSE(o.received);
    }
}

TEST(TcpAuth, ForgedResponsesAndSilenceAreRefused) {
    Options so;
    so.auth = auth_with("k", 'z');
    so.hello_timeout = std::chrono::milliseconds(300);
    Peer s = make_peer("tcp://127.0.0.1:0", so);
    std::string addr = s.self();
    auto hello_with_auth = [] {
        std::byte nonce[tcp::kAuthNonceSize]{};
        tcp::Hello hello{0x77, "", true, "k", nonce};
        tcp::FrameHeader h;
        h.type = tcp::FrameType::hello;
        h.length = tcp::hello_size("", true, "k");
        auto b = frame(h, h.length);
        tcp::encode_hello(hello, b.data() + tcp::kFrameHeaderSize);
        return b;
    };
    {  // a response with a made-up proof
        RawClient r(addr);
        r.send_bytes(hello_with_auth());
        tcp::FrameHeader h;
        h.type = tcp::FrameType::auth;
        h.context_id = uint8_t(tcp::AuthStep::response);
        h.length = tcp::kAuthProofSize;
        r.send_bytes(frame(h, tcp::kAuthProofSize));
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    {  // a message instead of the response
        RawClient r(addr);
        r.send_bytes(hello_with_auth());
        r.send_bytes(message_frame(4, 4));
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    {  // no response at all: closed after hello_timeout
        RawClient r(addr);
        r.send_bytes(hello_with_auth());
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    {  // a plain hello, then data
        RawClient r(addr);
        r.send_bytes(hello_frame());
        r.send_bytes(message_frame(4, 4));
        EXPECT_TRUE(r.closed_by_peer(*s.ctx));
    }
    // A client with the secret still gets in.
    Options co;
    co.listen = false;
    co.auth = so.auth;
    Peer c = make_peer("tcp://", co);
    Addr dest = lookup(*c.t, addr);
    auto m = buf_with(*c.t, "ok");
    auto rb = buf_with(*s.t, "", 8);
    bool got = false;
    ASSERT_TRUE(s.t->post_recv_unexpected(
        *s.ctx, [&](const Completion& cp) { got = cp.status == Errc::ok; }, rb));
    ASSERT_TRUE(c.t->post_send_unexpected(*c.ctx, {}, m, 2, dest, 0, 3));
    EXPECT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return got; }));
}

// --- protection of the stream after the handshake (Auth::protect) ---------------------------

TEST(TcpProtect, BothModesCarryMessagesRepliesAndBulk) {
    for (Protect mode : {Protect::integrity, Protect::encryption}) {
        SCOPED_TRACE(mode == Protect::integrity ? "integrity" : "encryption");
        Options so;
        so.auth = auth_with("k", 'p');
        so.auth.protect = mode;
        Options co = so;
        co.listen = false;
        {
            Peer s = make_peer("tcp://127.0.0.1:0", so);
            Peer c = make_peer("tcp://", co);
            Addr dest = lookup(*c.t, s.self());
            // Messages of every size up to the largest: several records each.
            for (std::size_t len : {std::size_t{1}, std::size_t{4000}, tcp::kMaxMessageSize}) {
                auto m = buf_with(*c.t, "", len);
                for (std::size_t i = 0; i < len; ++i)
                    m.data()[i] = std::byte(uint8_t(i * 13 + len));
                auto r = buf_with(*s.t, "", tcp::kMaxMessageSize);
                std::size_t got = 0;
                Addr from;
                ASSERT_TRUE(s.t->post_recv_unexpected(
                    *s.ctx,
                    [&](const Completion& cp) {
                        got = cp.status == Errc::ok ? cp.size : 1;
                        from = cp.source;
                    },
                    r));
                ASSERT_TRUE(c.t->post_send_unexpected(*c.ctx, {}, m, len, dest, 0, 1));
                ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return got != 0; }));
                ASSERT_EQ(got, len);
                EXPECT_EQ(std::memcmp(r.data(), m.data(), len), 0);
                // The reply comes back protected too.
                auto back = buf_with(*s.t, "pong");
                auto cr = buf_with(*c.t, "", 8);
                std::size_t back_got = 0;
                ASSERT_TRUE(c.t->post_recv_unexpected(
                    *c.ctx, [&](const Completion& cp) { back_got = cp.size; }, cr));
                ASSERT_TRUE(s.t->post_send_unexpected(*s.ctx, {}, back, 4, from, 0, 2));
                ASSERT_TRUE(drive({c.ctx.get(), s.ctx.get()}, [&] { return back_got != 0; }));
                EXPECT_EQ(as_string(cr, back_got), "pong");
            }
        }
        RmaPair p(so, co);
        put_get_large(p);
    }
}

TEST(TcpProtect, MismatchedSettingsCloseTheConnectionWithTheSettingNamed) {
    for (bool server_protects : {true, false}) {
        SCOPED_TRACE(server_protects ? "only the server protects" : "only the client protects");
        Options so;
        so.auth = auth_with("k", 'm');
        Options co = so;
        co.listen = false;
        (server_protects ? so : co).auth.protect = Protect::encryption;
        auto o = send_with_auth(so.auth, co.auth);
        // (The send itself may complete: it left this process before the peer refused it.)
        EXPECT_FALSE(o.received) << "a message crossed a mismatched protection";
    }
}

TEST(TcpProtect, ProtectionNeedsASecretAndTcp) {
    Options o;
    o.auth.protect = Protect::integrity;
    auto t = open("tcp://127.0.0.1:0", o);
    ASSERT_FALSE(t);
    EXPECT_EQ(t.code(), Errc::invalid_argument);
    o.auth = auth_with("k", 'a');
    o.auth.protect = Protect::encryption;
    auto sm = open("sm://", o);
    ASSERT_FALSE(sm);
    EXPECT_EQ(sm.code(), Errc::not_supported);
    EXPECT_NE(sm.error().message().find("protect"), std::string::npos) << sm.error().message();
}

TEST(TcpAuth, BadSecretsAndSecretFilesAreRefusedWithTheReason) {
    Options o;
    o.auth.key_id = "k";
    o.auth.secret.assign(8, std::byte{1});
    auto t = open("tcp://127.0.0.1:0", o);
    ASSERT_FALSE(t);
    EXPECT_EQ(t.code(), Errc::invalid_argument);
    o.auth.secret.assign(32, std::byte{1});
    auto built = transports_built();
    if (std::find(built.begin(), built.end(), "ucx") != built.end()) {
        auto u = open("ucx+sm://", o);
        ASSERT_FALSE(u) << "a transport that cannot authenticate opened with a secret";
        EXPECT_EQ(u.code(), Errc::not_supported);
        EXPECT_NE(u.error().message().find("Options::auth"), std::string::npos)
            << u.error().message();
    }

    char path[] = "/tmp/talaria-secret-XXXXXX";
    int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    std::string secret(40, 's');
    ASSERT_EQ(::write(fd, secret.data(), secret.size()), ssize_t(secret.size()));
    ::close(fd);
    ::chmod(path, 0644);
    auto r = read_secret_file(path);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::permission_denied);
    EXPECT_NE(r.error().message().find("chmod"), std::string::npos) << r.error().message();
    ::chmod(path, 0600);
    r = read_secret_file(path);
    ASSERT_TRUE(r) << r.error().describe();
    EXPECT_EQ(r->size(), secret.size());
    ::unlink(path);
}

}  // namespace
}  // namespace talaria::na
