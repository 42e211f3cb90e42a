// tcp address interning is weak: addresses nobody holds are freed, so neither a long-running
// server nor a hostile peer (ever new serialized addresses, memory handles or hello frames)
// can grow the interned table without bound.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "na/tcp/frame.hpp"
#include "na/tcp/tcp.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;

struct Endpoint {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Context> ctx;
    tcp::TcpTransport* tt = nullptr;
    explicit Endpoint(const std::string& address, Options o = {}) {
        auto r = open(address, o);
        EXPECT_TRUE(r) << r.error().describe();
        if (!r) return;
        t = std::move(*r);
        tt = dynamic_cast<tcp::TcpTransport*>(t.get());
        EXPECT_NE(tt, nullptr);
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

std::vector<std::byte> mem_blob(std::string_view owner) {
    tcp::MemBlob m;
    m.base = 0x1000;
    m.length = 64;
    m.key = 42;
    m.access = uint8_t(Access::read_write);
    m.owner = owner;
    std::vector<std::byte> b(tcp::mem_blob_size(owner));
    tcp::encode_mem_blob(m, b.data());
    return b;
}

TEST(TcpAddrIntern, DistinctAddressesAndHandlesDoNotAccumulate) {
    Endpoint s("tcp://127.0.0.1:0");
    Endpoint feeder("tcp://", Options{.listen = false});
    ASSERT_TRUE(s.tt && feeder.tt);
    const std::size_t base = s.tt->live_addrs();
    const std::size_t feeder_base = feeder.tt->live_addrs();
    EXPECT_EQ(base, 1u);  // self
    std::size_t most = 0;
    for (int i = 0; i < 10000; ++i) {
        const std::string name = fmt::format("tcp://127.0.0.{}:{}", 2 + i % 200, 1 + i);
        std::vector<std::byte> blob;
        {
            auto f = feeder.t->addr_lookup(name);
            ASSERT_TRUE(f) << f.error().describe();
            blob = serialized(*feeder.t, *f);
        }
        auto d = s.t->addr_deserialize(blob);
        ASSERT_TRUE(d) << d.error().describe();
        auto l = s.t->addr_lookup(name);
        ASSERT_TRUE(l);
        EXPECT_EQ(*d, *l);  // interned while held
        {
            // A memory handle names its owner: it holds the owner's address while it lives.
            auto h = s.t->mem_deserialize(
                mem_blob(fmt::format("tcp://10.1.{}.{}:{}", i % 250, i / 250, 1000 + i)));
            ASSERT_TRUE(h) << h.error().describe();
            most = std::max(most, s.tt->live_addrs());
        }
        most = std::max(most, s.tt->live_addrs());
    }
    EXPECT_LE(most, base + 2);
    EXPECT_EQ(s.tt->live_addrs(), base);
    EXPECT_EQ(feeder.tt->live_addrs(), feeder_base);
}

TEST(TcpAddrIntern, SameAddressWhileHeldAndFreedAfter) {
    Endpoint s("tcp://127.0.0.1:0");
    ASSERT_TRUE(s.tt);
    const std::size_t base = s.tt->live_addrs();
    {
        auto x = s.t->addr_lookup("tcp://127.0.0.1:4242");
        ASSERT_TRUE(x);
        auto y = s.t->addr_lookup("127.0.0.1:4242");  // another spelling: an alias
        ASSERT_TRUE(y);
        EXPECT_EQ(*x, *y);
        auto y2 = s.t->addr_lookup("127.0.0.1:4242");
        ASSERT_TRUE(y2);
        EXPECT_EQ(*x, *y2);
        auto z = s.t->addr_deserialize(serialized(*s.t, *x));
        ASSERT_TRUE(z);
        EXPECT_EQ(*x, *z);
        auto self = s.t->addr_lookup(s.self());
        ASSERT_TRUE(self);
        EXPECT_EQ(*self, s.t->addr_self());
        EXPECT_EQ(s.tt->live_addrs(), base + 1);
    }
    EXPECT_EQ(s.tt->live_addrs(), base);
    auto again = s.t->addr_lookup("127.0.0.1:4242");
    ASSERT_TRUE(again);
    EXPECT_EQ(s.t->addr_to_string(*again), "tcp://127.0.0.1:4242");
}

/// A raw client that sends a hello as an anonymous (non-listening) peer.
struct HelloClient {
    int fd = -1;
    HelloClient(const std::string& addr, uint64_t instance) {
        auto colon = addr.rfind(':');
        int port = std::stoi(addr.substr(colon + 1));
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(uint16_t(port));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
        tcp::FrameHeader h;
        h.type = tcp::FrameType::hello;
        h.length = uint32_t(tcp::hello_size(""));
        std::vector<std::byte> b(tcp::kFrameHeaderSize + h.length);
        tcp::encode_frame_header(h, b.data());
        tcp::encode_hello(tcp::Hello{instance, ""}, b.data() + tcp::kFrameHeaderSize);
        EXPECT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size()));
    }
    HelloClient(const HelloClient&) = delete;
    HelloClient& operator=(const HelloClient&) = delete;
    ~HelloClient() {
        if (fd >= 0) ::close(fd);
    }
};

bool progress_until(Context& ctx, const std::function<bool()>& done) {
    auto end = Clock::now() + 10s;
    while (!done()) {
        if (Clock::now() > end) return false;
        (void)ctx.progress(1ms);
        ctx.trigger();
    }
    return true;
}

TEST(TcpAddrIntern, AnonymousClientsVanishWhenTheirConnectionCloses) {
    Endpoint s("tcp://127.0.0.1:0");
    ASSERT_TRUE(s.tt);
    const std::size_t base = s.tt->live_addrs();
    const std::string addr = s.self();
    for (int round = 0; round < 5; ++round) {
        std::vector<std::unique_ptr<HelloClient>> clients;
        for (uint64_t i = 0; i < 40; ++i)
            clients.push_back(std::make_unique<HelloClient>(addr, 0xabc00000 + round * 100 + i));
        // Each open connection holds its peer's address.
        ASSERT_TRUE(progress_until(*s.ctx, [&] { return s.tt->live_addrs() == base + 40; }))
            << s.tt->live_addrs();
        const std::string anon = fmt::format("tcp://~{:016x}", 0xabc00000 + round * 100 + 3);
        {
            auto a = s.t->addr_lookup(anon);
            ASSERT_TRUE(a) << a.error().describe();
            EXPECT_EQ(s.t->addr_to_string(*a), anon);
        }
        clients.clear();
        ASSERT_TRUE(progress_until(*s.ctx, [&] { return s.tt->live_addrs() == base; }))
            << s.tt->live_addrs();
        auto gone = s.t->addr_lookup(anon);
        ASSERT_FALSE(gone);
        EXPECT_EQ(gone.error().code(), Errc::unreachable);
    }
}

TEST(TcpAddrIntern, AClientAddressHeldByTheUserOutlivesItsConnection) {
    Endpoint s("tcp://127.0.0.1:0");
    ASSERT_TRUE(s.tt);
    const std::size_t base = s.tt->live_addrs();
    Addr source;
    {
        Endpoint c("tcp://", Options{.listen = false});
        auto dest = c.t->addr_lookup(s.self());
        ASSERT_TRUE(dest);
        auto m = c.t->msg_buf_alloc(4);
        auto r = s.t->msg_buf_alloc(4);
        ASSERT_TRUE(m && r);
        ASSERT_TRUE(s.t->post_recv_unexpected(
            *s.ctx, [&](const Completion& cp) { source = cp.source; }, *r));
        ASSERT_TRUE(c.t->post_send_unexpected(*c.ctx, {}, *m, 4, *dest, 0, 9));
        auto end = Clock::now() + 10s;
        while (!source && Clock::now() < end) {
            (void)c.ctx->progress(Duration::zero());
            c.ctx->trigger();
            (void)s.ctx->progress(1ms);
            s.ctx->trigger();
        }
        ASSERT_TRUE(source);
        EXPECT_EQ(s.t->addr_to_string(source), c.t->addr_to_string(c.t->addr_self()));
    }
    // The client closed; the server notices, but the user still holds the address.
    ASSERT_TRUE(progress_until(*s.ctx, [&] {
        auto l = s.t->addr_lookup(s.t->addr_to_string(source));
        return l && *l == source && s.tt->live_addrs() == base + 1;
    }));
    for (int i = 0; i < 20; ++i)
        (void)s.ctx->progress(1ms);
    EXPECT_EQ(s.tt->live_addrs(), base + 1);
    source.reset();
    EXPECT_EQ(s.tt->live_addrs(), base);
}

TEST(TcpAddrIntern, ThreadsLookUpAndDropConcurrently) {
    Endpoint a("tcp://127.0.0.1:0");
    ASSERT_TRUE(a.tt);
    const std::size_t base = a.tt->live_addrs();
    // Few names, many threads: lookups race with the destruction of the last reference, so a
    // lookup often finds a dying address and must replace it.
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 3000; ++i) {
                const std::string name = fmt::format("tcp://127.0.0.1:{}", 1 + (i + t) % 5);
                auto x = a.t->addr_lookup(name);
                auto y = a.t->addr_lookup(name);
                if (!x || !y || *x != *y || a.t->addr_to_string(*x) != name) ++mismatches;
            }
        });
    for (auto& th : threads)
        th.join();
    EXPECT_EQ(mismatches.load(), 0);
    EXPECT_EQ(a.tt->live_addrs(), base);
}

}  // namespace
}  // namespace talaria::na
