#include "netns.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

extern char** environ;

namespace talaria::na::test {

namespace {

/// The first of these that exists, or "".
std::string ip_tool() {
    for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
        if (::access(p, X_OK) == 0) return p;
    return {};
}

/// Run `ip args...` quietly; its stderr (first line) in `*err` when it fails.
bool run_ip(const std::vector<std::string>& args, std::string* err = nullptr) {
    static const std::string tool = ip_tool();
    if (tool.empty()) {
        if (err) *err = "iproute2's ip is not installed";
        return false;
    }
    std::vector<std::string> copies{tool};
    copies.insert(copies.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : copies)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    int errpipe[2];
    if (::pipe2(errpipe, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, errpipe[1], 2);
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, tool.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(errpipe[1]);
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = ::read(errpipe[0], buf, sizeof buf)) > 0)
        text.append(buf, std::size_t(n));
    ::close(errpipe[0]);
    if (rc != 0) {
        if (err) *err = std::string("posix_spawn of ip: ") + std::strerror(rc);
        return false;
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    if (err) {
        std::string cmd = "ip";
        for (const std::string& a : args)
            cmd += " " + a;
        *err = cmd + ": " + text.substr(0, text.find('\n'));
    }
    return false;
}

std::atomic<int> next_set{0};

}  // namespace

void Hosts::remove_stale() {
    DIR* d = ::opendir("/run/netns");
    if (!d) return;
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n.rfind("tlr", 0) != 0) continue;
        const pid_t pid = pid_t(std::atol(n.c_str() + 3));
        if (pid <= 0 || n.find('-') == std::string::npos) continue;
        if (::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : stale)
        (void)run_ip({"netns", "delete", n});
}

std::unique_ptr<Hosts> Hosts::create(int n, std::string* why) {
    if (::geteuid() != 0) {
        *why = "emulated hosts need root (network namespaces and veth pairs)";
        return nullptr;
    }
    if (ip_tool().empty()) {
        *why = "emulated hosts need iproute2's ip (apt-get install iproute2)";
        return nullptr;
    }
    remove_stale();
    std::unique_ptr<Hosts> h(new Hosts());
    const std::string base =
        "tlr" + std::to_string(::getpid()) + "-" + std::to_string(next_set.fetch_add(1));
    h->bridge_ = base + "-br";
    std::string err;
    auto fail = [&](const std::string& what) {
        *why = "cannot emulate hosts with network namespaces here (" + what + ")";
        return nullptr;
    };
    if (!run_ip({"netns", "add", h->bridge_}, &err)) return fail(err);
    if (!run_ip({"-n", h->bridge_, "link", "add", "br0", "type", "bridge"}, &err) ||
        !run_ip({"-n", h->bridge_, "link", "set", "br0", "up"}, &err))
        return fail(err);
    for (int i = 0; i < n; ++i) {
        const std::string name = base + "-h" + std::to_string(i);
        if (!run_ip({"netns", "add", name}, &err)) return fail(err);
        h->names_.push_back(name);
        const std::string port = "p" + std::to_string(i);
        if (!run_ip({"-n", h->bridge_, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                     "netns", name},
                    &err) ||
            !run_ip({"-n", h->bridge_, "link", "set", port, "master", "br0", "up"}, &err) ||
            !run_ip({"-n", name, "addr", "add", h->ip(i) + "/24", "dev", "eth0"}, &err) ||
            !run_ip({"-n", name, "link", "set", "eth0", "up"}, &err) ||
            !run_ip({"-n", name, "link", "set", "lo", "up"}, &err))
            return fail(err);
        const int fd = ::open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return fail("open /run/netns/" + name + ": " + std::strerror(errno));
        h->fds_.push_back(fd);
    }
    return h;
}

Hosts::~Hosts() {
    for (int fd : fds_)
        ::close(fd);
    for (const std::string& n : names_)
        (void)run_ip({"netns", "delete", n});
    if (!bridge_.empty()) (void)run_ip({"netns", "delete", bridge_});
}

std::string Hosts::ip(int i) const {
    return "10.200.0." + std::to_string(i + 1);
}

}  // namespace talaria::na::test
