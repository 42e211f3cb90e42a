// talaria-perf: child processes for the external baselines (see external.hpp).
#include "external.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace talaria::perf {

namespace {

/// Largest amount of output kept per stream (the programs print a few lines).
constexpr std::size_t kMaxOutput = 256 * 1024;

bool executable(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
}

/// Whether some socket listens on TCP `port` (any address), from /proc/net/tcp{,6}.
bool listening(uint16_t port) {
    for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::ifstream f(file);
        std::string line;
        std::getline(f, line);  // header
        while (std::getline(f, line)) {
            // "  sl  local_address rem_address   st ..." with local_address "HEXADDR:HEXPORT"
            char local[128] = {}, remote[128] = {};
            unsigned st = 0;
            if (std::sscanf(line.c_str(), "%*s %127s %127s %x", local, remote, &st) != 3) continue;
            const char* colon = std::strrchr(local, ':');
            if (!colon) continue;
            unsigned long p = std::strtoul(colon + 1, nullptr, 16);
            if (p == port && st == 0x0A) return true;  // TCP_LISTEN
        }
    }
    return false;
}

}  // namespace

Result<std::string> find_program(const std::string& program, const std::string& package) {
    auto missing = [&](std::string where) {
        return Error(Errc::not_found,
                     fmt::format("{} not found{}: install the Debian package {}", program, where,
                                 package.empty() ? "that provides it" : package));
    };
    if (program.find('/') != std::string::npos) {
        if (executable(program)) return program;
        return missing("");
    }
    const char* path = std::getenv("PATH");
    std::string_view rest = path ? path : "/usr/local/bin:/usr/bin:/bin";
    while (!rest.empty()) {
        auto colon = rest.find(':');
        std::string dir(rest.substr(0, colon));
        rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
        if (dir.empty()) continue;
        std::string full = dir + "/" + program;
        if (executable(full)) return full;
    }
    return missing(" in PATH");
}

Result<void> Child::start(const ChildSpec& spec) {
    if (spec.argv.empty()) return Error(Errc::invalid_argument, "empty command line");
    name_ = spec.argv[0];
    TALARIA_TRY(path, find_program(spec.argv[0], spec.package));
    // Everything the child needs is built before fork: only async-signal-safe calls after.
    std::vector<std::string> args = spec.argv;
    std::vector<char*> argv;
    for (auto& a : args)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> envs;
    for (char** e = environ; e && *e; ++e) {
        std::string_view kv(*e);
        bool replaced = false;
        for (const auto& [k, v] : spec.env)
            if (kv.size() > k.size() && kv.substr(0, k.size()) == k && kv[k.size()] == '=')
                replaced = true;
        if (!replaced) envs.emplace_back(kv);
    }
    for (const auto& [k, v] : spec.env)
        envs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : envs)
        envp.push_back(e.data());
    envp.push_back(nullptr);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (spec.cpu >= 0) CPU_SET(spec.cpu, &set);

    int outp[2], errp[2];
    if (::pipe2(outp, O_CLOEXEC) != 0) return errno_error("pipe2", errno);
    if (::pipe2(errp, O_CLOEXEC) != 0) {
        int e = errno;
        ::close(outp[0]);
        ::close(outp[1]);
        return errno_error("pipe2", e);
    }
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
        int e = errno;
        for (int fd : {outp[0], outp[1], errp[0], errp[1]})
            ::close(fd);
        return errno_error("fork", e);
    }
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
        ::dup2(outp[1], STDOUT_FILENO);
        ::dup2(errp[1], STDERR_FILENO);
        if (spec.cpu >= 0) ::sched_setaffinity(0, sizeof set, &set);
        ::execve(path.c_str(), argv.data(), envp.data());
        ::_exit(127);
    }
    ::close(outp[1]);
    ::close(errp[1]);
    pid_ = pid;
    out_fd_ = outp[0];
    err_fd_ = errp[0];
    reaped_ = false;
    out_.clear();
    err_.clear();
    return ok();
}

void Child::drain(int timeout_ms) {
    pollfd p[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    int n = 0;
    if (out_fd_ >= 0) ++n;
    if (err_fd_ >= 0) ++n;
    if (n == 0) {
        if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
        return;
    }
    if (::poll(p, 2, timeout_ms) <= 0) return;
    int* fds[2] = {&out_fd_, &err_fd_};
    std::string* bufs[2] = {&out_, &err_};
    for (int i = 0; i < 2; ++i) {
        if (*fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[4096];
        ssize_t r = ::read(*fds[i], buf, sizeof buf);
        if (r > 0) {
            if (bufs[i]->size() < kMaxOutput) bufs[i]->append(buf, static_cast<std::size_t>(r));
        } else if (r == 0 || errno != EINTR) {
            ::close(*fds[i]);
            *fds[i] = -1;
        }
    }
}

bool Child::exited() {
    if (pid_ <= 0) return true;
    drain(0);
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
        status_ = st;
        reaped_ = true;
        pid_ = -1;
        // The pipes may still hold the last output.
        for (int i = 0; i < 100 && (out_fd_ >= 0 || err_fd_ >= 0); ++i)
            drain(10);
        return true;
    }
    return false;
}

Result<int> Child::wait(TimePoint deadline) {
    for (;;) {
        if (exited()) return status_;
        if (Clock::now() >= deadline)
            return Error(Errc::timeout, fmt::format("{} did not finish in time", name_));
        drain(std::clamp(ms_until(deadline), 1, 20));
    }
}

void Child::kill_and_reap() noexcept {
    if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        int st = 0;
        while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
        }
        status_ = st;
        reaped_ = true;
        pid_ = -1;
    }
    for (int* fd : {&out_fd_, &err_fd_})
        if (*fd >= 0) {
            ::close(*fd);
            *fd = -1;
        }
}

std::string Child::status_text() const {
    if (!reaped_) return "still running";
    if (WIFEXITED(status_)) return fmt::format("exit status {}", WEXITSTATUS(status_));
    if (WIFSIGNALED(status_)) return fmt::format("killed by signal {}", WTERMSIG(status_));
    return fmt::format("wait status {}", status_);
}

std::string Child::tail(std::size_t max_chars) const {
    std::string all = err_;
    if (!out_.empty()) all += (all.empty() ? "" : " | ") + out_;
    for (char& c : all)
        if (c == '\n' || c == '\r') c = ' ';
    while (!all.empty() && all.back() == ' ')
        all.pop_back();
    if (all.size() > max_chars) all = "..." + all.substr(all.size() - max_chars);
    return all.empty() ? "(no output)" : all;
}

Result<uint16_t> free_tcp_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno_error("socket", errno);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        int e = errno;
        ::close(fd);
        return errno_error("bind/getsockname of a free port", e);
    }
    ::close(fd);
    return ntohs(a.sin_port);
}

std::string command_text(const ChildSpec& spec) {
    std::string s;
    for (const auto& [k, v] : spec.env)
        s += fmt::format("{}={} ", k, v);
    for (std::size_t i = 0; i < spec.argv.size(); ++i)
        s += (i ? " " : "") + spec.argv[i];
    return s;
}

Result<std::string> run_pair(const ChildSpec& server_spec, const ChildSpec& client_spec,
                             uint16_t port, Duration timeout) {
    TimePoint deadline = deadline_after(timeout);
    Child server, client;
    TALARIA_CHECK(server.start(server_spec));
    const TimePoint started = Clock::now();
    // Wait for the server's listening socket: connecting to it ourselves would take the one
    // connection the program accepts.
    while (!listening(port)) {
        if (server.exited())
            return Error(
                Errc::io_error,
                fmt::format("`{}` exited before listening on port {} ({}): {}",
                            command_text(server_spec), port, server.status_text(), server.tail()));
        if (Clock::now() >= deadline) {
            server.kill_and_reap();
            return Error(
                Errc::timeout,
                fmt::format("`{}` did not listen on port {} within {} ms (killed): {}",
                            command_text(server_spec), port,
                            std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(),
                            server.tail()));
        }
        // Reading /proc/net/tcp costs system time: often at first, then every 20 ms.
        bool early = Clock::now() - started < std::chrono::milliseconds(200);
        std::this_thread::sleep_for(std::chrono::milliseconds(early ? 2 : 20));
    }
    TALARIA_CHECK(client.start(client_spec));
    auto fail = [&](Errc code, Child& who, const ChildSpec& spec, std::string_view what) {
        client.kill_and_reap();
        server.kill_and_reap();
        return Error(code, fmt::format("`{}` {} ({}): {}", command_text(spec), what,
                                       who.status_text(), who.tail()));
    };
    auto cw = client.wait(deadline);
    if (!cw) return fail(Errc::timeout, client, client_spec, "timed out (killed)");
    if (!WIFEXITED(*cw) || WEXITSTATUS(*cw) != 0) {
        // The server's output usually says why (e.g. a provider error): let it finish
        // printing (it exits once the client is gone), briefly.
        (void)server.wait(std::min(deadline, deadline_after(std::chrono::seconds(1))));
        std::string why = fmt::format("; server: {}", server.tail());
        auto e = fail(Errc::io_error, client, client_spec, "failed");
        return Error(e.code(), e.message() + why);
    }
    // The server finishes its side right after the client; give it a moment, then kill.
    auto sw = server.wait(std::min(deadline, deadline_after(std::chrono::seconds(3))));
    if (!sw) server.kill_and_reap();
    return client.out();
}

}  // namespace talaria::perf
