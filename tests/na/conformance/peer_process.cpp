#include "peer_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <thread>
#include <vector>

namespace talaria::na::test {

using namespace std::chrono_literals;

std::unique_ptr<PeerProcess> PeerProcess::spawn(const std::string& path, const std::string& address,
                                                std::string* err) {
    return spawn(path, std::vector<std::string>{address}, err);
}

std::unique_ptr<PeerProcess> PeerProcess::spawn(const std::string& path,
                                                const std::vector<std::string>& args,
                                                std::string* err, int netns_fd) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) < 0) {
        *err = "pipe2 failed";
        return nullptr;
    }
    if (::pipe2(out, O_CLOEXEC) < 0) {
        ::close(in[0]);
        ::close(in[1]);
        *err = "pipe2 failed";
        return nullptr;
    }
    // Everything the child needs is made before fork: it only calls async-signal-safe functions.
    std::string exe = path;
    std::vector<std::string> copies(args);
    std::vector<char*> argv{exe.data()};
    for (std::string& a : copies)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) {
        for (int fd : {in[0], in[1], out[0], out[1]})
            ::close(fd);
        *err = "fork failed";
        return nullptr;
    }
    if (pid == 0) {
        if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) ::_exit(126);
        ::dup2(in[0], 0);
        ::dup2(out[1], 1);
        ::execv(exe.c_str(), argv.data());
        ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    auto p = std::unique_ptr<PeerProcess>(new PeerProcess(pid, in[1], out[0]));
    auto a = p->read_line(10s);
    if (!a) {
        auto st = p->wait_exit(Duration(0));
        *err = st && *st == 126
                   ? "setns into the network namespace failed"
                   : "the peer did not print its first line within 10 s (see its stderr)";
        return nullptr;
    }
    p->address = *a;
    return p;
}

PeerProcess::~PeerProcess() {
    close_stdin();
    if (from_child_ >= 0) ::close(from_child_);
    if (pid_ > 0 && !wait_exit(3s)) {
        ::kill(pid_, SIGKILL);
        (void)wait_exit(5s);
    }
}

void PeerProcess::kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    (void)wait_exit(5s);
}

void PeerProcess::close_stdin() {
    if (to_child_ >= 0) ::close(to_child_);
    to_child_ = -1;
}

std::optional<int> PeerProcess::wait_exit(Duration timeout) {
    if (pid_ <= 0) return status_;
    auto deadline = Clock::now() + timeout;
    for (;;) {
        int st = 0;
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {
            pid_ = -1;
            status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            return status_;
        }
        if (Clock::now() >= deadline) return std::nullopt;
        std::this_thread::sleep_for(10ms);
    }
}

std::optional<std::string> PeerProcess::read_line(Duration timeout) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
        if (auto nl = pending_.find('\n'); nl != std::string::npos) {
            std::string line = pending_.substr(0, nl);
            pending_.erase(0, nl + 1);
            return line;
        }
        pollfd p{from_child_, POLLIN, 0};
        int wait = timeout == Duration(0) ? 0 : std::max(ms_until(deadline), 0);
        if (::poll(&p, 1, wait) <= 0) return std::nullopt;
        char buf[256];
        ssize_t n = ::read(from_child_, buf, sizeof buf);
        if (n <= 0) return std::nullopt;
        pending_.append(buf, std::size_t(n));
        if (pending_.size() > 4096) return std::nullopt;
    }
}

std::optional<std::string> peer_start(std::string_view name, int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %.*s <address>\n", int(name.size()), name.data());
        return std::nullopt;
    }
    ::alarm(60);  // never outlive a test run
    std::signal(SIGPIPE, SIG_IGN);
    return std::string(argv[1]);
}

void print_line(std::string_view line) {
    std::printf("%.*s\n", int(line.size()), line.data());
    std::fflush(stdout);
}

bool stdin_closed() {
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR)) return true;
    char c;
    return ::read(0, &c, 1) <= 0;
}

}  // namespace talaria::na::test
