// The API suite's peer process, a server as users run one: `api_peer <address> [contexts [key]]`
// opens a listening talaria::Engine on `address` with `contexts` RPC contexts (1 when not given)
// and, given `key`, a shared secret known by that key id (32 bytes of 's'), defines
// "echo" (uint64_t(uint64_t)) and "pid" (int64_t()), prints its address on stdout (one line) and
// serves until its stdin closes (the test closed it or died) or 60 seconds pass.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "talaria/talaria.hpp"

using namespace std::chrono_literals;

namespace {
bool stdin_closed() {
    char c;
    return ::read(0, &c, 1) <= 0;
}
}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || argc > 4) {
        std::fprintf(stderr, "usage: api_peer <address> [contexts [key]]\n");
        return 2;
    }
    ::alarm(60);  // never outlive a test run
    std::signal(SIGPIPE, SIG_IGN);
    try {
        talaria::EngineOptions o;
        if (argc >= 3) o.contexts = uint8_t(std::atoi(argv[2]));
        if (argc == 4) {
            o.core.na.auth.key_id = argv[3];
            o.core.na.auth.secret.assign(32, std::byte{'s'});
        }
        talaria::Engine server{argv[1], talaria::listen, o};
        server.define("echo", [](uint64_t x) { return x; });
        server.define("pid", [] { return int64_t(::getpid()); });
        std::printf("%s\n", server.self_address().c_str());
        std::fflush(stdout);
        while (!stdin_closed()) {
        }
    } catch (const talaria::Exception& e) {
        std::fprintf(stderr, "api_peer: %s\n", e.what());
        return 1;
    }
    return 0;
}
