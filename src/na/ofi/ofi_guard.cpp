// ofi+tcp's listeners and the connections they accept belong to libfabric's tcp provider, and
// two things about them need a guard of ours:
//  * At the descriptor limit the provider's listener stays readable while accept() fails with
//    EMFILE, so the lane's wait fd never sleeps (a core at 100%). When progress finds its lane
//    waking with nothing to do (kSpinWakes within kSpinWindow), it naps 1 ms a wake, and the
//    guard, if we are out of descriptors, takes the connections waiting on our listeners
//    through a spare descriptor and closes them, as tcp does.
//  * A connection the provider accepted waits for the peer's connection request with no time
//    limit, holding a descriptor. 1.17 does not notice a shutdown() of one: its read of the
//    request sees the end of the stream, takes the thread's stale errno (often EAGAIN) for the
//    reason, and waits on. So once every hello_timeout / 2 the guard looks at the accepted
//    connections of our listeners, and one to which we have sent nothing (no byte of ours
//    acknowledged: every connection the provider set up carries its answer) and from which
//    nothing came for hello_timeout is reset (connect() with AF_UNSPEC, which sends a RST and
//    leaves ECONNRESET pending on the socket): the provider's read then fails with that, and
//    it closes the connection and its descriptor. As tcp's hello_timeout, before any
//    authentication.
// docs/architecture.md, trust model; docs/transports.md, "Descriptors on an ofi+tcp server".
#include <dirent.h>
#include <fcntl.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_acked (glibc's lacks it)
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "na/ofi/ofi.hpp"

namespace talaria::na::ofi {

namespace {
/// TCP states as the kernel reports them (its tcp_states.h; tcpi_state, /proc/net/tcp's `st`).
constexpr uint8_t kTcpEstablished = 1;
constexpr uint8_t kTcpCloseWait = 8;
constexpr uint8_t kTcpListen = 10;

/// The socket's TCP state (TCP_INFO), or false if it is not a TCP socket.
bool tcp_info_of(int fd, tcp_info& out) noexcept {
    socklen_t len = sizeof out;
    return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &out, &len) == 0;
}

/// A TCP socket of this network namespace bound to one of our ports.
struct OurSocket {
    unsigned long inode;
    uint8_t state;
};

/// Appends the sockets of `table` (/proc/self/net/tcp or tcp6) whose local port is one of
/// `ports`. One descriptor while it reads.
void sockets_in(const char* table, const std::vector<uint16_t>& ports,
                std::vector<OurSocket>& out) {
    FILE* f = std::fopen(table, "re");
    if (!f) return;
    char line[512];
    std::fgets(line, sizeof line, f);  // the header
    while (std::fgets(line, sizeof line, f)) {
        // "  sl: local:port remote:port st tx:rx tr:when retrnsmt uid timeout inode ..."
        unsigned port = 0, state = 0;
        unsigned long inode = 0;
        if (std::sscanf(
                line, " %*u: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
                &port, &state, &inode) != 3 ||
            inode == 0)
            continue;
        if (std::find(ports.begin(), ports.end(), uint16_t(port)) != ports.end())
            out.push_back({inode, uint8_t(state)});
    }
    std::fclose(f);
}

/// Calls `f(fd, state)` for each descriptor of ours that is a TCP socket bound to one of
/// `ports`. The kernel's socket table names the sockets; the descriptors are matched to them by
/// their /proc/self/fd links, so no descriptor of the process other than those is touched (the
/// application's, and the other transports', are not ours to probe). Needs one free descriptor.
template <class F>
void for_each_socket_on(const std::vector<uint16_t>& ports, F&& f) {
    std::vector<OurSocket> ours;
    sockets_in("/proc/self/net/tcp", ports, ours);
    sockets_in("/proc/self/net/tcp6", ports, ours);
    if (ours.empty()) return;
    // Sorted by inode: a look-up per descriptor, not a scan (servers hold thousands of both).
    std::sort(ours.begin(), ours.end(),
              [](const OurSocket& a, const OurSocket& b) { return a.inode < b.inode; });
    DIR* d = ::opendir("/proc/self/fd");
    if (!d) return;
    const int dir_fd = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
        char* end = nullptr;
        const long v = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || v == dir_fd) continue;
        char link[64];
        const ssize_t n = ::readlinkat(dir_fd, e->d_name, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = '\0';
        unsigned long inode = 0;
        if (std::sscanf(link, "socket:[%lu]", &inode) != 1) continue;
        const auto it =
            std::lower_bound(ours.begin(), ours.end(), inode,
                             [](const OurSocket& s, unsigned long i) { return s.inode < i; });
        if (it != ours.end() && it->inode == inode) f(int(v), it->state);
    }
    ::closedir(d);
}
}  // namespace

void OfiTransport::guard_ports_locked() {
    // The ports our lanes listen on (each lane's endpoint has a listener of the provider's).
    for (std::size_t i = 0; i < opts_.max_contexts; ++i) {
        OfiLane* l = lane_at(uint8_t(i));
        if (!l) continue;
        if (auto sa = sock_addr_of(std::as_bytes(std::span(l->raw)));
            sa && sa->port() != 0 &&
            std::find(guard_ports_.begin(), guard_ports_.end(), sa->port()) == guard_ports_.end())
            guard_ports_.push_back(sa->port());
    }
}

void OfiTransport::guard_idle_locked(TimePoint now) {
    if (now < guard_idle_next_) return;
    const Duration timeout = opts_.hello_timeout;
    if (timeout <= Duration::zero()) {
        guard_idle_next_ = TimePoint::max();
        guard_due_.store(guard_idle_next_.time_since_epoch().count(), std::memory_order_relaxed);
        return;
    }
    guard_idle_next_ = now + std::clamp<Duration>(timeout / 2, std::chrono::milliseconds(250),
                                                  std::chrono::seconds(5));
    guard_due_.store(guard_idle_next_.time_since_epoch().count(), std::memory_order_relaxed);
    guard_ports_locked();
    const auto silent_ms =
        uint32_t(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
    std::size_t reset = 0;
    // Listing our descriptors takes one: at the limit, the spare's.
    if (guard_spare_ >= 0) ::close(guard_spare_);
    for_each_socket_on(guard_ports_, [&](int fd, uint8_t state) {
        tcp_info ti{};
        if (state == kTcpListen || !tcp_info_of(fd, ti)) return;
        if (ti.tcpi_state != kTcpEstablished && ti.tcpi_state != kTcpCloseWait) return;
        if (ti.tcpi_bytes_acked != 0 || ti.tcpi_last_data_recv < silent_ms) return;
        sockaddr unspec{};
        unspec.sa_family = AF_UNSPEC;
        if (::connect(fd, &unspec, sizeof unspec) == 0) ++reset;
    });
    guard_spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (reset != 0)
        if (auto held = guard_log_.admit())
            TALARIA_LOG(ofi, warn,
                        "{}: reset {} connection(s) the provider accepted that sent no connection "
                        "request within hello_timeout ({} ms){}",
                        scheme_, reset, silent_ms, log::held_back(*held));
}

bool OfiTransport::guard_spinning_locked(OfiLane& l, TimePoint now) noexcept {
    if (now - l.wakes_since > kSpinWindow) {
        l.wakes_since = now;
        l.wakes = 0;
        if (l.spinning) l.spinning = false;  // a quiet window: the spin is over
    }
    if (++l.wakes >= kSpinWakes) l.spinning = true;
    return l.spinning;
}

void OfiTransport::guard(TimePoint now) {
    std::unique_lock g(guard_mu_, std::try_to_lock);
    if (!g.owns_lock()) return;
    guard_idle_locked(now);
    if (now < guard_next_) return;
    guard_next_ = now + std::chrono::milliseconds(250);
    // Only out of descriptors: a listener that wakes us for another reason is the provider's
    // business (and taking its connections would refuse good clients).
    if (guard_spare_ < 0) return;
    if (int probe = ::open("/dev/null", O_RDONLY | O_CLOEXEC); probe >= 0) {
        ::close(probe);
        return;
    } else if (errno != EMFILE && errno != ENFILE) {
        return;
    }
    guard_ports_locked();
    // Find the provider's listeners among our descriptors (listing them takes one: the
    // spare's).
    std::vector<int> listeners;
    ::close(guard_spare_);
    for_each_socket_on(guard_ports_, [&](int fd, uint8_t state) {
        if (state == kTcpListen) listeners.push_back(fd);
    });
    // Take what waits on them and close it at once, one accept per spare, so that they stop
    // waking us.
    std::size_t refused = 0;
    guard_spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int lfd : listeners) {
        while (guard_spare_ >= 0 && refused < 4096) {
            ::close(guard_spare_);
            const int c = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (c >= 0) ::close(c);
            guard_spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (c < 0) break;
            ++refused;
        }
    }
    if (refused != 0)
        if (auto held = guard_log_.admit())
            TALARIA_LOG(ofi, warn,
                        "{}: out of descriptors: refused {} connection(s) waiting on the "
                        "provider's listener (raise `ulimit -n`; connections the provider "
                        "already accepted and that never speak are reset after hello_timeout){}",
                        scheme_, refused, log::held_back(*held));
}

void OfiTransport::guard_open() {
    if (prov_.prov_name.find("tcp") == std::string::npos) return;
    guarding_ = true;
    guard_spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void OfiTransport::guard_close() noexcept {
    if (guard_spare_ >= 0) ::close(guard_spare_);
    guard_spare_ = -1;
}

}  // namespace talaria::na::ofi
