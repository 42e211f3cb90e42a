// talaria-perf: raw baselines of the libfabric and UCX transports: the libraries' own test
// programs, run as a server/client pair of child processes on 127.0.0.1 for every repetition
// (interleaved with the layer's repetitions like the other baselines; process start-up and
// connection set-up are outside what the programs time).
//   ofi+<provider>: pingpong -> fi_pingpong -p <provider> -e rdm (round trip = 2 x usec/xfer)
//                   put/get  -> talaria-perf raw-ofi-rma (fi_write / fi_read, registered buffers)
//                   blast    -> none (fi_pingpong has no one-way test; no fabtests package)
//   ucx+<tls>:      pingpong -> ucx_perftest -t tag_lat (round trip = 2 x overall_lat)
//                   blast    -> ucx_perftest -t tag_bw -O <inflight>
//                   put/get  -> ucx_perftest -t ucp_put_bw / ucp_get -O <inflight>
// with UCX_TLS (and the shared-memory error-handling switches) set in the children's
// environment the way the ucx transport sets them in its own UCX configuration.
#include <unistd.h>

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "baseline.hpp"
#include "control.hpp"
#include "ext_parse.hpp"
#include "external.hpp"
#include "talaria/config.hpp"
#include "talaria/util/log.hpp"
#include "transports.hpp"

namespace talaria::perf {

namespace {

/// One external run may take this long before both children are killed.
constexpr Duration kExternalTimeout = std::chrono::seconds(30);
/// fi_pingpong and ucx_perftest take their iteration count as an int.
constexpr uint64_t kMaxExternalIters = INT_MAX;

/// Common part: a client/server pair per run, on the CPUs of the talaria-perf client and
/// server, on this host only.
class ExternalBaseline : public Runner {
  public:
    ExternalBaseline(std::string transport, int ctl_fd, const BaselineOptions& opt)
        : transport_(std::move(transport)), ctl_fd_(ctl_fd), opt_(opt) {}

    [[nodiscard]] std::string unavailable(const Spec& s) const override {
        if (!opt_.local)
            return "the libraries' own benchmarks run on this host: no baseline against a "
                   "--connect server";
        return why_not(s);
    }
    Result<void> prepare(const Spec& s) override {
        if (auto why = unavailable(s); !why.empty()) return Error(Errc::not_supported, why);
        return ok();
    }
    Result<void> finish(const Spec&) override { return ok(); }
    /// Our own child processes: a failure leaves the control connection intact, unless the
    /// control exchange before the run failed.
    [[nodiscard]] bool uses_control() const override { return ctl_failed_; }

  protected:
    /// Why the library has no baseline for this spec ("" = it has one).
    [[nodiscard]] virtual std::string why_not(const Spec& s) const = 0;

    /// Run the pair with the port filled in (placeholder argument "{port}").
    Result<std::string> run_children(ChildSpec server, ChildSpec client) {
        // The talaria-perf server keeps polling after the layer's phase ended until its next
        // control request (its last response may still be leaving): send it one, so that it
        // blocks in its control loop and leaves the server CPU to the programs measured.
        if (ctl_fd_ >= 0) {
            CtlRequest hello;
            hello.cmd = uint32_t(Cmd::hello);
            auto r = ctl_call(ctl_fd_, hello);
            if (!r) {
                ctl_failed_ = true;
                return std::move(r).error();
            }
        }
        TALARIA_TRY(port, free_tcp_port());
        auto fill = [&](ChildSpec& c) {
            for (auto& a : c.argv)
                if (a == "{port}") a = std::to_string(port);
        };
        fill(server);
        fill(client);
        server.cpu = opt_.server_cpu;
        client.cpu = opt_.client_cpu;
        return run_pair(server, client, port, kExternalTimeout);
    }

    std::string transport_;
    int ctl_fd_ = -1;
    bool ctl_failed_ = false;
    BaselineOptions opt_;
};

// ---------------------------------------------------------------------------------------------
// libfabric

/// The provider string the ofi transport opens for a sub-scheme (src/na/ofi: "tcp" is the
/// tcp provider under the ofi_rxm utility provider; verbs likewise; others as named).
std::string ofi_provider(std::string_view sub) {
    if (sub == "tcp" || sub == "verbs") return fmt::format("{};ofi_rxm", sub);
    return std::string(sub);
}

#if TALARIA_HAVE_OFI
std::string self_exe() {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return "/proc/self/exe";
    return std::string(buf, static_cast<std::size_t>(n));
}
#endif

class OfiBaseline final : public ExternalBaseline {
  public:
    using ExternalBaseline::ExternalBaseline;

    [[nodiscard]] std::string describe(const Spec& s) const override {
        std::string prov = ofi_provider(sub_scheme(transport_));
        switch (s.pattern) {
            case Pattern::put:
            case Pattern::get:
                return fmt::format("raw libfabric {} ({}, {} in flight)",
                                   s.pattern == Pattern::put ? "fi_write" : "fi_read", prov,
                                   s.inflight);
            case Pattern::blast:
                return "no baseline";
            default:
                return fmt::format("fi_pingpong -p {} -e rdm{}", prov,
                                   s.mode == Mode::block ? " (busy: it has no blocking mode)" : "");
        }
    }

    Result<void> prepare(const Spec& s) override {
        TALARIA_CHECK(ExternalBaseline::prepare(s));
        if (s.pattern != Pattern::pingpong) return ok();
        // fi_pingpong has no warm-up: its timed loop includes the first message, which sets
        // up the connection (about 20 ms over tcp;ofi_rxm here). Measure that first round trip
        // alone (-I 1, the least of kSetupRuns) and take it out of every run (see run()).
        std::vector<double> firsts;
        for (int i = 0; i < kSetupRuns; ++i) {
            TALARIA_TRY(t, pingpong_total_us(s, 1));
            firsts.push_back(t);
        }
        // The least disturbed: the set-up is a fixed cost plus whatever the host adds.
        first_us_ = *std::min_element(firsts.begin(), firsts.end());
        rtt_hint_us_ = 0;
        per_iter_us_ = 0;
        TALARIA_LOG(perf, info,
                    "fi_pingpong -p {} {} B: first round trip (connection set-up included) "
                    "{:.0f} us (least of {})",
                    ofi_provider(sub_scheme(transport_)), s.size, first_us_, kSetupRuns);
        return ok();
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        iters = std::clamp<uint64_t>(iters, 1, kMaxExternalIters);
        if (s.pattern == Pattern::pingpong) {
            // total(N) = first + (N - 1) x round trip. The timed loop is made at least
            // kSetupFactor times longer than the first round trip (and N >= kMinPingIters), so
            // that the spread of the set-up estimate stays small against what is measured.
            // Never longer than kMaxPingTotalUs by the last run's own pace (its whole loop over
            // its count, set-up included: never less than a round trip), however small a
            // noisy round-trip estimate makes the set-up factor's count.
            const uint64_t cap =
                per_iter_us_ > 0
                    ? std::max<uint64_t>(kMinPingIters,
                                         static_cast<uint64_t>(kMaxPingTotalUs / per_iter_us_))
                    : kMaxExternalIters;
            uint64_t n = std::max(iters, kMinPingIters);
            if (rtt_hint_us_ > 0)
                n = std::max<uint64_t>(
                    n, static_cast<uint64_t>(kSetupFactor * first_us_ / rtt_hint_us_) + 1);
            n = std::min({n, cap, kMaxExternalIters});
            TALARIA_TRY(total, pingpong_total_us(s, n));
            // A loaded host can make this run's set-up much cheaper than the one measured
            // alone; a longer run shrinks the set-up's share, so try twice more, 4x longer each
            // (within the same cap, by this run's pace).
            for (int retry = 0; total <= first_us_ && retry < 2; ++retry) {
                uint64_t longer_n = std::min(
                    {n * 4, kMaxExternalIters,
                     std::max<uint64_t>(n, static_cast<uint64_t>(kMaxPingTotalUs * double(n) /
                                                                 std::max(total, 1.0)))});
                if (longer_n <= n) break;
                n = longer_n;
                TALARIA_TRY(longer, pingpong_total_us(s, n));
                total = longer;
            }
            per_iter_us_ = total / double(n);
            double rtt = (total - first_us_) / double(n - 1);
            if (!(rtt > 0))
                return Error(Errc::internal,
                             fmt::format("fi_pingpong: {} round trips took {:.1f} us, less than "
                                         "its first one alone ({:.1f} us): too noisy to use",
                                         n, total, first_us_));
            rtt_hint_us_ = rtt;
            return std::chrono::duration_cast<Duration>(
                std::chrono::duration<double, std::micro>(rtt * double(iters)));
        }
#if TALARIA_HAVE_OFI
        // put/get: our raw libfabric RMA program (raw_ofi_rma.cpp), the hidden subcommand.
        std::string prov = ofi_provider(sub_scheme(transport_));
        std::string exe = self_exe();
        std::vector<std::string> common{
            "--provider", prov,
            "--size",     std::to_string(s.size),
            "--port",     "{port}",
            "--op",       s.pattern == Pattern::put ? "write" : "read",
            "--inflight", std::to_string(std::max(1u, s.inflight)),
            "--iters",    std::to_string(iters),
            "--warmup",   std::to_string(std::clamp<uint64_t>(iters, 2, 4))};
        if (is_ip_transport(transport_)) {
            common.push_back("--node");
            common.push_back("127.0.0.1");
        }
        ChildSpec server{{exe, "raw-ofi-rma", "server"}, {}, -1, "talaria (this build)"};
        server.argv.insert(server.argv.end(), common.begin(), common.end());
        ChildSpec client{{exe, "raw-ofi-rma", "client"}, {}, -1, "talaria (this build)"};
        client.argv.insert(client.argv.end(), common.begin(), common.end());
        TALARIA_TRY(out, run_children(server, client));
        TALARIA_TRY(r, parse_raw_ofi_rma(out));
        if (r.iters != iters || r.size != s.size)
            return Error(Errc::protocol_error,
                         fmt::format("raw-ofi-rma ran {} x {} B, asked {} x {} B", r.iters, r.size,
                                     iters, s.size));
        return Duration(static_cast<Duration::rep>(r.ns));
#else
        return Error(Errc::not_supported,
                     "talaria-perf was built without libfabric: no raw RMA baseline");
#endif
    }

  protected:
    [[nodiscard]] std::string why_not(const Spec& s) const override {
        if (s.pattern == Pattern::blast)
            return "no libfabric baseline for one-way messages: fi_pingpong only ping-pongs and "
                   "there is no fabtests package (fi_msg_bw) here";
        return {};
    }

  private:
    static constexpr int kSetupRuns = 3;
    static constexpr uint64_t kMinPingIters = 1000;
    static constexpr double kSetupFactor = 20;
    double first_us_ = 0;     ///< fi_pingpong's first round trip (with connection set-up)
    double rtt_hint_us_ = 0;  ///< the last round trip measured (sizes the next run)
    /// The last run's whole loop over its count (set-up included): caps the next run's length.
    double per_iter_us_ = 0;
    /// The longest a timed fi_pingpong loop may take by the last run's pace (the smoke test
    /// gives the whole tool 60 s; a loaded host once made a noisy estimate ask 2.3 million).
    static constexpr double kMaxPingTotalUs = 2e6;

    /// fi_pingpong's whole timed loop of `n` round trips, in microseconds.
    Result<double> pingpong_total_us(const Spec& s, uint64_t n) {
        std::string prov = ofi_provider(sub_scheme(transport_));
        std::vector<std::string> common{
            "fi_pingpong",    "-p", prov, "-e", "rdm", "-S", std::to_string(s.size), "-I",
            std::to_string(n)};
        ChildSpec server{common, {}, -1, "libfabric-bin"};
        server.argv.insert(server.argv.end(), {"-B", "{port}"});
        ChildSpec client{common, {}, -1, "libfabric-bin"};
        client.argv.insert(client.argv.end(), {"-P", "{port}", "127.0.0.1"});
        TALARIA_TRY(out, run_children(server, client));
        TALARIA_TRY(rtt_us, parse_fi_pingpong_round_trip(out));
        return rtt_us * double(n);
    }
};

// ---------------------------------------------------------------------------------------------
// UCX

/// The UCX settings the ucx transport puts in its own UCP configuration for a sub-scheme
/// (src/na/ucx/ucx_setup.cpp: parse_spec, init_context), given to ucx_perftest through the
/// children's environment: UCX_TLS ("sm" -> "sm,self", else the sub-scheme as given), the
/// keepalive interval, and where shared memory may be used the posix/sysv error-handling
/// switches (the transport sets MM_ERROR_HANDLING, which is both): without them UCX 1.13
/// refuses posix/sysv for endpoints created with peer error handling (openucx/ucx#8477).
std::vector<std::pair<std::string, std::string>> ucx_env(std::string_view sub) {
    std::vector<std::pair<std::string, std::string>> env;
    std::string tls = sub == "sm" ? "sm,self" : std::string(sub);
    env.emplace_back("UCX_TLS", tls);
    if (tls.find("sm") != std::string::npos || tls.find("posix") != std::string::npos ||
        tls.find("sysv") != std::string::npos || tls.find("all") != std::string::npos) {
        env.emplace_back("UCX_POSIX_ERROR_HANDLING", "y");
        env.emplace_back("UCX_SYSV_ERROR_HANDLING", "y");
    }
    env.emplace_back("UCX_KEEPALIVE_INTERVAL", "1s");
    return env;
}

class UcxBaseline final : public ExternalBaseline {
  public:
    using ExternalBaseline::ExternalBaseline;

    [[nodiscard]] std::string describe(const Spec& s) const override {
        std::string mode;
        if (s.mode == Mode::block)
            mode = rma(s) ? " (poll: its sleep mode does not run RMA tests)" : " -E sleep";
        return fmt::format("ucx_perftest -t {}{} UCX_TLS={}", test(s), mode,
                           ucx_env(sub())[0].second);
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        iters = std::clamp<uint64_t>(iters, 1, kMaxExternalIters);
        bool latency = s.pattern == Pattern::pingpong;
        // Its own warm-up (each run is a fresh process): like our calibration runs.
        // One warm-up iteration does not finish UCX's wire-up (the first round trips take
        // about a millisecond): a thousand for latency, a few for bandwidth.
        uint64_t warmup = latency ? 1000 : std::clamp<uint64_t>(iters, 2, 4);
        std::vector<std::string> args{"-t", test(s), "-s", std::to_string(s.size), "-n",
                                      std::to_string(iters), "-w", std::to_string(warmup), "-p",
                                      "{port}", "-E",
                                      s.mode == Mode::block && !rma(s) ? "sleep" : "poll",
                                      // Peer error handling, as the ucx transport's endpoints.
                                      "-e", "-v"};
        if (!latency) {
            args.push_back("-O");
            args.push_back(std::to_string(std::max(1u, s.inflight)));
        }
        // The transport's worker: UCS_THREAD_MODE_SERIALIZED when thread_safe, else SINGLE.
        args.push_back("-M");
        args.push_back(opt_.thread_safe ? "serialized" : "single");
        ChildSpec server{{"ucx_perftest"}, ucx_env(sub()), -1, "ucx-utils"};
        server.argv.insert(server.argv.end(), args.begin(), args.end());
        ChildSpec client{{"ucx_perftest", "127.0.0.1"}, ucx_env(sub()), -1, "ucx-utils"};
        client.argv.insert(client.argv.end(), args.begin(), args.end());
        TALARIA_TRY(out, run_children(server, client));
        TALARIA_TRY(r, parse_ucx_perftest(out));
        // tag_lat: overall_lat is half the round trip; the others: time per operation.
        double per_op_us = r.overall_lat_us * (latency ? 2 : 1);
        return std::chrono::duration_cast<Duration>(
            std::chrono::duration<double, std::micro>(per_op_us * double(iters)));
    }

  protected:
    [[nodiscard]] std::string why_not(const Spec&) const override { return {}; }

  private:
    [[nodiscard]] std::string_view sub() const { return sub_scheme(transport_); }
    static bool rma(const Spec& s) {
        return s.pattern == Pattern::put || s.pattern == Pattern::get;
    }
    static std::string test(const Spec& s) {
        switch (s.pattern) {
            case Pattern::blast:
                return "tag_bw";
            case Pattern::put:
                return "ucp_put_bw";
            case Pattern::get:
                return "ucp_get";
            default:
                return "tag_lat";
        }
    }
};

}  // namespace

std::unique_ptr<Runner> make_raw_ofi(std::string transport, int ctl_fd,
                                     const BaselineOptions& opt) {
    return std::make_unique<OfiBaseline>(std::move(transport), ctl_fd, opt);
}

std::unique_ptr<Runner> make_raw_ucx(std::string transport, int ctl_fd,
                                     const BaselineOptions& opt) {
    return std::make_unique<UcxBaseline>(std::move(transport), ctl_fd, opt);
}

}  // namespace talaria::perf
