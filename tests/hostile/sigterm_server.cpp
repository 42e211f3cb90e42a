// `sigterm_server <address>`: a service with a graceful stop, as users write one against the
// installed library. It installs its SIGTERM handler, then opens a listening talaria::Engine on
// `address` (the libfabric and UCX transports are plugins of the shared library, loaded at this
// first open), prints the engine's address, and waits. At SIGTERM it closes the engine, prints
// "stopped by SIGTERM" and exits 0; after 60 s without one it exits 3. A transport whose set-up
// took SIGTERM for itself makes it exit otherwise (libinfinipath's handler exits 1).
#include <talaria/talaria.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

namespace {
volatile std::sig_atomic_t g_terminated = 0;
extern "C" void on_sigterm(int) {
    g_terminated = 1;
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: sigterm_server <address>\n");
        return 2;
    }
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    if (::sigaction(SIGTERM, &sa, nullptr) != 0) return 1;
    std::signal(SIGPIPE, SIG_IGN);  // the test may die first
    std::optional<talaria::Engine> engine;
    try {
        engine.emplace(argv[1], talaria::listen);
        engine->define("echo", [](std::string s) { return s; });
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sigterm_server: %s\n", e.what());
        return 1;
    }
    std::printf("%s\n", engine->self_address().c_str());
    std::fflush(stdout);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!g_terminated && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!g_terminated) return 3;
    engine.reset();
    std::printf("stopped by SIGTERM\n");
    std::fflush(stdout);
    return 0;
}
