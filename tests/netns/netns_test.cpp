// Two hosts emulated with network namespaces (tests/na/conformance/netns.hpp): calls between
// them over every transport that reaches another host, and the errors of a call to a host where
// nothing listens on the port (issue 11: fail at once, naming the refusal) or to an address no
// host answers for. Each case runs its client and server as netns_peer processes, one per
// namespace; the test process stays in its own namespace. The cases skip, saying why, where
// namespaces cannot be made (not root, no iproute2, a kernel or container that refuses them).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "netns.hpp"
#include "peer_process.hpp"
#include "talaria/config.hpp"

namespace {

using namespace std::chrono_literals;
using talaria::na::test::Hosts;
using talaria::na::test::PeerProcess;

struct Family {
    const char* name;
    std::string scheme;
};

std::vector<Family> families() {
    std::vector<Family> f{{"tcp", "tcp"}};
#if TALARIA_HAVE_UCX
    f.push_back({"ucx_tcp", "ucx+tcp"});
#endif
#if TALARIA_HAVE_OFI
    f.push_back({"ofi_tcp", "ofi+tcp"});
#endif
    return f;
}

/// What `netns_peer call` printed: "ok <ms> <answer>" or "error <errc> <ms> <message>".
struct Outcome {
    bool ok = false;
    std::string errc;
    long ms = -1;
    std::string text;  ///< the answer, or the error's message
    std::string line;
};

Outcome parse(const std::string& line) {
    Outcome o;
    o.line = line;
    auto word = [&](std::size_t& at) {
        auto sp = line.find(' ', at);
        std::string w = line.substr(at, sp == std::string::npos ? std::string::npos : sp - at);
        at = sp == std::string::npos ? line.size() : sp + 1;
        return w;
    };
    std::size_t at = 0;
    const std::string kind = word(at);
    o.ok = kind == "ok";
    if (kind == "error") o.errc = word(at);
    if (kind == "ok" || kind == "error") o.ms = std::atol(word(at).c_str());
    o.text = line.substr(at);
    return o;
}

class Netns : public ::testing::TestWithParam<Family> {
  protected:
    void SetUp() override {
        std::string why;
        hosts_ = Hosts::create(2, &why);
        if (!hosts_) GTEST_SKIP() << why;
    }

    /// `netns_peer call` in host 0, with a client engine on host 0's address.
    Outcome call_from_host0(const std::string& target, long deadline_ms) {
        std::string err;
        const std::string client = GetParam().scheme + "://" + hosts_->ip(0) + ":0";
        auto p = PeerProcess::spawn(TALARIA_NETNS_PEER,
                                    {"call", client, target, std::to_string(deadline_ms)}, &err,
                                    hosts_->fd(0));
        EXPECT_TRUE(p) << err;
        if (!p) return {};
        Outcome o = parse(p->address);
        std::printf("host 0 -> %s: %s\n", target.c_str(), o.line.c_str());
        EXPECT_EQ(p->wait_exit(10s), 0) << o.line;
        return o;
    }

    std::unique_ptr<Hosts> hosts_;
};

// A server on host 1 answers a client on host 0, over the bridge.
TEST_P(Netns, CallAcrossHosts) {
    std::string err;
    const std::string listen = GetParam().scheme + "://" + hosts_->ip(1) + ":0";
    auto server = PeerProcess::spawn(TALARIA_NETNS_PEER, {"serve", listen}, &err, hosts_->fd(1));
    ASSERT_TRUE(server) << err;
    EXPECT_NE(server->address.find(hosts_->ip(1)), std::string::npos) << server->address;
    Outcome o = call_from_host0(server->address, 10000);
    EXPECT_TRUE(o.ok) << o.line;
    EXPECT_EQ(o.text, "across hosts") << o.line;
}

// Host 1 runs nothing on the port: its kernel refuses the connection, and the call fails at once
// (well before the provider's own retries end), naming the refusal and asking whether the server
// runs. On ofi+tcp a peer on another host cannot be checked through /proc as a local one is:
// the transport's own connect probe learns the refusal.
TEST_P(Netns, NothingListensOnTheOtherHostSaysConnectionRefused) {
    const std::string where = hosts_->ip(1) + ":4321";
    Outcome o = call_from_host0(GetParam().scheme + "://" + where, 10000);
    ASSERT_FALSE(o.ok) << o.line;
    EXPECT_EQ(o.errc, "unreachable") << o.line;
    EXPECT_NE(o.text.find("connection refused by " + where), std::string::npos) << o.line;
    EXPECT_NE(o.text.find("(ECONNREFUSED)"), std::string::npos) << o.line;
    EXPECT_NE(o.text.find("is the server running"), std::string::npos) << o.line;
    EXPECT_LT(o.ms, 1000) << o.line;
}

INSTANTIATE_TEST_SUITE_P(netns, Netns, ::testing::ValuesIn(families()),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
