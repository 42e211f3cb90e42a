// The RPC suite's peer process: `rpc_peer <address>` opens a core::Engine on `address`, registers
// the procedures of rpc_common.hpp (echo, hang, large, huge), prints its address on stdout (one
// line) and serves until its stdin closes (the test closed it or died) or 60 seconds pass. The
// two-process tests kill it with SIGKILL while calls are in flight.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "peer_process.hpp"
#include "rpc_common.hpp"
#include "talaria/core/core.hpp"

using namespace talaria;
using namespace talaria::core;
using namespace std::chrono_literals;

using na::test::print_line;

int main(int argc, char** argv) {
    auto address = na::test::peer_start("rpc_peer", argc, argv);
    if (!address) return 2;

    auto er = Engine::open(*address);
    if (!er) {
        std::fprintf(stderr, "rpc_peer: open %s: %s\n", address->c_str(),
                     er.error().describe().c_str());
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
        print_line("hang " + std::to_string(held.size()));
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
        print_line("huge");
    });
    if (errors) return 1;

    print_line(engine->self_string());

    bool ok = na::test::serve_until_stdin_closed(engine->context(0), "rpc_peer",
                                                 []() -> std::optional<Duration> { return 50ms; });
    if (!ok) return 1;
    held.clear();
    engine.reset();
    return 0;
}
