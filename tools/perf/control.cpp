// talaria-perf: control channel, sockets, the server child process, CPU placement.
#include "control.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace talaria::perf {

Fd& Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = o.release();
    }
    return *this;
}

Fd::~Fd() {
    if (fd_ >= 0) ::close(fd_);
}

Result<HostPort> parse_host_port(std::string_view s) {
    HostPort hp;
    std::string_view port;
    if (!s.empty() && s.front() == '[') {
        auto close = s.find(']');
        if (close == std::string_view::npos)
            return Error(Errc::address_invalid,
                         fmt::format("'{}': missing ']' after IPv6 host", s));
        hp.host = std::string(s.substr(1, close - 1));
        auto rest = s.substr(close + 1);
        if (!rest.empty()) {
            if (rest.front() != ':')
                return Error(Errc::address_invalid, fmt::format("'{}': expected ':port'", s));
            port = rest.substr(1);
        }
    } else {
        auto colon = s.rfind(':');
        if (colon == std::string_view::npos) {
            hp.host = std::string(s);
        } else {
            hp.host = std::string(s.substr(0, colon));
            port = s.substr(colon + 1);
        }
    }
    if (!port.empty()) {
        unsigned v = 0;
        auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
        if (ec != std::errc() || p != port.data() + port.size() || v > 65535)
            return Error(Errc::address_invalid,
                         fmt::format("'{}': port '{}' is not a number in 0..65535", s, port));
        hp.port = static_cast<uint16_t>(v);
    }
    if (hp.host.empty()) hp.host = "0.0.0.0";
    return hp;
}

Result<HostPort> host_port_of_url(std::string_view url) {
    auto sep = url.find("://");
    if (sep == std::string_view::npos)
        return Error(Errc::address_invalid, fmt::format("'{}' is not scheme://address", url));
    return parse_host_port(url.substr(sep + 3));
}

namespace {

Result<addrinfo*> resolve(const HostPort& hp, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo* res = nullptr;
    std::string port = std::to_string(hp.port);
    int rc = ::getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0 || !res)
        return Error(Errc::unreachable,
                     fmt::format("cannot resolve '{}': {}", hp.host, ::gai_strerror(rc)));
    return res;
}

Result<void> wait_fd(int fd, short events, TimePoint deadline, std::string_view what) {
    for (;;) {
        pollfd p{fd, events, 0};
        int rc = ::poll(&p, 1, ms_until(deadline));
        if (rc > 0) return ok();
        if (rc == 0)
            return Error(Errc::timeout, fmt::format("timed out waiting to {} (peer silent)", what));
        if (errno != EINTR) return errno_error(fmt::format("poll to {}", what), errno);
    }
}

}  // namespace

Result<Fd> tcp_listen(const HostPort& hp) {
    TALARIA_TRY(res, resolve(hp, true));
    Error last(Errc::unreachable, "no address");
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
        if (!fd.valid()) {
            last = errno_error("socket", errno);
            continue;
        }
        int one = 1;
        ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 16) != 0) {
            last = errno_error(fmt::format("bind/listen on {}:{}", hp.host, hp.port), errno);
            continue;
        }
        ::freeaddrinfo(res);
        return fd;
    }
    ::freeaddrinfo(res);
    return last;
}

Result<std::string> local_address(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
        return errno_error("getsockname", errno);
    char host[INET6_ADDRSTRLEN] = {};
    if (ss.ss_family == AF_INET) {
        auto* a = reinterpret_cast<sockaddr_in*>(&ss);
        ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        return fmt::format("{}:{}", host, ntohs(a->sin_port));
    }
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
}

Result<Fd> tcp_accept(int listen_fd, Duration timeout) {
    TALARIA_CHECK(wait_fd(listen_fd, POLLIN, deadline_after(timeout), "accept a client"));
    Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) return errno_error("accept", errno);
    return fd;
}

Result<Fd> tcp_connect(const HostPort& hp, Duration timeout) {
    TALARIA_TRY(res, resolve(hp, false));
    Error last(Errc::unreachable, "no address");
    TimePoint deadline = deadline_after(timeout);
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!fd.valid()) {
            last = errno_error("socket", errno);
            continue;
        }
        if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
            if (errno != EINPROGRESS) {
                last = errno_error(fmt::format("connect to {}:{}", hp.host, hp.port), errno);
                continue;
            }
            auto w = wait_fd(fd.get(), POLLOUT, deadline, "connect");
            if (!w) {
                last = w.error();
                continue;
            }
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
            if (err != 0) {
                last = errno_error(fmt::format("connect to {}:{}", hp.host, hp.port), err);
                continue;
            }
        }
        int flags = ::fcntl(fd.get(), F_GETFL);
        ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
        ::freeaddrinfo(res);
        return fd;
    }
    ::freeaddrinfo(res);
    return last;
}

Result<void> tune_socket(int fd, Duration io_timeout) {
    int one = 1;
    if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        return errno_error("setsockopt TCP_NODELAY", errno);
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(io_timeout).count();
    timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
        return errno_error("setsockopt SO_RCVTIMEO/SO_SNDTIMEO", errno);
    return ok();
}

Result<void> send_all(int fd, const void* data, std::size_t len) {
    auto* p = static_cast<const char*>(data);
    while (len > 0) {
        ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return Error(Errc::timeout, "send timed out: the peer stopped reading");
            return errno_error("send", errno);
        }
        p += n;
        len -= static_cast<std::size_t>(n);
    }
    return ok();
}

Result<void> recv_all(int fd, void* data, std::size_t len) {
    auto* p = static_cast<char*>(data);
    while (len > 0) {
        ssize_t n = ::recv(fd, p, len, 0);
        if (n == 0) return Error(Errc::disconnected, "the peer closed the control connection");
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return Error(Errc::timeout, "receive timed out: the peer went silent");
            return errno_error("recv", errno);
        }
        p += n;
        len -= static_cast<std::size_t>(n);
    }
    return ok();
}

Result<void> ctl_send(int fd, const CtlRequest& r) {
    return send_all(fd, &r, sizeof r);
}
Result<void> ctl_send(int fd, const CtlReply& r) {
    return send_all(fd, &r, sizeof r);
}

Result<CtlRequest> ctl_recv_request(int fd) {
    CtlRequest r;
    TALARIA_CHECK(recv_all(fd, &r, sizeof r));
    if (r.magic != kCtlMagic || r.cmd < uint32_t(Cmd::hello) || r.cmd > uint32_t(Cmd::quit))
        return Error(Errc::protocol_error,
                     fmt::format("bad control request (magic {:#x}, command {}): not a "
                                 "talaria-perf client of this version",
                                 r.magic, r.cmd));
    r.name[sizeof r.name - 1] = '\0';
    return r;
}

Result<CtlReply> ctl_recv_reply(int fd) {
    CtlReply r;
    TALARIA_CHECK(recv_all(fd, &r, sizeof r));
    if (r.magic != kCtlMagic || r.status > uint32_t(Errc::internal))
        return Error(Errc::protocol_error,
                     fmt::format("bad control reply (magic {:#x}, status {}): not a talaria-perf "
                                 "server of this version",
                                 r.magic, r.status));
    r.text[sizeof r.text - 1] = '\0';
    return r;
}

Result<CtlReply> ctl_call(int fd, const CtlRequest& r) {
    TALARIA_CHECK(ctl_send(fd, r));
    TALARIA_TRY(reply, ctl_recv_reply(fd));
    if (reply.status != 0)
        return Error(static_cast<Errc>(reply.status),
                     fmt::format("server: {}", fixed_text(reply.text, sizeof reply.text)));
    return reply;
}

CtlReply ctl_error(const Error& e) {
    CtlReply r;
    r.status = static_cast<uint32_t>(e.code() == Errc::ok ? Errc::internal : e.code());
    set_text(r.text, sizeof r.text, e.message().empty() ? errc_name(e.code()) : e.message());
    return r;
}

std::string fixed_text(const char* field, std::size_t size) {
    return std::string(field, strnlen(field, size));
}

void set_text(char* field, std::size_t size, std::string_view text) {
    std::size_t n = std::min(text.size(), size - 1);
    std::memcpy(field, text.data(), n);
    field[n] = '\0';
}

// --- the server child process ----------------------------------------------------------------

ServerProcess::~ServerProcess() {
    stop(std::chrono::milliseconds(500));
}

Result<void> ServerProcess::start(const std::vector<std::string>& args, int cpu, bool commands) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) return errno_error("pipe2", errno);
    int infd[2] = {-1, -1};
    if (commands && ::pipe2(infd, O_CLOEXEC) != 0) {
        int e = errno;
        ::close(pipefd[0]);
        ::close(pipefd[1]);
        return errno_error("pipe2", e);
    }
    // Everything the child needs is built before fork: only async-signal-safe calls after.
    std::vector<std::string> all{"talaria-perf"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (cpu >= 0) CPU_SET(cpu, &set);
    pid_t parent = ::getpid();

    pid_t pid = ::fork();
    if (pid < 0) {
        int e = errno;
        for (int fd : {pipefd[0], pipefd[1], infd[0], infd[1]})
            if (fd >= 0) ::close(fd);
        return errno_error("fork", e);
    }
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
        ::dup2(pipefd[1], STDOUT_FILENO);         // dup2 clears O_CLOEXEC on the copy
        if (infd[0] >= 0) ::dup2(infd[0], STDIN_FILENO);
        if (cpu >= 0) ::sched_setaffinity(0, sizeof set, &set);
        ::execv("/proc/self/exe", argv.data());
        ::_exit(127);
    }
    ::close(pipefd[1]);
    if (infd[0] >= 0) ::close(infd[0]);
    pid_ = pid;
    out_fd_ = pipefd[0];
    in_fd_ = infd[1];
    return ok();
}

Result<void> ServerProcess::write_line(std::string_view line) {
    if (in_fd_ < 0) return Error(Errc::invalid_argument, "the child takes no commands");
    std::string buf(line);
    buf.push_back('\n');
    std::size_t off = 0;
    while (off < buf.size()) {
        ssize_t n = ::write(in_fd_, buf.data() + off, buf.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno_error("write to the child's stdin", errno);
        off += std::size_t(n);
    }
    return ok();
}

Result<std::string> ServerProcess::read_line(Duration timeout) {
    TimePoint deadline = deadline_after(timeout);
    for (;;) {
        auto nl = buffered_.find('\n');
        if (nl != std::string::npos) {
            std::string line = buffered_.substr(0, nl);
            buffered_.erase(0, nl + 1);
            return line;
        }
        if (buffered_.size() > 64 * 1024)
            return Error(Errc::protocol_error, "the server printed an over-long line");
        pollfd p{out_fd_, POLLIN, 0};
        int rc = ::poll(&p, 1, ms_until(deadline));
        if (rc == 0)
            return Error(Errc::timeout, "the server process did not print its address in time");
        if (rc < 0) {
            if (errno == EINTR) continue;
            return errno_error("poll on the server's stdout", errno);
        }
        char buf[4096];
        ssize_t n = ::read(out_fd_, buf, sizeof buf);
        if (n == 0)
            return Error(Errc::disconnected,
                         "the server process exited before printing its address (see its "
                         "messages above)");
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno_error("read from the server's stdout", errno);
        }
        buffered_.append(buf, static_cast<std::size_t>(n));
    }
}

void ServerProcess::stop(Duration grace) {
    if (in_fd_ >= 0) {  // EOF on its stdin: a worker's signal to exit
        ::close(in_fd_);
        in_fd_ = -1;
    }
    if (out_fd_ >= 0) {
        ::close(out_fd_);
        out_fd_ = -1;
    }
    if (pid_ <= 0) return;
    TimePoint deadline = deadline_after(grace);
    for (;;) {
        int st = 0;
        pid_t r = ::waitpid(pid_, &st, WNOHANG);
        if (r == pid_ || (r < 0 && errno != EINTR)) break;
        if (Clock::now() >= deadline) {
            ::kill(pid_, SIGKILL);
            while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
            }
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
}

std::vector<int> allowed_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> v;
    if (::sched_getaffinity(0, sizeof set, &set) != 0) return v;
    for (int i = 0; i < CPU_SETSIZE; ++i)
        if (CPU_ISSET(i, &set)) v.push_back(i);
    return v;
}

Result<void> pin_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0)
        return errno_error(fmt::format("sched_setaffinity to CPU {}", cpu), errno);
    return ok();
}

Result<void> set_realtime(int priority) {
    sched_param sp{};
    sp.sched_priority = priority;
    if (::sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
        return errno_error(fmt::format("sched_setscheduler(SCHED_FIFO, {}) (needs "
                                       "CAP_SYS_NICE or an RLIMIT_RTPRIO)",
                                       priority),
                           errno);
    return ok();
}

}  // namespace talaria::perf
