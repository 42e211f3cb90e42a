// The hostile suite's server: `hostile_server <address>` opens a core::Engine on `address` with
// the limits of hostile_common.hpp, registers echo and sink, prints its address on stdout (one
// line) and serves until its stdin closes or 60 seconds pass. The tests attack it and read its
// memory and descriptors from /proc.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

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
    if (const char* key = std::getenv(hostile::kKeyVariable); key && *key) {
        o.na.auth.key_id = key;
        o.na.auth.secret.assign(32, std::byte{hostile::kSecretByte});
    }
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
    std::vector<Request> never;
    reg(hostile::kNever, [&never](Request& req) { never.push_back(std::move(req)); });
    // Exposed memory (kExpose): handles dropped before the engine below.
    std::vector<std::byte> exposed(hostile::kExposedSize);
    for (std::size_t i = 0; i < exposed.size(); ++i)
        exposed[i] = hostile::exposed_byte(i);
    na::MemHandle ro, wo;
    reg(hostile::kExpose, [&](Request& req) {
        na::Transport& t = engine->transport();
        if (!ro) {
            auto r = t.mem_register(exposed.data() + hostile::kReadOnlyAt, hostile::kRegionSize,
                                    na::Access::read_only);
            auto w = t.mem_register(exposed.data() + hostile::kWriteOnlyAt, hostile::kRegionSize,
                                    na::Access::write_only);
            if (!r || !w) {
                (void)req.respond_error(Errc::internal, "mem_register failed");
                return;
            }
            ro = std::move(*r);
            wo = std::move(*w);
        }
        std::vector<std::byte> out(16);
        for (int i = 0; i < 8; ++i) {
            out[std::size_t(i)] = std::byte(uint8_t(ro->base() >> (8 * i)));
            out[std::size_t(8 + i)] = std::byte(uint8_t(wo->base() >> (8 * i)));
        }
        for (const na::MemHandle* h : {&ro, &wo}) {
            const std::size_t n = t.mem_serialize_size(*h);
            const std::size_t at = out.size();
            out.resize(at + 2 + n);
            out[at] = std::byte(uint8_t(n));
            out[at + 1] = std::byte(uint8_t(n >> 8));
            (void)t.mem_serialize(*h, std::span(out).subspan(at + 2, n));
        }
        (void)req.respond(out);
    });
    reg(hostile::kHeap, [](Request& req) {
        const struct mallinfo2 mi = ::mallinfo2();
        const uint64_t v = uint64_t(mi.uordblks) + uint64_t(mi.hblkhd);
        std::byte out[8];
        for (int i = 0; i < 8; ++i)
            out[i] = std::byte(uint8_t(v >> (8 * i)));
        (void)req.respond(out);
    });
    reg(hostile::kPeek, [&](Request& req) { (void)req.respond(exposed); });
    reg(hostile::kDrop, [&](Request& req) {
        wo = na::MemHandle();
        (void)req.respond({});
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
    never.clear();
    ro = na::MemHandle();
    wo = na::MemHandle();
    engine.reset();
    return ok ? 0 : 1;
}
