// Fuzz target: RPC messages as they arrive at a core engine.
//
// Each input is (1) parsed with the header and large-payload decoders, whose results must be
// self-consistent, and (2) delivered as an unexpected na message to a live inproc core engine
// with registered handlers, from a raw na endpoint that drains whatever the engine answers.
// Nothing may crash, hang or grow: the engine drops or rejects what is malformed, pulls
// garbage descriptors only up to its (small, here) max_payload, and answers unknown ids.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "core/wire.hpp"
#include "talaria/core/core.hpp"
#include "talaria/util/log.hpp"

namespace {

using namespace talaria;
using namespace std::chrono_literals;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz_rpc_header: %s\n", what);
    std::abort();
}

void check_decoders(std::span<const std::byte> in) {
    auto h = core::wire::decode_header(in);
    if (h) {
        if (h->payload_len != in.size() - core::wire::kHeaderSize)
            fail("decode_header accepted a payload length that differs from the message");
        if (h->flags & ~core::wire::kKnownFlags) fail("decode_header accepted unknown flags");
        const bool request =
            (h->flags & (core::wire::kResponse | core::wire::kAck | core::wire::kCancel)) == 0;
        if (!request && (h->provider != 0 || h->budget_us != 0 || h->signature != 0))
            fail("decode_header accepted request fields on a response, ack or cancel");
        if ((h->flags & core::wire::kCancel) && h->payload_len != 0)
            fail("decode_header accepted a cancel with a payload");
        // Re-encoding the decoded header reproduces the input's header bytes (all but the crc,
        // at offset 20, which encode_header computes only when flagged).
        std::vector<std::byte> out(core::wire::kHeaderSize);
        core::wire::encode_header(*h, out.data(), in.subspan(core::wire::kHeaderSize));
        if (std::memcmp(out.data(), in.data(), 20) != 0 ||
            std::memcmp(out.data() + 24, in.data() + 24, core::wire::kHeaderSize - 24) != 0)
            fail("re-encoded header differs from the accepted bytes");
    }
    auto d = core::wire::decode_more(in);
    if (d) {
        if (d->mem.size() + core::wire::kMoreFixedSize != in.size())
            fail("decode_more accepted a descriptor whose handle length is inconsistent");
        std::vector<std::byte> out(in.size());
        auto w = core::wire::encode_more(*d, out);
        if (!w || *w != in.size() || std::memcmp(out.data(), in.data(), in.size()) != 0)
            fail("decode_more / encode_more do not round-trip");
    }
}

struct World {
    std::unique_ptr<core::Engine> engine;
    std::unique_ptr<na::Transport> raw;
    std::unique_ptr<na::Context> raw_ctx;
    na::Addr engine_addr;
    na::MsgBuffer send_buf, recv_buf;
    bool recv_posted = false;
};

World& world() {
    static World* w = [] {
        if (!std::getenv("TALARIA_LOG")) log::configure("error");
        auto* v = new World;
        core::Options o;
        o.max_payload = 1 << 20;  // a garbage descriptor may make the engine allocate this much
        o.contexts = 2;
        auto e = core::Engine::open("inproc://fuzz-rpc-engine", o);
        if (!e) fail("cannot open the engine");
        v->engine = std::move(*e);
        auto echo = [](core::Request& r) {
            std::vector<std::byte> out(r.input().begin(), r.input().end());
            (void)r.respond(out);
        };
        (void)v->engine->register_rpc(core::rpc_id("echo"), "echo", echo);
        (void)v->engine->register_rpc(core::rpc_id("drop"), "drop", [](core::Request&) {});
        // A provider's instance, and a procedure whose calls are checked against a signature.
        core::Registration prov;
        prov.provider = 1;
        (void)v->engine->register_rpc(core::rpc_id("echo"), "echo", echo, prov);
        core::Registration typed;
        typed.signature = 0x1122334455667788ull;
        typed.signature_text = "i32(i32)";
        (void)v->engine->register_rpc(core::rpc_id("typed"), "typed", echo, typed);
        // A handler that looks at its call's deadline and cancel state.
        (void)v->engine->register_rpc(core::rpc_id("ask"), "ask", [](core::Request& r) {
            const bool c = r.cancelled();
            (void)r.respond({reinterpret_cast<const std::byte*>(&c), 1});
        });
        auto t = na::open("inproc://fuzz-rpc-raw");
        if (!t) fail("cannot open the raw endpoint");
        v->raw = std::move(*t);
        auto c = v->raw->context_create(0);
        if (!c) fail("cannot create the raw context");
        v->raw_ctx = std::move(*c);
        auto a = v->raw->addr_lookup("inproc://fuzz-rpc-engine");
        if (!a) fail("cannot look up the engine");
        v->engine_addr = *a;
        auto sb = v->raw->msg_buf_alloc(v->raw->max_unexpected_size());
        auto rb = v->raw->msg_buf_alloc(v->raw->max_unexpected_size());
        if (!sb || !rb) fail("no message buffers");
        v->send_buf = std::move(*sb);
        v->recv_buf = std::move(*rb);
        return v;
    }();
    return *w;
}

void deliver(std::span<const std::byte> in) {
    World& w = world();
    std::size_t n = std::min(in.size(), w.send_buf.size());
    if (n) std::memcpy(w.send_buf.data(), in.data(), n);
    bool sent = false;
    // The first byte of the input (when present) picks the target context, to reach both.
    uint8_t ctx = in.empty() ? 0 : uint8_t(in[0]) & 1;
    auto r = w.raw->post_send_unexpected(
        *w.raw_ctx, [&sent](const na::Completion&) { sent = true; }, w.send_buf, n, w.engine_addr,
        ctx, core::wire::kMessageTag);
    if (!r) fail("raw send refused");
    // Bounded: a handful of rounds moves everything inproc has to move.
    for (int round = 0; round < 8; ++round) {
        if (!w.recv_posted) {
            auto rr = w.raw->post_recv_unexpected(
                *w.raw_ctx, [&w](const na::Completion&) { w.recv_posted = false; }, w.recv_buf);
            w.recv_posted = rr.has_value();
        }
        for (uint8_t i = 0; i < w.engine->context_count(); ++i) {
            (void)w.engine->context(i).progress(0ms);
            w.engine->context(i).trigger();
        }
        (void)w.raw_ctx->progress(0ms);
        w.raw_ctx->trigger();
    }
    if (!sent) fail("the raw send never completed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
    check_decoders(in);
    deliver(in);
    return 0;
}
