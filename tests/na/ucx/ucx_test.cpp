// ucx transport tests: address strings, that ucx+sm (and ucx+all, for a local peer) really run
// over shared memory (openucx/ucx#8477), peer death over sm and tcp, an anonymous client, and
// teardown with operations in flight.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "endpoint.hpp"
#include "harness.hpp"
#include "na/base/auth.hpp"
#include "na/ucx/ucx.hpp"
#include "output_capture.hpp"
#include "peer_process.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;
using test::alloc_buf;
using test::progress_until;
using test::record;
using test::Recorder;
using Endpoint = test::TransportEndpoint<ucx::UcxTransport>;

// --- address strings ---------------------------------------------------------------------------

TEST(UcxAddress, SpecsMapOntoUcxSettings) {
    auto tcp = ucx::parse_spec("tcp", "127.0.0.1:0");
    ASSERT_TRUE(tcp) << tcp.error().describe();
    EXPECT_EQ(tcp->mode, ucx::Mode::sockaddr);
    EXPECT_EQ(tcp->tls, "tcp");
    EXPECT_EQ(tcp->host, "127.0.0.1:0");
    EXPECT_EQ(tcp->devices, "");

    auto sm = ucx::parse_spec("sm", "");
    ASSERT_TRUE(sm);
    EXPECT_EQ(sm->mode, ucx::Mode::worker);
    EXPECT_EQ(sm->tls, "sm,self");

    auto all = ucx::parse_spec("all", "");
    ASSERT_TRUE(all);
    EXPECT_EQ(all->mode, ucx::Mode::worker);
    EXPECT_EQ(all->tls, "all");

    auto rc = ucx::parse_spec("rc", "mlx5_0:1/10.0.0.1:7000");
    ASSERT_TRUE(rc) << rc.error().describe();
    EXPECT_EQ(rc->mode, ucx::Mode::sockaddr);
    EXPECT_EQ(rc->tls, "rc");
    EXPECT_EQ(rc->devices, "mlx5_0:1");
    EXPECT_EQ(rc->host, "10.0.0.1:7000");

    auto dc = ucx::parse_spec("dc,sm", "mlx5_0:1,mlx5_1:1/");
    ASSERT_TRUE(dc) << dc.error().describe();
    EXPECT_EQ(dc->mode, ucx::Mode::worker);
    EXPECT_EQ(dc->tls, "dc,sm");
    EXPECT_EQ(dc->devices, "mlx5_0:1,mlx5_1:1");
}

TEST(UcxAddress, BadSpecsAreRefusedWithACause) {
    for (auto [sub, rest] : std::vector<std::pair<std::string, std::string>>{
             {"sm", "127.0.0.1:0"},  // shared memory has no host
             {"", ""},
             {"t cp", ""},
             {"tcp!", ""},
             {"tcp", "a/b/c"},
             {"tcp", "bad dev/127.0.0.1:0"},
             {"tcp", "/127.0.0.1:0"},
         }) {
        auto s = ucx::parse_spec(sub, rest);
        EXPECT_FALSE(s) << "ucx+" << sub << "://" << rest << " accepted";
        if (!s) {
            EXPECT_EQ(s.code(), Errc::address_invalid);
            EXPECT_FALSE(s.error().message().empty());
        }
    }
    for (const char* a : {"ucx+sm://127.0.0.1:0", "ucx+tcp://127.0.0.1:99999", "ucx+://",
                          "ucx://127.0.0.1:0", "ucx+tcp://no such host name:1"}) {
        auto t = open(a);
        EXPECT_FALSE(t) << a << " opened";
        if (!t) {
            EXPECT_FALSE(t.error().message().empty()) << a;
        }
    }
}

TEST(UcxAddress, TransportsOrDevicesNotPresentAreNotSupported) {
    for (const char* a : {"ucx+nosuch://", "ucx+tcp://nodev0/127.0.0.1:0"}) {
        auto t = open(a);
        ASSERT_FALSE(t) << a << " opened";
        EXPECT_EQ(t.code(), Errc::not_supported) << t.error().describe();
        EXPECT_NE(t.error().message().find("ucp_init"), std::string::npos) << t.error().describe();
    }
}

// UCX's own messages go to Talaria's log, never to stdout (where they would corrupt an
// application's output, e.g. talaria-info --json). An environment variable UCX does not know
// makes it warn ("unused env variable") when its context is created. ctest runs each
// test in a process of its own, so this is the first UCX context of the process, and UCX warns.
TEST(UcxDiagnostics, UcxWarningsGoToTheLogNotStdout) {
    ::setenv("UCX_TALARIA_TEST_NO_SUCH_SETTING", "1", 1);
    auto o = test::capture_output([] {
        auto t = open("ucx+tcp://127.0.0.1:0");
        EXPECT_TRUE(t) << t.error().describe();
    });
    ::unsetenv("UCX_TALARIA_TEST_NO_SUCH_SETTING");
    EXPECT_EQ(o.out, "") << "UCX wrote to stdout";
    // The warning, through Talaria's log (warn, subsystem ucx: on by default, to stderr).
    EXPECT_NE(o.err.find("warn ucx"), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("UCX: unused env variable"), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("UCX_TALARIA_TEST_NO_SUCH_SETTING"), std::string::npos) << o.err;
}

TEST(UcxAddress, NamesAndLookups) {
    Endpoint sm("ucx+sm://");
    ASSERT_TRUE(sm.impl);
    EXPECT_EQ(sm.t->name(), "ucx+sm");
    std::string self = sm.self();
    ASSERT_TRUE(self.starts_with("ucx+sm://")) << self;
    EXPECT_TRUE(ucx::is_hex(self.substr(9))) << self;
    // Another family member names the same peer; garbage does not.
    auto a = sm.t->addr_lookup("ucx+all://" + self.substr(9));
    ASSERT_TRUE(a) << a.error().describe();
    EXPECT_EQ(*a, sm.t->addr_self());
    for (const std::string& bad : std::vector<std::string>{
             "ucx+sm://xyz", "ucx+sm://abc", "ucx+sm://ABCD", "bogus://1.2.3.4:5",
             "ucx+sm://" + std::string(ucx::kMaxAddrString + 2, 'a')}) {
        auto r = sm.t->addr_lookup(bad);
        EXPECT_FALSE(r) << bad;
        if (!r) {
            EXPECT_EQ(r.code(), Errc::address_invalid) << bad;
        }
    }

    // Another transport's address: well formed, but not reachable from here.
    auto other = sm.t->addr_lookup("tcp://127.0.0.1:5000");
    ASSERT_FALSE(other);
    EXPECT_EQ(other.code(), Errc::unreachable) << other.error().describe();

    Endpoint tcp("ucx+tcp://127.0.0.1:0");
    ASSERT_TRUE(tcp.impl);
    EXPECT_EQ(tcp.t->name(), "ucx+tcp");
    EXPECT_TRUE(tcp.self().starts_with("ucx+tcp://127.0.0.1:")) << tcp.self();
    EXPECT_FALSE(tcp.t->addr_lookup("ucx+tcp://127.0.0.1:0")) << "port 0 names no peer";
    EXPECT_FALSE(tcp.t->addr_lookup("ucx+tcp://~0123456789abcdef")) << "unknown client";
    // The settings we give UCX, for the record (and the test below).
    bool mm = false, keepalive = false, tls = false;
    for (const auto& [k, v] : sm.impl->ucx_settings()) {
        mm |= k == "MM_ERROR_HANDLING" && v == "y";
        keepalive |= k == "KEEPALIVE_INTERVAL";
        tls |= k == "TLS" && v == "sm,self";
    }
    EXPECT_TRUE(mm && keepalive && tls);
}

// --- shared memory really used
// --------------------------------------------------------------------

/// Busy-poll both contexts until `pred` (10 s at most): what a latency-bound caller does.
bool spin_until(Context& x, Context& y, const std::function<bool()>& pred) {
    auto deadline = Clock::now() + 10s;
    while (!pred()) {
        if (Clock::now() > deadline) return false;
        (void)x.progress(0s);
        x.trigger();
        (void)y.progress(0s);
        y.trigger();
    }
    return true;
}

/// Send one message a -> b and back, so that both endpoints are wired up. `spin`: busy-poll
/// (for timing) instead of the harness's sliced blocking progress.
void ping(Endpoint& a, Endpoint& b, bool spin = false) {
    auto until = [&](const std::function<bool()>& pred) {
        return spin ? spin_until(*a.ctx, *b.ctx, pred)
                    : progress_until({a.ctx.get(), b.ctx.get()}, pred, 10s);
    };
    auto dest = a.t->addr_lookup(b.self());
    ASSERT_TRUE(dest) << dest.error().describe();
    MsgBuffer sb = alloc_buf(*a.t, 8), rb = alloc_buf(*b.t, 8), rrb = alloc_buf(*a.t, 8);
    Recorder sr, rr, back_r, back_s;
    ASSERT_TRUE(b.t->post_recv_unexpected(*b.ctx, record(rr), rb));
    ASSERT_TRUE(a.t->post_recv_expected(*a.ctx, record(back_r), rrb, *dest, 5));
    ASSERT_TRUE(a.t->post_send_unexpected(*a.ctx, record(sr), sb, 8, *dest, 0, 5));
    ASSERT_TRUE(until([&] { return rr.done(); }));
    ASSERT_EQ(rr.last.status, Errc::ok);
    ASSERT_TRUE(b.t->post_send_expected(*b.ctx, record(back_s), rb, 8, rr.last.source, 0, 5));
    ASSERT_TRUE(until([&] { return sr.done() && back_r.done() && back_s.done(); }));
    EXPECT_EQ(back_r.last.status, Errc::ok);
    EXPECT_EQ(back_r.last.source, *dest);
}

/// The UCT transports the lanes of `from`'s endpoint to `to` use, from ucp_ep_print_info.
std::string lanes(Endpoint& from, Endpoint& to) {
    auto a = from.t->addr_lookup(to.self());
    EXPECT_TRUE(a);
    return a ? from.impl->ep_info(*a) : std::string();
}

bool uses_shm(const std::string& info) {
    return info.find("posix/") != std::string::npos || info.find("sysv/") != std::string::npos;
}

TEST(UcxSharedMemory, SmEndpointsRunOverShmWithPeerErrorHandling) {
    Endpoint a("ucx+sm://"), b("ucx+sm://");
    ASSERT_TRUE(a.impl && b.impl && a.ctx && b.ctx);
    ping(a, b);
    std::string info = lanes(a, b);
    EXPECT_TRUE(uses_shm(info)) << info;
    EXPECT_EQ(info.find("tcp/"), std::string::npos) << info;
    // Only endpoints with peer error handling get a keepalive lane.
    EXPECT_NE(info.find("keepalive"), std::string::npos)
        << "the endpoint should have peer error handling:\n"
        << info;
}

TEST(UcxSharedMemory, AllPrefersShmOverTcpForALocalPeer) {
    // The 8477 trap: with peer error handling and without MM_ERROR_HANDLING, ucx+all quietly
    // runs a local peer's messages over tcp.
    Endpoint a("ucx+all://"), b("ucx+all://");
    ASSERT_TRUE(a.impl && b.impl && a.ctx && b.ctx);
    ping(a, b);
    std::string info = lanes(a, b);
    EXPECT_TRUE(uses_shm(info)) << info;
}

TEST(UcxSharedMemory, TcpUsesTcp) {
    Endpoint a("ucx+tcp://127.0.0.1:0"), b("ucx+tcp://127.0.0.1:0");
    ASSERT_TRUE(a.impl && b.impl && a.ctx && b.ctx);
    ping(a, b);
    std::string info = lanes(a, b);
    EXPECT_NE(info.find("tcp/"), std::string::npos) << info;
    EXPECT_FALSE(uses_shm(info)) << info;
}

// --- put/get over ucx+sm
// ---------------------------------------------------------------------------

TEST(UcxSharedMemory, SmRmaLanesAndDirectCopy) {
    // UCX 1.13 gives RMA lanes only to transports with put_short/put_bcopy/get_bcopy: for
    // ucx+sm that is posix/sysv, which reach only memory UCX allocated, so ucp_put/get on user
    // memory would be active-message emulation. ucx+sm therefore copies with process_vm_*.
    Endpoint a("ucx+sm://"), b("ucx+sm://"), t("ucx+tcp://127.0.0.1:0");
    ASSERT_TRUE(a.impl && b.impl && t.impl && a.ctx && b.ctx);
    EXPECT_TRUE(a.impl->direct_rma());
    EXPECT_FALSE(t.impl->direct_rma());
    ping(a, b);
    std::string info = lanes(a, b);
    EXPECT_EQ(info.find("cma/"), std::string::npos)
        << "UCX now picks cma for a lane: ucp_put/get may no longer need the direct path\n"
        << info;
}

TEST(UcxSharedMemory, SmPutGetCopyDirectlyToAnotherProcess) {
    Endpoint me("ucx+sm://");
    ASSERT_TRUE(me.impl && me.ctx);
    std::string err;
    auto peer = test::PeerProcess::spawn(TALARIA_NA_PEER_PATH, "ucx+sm://", &err);
    ASSERT_TRUE(peer) << err;
    auto line = peer->read_line(10s);
    ASSERT_TRUE(line) << "no memory handle line from na_peer";
    auto blob = test::from_hex(*line);
    ASSERT_TRUE(blob);
    auto addr = me.t->addr_lookup(peer->address);
    ASSERT_TRUE(addr) << addr.error().describe();
    auto remote = me.t->mem_deserialize(*blob);
    ASSERT_TRUE(remote) << remote.error().describe();
    // The handle names the owner process, which is not us.
    auto* rm = remote->as<ucx::UcxMem>();
    EXPECT_NE(rm->pid, 0u);
    EXPECT_NE(rm->pid, uint32_t(::getpid()));
    const std::size_t n = (*remote)->length();
    ASSERT_EQ(n, 64u * 1024);
    std::vector<std::byte> mine(n);
    auto local = me.t->mem_register(mine.data(), n, Access::read_write);
    ASSERT_TRUE(local) << local.error().describe();
    auto rma = [&](bool put, std::size_t loff, std::size_t roff, std::size_t len) {
        Recorder r;
        auto id = put ? me.t->post_put(*me.ctx, record(r), *local, loff, *remote, roff, len, *addr)
                      : me.t->post_get(*me.ctx, record(r), *local, loff, *remote, roff, len, *addr);
        EXPECT_TRUE(id) << id.error().describe();
        EXPECT_TRUE(progress_until(
            {me.ctx.get()}, [&] { return r.done(); }, 10s));
        return r.last;
    };
    // The whole region, as na_peer filled it.
    auto c = rma(false, 0, 0, n);
    ASSERT_EQ(c.status, Errc::ok) << errc_name(c.status);
    EXPECT_EQ(c.size, n);
    EXPECT_EQ(test::pattern_mismatch(mine, 7), std::nullopt);
    // Put a new pattern into the middle of it, read it back elsewhere.
    test::fill_pattern(std::span(mine).first(8192), 9);
    c = rma(true, 0, 1000, 8192);
    ASSERT_EQ(c.status, Errc::ok) << errc_name(c.status);
    c = rma(false, 16384, 1000, 8192);
    ASSERT_EQ(c.status, Errc::ok) << errc_name(c.status);
    EXPECT_EQ(test::pattern_mismatch(std::span(mine).subspan(16384, 8192), 9), std::nullopt);
    // The owner dies: a get fails (the process is gone), it does not read stale memory.
    peer->kill9();
    c = rma(false, 0, 0, 4096);
    EXPECT_TRUE(c.status == Errc::disconnected || c.status == Errc::unreachable)
        << errc_name(c.status);
}

// --- put/get served by the target (ucx+tcp) ---------------------------------------------------

/// A client and a server ucx+tcp transport in this process, the client holding handles the
/// server serialized (optionally edited on the way, as a hostile peer would).
struct ServedPair {
    Endpoint s{"ucx+tcp://127.0.0.1:0"};
    Endpoint c{"ucx+tcp://127.0.0.1:0"};
    Addr server;
    ServedPair() {
        auto a = c.t->addr_lookup(s.self());
        EXPECT_TRUE(a) << a.error().describe();
        if (a) server = *a;
    }
    MemHandle ship(const MemHandle& h,
                   const std::function<void(std::vector<std::byte>&)>& edit = {}) {
        std::vector<std::byte> b(s.t->mem_serialize_size(h));
        EXPECT_TRUE(s.t->mem_serialize(h, b));
        if (edit) edit(b);
        auto r = c.t->mem_deserialize(b);
        EXPECT_TRUE(r) << r.error().describe();
        return r ? std::move(*r) : MemHandle();
    }
    Errc run(bool put, const MemHandle& local, std::size_t loff, const MemHandle& remote,
             std::size_t roff, std::size_t len, std::size_t* moved = nullptr) {
        Recorder r;
        auto id = put ? c.t->post_put(*c.ctx, record(r), local, loff, remote, roff, len, server)
                      : c.t->post_get(*c.ctx, record(r), local, loff, remote, roff, len, server);
        if (!id) return id.code();
        EXPECT_TRUE(progress_until(
            {c.ctx.get(), s.ctx.get()}, [&] { return r.done(); }, 20s));
        if (moved) *moved = r.last.size;
        return r.done() ? r.last.status : Errc::timeout;
    }
};

void set_u64(std::vector<std::byte>& b, std::size_t off, uint64_t v) {
    for (int i = 0; i < 8; ++i)
        b[off + i] = std::byte(uint8_t(v >> (8 * i)));
}

bool all_are(const std::vector<uint8_t>& v, uint8_t x) {
    return std::all_of(v.begin(), v.end(), [x](uint8_t b) { return b == x; });
}

TEST(UcxServedRma, NetworkTransportsServePutGetThemselves) {
    Endpoint t("ucx+tcp://127.0.0.1:0"), sm("ucx+sm://");
    ASSERT_TRUE(t.impl && sm.impl);
    EXPECT_TRUE(t.impl->served_rma());
    EXPECT_FALSE(sm.impl->served_rma());  // same host, same user: process_vm_* (Trust model)
    for (const char* sub :
         {"tcp", "all", "ud", "tcp,sm", "rc,ud", "tcp,rc", "ib", "cuda_copy,rc"}) {
        auto spec = ucx::parse_spec(sub, "");
        ASSERT_TRUE(spec);
        EXPECT_TRUE(ucx::serves_rma(*spec)) << sub;
    }
    for (const char* sub : {"sm", "rc", "rc_x", "dc_mlx5", "rc,dc_x"}) {
        auto spec = ucx::parse_spec(sub, "");
        ASSERT_TRUE(spec);
        EXPECT_FALSE(ucx::serves_rma(*spec)) << sub;
    }
}

TEST(UcxServedRma, PutGetLargeAtOffsets) {
    ServedPair p;
    constexpr std::size_t kLen = (8u << 20) + 12345;  // not a whole number of chunks
    std::vector<uint8_t> target(kLen, 0), src(kLen), dst(kLen, 0);
    for (std::size_t i = 0; i < kLen; ++i)
        src[i] = uint8_t(i * 7 + 3);
    auto th = p.s.t->mem_register(target.data(), kLen, Access::read_write);
    auto sh = p.c.t->mem_register(src.data(), kLen, Access::read_only);
    auto dh = p.c.t->mem_register(dst.data(), kLen, Access::write_only);
    ASSERT_TRUE(th && sh && dh);
    MemHandle remote = p.ship(*th);
    EXPECT_TRUE(remote.as<ucx::UcxMem>()->rkey.empty());
    EXPECT_NE(remote.as<ucx::UcxMem>()->key, 0u);
    std::size_t moved = 0;
    EXPECT_EQ(p.run(true, *sh, 0, remote, 0, kLen, &moved), Errc::ok);
    EXPECT_EQ(moved, kLen);
    EXPECT_TRUE(target == src);
    EXPECT_EQ(p.run(false, *dh, 16, remote, 32, kLen - 64, &moved), Errc::ok);
    EXPECT_EQ(moved, kLen - 64);
    EXPECT_TRUE(std::equal(dst.begin() + 16, dst.begin() + 16 + (kLen - 64), src.begin() + 32));
    EXPECT_EQ(dst[0], 0);
    EXPECT_EQ(p.run(true, *sh, 0, remote, kLen, 0), Errc::ok);
}

// Issue 10, item 3: a peer that edits a handle's bytes (access, base, length, key) or keeps one
// whose registration was dropped reads and writes nothing at the target.
TEST(UcxServedRma, TargetRejectsForgedHandlesAndChangesNothing) {
    ServedPair p;
    std::vector<uint8_t> ro_mem(4096, 0xaa), rw_mem(8192, 0xbb), local(16384, 0x11);
    auto ro = p.s.t->mem_register(ro_mem.data(), 4096, Access::read_only);
    auto wo = p.s.t->mem_register(rw_mem.data(), 4096, Access::write_only);  // first half only
    auto lh = p.c.t->mem_register(local.data(), local.size(), Access::read_write);
    ASSERT_TRUE(ro && wo && lh);
    // Blob layout (docs/protocol.md, ucx memory handle): access at 5, base at 8, length at 16,
    // key at 40.
    MemHandle forged_ro = p.ship(*ro, [](auto& b) { b[5] = std::byte{3}; });
    EXPECT_EQ(p.run(true, *lh, 0, forged_ro, 0, 4096), Errc::access_denied);
    EXPECT_TRUE(all_are(ro_mem, 0xaa));
    MemHandle forged_wo = p.ship(*wo, [](auto& b) { b[5] = std::byte{3}; });
    EXPECT_EQ(p.run(false, *lh, 0, forged_wo, 0, 64), Errc::access_denied);
    EXPECT_EQ(local[0], 0x11);
    // Past the end of the real registration: by 8 KiB, and by one byte.
    MemHandle forged_len = p.ship(*wo, [](auto& b) { set_u64(b, 16, 16384); });
    EXPECT_EQ(p.run(true, *lh, 0, forged_len, 4000, 200), Errc::out_of_range);
    EXPECT_EQ(p.run(true, *lh, 0, forged_len, 4096, 8192), Errc::out_of_range);
    EXPECT_EQ(p.run(false, *lh, 0, forged_len, 4096, 8192), Errc::access_denied);
    EXPECT_TRUE(all_are(rw_mem, 0xbb));
    MemHandle forged_ro_len = p.ship(*ro, [](auto& b) { set_u64(b, 16, 12288); });
    EXPECT_EQ(p.run(false, *lh, 0, forged_ro_len, 0, 12288), Errc::out_of_range);
    EXPECT_EQ(local[0], 0x11) << "a refused get wrote nothing";
    // Below the region.
    MemHandle forged_base = p.ship(
        *wo, [&](auto& b) { set_u64(b, 8, reinterpret_cast<uintptr_t>(rw_mem.data()) - 64); });
    EXPECT_EQ(p.run(true, *lh, 0, forged_base, 0, 128), Errc::out_of_range);
    // A key the target never issued.
    MemHandle forged_key = p.ship(*wo, [](auto& b) { b[40] = std::byte(uint8_t(b[40]) ^ 1); });
    EXPECT_EQ(p.run(true, *lh, 0, forged_key, 0, 16), Errc::invalid_argument);
    EXPECT_TRUE(all_are(rw_mem, 0xbb));
    // After every refusal the peer is still usable: a legal put works, exactly where it should.
    MemHandle good = p.ship(*wo);
    EXPECT_EQ(p.run(true, *lh, 0, good, 100, 50), Errc::ok);
    EXPECT_EQ(rw_mem[99], 0xbb);
    EXPECT_EQ(rw_mem[100], 0x11);
    EXPECT_EQ(rw_mem[149], 0x11);
    EXPECT_EQ(rw_mem[150], 0xbb);
    // Deregistered at the target: the key is gone there.
    std::fill(rw_mem.begin(), rw_mem.end(), 0xbb);
    wo->reset();
    EXPECT_EQ(p.run(true, *lh, 0, good, 0, 16), Errc::invalid_argument);
    MemHandle ro_good = p.ship(*ro);
    ro->reset();
    EXPECT_EQ(p.run(false, *lh, 0, ro_good, 0, 16), Errc::invalid_argument);
    EXPECT_EQ(local[0], 0x11);
    EXPECT_TRUE(all_are(rw_mem, 0xbb));
}

TEST(UcxServedRma, ManyLargeGetsBeyondTheAnswerBudgetAllComplete) {
    // 40 gets of 4 MiB while the client does not progress: their windows (2 MiB each) exceed
    // the server's 64 MiB budget of queued get answers, the rest are answered busy and asked
    // again.
    ServedPair p;
    constexpr std::size_t kLen = 4u << 20;
    constexpr int kGets = 40;
    std::vector<uint8_t> target(kLen);
    for (std::size_t i = 0; i < kLen; ++i)
        target[i] = uint8_t(i * 5 + 1);
    auto th = p.s.t->mem_register(target.data(), kLen, Access::read_only);
    ASSERT_TRUE(th);
    MemHandle remote = p.ship(*th);
    std::vector<std::vector<uint8_t>> dst(kGets, std::vector<uint8_t>(kLen, 0));
    std::vector<MemHandle> dh;
    std::vector<Recorder> rec(kGets);
    for (int i = 0; i < kGets; ++i) {
        auto h = p.c.t->mem_register(dst[i].data(), kLen, Access::write_only);
        ASSERT_TRUE(h);
        dh.push_back(std::move(*h));
        ASSERT_TRUE(p.c.t->post_get(*p.c.ctx, record(rec[i]), dh[i], 0, remote, 0, kLen, p.server));
    }
    for (int i = 0; i < 50; ++i)
        (void)p.s.ctx->progress(2ms);
    ASSERT_TRUE(progress_until(
        {p.c.ctx.get(), p.s.ctx.get()},
        [&] { return std::all_of(rec.begin(), rec.end(), [](auto& r) { return r.done(); }); },
        60s));
    for (int i = 0; i < kGets; ++i) {
        EXPECT_EQ(rec[i].last.status, Errc::ok) << i;
        EXPECT_TRUE(dst[i] == target) << i;
    }
}

TEST(UcxServedRma, CancelAndPeerDeathFinishServedTransfers) {
    ServedPair p;
    constexpr std::size_t kLen = 16u << 20;
    std::vector<uint8_t> target(kLen, 1), local(kLen, 0);
    auto th = p.s.t->mem_register(target.data(), kLen, Access::read_write);
    auto lh = p.c.t->mem_register(local.data(), kLen, Access::read_write);
    ASSERT_TRUE(th && lh);
    MemHandle remote = p.ship(*th);
    ASSERT_EQ(p.run(false, *lh, 0, remote, 0, 4096), Errc::ok);  // wired up
    // Canceled before the server answers: completes canceled, and a later get still works.
    Recorder r;
    auto id = p.c.t->post_get(*p.c.ctx, record(r), *lh, 0, remote, 0, kLen, p.server);
    ASSERT_TRUE(id);
    ASSERT_TRUE(p.c.t->cancel(*id));
    ASSERT_TRUE(progress_until(
        {p.c.ctx.get()}, [&] { return r.done(); }, 10s));
    EXPECT_EQ(r.last.status, Errc::canceled);
    EXPECT_EQ(p.run(false, *lh, 0, remote, 0, kLen), Errc::ok);
    // The server goes while a get waits for it: the get fails, it does not hang.
    Recorder d;
    ASSERT_TRUE(p.c.t->post_get(*p.c.ctx, record(d), *lh, 0, remote, 0, kLen, p.server));
    th->reset();  // a handle must not outlive its transport
    p.s.ctx.reset();
    p.s.t.reset();
    ASSERT_TRUE(progress_until(
        {p.c.ctx.get()}, [&] { return d.done(); }, 15s));
    EXPECT_NE(d.last.status, Errc::ok);
}

// --- peer death
// -----------------------------------------------------------------------------------

class UcxPeerDeath : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxPeerDeath, KilledPeerFailsTheWatchWithinFiveSeconds) {
    Endpoint me(GetParam());
    ASSERT_TRUE(me.impl && me.ctx);
    std::string err;
    auto peer = test::PeerProcess::spawn(TALARIA_NA_PEER_PATH, GetParam(), &err);
    ASSERT_TRUE(peer) << err;
    ASSERT_TRUE(peer->read_line(10s)) << "no memory handle line from na_peer";
    auto addr = me.t->addr_lookup(peer->address);
    ASSERT_TRUE(addr) << addr.error().describe();
    // One echo: the link is up.
    MsgBuffer sb = alloc_buf(*me.t, 16), rb = alloc_buf(*me.t, 64);
    Recorder sr, rr;
    ASSERT_TRUE(me.t->post_recv_expected(*me.ctx, record(rr), rb, *addr, test::kPeerEcho));
    ASSERT_TRUE(me.t->post_send_unexpected(*me.ctx, record(sr), sb, 16, *addr, 0, test::kPeerEcho));
    ASSERT_TRUE(progress_until(
        {me.ctx.get()}, [&] { return rr.done() && sr.done(); }, 10s));
    ASSERT_EQ(rr.last.status, Errc::ok);
    // The RPC core's watch: an expected receive with tag 0xFFFFFFFF the peer never answers.
    MsgBuffer wb = alloc_buf(*me.t, 8);
    Recorder watch;
    ASSERT_TRUE(me.t->post_recv_expected(*me.ctx, record(watch), wb, *addr, 0xFFFFFFFFu));
    peer->kill9();
    auto t0 = Clock::now();
    // One blocking progress call with a long deadline: it must wake by itself (keepalive tick
    // for shared memory, the socket for tcp).
    auto r = me.ctx->progress(10s);
    EXPECT_TRUE(r) << "progress returned " << r.error().describe();
    me.ctx->trigger();
    auto waited = Clock::now() - t0;
    ASSERT_TRUE(watch.done()) << "the watch is still pending";
    EXPECT_LT(waited, 5s) << "the peer's death was noticed after "
                          << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                          << " ms";
    EXPECT_TRUE(watch.last.status == Errc::disconnected || watch.last.status == Errc::unreachable)
        << errc_name(watch.last.status);
    // Afterwards: a receive from it fails at once, a send fails, and a new lookup of its name
    // is a fresh address (a new process may come to live there).
    Recorder again, send_after;
    ASSERT_TRUE(me.t->post_recv_expected(*me.ctx, record(again), wb, *addr, 1));
    ASSERT_TRUE(progress_until(
        {me.ctx.get()}, [&] { return again.done(); }, 1s));
    EXPECT_EQ(again.last.status, Errc::disconnected);
    auto s = me.t->post_send_unexpected(*me.ctx, record(send_after), sb, 16, *addr, 0, 1);
    if (s) {
        ASSERT_TRUE(progress_until(
            {me.ctx.get()}, [&] { return send_after.done(); }, 5s));
        EXPECT_NE(send_after.last.status, Errc::ok);
    }
    auto fresh = me.t->addr_lookup(peer->address);
    ASSERT_TRUE(fresh);
    EXPECT_NE(*fresh, *addr);
}

INSTANTIATE_TEST_SUITE_P(ucx, UcxPeerDeath, ::testing::Values("ucx+tcp://127.0.0.1:0", "ucx+sm://"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                             return std::string(p.param.starts_with("ucx+tcp") ? "tcp" : "sm");
                         });

// --- a client that does not listen ---------------------------------------------------------------

/// A client opened with Options::listen = false: ucx+tcp names it by instance ("~<hex>").
Options not_listening() {
    Options o;
    o.listen = false;
    return o;
}

TEST(UcxClient, AnonymousClientIsAnsweredOverItsOwnEndpoint) {
    Endpoint srv("ucx+tcp://127.0.0.1:0");
    Endpoint cli("ucx+tcp://127.0.0.1:0", not_listening());
    ASSERT_TRUE(srv.impl && cli.impl && srv.ctx && cli.ctx);
    EXPECT_TRUE(cli.self().starts_with("ucx+tcp://~")) << cli.self();
    ping(cli, srv);
    // The server knows it by that name while its endpoint is up.
    auto a = srv.t->addr_lookup(cli.self());
    EXPECT_TRUE(a) << a.error().describe();
}

// Each context of a client that does not listen is a progress domain with a worker of its own.
// Its context 1, which never talked to the server before, reaches the server's context 1 (it
// asks the server's context 0 where that is served), is answered at its own worker (the server
// connects back to it), and a server context the client never called (2: a bulk context)
// reads the client's memory.
void contexts_reach_their_own_workers(const Options& so, const Options& co) {
    Endpoint srv("ucx+tcp://127.0.0.1:0", so);
    Endpoint cli("ucx+tcp://127.0.0.1:0", co);
    ASSERT_TRUE(srv.impl && cli.impl && srv.ctx && cli.ctx);
    auto s1 = srv.t->context_create(1);
    auto s2 = srv.t->context_create(2, ContextOptions{.unexpected = false});
    auto c1 = cli.t->context_create(1);
    ASSERT_TRUE(s1 && s2 && c1);
    auto all = {srv.ctx.get(), s1->get(), s2->get(), cli.ctx.get(), c1->get()};
    auto dest = cli.t->addr_lookup(srv.self());
    ASSERT_TRUE(dest) << dest.error().describe();
    MsgBuffer sb = alloc_buf(*cli.t, 64), rb = alloc_buf(*srv.t, 64);
    MsgBuffer rep = alloc_buf(*srv.t, 64), rr = alloc_buf(*cli.t, 64);
    test::fill_pattern(sb.span(), 41);
    test::fill_pattern(rep.span(), 42);
    Recorder got, sent, reply_got, reply_sent;
    ASSERT_TRUE(srv.t->post_recv_unexpected(**s1, record(got), rb));
    ASSERT_TRUE(cli.t->post_recv_expected(**c1, record(reply_got), rr, *dest, 7));
    ASSERT_TRUE(cli.t->post_send_unexpected(**c1, record(sent), sb, 64, *dest, 1, 7));
    ASSERT_TRUE(progress_until(
        all, [&] { return got.done() && sent.done(); }, 10s));
    ASSERT_EQ(got.last.status, Errc::ok);
    EXPECT_EQ(sent.last.status, Errc::ok);
    EXPECT_EQ(got.last.context_id, 1);
    EXPECT_FALSE(test::pattern_mismatch(rb.span(), 41));
    EXPECT_EQ(srv.t->addr_to_string(got.last.source), cli.self());
    ASSERT_TRUE(
        srv.t->post_send_expected(**s1, record(reply_sent), rep, 64, got.last.source, 1, 7));
    ASSERT_TRUE(progress_until(
        all, [&] { return reply_got.done() && reply_sent.done(); }, 10s));
    ASSERT_EQ(reply_got.last.status, Errc::ok);
    EXPECT_FALSE(test::pattern_mismatch(rr.span(), 42));
    EXPECT_EQ(reply_got.last.source, *dest);

    std::vector<std::byte> mem(8192), local(8192);
    test::fill_pattern(mem, 43);
    auto mh = cli.t->mem_register(mem.data(), mem.size(), Access::read_only);
    auto lh = srv.t->mem_register(local.data(), local.size(), Access::read_write);
    ASSERT_TRUE(mh && lh);
    std::vector<std::byte> blob(cli.t->mem_serialize_size(*mh));
    ASSERT_TRUE(cli.t->mem_serialize(*mh, blob));
    auto rh = srv.t->mem_deserialize(blob);
    ASSERT_TRUE(rh) << rh.error().describe();
    Recorder g;
    ASSERT_TRUE(srv.t->post_get(**s2, record(g), *lh, 0, *rh, 0, mem.size(), got.last.source));
    ASSERT_TRUE(progress_until(
        all, [&] { return g.done(); }, 10s));
    EXPECT_EQ(g.last.status, Errc::ok);
    EXPECT_FALSE(test::pattern_mismatch(local, 43)) << "the get did not bring the client's bytes";
    got.last.source.reset();
    rh->reset();
    dest->reset();
    s1->reset();
    s2->reset();
    c1->reset();
}

TEST(UcxClient, AnonymousClientContextsAreReachedAtTheirOwnWorkers) {
    contexts_reach_their_own_workers({}, not_listening());
}

// A server that has never had a peer, blocked in one long progress call (as a Mercury server's
// HG_Trigger with HG_MAX_IDLE_TIME blocks it), wakes for its first client's message: UCX
// accepts the client's connection to its listener on its async thread, which does not always
// signal the worker's fd (before Lane::listen_epfd, the server slept through the whole call in
// worker-address mode and the client's first call waited). The server runs in a thread of its
// own; the client progresses in short slices.
TEST(UcxClient, AServerBlockedInProgressWakesForItsFirstClient) {
    for (std::string addr : {"ucx+tcp://", "ucx+tcp://127.0.0.1:0"}) {
        for (int round = 0; round < 3; ++round) {
            Endpoint srv(addr);
            Endpoint cli(addr, not_listening());
            ASSERT_TRUE(srv.ctx && cli.ctx);
            MsgBuffer sb = alloc_buf(*cli.t, 64), rb = alloc_buf(*srv.t, 64);
            Recorder got, sent;
            ASSERT_TRUE(srv.t->post_recv_unexpected(*srv.ctx, record(got), rb));
            auto dest = cli.t->addr_lookup(srv.self());
            ASSERT_TRUE(dest) << dest.error().describe();
            Duration waited{};
            std::thread server([&] {
                const auto t0 = Clock::now();
                const auto deadline = t0 + 10s;
                while (!got.done() && Clock::now() < deadline) {
                    (void)srv.ctx->progress(deadline - Clock::now());
                    srv.ctx->trigger();
                }
                waited = Clock::now() - t0;
            });
            std::this_thread::sleep_for(50ms);  // the server is asleep in progress by now
            const auto t0 = Clock::now();
            ASSERT_TRUE(cli.t->post_send_unexpected(*cli.ctx, record(sent), sb, 64, *dest, 0, 3));
            const bool sent_ok = progress_until(
                {cli.ctx.get()}, [&] { return sent.done(); }, 10s);
            server.join();
            const auto took =
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
            ASSERT_TRUE(sent_ok) << addr << ": the client's first send did not complete";
            EXPECT_EQ(sent.last.status, Errc::ok) << addr;
            ASSERT_TRUE(got.done()) << addr << ": the server slept through its whole progress call";
            EXPECT_EQ(got.last.status, Errc::ok) << addr;
            // Loose (shared machine): the wire-up is a few ms; the bug cost the whole call.
            EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(),
                      3000 + 50)
                << addr;
            std::printf("%s: first message to a server blocked in progress: %lld ms\n",
                        addr.c_str(), static_cast<long long>(took.count()));
            dest->reset();
            got.last.source.reset();
        }
    }
}

// --- authentication (Options::auth) --------------------------------------------------------------

Options with_auth(std::string key, char fill, bool listen = true) {
    Options o;
    o.listen = listen;
    o.auth.key_id = std::move(key);
    o.auth.secret.assign(32, std::byte(fill));
    return o;
}

/// A client (not listening) sends one unexpected message to a server, each opened with the
/// options given: the send's status, and whether the server received it.
struct AuthOutcome {
    Errc sent = Errc::internal;
    std::string why;
    bool received = false;
};
AuthOutcome send_with_auth(const Options& so, const Options& co) {
    AuthOutcome out;
    Endpoint srv("ucx+tcp://127.0.0.1:0", so);
    Endpoint cli("ucx+tcp://127.0.0.1:0", co);
    if (!srv.ctx || !cli.ctx) return out;
    auto dest = cli.t->addr_lookup(srv.self());
    EXPECT_TRUE(dest);
    if (!dest) return out;
    MsgBuffer sb = alloc_buf(*cli.t, 8), rb = alloc_buf(*srv.t, 8);
    Recorder sr, rr;
    EXPECT_TRUE(srv.t->post_recv_unexpected(*srv.ctx, record(rr), rb));
    auto posted = cli.t->post_send_unexpected(*cli.ctx, record(sr), sb, 8, *dest, 0, 5);
    if (!posted) {
        out.sent = posted.code();
        out.why = posted.error().describe();
    } else {
        EXPECT_TRUE(progress_until(
            {cli.ctx.get(), srv.ctx.get()}, [&] { return sr.done(); }, 10s));
        out.sent = sr.last.status;
    }
    progress_until(
        {cli.ctx.get(), srv.ctx.get()}, [&] { return rr.done(); }, 300ms);
    out.received = rr.done() && rr.last.status == Errc::ok;
    return out;
}

TEST(UcxAuth, PeersWithTheSameSecretTalkBothWays) {
    Options so = with_auth("cluster-1", 'k');
    Endpoint srv("ucx+tcp://127.0.0.1:0", so);
    Endpoint cli("ucx+tcp://127.0.0.1:0", with_auth("cluster-1", 'k', false));
    ASSERT_TRUE(srv.ctx && cli.ctx);
    ping(cli, srv);
    auto a = srv.t->addr_lookup(cli.self());
    ASSERT_TRUE(a) << a.error().describe();
    EXPECT_EQ(srv.t->peer_identity(*a).key_id, "cluster-1");
    EXPECT_TRUE(srv.t->peer_identity(*a).authenticated());
    // Sends to ourselves are signed with a key of our own.
    ping(srv, srv);
}

TEST(UcxAuth, EveryContextOfAnAuthenticatedClientIsReachedBothWays) {
    // Contexts found through locate, endpoints made back to the client's own workers, and a get
    // from a bulk context: every hello on the way is signed with the bootstrap's session.
    contexts_reach_their_own_workers(with_auth("k", 'q'), with_auth("k", 'q', false));
}

TEST(UcxAuth, StrangersAreRefusedWithAccessDenied) {
    struct Case {
        const char* what;
        Options server, client;
        const char* names;  ///< a word the client's error must hold
    };
    Options none;
    none.listen = false;
    const Case cases[] = {
        {"a different secret", with_auth("k", 'a'), with_auth("k", 'b', false), "proof"},
        {"another key id", with_auth("k", 'a'), with_auth("other", 'a', false), "key"},
        {"a client without a secret", with_auth("k", 'a'), none, "authenticate"},
        {"a server without a secret", Options{}, with_auth("k", 'a', false), "secret"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        auto o = send_with_auth(c.server, c.client);
        EXPECT_EQ(o.sent, Errc::access_denied) << errc_name(o.sent) << " " << o.why;
        EXPECT_FALSE(o.received);
        if (!o.why.empty()) {
            EXPECT_NE(o.why.find(c.names), std::string::npos) << o.why;
        }
    }
}

TEST(UcxAuth, WorkerAddressModesRefuseASecret) {
    for (const char* addr : {"ucx+sm://", "ucx+tcp://"}) {
        auto t = open(addr, with_auth("k", 'a'));
        ASSERT_FALSE(t) << addr;
        EXPECT_EQ(t.code(), Errc::not_supported) << addr;
        EXPECT_NE(t.error().message().find("host:port"), std::string::npos) << t.error().message();
    }
}

/// The server's context-0 worker address, from its bootstrap port, proving `o`'s secret as an
/// authenticated client does (wire.hpp): what a peer that once held the secret, or learned the
/// address some other way, knows.
std::vector<std::byte> worker_of(const std::string& server, const Options& o) {
    auto colon = server.rfind(':');
    int port = std::stoi(server.substr(colon + 1));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(uint16_t(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    auto read_n = [&](std::size_t n) {
        std::vector<std::byte> v(n);
        std::size_t got = 0;
        while (got < n) {
            ssize_t r = ::recv(fd, v.data() + got, n - got, 0);
            if (r <= 0) return std::vector<std::byte>{};
            got += std::size_t(r);
        }
        return v;
    };
    const uint64_t me = 0x1234;
    auth::Nonce nonce{};
    nonce.fill(std::byte{7});
    std::vector<std::byte> req(ucx::kBootFixedSize + ucx::boot_request_body_size(o.auth.key_id));
    ucx::encode_boot_fixed({ucx::BootKind::request, req.size() - ucx::kBootFixedSize, me},
                           req.data());
    ucx::encode_boot_request_body(o.auth.key_id, nonce, req.data() + ucx::kBootFixedSize);
    EXPECT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
    auto ch = read_n(ucx::kBootFixedSize + 64);
    EXPECT_FALSE(ch.empty());
    if (ch.empty()) {
        ::close(fd);
        return {};
    }
    auto theirs = std::span<const std::byte>(ch).subspan(ucx::kBootFixedSize, 32);
    auto proof = auth::prove(o.auth.secret, auth::Role::connector, nonce, theirs, o.auth.key_id);
    std::byte resp[ucx::kBootFixedSize + 32];
    ucx::encode_boot_fixed({ucx::BootKind::response, 32, me}, resp);
    std::memcpy(resp + ucx::kBootFixedSize, proof.data(), 32);
    EXPECT_EQ(::send(fd, resp, sizeof resp, MSG_NOSIGNAL), ssize_t(sizeof resp));
    auto fixed = read_n(ucx::kBootFixedSize);
    auto f = ucx::decode_boot_fixed(fixed);
    EXPECT_TRUE(f && f->kind == ucx::BootKind::answer);
    auto worker = f ? read_n(f->length) : std::vector<std::byte>{};
    ::close(fd);
    return worker;
}

TEST(UcxAuth, UnsignedHellosAtTheWorkerStartNothing) {
    // UCX's own ports (the worker's UCT tcp interface) take anyone who has the worker's
    // address. A peer that has it but no session (here: a worker-mode transport, which
    // cannot sign) says hello and sends; the server must deliver nothing, and still serve an
    // authenticated client.
    Options so = with_auth("k", 'w');
    Endpoint srv("ucx+tcp://127.0.0.1:0", so);
    ASSERT_TRUE(srv.ctx);
    auto worker = worker_of(srv.self(), so);
    ASSERT_FALSE(worker.empty());
    Endpoint stranger("ucx+tcp://");
    ASSERT_TRUE(stranger.ctx);
    std::string hex =
        fmt::format("ucx+tcp://{:02x}",
                    fmt::join(reinterpret_cast<const uint8_t*>(worker.data()),
                              reinterpret_cast<const uint8_t*>(worker.data()) + worker.size(), ""));
    auto dest = stranger.t->addr_lookup(hex);
    ASSERT_TRUE(dest) << dest.error().describe();
    MsgBuffer sb = alloc_buf(*stranger.t, 8), rb = alloc_buf(*srv.t, 8);
    Recorder sr, rr;
    ASSERT_TRUE(srv.t->post_recv_unexpected(*srv.ctx, record(rr), rb));
    for (int i = 0; i < 4; ++i)
        ASSERT_TRUE(
            stranger.t->post_send_unexpected(*stranger.ctx, record(sr), sb, 8, *dest, 0, 5));
    progress_until(
        {stranger.ctx.get(), srv.ctx.get()}, [&] { return rr.done(); }, 1s);
    EXPECT_FALSE(rr.done()) << "a message from a peer without a session reached the server";
    // The server still serves a client that proves the secret (the receive posted above takes
    // its message).
    Endpoint cli("ucx+tcp://127.0.0.1:0", with_auth("k", 'w', false));
    ASSERT_TRUE(cli.ctx);
    auto d2 = cli.t->addr_lookup(srv.self());
    ASSERT_TRUE(d2);
    MsgBuffer cb = alloc_buf(*cli.t, 8);
    Recorder cr;
    ASSERT_TRUE(cli.t->post_send_unexpected(*cli.ctx, record(cr), cb, 8, *d2, 0, 6));
    ASSERT_TRUE(progress_until(
        {stranger.ctx.get(), srv.ctx.get(), cli.ctx.get()}, [&] { return rr.done() && cr.done(); },
        10s));
    EXPECT_EQ(rr.last.status, Errc::ok);
    EXPECT_EQ(rr.last.tag, 6u) << "the stranger's message was delivered";
    dest->reset();
    d2->reset();
    rr.last.source.reset();
}

// --- teardown ------------------------------------------------------------------------------------

class UcxTeardown : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTeardown, DestroyWithOperationsInFlight) {
    auto a = std::make_unique<Endpoint>(GetParam());
    auto b = std::make_unique<Endpoint>(GetParam());
    ASSERT_TRUE(a->impl && b->impl);
    ping(*a, *b);
    auto dest = a->t->addr_lookup(b->self());
    auto back = b->t->addr_lookup(a->self());
    ASSERT_TRUE(dest && back);
    // Buffers the test owns (no transport frees them), so they outlive both transports as the
    // contract asks of buffers with operations in flight.
    std::vector<std::byte> mem(64 * 4096);
    std::vector<MsgBuffer> bufs;
    for (int i = 0; i < 64; ++i)
        bufs.emplace_back(nullptr, mem.data() + i * 4096, 4096, nullptr);
    for (int i = 0; i < 32; ++i) {
        (void)a->t->post_send_unexpected(*a->ctx, {}, bufs[i], 4096, *dest, 0, 1);
        (void)a->t->post_recv_expected(*a->ctx, {}, bufs[32 + i], *dest, 99);
        (void)b->t->post_send_expected(*b->ctx, {}, bufs[i], 4096, *back, 0, 98);
    }
    (void)a->ctx->progress(0s);
    (void)b->ctx->progress(0s);
    // Addresses and contexts go first (the contract), then the transports with sends, queued
    // messages and receives in flight: no crash, no leak (the ASan build checks), no hang.
    dest->reset();
    back->reset();
    b.reset();
    a.reset();
}

INSTANTIATE_TEST_SUITE_P(ucx, UcxTeardown, ::testing::Values("ucx+tcp://127.0.0.1:0", "ucx+sm://"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                             return std::string(p.param.starts_with("ucx+tcp") ? "tcp" : "sm");
                         });

// --- first contact
// --------------------------------------------------------------------------------

TEST(UcxLatency, FirstCallToANewPeerIsQuick) {
    for (std::string addr : {"ucx+tcp://127.0.0.1:0", "ucx+sm://"}) {
        Endpoint a(addr), b(addr), c(addr);
        ASSERT_TRUE(a.impl && b.impl && c.impl);
        auto t0 = Clock::now();
        ping(a, b, true);
        auto cold = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0);
        t0 = Clock::now();
        ping(a, c, true);
        auto warm = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0);
        t0 = Clock::now();
        ping(a, c, true);
        auto again = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0);
        std::printf(
            "%s: first round trip to a new peer (connection set-up included): %lld us "
            "(first ever in this worker: %lld us; the next one: %lld us)\n",
            addr.c_str(), static_cast<long long>(warm.count()),
            static_cast<long long>(cold.count()), static_cast<long long>(again.count()));
        // Loose bound (shared machine): the goal is < 5 ms, see the report.
        EXPECT_LT(warm.count(), 100000) << addr;
    }
}

TEST(UcxLatency, EchoRoundTripToAnotherProcess) {
    // An 8-byte request and its reply to a busy-polling peer process, busy-polled here too:
    // compare with ucx_perftest -t tag_lat over the same UCX transports (see the report).
    for (std::string addr : {"ucx+tcp://127.0.0.1:0", "ucx+sm://"}) {
        Endpoint me(addr);
        ASSERT_TRUE(me.impl && me.ctx);
        std::string err;
        auto peer = test::PeerProcess::spawn(TALARIA_UCX_ECHO_PEER_PATH, addr, &err);
        ASSERT_TRUE(peer) << err;
        auto dest = me.t->addr_lookup(peer->address);
        ASSERT_TRUE(dest);
        MsgBuffer sb = alloc_buf(*me.t, 8), rb = alloc_buf(*me.t, 64);
        std::vector<double> us;
        constexpr int kIters = 3000;
        for (int i = 0; i < kIters; ++i) {
            bool got = false, sent = false;
            auto t0 = Clock::now();
            ASSERT_TRUE(me.t->post_recv_expected(
                *me.ctx, [&](const Completion& c) { got = c.status == Errc::ok; }, rb, *dest, 7));
            ASSERT_TRUE(me.t->post_send_unexpected(
                *me.ctx, [&](const Completion&) { sent = true; }, sb, 8, *dest, 0, 7));
            auto deadline = t0 + 5s;
            while (!(got && sent) && Clock::now() < deadline) {
                (void)me.ctx->progress(0s);
                me.ctx->trigger();
            }
            ASSERT_TRUE(got && sent) << "echo " << i << " timed out";
            if (i >= 100)  // warm-up excluded
                us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
        std::sort(us.begin(), us.end());
        std::printf("%s: echo round trip to another process: median %.2f us, p90 %.2f us\n",
                    addr.c_str(), us[us.size() / 2], us[us.size() * 9 / 10]);
        EXPECT_LT(us[us.size() / 2], 1000.0) << addr;  // loose: a shared 2-core machine
    }
}

}  // namespace
}  // namespace talaria::na
