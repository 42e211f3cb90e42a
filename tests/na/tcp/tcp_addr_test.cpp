// tcp address interning is weak: addresses nobody holds are freed, so neither a long-running
// server nor a hostile peer (ever new memory handles or hello frames) can grow the interned
// table without bound. The transport-independent part (distinct lookups and serialized
// addresses, same Addr while held, concurrent lookups) is in
// tests/na/conformance/addr_lifetime_test.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "endpoint.hpp"
#include "harness.hpp"
#include "na/tcp/frame.hpp"
#include "na/tcp/tcp.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {
namespace {

using namespace std::chrono_literals;

using Endpoint = test::TransportEndpoint<tcp::TcpTransport>;

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

TEST(TcpAddrIntern, DistinctMemoryHandleOwnersDoNotAccumulate) {
    Endpoint s("tcp://127.0.0.1:0");
    ASSERT_TRUE(s.impl);
    const std::size_t base = s.impl->live_addrs();
    EXPECT_EQ(base, 1u);  // self
    std::size_t most = 0;
    for (int i = 0; i < 10000; ++i) {
        {
            // A memory handle names its owner: it holds the owner's address while it lives.
            auto h = s.t->mem_deserialize(
                mem_blob(fmt::format("tcp://10.1.{}.{}:{}", i % 250, i / 250, 1000 + i)));
            ASSERT_TRUE(h) << h.error().describe();
            EXPECT_EQ(s.impl->live_addrs(), base + 1);
            most = std::max(most, s.impl->live_addrs());
        }
        most = std::max(most, s.impl->live_addrs());
    }
    EXPECT_LE(most, base + 1);
    EXPECT_EQ(s.impl->live_addrs(), base);
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

TEST(TcpAddrIntern, AnonymousClientsVanishWhenTheirConnectionCloses) {
    Endpoint s("tcp://127.0.0.1:0");
    ASSERT_TRUE(s.impl);
    const std::size_t base = s.impl->live_addrs();
    const std::string addr = s.self();
    for (int round = 0; round < 5; ++round) {
        std::vector<std::unique_ptr<HelloClient>> clients;
        for (uint64_t i = 0; i < 40; ++i)
            clients.push_back(std::make_unique<HelloClient>(addr, 0xabc00000 + round * 100 + i));
        // Each open connection holds its peer's address.
        ASSERT_TRUE(test::progress_until({s.ctx.get()}, [&] {
            return s.impl->live_addrs() == base + 40;
        })) << s.impl->live_addrs();
        const std::string anon = fmt::format("tcp://~{:016x}", 0xabc00000 + round * 100 + 3);
        {
            auto a = s.t->addr_lookup(anon);
            ASSERT_TRUE(a) << a.error().describe();
            EXPECT_EQ(s.t->addr_to_string(*a), anon);
        }
        clients.clear();
        ASSERT_TRUE(test::progress_until({s.ctx.get()}, [&] {
            return s.impl->live_addrs() == base;
        })) << s.impl->live_addrs();
        auto gone = s.t->addr_lookup(anon);
        ASSERT_FALSE(gone);
        EXPECT_EQ(gone.error().code(), Errc::unreachable);
    }
}

TEST(TcpAddrIntern, AClientAddressHeldByTheUserOutlivesItsConnection) {
    Endpoint s("tcp://127.0.0.1:0");
    ASSERT_TRUE(s.impl);
    const std::size_t base = s.impl->live_addrs();
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
        ASSERT_TRUE(test::progress_until({c.ctx.get(), s.ctx.get()},
                                         [&] { return static_cast<bool>(source); }));
        EXPECT_EQ(s.t->addr_to_string(source), c.t->addr_to_string(c.t->addr_self()));
    }
    // The client closed; the server notices, but the user still holds the address.
    ASSERT_TRUE(test::progress_until({s.ctx.get()}, [&] {
        auto l = s.t->addr_lookup(s.t->addr_to_string(source));
        return l && *l == source && s.impl->live_addrs() == base + 1;
    }));
    for (int i = 0; i < 20; ++i)
        (void)s.ctx->progress(1ms);
    EXPECT_EQ(s.impl->live_addrs(), base + 1);
    source.reset();
    EXPECT_EQ(s.impl->live_addrs(), base);
}

}  // namespace
}  // namespace talaria::na
