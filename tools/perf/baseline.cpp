// talaria-perf: choosing the raw baseline of a transport, and mapping the rpc and bulk layers'
// patterns onto the raw patterns they are compared with.
#include <algorithm>

#include <fmt/format.h>

#include "baseline.hpp"
#include "transports.hpp"

namespace talaria::perf {

std::unique_ptr<Runner> make_raw_sm(int ctl_fd, const BaselineOptions& opt);
std::unique_ptr<Runner> make_raw_tcp(int ctl_fd);
std::unique_ptr<Runner> make_raw_ofi(std::string transport, int ctl_fd, const BaselineOptions& opt);
std::unique_ptr<Runner> make_raw_ucx(std::string transport, int ctl_fd, const BaselineOptions& opt);

Spec baseline_spec(const Spec& s) {
    Spec b = s;
    switch (s.pattern) {
        case Pattern::rate:
        case Pattern::first:
            // A round trip of the raw ping-pong, one at a time: rate compares with 1 / round
            // trip; the first call with a round trip on an established connection.
            b.pattern = Pattern::pingpong;
            b.inflight = 1;
            break;
        case Pattern::pull:
            b.pattern = Pattern::get;
            break;
        case Pattern::push:
            b.pattern = Pattern::put;
            break;
        default:
            break;
    }
    // The rpc layer's raw ping-pong moves at least kMinPingBytes (empty RPC arguments still
    // carry the core's header; the na mode's default message is 8 bytes).
    if (b.pattern == Pattern::pingpong && s.layer == "rpc")
        b.size = std::max(b.size, kMinPingBytes);
    return b;
}

namespace {

/// A raw baseline driven with the mapped spec. The driver converts its iterations with the
/// layer's spec: a rate spec yields round trips per second, a pull spec bytes per second.
class MappedBaseline final : public Runner {
  public:
    explicit MappedBaseline(std::unique_ptr<Runner> raw) : raw_(std::move(raw)) {}
    [[nodiscard]] std::string describe(const Spec& s) const override {
        Spec b = baseline_spec(s);
        std::string d = raw_->describe(b);
        if (b.pattern == Pattern::pingpong && b.size != s.size) d += fmt::format(" {} B", b.size);
        if (s.pattern == Pattern::rate) d = "1 / " + d;
        return d;
    }
    [[nodiscard]] std::string unavailable(const Spec& s) const override {
        return raw_->unavailable(baseline_spec(s));
    }
    [[nodiscard]] bool uses_control() const override { return raw_->uses_control(); }
    Result<void> prepare(const Spec& s) override { return raw_->prepare(baseline_spec(s)); }
    Result<Duration> run(const Spec& s, uint64_t iters) override {
        return raw_->run(baseline_spec(s), iters);
    }
    Result<void> finish(const Spec& s) override { return raw_->finish(baseline_spec(s)); }
    Result<void> suspend(const Spec& s) override { return raw_->suspend(baseline_spec(s)); }
    Result<void> resume(const Spec& s) override { return raw_->resume(baseline_spec(s)); }

  private:
    std::unique_ptr<Runner> raw_;
};

}  // namespace

Result<std::unique_ptr<Runner>> make_baseline(std::string_view transport, int ctl_fd,
                                              const BaselineOptions& opt) {
    std::unique_ptr<Runner> raw;
    TALARIA_TRY(family, transport_family(transport));
    switch (family) {
        case Family::sm:
            raw = make_raw_sm(ctl_fd, opt);
            break;
        case Family::tcp:
            raw = make_raw_tcp(ctl_fd);
            break;
        case Family::ofi:
            raw = make_raw_ofi(std::string(transport), ctl_fd, opt);
            break;
        case Family::ucx:
            raw = make_raw_ucx(std::string(transport), ctl_fd, opt);
            break;
    }
    return std::unique_ptr<Runner>(std::make_unique<MappedBaseline>(std::move(raw)));
}

}  // namespace talaria::perf
