// fork() in a process with open engines (issue 10, item 8). The test process runs a server
// engine and a client engine of the transport under test, starts a call, and forks. The child
// must find every use of the inherited engines refused at once with Errc::invalid_state, must
// be able to destroy them without touching the parent's threads, connections, rings or
// registrations, and must be able to open an engine of its own that calls the parent's server.
// The parent must carry on as if nothing happened: its call in flight completes, its server
// still answers, its client's next calls succeed (before issue 10 the child's use of the
// inherited client made the server see a duplicate message on sm and ucx+tcp, and a child hung
// past its own deadline on every transport).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "talaria/talaria.hpp"

using namespace talaria;
using namespace std::chrono_literals;
using na::test::TransportKind;

namespace {

class Fork : public ::testing::TestWithParam<TransportKind> {};

std::string kind_name(const ::testing::TestParamInfo<TransportKind>& info) {
    return info.param.label;
}

/// What the child checks, one bit each: the exit status names the checks that failed.
enum ChildFailure : int {
    kInFlightNotRefused = 1,  ///< get() on the parent's call in flight was not invalid_state
    kCallNotRefused = 2,      ///< a new call through the inherited client was not refused
    kLookupNotRefused = 4,    ///< lookup on the inherited client was not refused
    kSlow = 8,                ///< a refusal or the destruction took longer than kPrompt
    kOwnEngineFailed = 16,    ///< the child's own engine could not call the parent's server
    kWrongServer = 32,        ///< the parent's server did not report the parent's pid
    kChildThrew = 64,         ///< an exception escaped
};
constexpr auto kPrompt = 2s;  // "at once", generous for a loaded machine and sanitizers

void say(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fork_test child %d: %s: %s\n", int(::getpid()), what, detail.c_str());
}

/// Runs in the child; returns the exit status.
int child(std::optional<Engine>& server, std::optional<Engine>& client, Endpoint& ep,
          Future<int>& in_flight, const std::string& transport, const std::string& server_address,
          pid_t parent) {
    int fail = 0;
    try {
        auto t0 = Clock::now();
        auto r1 = in_flight.try_get();
        if (r1 || r1.code() != Errc::invalid_state) {
            fail |= kInFlightNotRefused;
            say("the parent's call in flight", r1 ? "completed" : r1.error().describe());
        }
        auto r2 = client->remote<int(int)>("twice").on(ep).timeout(30s)(21).try_get();
        if (r2 || r2.code() != Errc::invalid_state) {
            fail |= kCallNotRefused;
            say("a call through the inherited engine", r2 ? "completed" : r2.error().describe());
        }
        auto r3 = client->try_lookup(server_address);
        if (r3 || r3.code() != Errc::invalid_state) {
            fail |= kLookupNotRefused;
            say("lookup", r3 ? "succeeded" : r3.error().describe());
        }
        ep = {};
        client.reset();
        server.reset();
        if (Clock::now() - t0 > kPrompt) {
            fail |= kSlow;
            say("refusals and destruction", "took longer than 2 s");
        }
        auto opened = Engine::open(transport, false, {});
        if (!opened && transport.starts_with("ucx+tcp") && opened.code() == Errc::not_supported &&
            opened.error().message().find("forked") != std::string::npos) {
            // UCX 1.13 keeps its async thread in process-wide state that a child inherits
            // without the thread (src/na/ucx/ucx_setup.cpp): refused, naming why and what to do.
            return fail;
        }
        if (!opened) {
            fail |= kOwnEngineFailed;
            say("the child's own engine", opened.error().describe());
            return fail;
        }
        Engine own = std::move(*opened);
        auto parent_server = own.try_lookup(server_address);
        if (!parent_server) {
            fail |= kOwnEngineFailed;
            say("lookup of the parent's server", parent_server.error().describe());
            return fail;
        }
        auto twice = own.remote<int(int)>("twice").on(*parent_server).timeout(10s);
        for (int i = 0; i < 20; ++i) {
            auto r = twice(i).try_get();
            if (!r || *r != 2 * i) {
                fail |= kOwnEngineFailed;
                say("a call through the child's own engine",
                    r ? std::to_string(*r) : r.error().describe());
                break;
            }
        }
        auto who = own.remote<int()>("pid").on(*parent_server).timeout(10s)().try_get();
        if (!who || *who != int(parent)) {
            fail |= kWrongServer;
            say("pid of the server", who ? std::to_string(*who) : who.error().describe());
        }
    } catch (const std::exception& e) {
        fail |= kChildThrew;
        say("exception", e.what());
    }
    return fail;
}

}  // namespace

TEST_P(Fork, AChildIsRefusedTheInheritedEnginesAndItsOwnEngineWorks) {
    const std::string transport = GetParam().address;
    std::optional<Engine> server;
    server.emplace(transport, listen);
    server->define("twice", [](int x) { return 2 * x; });
    server->define("pid", [] { return int(::getpid()); });
    std::atomic<bool> slow_started{false};
    server->define("slow", [&slow_started](int x) {
        slow_started = true;
        std::this_thread::sleep_for(300ms);
        return x;
    });
    const std::string server_address = server->self_address();
    std::optional<Engine> client;
    client.emplace(transport);
    Endpoint ep = client->lookup(server_address);
    auto twice = client->remote<int(int)>("twice").on(ep).timeout(10s);
    ASSERT_EQ(twice(1).get(), 2);  // connected, on every lane the call uses

    // A call in flight across the fork: the parent must still get its answer.
    Future<int> in_flight = client->remote<int(int)>("slow").on(ep).timeout(10s)(7);
    // Fork once the server runs the handler, while the parent's threads are quiet. GCC 12's
    // AddressSanitizer does not hold its allocator's locks across fork(): a parent thread in
    // the middle of an allocation at that instant (the server taking in the request and making
    // its first statistics for "slow") leaves a lock held forever in the child, whose next
    // allocation of that size then hangs. glibc's malloc and ThreadSanitizer lock around
    // fork(); newer AddressSanitizers do too.
    for (auto until = Clock::now() + 10s; !slow_started && Clock::now() < until;)
        std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(slow_started) << "the server never ran the call in flight";

    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) ::_exit(child(server, client, ep, in_flight, transport, server_address, parent));

    // The child must finish on its own (a hang is a failure, not a stalled test).
    int status = 0;
    pid_t done = 0;
    for (auto until = Clock::now() + 60s; Clock::now() < until;) {
        done = ::waitpid(pid, &status, WNOHANG);
        if (done != 0) break;
        std::this_thread::sleep_for(20ms);
    }
    if (done == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        FAIL() << "the child did not finish within 60 s (killed)";
    }
    ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "the child's failed checks (bits of ChildFailure; its stderr says more)";

    // The parent is unaffected.
    {
        auto r = in_flight.try_get();
        ASSERT_TRUE(r) << "the call in flight at the fork: " << r.error().describe();
        EXPECT_EQ(*r, 7);
    }
    for (int i = 0; i < 100; ++i) {
        auto r = twice(i).try_get();
        ASSERT_TRUE(r) << "call " << i << " after the fork: " << r.error().describe();
        ASSERT_EQ(*r, 2 * i);
    }
    // A fresh client of the parent reaches the server too (its listener is intact).
    Engine fresh{transport};
    auto r = fresh.remote<int()>("pid").on(fresh.lookup(server_address)).timeout(10s)().try_get();
    ASSERT_TRUE(r) << r.error().describe();
    EXPECT_EQ(*r, int(parent));
    ep = {};
}

INSTANTIATE_TEST_SUITE_P(hostile, Fork, ::testing::ValuesIn(na::test::multi_process_kinds()),
                         kind_name);
