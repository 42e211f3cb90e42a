// when_all / when_any over calls on every transport: background and manual clients, calls on
// several contexts, failures kept per input, empty inputs, coroutines.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api_fixture.hpp"

namespace talaria::api_test {
namespace {

TEST_P(Api, WhenAllKeepsEveryResultInOrder) {
    open();
    server->define("square", [](int x) { return x * x; });
    auto square = client->remote<int(int)>("square").on(ep);
    auto missing = client->remote<int(int)>("no_such").on(ep);
    std::vector<Future<int>> fs;
    for (int i = 0; i < 16; ++i)
        fs.push_back(i == 5 ? missing(i) : square(i));
    auto all = value_within(when_all(std::move(fs)));
    ASSERT_EQ(all.size(), 16u);
    for (int i = 0; i < 16; ++i) {
        if (i == 5) {
            ASSERT_FALSE(all[i]);  // one failure hides no other result
            EXPECT_EQ(all[i].code(), Errc::not_found);
        } else {
            ASSERT_TRUE(all[i]) << all[i].error().describe();
            EXPECT_EQ(*all[i], i * i);
        }
    }
    // Nothing in: nothing out, at once.
    auto none = when_all(std::vector<Future<int>>{});
    ASSERT_TRUE(none.ready());
    EXPECT_TRUE(none.get().empty());
    // An empty future in the inputs fails in its own place.
    std::vector<Future<int>> with_empty;
    with_empty.push_back(square(3));
    with_empty.emplace_back();
    auto r = value_within(when_all(std::move(with_empty)));
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(*r[0], 9);
    EXPECT_EQ(r[1].code(), Errc::invalid_argument);
}

TEST_P(Api, WhenAllOfDifferentTypes) {
    open();
    server->define("square", [](int x) { return x * x; });
    server->define("greet", [](std::string s) { return "hello " + s; });
    server->define("nothing", [] {});
    auto [a, b, c] =
        value_within(when_all(client->remote<int(int)>("square").on(ep)(7),
                              client->remote<std::string(std::string)>("greet").on(ep)("x"),
                              client->remote<void()>("nothing").on(ep)()));
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(*a, 49);
    EXPECT_EQ(*b, "hello x");
}

TEST_P(Api, WhenAnyGivesTheFirst) {
    open();
    // "held" answers only when the test says so; "now" at once: the second call wins.
    std::mutex mu;
    std::vector<Request> held;
    server->define("held", [&](Request req, int) {
        std::lock_guard g(mu);
        held.push_back(std::move(req));
    });
    server->define("now", [](int x) { return x; });
    std::vector<Future<int>> fs;
    fs.push_back(client->remote<int(int)>("held").on(ep)(1));
    fs.push_back(client->remote<int(int)>("now").on(ep)(2));
    auto [index, r] = value_within(when_any(std::move(fs)));
    EXPECT_EQ(index, 1u);
    ASSERT_TRUE(r) << r.error().describe();
    EXPECT_EQ(*r, 2);
    // The loser runs on: answered now, its result dropped on arrival.
    for (int i = 0; i < 1000; ++i) {
        std::lock_guard g(mu);
        if (!held.empty()) break;
        std::this_thread::sleep_for(1ms);
    }
    {
        std::lock_guard g(mu);
        ASSERT_EQ(held.size(), 1u);
        held[0].respond(1);
    }
    auto none = when_any(std::vector<Future<int>>{});
    ASSERT_TRUE(none.ready());
    EXPECT_EQ(none.try_get().code(), Errc::invalid_argument);
}

TEST_P(Api, WhenAllAndAnyDriveAManualClient) {
    // Nobody progresses a manual client but the thread that waits: waiting on the combined
    // future must drive the inputs' contexts (two here), with get(), wait_for and sync_wait.
    EngineOptions manual{.progress = ProgressMode::manual};
    manual.contexts = 2;
    EngineOptions two;
    two.contexts = 2;
    open(two, manual);
    server->define("square", [](int x) { return x * x; });
    auto on0 = client->remote<int(int)>("square").on(ep);
    auto on1 = client->remote<int(int)>("square").on(ep).from(1).context(1);
    std::vector<Future<int>> fs;
    for (int i = 0; i < 8; ++i)
        fs.push_back(i % 2 ? on1(i) : on0(i));
    auto all = when_all(std::move(fs)).get();
    for (int i = 0; i < 8; ++i)
        EXPECT_EQ(*all[i], i * i);
    std::vector<Future<int>> gs;
    gs.push_back(on1(3));
    auto any = when_any(std::move(gs));
    ASSERT_TRUE(any.wait_for(kWait));
    EXPECT_EQ(*any.get().second, 9);
    auto task = [](Procedure<int(int)> a, Procedure<int(int)> b) -> Task<int> {
        auto [x, y] = co_await when_all(a(2), b(3));
        co_return *x + *y;
    };
    EXPECT_EQ(sync_wait(task(on0, on1)), 13);
}

}  // namespace
}  // namespace talaria::api_test
