// Errors that name the cause and the remedy (issue 11): a call to a port where nothing listens,
// and to a peer that is not Talaria, over every transport that reaches a host and port.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "talaria/config.hpp"
#include "talaria/talaria.hpp"

namespace talaria::api_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Family {
    const char* name;
    std::string host;  ///< "127.0.0.1" or "[::1]"
    std::string scheme;
    std::string client;  ///< the client engine's address
};

std::vector<Family> families() {
    std::vector<Family> f{{"tcp", "127.0.0.1", "tcp", "tcp://"},
                          {"tcp_ipv6", "[::1]", "tcp", "tcp://[::1]:0"}};
#if TALARIA_HAVE_UCX
    f.push_back({"ucx_tcp", "127.0.0.1", "ucx+tcp", "ucx+tcp://127.0.0.1:0"});
#endif
#if TALARIA_HAVE_OFI
    f.push_back({"ofi_tcp", "127.0.0.1", "ofi+tcp", "ofi+tcp://127.0.0.1:0"});
#endif
    return f;
}

/// A listening socket on the loopback address of `host`'s family, port chosen by the kernel.
struct Listener {
    int fd = -1;
    int port = 0;
    explicit Listener(const std::string& host) {
        bool v6 = host.front() == '[';
        fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_storage ss{};
        socklen_t len = 0;
        if (v6) {
            auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
            a->sin6_family = AF_INET6;
            a->sin6_addr = in6addr_loopback;
            len = sizeof *a;
        } else {
            auto* a = reinterpret_cast<sockaddr_in*>(&ss);
            a->sin_family = AF_INET;
            a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            len = sizeof *a;
        }
        if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) return;
        getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
        port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                        : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    }
    ~Listener() { close(); }
    void close() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
};

class Errors : public ::testing::TestWithParam<Family> {};

// Nothing listens on the port (bound and closed again, never listened): the call fails at once
// with unreachable, saying the connection was refused and asking whether the server runs.
TEST_P(Errors, NothingListensSaysConnectionRefused) {
    const Family& f = GetParam();
    Listener free_port(f.host);
    ASSERT_GT(free_port.port, 0);
    free_port.close();
    std::string where = f.host + ":" + std::to_string(free_port.port);
    Engine client{f.client};
    auto ep = client.lookup(f.scheme + "://" + where);
    auto t0 = Clock::now();
    auto r = client.remote<int(int)>("anything").on(ep).timeout(10s)(1).try_get();
    auto took = Clock::now() - t0;
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::unreachable) << r.error().describe();
    const std::string& m = r.error().message();
    EXPECT_NE(m.find("connection refused by " + where), std::string::npos) << m;
    EXPECT_NE(m.find("(ECONNREFUSED"), std::string::npos) << m;
    EXPECT_NE(m.find("is the server running"), std::string::npos) << m;
    EXPECT_LT(took, 1s) << m;
}

// A peer that answers with bytes that are not Talaria's (an HTTP server, say): the error says
// so, not only the log.
TEST_P(Errors, APeerThatIsNotTalariaIsNamed) {
    const Family& f = GetParam();
    if (f.scheme == "ofi+tcp")
        GTEST_SKIP() << "libfabric's tcp provider drops the connection and retries; it reports no "
                        "cause to tell apart from a peer that died";
    Listener l(f.host);
    ASSERT_EQ(::listen(l.fd, 8), 0);
    std::atomic<bool> stop{false};
    std::thread http([&] {
        while (!stop) {
            pollfd p{l.fd, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            int c = ::accept(l.fd, nullptr, nullptr);
            if (c < 0) continue;
            static const char reply[] =
                "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            (void)!::write(c, reply, sizeof reply - 1);
            std::this_thread::sleep_for(100ms);
            ::close(c);
        }
    });
    Engine client{f.client};
    auto ep = client.lookup(f.scheme + "://" + f.host + ":" + std::to_string(l.port));
    auto r = client.remote<int(int)>("anything").on(ep).timeout(10s)(1).try_get();
    stop = true;
    http.join();
    ASSERT_FALSE(r);
    const std::string& m = r.error().message();
    EXPECT_NE(m.find("not a talaria"), std::string::npos) << r.error().describe();
}

INSTANTIATE_TEST_SUITE_P(api, Errors, ::testing::ValuesIn(families()),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace talaria::api_test
