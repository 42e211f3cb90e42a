// The RPC suite's peer process: `rpc_peer <address>` opens a core::Engine on `address`, registers
// the procedures of rpc_common.hpp (echo, hang, large, huge), prints its address on stdout (one
// line) and serves until its stdin closes (the test closed it or died) or 60 seconds pass. The
// two-process tests kill it with SIGKILL while calls are in flight.
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <vector>

#include "harness.hpp"
#include "rpc_common.hpp"
#include "talaria/core/core.hpp"

using namespace talaria;
using namespace talaria::core;
using namespace std::chrono_literals;

namespace {

bool stdin_closed() {
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR)) return true;
    char c;
    return ::read(0, &c, 1) <= 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: rpc_peer <address>\n");
        return 2;
    }
    ::alarm(60);  // never outlive a test run
    std::signal(SIGPIPE, SIG_IGN);

    auto er = Engine::open(argv[1]);
    if (!er) {
        std::fprintf(stderr, "rpc_peer: open %s: %s\n", argv[1], er.error().describe().c_str());
        return 1;
    }
    std::unique_ptr<Engine> engine = std::move(*er);
    // Held "hang" requests: declared after the engine so they are destroyed before it.
    std::vector<Request> held;
    std::vector<std::byte> large(test::kPeerLargeSize);
    na::test::fill_pattern(large, test::kPeerLargeSeed);
    int errors = 0;

    auto reg = [&](std::string_view name, Handler h) {
        auto r = engine->register_rpc(rpc_id(name), name, std::move(h));
        if (!r) {
            std::fprintf(stderr, "rpc_peer: register %.*s: %s\n", int(name.size()), name.data(),
                         r.error().describe().c_str());
            ++errors;
        }
    };
    reg(test::kPeerEcho, [&](Request& req) {
        if (auto r = req.respond(req.input()); !r)
            std::fprintf(stderr, "rpc_peer: echo respond: %s\n", r.error().describe().c_str());
    });
    reg(test::kPeerHang, [&](Request& req) {
        held.push_back(std::move(req));
        std::printf("hang %zu\n", held.size());
        std::fflush(stdout);
    });
    reg(test::kPeerLarge, [&](Request& req) {
        if (auto r = req.respond(large); !r)
            std::fprintf(stderr, "rpc_peer: large respond: %s\n", r.error().describe().c_str());
    });
    reg(test::kPeerHuge, [&](Request& req) {
        std::vector<std::byte> huge(test::kPeerHugeSize);
        na::test::fill_pattern(huge, test::kPeerLargeSeed);
        if (auto r = req.respond(huge); !r)
            std::fprintf(stderr, "rpc_peer: huge respond: %s\n", r.error().describe().c_str());
        std::printf("huge\n");
        std::fflush(stdout);
    });
    if (errors) return 1;

    std::printf("%s\n", engine->self_string().c_str());
    std::fflush(stdout);

    Context& ctx = engine->context(0);
    while (!stdin_closed()) {
        auto r = ctx.progress(50ms);
        if (!r && r.code() != Errc::timeout) {
            std::fprintf(stderr, "rpc_peer: progress: %s\n", r.error().describe().c_str());
            return 1;
        }
        ctx.trigger();
    }
    held.clear();
    engine.reset();
    return 0;
}
