// talaria-perf: the client side shared by the rpc and bulk back ends: one core::Engine talking
// to the talaria-perf server's engine, phases opened over the control connection, and control
// calls ("perf.ctl") carried by the RPC layer itself.
//
// Wire (internal to talaria-perf; client and server are the same binary):
//   perf.empty : empty result; the measured call (its arguments are ignored)
//   perf.ctl   : [u8 op][body]; op set_mode: [u8 Mode] (starts a measurement, releases any
//                exposed buffer); end: leave the phase; bulk_setup: [u64 size] -> the encoding
//                of a read-write bulk handle over `size` bytes; bulk_release;
//                api_start: [u8 Mode][u8 contexts][u8 stats: 0 or 1] -> the address of the server's
//                api engine (a talaria::Engine with background progress and at least `contexts`
//                contexts, serving perf.echo), its threads set to Mode; the core engine's own
//                loop blocks meanwhile. set_mode puts the api engine back to block.
//   perf.echo  : uint64_t(uint64_t), defined with talaria::Engine::define (the api layer).
//   Errors come back as the core's error responses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend.hpp"
#include "control.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/core/core.hpp"

namespace talaria::perf {

inline constexpr std::string_view kRpcEmpty = "perf.empty";
inline constexpr std::string_view kRpcCtl = "perf.ctl";
inline constexpr std::string_view kRpcEcho = "perf.echo";

enum class RpcCtlOp : uint8_t { set_mode = 1, end, bulk_setup, bulk_release, api_start };

/// The default address a perf engine opens for `transport` (transports.hpp default_url).
std::string default_engine_url(std::string_view transport);

/// Open a perf engine: `listen` for the server; thread_safe from the options.
Result<std::unique_ptr<core::Engine>> open_perf_engine(std::string_view transport,
                                                       std::string_view url, bool listen,
                                                       const LayerOptions& opt);

/// One client engine and its server, the phase bookkeeping and the wait loops. Owned by one
/// back end Runner; used from the driver's thread only.
class RpcSession {
  public:
    static Result<std::unique_ptr<RpcSession>> create(std::string_view layer,
                                                      std::string_view transport,
                                                      std::string_view server_address, int ctl_fd,
                                                      const LayerOptions& opt);
    ~RpcSession();

    [[nodiscard]] core::Engine& engine() const noexcept { return *engine_; }
    [[nodiscard]] core::Context& context() const noexcept { return engine_->context(0); }
    [[nodiscard]] const na::Addr& server() const noexcept { return server_; }
    [[nodiscard]] const std::string& server_address() const noexcept { return address_; }
    [[nodiscard]] const LayerOptions& options() const noexcept { return opt_; }
    [[nodiscard]] std::string_view transport() const noexcept { return transport_; }

    Mode mode = Mode::busy;  ///< how wait() drives progress

    /// Ask the server over the control connection to serve this layer until `end`.
    Result<void> enter_phase();
    /// Enter the phase (if not in it) and tell the server the mode of the next measurement.
    Result<void> start(Mode m);
    /// Enter the phase and start an api measurement: the server's api engine (opened with at
    /// least `contexts` contexts) polls in mode `m`; returns its address.
    Result<std::string> start_api(Mode m, unsigned contexts, bool stats);
    /// Leave the phase (the server goes back to its control loop).
    Result<void> leave_phase();
    [[nodiscard]] bool in_phase() const noexcept { return in_phase_; }

    /// One perf.ctl call; returns the result bytes (valid until the next control call).
    Result<std::span<const std::byte>> control(RpcCtlOp op, std::span<const std::byte> body);

    /// perf.ctl bulk_setup: the server's core engine exposes `size` bytes read-write for this
    /// client (replacing what it exposed for it before); the handle's encoding (valid until the
    /// next control call).
    Result<std::span<const std::byte>> bulk_setup(uint64_t size);
    /// The server's handle of bulk_setup, decoded on `transport` with `owner` (the server's
    /// core engine as that transport knows it); protocol_error if it covers less than `size`.
    static Result<bulk::Handle> decode_exposed(std::span<const std::byte> enc,
                                               na::Transport& transport, const na::Addr& owner,
                                               uint64_t size);
    /// End a measurement: release the buffer the server exposed for this client (when
    /// `exposed`), then leave the phase; the first error of the two.
    Result<void> end_measurement(bool exposed);

    /// Drive `ctx` until `*counter >= target`: busy polls progress(0), block waits
    /// progress(1 s). Fails after kPeerTimeout without any completion.
    Result<void> wait(core::Context& ctx, const uint64_t* counter, uint64_t target,
                      std::string_view what);

  private:
    RpcSession() = default;

    std::unique_ptr<core::Engine> engine_;
    na::Addr server_;
    std::string address_;
    std::string layer_;
    std::string transport_;
    LayerOptions opt_;
    int ctl_fd_ = -1;
    bool in_phase_ = false;
    // The control call in flight: its completion count, result bytes and error.
    uint64_t ctl_done_ = 0;
    std::vector<std::byte> ctl_reply_;
    std::optional<Error> ctl_error_;
    std::vector<std::byte> ctl_args_;
};

}  // namespace talaria::perf
