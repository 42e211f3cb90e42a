// talaria-perf: raw baselines, measured in the same run and the same two-process arrangement as
// the layer back ends, so every result can be reported as a ratio to what the hardware and
// kernel give without Talaria:
//   sm:  pingpong -> bare shared-memory ping-pong (one region each way; spin, or spin a
//                    little then futex)
//        blast    -> bare single-producer single-consumer ring, `inflight` slots
//        put/get  -> process_vm_writev / process_vm_readv of the same size
//   tcp: pingpong -> bare TCP ping-pong (TCP_NODELAY; MSG_DONTWAIT spin or blocking recv)
//        blast    -> bare TCP stream, one send() per message
//        put/get  -> bare TCP stream of `size`-byte writes, client->server / server->client
// The rpc and bulk layers' patterns map onto these (baseline_spec): rpc pingpong, rate and
// first -> pingpong (rate as 1 / round trip); bulk pull -> get, push -> put.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "control.hpp"
#include "driver.hpp"

namespace talaria::perf {

struct BaselineOptions {
    /// process_vm_* iovec size (0: one iovec for the whole transfer).
    std::size_t pvm_iov_bytes = 0;
    /// Block mode of the shm baselines: spin this long before FUTEX_WAIT (the sm transport
    /// also spins before it sleeps; 0 = sleep at once).
    Duration block_spin = std::chrono::microseconds(30);
    // The external baselines (ofi, ucx: baseline_ext.cpp) run their own server/client pair:
    /// CPUs of the pair's halves (-1: not pinned), the talaria-perf server's and client's.
    int server_cpu = -1;
    int client_cpu = -1;
    /// The layer's transports are opened thread-safe (ucx_perftest -M multi to match).
    bool thread_safe = true;
    /// The server runs on this host (false with --connect: no external baseline then).
    bool local = true;
};

/// The smallest raw ping-pong message (an empty RPC still carries the core's header).
inline constexpr std::size_t kMinPingBytes = 8;

/// The raw spec a layer's spec is compared with.
Spec baseline_spec(const Spec& s);

/// The client half of the raw baseline for `transport`: "sm" or "tcp", driven over the
/// control connection `ctl_fd` (which it also uses as the raw TCP socket); "ofi+<provider>"
/// and "ucx+<tls>": the libraries' own test programs, run as child processes
/// (baseline_ext.cpp; `ctl_fd` only parks the server in its control loop before each run).
Result<std::unique_ptr<Runner>> make_baseline(std::string_view transport, int ctl_fd,
                                              const BaselineOptions& opt);

// --- server halves: each replies "ready" (or an error) on `fd`, then runs the data phase ----
Result<void> serve_shm_pingpong(int fd, const CtlRequest& r);
Result<void> serve_shm_ring(int fd, const CtlRequest& r);
Result<void> serve_tcp_pingpong(int fd, const CtlRequest& r);
Result<void> serve_tcp_stream(int fd, const CtlRequest& r);

/// The target buffer of the process_vm_* baseline, owned by the server between pvm_setup and
/// pvm_release.
class PvmTarget {
  public:
    PvmTarget() = default;
    PvmTarget(const PvmTarget&) = delete;
    PvmTarget& operator=(const PvmTarget&) = delete;
    ~PvmTarget() { release(); }
    Result<CtlReply> setup(const CtlRequest& r);
    void release() noexcept;

  private:
    void* buf_ = nullptr;
    std::size_t len_ = 0;
};

}  // namespace talaria::perf
