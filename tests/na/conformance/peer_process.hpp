// The two sides of a two-process test. The test side: PeerProcess spawns a peer executable
// (na_peer, bulk_peer, rpc_peer) over pipes and reads the lines it prints. The peer side: the
// start-up and serve loop those executables share, so each keeps only its own protocol.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria::na::test {

// --- the test side -------------------------------------------------------------------------------

/// A running peer process: the address it printed first, its stdout (further lines it prints),
/// its stdin (closing it ends the peer) and its pid. Killed and reaped by the destructor if
/// still running.
class PeerProcess {
  public:
    /// Run `path <address>` and read the address line it prints first (10 s at most). Null, with
    /// `*err` saying why, when the peer cannot be started or prints no address.
    static std::unique_ptr<PeerProcess> spawn(const std::string& path, const std::string& address,
                                              std::string* err);
    /// Run `path args...`, in the network namespace open at `netns_fd` when it is not -1 (see
    /// netns.hpp), and read the first line it prints (10 s at most) into `address`.
    static std::unique_ptr<PeerProcess> spawn(const std::string& path,
                                              const std::vector<std::string>& args,
                                              std::string* err, int netns_fd = -1);

    PeerProcess(const PeerProcess&) = delete;
    PeerProcess& operator=(const PeerProcess&) = delete;
    ~PeerProcess();

    /// SIGKILL the peer and reap it.
    void kill9();

    /// Close the peer's stdin: the peers take it as "the test is done" and exit.
    void close_stdin();

    /// Wait for the peer to exit; its exit status (128 + signal when killed), or nullopt on
    /// timeout.
    std::optional<int> wait_exit(Duration timeout);

    /// A whole line the peer printed, if one is there within `timeout` (0: do not wait).
    std::optional<std::string> read_line(Duration timeout);

    /// The address line the peer printed first.
    std::string address;
    /// Its process id (to read /proc/<pid>/...).
    [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  private:
    PeerProcess(pid_t pid, int to, int from) : pid_(pid), to_child_(to), from_child_(from) {}

    pid_t pid_;
    int to_child_;
    int from_child_;
    std::string pending_;  // read from the peer's stdout, not yet returned as a line
    std::optional<int> status_;
};

// --- the peer side -------------------------------------------------------------------------------

/// The start of a peer's main(): checks the usage `<name> <address>`, arms a 60 s alarm (a peer
/// never outlives a test run) and ignores SIGPIPE (the test may die first). The address, or
/// nullopt after printing the usage.
std::optional<std::string> peer_start(std::string_view name, int argc, char** argv);

/// Print `line` and a newline on stdout and flush, so the test reads it at once.
void print_line(std::string_view line);

/// Has stdin closed (the test closed it, or died)? Never blocks.
bool stdin_closed();

/// The serve loop of a peer: each round runs `round()` (the peer's own work), which returns how
/// long progress may block, or nullopt to stop; then progresses and triggers `ctx`. Stops too
/// when stdin closes. False when progress fails (reported on stderr as "<name>: progress: ...").
/// A template: `Ctx` is na::Context or core::Context.
template <class Ctx, class Round>
bool serve_until_stdin_closed(Ctx& ctx, std::string_view name, Round round) {
    for (;;) {
        std::optional<Duration> slice = round();
        if (!slice || stdin_closed()) return true;
        auto r = ctx.progress(*slice);
        if (!r && r.code() != Errc::timeout) {
            std::fprintf(stderr, "%.*s: progress: %s\n", int(name.size()), name.data(),
                         r.error().describe().c_str());
            return false;
        }
        ctx.trigger();
    }
}

}  // namespace talaria::na::test
