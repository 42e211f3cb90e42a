// talaria-info --doctor [ADDRESS]: what commonly breaks a Talaria deployment on this host, each
// with its status and what to do: ptrace scope (sm's single-copy bulk), /dev/shm (sm's rings),
// the locked-memory limit (RDMA registration), libfabric's and UCX's versions and what they
// offer, each transport opened once, and, given ADDRESS, whether its TCP port answers: refused,
// filtered (no answer), or open, with the connect's round-trip time.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "info.hpp"
#include "na/base/url.hpp"
#include "talaria/config.hpp"
#include "talaria/talaria.hpp"

namespace talaria::info {

namespace {

Row check(std::string name, std::string status, std::string detail, std::string remedy = "") {
    Row r;
    r.add("check", std::move(name));
    r.add("status", std::move(status));
    r.add("detail", std::move(detail));
    r.add("remedy", remedy.empty() ? "-" : std::move(remedy));
    return r;
}

Row ptrace_scope() {
    std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
    int scope = -1;
    if (!(f >> scope))
        return check("ptrace scope", "ok",
                     "no Yama LSM here: process_vm_readv needs only the same user");
    if (scope == 0)
        return check("ptrace scope", "ok",
                     "kernel.yama.ptrace_scope=0: sm put/get copy once between processes of one "
                     "user (process_vm_readv)");
    return check("ptrace scope", "warn",
                 fmt::format("kernel.yama.ptrace_scope={}: sm put/get between processes that are "
                             "not parent and child fail with permission_denied",
                             scope),
                 "sysctl kernel.yama.ptrace_scope=0, or give the processes CAP_SYS_PTRACE "
                 "(containers: --cap-add SYS_PTRACE), or move bulk data over tcp");
}

Row dev_shm() {
    struct statvfs v {};
    struct stat st {};
    if (::statvfs("/dev/shm", &v) != 0 || ::stat("/dev/shm", &st) != 0)
        return check("/dev/shm", "fail", fmt::format("cannot read it: {}", std::strerror(errno)),
                     "mount a tmpfs at /dev/shm (sm:// keeps its rings and sockets there)");
    const double free_mb = double(v.f_bavail) * double(v.f_frsize) / 1e6;
    const double size_mb = double(v.f_blocks) * double(v.f_frsize) / 1e6;
    const bool writable = ::access("/dev/shm", W_OK) == 0;
    const bool sticky = (st.st_mode & S_ISVTX) != 0;
    std::string detail =
        fmt::format("{:.0f} MB, {:.0f} MB free, mode {:o}", size_mb, free_mb, st.st_mode & 07777);
    if (!writable)
        return check("/dev/shm", "fail", detail + ": not writable by this user",
                     "make it writable (mode 1777, as distributions mount it)");
    if (!sticky)
        return check("/dev/shm", "warn", detail + ": not sticky (others may remove our files)",
                     "chmod 1777 /dev/shm");
    // Each sm:// engine maps a ring per peer; tens of MB for a handful of peers.
    if (free_mb < 64)
        return check("/dev/shm", "warn", detail + ": little room for sm rings",
                     "grow the tmpfs (mount -o remount,size=1G /dev/shm; containers: --shm-size)");
    return check("/dev/shm", "ok", detail);
}

Row memlock() {
    rlimit r{};
    if (::getrlimit(RLIMIT_MEMLOCK, &r) != 0)
        return check("locked memory", "warn", std::strerror(errno));
    auto text = [](rlim_t v) {
        return v == RLIM_INFINITY ? std::string("unlimited") : fmt::format("{} KiB", v / 1024);
    };
    const std::string detail =
        fmt::format("RLIMIT_MEMLOCK soft {}, hard {}", text(r.rlim_cur), text(r.rlim_max));
    if (r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= (rlim_t(1) << 30))
        return check("locked memory", "ok", detail + ": RDMA registration has room");
    return check("locked memory", "warn",
                 detail +
                     ": RDMA providers (verbs, ucx+rc) pin every registered buffer and fail "
                     "past it",
                 "ulimit -l unlimited (memlock in /etc/security/limits.conf, LimitMEMLOCK= for "
                 "systemd, --ulimit memlock=-1 for containers); not needed for sm and tcp");
}

/// A section's rows whose `column` is not "-": for the libraries' summaries.
std::string usable(const Section& s, const char* name_col, const char* talaria_col, unsigned& n) {
    std::string names;
    n = 0;
    for (const auto& r : s.rows) {
        std::string name, scheme;
        for (const auto& [k, v] : r.cells) {
            if (k == name_col) name = v;
            if (k == talaria_col) scheme = v;
        }
        if (scheme.empty() || scheme == "-") continue;
        ++n;
        if (names.find(name) == std::string::npos) names += (names.empty() ? "" : ", ") + name;
    }
    return names;
}

Row library(const char* what, Section s, const char* name_col, const char* talaria_col) {
    unsigned n = 0;
    const std::string names = usable(s, name_col, talaria_col, n);
    if (n == 0)
        return check(what, "warn", s.title + ": nothing Talaria can use",
                     "install the provider for this fabric, or use sm and tcp");
    return check(what, "ok", fmt::format("{}: {}", s.title, names));
}

Row transports() {
    Section s = transports_section();
    std::string open, failed;
    for (const auto& r : s.rows) {
        std::string name, here, error;
        for (const auto& [k, v] : r.cells) {
            if (k == "transport") name = v;
            if (k == "here") here = v;
            if (k == "error") error = v;
        }
        if (here == "yes")
            open += (open.empty() ? "" : " ") + name;
        else
            failed += fmt::format("{}{} ({})", failed.empty() ? "" : "; ", name, error);
    }
    return check("transports", "ok",
                 "open here: " + open + (failed.empty() ? "" : "; not here: " + failed));
}

/// FI_OFI_RXM_* settings libfabric reads from the environment only: missing ones, with what to
/// set (the library says the same at info level when an rxm provider opens).
Row provider_env() {
    std::string missing, remedy;
    for (const na::EnvSetting& e : na::recommended_env()) {
        if (::getenv(e.name) != nullptr) continue;
        missing += fmt::format("{}{} is not set: {}", missing.empty() ? "" : "; ", e.name, e.why);
        remedy += fmt::format("{}{}={}", remedy.empty() ? "export " : " ", e.name, e.value);
    }
    if (missing.empty())
        return check("libfabric tuning", "ok",
                     "the FI_OFI_RXM_* settings Talaria relies on are set");
    return check("libfabric tuning", "warn", missing + " (ofi+tcp and ofi+verbs only)",
                 remedy +
                     " in the environment of every process before it opens ofi+ (libfabric "
                     "reads them once; Talaria never changes the environment)");
}

/// sm://NAME: reached as the library reaches it (its socket under /dev/shm, the peer's uid),
/// by a call from an sm engine of this process.
Row sm_check(const std::string& address) {
    try {
        Engine probe{"sm://"};
        auto ep = probe.try_lookup(address);
        if (!ep)
            return check("address", "fail", ep.error().describe(),
                         "write sm://NAME with the name the server opened");
        auto r = probe.remote<std::string()>(std::string(Engine::kHealthProcedure))
                     .on(*ep)
                     .timeout(std::chrono::seconds(3))()
                     .try_get();
        if (r || r.code() == Errc::not_found)
            return check("address", "ok",
                         fmt::format("{}: a live engine answers on its socket{}", address,
                                     r ? "" : " (it does not enable introspection)"));
        return check("address", "fail", fmt::format("{}: {}", address, r.error().message()),
                     "is the server running on this host, as this user (or in its sm_group)?");
    } catch (const Exception& e) {
        return check("address", "fail", e.what());
    }
}

Row port_check(const std::string& address) {
    auto url = na::parse_url(address);
    if (url && url->scheme == "sm") return sm_check(address);
    const bool tcp_family = url && (url->scheme == "tcp" || url->scheme == "ofi+tcp" ||
                                    url->scheme == "ucx+tcp" || url->scheme == "ofi+sockets");
    if (!tcp_family)
        return check("address", "warn",
                     fmt::format("{}: not a TCP or sm address (tcp://, ofi+tcp://, ucx+tcp://, "
                                 "sm://): nothing to try",
                                 address));
    auto sa = na::parse_host_port(url->rest, false);
    if (!sa)
        return check("address", "fail", fmt::format("{}: {}", address, sa.error().message()),
                     "check the host name (DNS, /etc/hosts) and write HOST:PORT");
    if (sa->port() == 0)
        return check("address", "warn", fmt::format("{}: no port to try", address));
    const std::string where = sa->to_string();
    const int fd = ::socket(sa->family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return check("address", "fail", std::strerror(errno));
    const auto t0 = std::chrono::steady_clock::now();
    int rc = ::connect(fd, sa->sa(), sa->len);
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        rc = ::poll(&p, 1, 3000);
        if (rc == 0) {
            ::close(fd);
            return check("address", "fail",
                         fmt::format("{}: no answer from {} in 3 s (filtered: a firewall drops "
                                     "the connection, or the host is down)",
                                     address, where),
                         "open the port in the firewall (iptables/nftables, cloud security "
                         "group), or check that the host is up");
        }
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ::close(fd);
    if (err == ECONNREFUSED)
        return check("address", "fail",
                     fmt::format("{}: connection refused by {} (ECONNREFUSED) after {:.2f} ms",
                                 address, where, ms),
                     "is the server running, and listening on that address and port?");
    if (err != 0)
        return check("address", "fail",
                     fmt::format("{}: {}: {}", address, where, std::strerror(err)),
                     "check the route to the host (ip route get HOST) and its firewall");
    return check(
        "address", "ok",
        fmt::format("{}: {} accepts TCP connections (connect in {:.2f} ms)", address, where, ms));
}

}  // namespace

Section doctor_section(const std::string& address) {
    Section s;
    s.key = "doctor";
    s.title = "What commonly breaks, checked on this host";
    s.as_lines = true;
    s.rows.push_back(transports());
    s.rows.push_back(ptrace_scope());
    s.rows.push_back(dev_shm());
    s.rows.push_back(memlock());
#if TALARIA_HAVE_OFI
    s.rows.push_back(library("libfabric", libfabric_section(), "provider", "talaria"));
    s.rows.push_back(provider_env());
#else
    s.rows.push_back(
        check("libfabric", "ok", "not built into this Talaria (ofi+ addresses refused)"));
#endif
#if TALARIA_HAVE_UCX
    s.rows.push_back(library("UCX", ucx_section(), "transport", "talaria"));
#else
    s.rows.push_back(check("UCX", "ok", "not built into this Talaria (ucx+ addresses refused)"));
#endif
    if (!address.empty()) s.rows.push_back(port_check(address));
    return s;
}

}  // namespace talaria::info
