// Coroutines: Task chains awaiting Futures and other Tasks, sequential and concurrent calls,
// errors as exceptions and as values, sync_wait on background and manual engines.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "api_fixture.hpp"

namespace talaria::api_test {
namespace {

using Sum = Procedure<int(int, int)>;

Task<int> count_up(Sum sum, int n) {
    int acc = 0;
    for (int i = 0; i < n; ++i)
        acc = co_await sum(acc, 1);
    co_return acc;
}

Task<int> fan_out(Sum sum, int n) {
    std::vector<Future<int>> fs;
    for (int i = 0; i < n; ++i)
        fs.push_back(sum(i, i));  // all in flight at once
    int total = 0;
    for (auto& f : fs)
        total += co_await std::move(f);
    co_return total;
}

Task<int> nested(Sum sum) {
    int a = co_await count_up(sum, 3);
    int b = co_await fan_out(sum, 4);  // 0+2+4+6
    auto t = count_up(sum, 2);
    int c = co_await t;  // an lvalue Task
    co_return a + b + c;
}

Task<Errc> timeout_code(Procedure<void()> stall) {
    try {
        co_await stall.timeout(50ms)();
    } catch (const Exception& e) {
        co_return e.code();
    }
    co_return Errc::ok;
}

Task<Errc> as_result_code(Procedure<int(int)> missing) {
    auto r = co_await missing(1).as_result();
    co_return r.code();
}

Task<void> throws_after(Sum sum) {
    (void)co_await sum(1, 1);
    throw std::runtime_error("after the call");
}

TEST_P(Api, CoroutineSequentialAndConcurrent) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    EXPECT_EQ(sync_wait(count_up(sum, 10)), 10);
    EXPECT_EQ(sync_wait(fan_out(sum, 16)), 240);
    EXPECT_EQ(nested(sum).get(), 3 + 12 + 2);
    // The form from the issue: co_await on a call with a timeout.
    auto issue_form = [](Engine& c, Endpoint e) -> Task<int> {
        co_return co_await c.remote<int(int, int)>("sum").on(e).timeout(1s)(1, 2);
    };
    EXPECT_EQ(sync_wait(issue_form(*client, ep)), 3);
}

TEST_P(Api, CoroutineErrors) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    std::vector<Request> parked;
    std::mutex mu;
    server->define("stall", [&](Request req) {
        std::lock_guard g(mu);
        parked.push_back(std::move(req));
    });
    EXPECT_EQ(sync_wait(timeout_code(client->remote<void()>("stall").on(ep))), Errc::timeout);
    EXPECT_EQ(sync_wait(as_result_code(client->remote<int(int)>("missing").on(ep))),
              Errc::not_found);
    EXPECT_THROW(sync_wait(throws_after(client->remote<int(int, int)>("sum").on(ep))),
                 std::runtime_error);
    std::lock_guard g(mu);
    for (auto& q : parked)
        (void)q.try_respond();
}

TEST_P(Api, CoroutinesConcurrentThread) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    std::atomic<int> good{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&] {
            if (sync_wait(count_up(sum, 20)) == 20) ++good;
            if (sync_wait(fan_out(sum, 8)) == 56) ++good;
        });
    for (auto& t : ts)
        t.join();
    EXPECT_EQ(good.load(), 8);
}

TEST_P(Api, CoroutineOnManualEngine) {
    // A background server; the manual client is driven by sync_wait itself.
    server.emplace(GetParam().address, listen);
    client.emplace(GetParam().address, EngineOptions{.progress = ProgressMode::manual});
    ep = client->lookup(server->self_address());
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    EXPECT_EQ(sync_wait(count_up(sum, 5)), 5);
    EXPECT_EQ(sync_wait(fan_out(sum, 5)), 20);
}

}  // namespace
}  // namespace talaria::api_test
