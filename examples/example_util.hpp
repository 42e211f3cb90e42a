// Scaffolding shared by the examples, not part of Talaria's API: each example is one binary that
// runs its server half in a child process (the same binary, "server <address>") and its client
// half in the parent, so one command shows two processes talking.
//
//   ./01_hello                     tcp on 127.0.0.1 (default)
//   ./01_hello sm://               shared memory
//   ./01_hello server tcp://0.0.0.0:5000      just the server (prints its address)
//   ./01_hello client tcp://10.0.0.2:5000     just the client, against a running server
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

namespace example {

/// The address a client engine opens for a server address: same transport, any local port.
inline std::string client_address_for(const std::string& server) {
    if (server.rfind("tcp://[", 0) == 0) return "tcp://[::1]:0";
    if (server.rfind("tcp://", 0) == 0) return "tcp://";
    if (server.rfind("inproc://", 0) == 0) return "inproc://example-client";
    // ofi+tcp://host:port, ucx+tcp://host:port: the same host (so the same interface), any port.
    auto scheme_end = server.find("://");
    auto colon = server.rfind(':');
    if (server.find('+') < scheme_end && colon != std::string::npos && colon > scheme_end + 2)
        return server.substr(0, colon) + ":0";
    return server.substr(0, scheme_end) + "://";
}

/// Tell where the server listens: on stdout, and to the parent example process when it
/// started us (it passes a pipe in TALARIA_EXAMPLE_FD).
inline void announce(const std::string& address) {
    std::printf("server listening at %s\n", address.c_str());
    std::fflush(stdout);
    if (const char* fd = std::getenv("TALARIA_EXAMPLE_FD")) {
        std::string line = "ADDRESS " + address + "\n";
        [[maybe_unused]] auto n = ::write(std::atoi(fd), line.data(), line.size());
        ::close(std::atoi(fd));
    }
}

/// The server half, running as a child process.
class ServerProcess {
  public:
    ServerProcess(const char* self, const std::string& listen_address) {
        int fds[2];
        if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
        pid_ = ::fork();
        if (pid_ < 0) throw std::runtime_error("fork failed");
        if (pid_ == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the example
            ::close(fds[0]);
            ::setenv("TALARIA_EXAMPLE_FD", std::to_string(fds[1]).c_str(), 1);
            ::execl("/proc/self/exe", self, "server", listen_address.c_str(),
                    static_cast<char*>(nullptr));
            std::_Exit(127);
        }
        ::close(fds[1]);
        FILE* in = ::fdopen(fds[0], "r");
        char line[512];
        while (std::fgets(line, sizeof line, in)) {
            std::string s(line);
            if (s.rfind("ADDRESS ", 0) == 0) {
                address_ = s.substr(8, s.find_last_not_of("\r\n") - 7);
                break;
            }
        }
        std::fclose(in);
        if (address_.empty()) throw std::runtime_error("the server process did not start");
    }
    ServerProcess(const ServerProcess&) = delete;
    ServerProcess& operator=(const ServerProcess&) = delete;
    /// Waits for the server to exit (it does after the client's "shutdown" call), then kills it.
    ~ServerProcess() {
        for (int i = 0; i < 500; ++i) {
            int status;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
    [[nodiscard]] const std::string& address() const { return address_; }

  private:
    pid_t pid_ = -1;
    std::string address_;
};

/// The main() of every example. `NAME server ADDRESS` serves; `NAME client ADDRESS [ARG]` runs
/// the client against a server already running; `NAME [ADDRESS [ARG]]` (ADDRESS by default
/// tcp://127.0.0.1:0) starts the server half in a child process and runs the client against
/// it. `client(server_address)`, or `client(server_address, ARG)` where it takes ARG ("" when
/// none is given). An exception is printed as `NAME: what` and exits with 1.
template <class Serve, class Client>
int run(int argc, char** argv, const char* name, Serve serve, Client client) {
    auto run_client = [&](const std::string& address, const char* arg) {
        if constexpr (std::is_invocable_v<Client&, const std::string&, const std::string&>)
            return client(address, std::string(arg ? arg : ""));
        else
            return client(address);
    };
    try {
        std::string mode = argc > 1 ? argv[1] : "tcp://127.0.0.1:0";
        if (mode == "server") return serve(std::string(argc > 2 ? argv[2] : "tcp://127.0.0.1:0"));
        if (mode == "client" && argc > 2) return run_client(argv[2], argc > 3 ? argv[3] : nullptr);
        ServerProcess server(argv[0], mode);  // the server half, in another process
        return run_client(server.address(), argc > 2 ? argv[2] : nullptr);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
        return 1;
    }
}

}  // namespace example
