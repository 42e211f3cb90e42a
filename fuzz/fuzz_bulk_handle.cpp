// Fuzz target: bulk handle encodings (docs/protocol.md, "bulk handle"), decoded with every
// transport that is built in the DecodeContext.
//
// A decode must fail with protocol_error and leave the Decoder failed too, or succeed with a
// remote handle of that transport whose size, access and segments are consistent. A handle
// that decodes must encode again, and that encoding must decode to the same handle, consuming
// exactly the bytes written. Any violation aborts (a finding). Nothing is transferred.
//
// Transports are opened once and never destroyed (libFuzzer may exit from anywhere).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/proc/archive.hpp"

namespace {

using talaria::Errc;
using talaria::bulk::Handle;
using talaria::na::Access;
using talaria::na::Transport;

constexpr const char* kTarget = "fuzz_bulk_handle";

[[noreturn]] void fail(const Transport& t, const char* what, std::string_view detail = {}) {
    talaria::fuzz::fail(kTarget, t, what, detail);
}

void check_handle(Transport& t, const Handle& h) {
    if (!h) {
        // A null handle (its one-byte encoding) round-trips as one.
        std::vector<std::byte> enc;
        if (!h.encode(enc) || enc.size() != 1) fail(t, "a null handle does not encode as 1 byte");
        talaria::proc::Decoder d(enc, {&t, nullptr});
        auto back = Handle::decode(d);
        if (!back || back->valid()) fail(t, "a null handle's encoding does not decode as null");
        return;
    }
    if (h.local()) fail(t, "a decoded handle claims to be local");
    if (h.transport() != &t) fail(t, "a decoded handle belongs to another transport");
    if (h.segment_count() == 0 && h.size() != 0) fail(t, "no segments but a size");
    if (h.size() < h.segment_count()) fail(t, "segments smaller than one byte");
    Access a = h.access();
    if (a != Access::read_only && a != Access::write_only && a != Access::read_write)
        fail(t, "a decoded handle has an invalid access mode");
    if (h.is_inline() && (a != Access::read_only || h.size() > talaria::bulk::kInlineMax))
        fail(t, "an inline handle that is writable or larger than kInlineMax");

    std::vector<std::byte> enc;
    auto e = h.encode(enc);
    if (!e) fail(t, "a decoded handle does not encode", e.error().describe());
    talaria::proc::Decoder d(enc, {&t, nullptr});
    auto back = Handle::decode(d);
    if (!back) fail(t, "own encoding does not decode", back.error().describe());
    if (d.remaining() != 0) fail(t, "decoding own encoding left bytes over");
    if (back->size() != h.size() || back->access() != h.access() ||
        back->segment_count() != h.segment_count() || back->is_inline() != h.is_inline() ||
        back->owner().valid() != h.owner().valid() ||
        back->owner_unreachable() != h.owner_unreachable())
        fail(t, "the round trip changes size, access, segments, inline or owner");
    if (h.owner_unreachable() && h.owner().valid())
        fail(t, "a relayed handle whose owner does not listen names an owner");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
    for (auto& t : talaria::fuzz::transports(kTarget)) {
        talaria::proc::Decoder d(in, {t.get(), nullptr});
        auto r = Handle::decode(d);
        if (bool(r) != d.ok()) fail(*t, "the result and the decoder disagree");
        if (!r) {
            if (r.code() != Errc::protocol_error)
                fail(*t, "a bad encoding failed with a code other than protocol_error",
                     r.error().describe());
            continue;
        }
        if (d.position() > size) fail(*t, "the decoder read past the input");
        check_handle(*t, *r);
    }
    return 0;
}
