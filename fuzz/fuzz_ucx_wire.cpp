// Fuzz target: the ucx transport's wire decoders (src/na/ucx/wire.hpp).
//
// The first byte picks a split point: bytes before it are an active-message header, bytes after
// it its payload, as the AM handler gets them. A header that decodes must re-encode to the very
// same bytes; a hello payload must name an address within bounds. The whole input also goes
// through the serialized-address and memory-handle decoders (the rkey and owner they return
// must lie inside the input), and through the bootstrap request and reply decoders. Any
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
                if (auto a = decode_hello(payload)) {
                    if (a->address.empty() || a->address.size() > kMaxAddrString)
                        fail("hello address size");
                    if (!inside(payload, a->address.data(), a->address.size()))
                        fail("hello address outside");
                    check_worker(payload, a->worker, "hello worker size or position");
                    if (hello_size(a->address, a->worker.size()) != payload.size())
                        fail("hello parts do not add up to its payload");
                }
            }
            if (h->kind == MsgKind::locate) {
                if (auto k = decode_locate(payload); k && payload.size() != kLocateSize)
                    fail("a locate of the wrong size decoded");
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
    // The bootstrap (sockaddr mode): a request decodes only whole and re-encodes to itself; a
    // reply's worker address lies inside it and the reply re-encodes to itself.
    if (auto r = decode_boot_request(in)) {
        if (in.size() != kBootRequestSize || *r == 0) fail("a bad bootstrap request decoded");
        std::byte again[kBootRequestSize];
        encode_boot_request(*r, again);
        if (std::memcmp(again, in.data(), kBootRequestSize) != 0)
            fail("a decoded bootstrap request does not re-encode to the same bytes");
    }
    if (in.size() >= kBootReplyFixedSize) {
        auto fixed = decode_boot_reply_fixed(in.first(kBootReplyFixedSize));
        auto whole = decode_boot_reply(in);
        if (whole && !fixed) fail("a bootstrap reply decoded whole but not its fixed part");
        if (whole) {
            if (whole->instance == 0) fail("bootstrap reply instance 0");
            check_worker(in, whole->worker, "bootstrap reply worker size or position");
            if (whole->worker.size() != *fixed) fail("bootstrap reply length disagrees");
            std::vector<std::byte> re(boot_reply_size(whole->worker.size()));
            encode_boot_reply(*whole, re.data());
            if (re.size() != in.size() || std::memcmp(re.data(), in.data(), re.size()) != 0)
                fail("a decoded bootstrap reply does not re-encode to the same bytes");
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
        if ((m->rkey.size() == 0) != (m->length == 0)) fail("rkey presence");
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
