// Fuzz the sm transport's decoders of peer-written bytes: the ring slot header (plus the ring
// index check), the handshake packet, the serialized address and memory handle. None may
// crash, hang, or accept what the encoders would not produce.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "na/sm/sm_wire.hpp"

using namespace talaria::na::sm;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

void slot(std::span<const std::byte> in) {
    if (in.size() < kSlotHeaderSize) return;
    SlotHeader h;
    if (!decode_slot_header(in.data(), h)) return;
    // What is accepted is what a correct peer writes: re-encoding gives the same bytes.
    check(h.len <= kMaxMsgSize);
    std::byte again[kSlotHeaderSize];
    encode_slot_header(again, h);
    check(std::memcmp(again, in.data(), kSlotHeaderSize) == 0);
}

void indices(std::span<const std::byte> in) {
    if (in.size() < 16) return;
    uint64_t head, tail;
    std::memcpy(&head, in.data(), 8);
    std::memcpy(&tail, in.data() + 8, 8);
    int64_t n = ring_fill(head, tail);
    check(n >= -1 && n <= int64_t(kRingSlots));
    if (n >= 0) check(tail - head == uint64_t(n));
}

void handshake(std::span<const std::byte> in) {
    auto m = decode_handshake(in);
    if (!m) return;
    check(m->name.size() <= kMaxNameLen);
    std::byte again[kHsMaxSize];
    std::size_t n = encode_handshake(*m, again);
    check(n == in.size());
    check(std::memcmp(again, in.data(), n) == 0);
}

void addr(std::span<const std::byte> in) {
    auto a = decode_addr(in);
    if (!a) return;
    check(name_valid(*a));
}

void mem(std::span<const std::byte> in) {
    auto m = decode_mem(in);
    if (!m) return;
    check(m->base + m->length >= m->base);
    std::byte again[kMemWireSize];
    encode_mem(*m, again);
    check(std::memcmp(again, in.data(), kMemWireSize) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    std::span<const std::byte> all(reinterpret_cast<const std::byte*>(data), size);
    // The first byte picks the decoder the rest is meant for; every decoder also sees it all.
    auto rest = all.subspan(1);
    switch (data[0] % 5) {
        case 0:
            slot(rest);
            break;
        case 1:
            indices(rest);
            break;
        case 2:
            handshake(rest);
            break;
        case 3:
            addr(rest);
            break;
        case 4:
            mem(rest);
            break;
    }
    slot(all);
    handshake(all);
    addr(all);
    mem(all);
    return 0;
}
