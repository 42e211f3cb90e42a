// Future::cancel on every transport: a call the server holds completes with canceled at once
// (its late answer is dropped and the engine serves on), a complete one is left alone, and a
// manual client's call is canceled the same way.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "api_fixture.hpp"

namespace talaria::api_test {
namespace {

/// A server procedure "held" that answers only when told (answer_all). Shared with the
/// handler, so that a call arriving after the test body (a manual client flushes its sends as
/// it closes) still finds it.
struct Held : std::enable_shared_from_this<Held> {
    std::mutex mu;
    std::vector<Request> reqs;
    void define(Engine& server) {
        server.define("held", [self = shared_from_this()](Request req, int) {
            std::lock_guard g(self->mu);
            self->reqs.push_back(std::move(req));
        });
    }
    std::size_t count() {
        std::lock_guard g(mu);
        return reqs.size();
    }
    /// Wait until `n` calls are held.
    bool wait_for(std::size_t n) {
        for (int i = 0; i < 5000; ++i) {
            {
                std::lock_guard g(mu);
                if (reqs.size() >= n) return true;
            }
            std::this_thread::sleep_for(1ms);
        }
        return false;
    }
    void answer_all(int v) {
        std::lock_guard g(mu);
        for (auto& r : reqs)
            r.respond(v);
        reqs.clear();
    }
};

void cancel_held_call(Engine& client, const Endpoint& ep, Held& held) {
    auto call = client.remote<int(int)>("held").on(ep);
    auto f = call(1);
    ASSERT_TRUE(held.wait_for(1));  // the server has it, and holds it
    auto t0 = Clock::now();
    EXPECT_TRUE(f.cancel());
    EXPECT_FALSE(f.cancel()) << "a second cancel finds nothing outstanding";
    auto r = result_within(std::move(f));
    EXPECT_LT(Clock::now() - t0, 2s);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::canceled) << r.error().describe();
    // The late answer is dropped; the engine goes on.
    held.answer_all(7);
    auto g = call(2);
    ASSERT_TRUE(held.wait_for(1));
    held.answer_all(8);
    EXPECT_EQ(value_within(std::move(g)), 8);
}

TEST_P(Api, CancelAnOutstandingCall) {
    open();
    auto held = std::make_shared<Held>();
    held->define(*server);
    cancel_held_call(*client, ep, *held);
    // Complete already: cancel changes nothing.
    server->define("square", [](int x) { return x * x; });
    auto f = client->remote<int(int)>("square").on(ep)(5);
    ASSERT_TRUE(f.wait_for(kWait));
    EXPECT_FALSE(f.cancel());
    EXPECT_EQ(f.get(), 25);
    // Nothing to cancel: an empty future, a failed-before-sent one.
    EXPECT_FALSE(Future<int>().cancel());
    EXPECT_FALSE(Procedure<int(int)>()(1).cancel());
}

TEST_P(Api, CancelOnAManualClient) {
    open({}, EngineOptions{.progress = ProgressMode::manual});
    auto held = std::make_shared<Held>();
    held->define(*server);
    auto call = client->remote<int(int)>("held").on(ep);
    auto f = call(1);
    // Drive the manual client until the server holds the call.
    for (int i = 0; i < 5000 && held->count() == 0; ++i)
        (void)f.wait_for(1ms);
    ASSERT_TRUE(held->wait_for(1));
    EXPECT_TRUE(f.cancel());
    auto r = result_within(std::move(f));
    EXPECT_EQ(r.code(), Errc::canceled);
    held->answer_all(1);
}

TEST_P(Api, CancelOnAnotherThreadRacesTheAnswerAndTheEngineClosing) {
    // Cancel from another thread while answers arrive and, last, while the engine closes:
    // every future completes once, with its value or canceled (or shutdown), and nothing
    // crashes (the sanitizer builds check the rest).
    open();
    server->define("echo", [](int x) { return x; });
    auto echo = client->remote<int(int)>("echo").on(ep);
    for (int round = 0; round < 3; ++round) {
        std::vector<Future<int>> fs;
        for (int i = 0; i < 64; ++i)
            fs.push_back(echo(i));
        std::thread canceller([&] {
            for (std::size_t i = 0; i < fs.size(); i += 2)
                (void)fs[i].cancel();
        });
        canceller.join();
        for (int i = 0; i < 64; ++i) {
            auto r = result_within(std::move(fs[i]));
            if (r)
                EXPECT_EQ(*r, i);
            else
                EXPECT_EQ(r.code(), Errc::canceled) << r.error().describe();
        }
    }
    if (GetParam().label == "ofi_shm") {
        // Seen once in a fresh clone: with both engines in this process, the server's answer
        // crashed in libfabric 1.17 shm's fi_send (a memcpy into the client's region) while the
        // client's endpoint closed. Two processes do not share that region's mapping; until
        // this is understood, ofi_shm skips the closing phase.
        std::printf("ofi_shm: not closing the client under answers in flight (libfabric shm)\n");
        return;
    }
    std::vector<Future<int>> last;
    for (int i = 0; i < 32; ++i)
        last.push_back(echo(i));
    echo = {};  // addresses go before their engine
    ep = {};
    std::thread canceller([&] {
        for (auto& f : last)
            (void)f.cancel();
    });
    client.reset();  // the engine closes while the other thread cancels
    canceller.join();
    for (auto& f : last) {
        auto r = result_within(std::move(f), 1s);
        if (!r) {
            EXPECT_TRUE(r.code() == Errc::canceled || r.code() == Errc::shutdown)
                << r.error().describe();
        }
    }
}

}  // namespace
}  // namespace talaria::api_test
