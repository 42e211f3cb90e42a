// talaria-perf: running the libraries' own benchmark programs (fi_pingpong, ucx_perftest) and
// our raw libfabric RMA baseline as child processes: a server and a client on 127.0.0.1, each
// with its own environment and CPU, every wait bounded, the children killed on timeout and
// when we die (PR_SET_PDEATHSIG), their output captured for parsing and for error messages.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria::perf {

/// One program to run.
struct ChildSpec {
    /// argv[0] is the program: a path, or a name looked up in PATH.
    std::vector<std::string> argv;
    /// Variables set (or replaced) in the child's environment only.
    std::vector<std::pair<std::string, std::string>> env;
    /// Pin the child to this CPU (-1: inherit our affinity).
    int cpu = -1;
    /// Debian package that provides the program, named when it is missing.
    std::string package;
};

/// The full path of `program` (as given when it contains '/', else searched in PATH), or a
/// not_found error naming `package`.
Result<std::string> find_program(const std::string& program, const std::string& package);

/// A running child with stdout and stderr captured.
class Child {
  public:
    Child() = default;
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;
    ~Child() { kill_and_reap(); }

    Result<void> start(const ChildSpec& spec);
    /// Drain output until the child exits or `deadline` passes (timeout error; the child is
    /// left running). Returns the exit status as from waitpid.
    Result<int> wait(TimePoint deadline);
    /// Whether the child has exited (reaps it; output drained).
    bool exited();
    /// SIGKILL and reap (no-op when not running).
    void kill_and_reap() noexcept;
    [[nodiscard]] const std::string& out() const noexcept { return out_; }
    [[nodiscard]] const std::string& err() const noexcept { return err_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// "exit status 1" / "killed by signal 11".
    [[nodiscard]] std::string status_text() const;
    /// The last lines of stderr then stdout, for an error message.
    [[nodiscard]] std::string tail(std::size_t max_chars = 400) const;

  private:
    void drain(int timeout_ms);
    pid_t pid_ = -1;
    int out_fd_ = -1;
    int err_fd_ = -1;
    int status_ = 0;
    bool reaped_ = false;
    std::string out_, err_, name_;
};

/// A free TCP port on the loopback interface (bound and released: another process may take it
/// before the child does; the caller's retry covers that).
Result<uint16_t> free_tcp_port();

/// Run a server/client pair: start `server`, wait until something listens on TCP `port`,
/// start `client`, wait for both (at most `timeout` in all). Returns the client's stdout; on
/// failure (missing program, non-zero exit, timeout: both killed) an error naming the program,
/// its status and the tail of its output.
Result<std::string> run_pair(const ChildSpec& server, const ChildSpec& client, uint16_t port,
                             Duration timeout);

/// The command line of a spec, for error messages and the README's "how derived".
std::string command_text(const ChildSpec& spec);

}  // namespace talaria::perf
