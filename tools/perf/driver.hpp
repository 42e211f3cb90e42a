// talaria-perf: the driver's shared vocabulary. A Spec names one measurement (layer, transport,
// pattern, mode, size, inflight); a Runner executes repetitions of specs on the client side. The
// driver measures every spec twice: with the layer's back end and with the raw baseline of the
// same transport, in the same run, against the same server process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria::perf {

/// na: pingpong, blast, put, get; rpc: pingpong, rate (calls in flight), first (first call to a
/// new peer); bulk: pull, push.
enum class Pattern : uint8_t { pingpong, blast, put, get, rate, first, pull, push };
enum class Mode : uint8_t { busy, block };
/// api layer: how a caller consumes results (none: the other layers).
enum class Consume : uint8_t { none, get, then, coawait };

std::string_view pattern_name(Pattern p) noexcept;
std::string_view mode_name(Mode m) noexcept;
Result<Pattern> parse_pattern(std::string_view s);
Result<Mode> parse_mode(std::string_view s);
std::string_view consume_name(Consume c) noexcept;
Result<Consume> parse_consume(std::string_view s);
/// "8", "4K", "4KiB", "1M", "16MiB", "1G" -> bytes.
Result<std::size_t> parse_size(std::string_view s);
/// 8 -> "8", 4096 -> "4Ki", 16777216 -> "16Mi".
std::string size_label(std::size_t bytes);

/// One measurement.
struct Spec {
    std::string layer;      ///< "na", "rpc", "bulk"
    std::string transport;  ///< "sm", "tcp", "ofi+tcp", "ucx+sm", ... (transports.hpp)
    Pattern pattern = Pattern::pingpong;
    Mode mode = Mode::busy;
    std::size_t size = 8;   ///< message, argument (rpc) or transfer size in bytes
    unsigned inflight = 1;  ///< per client thread (api: per context)
    // api layer only:
    unsigned contexts = 1;  ///< server contexts = client threads, each on its own context pair
    unsigned procs = 1;     ///< client processes (each with `contexts` threads)
    Consume consume = Consume::none;
};

/// What a measurement reports: latency per round trip, message rate, or bandwidth.
enum class Unit : uint8_t { us, ops_per_s, gb_per_s };
std::string_view unit_name(Unit u) noexcept;
Unit unit_of(Pattern p) noexcept;
/// Convert `iters` operations of a spec taking `elapsed` into the spec's unit.
double to_unit(const Spec& s, uint64_t iters, Duration elapsed) noexcept;

/// Executes one side of measurements. Both the layer back ends and the raw baselines are
/// Runners, so the driver calibrates and repeats them the same way.
class Runner {
  public:
    virtual ~Runner() = default;
    /// Human-readable name of what is measured for `s` ("na", "raw shm spin ping-pong", ...).
    [[nodiscard]] virtual std::string describe(const Spec& s) const = 0;
    /// Set-up outside the timed region (register memory, map shared memory...).
    virtual Result<void> prepare(const Spec& s) = 0;
    /// Why this runner cannot measure `s` at all (e.g. the library has no such raw test),
    /// or empty. The driver then measures the layer alone and reports "no baseline".
    [[nodiscard]] virtual std::string unavailable(const Spec&) const { return {}; }
    /// Whether a failure of this runner may leave the control connection unusable (the sm and
    /// tcp baselines and the layers use it; the external baselines do not).
    [[nodiscard]] virtual bool uses_control() const { return true; }
    /// Run `iters` operations of `s`; returns the time they took.
    virtual Result<Duration> run(const Spec& s, uint64_t iters) = 0;
    /// Undo prepare().
    virtual Result<void> finish(const Spec& s) = 0;
    /// Around each repetition when interleaved with a baseline that shares the server: step
    /// aside (e.g. end the server's layer phase) and come back. Prepared state is kept.
    virtual Result<void> suspend(const Spec&) { return ok(); }
    virtual Result<void> resume(const Spec&) { return ok(); }
};

struct Stats {
    double median = 0;
    double min = 0;
    double max = 0;
    uint64_t iters = 0;  ///< per repetition
    unsigned reps = 0;
};

/// How many repetitions, and how long each should take.
struct RepeatOptions {
    unsigned reps = 11;
    Duration rep_time = std::chrono::milliseconds(40);
    uint64_t fixed_iters = 0;  ///< 0: calibrate to rep_time
    uint64_t max_iters = 2'000'000;
};

/// Calibrate (unless fixed), warm up, then run `opt.reps` repetitions of `s` on `r`.
Result<Stats> measure(Runner& r, const Spec& s, const RepeatOptions& opt);

/// Measure `s` on the baseline and on the layer with their repetitions interleaved
/// (baseline, layer, baseline, layer...), so that both see the same machine: on a shared
/// host the ratio is then far steadier than either number.
struct PairResult {
    Result<Stats> baseline = Error(Errc::internal, "not measured");
    Result<Stats> value = Error(Errc::internal, "not measured");
};
PairResult measure_pair(Runner& baseline, Runner& layer, const Spec& s, const RepeatOptions& opt);

/// One line of the report.
struct Record {
    Spec spec;
    std::string baseline_name;
    std::optional<Stats> value;
    std::optional<Stats> baseline;
    std::string error;         ///< non-empty when the measurement or its baseline failed
    bool skipped = false;      ///< the layer cannot run this spec (e.g. message size over its max)
    bool no_baseline = false;  ///< the baseline has no test for this spec (baseline_name: why)
    bool thread_safe = true;
    double load_avg = -1;  ///< 1-minute load average when the measurement started

    [[nodiscard]] double ratio() const noexcept;
    /// Best against best (min/min for latency, max/max for rates): on a busy host the least
    /// disturbed repetitions, a steadier view than the medians.
    [[nodiscard]] double best_ratio() const noexcept;
    /// The goal for this spec, if it has one: on the ratio ("<=1.5x", ">=0.85x"), or
    /// on the median itself ("<1000us").
    struct Goal {
        bool at_most = true;
        double bound = 0;
        bool absolute = false;  ///< bound applies to the median (in the spec's unit)
        bool plus = false;      ///< bound is a difference in the spec's unit (value - baseline)
    };
    [[nodiscard]] std::optional<Goal> goal() const noexcept;
    [[nodiscard]] std::optional<bool> goal_met() const noexcept;
};

/// The 1-minute load average (/proc/loadavg), or -1.
double load_average() noexcept;

/// What every record of a run carries in --json and --csv: which Talaria, which commit of it,
/// where, when, and the command line.
struct RunInfo {
    std::string version;
    std::string commit;  ///< git describe of the source tree at build time ("-dirty": edited)
    std::string host;
    std::string date;  ///< UTC, ISO 8601
    std::string command;
};

/// The readable table; without the project's goal column when `goals` is false (--no-goals).
std::string format_table(const std::vector<Record>& records, bool goals = true);
/// The --json array: each record with the run's info.
std::string format_json(const std::vector<Record>& records, const RunInfo& run = {});
/// The --csv text: a header line, then a line per record (the --json fields, flat; a field
/// with a comma, quote or line break quoted as RFC 4180 says).
std::string format_csv(const std::vector<Record>& records, const RunInfo& run = {});

}  // namespace talaria::perf
