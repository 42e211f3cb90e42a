// talaria-perf's driver: calibration and repetition against a runner whose "time" is scripted,
// so the checks are exact and take no real time. Discovered as perf.<name>.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "driver.hpp"

namespace talaria::perf {
namespace {

using namespace std::chrono_literals;

/// Every run of n operations takes n x `per_op`, except those `stall` picks (by run index,
/// counting from 0), which take `stall_time` more.
class ScriptedRunner final : public Runner {
  public:
    ScriptedRunner(Duration per_op, std::function<bool(int)> stall, Duration stall_time)
        : per_op_(per_op), stall_(std::move(stall)), stall_time_(stall_time) {}
    [[nodiscard]] std::string describe(const Spec&) const override { return "scripted"; }
    Result<void> prepare(const Spec&) override { return ok(); }
    Result<Duration> run(const Spec&, uint64_t iters) override {
        int i = runs_++;
        counts.push_back(iters);
        return per_op_ * int64_t(iters) + (stall_(i) ? stall_time_ : Duration::zero());
    }
    Result<void> finish(const Spec&) override { return ok(); }
    std::vector<uint64_t> counts;

  private:
    Duration per_op_;
    std::function<bool(int)> stall_;
    Duration stall_time_;
    int runs_ = 0;
};

RepeatOptions options() {
    RepeatOptions o;
    o.reps = 5;
    o.rep_time = 40ms;
    return o;
}

TEST(perf, CalibrationReachesTheTargetTime) {
    ScriptedRunner r(1us, [](int) { return false; }, {});
    Spec s;
    auto st = measure(r, s, options());
    ASSERT_TRUE(st) << st.error().describe();
    EXPECT_NEAR(double(st->iters), 40000.0, 400.0);
    EXPECT_NEAR(st->median, 1.0, 0.01);  // µs per round trip
}

TEST(perf, OneStalledCalibrationRunDoesNotSetTheCount) {
    // Run 0 is the discarded first call; run 1 (one call) stalls for 10 ms: taken alone it
    // would make 4 calls per repetition.
    ScriptedRunner r(
        1us, [](int i) { return i == 1; }, 10ms);
    Spec s;
    auto st = measure(r, s, options());
    ASSERT_TRUE(st) << st.error().describe();
    EXPECT_GT(st->iters, 20000u) << "a stall during calibration made the count tiny";
    EXPECT_NEAR(st->median, 1.0, 0.01);
    // A stall on the run that would have closed the calibration is caught the same way.
    for (int at = 2; at < 8; ++at) {
        ScriptedRunner late(
            1us, [at](int i) { return i == at; }, 10ms);
        auto lt = measure(late, s, options());
        ASSERT_TRUE(lt);
        EXPECT_GT(lt->iters, 20000u) << "stall at run " << at;
    }
}

TEST(perf, StallsOnEveryEarlyRunDoNotSetTheCount) {
    // The first runs (the discarded call, then n = 1 and its repeat) each stall 8 ms, as a
    // server still setting up made them: both closing runs agree, but twice the calls take
    // no longer, so the count keeps growing past the stall.
    ScriptedRunner r(
        1us, [](int i) { return i < 4; }, 8ms);
    Spec s;
    auto st = measure(r, s, options());
    ASSERT_TRUE(st) << st.error().describe();
    EXPECT_GT(st->iters, 20000u) << "stalls on the closing runs made the count tiny";
    EXPECT_NEAR(st->median, 1.0, 0.01);
}

TEST(perf, SlowOperationsStillCalibrateToFewCalls) {
    // Every call takes 10 ms: the target is 4 of them, not a count grown forever.
    ScriptedRunner r(10ms, [](int) { return false; }, {});
    Spec s;
    auto st = measure(r, s, options());
    ASSERT_TRUE(st) << st.error().describe();
    EXPECT_EQ(st->iters, 4u);
    EXPECT_LE(r.counts.size(), 10u) << "calibration ran too many times";
}

// Issue 12: the records' formats. CSV has a header of every key, quotes what needs it, and
// carries the run's info; --no-goals drops the goal column from the table only.
std::vector<Record> two_records() {
    Record a;
    a.spec.layer = "rpc";
    a.spec.transport = "sm";
    a.value = Stats{10.0, 9.0, 12.0, 1000, 5};
    a.baseline = Stats{5.0, 4.0, 6.0, 1000, 5};
    a.baseline_name = "raw, \"bare\" ring";
    Record b;
    b.spec.layer = "api";
    b.spec.transport = "tcp";
    b.spec.consume = Consume::get;
    b.error = "server for tcp: refused";
    return {a, b};
}

TEST(perf, CsvHasEveryKeyQuotedFieldsAndTheRunsInfo) {
    RunInfo run{"0.1.0", "abc123", "host1", "2026-11-28T07:00:00Z", "talaria-perf rpc -t sm"};
    const std::string csv = format_csv(two_records(), run);
    std::vector<std::string> lines;
    std::size_t at = 0;
    while (at < csv.size()) {
        auto nl = csv.find('\n', at);
        lines.push_back(csv.substr(at, nl - at));
        at = nl + 1;
    }
    ASSERT_EQ(lines.size(), 3u) << csv;
    for (const char* col : {"layer", "transport", "median", "ratio", "contexts", "consume", "error",
                            "talaria_version", "commit", "host", "date", "command"})
        EXPECT_NE(lines[0].find(col), std::string::npos) << col << " in " << lines[0];
    EXPECT_NE(lines[1].find("\"raw, \"\"bare\"\" ring\""), std::string::npos) << lines[1];
    EXPECT_NE(lines[1].find("abc123"), std::string::npos);
    EXPECT_NE(lines[2].find("server for tcp: refused"), std::string::npos);
    // Every line has as many fields as the header (the quoted comma does not count).
    auto fields = [](const std::string& l) {
        std::size_t n = 1;
        bool quoted = false;
        for (char c : l) {
            if (c == '"') quoted = !quoted;
            if (c == ',' && !quoted) ++n;
        }
        return n;
    };
    EXPECT_EQ(fields(lines[1]), fields(lines[0]));
    EXPECT_EQ(fields(lines[2]), fields(lines[0]));
    const std::string json = format_json(two_records(), run);
    EXPECT_NE(json.find("\"commit\": \"abc123\""), std::string::npos) << json;
    EXPECT_NE(json.find("\"host\": \"host1\""), std::string::npos) << json;
}

TEST(perf, NoGoalsDropsTheGoalColumn) {
    EXPECT_NE(format_table(two_records()).find(" goal "), std::string::npos);
    EXPECT_EQ(format_table(two_records(), false).find(" goal "), std::string::npos);
}

}  // namespace
}  // namespace talaria::perf
