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

EngineOptions with_secret(std::string key_id, char fill, na::Protect protect = na::Protect::none) {
    EngineOptions o;
    o.core.na.auth.key_id = std::move(key_id);
    o.core.na.auth.secret.assign(32, std::byte(fill));
    o.core.na.auth.protect = protect;
    return o;
}

/// The failed call's error against a server that holds the secret of key "svc" (filled 's').
Error refused_call(const Family& f, const EngineOptions& server_opts,
                   const EngineOptions& client_opts) {
    Engine server{f.scheme + "://" + f.host + ":0", listen, server_opts};
    server.define("twice", [](int x) { return 2 * x; });
    Engine client{f.client, client_opts};
    auto r = client.remote<int(int)>("twice")
                 .on(client.lookup(server.self_address()))
                 .timeout(10s)(21)
                 .try_get();
    if (r) return Error(Errc::ok, "the call succeeded");
    return r.error();
}

// A refused connection's reason (which only the logs held) reaches the caller's exception, with
// the remedy on the caller's side: no secret, another secret, another key id.
TEST_P(Errors, AnAuthRefusalSaysWhyInTheCallersError) {
    const Family& f = GetParam();
    const EngineOptions server = with_secret("svc", 's');
    struct Case {
        const char* name;
        EngineOptions client;
        std::vector<std::string> words;  ///< each in the message
    };
    std::vector<Case> cases{
        {"no secret",
         EngineOptions{},
         {"admits only peers that authenticate with the secret of key 'svc'",
          "this client holds no secret", "na.auth"}},
        {"another secret",
         with_secret("svc", 'x'),
         {"could not prove that it holds the secret of key 'svc'",
          "the same key id, secret and protect on both sides"}},
        {"another key id",
         with_secret("other", 's'),
         {"names key \"other\", this server holds key 'svc'",
          "this client holds the secret of key 'other'", "na.auth"}},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        Error e = refused_call(f, server, c.client);
        ASSERT_NE(e.code(), Errc::ok);
        EXPECT_EQ(e.code(), Errc::access_denied) << e.describe();
        for (const std::string& w : c.words)
            EXPECT_NE(e.message().find(w), std::string::npos) << "wanted: " << w << "\n"
                                                              << e.describe();
    }
}

// tcp: protect set on one side only; the side that meets the other's bytes closes, and the
// caller's error names the setting either way round.
TEST_P(Errors, AProtectMismatchSaysWhyInTheCallersError) {
    const Family& f = GetParam();
    if (f.scheme != "tcp") GTEST_SKIP() << "na::Auth::protect is tcp's alone";
    auto plain = with_secret("svc", 's');
    auto sealed = with_secret("svc", 's', na::Protect::encryption);
    for (bool server_seals : {true, false}) {
        SCOPED_TRACE(server_seals ? "the server protects" : "the client protects");
        Error e = refused_call(f, server_seals ? sealed : plain, server_seals ? plain : sealed);
        ASSERT_NE(e.code(), Errc::ok);
        const std::string& m = e.message();
        EXPECT_NE(m.find("na::Auth::protect"), std::string::npos) << e.describe();
        EXPECT_NE(m.find(server_seals ? "and does not protect its stream"
                                      : "and protects its stream (encryption)"),
                  std::string::npos)
            << e.describe();
    }
}

// Messages that point at what the user touched: a scheme written "tcp:/", a typo in one, port 0
// (the address a server reports), arguments past core.max_payload.
TEST(ErrorsWording, AddressesAndSizesNameWhatToChange) {
    Engine client{"tcp://"};
    auto one_slash = client.try_lookup("tcp:/127.0.0.1:7000");
    ASSERT_FALSE(one_slash);
    EXPECT_NE(one_slash.error().message().find("did you mean 'tcp://127.0.0.1:7000'"),
              std::string::npos)
        << one_slash.error().describe();
    EXPECT_EQ(one_slash.error().message().find("IPv6"), std::string::npos)
        << one_slash.error().describe();

    auto typo = Engine::open("tpc://127.0.0.1:0", false);
    ASSERT_FALSE(typo);
    EXPECT_NE(typo.error().message().find("did you mean 'tcp://'"), std::string::npos)
        << typo.error().describe();
    auto typo2 = Engine::open("ofi+tpc://127.0.0.1:0", false);
    ASSERT_FALSE(typo2);
    auto far = Engine::open("zzzzzz://", false);
    ASSERT_FALSE(far);
    EXPECT_EQ(far.error().message().find("did you mean"), std::string::npos)
        << far.error().describe();

    auto port0 = client.try_lookup("tcp://127.0.0.1:0");
    ASSERT_FALSE(port0);
    EXPECT_NE(port0.error().message().find("Engine::self_address()"), std::string::npos)
        << port0.error().describe();

    EngineOptions small;
    small.core.max_payload = 1 << 16;
    Engine server{"tcp://127.0.0.1:0", listen};
    server.define("size", [](const std::vector<uint8_t>& v) { return v.size(); });
    Engine sender{"tcp://", small};
    auto r = sender.remote<std::size_t(std::vector<uint8_t>)>("size")
                 .on(sender.lookup(server.self_address()))
                 .timeout(10s)(std::vector<uint8_t>(1 << 17))
                 .try_get();
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::message_too_large);
    for (const char* w : {"core.max_payload", "EngineOptions::core.max_payload", "talaria::Bulk"})
        EXPECT_NE(r.error().message().find(w), std::string::npos)
            << w << ": " << r.error().describe();
}

INSTANTIATE_TEST_SUITE_P(api, Errors, ::testing::ValuesIn(families()),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace talaria::api_test
