// Fuzz target: the tcp transport's wire decoders (src/na/tcp/frame.hpp).
//
// The input is read as a byte stream of frames, the way a connection reads it: decode a
// header, check that a header which decodes re-encodes to the very same bytes and respects the
// per-type bounds, decode the hello payload when there is one, skip the payload, repeat. The
// whole input also goes through the memory-handle and address decoders. Any violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "na/base/seal.hpp"
#include "na/tcp/frame.hpp"

namespace {

using namespace talaria::na::tcp;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz_tcp_frame: %s\n", what);
    std::abort();
}

void check_header(const FrameHeader& h, std::span<const std::byte> raw) {
    std::byte again[kFrameHeaderSize];
    encode_frame_header(h, again);
    if (std::memcmp(again, raw.data(), kFrameHeaderSize) != 0)
        fail("a decoded header does not re-encode to the same bytes");
    switch (h.type) {
        case FrameType::hello:
            if (h.length < kHelloFixedSize || h.length > kMaxHelloPayload) fail("hello length");
            break;
        case FrameType::msg_unexpected:
        case FrameType::msg_expected:
            if (h.length > kMaxMessageSize) fail("message length above 64 KiB accepted");
            break;
        case FrameType::put_req:
            if (h.length != h.rma_length || h.rma_length > kMaxRmaLength) fail("put length");
            break;
        case FrameType::get_req:
        case FrameType::put_resp:
            if (h.length != 0) fail("payload on a frame that has none");
            break;
        case FrameType::get_resp:
            if (h.length > kMaxRmaLength) fail("get response length");
            break;
        case FrameType::auth:
            if (h.context_id == uint8_t(AuthStep::challenge) &&
                h.length != kAuthNonceSize + kAuthProofSize)
                fail("auth challenge length");
            if (h.context_id == uint8_t(AuthStep::response) && h.length != kAuthProofSize)
                fail("auth response length");
            if (h.context_id == uint8_t(AuthStep::refused) &&
                (h.length > kMaxAuthReason || h.status == talaria::Errc::ok))
                fail("auth refusal");
            if (h.context_id < 1 || h.context_id > 3) fail("auth step");
            break;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
    std::size_t pos = 0;
    while (pos < in.size()) {
        auto rest = in.subspan(pos);
        auto h = decode_frame_header(rest);
        if (!h) {
            if (rest.size() >= kFrameHeaderSize && h.code() != talaria::Errc::protocol_error)
                fail("a full header failed with something other than protocol_error");
            if (rest.size() < kFrameHeaderSize && h.code() != talaria::Errc::again)
                fail("a short header did not ask for more bytes");
            break;
        }
        check_header(*h, rest);
        pos += kFrameHeaderSize;
        std::size_t avail = in.size() - pos;
        if (h->type == FrameType::hello && h->length <= avail) {
            auto hello = decode_hello(in.subspan(pos, std::size_t(h->length)));
            if (hello && hello->address.size() > kMaxAddrString) fail("hello address too long");
        }
        if (h->length >= avail) break;
        pos += std::size_t(h->length);
    }
    // A protected record (Auth::protect): a header decodes only within bounds, and bytes that
    // nobody sealed never open (under a key of ours, in either mode).
    if (auto n = talaria::na::seal::record_length(in)) {
        if (*n == 0 || *n > talaria::na::seal::kMaxRecordBody) fail("record length bounds");
        if (in.size() >= *n + talaria::na::seal::kRecordOverhead) {
            for (auto mode : {talaria::na::Protect::integrity, talaria::na::Protect::encryption}) {
                std::byte key[talaria::na::seal::kKeySize] = {};
                talaria::na::seal::Direction d;
                if (!d.init(key, 0, mode)) fail("seal set-up");
                std::vector<std::byte> out(*n);
                if (d.open(in.data(), *n, out.data())) fail("a record nobody sealed opened");
            }
        }
    }
    if (auto m = decode_mem_blob(in)) {
        if (m->base + m->length < m->base) fail("memory handle wraps around");
        if (m->access < 1 || m->access > 3) fail("memory handle access");
        if (m->owner.size() > kMaxAddrString) fail("memory handle owner too long");
    }
    if (auto a = decode_addr_blob(in)) {
        if (a->empty() || a->size() > kMaxAddrString || a->size() + 2 > in.size())
            fail("address blob bounds");
    }
    return 0;
}
