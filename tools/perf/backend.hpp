// talaria-perf: per-layer back ends. Each layer ("na", "rpc", "bulk") provides a client half (a
// Runner, driven by the driver exactly like the raw baselines) and a server half (run by
// `talaria-perf serve <layer>` in phases the client opens over the control connection).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "driver.hpp"
#include "talaria/na/na.hpp"

namespace talaria::perf {

struct LayerOptions {
    bool thread_safe = true;  ///< na::Options::thread_safe on both sides
    std::string url;          ///< address to open the transport with ("" = the default)
    /// Shared-secret authentication on both sides (--auth-secret-file, --protect).
    na::Auth auth;
    std::string auth_file;  ///< where the secret was read, passed on to the processes we start
    std::string protect;    ///< --protect, passed on likewise
    /// EngineOptions::core.stats of the api layer's engines, both sides (off: --no-stats).
    bool api_stats = true;
};

/// The key id talaria-perf's processes name their shared secret with.
inline constexpr std::string_view kPerfAuthKeyId = "talaria-perf";
/// na::Options::auth from --auth-secret-file (off when `path` is empty) and --protect ("",
/// "none", "integrity" or "encryption"; tcp only, needs the secret).
Result<na::Auth> perf_auth(const std::string& path, const std::string& protect = {});
/// The --auth-secret-file and --protect arguments of a process we start, as ours.
void push_auth_args(std::vector<std::string>& args, const std::string& path,
                    const std::string& protect);

/// The server half of a layer.
class LayerServer {
  public:
    virtual ~LayerServer() = default;
    /// The address clients connect to (printed by `serve`).
    [[nodiscard]] virtual std::string address() const = 0;
    /// Serve requests until the client ends the phase, sends a control request, disconnects,
    /// or stays silent too long. Never returns while operations it posted are half done.
    virtual Result<void> run_phase(int ctl_fd) = 0;
};

/// One layer: its name, its patterns, and how to make both halves. Layers with the same
/// make_server share one server process (rpc and bulk: one core::Engine serves both).
struct Layer {
    std::string_view name;
    std::span<const Pattern> patterns;
    /// `transport` is "sm" or "tcp".
    Result<std::unique_ptr<LayerServer>> (*make_server)(std::string_view transport,
                                                        const LayerOptions& opt);
    /// The client half talks to the server at `server_address`; `ctl_fd` opens its phases.
    Result<std::unique_ptr<Runner>> (*make_client)(std::string_view transport,
                                                   std::string_view server_address, int ctl_fd,
                                                   const LayerOptions& opt);
};

/// The compiled-in layers (an explicit list, no registration).
std::span<const Layer> layers();
const Layer* find_layer(std::string_view name);

/// Whether a server started for layer `a` also serves layer `b`'s phases.
bool shares_server(const Layer& a, const Layer& b) noexcept;

// The na layer (backend_na.cpp).
Result<std::unique_ptr<LayerServer>> make_na_server(std::string_view transport,
                                                    const LayerOptions& opt);
Result<std::unique_ptr<Runner>> make_na_client(std::string_view transport,
                                               std::string_view server_address, int ctl_fd,
                                               const LayerOptions& opt);

// The rpc layer (backend_rpc.cpp): its server also serves the bulk layer.
Result<std::unique_ptr<LayerServer>> make_rpc_server(std::string_view transport,
                                                     const LayerOptions& opt);
Result<std::unique_ptr<Runner>> make_rpc_client(std::string_view transport,
                                                std::string_view server_address, int ctl_fd,
                                                const LayerOptions& opt);

// The api layer (backend_api.cpp): talaria::Engine / define / remote; served by the rpc
// server's api engine.
Result<std::unique_ptr<Runner>> make_api_client(std::string_view transport,
                                                std::string_view server_address, int ctl_fd,
                                                const LayerOptions& opt);

// The hg layer (backend_hg.cpp): Mercury's C API (HG_Forward, HG_Bulk_transfer) on Talaria,
// served by the rpc server's api engine (calls) and core engine (transfers).
Result<std::unique_ptr<Runner>> make_hg_client(std::string_view transport,
                                               std::string_view server_address, int ctl_fd,
                                               const LayerOptions& opt);

// The bulk layer (backend_bulk.cpp).
Result<std::unique_ptr<Runner>> make_bulk_client(std::string_view transport,
                                                 std::string_view server_address, int ctl_fd,
                                                 const LayerOptions& opt);

/// The rpc server's exposed buffer for the bulk layer (backend_bulk.cpp): registered memory
/// and its bulk handle, owned here until release() or the next expose().
class BulkExposure {
  public:
    virtual ~BulkExposure() = default;
    /// Register `size` bytes read-write on `transport`; returns the handle's encoding.
    virtual Result<std::vector<std::byte>> expose(na::Transport& transport, uint64_t size) = 0;
    virtual void release() noexcept = 0;
};
std::unique_ptr<BulkExposure> make_bulk_exposure();

}  // namespace talaria::perf
