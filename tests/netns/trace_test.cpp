// Issue 12: a call's trace id in the logs of both processes. netns_peer serves echo in another
// process logging rpc=trace to a file (TALARIA_LOG, TALARIA_LOG_FILE in its environment only);
// this process calls it with a trace id and logs to a sink. Both logs name the id, so they can
// be joined. No namespace: two processes of this host over tcp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "peer_process.hpp"
#include "talaria/talaria.hpp"
#include "talaria/util/log.hpp"

namespace {

using namespace std::chrono_literals;
using talaria::na::test::PeerProcess;

TEST(TraceAcrossProcesses, TheIdIsInBothProcessesLogs) {
    char path[] = "/tmp/talaria-trace-test-XXXXXX";
    const int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    ::close(fd);
    std::string err;
    auto peer =
        PeerProcess::spawn("/usr/bin/env",
                           {"TALARIA_LOG=warn,rpc=trace", std::string("TALARIA_LOG_FILE=") + path,
                            TALARIA_NETNS_PEER, "serve", "tcp://127.0.0.1:0"},
                           &err);
    ASSERT_TRUE(peer) << err;

    std::mutex mu;
    std::vector<std::string> mine;
    talaria::log::set_sink([&](const talaria::log::Record& r) {
        std::lock_guard g(mu);
        mine.emplace_back(r.message);
    });
    talaria::log::set_level(talaria::log::Subsys::rpc, talaria::log::Level::trace);
    std::string answer;
    {
        talaria::Engine client("tcp://127.0.0.1:0");
        answer = client.remote<std::string(std::string)>("echo")
                     .on(client.lookup(peer->address))
                     .trace(0x00c0ffee0ddba115ull)
                     .timeout(10s)("traced")
                     .get();
    }
    talaria::log::set_level(talaria::log::Subsys::rpc, talaria::log::Level::warn);
    talaria::log::set_sink({});
    EXPECT_EQ(answer, "traced");
    peer->close_stdin();
    EXPECT_EQ(peer->wait_exit(10s), 0);

    const std::string id = "trace 00c0ffee0ddba115";  // 16 hex digits, zero-padded
    auto count = [&](const std::string& text, const char* what) {
        int n = 0;
        std::istringstream in(text);
        std::string line;
        while (std::getline(in, line))
            n += line.find(what) != std::string::npos && line.find(id) != std::string::npos;
        return n;
    };
    std::string client_log;
    for (const auto& l : mine)
        client_log += l + "\n";
    EXPECT_EQ(count(client_log, "call echo seq"), 2) << client_log;  // sent, completed
    std::ifstream f(path);
    std::stringstream server_log;
    server_log << f.rdbuf();
    ::unlink(path);
    EXPECT_EQ(count(server_log.str(), "serve echo seq"), 1) << server_log.str();
    EXPECT_EQ(count(server_log.str(), "answer echo seq"), 1) << server_log.str();
}

}  // namespace
