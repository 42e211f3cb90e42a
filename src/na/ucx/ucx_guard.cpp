// UCX's own listening sockets: the ports its tcp interfaces listen on (not our bootstrap's),
// which every peer that connects to one of our workers reaches.
//
// UCX 1.13 (and UCX's master since) closes such a listener for good when one accept() fails with
// anything but EAGAIN: a crowd of idle connections that brings the process to its descriptor
// limit (EMFILE) cuts it off from every later peer, and nothing in UCP rebuilds it. It cannot
// be made to survive from outside UCX, so with na::Options::auth (sockaddr mode, where peers
// prove the secret at our bootstrap) it is not exposed: each of UCX's listeners carries a
// classic BPF socket filter (SO_ATTACH_FILTER, unprivileged) that drops every packet, the SYN
// included, from a host that has not proved the secret to us or been proved to by us (the
// source address of an authenticated bootstrap, either way) or is not one of our own
// addresses. A stranger's connection never completes, so it holds no descriptor; sockets
// accepted later inherit the filter. Hosts, not processes: another process on an admitted
// host gets through, as through a firewall rule.
//
// Without auth nothing can tell a stranger from a peer, and the listeners stay open to all: the
// bootstrap thread checks them once a second and says, once per listener, when UCX has closed
// one (and what to set). docs/transports.md says what an operator must set either way.
//
// The listeners are found by what ucp_worker_create adds to the descriptor table (sockets in
// the listening state that were not there before), under the setup lock: a listening socket
// another thread of the application makes in that instant would be taken for UCX's.
#include <arpa/inet.h>
#include <dirent.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "na/ucx/ucx.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ucx {

namespace {

/// The hosts one filter admits at most (each IPv6 host costs 9 instructions, of the kernel's
/// 4096): past this, the listeners are left unfiltered, with a warning.
constexpr std::size_t kMaxAdmittedHosts = 400;

/// How often the bootstrap thread looks whether UCX still has its listeners.
constexpr Duration kListenerCheckEvery = std::chrono::seconds(1);

/// `a` as a host: IPv4 (IPv4-mapped IPv6 too) or IPv6, without the port; false for others.
bool host_of(const SockAddr& a, AdmittedHost& out) {
    out = AdmittedHost{};
    if (a.family() == AF_INET) {
        const auto* s = reinterpret_cast<const sockaddr_in*>(&a.storage);
        out.v6 = false;
        std::memcpy(out.bytes.data(), &s->sin_addr, 4);
        return true;
    }
    if (a.family() == AF_INET6) {
        const auto* s = reinterpret_cast<const sockaddr_in6*>(&a.storage);
        if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) {
            out.v6 = false;
            std::memcpy(out.bytes.data(), s->sin6_addr.s6_addr + 12, 4);
        } else {
            out.v6 = true;
            std::memcpy(out.bytes.data(), s->sin6_addr.s6_addr, 16);
        }
        return true;
    }
    return false;
}

uint32_t word_at(const AdmittedHost& h, std::size_t i) {
    uint32_t w;
    std::memcpy(&w, h.bytes.data() + 4 * i, 4);
    return ntohl(w);  // the filter's loads are in host order
}

/// The filter: accept a packet whose source is one of `hosts`, drop the rest.
std::vector<sock_filter> build_filter(const std::vector<AdmittedHost>& hosts) {
    constexpr uint32_t kAccept = 0xFFFFFFFFu;
    std::vector<sock_filter> p;
    auto at = [](int off) { return uint32_t(SKF_NET_OFF + off); };
    // skb->protocol, then to the section of its family (BPF_JA takes a 32-bit offset).
    p.push_back(BPF_STMT(BPF_LD | BPF_H | BPF_ABS, uint32_t(SKF_AD_OFF + SKF_AD_PROTOCOL)));
    p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x0800, 0, 1));
    const std::size_t ja_v4 = p.size();
    p.push_back(BPF_STMT(BPF_JMP | BPF_JA, 0));
    p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x86DD, 0, 1));
    const std::size_t ja_v6 = p.size();
    p.push_back(BPF_STMT(BPF_JMP | BPF_JA, 0));
    p.push_back(BPF_STMT(BPF_RET | BPF_K, 0));
    p[ja_v4].k = uint32_t(p.size() - ja_v4 - 1);
    p.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, at(12)));  // IPv4 source
    for (const AdmittedHost& h : hosts) {
        if (h.v6) continue;
        p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word_at(h, 0), 0, 1));
        p.push_back(BPF_STMT(BPF_RET | BPF_K, kAccept));
    }
    p.push_back(BPF_STMT(BPF_RET | BPF_K, 0));
    p[ja_v6].k = uint32_t(p.size() - ja_v6 - 1);
    for (const AdmittedHost& h : hosts) {  // IPv6 source: 4 words from offset 8
        if (!h.v6) continue;
        for (uint8_t i = 0; i < 4; ++i) {
            p.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, at(8 + 4 * i)));
            p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word_at(h, i), 0, uint8_t(7 - 2 * i)));
        }
        p.push_back(BPF_STMT(BPF_RET | BPF_K, kAccept));
    }
    p.push_back(BPF_STMT(BPF_RET | BPF_K, 0));
    return p;
}

std::string host_string(const AdmittedHost& h) {
    char text[INET6_ADDRSTRLEN]{};
    ::inet_ntop(h.v6 ? AF_INET6 : AF_INET, h.bytes.data(), text, sizeof text);
    return text;
}

/// Still the listening socket it was: the descriptor names the same socket, still listening.
bool still_listening(const UctListener& l) {
    struct stat st {};
    if (::fstat(l.fd, &st) != 0 || st.st_ino != l.ino || !S_ISSOCK(st.st_mode)) return false;
    int on = 0;
    socklen_t len = sizeof on;
    return ::getsockopt(l.fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on != 0;
}

}  // namespace

std::vector<UctListener> listening_sockets() {
    std::vector<UctListener> out;
    DIR* d = ::opendir("/proc/self/fd");
    if (!d) return out;
    const int own = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == own) continue;
        UctListener l;
        l.fd = int(fd);
        struct stat st {};
        if (::fstat(l.fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        l.ino = st.st_ino;
        if (!still_listening(l)) continue;
        SockAddr a;
        a.len = sizeof a.storage;
        if (::getsockname(l.fd, a.sa(), &a.len) != 0 ||
            (a.family() != AF_INET && a.family() != AF_INET6))
            continue;
        l.where = a.to_string();
        l.local = a;
        out.push_back(std::move(l));
    }
    ::closedir(d);
    return out;
}

std::vector<int> UcxTransport::guard_new_listeners(const std::vector<UctListener>& before,
                                                   uint8_t lane) {
    std::vector<UctListener> now = listening_sockets();
    std::vector<int> found;
    std::lock_guard g(guard_mu_);
    for (UctListener& l : now) {
        const bool old = std::any_of(before.begin(), before.end(), [&](const UctListener& b) {
            return b.fd == l.fd && b.ino == l.ino;
        });
        if (old || l.fd == boot_fd_) continue;
        l.lane = lane;
        TALARIA_LOG(ucx, debug, "{}: UCX listens on {} for context {} (descriptor {}){}", scheme_,
                    l.where, lane, l.fd,
                    filter_listeners_ ? ": admitting only hosts that proved the secret" : "");
        // Our own addresses: our lanes connect to one another through them.
        AdmittedHost h;
        if (host_of(l.local, h) &&
            std::find(admitted_.begin(), admitted_.end(), h) == admitted_.end())
            admitted_.push_back(h);
        found.push_back(l.fd);
        uct_listeners_.push_back(std::move(l));
        any_listener_.store(true, std::memory_order_release);
    }
    if (filter_listeners_) attach_filters_locked();
    return found;
}

void UcxTransport::admit_host(const SockAddr& peer) {
    if (!filter_listeners_) return;
    AdmittedHost h;
    if (!host_of(peer, h)) return;
    std::lock_guard g(guard_mu_);
    if (std::find(admitted_.begin(), admitted_.end(), h) != admitted_.end()) return;
    admitted_.push_back(h);
    TALARIA_LOG(ucx, debug, "{}: host {} proved the secret: UCX's listeners admit it", scheme_,
                host_string(h));
    attach_filters_locked();
}

void UcxTransport::attach_filters_locked() {
    if (uct_listeners_.empty()) return;
    if (admitted_.size() > kMaxAdmittedHosts) {
        if (!filter_overflow_) {
            filter_overflow_ = true;
            TALARIA_LOG(ucx, warn,
                        "{}: more than {} hosts proved the secret; UCX's own listeners now admit "
                        "every host (a crowd of idle connections to them can make UCX close them "
                        "at the descriptor limit: keep strangers off with a firewall, "
                        "docs/transports.md)",
                        scheme_, kMaxAdmittedHosts);
            for (const UctListener& l : uct_listeners_)
                if (still_listening(l))
                    (void)::setsockopt(l.fd, SOL_SOCKET, SO_DETACH_FILTER, nullptr, 0);
        }
        return;
    }
    std::vector<sock_filter> code = build_filter(admitted_);
    sock_fprog prog{uint16_t(code.size()), code.data()};
    for (const UctListener& l : uct_listeners_) {
        if (!still_listening(l)) continue;  // closed by UCX: its descriptor may be another's now
        if (::setsockopt(l.fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) != 0)
            TALARIA_LOG(ucx, warn,
                        "{}: cannot filter UCX's listener on {} (SO_ATTACH_FILTER: {}): it admits "
                        "every host",
                        scheme_, l.where, std::strerror(errno));
    }
}

void UcxTransport::check_listeners(TimePoint now) {
    if (now < next_listener_check_) return;
    next_listener_check_ = now + kListenerCheckEvery;
    std::lock_guard g(guard_mu_);
    for (UctListener& l : uct_listeners_) {
        if (l.lost || still_listening(l)) continue;
        l.lost = true;
        TALARIA_LOG(ucx, error,
                    "{}: UCX closed its listener on {} (context {}); it does so for good when "
                    "an accept fails, as at the descriptor limit, so peers that are not yet "
                    "connected to context {} can no longer reach it. Set na::Options::auth "
                    "(only hosts that proved the secret then reach UCX's listeners), raise "
                    "`ulimit -n`, and keep strangers off UCX's ports (docs/transports.md); "
                    "reopen the engine to listen again",
                    scheme_, l.where, l.lane, l.lane);
    }
}

TimePoint UcxTransport::next_listener_check() const noexcept {
    return any_listener_.load(std::memory_order_acquire) ? next_listener_check_ : TimePoint::max();
}

}  // namespace talaria::na::ucx
