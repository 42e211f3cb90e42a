// ofi+tcp at the descriptor limit: the provider's listening sockets belong to libfabric, whose
// listener stays readable while accept() fails with EMFILE, so the lane's wait fd never sleeps
// (a core at 100%). When progress finds its lane waking with nothing to do (kSpinWakes within
// kSpinWindow), it naps 1 ms a wake, and the guard, if we are out of descriptors, takes the
// connections waiting on our listeners through a spare descriptor and closes them, as tcp
// does. Connections the provider already accepted are its own: 1.17's tcp provider does not
// notice a shutdown() of one that never spoke, so they keep their descriptors until their
// peer closes them. docs/architecture.md, trust model.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "na/ofi/ofi.hpp"

namespace talaria::na::ofi {

namespace {
/// The local TCP port of socket `fd`, or 0.
uint16_t local_port(int fd) noexcept {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
    if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    return 0;
}
}  // namespace

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
    if (!g.owns_lock() || now < guard_next_) return;
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
    // The ports our lanes listen on (each lane's endpoint has a listener of the provider's).
    for (std::size_t i = 0; i < opts_.max_contexts; ++i) {
        OfiLane* l = lane_at(uint8_t(i));
        if (!l) continue;
        if (auto sa = sock_addr_of(std::as_bytes(std::span(l->raw)));
            sa && sa->port() != 0 &&
            std::find(guard_ports_.begin(), guard_ports_.end(), sa->port()) == guard_ports_.end())
            guard_ports_.push_back(sa->port());
    }
    // Find the provider's listeners among our descriptors (listing them takes one: the
    // spare's).
    std::vector<int> listeners;
    ::close(guard_spare_);
    if (DIR* d = ::opendir("/proc/self/fd")) {
        const int dir_fd = ::dirfd(d);
        while (dirent* e = ::readdir(d)) {
            char* end = nullptr;
            const long v = std::strtol(e->d_name, &end, 10);
            if (end == e->d_name || *end != '\0' || v == dir_fd) continue;
            const int fd = int(v);
            struct stat sb {};
            if (::fstat(fd, &sb) != 0 || !S_ISSOCK(sb.st_mode)) continue;
            const uint16_t port = local_port(fd);
            int listening = 0;
            socklen_t ol = sizeof listening;
            if (port != 0 &&
                std::find(guard_ports_.begin(), guard_ports_.end(), port) != guard_ports_.end() &&
                ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) == 0 && listening)
                listeners.push_back(fd);
        }
        ::closedir(d);
    }
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
                        "already accepted keep theirs until they close){}",
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
