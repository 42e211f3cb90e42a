// The C++ API over every transport: calls, types, errors, progress modes, contexts, counters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_fixture.hpp"

namespace talaria::api_test {
namespace {

struct Point {
    int32_t x = 0;
    int32_t y = 0;
    std::string label;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(x, y, label);
    }
    friend bool operator==(const Point&, const Point&) = default;
};

/// A value that notes which thread decoded it (the thread that ran the response's trigger).
struct DecodedOn {
    int32_t v = 0;
    std::thread::id decoded_by{};
    template <class Archive>
    void serialize(Archive& ar) {
        ar(v);
        if constexpr (Archive::decoding) decoded_by = std::this_thread::get_id();
    }
};

TEST_P(Api, Sum) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    EXPECT_EQ(value_within(sum(40, 2)), 42);
    auto r = result_within(sum(-1, 1));
    ASSERT_TRUE(r) << r.error().describe();
    EXPECT_EQ(*r, 0);
    // Blocking get() on a background engine.
    EXPECT_EQ(sum(1, 2).get(), 3);
}

TEST_P(Api, StringsVectorsMapsStructs) {
    open();
    server->define("greet", [](const std::string& name) { return "hello " + name; });
    server->define("stats", [](std::vector<int> v) {
        std::map<std::string, int64_t> m;
        m["count"] = static_cast<int64_t>(v.size());
        m["sum"] = std::accumulate(v.begin(), v.end(), int64_t{0});
        return m;
    });
    server->define("mirror", [](Point p, int dx) { return Point{-p.x + dx, -p.y, p.label + "'"}; });
    server->define("points", [](const std::map<std::string, Point>& in) {
        std::vector<Point> out;
        for (auto& [k, v] : in)
            out.push_back(Point{v.x, v.y, k});
        return out;
    });

    EXPECT_EQ(value_within(client->remote<std::string(std::string)>("greet").on(ep)("bob")),
              "hello bob");
    auto m =
        value_within(client->remote<std::map<std::string, int64_t>(std::vector<int>)>("stats").on(
            ep)(std::vector<int>{1, 2, 3, 4}));
    EXPECT_EQ(m.at("count"), 4);
    EXPECT_EQ(m.at("sum"), 10);
    EXPECT_EQ(value_within(client->remote<Point(Point, int)>("mirror").on(ep)(Point{1, 2, "p"}, 5)),
              (Point{4, -2, "p'"}));
    auto pts =
        value_within(client->remote<std::vector<Point>(std::map<std::string, Point>)>("points").on(
            ep)(std::map<std::string, Point>{{"a", {1, 1, ""}}, {"b", {2, 3, ""}}}));
    ASSERT_EQ(pts.size(), 2u);
    EXPECT_EQ(pts[0], (Point{1, 1, "a"}));
    EXPECT_EQ(pts[1], (Point{2, 3, "b"}));
    // Empty strings and containers.
    EXPECT_EQ(value_within(client->remote<std::string(std::string)>("greet").on(ep)("")), "hello ");
}

TEST_P(Api, VoidResultsAndNoArguments) {
    open();
    std::atomic<int> touched{0};
    server->define("touch", [&](int by) { touched += by; });
    server->define("answer", [] { return 42; });
    server->define("nothing", [] {});
    client->remote<void(int)>("touch").on(ep)(3).get();
    EXPECT_EQ(touched.load(), 3);
    EXPECT_EQ(value_within(client->remote<int()>("answer").on(ep)()), 42);
    auto r = result_within(client->remote<void()>("nothing").on(ep)());
    EXPECT_TRUE(r) << r.error().describe();
}

TEST_P(Api, LargeArgumentsAndResults) {
    open();
    server->define("reverse", [](std::vector<uint8_t> v) {
        std::reverse(v.begin(), v.end());
        return v;
    });
    std::vector<uint8_t> big(1 << 20);
    for (std::size_t i = 0; i < big.size(); ++i)
        big[i] = static_cast<uint8_t>(i * 7 + (i >> 12));
    auto out = value_within(
        client->remote<std::vector<uint8_t>(std::vector<uint8_t>)>("reverse").on(ep)(big));
    ASSERT_EQ(out.size(), big.size());
    std::reverse(out.begin(), out.end());
    EXPECT_TRUE(out == big);

    // Fixed-size values larger than the send buffer's room spill too (the fixed fast path
    // writes only what fits), both ways, with small fixed values beside them in place.
    using Block = std::array<uint64_t, 4096>;  // 32 KiB
    server->define("scale", [](Block b, uint64_t k) {
        for (auto& x : b)
            x *= k;
        return b;
    });
    Block in{};
    for (std::size_t i = 0; i < in.size(); ++i)
        in[i] = i + 1;
    auto scaled = value_within(client->remote<Block(Block, uint64_t)>("scale").on(ep)(in, 3));
    for (std::size_t i = 0; i < in.size(); ++i)
        ASSERT_EQ(scaled[i], 3 * (i + 1)) << "at " << i;
    server->define("add1", [](uint64_t x) { return x + 1; });
    EXPECT_EQ(value_within(client->remote<uint64_t(uint64_t)>("add1").on(ep)(41)), 42u);
}

TEST_P(Api, AsyncRespondFromThread) {
    open();
    std::mutex mu;
    std::vector<std::thread> workers;
    server->define("later", [&](Request req, int x) {
        std::lock_guard g(mu);
        workers.emplace_back([r = std::move(req), x]() mutable {
            std::this_thread::sleep_for(5ms);
            r.respond(x * 2);
        });
    });
    auto later = client->remote<int(int)>("later").on(ep);
    std::vector<Future<int>> fs;
    for (int i = 0; i < 8; ++i)
        fs.push_back(later(i));
    for (int i = 0; i < 8; ++i)
        EXPECT_EQ(value_within(std::move(fs[i])), i * 2);
    std::lock_guard g(mu);
    for (auto& t : workers)
        t.join();
}

TEST_P(Api, HandlerExceptionsReachTheCaller) {
    open();
    server->define("refuse", [](int) -> int { throw Exception(Errc::busy, "come back later"); });
    server->define("boom", [](int) -> int { throw std::runtime_error("kaboom"); });
    auto r1 = result_within(client->remote<int(int)>("refuse").on(ep)(1));
    ASSERT_FALSE(r1);
    EXPECT_EQ(r1.code(), Errc::busy);
    EXPECT_NE(r1.error().message().find("come back later"), std::string::npos)
        << r1.error().message();
    try {
        (void)client->remote<int(int)>("boom").on(ep)(1).get();
        FAIL() << "no exception";
    } catch (const Exception& e) {
        EXPECT_EQ(e.code(), Errc::internal);
        EXPECT_NE(std::string(e.what()).find("handler 'boom' threw: kaboom"), std::string::npos)
            << e.what();
    }
    // The server still serves after handler failures.
    server->define("ok", [] { return 1; });
    EXPECT_EQ(value_within(client->remote<int()>("ok").on(ep)()), 1);
}

TEST_P(Api, UnknownRpcNamesIt) {
    open();
    try {
        (void)client->remote<int(int)>("no_such_procedure").on(ep)(1).get();
        FAIL() << "no exception";
    } catch (const Exception& e) {
        EXPECT_EQ(e.code(), Errc::not_found);
        std::string what = e.what();
        // Said once: "no procedure 'no_such_procedure' (id 0x...) is registered at <address>".
        EXPECT_NE(what.find("no procedure 'no_such_procedure' (id 0x"), std::string::npos) << what;
        EXPECT_NE(what.find(" is registered at "), std::string::npos) << what;
        EXPECT_EQ(what.find("no RPC"), std::string::npos) << what;
        EXPECT_EQ(what.find("registered", what.find("registered") + 1), std::string::npos) << what;
    }
    // A handler's own not_found is not "no procedure": the peer's words reach the caller.
    server->define("lookup", []() -> int {
        throw Exception(Error(Errc::not_found, "no object 'x' in this store"));
    });
    auto r = result_within(client->remote<int()>("lookup").on(ep)());
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::not_found);
    EXPECT_NE(r.error().message().find("no object 'x' in this store"), std::string::npos)
        << r.error().message();
    EXPECT_EQ(r.error().message().find("no procedure"), std::string::npos) << r.error().message();
}

TEST_P(Api, ArgumentMismatchIsProtocolError) {
    // Checked calls are refused by their signature before anything is decoded
    // (Api.ASignatureMismatchIsRefusedNamingBothSidesTypes); unchecked ones meet the decoders.
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    auto checked = result_within(client->remote<int(std::string)>("sum").on(ep)("not two ints"));
    ASSERT_FALSE(checked);
    EXPECT_EQ(checked.code(), Errc::invalid_argument) << checked.error().describe();
    auto r =
        result_within(client->remote<int(std::string)>("sum").on(ep).unchecked()("not two ints"));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::protocol_error);
    EXPECT_NE(r.error().message().find("'sum'"), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find("(int, int)"), std::string::npos) << r.error().message();
    // Too few bytes, and a result type that does not match what the server returns.
    auto r2 = result_within(client->remote<int(int)>("sum").on(ep).unchecked()(1));
    EXPECT_EQ(r2.code(), Errc::protocol_error);
    auto r3 = result_within(client->remote<std::string(int, int)>("sum").on(ep).unchecked()(1, 2));
    EXPECT_EQ(r3.code(), Errc::protocol_error);
}

/// A tree as deep as asked: beyond proc::kMaxDepth it cannot be encoded.
struct Tree {
    std::vector<Tree> kids;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(kids);
    }
};
Tree tree_of_depth(uint32_t depth) {
    Tree root;
    Tree* t = &root;
    for (uint32_t i = 1; i < depth; ++i) {
        t->kids.emplace_back();
        t = &t->kids.back();
    }
    return root;
}

TEST_P(Api, EncodingErrorsNameTheirSide) {
    // Arguments and results are encoded straight into the send buffer: an encoding that fails
    // sends nothing, and the error says whether the arguments or the result failed.
    open();
    server->define("depth", [](const Tree&) { return 1; });
    server->define("grow", [](int depth) { return tree_of_depth(uint32_t(depth)); });
    auto r = result_within(
        client->remote<int(Tree)>("depth").on(ep)(tree_of_depth(proc::kMaxDepth + 2)));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::invalid_argument);
    EXPECT_NE(r.error().message().find("'depth': arguments"), std::string::npos)
        << r.error().message();
    auto g = result_within(client->remote<Tree(int)>("grow").on(ep)(int(proc::kMaxDepth) + 2));
    ASSERT_FALSE(g);
    EXPECT_EQ(g.code(), Errc::invalid_argument);
    EXPECT_NE(g.error().message().find("encoding the result"), std::string::npos)
        << g.error().message();
    // Both sides go on: a tree that fits, both ways.
    EXPECT_EQ(value_within(client->remote<int(Tree)>("depth").on(ep)(tree_of_depth(8))), 1);
    auto ok = result_within(client->remote<Tree(int)>("grow").on(ep)(8));
    ASSERT_TRUE(ok) << ok.error().describe();
    EXPECT_EQ(ok->kids.size(), 1u);
}

TEST_P(Api, TimeoutThrows) {
    open();
    std::mutex mu;
    std::vector<Request> parked;  // answered only after the caller gave up
    server->define("stall", [&](Request req) {
        std::lock_guard g(mu);
        parked.push_back(std::move(req));
    });
    auto t0 = Clock::now();
    try {
        client->remote<void()>("stall").on(ep).timeout(100ms)().get();
        FAIL() << "no exception";
    } catch (const Exception& e) {
        EXPECT_EQ(e.code(), Errc::timeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("stall"), std::string::npos) << e.what();
    }
    EXPECT_GE(Clock::now() - t0, 90ms);
    // The engine-wide default applies to calls that set none.
    Engine c2(GetParam().address, EngineOptions{.default_timeout = 50ms});
    auto r = result_within(c2.remote<void()>("stall").on(c2.lookup(server->self_address()))());
    EXPECT_EQ(r.code(), Errc::timeout);
    // Both calls reach the handler (on the server's thread) before `mu` and `parked` go out of
    // scope: a loaded machine may deliver the second one after its caller gave up.
    auto deadline = deadline_after(kWait);
    for (;;) {
        {
            std::lock_guard g(mu);
            if (parked.size() == 2 || deadline_passed(deadline)) break;
        }
        std::this_thread::sleep_for(1ms);
    }
    std::lock_guard g(mu);
    EXPECT_EQ(parked.size(), 2u);
    for (auto& q : parked)
        (void)q.try_respond();  // late answers are dropped by the caller
}

TEST_P(Api, ManualProgressOneThreadDrivesBoth) {
    EngineOptions manual{.progress = ProgressMode::manual};
    open(manual, manual);
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    std::vector<Future<int>> fs;
    for (int i = 0; i < 16; ++i)
        fs.push_back(sum(i, i));
    auto all_ready = [&] {
        return std::all_of(fs.begin(), fs.end(), [](auto& f) { return f.ready(); });
    };
    auto deadline = deadline_after(kWait);
    while (!all_ready() && !deadline_passed(deadline)) {
        server->poll();
        client->poll();
    }
    ASSERT_TRUE(all_ready());
    for (int i = 0; i < 16; ++i)
        EXPECT_EQ(fs[i].get(), 2 * i);
    // Nothing runs without the caller: a call stays pending while nobody drives the server.
    auto f = sum(1, 1);
    client->poll();
    EXPECT_FALSE(f.ready());
    deadline = deadline_after(kWait);
    while (!f.ready() && !deadline_passed(deadline)) {
        server->progress(1ms);
        server->trigger();
        client->progress(1ms);
        client->trigger();
    }
    EXPECT_EQ(f.get(), 2);
}

TEST_P(Api, ManualClientGetDrivesItselfThread) {
    // A background server and a manual client: get() progresses the client by itself.
    server.emplace(GetParam().address, listen);
    client.emplace(GetParam().address, EngineOptions{.progress = ProgressMode::manual});
    ep = client->lookup(server->self_address());
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    EXPECT_EQ(sum(2, 3).get(), 5);
    auto f = sum(3, 4);
    ASSERT_TRUE(f.wait_for(kWait));
    EXPECT_EQ(f.get(), 7);
}

TEST_P(Api, BusyWaitMode) {
    EngineOptions busy{.wait = WaitMode::busy};
    open(busy, busy);
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    for (int i = 0; i < 50; ++i)
        ASSERT_EQ(value_within(sum(i, 1)), i + 1);
}

TEST_P(Api, SeveralContextsThread) {
    EngineOptions three{.contexts = 3};
    open(three, three);
    server->define("where", [](const Request& req) { return int(req.context_id()); });
    auto where = client->remote<int()>("where").on(ep);
    for (uint8_t target = 0; target < 3; ++target)
        for (uint8_t from = 0; from < 3; ++from)
            EXPECT_EQ(value_within(where.context(target).from(from)()), target);
    // Calls from several threads and contexts at once.
    std::vector<std::thread> ts;
    std::atomic<int> good{0};
    for (int t = 0; t < 3; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; i < 20; ++i) {
                auto r = result_within(where.context(uint8_t(i % 3)).from(uint8_t(t))());
                if (r && *r == i % 3) ++good;
            }
        });
    for (auto& th : ts)
        th.join();
    EXPECT_EQ(good.load(), 60);
    auto bad = result_within(where.from(7)());
    EXPECT_EQ(bad.code(), Errc::invalid_argument);
}

TEST_P(Api, ThenRunsOnCompletion) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Result<int>> got;
    client->remote<int(int, int)>("sum").on(ep)(20, 22).then([&](Result<int>&& r) {
        std::lock_guard g(mu);
        got.emplace(std::move(r));
        cv.notify_all();
    });
    std::unique_lock g(mu);
    ASSERT_TRUE(cv.wait_for(g, kWait, [&] { return got.has_value(); }));
    ASSERT_TRUE(*got);
    EXPECT_EQ(**got, 42);
    // then() on a future that is already complete runs at once.
    bool ran = false;
    Future<int>::ready_with(Error(Errc::canceled)).then([&](Result<int>&& r) {
        ran = r.code() == Errc::canceled;
    });
    EXPECT_TRUE(ran);
}

// then() keeps a small callback in the future's state and a large one on the heap: both run
// once with the result, wherever the future completes (before or after then()), and a state
// that dies uncompleted destroys the callback it holds (what it captured is released).
TEST(FutureThen, SmallAndLargeCallbacksRunOnceAndDieWithTheirState) {
    using detail::State;
    auto token = std::make_shared<int>(7);
    struct Big {
        std::array<std::byte, 200> pad{};
    };
    for (bool large : {false, true}) {
        SCOPED_TRACE(large ? "large callback" : "small callback");
        // Completed after then().
        {
            auto st = std::make_shared<State<int>>();
            int runs = 0, value = 0;
            Big big;
            Future<int> f(st);
            if (large)
                std::move(f).then([&, big, token](Result<int>&& r) {
                    ++runs;
                    value = *r;
                    (void)big;
                });
            else
                std::move(f).then([&, token](Result<int>&& r) {
                    ++runs;
                    value = *r;
                });
            EXPECT_EQ(token.use_count(), 2);  // held by the waiting callback
            EXPECT_EQ(runs, 0);
            st->set(Result<int>(41));
            EXPECT_EQ(runs, 1);
            EXPECT_EQ(value, 41);
            EXPECT_EQ(token.use_count(), 1);  // released once run
        }
        // Completed before then(): runs at once, on this thread.
        {
            auto st = std::make_shared<State<int>>();
            st->set(Result<int>(Error(Errc::canceled)));
            int runs = 0;
            Errc code = Errc::ok;
            Big big;
            if (large)
                Future<int>(st).then([&, big](Result<int>&& r) {
                    ++runs;
                    code = r.code();
                    (void)big;
                });
            else
                Future<int>(st).then([&](Result<int>&& r) {
                    ++runs;
                    code = r.code();
                });
            EXPECT_EQ(runs, 1);
            EXPECT_EQ(code, Errc::canceled);
        }
    }
    // Never completed: the small callback dies with the state (the large one is kept alive by
    // the state it holds, as before: a cycle only completion breaks, so not tested here).
    {
        auto st = std::make_shared<State<int>>();
        bool ran = false;
        Future<int>(st).then([&ran, token](Result<int>&&) { ran = true; });
        EXPECT_EQ(token.use_count(), 2);
        st.reset();
        EXPECT_EQ(token.use_count(), 1);
        EXPECT_FALSE(ran);
    }
}

TEST_P(Api, OneWayCalls) {
    open();
    std::atomic<int> hits{0};
    server->define("hit", [&](int n) { hits += n; });
    auto hit = client->remote<void(int)>("hit").on(ep).one_way();
    for (int i = 0; i < 10; ++i)
        EXPECT_TRUE(result_within(hit(1)));
    auto deadline = deadline_after(kWait);
    while (hits.load() < 10 && !deadline_passed(deadline))
        std::this_thread::sleep_for(1ms);
    EXPECT_EQ(hits.load(), 10);
}

// An engine calls itself through its own self(), listening or not (a client's engine has no
// endpoint its transport could reach on sm or tcp): small and large arguments, one-way calls,
// and its own memory pulled and pushed.
TEST_P(Api, AnEngineCallsItselfWhetherOrNotItListens) {
    open();
    for (Engine* e : {&*client, &*server}) {
        SCOPED_TRACE(e == &*client ? "the client (not listening)" : "the server (listening)");
        Engine& me = *e;
        std::atomic<int> hits{0};
        me.define("twice", [](int x) { return 2 * x; });
        me.define("sum", [](std::vector<uint8_t> v) {
            uint64_t s = 0;
            for (uint8_t b : v)
                s += b;
            return s;
        });
        me.define("hit", [&](int n) { hits += n; });
        me.define("copy", [&me](const Request& req, Bulk from, Bulk to) {
            std::vector<std::byte> buf(from.size());
            auto local = me.expose({buf.data(), buf.size()}, read_write);
            req.pull(from, 0, local, 0, from.size()).get();
            req.push(to, 0, local, 0, buf.size()).get();
            return buf.size();
        });
        const Endpoint self = me.self();
        EXPECT_EQ(value_within(me.remote<int(int)>("twice").on(self)(21)), 42);
        std::vector<uint8_t> big(1 << 20, 3);  // past the eager size: the target pulls it
        EXPECT_EQ(value_within(me.remote<uint64_t(std::vector<uint8_t>)>("sum").on(self)(big)),
                  uint64_t{3} << 20);
        auto hit = me.remote<void(int)>("hit").on(self).one_way();
        for (int i = 0; i < 5; ++i)
            EXPECT_TRUE(result_within(hit(2)));
        auto deadline = deadline_after(kWait);
        while (hits.load() < 10 && !deadline_passed(deadline))
            std::this_thread::sleep_for(1ms);
        EXPECT_EQ(hits.load(), 10);
        // Its own memory, pulled and pushed by a handler of a call to itself that blocks on
        // each transfer (small handles travel inline): the transport serves a put/get to its
        // own address itself, since the target endpoint's progress is the blocked handler's.
        for (std::size_t n : {std::size_t{100}, std::size_t{1} << 20}) {
            std::vector<std::byte> src(n), dst(n);
            na::test::fill_pattern(src, uint32_t(n));
            auto from = me.expose({src.data(), n}, read_only);
            auto to = me.expose({dst.data(), n}, write_only);
            EXPECT_EQ(value_within(me.remote<std::size_t(Bulk, Bulk)>("copy").on(self)(from, to)),
                      n);
            EXPECT_EQ(na::test::pattern_mismatch(dst, uint32_t(n)), std::nullopt) << n;
        }
        for (const char* name : {"twice", "sum", "hit", "copy"})
            EXPECT_TRUE(me.try_undefine(name));
    }
}

TEST_P(Api, DefineErrorsAndTwins) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    auto again = server->try_define("sum", [](int a) { return a; });
    EXPECT_EQ(again.code(), Errc::already_exists);
    EXPECT_THROW(server->define("sum", [](int a) { return a; }), Exception);
    auto bad = client->try_lookup("nosuchscheme://nowhere");
    EXPECT_FALSE(bad);
    EXPECT_THROW((void)client->lookup("nosuchscheme://nowhere"), Exception);
    auto e = Engine::open("nosuchscheme://x", false);
    EXPECT_FALSE(e);
    EXPECT_THROW(Engine("nosuchscheme://x"), Exception);
    // Undefine: later calls are not_found.
    EXPECT_TRUE(server->try_undefine("sum"));
    auto r = result_within(client->remote<int(int, int)>("sum").on(ep)(1, 2));
    EXPECT_EQ(r.code(), Errc::not_found);
    // A call without an endpoint fails in its future.
    EXPECT_EQ(result_within(client->remote<int(int, int)>("sum")(1, 2)).code(),
              Errc::invalid_argument);
}

TEST_P(Api, EndpointsAndMove) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    EXPECT_EQ(ep.to_string(), server->self_address());
    EXPECT_TRUE(ep == client->lookup(server->self_address()));
    EXPECT_FALSE(ep == client->self());
    // Moving the engine keeps procedures and endpoints working.
    Engine moved = std::move(*client);
    client.reset();  // a moved-from engine is empty: destroying it does nothing
    EXPECT_EQ(value_within(moved.remote<int(int, int)>("sum").on(ep)(2, 2)), 4);
    std::mutex mu;
    Endpoint seen;  // written on the server's thread
    server->define("whoami", [&](const Request& req) {
        std::lock_guard g(mu);
        seen = req.source();
        return req.source().to_string();
    });
    auto s = value_within(moved.remote<std::string()>("whoami").on(ep)());
    {
        std::lock_guard g(mu);
        EXPECT_EQ(s, seen.to_string());
    }
    ep = {};  // before `moved`, whose transport it points into
}

TEST_P(Api, ShutdownFailsPendingCalls) {
    open();
    std::mutex mu;
    std::vector<Request> parked;
    server->define("stall", [&](Request req) {
        std::lock_guard g(mu);
        parked.push_back(std::move(req));
    });
    auto f = client->remote<void()>("stall").on(ep)();
    // Wait until the server holds the call, then destroy the client under it.
    auto deadline = deadline_after(kWait);
    for (;;) {
        {
            std::lock_guard g(mu);
            if (!parked.empty() || deadline_passed(deadline)) break;
        }
        std::this_thread::sleep_for(1ms);
    }
    ep = {};
    client.reset();
    ASSERT_TRUE(f.ready());
    EXPECT_EQ(f.try_get().code(), Errc::shutdown);
    std::lock_guard g(mu);
    for (auto& q : parked)
        (void)q.try_respond();
}

/// Calls `echo` 200 times with get(): at least one response must be decoded on this thread.
/// Then 20 calls with then(), which nobody waits for: they complete all the same.
void expect_get_drives(const Procedure<DecodedOn(DecodedOn)>& echo, const char* mode) {
    int here = 0;
    for (int i = 0; i < 200; ++i) {
        DecodedOn r = value_within(echo(DecodedOn{i, {}}));
        ASSERT_EQ(r.v, i);
        if (r.decoded_by == std::this_thread::get_id()) ++here;
    }
    EXPECT_GT(here, 0) << mode << ": no response of 200 was decoded on the thread waiting in get()";
    // Shared with the continuations: a late one must not touch a finished test's stack.
    auto done = std::make_shared<std::atomic<int>>(0);
    for (int i = 0; i < 20; ++i)
        echo(DecodedOn{i, {}}).then([done, i](Result<DecodedOn>&& r) {
            if (r && r->v == i) done->fetch_add(1);
        });
    auto deadline = deadline_after(kWait);
    while (done->load() < 20 && !deadline_passed(deadline))
        std::this_thread::sleep_for(1ms);
    EXPECT_EQ(done->load(), 20) << mode;
}

// get() on a background engine drives the call's context itself (the progress thread steps
// aside while it waits), so responses are decoded on the waiting thread; with the old hand-off
// every one was decoded on the progress thread. Busy and blocking modes.
TEST_P(Api, GetDrivesItsContextOnTheWaitingThread) {
    for (WaitMode mode : {WaitMode::busy, WaitMode::block}) {
        EngineOptions o{.wait = mode};
        open(o, o);
        server->define("echo", [](DecodedOn d) { return d; });
        expect_get_drives(client->remote<DecodedOn(DecodedOn)>("echo").on(ep),
                          mode == WaitMode::busy ? "busy" : "block");
        TearDown();
    }
}

// A thread waiting in get() (driving the context itself) while another thread destroys the
// engine: the wait ends with shutdown, nothing hangs or touches the destroyed context.
TEST_P(Api, EngineDestroyedUnderAGetOnAnotherThread) {
    for (WaitMode mode : {WaitMode::busy, WaitMode::block}) {
        EngineOptions o{.wait = mode};
        open({}, o);
        std::mutex mu;
        std::vector<Request> parked;
        server->define("stall", [&](Request req) {
            std::lock_guard g(mu);
            parked.push_back(std::move(req));
        });
        std::atomic<bool> entered{false};
        Result<void> got = ok();
        std::thread waiter([&, f = client->remote<void()>("stall").on(ep)()]() mutable {
            entered = true;
            got = f.try_get();
        });
        auto deadline = deadline_after(kWait);
        for (;;) {
            {
                std::lock_guard g(mu);
                if ((!parked.empty() && entered) || deadline_passed(deadline)) break;
            }
            std::this_thread::sleep_for(1ms);
        }
        std::this_thread::sleep_for(20ms);  // let it settle into driving the context
        ep = {};
        client.reset();
        waiter.join();
        EXPECT_EQ(got.code(), Errc::shutdown);
        {
            std::lock_guard g(mu);
            for (auto& q : parked)
                (void)q.try_respond();
            parked.clear();
        }
        TearDown();
    }
}

TEST_P(Api, CountersJson) {
    open();
    server->define("sum", [](int a, int b) { return a + b; });
    auto sum = client->remote<int(int, int)>("sum").on(ep);
    for (int i = 0; i < 5; ++i)
        ASSERT_EQ(value_within(sum(i, i)), 2 * i);
    auto c = client->counters();
    EXPECT_GE(c.rpcs_sent, 5u);
    EXPECT_GE(c.responses_received, 5u);
    auto j = nlohmann::json::parse(client->counters_json());
    EXPECT_GE(j.at("rpcs_sent").get<uint64_t>(), 5u);
    auto s = nlohmann::json::parse(server->counters_json());
    EXPECT_GE(s.at("rpcs_received").get<uint64_t>(), 5u);
}

// Issue 9: in blocking mode (the default) a round trip must not wait for a sleeping thread's
// timeout. A lost wake-up shows as round trips of ~100 ms (the sleep slice); the bound is
// loose so that a loaded machine does not trip it: at most 5 of 500 may take over 50 ms.
TEST_P(Api, BlockingRoundTripsAreNotLost) {
    open();
    server->define("echo", [](uint64_t x) { return x; });
    auto echo = client->remote<uint64_t(uint64_t)>("echo").on(ep);
    ASSERT_EQ(value_within(echo(7)), 7u);  // connection set-up is not measured
    int slow = 0;
    Duration worst{0};
    for (uint64_t i = 0; i < 500; ++i) {
        auto t0 = Clock::now();
        ASSERT_EQ(value_within(echo(i)), i);
        auto d = Clock::now() - t0;
        worst = std::max(worst, d);
        if (d > 50ms) ++slow;
        // Now and then let both sides fall asleep between calls, as an idle service does.
        if (i % 50 == 49) std::this_thread::sleep_for(2ms);
    }
    EXPECT_LE(slow, 5) << slow << " of 500 blocking round trips took over 50 ms (worst "
                       << std::chrono::duration<double, std::milli>(worst).count() << " ms)";
}

// Issue 9: a call to a context the server does not have fails promptly with not_found naming
// it. (Not yet for the id right after the last RPC context, where the engine keeps its bulk
// transfer context: see docs/architecture.md, Known limits.)
TEST_P(Api, CallToMissingContextFailsPromptly) {
    open();
    server->define("echo", [](uint64_t x) { return x; });
    // 5 and 200: ids the server has no context for; contexts(): the id of its bulk context,
    // which exists at the transport but takes no calls.
    uint8_t bulk_id = server->context_count();
    for (uint8_t target : {uint8_t(5), uint8_t(200), bulk_id}) {
        auto t0 = Clock::now();
        auto r =
            result_within(client->remote<uint64_t(uint64_t)>("echo").on(ep).context(target)(1), 5s);
        auto took = Clock::now() - t0;
        ASSERT_FALSE(r) << "context " << int(target);
        EXPECT_EQ(r.code(), Errc::not_found) << r.error().describe();
        EXPECT_NE(r.error().message().find("context " + std::to_string(target)), std::string::npos)
            << r.error().describe();
        EXPECT_LT(took, 2s) << "context " << int(target);
    }
}

INSTANTIATE_TEST_SUITE_P(api, Api, ::testing::ValuesIn(na::test::transport_kinds()), kind_name);

}  // namespace
}  // namespace talaria::api_test

namespace talaria::api_test {
namespace {

// A continuation that calls the engine again while the engine is being destroyed (it completes
// with shutdown there) must find the engine whole: its new call fails with shutdown.
TEST(ApiShutdown, ContinuationCallingAgainDuringDestruction) {
    Engine srv("inproc://api-shutdown-srv", listen);
    std::mutex mu;
    std::vector<Request> kept;
    srv.define("hang", [&](Request r, int) {
        std::lock_guard g(mu);
        kept.push_back(std::move(r));
    });
    std::atomic<int> first{-1}, retry{-1};
    {
        Engine cli("inproc://api-shutdown-cli");
        auto ep = cli.lookup(srv.self_address());
        auto p = cli.remote<int(int)>("hang").on(ep);
        p(1).then([p, &first, &retry](Result<int>&& r) {
            first = int(r.code());
            p(2).then([&retry](Result<int>&& r2) { retry = int(r2.code()); });
        });
        auto deadline = deadline_after(10s);
        while (!deadline_passed(deadline)) {
            {
                std::lock_guard g(mu);
                if (!kept.empty()) break;
            }
            std::this_thread::sleep_for(1ms);
        }
    }  // destroyed with the call in flight
    EXPECT_EQ(first.load(), int(Errc::shutdown));
    EXPECT_EQ(retry.load(), int(Errc::shutdown));
    std::lock_guard g(mu);
    kept.clear();
}

// Shared-secret authentication through the API (tcp): a client with the secret calls, a client
// without it or with another one is refused with access_denied before the handler runs.
// Request::peer_identity(): sm reports the caller's uid and pid as the kernel saw them; tcp
// without a secret and the fabrics' transports report that the caller proved nothing.
TEST(ApiAuth, HandlersSeeWhatTheCallerProved) {
    for (std::string where : {"sm://", "tcp://127.0.0.1:0"}) {
        Engine server{where, listen};
        server.define("who", [](const Request& req) {
            auto id = req.peer_identity();
            return std::vector<int64_t>{id.uid, id.pid, int64_t(id.authenticated())};
        });
        Engine client{where};
        auto r = result_within(client.remote<std::vector<int64_t>()>("who")
                                   .on(client.lookup(server.self_address()))
                                   .timeout(10s)());
        ASSERT_TRUE(r) << where << ": " << r.error().describe();
        if (where == "sm://")
            EXPECT_EQ(*r, (std::vector<int64_t>{int64_t(::geteuid()), int64_t(::getpid()), 1}));
        else
            EXPECT_EQ(*r, (std::vector<int64_t>{-1, -1, 0}))
                << "tcp without a secret proves nothing";
    }
}

// On tcp, ofi+tcp (a handshake of messages between the two processes) and ucx+tcp (whose
// peers prove the secret at its bootstrap port and sign their hellos with the session that
// leaves them).
TEST(ApiAuth, NetworkCallsNeedTheSharedSecret) {
    auto with = [](char fill) {
        EngineOptions o;
        o.core.na.auth.key_id = "test-cluster";
        o.core.na.auth.secret.assign(32, std::byte(fill));
        return o;
    };
    std::vector<std::string> where{"tcp://127.0.0.1:0"};
    auto built = na::transports_built();
    if (std::find(built.begin(), built.end(), "ofi") != built.end())
        where.push_back("ofi+tcp://127.0.0.1:0");
    if (std::find(built.begin(), built.end(), "ucx") != built.end())
        where.push_back("ucx+tcp://127.0.0.1:0");
    for (const std::string& addr : where) {
        SCOPED_TRACE(addr);
        std::atomic<int> ran{0};
        Engine server{addr, listen, with('s')};
        server.define("twice", [&ran](int x) {
            ++ran;
            return 2 * x;
        });
        // The handler sees who called: the key id of the secret the caller proved it holds.
        server.define("who", [](const Request& req) { return req.peer_identity().describe(); });
        {
            Engine good{addr, with('s')};
            auto r = result_within(good.remote<int(int)>("twice")
                                       .on(good.lookup(server.self_address()))
                                       .timeout(10s)(21));
            ASSERT_TRUE(r) << r.error().describe();
            EXPECT_EQ(*r, 42);
            auto who = result_within(good.remote<std::string()>("who")
                                         .on(good.lookup(server.self_address()))
                                         .timeout(10s)());
            ASSERT_TRUE(who) << who.error().describe();
            EXPECT_EQ(*who, "key \"test-cluster\"");
        }
        for (auto opts : {with('x'), EngineOptions{}}) {
            Engine stranger{addr, opts};
            auto r = result_within(stranger.remote<int(int)>("twice")
                                       .on(stranger.lookup(server.self_address()))
                                       .timeout(10s)(1));
            ASSERT_FALSE(r);
            EXPECT_TRUE(r.code() == Errc::access_denied || r.code() == Errc::disconnected)
                << r.error().describe();
        }
        EXPECT_EQ(ran.load(), 1) << "a stranger's call reached the handler";
    }
}

}  // namespace
}  // namespace talaria::api_test
