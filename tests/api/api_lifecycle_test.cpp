// Engine lifecycle on every transport: shutdown() releases wait_for_shutdown, a peer's
// shutdown_remote does the same once enabled, and the shutdown callbacks run once, last first,
// on the waiting thread, or in the destructor when nobody waited.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "api_fixture.hpp"

namespace talaria::api_test {
namespace {

TEST_P(Api, ShutdownReleasesTheWaiterAndRunsTheCallbacksOnItsThread) {
    open();
    std::vector<std::string> ran;
    std::thread::id ran_on;
    server->on_shutdown([&] { ran.push_back("first added"); });
    server->on_shutdown([&] {
        ran.push_back("last added");
        ran_on = std::this_thread::get_id();
        // The engine still works while its callbacks run.
        server->define("late", [] { return 1; });
    });
    EXPECT_FALSE(server->shutdown_requested());
    EXPECT_FALSE(server->wait_for_shutdown(20ms));
    EXPECT_TRUE(ran.empty()) << "a wait that timed out ran callbacks";
    std::thread asker([&] {
        std::this_thread::sleep_for(50ms);
        server->shutdown();
    });
    server->wait_for_shutdown();
    asker.join();
    EXPECT_TRUE(server->shutdown_requested());
    EXPECT_EQ(ran, (std::vector<std::string>{"last added", "first added"}));
    EXPECT_EQ(ran_on, std::this_thread::get_id());
    // Once: later waits return at once and run nothing again.
    EXPECT_TRUE(server->wait_for_shutdown(0ms));
    EXPECT_EQ(ran.size(), 2u);
    EXPECT_EQ(value_within(client->remote<int()>("late").on(ep)()), 1);
}

TEST_P(Api, ShutdownRemoteStopsAServerThatEnabledIt) {
    open();
    // Not enabled: the procedure does not exist there.
    auto r =
        result_within(client->remote<void()>(std::string(Engine::kShutdownProcedure)).on(ep)());
    EXPECT_EQ(r.code(), Errc::not_found);
    EXPECT_FALSE(server->shutdown_requested());
    server->enable_remote_shutdown();
    std::atomic<bool> released{false};
    std::thread waiter([&] {
        server->wait_for_shutdown();
        released = true;
    });
    EXPECT_TRUE(result_within(client->shutdown_remote(ep)));
    waiter.join();
    EXPECT_TRUE(released);
    EXPECT_TRUE(server->shutdown_requested());
}

TEST_P(Api, ShutdownCallbacksRunInTheDestructorWhenNobodyWaited) {
    open();
    std::vector<int> ran;
    server->on_shutdown([&] { ran.push_back(1); });
    server->on_shutdown([&] { throw std::runtime_error("a callback that throws"); });
    server->on_shutdown([&] { ran.push_back(3); });
    ep = {};
    client.reset();
    server.reset();
    EXPECT_EQ(ran, (std::vector<int>{3, 1})) << "the others run after one throws";
}

}  // namespace
}  // namespace talaria::api_test
