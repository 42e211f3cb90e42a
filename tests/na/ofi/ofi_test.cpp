// ofi transport tests: provider selection and errors, MR mode handling, messages and put/get
// over each provider built here, and peer death found by probing (tcp) and by pid (shm).
#include <rdma/fabric.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "harness.hpp"
#include "na/ofi/ofi.hpp"
#include "output_capture.hpp"
#include "peer_process.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;
using test::alloc_buf;
using test::progress_until;
using test::record;
using test::Recorder;

// Before any test opens a provider (libfabric reads them once, at the first fi_getinfo).
[[maybe_unused]] const bool kProviderEnv = (test::use_recommended_provider_env(), true);

struct Peer {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Context> ctx;
    [[nodiscard]] std::string self() const { return t->addr_to_string(t->addr_self()); }
    [[nodiscard]] ofi::OfiTransport& ofi() const { return static_cast<ofi::OfiTransport&>(*t); }
};

Peer make_peer(std::string_view address, Options o = {}) {
    Peer p;
    auto t = open(address, o);
    EXPECT_TRUE(t) << (t ? "" : t.error().describe());
    if (!t) return p;
    p.t = std::move(*t);
    auto c = p.t->context_create(0);
    EXPECT_TRUE(c) << (c ? "" : c.error().describe());
    if (c) p.ctx = std::move(*c);
    return p;
}

class OfiProviders : public ::testing::TestWithParam<std::string> {};

TEST_P(OfiProviders, SendReceiveBothKindsAndReply) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    EXPECT_EQ(a.t->name(), GetParam().substr(0, GetParam().find(':')));
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b) << to_b.error().describe();
    MsgBuffer sb = alloc_buf(*a.t, 100), rb = alloc_buf(*b.t, 100);
    std::memset(sb.data(), 0x5a, 100);
    Recorder rr, sr;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr), rb));
    auto s = a.t->post_send_unexpected(*a.ctx, record(sr), sb, 100, *to_b, 0, 77);
    ASSERT_TRUE(s) << s.error().describe();
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return rr.done() && sr.done(); }));
    EXPECT_EQ(sr.last.status, Errc::ok);
    EXPECT_EQ(rr.last.status, Errc::ok);
    EXPECT_EQ(rr.last.size, 100u);
    EXPECT_EQ(rr.last.tag, 77u);
    EXPECT_EQ(b.t->addr_to_string(rr.last.source), a.self());
    auto src_lookup = b.t->addr_lookup(a.self());
    ASSERT_TRUE(src_lookup);
    EXPECT_TRUE(*src_lookup == rr.last.source) << "the source is the interned address";
    // Reply (expected) to the source, small enough to be injected after the first send.
    for (int i = 0; i < 3; ++i) {
        Recorder r2, s2;
        ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(r2), sb, *to_b, 5 + i));
        auto e = b.t->post_send_expected(*b.ctx, record(s2), rb, 8, rr.last.source, 0, 5 + i);
        ASSERT_TRUE(e) << e.error().describe();
        ASSERT_TRUE(
            progress_until({a.ctx.get(), b.ctx.get()}, [&] { return r2.done() && s2.done(); }));
        EXPECT_EQ(r2.last.status, Errc::ok);
        EXPECT_EQ(r2.last.size, 8u);
        EXPECT_EQ(s2.last.status, Errc::ok);
    }
}

TEST_P(OfiProviders, ForeignBufferIsCopiedThroughARegisteredBounceBuffer) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    std::vector<std::byte> raw(3000);
    test::fill_pattern(raw, 11);
    MsgBuffer foreign(nullptr, raw.data(), raw.size(), nullptr);
    MsgBuffer rb = alloc_buf(*b.t, 4096);
    Recorder rr, sr;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr), rb));
    auto s = a.t->post_send_unexpected(*a.ctx, record(sr), foreign, raw.size(), *to_b, 0, 1);
    ASSERT_TRUE(s) << s.error().describe();
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return rr.done() && sr.done(); }));
    EXPECT_EQ(sr.last.status, Errc::ok);
    ASSERT_EQ(rr.last.status, Errc::ok);
    EXPECT_EQ(rr.last.size, raw.size());
    EXPECT_FALSE(test::pattern_mismatch(std::span(rb.data(), raw.size()), 11));
}

TEST_P(OfiProviders, MemoryHandleFollowsTheProvidersMrMode) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    const uint64_t mr_mode = b.ofi().provider().mr_mode;
    std::vector<std::byte> region(8192), local(8192);
    test::fill_pattern(region, 3);
    auto rh = b.t->mem_register(region.data(), region.size(), Access::read_write);
    ASSERT_TRUE(rh) << rh.error().describe();
    std::vector<std::byte> blob(b.t->mem_serialize_size(*rh));
    ASSERT_TRUE(b.t->mem_serialize(*rh, blob));
    auto m = ofi::decode_mem_blob(blob);
    ASSERT_TRUE(m) << m.error().describe();
    // FI_MR_VIRT_ADDR: peers address the region by virtual address; otherwise by offset.
    EXPECT_EQ((m->flags & ofi::kMemVirtAddr) != 0, (mr_mode & FI_MR_VIRT_ADDR) != 0);
    EXPECT_EQ(m->base, reinterpret_cast<uintptr_t>(region.data()));
    EXPECT_EQ(m->owner, b.self());
    auto remote = a.t->mem_deserialize(blob);
    ASSERT_TRUE(remote) << remote.error().describe();
    auto lh = a.t->mem_register(local.data(), local.size(), Access::read_write);
    ASSERT_TRUE(lh);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    Recorder g;
    ASSERT_TRUE(a.t->post_get(*a.ctx, record(g), *lh, 100, *remote, 1000, 5000, *to_b));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return g.done(); }));
    ASSERT_EQ(g.last.status, Errc::ok);
    EXPECT_EQ(std::memcmp(local.data() + 100, region.data() + 1000, 5000), 0);
}

TEST_P(OfiProviders, LiveSilentPeerIsProbedAndKept) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    MsgBuffer rb = alloc_buf(*a.t, 64), sb = alloc_buf(*b.t, 64);
    Recorder rr;
    ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(rr), rb, *to_b, 42));
    EXPECT_EQ(a.ofi().watched_peers(), 1u) << "a peer with a pending receive is watched";
    // Over a second of silence: several probes go out; the peer answers none of them itself,
    // yet stays alive because it is progressed.
    auto until = Clock::now() + 1200ms;
    while (Clock::now() < until) {
        (void)a.ctx->progress(5ms);
        a.ctx->trigger();
        (void)b.ctx->progress(0ms);
        b.ctx->trigger();
    }
    EXPECT_FALSE(rr.done()) << "a live peer was declared dead: " << errc_name(rr.last.status);
    auto to_a = b.t->addr_lookup(a.self());
    ASSERT_TRUE(to_a);
    Recorder sr;
    ASSERT_TRUE(b.t->post_send_expected(*b.ctx, record(sr), sb, 64, *to_a, 0, 42));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return rr.done() && sr.done(); }));
    EXPECT_EQ(rr.last.status, Errc::ok);
    EXPECT_EQ(a.ofi().watched_peers(), 0u);
}

TEST_P(OfiProviders, KilledPeerFailsPendingReceiveAndLaterSends) {
    Peer a = make_peer(GetParam());
    ASSERT_TRUE(a.ctx);
    std::string err;
    auto peer = test::PeerProcess::spawn(TALARIA_NA_PEER_PATH, GetParam(), &err);
    ASSERT_TRUE(peer) << err;
    auto to_p = a.t->addr_lookup(peer->address);
    ASSERT_TRUE(to_p) << to_p.error().describe();
    // Talk first (the link is up, and for shm the peer's region is mapped).
    MsgBuffer sb = alloc_buf(*a.t, 16), rb = alloc_buf(*a.t, 64);
    Recorder er, es;
    ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(er), rb, *to_p, test::kPeerEcho));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(es), sb, 16, *to_p, 0, test::kPeerEcho));
    ASSERT_TRUE(progress_until({a.ctx.get()}, [&] { return er.done() && es.done(); }));
    ASSERT_EQ(er.last.status, Errc::ok);
    Recorder rr;
    ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(rr), rb, *to_p, 99));
    std::string shm_file;
    if (GetParam().starts_with("ofi+shm://"))
        shm_file = "/dev/shm/" + peer->address.substr(std::string("ofi+shm://").size());
    auto t0 = Clock::now();
    peer->kill9();
    ASSERT_TRUE(progress_until(
        {a.ctx.get()}, [&] { return rr.done(); }, 10s));
    EXPECT_LT(Clock::now() - t0, 5s);
    EXPECT_EQ(rr.last.status, Errc::disconnected);
    EXPECT_EQ(a.ofi().watched_peers(), 0u);
    // The receive waited in the lane's matcher: failed there, and exactly once.
    test::progress_for({a.ctx.get()}, 50ms);
    EXPECT_EQ(rr.count, 1);
    Recorder s2;
    auto r = a.t->post_send_unexpected(*a.ctx, record(s2), sb, 16, *to_p, 0, test::kPeerEcho);
    ASSERT_TRUE(r);
    ASSERT_TRUE(progress_until(
        {a.ctx.get()}, [&] { return s2.done(); }, 2s));
    EXPECT_EQ(s2.last.status, Errc::disconnected);
    // A new lookup of the name makes a new address (a restarted peer would get a fresh start).
    auto again = a.t->addr_lookup(peer->address);
    ASSERT_TRUE(again);
    EXPECT_FALSE(*again == *to_p);
    if (!shm_file.empty()) {
        struct stat st;
        EXPECT_NE(::stat(shm_file.c_str(), &st), 0)
            << "the killed shm peer's region " << shm_file << " was not removed";
    }
}

TEST_P(OfiProviders, SendToNobodyFailsPromptly) {
    Peer a = make_peer(GetParam());
    ASSERT_TRUE(a.ctx);
    std::string nobody;
    if (GetParam().starts_with("ofi+shm")) {
        nobody = fmt::format("ofi+shm://nobody-{}-00000000", ::getpid() + 1000000);
    } else {
        // A port that was free a moment ago.
        auto probe = open("ofi+tcp://127.0.0.1:0");
        ASSERT_TRUE(probe);
        nobody = (*probe)->addr_to_string((*probe)->addr_self());
    }
    auto to = a.t->addr_lookup(nobody);
    ASSERT_TRUE(to) << to.error().describe();
    MsgBuffer sb = alloc_buf(*a.t, 16);
    Recorder sr;
    auto t0 = Clock::now();
    auto r = a.t->post_send_unexpected(*a.ctx, record(sr), sb, 16, *to, 0, 1);
    if (r) {
        ASSERT_TRUE(progress_until(
            {a.ctx.get()}, [&] { return sr.done(); }, 10s));
        EXPECT_TRUE(sr.last.status == Errc::unreachable || sr.last.status == Errc::disconnected)
            << errc_name(sr.last.status);
    } else {
        EXPECT_TRUE(r.code() == Errc::unreachable || r.code() == Errc::disconnected)
            << r.error().describe();
    }
    EXPECT_LT(Clock::now() - t0, 5s);
}

TEST(OfiShm, SendToAClosedEndpointOfThisProcessFails) {
    Peer a = make_peer("ofi+shm://"), b = make_peer("ofi+shm://");
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    MsgBuffer sb = alloc_buf(*a.t, 16);
    Recorder s1;
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(s1), sb, 16, *to_b, 0, 1));
    ASSERT_TRUE(progress_until({a.ctx.get()}, [&] { return s1.done(); }));
    b.ctx.reset();
    b.t.reset();
    Recorder s2;
    auto r = a.t->post_send_unexpected(*a.ctx, record(s2), sb, 16, *to_b, 0, 1);
    ASSERT_TRUE(r);
    ASSERT_TRUE(progress_until({a.ctx.get()}, [&] { return s2.done(); }));
    EXPECT_EQ(s2.last.status, Errc::disconnected);
}

// shm has no wait fd: a blocked progress polls for a moment after a completion, then sleeps
// in growing slices. Idle, it must sleep, not spin; a message from another thread still wakes it.
TEST(OfiShm, BlockedProgressWithoutAWaitFdSleepsWhenIdle) {
    Peer a = make_peer("ofi+shm://"), b = make_peer("ofi+shm://");
    ASSERT_TRUE(a.ctx && b.ctx);
    auto thread_cpu = [] {
        timespec ts{};
        ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
    };
    auto c0 = thread_cpu();
    auto t0 = Clock::now();
    EXPECT_EQ(a.ctx->progress(500ms).code(), Errc::timeout);
    auto wall = Clock::now() - t0;
    auto cpu = thread_cpu() - c0;
    EXPECT_GE(wall, 500ms);
    EXPECT_LT(cpu, 150ms) << "an idle blocked progress must sleep, not poll ("
                          << std::chrono::duration_cast<std::chrono::microseconds>(cpu).count()
                          << " us CPU in 500 ms)";

    auto to_a = b.t->addr_lookup(a.self());
    ASSERT_TRUE(to_a);
    MsgBuffer rb = alloc_buf(*a.t, 16), sb = alloc_buf(*b.t, 16);
    Recorder r, s;
    ASSERT_TRUE(a.t->post_recv_unexpected(*a.ctx, record(r), rb));
    std::thread sender([&] {
        std::this_thread::sleep_for(100ms);
        ASSERT_TRUE(b.t->post_send_unexpected(*b.ctx, record(s), sb, 16, *to_a, 0, 7));
        ASSERT_TRUE(progress_until({b.ctx.get()}, [&] { return s.done(); }));
    });
    // One blocking progress per try: it returns when the message lands, not after 5 s.
    auto t1 = Clock::now();
    for (int i = 0; i < 50 && !r.done(); ++i) {
        (void)a.ctx->progress(5s);
        a.ctx->trigger();
    }
    auto waited = Clock::now() - t1;
    sender.join();
    ASSERT_TRUE(r.done());
    EXPECT_LT(waited, 3s);
    EXPECT_EQ(r.last.status, Errc::ok);
    EXPECT_EQ(r.last.tag, 7u);
}

// --- shm address vector: 256 peers in libfabric 1.17 ----------------------------------------

// One round trip from a fresh client: an unexpected request, the server's expected reply to the
// request's source. The server's Addr for the client is handed to `keep` (or dropped).
void client_round_trip(Peer& server, const std::string& server_name, int i, std::vector<Addr>* keep,
                       Errc* reply_status, std::string* reply_error) {
    Peer c = make_peer("ofi+shm://");
    ASSERT_TRUE(c.ctx);
    auto to_s = c.t->addr_lookup(server_name);
    ASSERT_TRUE(to_s) << to_s.error().describe();
    MsgBuffer cb = alloc_buf(*c.t, 64), sb = alloc_buf(*server.t, 64);
    Recorder req, sent, rep;
    auto req_r = server.t->post_recv_unexpected(*server.ctx, record(req), sb);
    ASSERT_TRUE(req_r);
    const OpId req_id = *req_r;
    auto rid = c.t->post_recv_expected(*c.ctx, record(rep), cb, *to_s, 9);
    ASSERT_TRUE(rid) << rid.error().describe();
    ASSERT_TRUE(c.t->post_send_unexpected(*c.ctx, record(sent), cb, 16, *to_s, 0, 1));
    ASSERT_TRUE(progress_until(
        {c.ctx.get(), server.ctx.get()},
        [&] {
            return (req.done() && sent.done()) || (sent.done() && sent.last.status != Errc::ok);
        },
        10s))
        << "request " << i;
    if (sent.last.status != Errc::ok) {
        // The server could not even say where its context is: its AV has no room for us.
        *reply_status = sent.last.status;
        *reply_error = "the request failed";
        auto cr = c.t->cancel(*rid);
        ASSERT_TRUE(cr) << cr.error().describe();
        ASSERT_TRUE(progress_until({c.ctx.get()}, [&] { return rep.done(); }));
        auto sr = server.t->cancel(req_id);
        ASSERT_TRUE(sr || req.done());
        ASSERT_TRUE(progress_until({server.ctx.get()}, [&] { return req.done(); }));
        return;
    }
    ASSERT_EQ(req.last.status, Errc::ok) << "request " << i;
    Recorder out;
    auto e = server.t->post_send_expected(*server.ctx, record(out), sb, 8, req.last.source, 0, 9);
    if (!e) {
        *reply_status = e.error().code();
        *reply_error = e.error().message();
    } else {
        ASSERT_TRUE(progress_until({c.ctx.get(), server.ctx.get()}, [&] { return out.done(); }))
            << "reply " << i;
        *reply_status = out.last.status;
        *reply_error = out.last.status == Errc::ok ? "" : "reply completion failed";
        if (out.last.status == Errc::ok) {
            ASSERT_TRUE(progress_until({c.ctx.get()}, [&] { return rep.done(); })) << "reply " << i;
            EXPECT_EQ(rep.last.status, Errc::ok) << "reply " << i;
        }
    }
    if (!rep.done()) {
        // No reply came: withdraw the client's receive before its Recorder goes.
        auto cr = c.t->cancel(*rid);
        ASSERT_TRUE(cr) << cr.error().describe();
        ASSERT_TRUE(progress_until({c.ctx.get()}, [&] { return rep.done(); }));
        EXPECT_EQ(rep.last.status, Errc::canceled);
    }
    if (keep) keep->push_back(req.last.source);
}

TEST(OfiShm, FullAddressVectorFailsTheSendLoudly) {
    // More distinct clients than shm 1.17's AV holds (256): once it is full, the call fails,
    // never a silent loss.
    Peer server = make_peer("ofi+shm://");
    ASSERT_TRUE(server.ctx);
    const std::string name = server.self();
    std::vector<Addr> keep;
    int failed_at = -1;
    for (int i = 0; i < 300 && failed_at < 0; ++i) {
        Errc st = Errc::internal;
        std::string why;
        client_round_trip(server, name, i, &keep, &st, &why);
        if (HasFatalFailure()) return;
        if (st != Errc::ok) {
            failed_at = i;
            // Either the reply fails at once, naming the limit, or (a client the server's
            // context 0 cannot answer: it must insert the client to answer where its context
            // is) the request fails after its locates went unanswered (the server logs a
            // warning naming the limit).
            if (st == Errc::no_memory) {
                EXPECT_NE(why.find("256"), std::string::npos) << why;
                EXPECT_NE(why.find("address vector"), std::string::npos) << why;
            } else {
                EXPECT_EQ(st, Errc::unreachable) << why;
            }
        }
    }
    EXPECT_GE(failed_at, 200) << "the AV should hold a few hundred peers";
    EXPECT_LE(failed_at, 256);
    // Entries are never removed (fi_av_remove crashes shm 1.17): it stays full, loudly.
    keep.clear();
    Errc st = Errc::internal;
    std::string why;
    client_round_trip(server, name, 1000, nullptr, &st, &why);
    EXPECT_TRUE(st == Errc::no_memory || st == Errc::unreachable) << why;
}

// --- contexts as lanes: an endpoint each; expected messages matched by the receiving lane --------

void every_context_has_an_endpoint(const std::string& address, const Options& o) {
    Peer a = make_peer(address, o), b = make_peer(address, o);
    ASSERT_TRUE(a.ctx && b.ctx);
    auto a1 = a.t->context_create(1);
    auto b1 = b.t->context_create(1);
    auto b2 = b.t->context_create(2, ContextOptions{.unexpected = false});
    ASSERT_TRUE(a1 && b1 && b2);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    MsgBuffer sb = alloc_buf(*a.t, 64), rb = alloc_buf(*b.t, 64), rb0 = alloc_buf(*b.t, 64);
    MsgBuffer rb2 = alloc_buf(*b.t, 64), ra = alloc_buf(*a.t, 64), sr = alloc_buf(*b.t, 64);
    MsgBuffer sb2 = alloc_buf(*a.t, 64);  // a buffer carries one send at a time (its header)
    // a's context 1 -> b's context 1: delivered there (a locate asked b's context 0 where).
    test::fill_pattern(sb.span(), 31);
    Recorder r1, s1;
    ASSERT_TRUE(b.t->post_recv_unexpected(**b1, record(r1), rb));
    ASSERT_TRUE(a.t->post_send_unexpected(**a1, record(s1), sb, 64, *to_b, 1, 5));
    ASSERT_TRUE(progress_until({a.ctx.get(), a1->get(), b.ctx.get(), b1->get(), b2->get()},
                               [&] { return r1.done() && s1.done(); }));
    ASSERT_EQ(r1.last.status, Errc::ok);
    EXPECT_EQ(r1.last.context_id, 1);
    EXPECT_FALSE(test::pattern_mismatch(rb.span(), 31));
    // The reply goes back to the endpoint it came from (a's context 1), learned from the
    // header: no locate.
    Recorder rr, ss;
    ASSERT_TRUE(a.t->post_recv_expected(**a1, record(rr), ra, *to_b, 6));
    ASSERT_TRUE(b.t->post_send_expected(**b1, record(ss), sr, 8, r1.last.source, 1, 6));
    ASSERT_TRUE(progress_until({a.ctx.get(), a1->get(), b.ctx.get(), b1->get(), b2->get()},
                               [&] { return rr.done() && ss.done(); }));
    EXPECT_EQ(rr.last.status, Errc::ok);
    EXPECT_EQ(rr.last.context_id, 1);
    // An unexpected message for context 2, which takes none, goes to b's context 0, still
    // naming context 2; an expected one goes to context 2 itself.
    Recorder r0, s0, re, se;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(r0), rb0));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(s0), sb, 16, *to_b, 2, 7));
    auto a_at_b = b.t->addr_lookup(a.self());
    ASSERT_TRUE(a_at_b);
    ASSERT_TRUE(b.t->post_recv_expected(**b2, record(re), rb2, *a_at_b, 8));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(se), sb2, 16, *to_b, 2, 8));
    ASSERT_TRUE(progress_until({a.ctx.get(), a1->get(), b.ctx.get(), b1->get(), b2->get()},
                               [&] { return r0.done() && s0.done() && re.done() && se.done(); }));
    EXPECT_EQ(r0.last.status, Errc::ok);
    EXPECT_EQ(r0.last.context_id, 2);
    EXPECT_EQ(re.last.status, Errc::ok);
    EXPECT_EQ(re.last.context_id, 2);
    r1.last.source.reset();
    r0.last.source.reset();
}

TEST_P(OfiProviders, EveryContextHasAnEndpointOfItsOwnAndPeersFindIt) {
    every_context_has_an_endpoint(GetParam(), {});
}

// --- authentication (Options::auth) --------------------------------------------------------------

Options with_auth(std::string key, char fill) {
    Options o;
    o.auth.key_id = std::move(key);
    o.auth.secret.assign(32, std::byte(fill));
    return o;
}

TEST_P(OfiProviders, AuthenticatedPeersTalkOnEveryContextBothWays) {
    // Locates, replies learned from headers, and sends from the acceptor to the connector's
    // contexts: all after one handshake between the two processes.
    every_context_has_an_endpoint(GetParam(), with_auth("cluster-1", 'k'));
    Peer a = make_peer(GetParam(), with_auth("cluster-1", 'k'));
    Peer b = make_peer(GetParam(), with_auth("cluster-1", 'k'));
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    MsgBuffer sb = alloc_buf(*a.t, 8), rb = alloc_buf(*b.t, 8);
    Recorder rr;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr), rb));
    // Several sends queued while the handshake runs: they wait for it, in order (a buffer
    // carries one send at a time: its header is in front of it).
    std::vector<Recorder> sent(3);
    std::vector<MsgBuffer> bufs;
    for (int i = 0; i < 3; ++i) {
        bufs.push_back(alloc_buf(*a.t, 8));
        ASSERT_TRUE(
            a.t->post_send_unexpected(*a.ctx, record(sent[i]), bufs.back(), 8, *to_b, 0, 10 + i));
    }
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] {
        return rr.done() && sent[0].done() && sent[1].done() && sent[2].done();
    }));
    EXPECT_EQ(rr.last.status, Errc::ok);
    EXPECT_EQ(rr.last.tag, 10u) << "the first send did not arrive first";
    for (auto& r : sent)
        EXPECT_EQ(r.last.status, Errc::ok);
    EXPECT_EQ(b.t->peer_identity(rr.last.source).key_id, "cluster-1");
    EXPECT_EQ(a.t->peer_identity(*to_b).key_id, "cluster-1");
    // Sends to ourselves need no handshake.
    auto me = a.t->addr_lookup(a.self());
    ASSERT_TRUE(me);
    MsgBuffer mine = alloc_buf(*a.t, 8);
    Recorder self_r, self_s;
    ASSERT_TRUE(a.t->post_recv_unexpected(*a.ctx, record(self_r), mine));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(self_s), sb, 8, *me, 0, 3));
    ASSERT_TRUE(progress_until({a.ctx.get()}, [&] { return self_r.done() && self_s.done(); }));
    EXPECT_EQ(self_r.last.status, Errc::ok);
    rr.last.source.reset();
    self_r.last.source.reset();
}

TEST_P(OfiProviders, StrangersAreRefusedWithAccessDenied) {
    struct Case {
        const char* what;
        Options server, client;
    };
    const Case cases[] = {
        {"a different secret", with_auth("k", 'a'), with_auth("k", 'b')},
        {"another key id", with_auth("k", 'a'), with_auth("other", 'a')},
        {"a client without a secret", with_auth("k", 'a'), Options{}},
        {"a server without a secret", Options{}, with_auth("k", 'a')},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        Peer srv = make_peer(GetParam(), c.server), cli = make_peer(GetParam(), c.client);
        ASSERT_TRUE(srv.ctx && cli.ctx);
        auto dest = cli.t->addr_lookup(srv.self());
        ASSERT_TRUE(dest);
        MsgBuffer sb = alloc_buf(*cli.t, 8), sb2 = alloc_buf(*cli.t, 8), rb = alloc_buf(*srv.t, 8);
        Recorder rr, first, second;
        ASSERT_TRUE(srv.t->post_recv_unexpected(*srv.ctx, record(rr), rb));
        ASSERT_TRUE(cli.t->post_send_unexpected(*cli.ctx, record(first), sb, 8, *dest, 0, 1));
        progress_until(
            {cli.ctx.get(), srv.ctx.get()}, [&] { return rr.done(); }, 500ms);
        EXPECT_FALSE(rr.done()) << "the server delivered a stranger's message";
        // A client without a secret learns from the server's refusal: its next send fails.
        ASSERT_TRUE(cli.t->post_send_unexpected(*cli.ctx, record(second), sb2, 8, *dest, 0, 2));
        ASSERT_TRUE(progress_until({cli.ctx.get(), srv.ctx.get()},
                                   [&] { return first.done() && second.done(); }));
        if (c.client.auth.enabled()) {
            EXPECT_EQ(first.last.status, Errc::access_denied) << errc_name(first.last.status);
        }
        EXPECT_EQ(second.last.status, Errc::access_denied) << errc_name(second.last.status);
        EXPECT_FALSE(rr.done());
    }
}

TEST_P(OfiProviders, ExpectedMessageToAContextThePeerDoesNotHaveFailsWithNotFound) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    MsgBuffer sb = alloc_buf(*a.t, 16);
    Recorder s;
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(s), sb, 16, *to_b, 9, 1));
    ASSERT_TRUE(progress_until(
        {a.ctx.get(), b.ctx.get()}, [&] { return s.done(); }, 5s));
    EXPECT_EQ(s.last.status, Errc::not_found);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST_P(OfiProviders, ExpectedMessageLandsInTheUsersBuffer) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    auto to_a = b.t->addr_lookup(a.self());
    ASSERT_TRUE(to_b && to_a);
    MsgBuffer sb = alloc_buf(*a.t, 4096), rb = alloc_buf(*b.t, 4096);
    std::vector<std::byte> raw(4096);  // not from msg_buf_alloc
    MsgBuffer foreign(nullptr, raw.data(), raw.size(), nullptr);
    for (MsgBuffer* dst : {&rb, &foreign}) {
        SCOPED_TRACE(dst == &rb ? "msg_buf_alloc buffer" : "foreign buffer");
        test::fill_pattern(sb.span().first(3000), 21);
        std::memset(dst->data(), 0xee, dst->size());
        const uint64_t before = b.ofi().rx_buffer_messages();
        Recorder rr, sr;
        ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(rr), *dst, *to_a, 0xfeedbeef));
        ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(sr), sb, 3000, *to_b, 0, 0xfeedbeef));
        ASSERT_TRUE(
            progress_until({a.ctx.get(), b.ctx.get()}, [&] { return rr.done() && sr.done(); }));
        EXPECT_EQ(sr.last.status, Errc::ok);
        ASSERT_EQ(rr.last.status, Errc::ok);
        EXPECT_EQ(rr.count, 1);
        EXPECT_EQ(rr.last.size, 3000u);
        EXPECT_EQ(rr.last.tag, 0xfeedbeefu);
        EXPECT_TRUE(rr.last.source == *to_a);
        EXPECT_FALSE(test::pattern_mismatch(std::span(dst->data(), 3000), 21));
        EXPECT_EQ(dst->data()[3000], std::byte{0xee}) << "wrote past the message";
        EXPECT_EQ(b.ofi().rx_buffer_messages(), before + 1)
            << "the expected message was not matched from the lane's receive buffers";
    }
}

TEST_P(OfiProviders, ExpectedMessageTooLargeIsReportedAndTheNextOneArrives) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    auto to_a = b.t->addr_lookup(a.self());
    ASSERT_TRUE(to_b && to_a);
    MsgBuffer sb = alloc_buf(*a.t, 64), small = alloc_buf(*b.t, 16), big = alloc_buf(*b.t, 64);
    test::fill_pattern(sb.span(), 4);
    Recorder rr, sr;
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(rr), small, *to_a, 9));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(sr), sb, 64, *to_b, 0, 9));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return rr.done() && sr.done(); }));
    EXPECT_EQ(rr.last.status, Errc::message_too_large);
    EXPECT_EQ(rr.count, 1);
    EXPECT_TRUE(rr.last.source == *to_a);
    EXPECT_EQ(rr.last.tag, 9u);
    Recorder r2, s2;
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(r2), big, *to_a, 9));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(s2), sb, 64, *to_b, 0, 9));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return r2.done() && s2.done(); }));
    EXPECT_EQ(r2.last.status, Errc::ok);
    EXPECT_EQ(r2.last.size, 64u);
    EXPECT_FALSE(test::pattern_mismatch(big.span().first(64), 4));
}

TEST_P(OfiProviders, CanceledExpectedReceiveCompletesOnceAndTakesNothing) {
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    auto to_a = b.t->addr_lookup(a.self());
    ASSERT_TRUE(to_b && to_a);
    MsgBuffer sb = alloc_buf(*a.t, 32), rb = alloc_buf(*b.t, 32), rb2 = alloc_buf(*b.t, 32);
    Recorder rr;
    auto id = b.t->post_recv_expected(*b.ctx, record(rr), rb, *to_a, 3);
    ASSERT_TRUE(id);
    ASSERT_TRUE(b.t->cancel(*id));
    ASSERT_TRUE(progress_until({b.ctx.get()}, [&] { return rr.done(); }));
    EXPECT_EQ(rr.last.status, Errc::canceled);
    EXPECT_EQ(b.ofi().watched_peers(), 0u);
    // The matcher no longer holds it: the next message with that tag goes to a new receive.
    test::fill_pattern(sb.span(), 8);
    Recorder r2, s2;
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(r2), rb2, *to_a, 3));
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(s2), sb, 32, *to_b, 0, 3));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return r2.done() && s2.done(); }));
    EXPECT_EQ(r2.last.status, Errc::ok);
    EXPECT_FALSE(test::pattern_mismatch(rb2.span(), 8));
    test::progress_for({a.ctx.get(), b.ctx.get()}, 50ms);
    EXPECT_EQ(rr.count, 1) << "the canceled receive completed twice";
    EXPECT_EQ(r2.count, 1);
}

TEST_P(OfiProviders, ExpectedMessagesBeforeAndAfterTheReceiveFromAPeerThatCalledFirst) {
    // A calls B (unexpected) before B ever heard of A. Then B posts an expected receive from A
    // before A sends, A sends one more before B posts its receive (B's lane must queue it), and
    // B replies expected.
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    MsgBuffer sa = alloc_buf(*a.t, 64), ra = alloc_buf(*a.t, 64);
    MsgBuffer sb = alloc_buf(*b.t, 64), rb = alloc_buf(*b.t, 64), rb2 = alloc_buf(*b.t, 64);
    Recorder ur, us;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(ur), rb));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(us), sa, 10, *to_b, 0, 1));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return ur.done() && us.done(); }));
    ASSERT_EQ(ur.last.status, Errc::ok);
    Addr a_at_b = ur.last.source;
    // Receive posted first.
    Recorder r1, s1;
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(r1), rb, a_at_b, 100));
    test::fill_pattern(sa.span(), 1);
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(s1), sa, 64, *to_b, 0, 100));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return r1.done() && s1.done(); }));
    ASSERT_EQ(r1.last.status, Errc::ok);
    EXPECT_FALSE(test::pattern_mismatch(rb.span(), 1));
    // Message first: it arrives and waits in the lane's matcher until the receive is posted.
    Recorder s2;
    test::fill_pattern(sa.span(), 2);
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(s2), sa, 64, *to_b, 0, 101));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return s2.done(); }));
    test::progress_for({a.ctx.get(), b.ctx.get()}, 30ms);
    Recorder r2;
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(r2), rb2, a_at_b, 101));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return r2.done(); }));
    ASSERT_EQ(r2.last.status, Errc::ok);
    EXPECT_FALSE(test::pattern_mismatch(rb2.span(), 2));
    // The reply, B -> A.
    Recorder r3, s3;
    ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(r3), ra, *to_b, 102));
    ASSERT_TRUE(b.t->post_send_expected(*b.ctx, record(s3), sb, 20, a_at_b, 0, 102));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return r3.done() && s3.done(); }));
    EXPECT_EQ(r3.last.status, Errc::ok);
    EXPECT_EQ(r3.last.size, 20u);
}

TEST_P(OfiProviders, ExpectedMessageFromAPeerLookedUpOnlyAfterItArrived) {
    // A sends an expected message to B, which has never heard of A; B looks A up only after
    // the message arrived, then posts the receive.
    Peer a = make_peer(GetParam()), b = make_peer(GetParam());
    ASSERT_TRUE(a.ctx && b.ctx);
    auto to_b = a.t->addr_lookup(b.self());
    ASSERT_TRUE(to_b);
    MsgBuffer sa = alloc_buf(*a.t, 64), rb = alloc_buf(*b.t, 64);
    test::fill_pattern(sa.span(), 6);
    Recorder s1;
    ASSERT_TRUE(a.t->post_send_expected(*a.ctx, record(s1), sa, 64, *to_b, 0, 7));
    ASSERT_TRUE(progress_until({a.ctx.get(), b.ctx.get()}, [&] { return s1.done(); }));
    ASSERT_EQ(s1.last.status, Errc::ok);
    test::progress_for({a.ctx.get(), b.ctx.get()}, 30ms);
    auto to_a = b.t->addr_lookup(a.self());
    ASSERT_TRUE(to_a);
    Recorder r1;
    ASSERT_TRUE(b.t->post_recv_expected(*b.ctx, record(r1), rb, *to_a, 7));
    ASSERT_TRUE(progress_until(
        {a.ctx.get(), b.ctx.get()}, [&] { return r1.done(); }, 3s));
    EXPECT_EQ(r1.last.status, Errc::ok);
    EXPECT_FALSE(test::pattern_mismatch(rb.span(), 6));
}

INSTANTIATE_TEST_SUITE_P(ofi, OfiProviders,
                         ::testing::Values("ofi+tcp://127.0.0.1:0", "ofi+shm://"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                             return std::string(p.param.find("tcp") != std::string::npos ? "tcp"
                                                                                         : "shm");
                         });

// --- opening: provider names, capabilities, address strings -----------------------------------

// libfabric's own messages go to Talaria's log (fi_import_log), never to stdout. With
// FI_LOG_LEVEL=info libfabric reports what it does as a transport opens; ctest runs each test in
// a process of its own, so libfabric reads the variable here first.
TEST(OfiDiagnostics, LibfabricMessagesGoToTheLog) {
    ::setenv("FI_LOG_LEVEL", "info", 1);
    log::set_level(log::Subsys::ofi, log::Level::info);
    auto o = test::capture_output([] {
        auto t = open("ofi+tcp://127.0.0.1:0");
        EXPECT_TRUE(t) << t.error().describe();
    });
    log::set_level(log::Subsys::ofi, log::Level::warn);
    ::unsetenv("FI_LOG_LEVEL");
    EXPECT_EQ(o.out, "") << "libfabric wrote to stdout";
    // Talaria's format: "<time> <tid> info ofi <function>:<line>: libfabric <provider>: ...".
    EXPECT_NE(o.err.find(" info ofi "), std::string::npos) << o.err.substr(0, 4000);
    EXPECT_NE(o.err.find(": libfabric "), std::string::npos) << o.err.substr(0, 4000);
}

TEST(OfiOpen, NameIsTheSchemeAndTcpMeansRxm) {
    auto t = open("ofi+tcp://127.0.0.1:0");
    ASSERT_TRUE(t) << t.error().describe();
    EXPECT_EQ((*t)->name(), "ofi+tcp");
    auto& o = static_cast<ofi::OfiTransport&>(**t);
    EXPECT_EQ(o.provider().prov_name, "tcp;ofi_rxm");
    EXPECT_TRUE(o.provider().wait_fd);
    EXPECT_TRUE((*t)->addr_to_string((*t)->addr_self()).starts_with("ofi+tcp://127.0.0.1:"));
    auto s = open("ofi+shm://");
    ASSERT_TRUE(s) << s.error().describe();
    EXPECT_EQ((*s)->name(), "ofi+shm");
    // shm names carry the pid (peers watch it) and have no wait fd here (poll-sleep).
    EXPECT_NE((*s)->addr_to_string((*s)->addr_self()).find(fmt::format("-{}-", ::getpid())),
              std::string::npos);
    EXPECT_FALSE(static_cast<ofi::OfiTransport&>(**s).provider().wait_fd);
}

TEST(OfiOpen, UnknownProviderIsNamed) {
    auto t = open("ofi+nosuchprov://");
    ASSERT_FALSE(t);
    EXPECT_EQ(t.error().code(), Errc::not_supported);
    EXPECT_NE(t.error().message().find("nosuchprov"), std::string::npos) << t.error().message();
}

TEST(OfiOpen, BadProviderSpellingIsAnAddressError) {
    for (const char* s : {"ofi+TCP://", "ofi+t cp://", "ofi+tcp/x://"}) {
        auto t = open(s);
        ASSERT_FALSE(t) << s;
        EXPECT_EQ(t.error().code(), Errc::address_invalid) << s << ": " << t.error().describe();
    }
}

TEST(OfiOpen, ProviderWithoutReliableDatagramsIsExplained) {
    // psm2 is compiled into this libfabric but has no device here: no RDM endpoint, named in
    // the error with the provider.
    auto t = open("ofi+psm2://");
    if (t) GTEST_SKIP() << "this machine has psm2 hardware";
    EXPECT_EQ(t.error().code(), Errc::not_supported);
    EXPECT_NE(t.error().message().find("psm2"), std::string::npos) << t.error().message();
    EXPECT_NE(t.error().message().find("FI_EP_RDM"), std::string::npos) << t.error().message();
}

TEST(OfiOpen, VerbsIsReachedThroughRxmAndFailsClearlyWithoutHardware) {
    auto t = open("ofi+verbs://mlx5_0");
    if (t) GTEST_SKIP() << "this machine has verbs hardware";
    EXPECT_EQ(t.error().code(), Errc::not_supported);
    EXPECT_NE(t.error().message().find("verbs;ofi_rxm"), std::string::npos) << t.error().message();
}

TEST(OfiOpen, BadHostsAndNamesAreRejected) {
    for (const char* s : {"ofi+tcp://127.0.0.1:99999", "ofi+tcp://127.0.0.1:12x", "ofi+tcp://[::1",
                          "ofi+shm://bad/name", "ofi+shm://with space",
                          "ofi+shm://waytoolongprefixwaytoolongprefix"}) {
        auto t = open(s);
        EXPECT_FALSE(t) << s << " opened";
        if (!t) {
            EXPECT_FALSE(t.error().message().empty()) << s;
        }
    }
}

TEST(OfiOpen, LookupChecksSchemeAndForm) {
    auto t = open("ofi+tcp://127.0.0.1:0");
    ASSERT_TRUE(t);
    for (const char* s : {"tcp://127.0.0.1:5", "ofi+shm://x", "ofi+tcp://127.0.0.1:0",
                          "ofi+tcp://[::1]:5", "ofi+tcp://", "ofi+tcp://1.2.3:4:5"}) {
        auto a = (*t)->addr_lookup(s);
        EXPECT_FALSE(a) << s << " accepted";
    }
    auto a = (*t)->addr_lookup("ofi+tcp://127.0.0.2:7");
    ASSERT_TRUE(a) << a.error().describe();
    EXPECT_EQ((*t)->addr_to_string(*a), "ofi+tcp://127.0.0.2:7");
    auto s = open("ofi+shm://");
    ASSERT_TRUE(s);
    auto n = (*s)->addr_lookup("ofi+shm://some-peer");
    ASSERT_TRUE(n) << n.error().describe();
    EXPECT_EQ((*s)->addr_to_string(*n), "ofi+shm://some-peer");
}

TEST(OfiOpen, TeardownWithOperationsInFlight) {
    for (const char* addr : {"ofi+tcp://127.0.0.1:0", "ofi+shm://"}) {
        Peer a = make_peer(addr), b = make_peer(addr);
        ASSERT_TRUE(a.ctx && b.ctx);
        auto to_b = a.t->addr_lookup(b.self());
        ASSERT_TRUE(to_b);
        std::vector<MsgBuffer> bufs;
        std::vector<Recorder> recs(40);
        for (int i = 0; i < 20; ++i) {
            bufs.push_back(alloc_buf(*a.t, 4096));
            ASSERT_TRUE(
                a.t->post_send_unexpected(*a.ctx, record(recs[i]), bufs.back(), 4096, *to_b, 0, i));
            ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(recs[20 + i]), bufs.back(), *to_b,
                                                1000 + i));
        }
        // Destroy everything without draining: contexts, buffers, addresses, then transports.
        a.ctx.reset();
        b.ctx.reset();
        bufs.clear();
        to_b = Error(Errc::shutdown);
        a.t.reset();
        b.t.reset();
    }
}

}  // namespace
}  // namespace talaria::na
