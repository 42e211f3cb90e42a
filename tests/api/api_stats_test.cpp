// Issue 12: per-procedure statistics through the API (Engine::stats, stats_json,
// stats_prometheus): counts on both sides match what was called, outcomes by error code,
// latencies, the queueing delay of handlers on an executor, and the exports parse.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "api_fixture.hpp"
#include "talaria/util/log.hpp"

namespace talaria::api_test {
namespace {

class Stats : public Api {
  protected:
    /// Engines that time every call (core::Options::stats_timing_gap 0), so the histograms'
    /// counts are the calls' whatever the machine's speed.
    void open_timing_all() {
        EngineOptions o;
        o.core.stats_timing_gap = Duration::zero();
        open(o, o);
    }
    void calls_after_a_busy_spell_are_timed(WaitMode mode);
};

const core::ProcStats* find(const std::vector<core::ProcStats>& all, std::string_view name,
                            uint16_t provider = 0) {
    for (const auto& p : all)
        if (p.name == name && p.provider == provider) return &p;
    return nullptr;
}

/// `calls` calls of `echo` (int -> the same int), `batch` in flight at a time, each answer checked.
template <class Echo>
void call_in_batches(Echo& echo, int calls, int batch) {
    std::vector<Future<int>> inflight;
    for (int i = 0; i < calls; i += batch) {
        inflight.clear();
        for (int j = i; j < i + batch; ++j)
            inflight.push_back(echo(j));
        for (int j = 0; j < batch; ++j)
            ASSERT_EQ(value_within(std::move(inflight[std::size_t(j)])), i + j);
    }
}

uint64_t errors_of(const core::ProcSideStats& s, Errc code) {
    return s.errors[std::size_t(code)];
}

TEST_P(Stats, CallsOutcomesAndBytesOnBothSides) {
    open_timing_all();
    server->define("echo", [](std::string s) { return s; });
    server->define("refuse", [](Request req) { req.respond_error(Errc::access_denied, "no"); });
    auto echo = client->remote<std::string(std::string)>("echo").on(ep);
    auto refuse = client->remote<void()>("refuse").on(ep);
    const std::string arg(100, 'x');
    constexpr int kCalls = 50;
    for (int i = 0; i < kCalls; ++i)
        ASSERT_EQ(value_within(echo(arg)), arg);
    for (int i = 0; i < 3; ++i)
        EXPECT_FALSE(result_within(refuse()));

    const auto cs = client->stats();
    const auto* ce = find(cs, "echo");
    ASSERT_NE(ce, nullptr) << client->stats_json(2);
    EXPECT_EQ(ce->client.calls, uint64_t(kCalls));
    EXPECT_EQ(ce->client.ok, uint64_t(kCalls));
    EXPECT_EQ(ce->client.failed(), 0u);
    EXPECT_GE(ce->client.bytes_out, uint64_t(kCalls) * arg.size());
    EXPECT_GE(ce->client.bytes_in, uint64_t(kCalls) * arg.size());
    EXPECT_EQ(ce->client.latency.count(), uint64_t(kCalls));
    EXPECT_GT(ce->client.latency.quantile(0.5), 0u);
    EXPECT_LE(ce->client.latency.quantile(0.5), ce->client.latency.quantile(0.99));
    EXPECT_LE(ce->client.latency.quantile(0.99), ce->client.latency.max());
    EXPECT_EQ(ce->server.calls, 0u) << "the client serves nothing";
    const auto* cr = find(cs, "refuse");
    ASSERT_NE(cr, nullptr);
    EXPECT_EQ(cr->client.calls, 3u);
    EXPECT_EQ(errors_of(cr->client, Errc::access_denied), 3u);

    // The server's side: answered by the time the client read the answers.
    const auto ss = server->stats();
    const auto* se = find(ss, "echo");
    ASSERT_NE(se, nullptr) << server->stats_json(2);
    EXPECT_EQ(se->server.calls, uint64_t(kCalls));
    EXPECT_EQ(se->server.ok, uint64_t(kCalls));
    EXPECT_EQ(se->server.bytes_in, ce->client.bytes_out);
    EXPECT_EQ(se->server.bytes_out, ce->client.bytes_in);
    EXPECT_EQ(se->server.latency.count(), uint64_t(kCalls));
    EXPECT_EQ(se->queue.count(), 0u) << "handlers on the progress thread do not queue";
    EXPECT_EQ(se->client.calls, 0u);
    const auto* sr = find(ss, "refuse");
    ASSERT_NE(sr, nullptr);
    EXPECT_EQ(sr->server.calls, 3u);
    EXPECT_EQ(errors_of(sr->server, Errc::access_denied), 3u);
}

TEST_P(Stats, TimeoutsAndProvidersAreCountedApart) {
    open_timing_all();
    server->define("slow", [](int ms) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        return ms;
    });
    server->define("id", uint16_t{7}, [] { return 7; });
    auto slow = client->remote<int(int)>("slow").on(ep);
    EXPECT_EQ(value_within(slow(0)), 0);
    auto r = result_within(slow.timeout(std::chrono::milliseconds(20))(300));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::timeout);
    EXPECT_EQ(value_within(client->remote<int()>("id").on(ep).provider(7)()), 7);

    const auto cs = client->stats();
    const auto* c = find(cs, "slow");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->client.calls, 2u);
    EXPECT_EQ(c->client.ok, 1u);
    EXPECT_EQ(errors_of(c->client, Errc::timeout), 1u);
    EXPECT_EQ(c->client.latency.count(), 2u) << "every outcome has a round trip";
    EXPECT_GE(c->client.latency.max(), 19'800'000u) << "the timed-out call waited 20 ms (to 1%)";
    ASSERT_NE(find(cs, "id", 7), nullptr);
    EXPECT_EQ(find(cs, "id", 7)->client.calls, 1u);
    EXPECT_EQ(find(cs, "id", 0), nullptr);
    // The slow handler still answers (its caller gave up): the server counts it when it does,
    // as what its caller saw (a timeout), not as ok.
    const auto deadline = deadline_after(kWait);
    while (!deadline_passed(deadline)) {
        const auto now = server->stats();  // kept: find() points into it
        const auto* s = find(now, "slow");
        if (s && s->server.ok + errors_of(s->server, Errc::timeout) == 2) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto ss = server->stats();
    const auto* s = find(ss, "slow");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->server.ok, 1u);
    EXPECT_EQ(errors_of(s->server, Errc::timeout), 1u) << "answered after its caller's deadline";
    // Ticks become nanoseconds through a measured rate (TickScale): the counter and
    // CLOCK_MONOTONIC (which NTP may slew by up to 500 ppm) agree to well within 1%, not exactly.
    EXPECT_GE(s->server.latency.max(), 297'000'000u) << "handler time of the 300 ms call";
}

// A handler that answers ok after its caller canceled is counted as canceled on the server,
// as the caller counts it.
TEST_P(Stats, AnAnswerToACanceledCallCountsAsCanceled) {
    open_timing_all();
    std::atomic<int> started{0};
    server->define(
        "sleepy",
        [&](int ms) {
            ++started;
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            return ms;
        },
        server->handler_pool());
    auto f = client->remote<int(int)>("sleepy").on(ep)(300);
    for (auto until = Clock::now() + kWait; started.load() == 0 && Clock::now() < until;)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(started.load(), 1);
    ASSERT_TRUE(f.cancel());
    const auto deadline = deadline_after(kWait);
    while (!deadline_passed(deadline)) {
        const auto now = server->stats();
        const auto* s = find(now, "sleepy");
        if (s && s->server.ok + errors_of(s->server, Errc::canceled) == 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto ss = server->stats();
    const auto* s = find(ss, "sleepy");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->server.ok, 0u);
    EXPECT_EQ(errors_of(s->server, Errc::canceled), 1u);
    EXPECT_EQ(s->server.latency.count(), 1u) << "still timed: the handler ran";
}

// A handler on the handler pool, called at intervals far above the timing gap: every call is
// timed, and the count is there when the caller has its answer (it was 0 or 1 from run to run).
TEST_P(Stats, HandlerPoolCallsFurtherApartThanTheGapAreAllTimed) {
    open();  // the default gap (10 us)
    server->define(
        "slow",
        [](int ms) {
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            return ms;
        },
        server->handler_pool());
    auto slow = client->remote<int(int)>("slow").on(ep);
    constexpr int kCalls = 4;
    for (int i = 0; i < kCalls; ++i) {
        ASSERT_EQ(value_within(slow(20)), 20);
        const auto ss = server->stats();
        const auto* s = find(ss, "slow");
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(s->server.ok, uint64_t(i + 1));
        EXPECT_EQ(s->server.latency.count(), uint64_t(i + 1)) << "call " << i;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const auto cs = client->stats();
    EXPECT_EQ(find(cs, "slow")->client.latency.count(), uint64_t(kCalls));
}

// Introspection answers about the engine without counting its own call: an idle server holds
// no request, whoever asks.
TEST_P(Stats, IntrospectionDoesNotCountItsOwnRequestAsHeld) {
    open();
    server->enable_introspection();
    auto in_flight = nlohmann::json::parse(value_within(
        client->remote<std::string()>(std::string(Engine::kInFlightProcedure)).on(ep)()));
    for (const auto& c : in_flight["contexts"])
        EXPECT_EQ(c["requests_held"], 0) << in_flight.dump();
    auto stats = nlohmann::json::parse(
        value_within(client->remote<std::string()>(std::string(Engine::kStatsProcedure)).on(ep)()));
    EXPECT_EQ(stats["counters"]["held"], 0) << stats["counters"].dump();
    const std::string text = value_within(
        client->remote<std::string()>(std::string(Engine::kPrometheusProcedure)).on(ep)());
    const auto at = text.find("\ntalaria_held{");
    ASSERT_NE(at, std::string::npos) << text;
    const std::string line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
    EXPECT_EQ(line.substr(line.size() - 2), " 0") << line;
}

TEST_P(Stats, BusyContextsTimeASampleAndCountEveryCall) {
    // A gap of a second makes any run of calls "busy": each side times about one call in
    // CallTimer::kMaxPeriod (64) once the counter's rate is known (2 ms after the open).
    EngineOptions o;
    o.core.stats_timing_gap = std::chrono::seconds(1);
    open(o, o);
    server->define("echo", [](int v) { return v; });
    auto echo = client->remote<int(int)>("echo").on(ep);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    constexpr int kCalls = 1000;
    call_in_batches(echo, kCalls, 8);
    const auto cs = client->stats();
    const auto ss = server->stats();
    const auto* c = find(cs, "echo");
    const auto* s = find(ss, "echo");
    ASSERT_NE(c, nullptr);
    ASSERT_NE(s, nullptr);
    for (const core::ProcSideStats* side : {&c->client, &s->server}) {
        EXPECT_EQ(side->calls, uint64_t(kCalls)) << "every call is counted";
        EXPECT_EQ(side->ok, uint64_t(kCalls));
        EXPECT_GE(side->latency.count(), 1u) << "some are timed";
        EXPECT_LE(side->latency.count(), uint64_t(kCalls) / 4) << "a sample, not every call";
        EXPECT_LE(side->latency.quantile(0.5), side->latency.max());
    }
    EXPECT_GT(c->client.latency.quantile(0.5), 0u);
}

TEST_P(Stats, CallsFurtherApartThanTheGapAreAllTimed) {
    EngineOptions o;
    o.core.stats_timing_gap = std::chrono::microseconds(200);
    open(o, o);
    server->define("echo", [](int v) { return v; });
    auto echo = client->remote<int(int)>("echo").on(ep);
    constexpr int kCalls = 12;
    for (int i = 0; i < kCalls; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        ASSERT_EQ(value_within(echo(i)), i);
    }
    const auto cs = client->stats();
    const auto ss = server->stats();
    ASSERT_NE(find(cs, "echo"), nullptr);
    ASSERT_NE(find(ss, "echo"), nullptr);
    EXPECT_EQ(find(cs, "echo")->client.latency.count(), uint64_t(kCalls));
    EXPECT_EQ(find(ss, "echo")->server.latency.count(), uint64_t(kCalls));
}

// After a busy spell the timers skip a random number of calls (up to twice the period less one);
// calls that then come further apart than the gap are timed all the same: the context's idle
// time ends the skip (QuietWatch), in blocking mode (a wait in the transport) and when busy
// polling (a run of empty passes). Without that, the first of them was left untimed.
void Stats::calls_after_a_busy_spell_are_timed(WaitMode mode) {
    EngineOptions o;
    o.wait = mode;
    // A gap of 2 ms: a loaded 2-core machine stalls a blocking burst's client or server for a
    // millisecond often enough that a 1 ms gap timed a quarter of the burst.
    o.core.stats_timing_gap = std::chrono::milliseconds(2);
    open(o, o);
    server->define("echo", [](int v) { return v; });
    auto echo = client->remote<int(int)>("echo").on(ep);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the counter's rate is known
    constexpr int kBurst = 2000;
    call_in_batches(echo, kBurst, 16);
    auto timed = [&] {
        const auto cs = client->stats();
        const auto ss = server->stats();
        return std::pair{find(cs, "echo")->client.latency.count(),
                         find(ss, "echo")->server.latency.count()};
    };
    const auto [client_before, server_before] = timed();
    // Sampled: about one call in CallTimer::kMaxPeriod (64) while busy, each stall past the gap
    // one more; timing every call would be kBurst.
    EXPECT_LT(client_before, uint64_t(kBurst) / 2) << "the burst was sampled";
    constexpr int kSpaced = 6;
    for (int i = 0; i < kSpaced; ++i) {
        // 20 times the gap: a loaded 2-core machine can keep the context's progress thread
        // off a core for several milliseconds before it sees the context idle.
        std::this_thread::sleep_for(std::chrono::milliseconds(40));
        ASSERT_EQ(value_within(echo(i)), i);
    }
    const auto deadline = deadline_after(kWait);  // the server's record follows its answer
    while (timed().second < server_before + kSpaced && !deadline_passed(deadline))
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto [client_after, server_after] = timed();
    EXPECT_EQ(client_after - client_before, uint64_t(kSpaced)) << "client side";
    EXPECT_EQ(server_after - server_before, uint64_t(kSpaced)) << "server side";
}

TEST_P(Stats, CallsAfterABusySpellAreTimedBlocking) {
    calls_after_a_busy_spell_are_timed(WaitMode::block);
}

TEST_P(Stats, CallsAfterABusySpellAreTimedBusyPolling) {
    calls_after_a_busy_spell_are_timed(WaitMode::busy);
}

TEST_P(Stats, QueueingDelayOfHandlersOnAnExecutor) {
    open_timing_all();
    ThreadPool pool(1);
    server->define(
        "nap",
        [](int ms) {
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            return ms;
        },
        pool);
    auto nap = client->remote<int(int)>("nap").on(ep);
    // Four at once on one thread: the later ones wait for the earlier ones.
    std::vector<Future<int>> calls;
    for (int i = 0; i < 4; ++i)
        calls.push_back(nap(10));
    for (auto& f : calls)
        EXPECT_EQ(value_within(std::move(f)), 10);
    const auto ss = server->stats();
    const auto* s = find(ss, "nap");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->queue.count(), 4u);
    EXPECT_GE(s->queue.max(), 20'000'000u) << "the last waited for about three naps";
    EXPECT_EQ(s->server.latency.count(), 4u);
    EXPECT_GE(s->server.latency.quantile(0.5), 10'000'000u) << "handler time excludes the wait";
    EXPECT_LT(s->server.latency.quantile(0.5), 20'000'000u) << "handler time excludes the wait";
}

TEST_P(Stats, TransfersCountByDirection) {
    open_timing_all();
    server->define("fetch", [this](const Request& req, Bulk b) {
        std::vector<std::byte> buf(b.size());
        auto local = server->expose({buf.data(), buf.size()}, write_only);
        req.pull(b, 0, local, 0, b.size()).get();
        return uint64_t(buf.size());
    });
    std::vector<std::byte> data(20000, std::byte{7});
    auto h = client->expose({data.data(), data.size()}, read_only);
    EXPECT_EQ(value_within(client->remote<uint64_t(Bulk)>("fetch").on(ep)(h)), data.size());
    const auto t = server->core().transfer_stats();
    EXPECT_EQ(t[0].transfers, 1u);
    EXPECT_EQ(t[0].failed, 0u);
    EXPECT_EQ(t[0].bytes, data.size());
    EXPECT_EQ(t[0].latency.count(), 1u);
    EXPECT_GT(t[0].latency.max(), 0u);
    EXPECT_EQ(t[1].transfers, 0u);
    auto j = nlohmann::json::parse(server->stats_json());
    EXPECT_EQ(j["transfers"]["pull"]["bytes"], data.size());
    EXPECT_EQ(j["transfers"]["push"]["transfers"], 0u);
}

TEST_P(Stats, OffKeepsNothing) {
    EngineOptions off;
    off.core.stats = false;
    open(off, off);
    server->define("echo", [](int v) { return v; });
    EXPECT_EQ(value_within(client->remote<int(int)>("echo").on(ep)(3)), 3);
    EXPECT_TRUE(client->stats().empty());
    EXPECT_TRUE(server->stats().empty());
    EXPECT_EQ(client->counters().rpcs_sent, 1u) << "the engine's counters are kept";
    auto j = nlohmann::json::parse(server->stats_json());
    EXPECT_EQ(j["stats"], false);
    EXPECT_TRUE(j["procedures"].empty());
}

TEST_P(Stats, JsonParsesWithNumbersAsNumbers) {
    open_timing_all();
    server->define("echo", [](int v) { return v; });
    auto echo = client->remote<int(int)>("echo").on(ep);
    for (int i = 0; i < 10; ++i)
        EXPECT_EQ(value_within(echo(i)), i);
    auto j = nlohmann::json::parse(client->stats_json());
    EXPECT_EQ(j["address"], client->self_address());
    EXPECT_TRUE(j["counters"]["rpcs_sent"].is_number_unsigned());
    EXPECT_EQ(j["counters"]["rpcs_sent"], 10u);
    ASSERT_TRUE(j["procedures"].is_array());
    ASSERT_EQ(j["procedures"].size(), 1u) << j.dump(2);
    const auto& p = j["procedures"][0];
    EXPECT_EQ(p["name"], "echo");
    EXPECT_EQ(p["client"]["calls"], 10u);
    EXPECT_EQ(p["client"]["ok"], 10u);
    EXPECT_TRUE(p["client"]["errors"].is_object());
    const auto& lat = p["client"]["latency_ns"];
    for (const char* k : {"count", "mean", "p50", "p90", "p99", "p999", "max"})
        EXPECT_TRUE(lat[k].is_number_unsigned()) << k << " in " << lat.dump();
    EXPECT_EQ(lat["count"], 10u);
    EXPECT_LE(lat["p50"].get<uint64_t>(), lat["max"].get<uint64_t>());
    // The na layer's own counts: every core message is an unexpected one (protocol.md).
    const auto& na = j["na"];
    EXPECT_GE(na["send_unexpected"]["ok"].get<uint64_t>(), 10u) << na.dump();
    EXPECT_GE(na["recv_unexpected"]["ok"].get<uint64_t>(), 10u) << na.dump();
    EXPECT_GT(na["recv_unexpected"]["bytes"].get<uint64_t>(), 0u) << na.dump();
    EXPECT_TRUE(na["get"]["failed"].is_number_unsigned());
    EXPECT_FALSE(na.contains("user"));
    // The transport's link events: the client's link to the server came up (inproc has none).
    const auto& links = j["links"];
    for (const char* e : {"connected", "accepted", "connect_failed", "lost", "backpressure"})
        EXPECT_TRUE(links[e].is_number_unsigned()) << e << " in " << links.dump();
    if (GetParam().label != "inproc") {  // up once its handshake ended (sm: the server's ack)
        uint64_t up = links["connected"].get<uint64_t>();
        for (auto until = Clock::now() + 5s; up == 0 && Clock::now() < until;) {
            std::this_thread::sleep_for(1ms);
            up = nlohmann::json::parse(client->stats_json())["links"]["connected"].get<uint64_t>();
        }
        EXPECT_GE(up, 1u) << links.dump();
    }
    EXPECT_EQ(links["lost"], 0u);
}

/// Checks Prometheus' text format (exposition format 0.0.4) line by line: # HELP and # TYPE
/// once per family, before its samples; every sample `name{labels} value` with a family
/// declared, label values quoted, a value that parses as a number; summaries' _sum and _count.
/// Returns the families' types and the number of samples.
std::pair<std::map<std::string, std::string>, int> check_exposition(const std::string& text) {
    static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)");
    static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|summary))");
    static const std::regex sample(
        R"(([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*)\} (\S+))");
    std::map<std::string, std::string> types;
    std::set<std::string> helped;
    std::istringstream in(text);
    std::string line;
    int samples = 0;
    EXPECT_TRUE(!text.empty() && text.back() == '\n');
    while (std::getline(in, line)) {
        std::smatch m;
        if (std::regex_match(line, m, help)) {
            EXPECT_TRUE(helped.insert(m[1]).second) << "HELP twice: " << line;
        } else if (std::regex_match(line, m, type)) {
            EXPECT_TRUE(types.emplace(m[1], m[2]).second) << "TYPE twice: " << line;
            EXPECT_TRUE(helped.count(m[1])) << "TYPE before HELP: " << line;
        } else if (std::regex_match(line, m, sample)) {
            ++samples;
            std::string family = m[1];
            for (const char* suffix : {"_sum", "_count"}) {
                const std::string sfx(suffix);
                if (!types.count(family) && family.size() > sfx.size() &&
                    family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0)
                    family.resize(family.size() - sfx.size());
            }
            EXPECT_TRUE(types.count(family)) << "sample of an undeclared family: " << line;
            const std::string v = m[3];
            std::size_t used = 0;
            EXPECT_NO_THROW((void)std::stod(v, &used)) << line;
            EXPECT_EQ(used, v.size()) << line;
        } else {
            ADD_FAILURE() << "not a line of the text format: '" << line << "'";
        }
    }
    return {types, samples};
}

TEST_P(Stats, PrometheusTextParsesLineByLine) {
    open_timing_all();
    server->define("echo \"quoted\"", [](int v) { return v; });
    auto echo = client->remote<int(int)>("echo \"quoted\"").on(ep);
    for (int i = 0; i < 5; ++i)
        EXPECT_EQ(value_within(echo(i)), i);
    const std::string text = server->stats_prometheus();
    auto [types, samples] = check_exposition(text);
    EXPECT_GT(samples, 20);
    EXPECT_NE(text.find(R"(procedure="echo \"quoted\"")"), std::string::npos)
        << "the procedure's quotes are escaped in its label:\n"
        << text;
    EXPECT_EQ(types["talaria_rpc_server_latency_seconds"], "summary");
    EXPECT_EQ(types["talaria_na_link_events_total"], "counter");
    if (GetParam().label != "inproc") {  // the client's link came up at the server
        std::smatch m;
        ASSERT_TRUE(std::regex_search(
            text, m, std::regex(R"(talaria_na_link_events_total\{[^}]*event="accepted"\} (\d+))")))
            << text;
        EXPECT_GE(std::stoul(m[1]), 1u) << text;
    }

    EXPECT_NE(text.find("talaria_rpc_server_calls_total{engine=\""), std::string::npos);
    EXPECT_NE(text.find(R"(,status="ok"} 5)"), std::string::npos) << text;
}

std::vector<TransportKind> stats_kinds() {
    // What is counted is the core's, the same over every transport: the in-process one and
    // the two most used between processes.
    std::vector<TransportKind> out;
    for (auto& k : na::test::transport_kinds())
        if (k.label == "inproc" || k.label == "sm" || k.label == "tcp") out.push_back(k);
    return out;
}

INSTANTIATE_TEST_SUITE_P(api, Stats, ::testing::ValuesIn(stats_kinds()), kind_name);

}  // namespace
}  // namespace talaria::api_test

namespace talaria::api_test {
namespace {

class Trace : public Api {};

// A caller's trace id reaches the handler, and the calls a handler makes (here from an
// executor's thread) carry it on; with none set there is none.
TEST_P(Trace, IdsReachTheHandlerAndNestedCalls) {
    open();
    ThreadPool pool(1);
    server->define("inner", [](const Request& req) { return req.trace_id(); });
    server->define(
        "outer",
        [this](const Request& req) {
            const uint64_t here = current_trace_id();
            const uint64_t inner = server->remote<uint64_t()>("inner")
                                       .on(server->lookup(server->self_address()))()
                                       .get();
            return std::vector<uint64_t>{req.trace_id(), here, inner};
        },
        pool);
    const uint64_t id = 0x1234abcd5678ef01ull;
    auto outer = client->remote<std::vector<uint64_t>()>("outer").on(ep);
    EXPECT_EQ(value_within(outer.trace(id)()), (std::vector<uint64_t>{id, id, id}));
    EXPECT_EQ(value_within(outer()), (std::vector<uint64_t>{0, 0, 0}));
    EXPECT_EQ(value_within(client->remote<uint64_t()>("inner").on(ep).trace(7)()), 7u);
}

// rpc=trace: each call on both sides (procedure, peer, sequence, sizes, status, time, trace
// id), to a log sink that replaced the writer.
TEST_P(Trace, RpcTraceLogsEachCallOnBothSides) {
    open();
    server->define("echo", [](std::string s) { return s; });
    std::mutex mu;
    std::vector<std::string> lines;
    log::set_sink([&](const log::Record& r) {
        if (r.subsys != log::Subsys::rpc) return;
        std::lock_guard g(mu);
        lines.emplace_back(r.message);
    });
    log::set_level(log::Subsys::rpc, log::Level::trace);
    auto r = result_within(client->remote<std::string(std::string)>("echo").on(ep).trace(
        0xfeedfacecafebeefull)("hello"));
    auto has = [&](std::string_view a, std::string_view b) {
        for (const auto& l : lines)
            if (l.find(a) != std::string::npos && l.find(b) != std::string::npos &&
                l.find("trace feedfacecafebeef") != std::string::npos)
                return true;
        return false;
    };
    // The server logs its answer once it has been sent, so the caller can hold the result
    // before the server's line is written: wait for it (bounded).
    for (auto until = Clock::now() + 10s; Clock::now() < until;) {
        {
            std::lock_guard g(mu);
            if (has("answer echo seq", ": ok (")) break;
        }
        std::this_thread::sleep_for(1ms);
    }
    log::set_level(log::Subsys::rpc, log::Level::warn);
    log::set_sink({});
    ASSERT_TRUE(r) << r.error().describe();
    std::lock_guard g(mu);
    std::string all;
    for (const auto& l : lines)
        all += l + "\n";
    EXPECT_TRUE(has("call echo seq", "bytes")) << all;     // sent
    EXPECT_TRUE(has("serve echo seq", "from ")) << all;    // received
    EXPECT_TRUE(has("answer echo seq", ": ok (")) << all;  // answered, with the handler time
    EXPECT_TRUE(has("call echo seq", ": ok (")) << all;    // completed, with the round trip
}

INSTANTIATE_TEST_SUITE_P(api, Trace, ::testing::ValuesIn(stats_kinds()), kind_name);

}  // namespace
}  // namespace talaria::api_test

namespace talaria::api_test {
namespace {

std::string read_file(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

uint64_t echo_calls(const std::string& stats_json) {
    auto j = nlohmann::json::parse(stats_json);
    for (const auto& p : j["procedures"])
        if (p["name"] == "echo") return p["client"]["calls"].get<uint64_t>();
    return 0;
}

// Issue 12: a JSON file rewritten every period while the engine runs, and a last time when it
// closes (counting what happened after the last period); an unwritable path is refused at once.
TEST(StatsExport, FileIsWrittenEveryPeriodAndWhenTheEngineCloses) {
    char dir[] = "/tmp/talaria-stats-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    const std::string path = std::string(dir) + "/stats.json";
    Engine server("tcp://127.0.0.1:0", listen);
    server.define("echo", [](int v) { return v; });
    {
        Engine client("tcp://127.0.0.1:0");
        client.write_stats_every(std::chrono::milliseconds(30), path);
        EXPECT_EQ(echo_calls(read_file(path)), 0u) << "written at once";
        auto echo = client.remote<int(int)>("echo").on(client.lookup(server.self_address()));
        for (int i = 0; i < 3; ++i)
            EXPECT_EQ(echo(i).get(), i);
        const auto deadline = deadline_after(kWait);
        while (echo_calls(read_file(path)) != 3 && !deadline_passed(deadline))
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        EXPECT_EQ(echo_calls(read_file(path)), 3u) << "rewritten within a period";
        client.write_stats_every(std::chrono::hours(1), path);  // no more periodic writes
        for (int i = 0; i < 2; ++i)
            EXPECT_EQ(echo(i).get(), i);
        EXPECT_EQ(echo_calls(read_file(path)), 3u);
    }
    EXPECT_EQ(echo_calls(read_file(path)), 5u) << "the last word, when the engine closed";
    std::remove(path.c_str());
    ::rmdir(dir);
    auto bad = server.try_write_stats_every(std::chrono::seconds(1), "/nonexistent-dir/x.json");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.code(), Errc::io_error);
    EXPECT_NE(bad.error().message().find("/nonexistent-dir/x.json"), std::string::npos);
}

/// GET `path` from `addr` (HOST:PORT) over a plain socket: the whole answer.
std::string http_get(const std::string& addr, const std::string& path) {
    const auto colon = addr.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(uint16_t(std::stoi(addr.substr(colon + 1))));
    ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) return {};
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: test\r\nAccept: text/plain\r\n\r\n";
    (void)!::send(fd, req.data(), req.size(), 0);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0)
        out.append(buf, std::size_t(n));
    ::close(fd);
    return out;
}

// Issue 12: a Prometheus scrape of the HTTP endpoint: status line, content type, and a body in
// the text format line by line; other paths are 404.
TEST(StatsExport, PrometheusEndpointAnswersAScrape) {
    Engine server("tcp://127.0.0.1:0", listen);
    server.define("echo", [](int v) { return v; });
    const std::string at = server.serve_prometheus("127.0.0.1:0");
    ASSERT_NE(at.find("127.0.0.1:"), std::string::npos) << at;
    {
        Engine client("tcp://127.0.0.1:0");
        auto echo = client.remote<int(int)>("echo").on(client.lookup(server.self_address()));
        for (int i = 0; i < 4; ++i)
            EXPECT_EQ(echo(i).get(), i);
    }
    const std::string r = http_get(at, "/metrics");
    ASSERT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r.substr(0, 200);
    EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
    const auto body_at = r.find("\r\n\r\n");
    ASSERT_NE(body_at, std::string::npos);
    const std::string body = r.substr(body_at + 4);
    auto [types, samples] = check_exposition(body);
    EXPECT_GT(samples, 10);
    EXPECT_NE(body.find(R"(talaria_rpc_server_calls_total{engine=")"), std::string::npos);
    EXPECT_NE(body.find(R"(procedure="echo",provider="0"} 4)"), std::string::npos) << body;
    EXPECT_EQ(http_get(at, "/other").rfind("HTTP/1.1 404", 0), 0u);
    auto twice = server.try_serve_prometheus("127.0.0.1:0");
    EXPECT_FALSE(twice);
    EXPECT_EQ(twice.code(), Errc::already_exists);
}

// A scraper that connects and then says nothing (or never reads) is dropped after the
// endpoint's time for an exchange, and never holds the engine's close.
TEST(StatsExport, ASilentScraperDoesNotHoldTheEngine) {
    std::string at;
    int fd = -1;
    const auto t0 = std::chrono::steady_clock::now();
    {
        Engine server("tcp://127.0.0.1:0", listen);
        at = server.serve_prometheus("127.0.0.1:0");
        const auto colon = at.rfind(':');
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(uint16_t(std::stoi(at.substr(colon + 1))));
        ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // accepted, waiting on us
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, std::chrono::seconds(2)) << "the close waited on a silent scraper";
    ::close(fd);
}

}  // namespace
}  // namespace talaria::api_test
