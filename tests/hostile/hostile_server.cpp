// The hostile suite's server: `hostile_server <address>` opens a core::Engine on `address` with
// the limits of hostile_common.hpp, registers echo and sink, prints its address on stdout (one
// line) and serves until its stdin closes or 60 seconds pass. The tests attack it and read its
// memory and descriptors from /proc.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>

#include "hostile_common.hpp"
#include "peer_process.hpp"
#include "talaria/core/core.hpp"

using namespace talaria;
using namespace talaria::core;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
    auto address = na::test::peer_start("hostile_server", argc, argv);
    if (!address) return 2;
    Options o;
    o.max_payload = hostile::kMaxPayload;
    o.large_budget = hostile::kLargeBudget;
    o.pull_timeout = hostile::kPullTimeout;
    o.na.hello_timeout = hostile::kHelloTimeout;
    o.max_requests = hostile::kMaxRequests;
    o.max_requests_per_peer = hostile::kMaxRequestsPerPeer;
    auto er = Engine::open(*address, o);
    if (!er) {
        std::fprintf(stderr, "hostile_server: open %s: %s\n", address->c_str(),
                     er.error().describe().c_str());
        return 1;
    }
    std::unique_ptr<Engine> engine = std::move(*er);
    int errors = 0;
    auto reg = [&](std::string_view name, Handler h) {
        if (auto r = engine->register_rpc(rpc_id(name), name, std::move(h)); !r) {
            std::fprintf(stderr, "hostile_server: register %.*s: %s\n", int(name.size()),
                         name.data(), r.error().describe().c_str());
            ++errors;
        }
    };
    reg(hostile::kEcho, [](Request& req) { (void)req.respond(req.input()); });
    reg(hostile::kSink, [](Request& req) { (void)req.respond({}); });
    // Requests kept to be answered later (by the serve loop below), as a coroutine would.
    struct Held {
        Request req;
        TimePoint due;
        uint32_t held_then;
    };
    std::deque<Held> held;
    reg(hostile::kHoldProc, [&held](Request& req) {
        const auto n = uint32_t(held.size() + 1);
        held.push_back(Held{std::move(req), Clock::now() + hostile::kHold, n});
    });
    if (errors) return 1;
    na::test::print_line(engine->self_string());
    bool ok = na::test::serve_until_stdin_closed(
        engine->context(0), "hostile_server", [&held]() -> std::optional<Duration> {
            auto now = Clock::now();
            while (!held.empty() && held.front().due <= now) {
                uint32_t n = held.front().held_then;
                std::byte out[4];
                for (int i = 0; i < 4; ++i)
                    out[i] = std::byte(n >> (8 * i));
                (void)held.front().req.respond(out);
                held.pop_front();
            }
            return held.empty() ? Duration(20ms)
                                : std::max<Duration>(held.front().due - now, Duration(0));
        });
    held.clear();
    engine.reset();
    return ok ? 0 : 1;
}
