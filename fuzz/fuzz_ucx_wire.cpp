// Fuzz target: the ucx transport's wire decoders (src/na/ucx/wire.hpp).
//
// The first byte picks a split point: bytes before it are an active-message header, bytes after
// it its payload, as the AM handler gets them. A header that decodes must re-encode to the very
// same bytes; a hello payload must name an address within bounds. The whole input also goes
// through the serialized-address and memory-handle decoders (the rkey and owner they return
// must lie inside the input), and through the bootstrap frame decoders. Any
// violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include <vector>

#include "na/ucx/wire.hpp"

namespace {

using namespace talaria::na::ucx;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz_ucx_wire: %s\n", what);
    std::abort();
}

bool inside(std::span<const std::byte> in, const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    return n == 0 || (b >= in.data() && b + n <= in.data() + in.size());
}

/// A worker address decoded from `payload` (a hello or a located answer): non-empty, within
/// kMaxWorkerAddr, inside the payload. `what` names the message in the failure.
void check_worker(std::span<const std::byte> payload, std::span<const std::byte> worker,
                  const char* what) {
    if (worker.empty() || worker.size() > kMaxWorkerAddr) fail(what);
    if (!inside(payload, worker.data(), worker.size())) fail(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
    if (!in.empty()) {
        std::size_t split = std::min<std::size_t>(std::size_t(data[0]), in.size() - 1);
        auto header = in.subspan(1, split);
        auto payload = in.subspan(1 + split);
        auto h = decode_msg_header(header);
        if (h) {
            if (header.size() != kMsgHeaderSize) fail("a header of the wrong size decoded");
            std::byte again[kMsgHeaderSize];
            encode_msg_header(*h, again);
            if (std::memcmp(again, header.data(), kMsgHeaderSize) != 0)
                fail("a decoded header does not re-encode to the same bytes");
            if (h->instance == 0) fail("instance 0 accepted");
            if (h->kind == MsgKind::hello) {
                const bool process = h->tag & kHelloProcess;
                if (auto a = decode_hello(payload, h->tag & kHelloSigned, process)) {
                    if (a->address.empty() || a->address.size() > kMaxAddrString)
                        fail("hello address size");
                    if (!inside(payload, a->address.data(), a->address.size()))
                        fail("hello address outside");
                    check_worker(payload, a->worker, "hello worker size or position");
                    const std::size_t tail = (h->tag & kHelloSigned) ? kHelloTailSize : 0;
                    if (hello_size(a->address, a->worker.size(), process) + tail != payload.size())
                        fail("hello parts do not add up to its payload");
                    if (process && (a->pid == 0 || a->pidns == 0))
                        fail("a hello's process part of pid or namespace 0 accepted");
                    if (tail && (a->mac.size() != 32 || !inside(payload, a->mac.data(), 32)))
                        fail("hello signature size or position");
                }
            }
            if (h->kind == MsgKind::locate) {
                if (auto k = decode_locate(payload); k && payload.size() != kLocateSize)
                    fail("a locate of the wrong size decoded");
            }
            if (is_rma_kind(h->kind) && payload.size() >= kRmaHeaderSize) {
                const bool request = h->kind == MsgKind::rma_put || h->kind == MsgKind::rma_get;
                if (auto r = decode_rma_header(payload.first(kRmaHeaderSize), request)) {
                    if (r->length > kRmaChunk) fail("put/get request longer than a chunk");
                    if (r->status > uint8_t(talaria::kLastErrc) || (request && r->status != 0))
                        fail("put/get status");
                    std::byte re[kRmaHeaderSize];
                    encode_rma_header(*r, re);
                    if (std::memcmp(re, payload.data(), kRmaHeaderSize) != 0)
                        fail("a decoded put/get header does not re-encode to the same bytes");
                }
            }
            if (h->kind == MsgKind::located) {
                if (auto l = decode_located(payload)) {
                    check_worker(payload, l->worker, "located worker size or position");
                    std::vector<std::byte> re(located_size(l->worker.size()));
                    encode_located(*l, re.data());
                    if (re.size() != payload.size() ||
                        std::memcmp(re.data(), payload.data(), re.size()) != 0)
                        fail("a decoded located answer does not re-encode to the same bytes");
                }
            }
        } else if (h.code() != talaria::Errc::protocol_error) {
            fail("a bad header failed with something other than protocol_error");
        }
    }
    // The bootstrap (sockaddr mode): a frame's fixed part re-encodes to itself and bounds its
    // body by kind; a request body's key id and nonce, and a refusal's reason, lie inside it.
    if (in.size() >= kBootFixedSize) {
        if (auto f = decode_boot_fixed(in.first(kBootFixedSize))) {
            if (f->instance == 0) fail("bootstrap instance 0");
            std::byte again[kBootFixedSize];
            encode_boot_fixed(*f, again);
            if (std::memcmp(again, in.data(), kBootFixedSize) != 0)
                fail("a decoded bootstrap fixed part does not re-encode to the same bytes");
            if (f->length > kMaxWorkerAddr) fail("bootstrap body length unbounded");
            auto body = in.subspan(kBootFixedSize);
            if (body.size() >= f->length) {
                body = body.first(f->length);
                if (f->kind == BootKind::request) {
                    auto r = decode_boot_request_body(body);
                    if (r && (r->key_id.empty() != body.empty())) fail("request key id presence");
                    if (r && !r->key_id.empty()) {
                        if (r->nonce.size() != kBootNonceSize) fail("request nonce size");
                        if (!inside(body, r->key_id.data(), r->key_id.size()) ||
                            !inside(body, r->nonce.data(), r->nonce.size()))
                            fail("request key id or nonce outside the body");
                        std::vector<std::byte> re(boot_request_body_size(r->key_id));
                        encode_boot_request_body(r->key_id, r->nonce, re.data());
                        if (re.size() != body.size() ||
                            std::memcmp(re.data(), body.data(), re.size()) != 0)
                            fail("a decoded request body does not re-encode to the same bytes");
                    }
                }
                if (f->kind == BootKind::refused) {
                    if (auto why = decode_boot_refused(body)) {
                        if (why->empty() || why->size() > kBootMaxReason) fail("refusal size");
                        for (char c : *why)
                            if (c < 0x20 || c > 0x7e) fail("refusal not printable");
                    }
                }
            }
        }
    }
    if (auto a = decode_addr_blob(in)) {
        if (a->empty() || a->size() > kMaxAddrString) fail("address blob size");
        if (!inside(in, a->data(), a->size())) fail("address blob outside the input");
    }
    if (auto m = decode_mem_blob(in)) {
        if (m->base + m->length < m->base) fail("memory handle wraps around");
        if (m->access < 1 || m->access > 3) fail("memory handle access");
        if (m->rkey.size() > kMaxRkeySize) fail("rkey too long");
        if (m->length == 0 ? (!m->rkey.empty() || m->key != 0) : (m->rkey.empty() == (m->key == 0)))
            fail("rkey or served key presence");
        if (m->owner.empty() || m->owner.size() > kMaxAddrString) fail("owner size");
        if ((m->pid == 0) != (m->pidns == 0) || m->pid > 0x7fffffffu) fail("owner process");
        if (!inside(in, m->rkey.data(), m->rkey.size())) fail("rkey outside the input");
        if (!inside(in, m->owner.data(), m->owner.size())) fail("owner outside the input");
        // A decoded handle re-encodes to the bytes it came from.
        std::size_t n = mem_blob_size(m->rkey.size(), m->owner.size());
        auto* out = static_cast<std::byte*>(std::malloc(n));
        if (!out) return 0;
        encode_mem_blob(*m, out);
        bool same = std::memcmp(out, in.data(), n) == 0;
        std::free(out);
        if (!same) fail("a decoded memory handle does not re-encode to the same bytes");
    }
    return 0;
}
