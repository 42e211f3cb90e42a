// The service API on every transport: providers (several instances of one procedure on one
// engine, picked by id; a Provider's procedures gone with it), signature checks (a caller's
// float(float, float) against a server's int(int, int) is refused, naming the server's types),
// and what a handler learns of its caller: the deadline, a cancel, and transfers it started for
// the call failing once the call ended.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "api_fixture.hpp"
#include "talaria/util/log.hpp"

namespace talaria::api_test {
namespace {

/// A key-value store, two of which serve on one engine.
class KvStore : public Provider {
  public:
    KvStore(Engine& e, uint16_t id) : Provider(e, id) {
        define("kv.put", &KvStore::put);
        define("kv.get", &KvStore::get);
        define("kv.who", [id](const Request& req) {
            return std::to_string(id) + "/" + std::to_string(req.provider());
        });
    }
    ~KvStore() override { undefine_all(); }

  private:
    void put(std::string k, std::string v) {
        std::lock_guard g(mu_);
        data_[std::move(k)] = std::move(v);
    }
    std::string get(std::string k) const {
        std::lock_guard g(mu_);
        auto it = data_.find(k);
        return it == data_.end() ? std::string() : it->second;
    }
    mutable std::mutex mu_;
    std::map<std::string, std::string> data_;
};

TEST_P(Api, ProvidersServeSideBySide) {
    open();
    std::optional<KvStore> a, b;
    a.emplace(*server, 1);
    b.emplace(*server, 2);
    EXPECT_EQ(a->procedures().size(), 3u);
    auto put = client->remote<void(std::string, std::string)>("kv.put").on(ep);
    auto get = client->remote<std::string(std::string)>("kv.get").on(ep);
    ASSERT_TRUE(result_within(put.provider(1)("k", "one")));
    ASSERT_TRUE(result_within(put.provider(2)("k", "two")));
    EXPECT_EQ(value_within(get.provider(1)("k")), "one");
    EXPECT_EQ(value_within(get.provider(2)("k")), "two");
    EXPECT_EQ(value_within(client->remote<std::string()>("kv.who").on(ep).provider(2)()), "2/2");

    // No provider 3, and none with the default id 0: not_found naming the provider.
    auto r = result_within(get.provider(3)("k"));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::not_found);
    EXPECT_NE(r.error().message().find("'kv.get'"), std::string::npos) << r.error().describe();
    EXPECT_NE(r.error().message().find("for provider 3"), std::string::npos)
        << r.error().describe();
    r = result_within(get("k"));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::not_found) << r.error().describe();

    // A second instance under a taken id is refused.
    EXPECT_THROW(KvStore(*server, 2), Exception);
    // A provider gone: its calls are not_found; the other serves on.
    b.reset();
    r = result_within(get.provider(2)("k"));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::not_found) << r.error().describe();
    EXPECT_EQ(value_within(get.provider(1)("k")), "one");
    // The id is free again.
    b.emplace(*server, 2);
    EXPECT_EQ(value_within(get.provider(2)("k")), "");
}

TEST_P(Api, ProviderDestroyedWhileItsHandlerThreadsRunWaitsForThem) {
    open();
    std::atomic<int> inside{0};
    std::atomic<bool> finished{false};
    struct Slow : Provider {
        Slow(Engine& e, std::atomic<int>& in, std::atomic<bool>& fin) : Provider(e, 9) {
            define("slow", [&in, &fin](int x) {
                in.fetch_add(1);
                std::this_thread::sleep_for(300ms);
                fin.store(true);
                return x;
            });
        }
    };
    auto slow = std::make_unique<Slow>(*server, inside, finished);
    auto f = client->remote<int(int)>("slow").on(ep).provider(9)(5);
    for (int i = 0; i < 5000 && inside.load() == 0; ++i)
        std::this_thread::sleep_for(1ms);
    ASSERT_EQ(inside.load(), 1);
    slow.reset();  // returns only once the running handler did
    EXPECT_TRUE(finished.load());
    EXPECT_EQ(value_within(std::move(f)), 5);
}

TEST_P(Api, ASignatureMismatchIsRefusedNamingBothSidesTypes) {
    open();
    std::atomic<int> ran{0};
    server->define("add", [&](int a, int b) {
        ran.fetch_add(1);
        return a + b;
    });
    auto r = result_within(client->remote<float(float, float)>("add").on(ep)(1.5f, 2.5f));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::invalid_argument);
    const std::string& m = r.error().message();
    EXPECT_NE(m.find("signature mismatch"), std::string::npos) << m;
    EXPECT_NE(m.find("'add' as i32(i32,i32)"), std::string::npos) << m;
    EXPECT_NE(m.find("this call is f32(f32,f32)"), std::string::npos) << m;  // both sides
    // The result type counts too.
    r = result_within(client->remote<float(int, int)>("add").on(ep)(1, 2));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::invalid_argument) << r.error().describe();
    EXPECT_EQ(ran.load(), 0) << "a refused call never reaches the handler";
    // Matching types (references and const do not count), and long against int64_t.
    EXPECT_EQ(value_within(client->remote<int(const int&, int)>("add").on(ep)(2, 3)), 5);
    server->define("wide", [](int64_t v) { return v; });
    EXPECT_EQ(value_within(client->remote<long(long)>("wide").on(ep)(7L)), 7L);
    // unchecked(): the caller takes responsibility; the same bytes reach the handler.
    auto u = result_within(client->remote<int(uint32_t, uint32_t)>("add").on(ep).unchecked()(2, 3));
    ASSERT_TRUE(u) << u.error().describe();
    EXPECT_EQ(*u, 5);
    EXPECT_EQ(ran.load(), 2);
}

TEST(Signature, SpellingsAreTheEncodingsNotTheCompilersNames) {
    EXPECT_EQ((detail::signature_text<int, int, int>()), "i32(i32,i32)");
    EXPECT_EQ((detail::signature_text<void, std::string, std::vector<uint8_t>>()),
              "void(string,vector<u8>)");
    EXPECT_EQ((detail::signature_text<std::map<std::string, double>, std::optional<bool>>()),
              "map<string,f64>(optional<bool>)");
    EXPECT_EQ((detail::signature_text<std::array<int16_t, 3>, std::chrono::milliseconds>()),
              "array<i16,3>(duration<i64,1/1000>)");
    EXPECT_EQ((detail::signature_text<void, Bulk>()), "void(talaria::bulk::Handle)");
    // unordered and ordered containers travel the same.
    static_assert(detail::kSignatureHash<void, std::map<int, int>> ==
                  detail::kSignatureHash<void, std::unordered_map<int, int>>);
    static_assert(detail::kSignatureHash<int, int, int> !=
                  detail::kSignatureHash<float, float, float>);
    static_assert(detail::kSignatureHash<int, long long> == detail::kSignatureHash<int, int64_t>);
}

TEST_P(Api, AHandlerSeesTheCallersDeadline) {
    open();
    std::mutex mu;
    std::vector<TimePoint> seen;
    server->define("when", [&](const Request& req) {
        std::lock_guard g(mu);
        seen.push_back(req.deadline());
        return req.cancelled();
    });
    auto call = client->remote<bool()>("when").on(ep);
    const TimePoint before = Clock::now();
    EXPECT_FALSE(value_within(call.timeout(5s)()));
    const TimePoint after = Clock::now();
    EXPECT_FALSE(value_within(call()));
    std::lock_guard g(mu);
    ASSERT_EQ(seen.size(), 2u);
    // Counted from the arrival: after the send's start, within the budget from the answer.
    EXPECT_GT(seen[0], before + 4s);
    EXPECT_LE(seen[0], after + 5s);
    EXPECT_EQ(seen[1], TimePoint::max());
}

/// A handler that hands its call to a worker thread (so that the context's thread stays free
/// to receive the caller's cancel), which waits (up to 10 s) for the call to end, then says how
/// long that took and what a pull started then gives.
struct Waiter {
    std::atomic<int> started{0};
    std::atomic<int64_t> waited_ms{-1};
    std::atomic<int> pull_code{-1};
    std::thread worker;
    ~Waiter() {
        if (worker.joinable()) worker.join();
    }
    void define(Engine& server) {
        server.define("wait", [this, &server](Request req, Bulk data) {
            started.fetch_add(1);
            worker = std::thread([this, &server, r = std::move(req), data]() mutable {
                const TimePoint t0 = Clock::now();
                while (!r.cancelled() && Clock::now() - t0 < 10s)
                    std::this_thread::sleep_for(1ms);
                waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0)
                                .count();
                std::vector<std::byte> buf(data.size());
                auto local = server.expose({buf.data(), buf.size()}, write_only);
                auto res = result_within(r.pull(data, 0, local, 0, data.size()));
                pull_code = res ? 0 : int(res.code());
                // The caller is gone: an answer now is dropped there. (Its own deadline timer
                // may fire a little after ours: give it time, so that the answer cannot win.)
                std::this_thread::sleep_for(200ms);
                (void)r.try_respond(1);
            });
        });
    }
    bool wait_started() {
        for (int i = 0; i < 5000 && started.load() == 0; ++i)
            std::this_thread::sleep_for(1ms);
        return started.load() != 0;
    }
    bool wait_done() {
        for (int i = 0; i < 15000 && pull_code.load() == -1; ++i)
            std::this_thread::sleep_for(1ms);
        return pull_code.load() != -1;
    }
};

TEST_P(Api, ACanceledCallIsSignalledToAHandlerThreadAndItsTransfersFail) {
    open();
    Waiter w;
    w.define(*server);
    std::vector<std::byte> buf(4096, std::byte{7});
    auto exposed = client->expose({buf.data(), buf.size()}, read_only);
    auto f = client->remote<int(Bulk)>("wait").on(ep)(exposed);
    ASSERT_TRUE(w.wait_started());
    EXPECT_TRUE(f.cancel());
    ASSERT_TRUE(w.wait_done());
    EXPECT_LT(w.waited_ms.load(), 5000) << "the handler never saw the cancel";
    EXPECT_EQ(w.pull_code.load(), int(Errc::canceled));
    // The engine serves on.
    server->define("one", [] { return 1; });
    EXPECT_EQ(value_within(client->remote<int()>("one").on(ep)()), 1);
}

TEST_P(Api, OnCancelRunsOnceWhenTheCallerCancels) {
    open();
    // The handler keeps its requests (answered at the end) and, when asked, watches for the
    // caller's cancel.
    struct Held {
        std::mutex mu;
        std::vector<Request> reqs;
        std::vector<core::CancelWatch> watches;
        std::atomic<int> ran{0};
        std::size_t count() {
            std::lock_guard g(mu);
            return reqs.size();
        }
        bool cancelled(std::size_t i) {
            std::lock_guard g(mu);
            return reqs[i].cancelled();
        }
    };
    auto h = std::make_shared<Held>();
    server->define("keep", [h](Request req, bool watch) {
        std::lock_guard g(h->mu);
        if (watch) h->watches.push_back(req.on_cancel([h] { h->ran.fetch_add(1); }));
        h->reqs.push_back(std::move(req));
    });
    auto keep = client->remote<int(bool)>("keep").on(ep);
    auto wait = [](auto pred) {
        for (int i = 0; i < 5000 && !pred(); ++i)
            std::this_thread::sleep_for(1ms);
        return pred();
    };

    // Watched, then canceled: the function runs once.
    auto a = keep(true);
    ASSERT_TRUE(wait([&] { return h->count() == 1; }));
    EXPECT_EQ(h->ran.load(), 0);
    EXPECT_TRUE(a.cancel());
    ASSERT_TRUE(wait([&] { return h->ran.load() == 1; })) << "the watch never ran";

    // Canceled first, watched after: it runs at once, on the watching thread.
    auto b = keep(false);
    ASSERT_TRUE(wait([&] { return h->count() == 2; }));
    EXPECT_TRUE(b.cancel());
    ASSERT_TRUE(wait([&] { return h->cancelled(1); }));
    {
        std::lock_guard g(h->mu);
        int here = 0;
        auto late = h->reqs[1].on_cancel([&here] { ++here; });
        EXPECT_EQ(here, 1);
    }

    // Watched, the watch reset, then canceled: it does not run.
    auto c = keep(true);
    ASSERT_TRUE(wait([&] { return h->count() == 3; }));
    {
        std::lock_guard g(h->mu);
        h->watches.back().reset();
    }
    EXPECT_TRUE(c.cancel());
    ASSERT_TRUE(wait([&] { return h->cancelled(2); }));
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(h->ran.load(), 1);

    // Answers after a cancel are dropped; the watches go before the engine.
    std::lock_guard g(h->mu);
    for (auto& r : h->reqs)
        (void)r.try_respond(0);
    h->reqs.clear();
    h->watches.clear();
}

TEST_P(Api, AnExpiredCallIsSignalledToItsHandlerAndItsTransfersTimeOut) {
    open();
    Waiter w;
    w.define(*server);
    std::vector<std::byte> buf(4096, std::byte{7});
    auto exposed = client->expose({buf.data(), buf.size()}, read_only);
    auto r = result_within(client->remote<int(Bulk)>("wait").on(ep).timeout(300ms)(exposed));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::timeout);
    ASSERT_TRUE(w.wait_done());
    EXPECT_GE(w.waited_ms.load(), 200);
    EXPECT_LT(w.waited_ms.load(), 5000);
    EXPECT_EQ(w.pull_code.load(), int(Errc::timeout));
}

}  // namespace
}  // namespace talaria::api_test

namespace talaria::api_test {
namespace {

TEST_P(Api, AHandlerOnAPoolThreadDoesNotStallItsContext) {
    open();
    // Shared with the handlers on the heap: the engine keeps them (and the pool may finish a
    // job's last instructions) past the test body's stack.
    struct Shared {
        std::atomic<bool> release{false};
        std::atomic<int> on_progress_thread{0};
        std::atomic<std::thread::id> progress_thread{};
    };
    auto sh = std::make_shared<Shared>();
    server->define("here", [sh] {
        sh->progress_thread = std::this_thread::get_id();
        return 1;
    });
    EXPECT_EQ(value_within(client->remote<int()>("here").on(ep)()), 1);
    server->define(
        "slow",
        [sh](int x) {
            if (std::this_thread::get_id() == sh->progress_thread.load())
                sh->on_progress_thread.fetch_add(1);
            for (int i = 0; i < 10000 && !sh->release.load(); ++i)
                std::this_thread::sleep_for(1ms);
            return x;
        },
        server->handler_pool());
    auto slow = client->remote<int(int)>("slow").on(ep);
    auto a = slow(1);
    auto b = slow(2);
    // The context's thread is free: another call is answered while both slow ones run.
    EXPECT_EQ(value_within(client->remote<int()>("here").on(ep)()), 1);
    EXPECT_FALSE(a.ready());
    sh->release = true;
    EXPECT_EQ(value_within(std::move(a)), 1);
    EXPECT_EQ(value_within(std::move(b)), 2);
    EXPECT_EQ(sh->on_progress_thread.load(), 0);
}

TEST_P(Api, AHandlerOnAPoolThreadHearsOfACancel) {
    open();
    ThreadPool pool(2);
    std::atomic<int64_t> waited_ms{-1};
    server->define(
        "spin",
        [&](const Request& req) {
            const TimePoint t0 = Clock::now();
            while (!req.cancelled() && Clock::now() - t0 < 10s)
                std::this_thread::sleep_for(1ms);
            waited_ms =
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
            return 0;
        },
        pool);
    auto f = client->remote<int()>("spin").on(ep)();
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(f.cancel());
    for (int i = 0; i < 10000 && waited_ms.load() < 0; ++i)
        std::this_thread::sleep_for(1ms);
    EXPECT_GE(waited_ms.load(), 0);
    EXPECT_LT(waited_ms.load(), 5000) << "the handler never heard of the cancel";
    server.reset();  // before the pool its procedure runs on
}

TEST_P(Api, AProviderOnAPoolThreadAndCallsQueuedWhenTheEngineCloses) {
    open();
    ThreadPool pool(1);
    std::atomic<int> ran{0};
    struct Worker : Provider {
        Worker(Engine& e, Executor& ex, std::atomic<int>& n) : Provider(e, 4, &ex) {
            define("work", [&n](int ms) {
                std::this_thread::sleep_for(std::chrono::milliseconds(ms));
                return n.fetch_add(1) + 1;
            });
        }
        ~Worker() override { undefine_all(); }
    };
    {
        Worker w(*server, pool, ran);
        auto work = client->remote<int(int)>("work").on(ep).provider(4);
        EXPECT_EQ(value_within(work(1)), 1);
        // Several queued on the one thread: each answered.
        std::vector<Future<int>> fs;
        for (int i = 0; i < 4; ++i)
            fs.push_back(work(20));
        for (auto& f : fs)
            EXPECT_TRUE(result_within(std::move(f)));
        EXPECT_EQ(ran.load(), 5);
    }
    // Calls queued on the engine's own pool when the engine closes are answered (run), and the
    // close does not hang.
    server->define(
        "nap",
        [](int ms) {
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            return ms;
        },
        server->handler_pool());
    std::vector<Future<int>> naps;
    for (int i = 0; i < 8; ++i)
        naps.push_back(client->remote<int(int)>("nap").on(ep)(50));
    std::this_thread::sleep_for(20ms);
    const TimePoint t0 = Clock::now();
    server.reset();
    EXPECT_LT(Clock::now() - t0, 8s);
    for (auto& f : naps) {
        auto r = result_within(std::move(f));
        // Answered before the close, or failed by it: never left waiting.
        if (!r) {
            EXPECT_NE(r.code(), Errc::timeout) << r.error().describe();
        }
    }
}

}  // namespace
}  // namespace talaria::api_test

namespace talaria::api_test {
namespace {

TEST_P(Api, ClosingTheEngineWaitsForItsCallsOnAnApplicationsPoolThread) {
    open();
    ThreadPool pool(1);  // outlives the engine, as it must
    std::atomic<int> started{0};
    server->define(
        "nap",
        [&](int ms) {
            started.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            return ms;
        },
        pool);
    auto nap = client->remote<int(int)>("nap").on(ep);
    auto a = nap(300);
    auto b = nap(1);  // queued behind it
    for (int i = 0; i < 5000 && started.load() == 0; ++i)
        std::this_thread::sleep_for(1ms);
    ASSERT_EQ(started.load(), 1);
    server.reset();  // waits for both jobs: they answer with the engine still whole
    EXPECT_EQ(started.load(), 2);
    EXPECT_EQ(value_within(std::move(a)), 300);
    EXPECT_EQ(value_within(std::move(b)), 1);
}

// The server's log shows what its callers got wrong, at warn: a procedure it lacks, a signature
// that differs, a handler's exception with its what(); each at most once a second per context,
// however many calls make it.
TEST_P(Api, TheServerLogsItsCallersMistakesRateLimited) {
    open();
    server->define("add", [](int a, int b) { return a + b; });
    server->define("fail", []() -> int { throw std::runtime_error("disk full on /srv"); });
    std::mutex mu;
    std::vector<std::string> warns;
    log::set_sink([&](const log::Record& r) {
        if (r.level != log::Level::warn) return;
        std::lock_guard g(mu);
        warns.emplace_back(r.message);
    });
    for (int i = 0; i < 20; ++i) {
        EXPECT_FALSE(result_within(client->remote<int()>("nothing.here").on(ep)()));
        EXPECT_FALSE(result_within(client->remote<float(float, float)>("add").on(ep)(1, 2)));
        EXPECT_FALSE(result_within(client->remote<int()>("fail").on(ep)()));
    }
    log::set_sink({});
    std::lock_guard g(mu);
    auto count = [&](std::string_view a, std::string_view b = {}) {
        int n = 0;
        for (const auto& w : warns)
            if (w.find(a) != std::string::npos && w.find(b) != std::string::npos) ++n;
        return n;
    };
    std::string all;
    for (const auto& w : warns)
        all += w + "\n";
    EXPECT_GE(count("which is not registered here"), 1) << all;
    EXPECT_GE(count("refused: signature mismatch", "'add' as i32(i32,i32)"), 1) << all;
    EXPECT_GE(count("rpc 'fail' from ", "disk full on /srv"), 1) << all;
    // A tcp client has no address of its own: the log says where it connects from.
    if (GetParam().label == "tcp") {
        EXPECT_GE(count("(from 127.0.0.1:"), 2) << all;
    }
    // 20 of each within a second or two: one line each, perhaps a second with the count held.
    EXPECT_LE(count("which is not registered here"), 3) << all;
    EXPECT_LE(count("refused: signature mismatch"), 3) << all;
    EXPECT_LE(count("disk full on /srv"), 3) << all;
}

}  // namespace
}  // namespace talaria::api_test
