// Client and server in separate processes, as users run them: api_peer is the server (a listening
// talaria::Engine), this process the client. What two engines of one process cannot show: a
// context the server lacks, and a server restarted at the same address.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api_fixture.hpp"
#include "harness.hpp"
#include "peer_process.hpp"
#include "talaria/talaria.hpp"

namespace talaria::api_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using na::test::PeerProcess;
using na::test::TransportKind;

std::unique_ptr<PeerProcess> start_server(const std::string& address, int contexts,
                                          const std::string& key = {}) {
    std::string err;
    std::vector<std::string> args{address, std::to_string(contexts)};
    if (!key.empty()) args.push_back(key);
    auto p = PeerProcess::spawn(TALARIA_API_PEER_PATH, args, &err);
    EXPECT_TRUE(p) << "api_peer " << address << ": " << err;
    return p;
}

/// A client address of the server's transport (the server's own with port 0, or the bare scheme).
std::string client_address(const TransportKind& k) {
    return k.address;
}

class ApiProcess : public ::testing::TestWithParam<TransportKind> {};

// A call to a context the server lacks fails at once with not_found, naming it and how many the
// server has, in blocking and in busy mode (over sm it waited for ever when the server was
// another process).
TEST_P(ApiProcess, CallToMissingContextFailsPromptly) {
    const TransportKind& k = GetParam();
    auto server = start_server(k.address, 2);
    ASSERT_TRUE(server);
    for (WaitMode wait : {WaitMode::block, WaitMode::busy}) {
        SCOPED_TRACE(wait == WaitMode::block ? "block" : "busy");
        EngineOptions o;
        o.wait = wait;
        Engine client{client_address(k), o};
        auto ep = client.lookup(server->address);
        auto echo = client.remote<uint64_t(uint64_t)>("echo").on(ep);
        // First calls of this client, before any to a context that exists (whose connection
        // the answer could otherwise go back on). 2: the id of the server's bulk context (it
        // exists at the transport, takes no calls); 5 and 200: no context at all.
        for (uint8_t target : {uint8_t(2), uint8_t(5), uint8_t(200)}) {
            auto t0 = Clock::now();
            auto r = result_within(echo.context(target).timeout(10s)(1), 15s);
            auto took = Clock::now() - t0;
            ASSERT_FALSE(r) << "context " << int(target);
            EXPECT_EQ(r.code(), Errc::not_found) << r.error().describe();
            EXPECT_NE(
                r.error().message().find("context " + std::to_string(target) + " does not exist"),
                std::string::npos)
                << r.error().describe();
            EXPECT_NE(r.error().message().find("(it has 2)"), std::string::npos)
                << r.error().describe();
            EXPECT_LT(took, 2s) << "context " << int(target) << ": " << r.error().describe();
        }
        // The endpoint still works.
        EXPECT_EQ(value_within(echo.context(0).timeout(10s)(9)), 9u);
        EXPECT_EQ(value_within(echo.context(1).timeout(10s)(8)), 8u);
    }
}

/// The address a restarted server listens at again: an sm name of this test's own, or the port
/// the first server was given.
std::string fixed_address(const TransportKind& k) {
    if (k.label == "sm") return "sm://api-restart-" + std::to_string(::getpid());
    return k.address;
}

// A server killed and started again at the same address is reached through the endpoint the
// client already holds, on sm as on tcp; calls while it is down fail, naming the peer.
TEST_P(ApiProcess, ARestartedServerIsReachedThroughTheSameEndpoint) {
    const TransportKind& k = GetParam();
    if (k.label != "sm" && k.label != "tcp" && k.label != "tcp_ipv6")
        GTEST_SKIP() << "restarts at a fixed address are checked on sm and tcp";
    auto server = start_server(fixed_address(k), 1);
    ASSERT_TRUE(server);
    const std::string address = server->address;  // with tcp's port, to listen at again
    Engine client{client_address(k)};
    auto ep = client.lookup(address);
    auto pid = client.remote<int64_t()>("pid").on(ep).timeout(10s);
    ASSERT_EQ(value_within(pid()), int64_t(server->pid()));

    server->kill9();
    auto down = result_within(pid(), 15s);
    ASSERT_FALSE(down);
    EXPECT_TRUE(down.code() == Errc::disconnected || down.code() == Errc::unreachable)
        << down.error().describe();

    server = start_server(address, 1);
    ASSERT_TRUE(server);
    ASSERT_EQ(server->address, address);
    // The first call may still meet the old connection's end; the next ones reach the new
    // server, through the same endpoint.
    Result<int64_t> r = Error(Errc::unreachable, "not called");
    auto until = Clock::now() + 10s;
    int tries = 0;
    while (Clock::now() < until) {
        ++tries;
        r = result_within(pid(), 15s);
        if (r) break;
        std::this_thread::sleep_for(50ms);
    }
    ASSERT_TRUE(r) << "after " << tries << " calls: " << r.error().describe();
    EXPECT_EQ(*r, int64_t(server->pid()));
    EXPECT_LE(tries, 2) << "the restarted server was reached only at call " << tries;
}

// A server of another process that asks for a secret: the caller without one reads the server's
// refusal and its own remedy in the exception, on every transport that authenticates.
TEST_P(ApiProcess, AnAuthRefusalReachesTheCallerInAnotherProcess) {
    const TransportKind& k = GetParam();
    if (k.label != "tcp" && k.label != "tcp_ipv6" && k.label != "ofi_tcp" && k.label != "ucx_tcp")
        GTEST_SKIP() << "sm, ofi+shm and ucx+sm admit by user id, not a secret";
    auto server = start_server(k.address, 1, "svc");
    ASSERT_TRUE(server);
    Engine client{client_address(k)};
    auto r = result_within(client.remote<uint64_t(uint64_t)>("echo")
                               .on(client.lookup(server->address))
                               .timeout(10s)(1),
                           15s);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::access_denied) << r.error().describe();
    for (const char* w : {"admits only peers that authenticate with the secret of key 'svc'",
                          "this client holds no secret", "na.auth"})
        EXPECT_NE(r.error().message().find(w), std::string::npos) << w << "\n"
                                                                  << r.error().describe();
}

INSTANTIATE_TEST_SUITE_P(api, ApiProcess, ::testing::ValuesIn(na::test::multi_process_kinds()),
                         [](const auto& p) { return p.param.label; });

}  // namespace
}  // namespace talaria::api_test
