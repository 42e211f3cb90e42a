// The JSON and text an engine answers about itself (stats.cpp), shared by Engine's members
// and the introspection procedures (engine.cpp), which hold the engine's state, not an Engine.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "talaria/core/core.hpp"

namespace talaria::detail {

/// `extra`: another na context of the engine to count with the core's (the API's bulk one).
/// `asking`: the request of the introspection procedure that asks (null from Engine's own
/// members): it is held while it runs, and is not counted as a held request.
std::string stats_json_of(const core::Engine& core, int indent, const na::Context* extra = nullptr,
                          const core::Request* asking = nullptr);
std::string stats_prometheus_of(const core::Engine& core, const na::Context* extra = nullptr,
                                const core::Request* asking = nullptr);
std::string calls_in_flight_json_of(const core::Engine& core,
                                    const core::Request* asking = nullptr);
/// The health object (one line), its strings escaped.
std::string health_json_text(std::string_view status, std::string_view address, uint64_t uptime_ms,
                             unsigned contexts);

/// Engine::write_stats_every and Engine::serve_prometheus (exporter.cpp): up to two threads of
/// the engine, stopped (the file written a last time) before the engine stops.
class StatsExporter {
  public:
    StatsExporter(const core::Engine& core, const na::Context* extra);
    ~StatsExporter();
    StatsExporter(const StatsExporter&) = delete;
    StatsExporter& operator=(const StatsExporter&) = delete;
    Result<void> write_every(Duration period, std::string path);
    Result<std::string> serve_http(std::string_view address);
    void stop() noexcept;

  private:
    void stop_writer() noexcept;
    const core::Engine& core_;
    const na::Context* extra_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool writer_stop_ = false;  ///< under mu_
    bool closed_ = false;       ///< stop() ran: nothing starts again (under the engine's life_mu)
    Duration period_{};         ///< under mu_
    std::string path_;          ///< under mu_
    std::thread writer_;
    std::thread http_;
    int listen_fd_ = -1;
    int wake_fd_ = -1;
    std::string http_address_;
};

}  // namespace talaria::detail
