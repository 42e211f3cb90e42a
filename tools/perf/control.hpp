// talaria-perf: the control channel between client and server (a TCP connection that also
// carries the raw TCP baseline), socket helpers with bounded waits, the spawned server process,
// and CPU placement.
//
// Control messages are fixed-size little-endian records (client and server run the same
// binary). Every field read from the socket is validated before use: a bad record ends the
// session with Errc::protocol_error, never a crash or an oversized allocation.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria::perf {

inline constexpr uint32_t kCtlMagic = 0x54505246;  // "TPRF"
/// Largest buffer a control command may ask the server to allocate or map.
inline constexpr uint64_t kMaxBufferBytes = uint64_t(1) << 30;
/// Longest a peer may stay silent in the middle of an exchange before we give up on it.
inline constexpr Duration kPeerTimeout = std::chrono::seconds(30);

enum class Cmd : uint32_t {
    hello = 1,     ///< reply.text: "transport=<name>"
    tcp_pingpong,  ///< a=size b=iters c=mode: echo b messages of a bytes on this connection
    tcp_stream,    ///< a=chunk b=count c=mode d=direction(0: client->server, 1: server->client)
    shm_pingpong,  ///< name=shm object a=size b=iters c=mode e=block spin ns: ack, then echo
    shm_ring,      ///< name=shm object a=slot size b=iters c=mode d=slots e=block spin ns
    pvm_setup,     ///< a=size: allocate; reply a=pid b=address
    pvm_release,   ///< free the pvm_setup buffer
    layer_enter,   ///< name=layer: reply, then run the layer's server phase until it ends
    quit,          ///< end the session
};

struct CtlRequest {
    uint32_t magic = kCtlMagic;
    uint32_t cmd = 0;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    uint64_t e = 0;
    char name[64] = {};
};

struct CtlReply {
    uint32_t magic = kCtlMagic;
    uint32_t status = 0;  ///< Errc
    uint64_t a = 0, b = 0;
    char text[240] = {};
};

/// A connected or listening socket that closes itself.
class Fd {
  public:
    Fd() = default;
    explicit Fd(int fd) noexcept : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(o.release()) {}
    Fd& operator=(Fd&& o) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd();
    [[nodiscard]] int get() const noexcept { return fd_; }
    [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
    int release() noexcept {
        int f = fd_;
        fd_ = -1;
        return f;
    }

  private:
    int fd_ = -1;
};

/// "host:port", "[v6]:port"; "host" alone means port 0.
struct HostPort {
    std::string host;
    uint16_t port = 0;
};
Result<HostPort> parse_host_port(std::string_view s);
/// "tcp://host:port" -> host:port (for deriving the control address from --connect).
Result<HostPort> host_port_of_url(std::string_view url);

Result<Fd> tcp_listen(const HostPort& hp);
/// The bound address of a listening socket, as "host:port".
Result<std::string> local_address(int fd);
/// Accept one connection, waiting at most `timeout` (negative: forever).
Result<Fd> tcp_accept(int listen_fd, Duration timeout);
Result<Fd> tcp_connect(const HostPort& hp, Duration timeout);
/// TCP_NODELAY, and send/receive timeouts so no blocking call waits forever.
Result<void> tune_socket(int fd, Duration io_timeout);

/// Send/receive exactly `len` bytes (blocking socket; bounded by the socket timeouts).
Result<void> send_all(int fd, const void* data, std::size_t len);
Result<void> recv_all(int fd, void* data, std::size_t len);

Result<void> ctl_send(int fd, const CtlRequest& r);
Result<void> ctl_send(int fd, const CtlReply& r);
Result<CtlRequest> ctl_recv_request(int fd);
Result<CtlReply> ctl_recv_reply(int fd);
/// Send a request and wait for its reply; an error status in the reply becomes the Error.
Result<CtlReply> ctl_call(int fd, const CtlRequest& r);
/// An error reply naming its cause.
CtlReply ctl_error(const Error& e);
/// A NUL-terminated copy of a fixed-size text field (validated: never reads past its end).
std::string fixed_text(const char* field, std::size_t size);
void set_text(char* field, std::size_t size, std::string_view text);

/// The server child process: started from our own executable with `serve` arguments, killed
/// when we die (PR_SET_PDEATHSIG) and at the latest when this object is destroyed.
class ServerProcess {
  public:
    ServerProcess() = default;
    ServerProcess(const ServerProcess&) = delete;
    ServerProcess& operator=(const ServerProcess&) = delete;
    ~ServerProcess();

    /// fork + exec /proc/self/exe with `args` (argv[1..]); pinned to `cpu` when cpu >= 0.
    /// With `commands`, its stdin is a pipe that write_line() writes (a worker that takes
    /// commands); otherwise it inherits ours.
    Result<void> start(const std::vector<std::string>& args, int cpu, bool commands = false);
    /// The next line the server prints on stdout, waiting at most `timeout`.
    Result<std::string> read_line(Duration timeout);
    /// Write `line` and a newline to its stdin (started with `commands`).
    Result<void> write_line(std::string_view line);
    /// Wait up to `grace` for a clean exit, then SIGKILL; always reaps.
    void stop(Duration grace);
    [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  private:
    pid_t pid_ = -1;
    int out_fd_ = -1;
    int in_fd_ = -1;  ///< its stdin (with `commands`)
    std::string buffered_;
};

/// CPUs this process may run on (sched_getaffinity).
std::vector<int> allowed_cpus();
Result<void> pin_to_cpu(int cpu);
/// SCHED_FIFO at `priority` (1..99) for this process, so that other work on a shared host does
/// not preempt a busy-polling side. The kernel's RT throttling still leaves others 5%.
Result<void> set_realtime(int priority);

}  // namespace talaria::perf
