// The sm wire decoders: what a correct peer writes decodes, what a broken or hostile one writes
// is rejected.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <vector>

#include "na/sm/sm_transport.hpp"
#include "na/sm/sm_wire.hpp"

namespace talaria::na::sm {
namespace {

TEST(SmWire, LayoutConstants) {
    EXPECT_EQ(kSlotSize % kCacheLine, 0u);
    EXPECT_GE(kSlotSize, kSlotHeaderSize + kMaxMsgSize);
    EXPECT_EQ(kSlotsOffset[0] % kCacheLine, 0u);
    EXPECT_EQ(kSlotsOffset[1], kSlotsOffset[0] + kRingBytes);
    EXPECT_GE(kSegmentSize, kSlotsOffset[1] + kRingBytes);
    EXPECT_EQ(kSegmentSize % 4096, 0u);
    // The numbers docs/protocol.md (sm) gives.
    EXPECT_EQ(kSlotSize, 4160u);
    EXPECT_EQ(kRingCtlOffset[0], 64u);
    EXPECT_EQ(kRingCtlOffset[1], 256u);
    EXPECT_EQ(kSlotsOffset[0], 448u);
    EXPECT_EQ(kSlotsOffset[1], 266688u);
    EXPECT_EQ(kSegmentSize, 536576u);
    EXPECT_EQ(offsetof(RingCtl, waiting), 64u);
    EXPECT_EQ(offsetof(RingCtl, space_wanted), 128u);
}

TEST(SmWire, SlotHeaderRoundTrip) {
    alignas(8) std::array<std::byte, kSlotHeaderSize> b{};
    encode_slot_header(b.data(), SlotHeader{4096, 0xdeadbeef, MsgKind::expected, 7, 99});
    SlotHeader h;
    ASSERT_TRUE(decode_slot_header(b.data(), h));
    EXPECT_EQ(h.seq, 99u);
    EXPECT_EQ(slot_seq(b.data()).load(), 99u) << "the sequence word is where the ring reads it";
    EXPECT_EQ(h.len, 4096u);
    EXPECT_EQ(h.tag, 0xdeadbeefu);
    EXPECT_EQ(h.kind, MsgKind::expected);
    EXPECT_EQ(h.ctx, 7);
}

TEST(SmWire, SlotHeaderRejectsGarbage) {
    std::array<std::byte, kSlotHeaderSize> b{};
    SlotHeader h;
    encode_slot_header(b.data(), SlotHeader{kMaxMsgSize + 1, 1, MsgKind::unexpected, 0});
    EXPECT_FALSE(decode_slot_header(b.data(), h)) << "length above the maximum";
    encode_slot_header(b.data(), SlotHeader{8, 1, MsgKind::unexpected, 0});
    b[8] = std::byte{9};
    EXPECT_FALSE(decode_slot_header(b.data(), h)) << "unknown kind";
    encode_slot_header(b.data(), SlotHeader{8, 1, MsgKind::unexpected, 0});
    b[10] = std::byte{1};
    EXPECT_FALSE(decode_slot_header(b.data(), h)) << "reserved byte set";
    b.fill(std::byte{0xff});
    EXPECT_FALSE(decode_slot_header(b.data(), h));
}

TEST(SmWire, RingFill) {
    EXPECT_EQ(ring_fill(0, 0), 0);
    EXPECT_EQ(ring_fill(10, 10 + kRingSlots), int64_t(kRingSlots));
    EXPECT_EQ(ring_fill(10, 11 + kRingSlots), -1);
    EXPECT_EQ(ring_fill(11, 10), -1) << "head ahead of tail";
    EXPECT_EQ(ring_fill(UINT64_MAX, 1), 2) << "wrap-around of the sequence numbers";
}

TEST(SmWire, HandshakeRoundTrip) {
    Handshake m;
    m.type = HsType::hello;
    m.pid = 1234;
    m.instance = 0x1122334455667788;
    m.probe_addr = 0x7fff0000;
    m.name = "server-0.a_b";
    std::array<std::byte, kHsMaxSize> b{};
    std::size_t n = encode_handshake(m, b);
    ASSERT_EQ(n, kHsFixedSize + m.name.size());
    auto d = decode_handshake(std::span<const std::byte>(b.data(), n));
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->type, HsType::hello);
    EXPECT_EQ(d->pid, 1234u);
    EXPECT_EQ(d->instance, m.instance);
    EXPECT_EQ(d->probe_addr, m.probe_addr);
    EXPECT_EQ(d->name, m.name);

    Handshake w;
    w.type = HsType::wake;
    n = encode_handshake(w, b);
    auto dw = decode_handshake(std::span<const std::byte>(b.data(), n));
    ASSERT_TRUE(dw) << dw.error().describe();
    EXPECT_EQ(dw->type, HsType::wake);
}

TEST(SmWire, HandshakeRejectsGarbage) {
    Handshake m;
    m.type = HsType::ack;
    m.pid = 1;
    m.instance = 2;
    m.name = "peer";
    std::array<std::byte, kHsMaxSize> good{};
    std::size_t n = encode_handshake(m, good);
    auto decode = [&](auto mutate, std::size_t len) {
        auto b = good;
        mutate(b);
        return decode_handshake(std::span<const std::byte>(b.data(), len));
    };
    auto none = [](auto&) {};
    EXPECT_TRUE(decode(none, n));
    EXPECT_EQ(decode(none, n - 1).code(), Errc::protocol_error) << "truncated name";
    EXPECT_EQ(decode(none, 10).code(), Errc::protocol_error) << "short packet";
    EXPECT_EQ(decode([](auto& b) { b[0] = std::byte{0}; }, n).code(), Errc::protocol_error);
    EXPECT_EQ(decode([](auto& b) { b[4] = std::byte{9}; }, n).code(), Errc::protocol_error)
        << "version";
    EXPECT_EQ(decode([](auto& b) { b[6] = std::byte{0}; }, n).code(), Errc::protocol_error)
        << "type";
    EXPECT_EQ(decode([](auto& b) { b[12] = std::byte{1}; }, n).code(), Errc::protocol_error)
        << "ring layout";
    EXPECT_EQ(decode([](auto& b) { b[28] = std::byte{200}; }, n).code(), Errc::protocol_error)
        << "name length beyond the packet";
    EXPECT_EQ(decode([](auto& b) { b[kHsFixedSize] = std::byte{'/'}; }, n).code(),
              Errc::protocol_error)
        << "name with a slash";
    EXPECT_EQ(decode([](auto& b) { std::memset(&b[8], 0, 4); }, n).code(), Errc::protocol_error)
        << "pid 0";
}

TEST(SmWire, AddrRoundTripAndRejects) {
    std::array<std::byte, 80> b{};
    std::size_t n = encode_addr("abc", b);
    ASSERT_EQ(n, 8u);
    auto d = decode_addr(std::span<const std::byte>(b.data(), n));
    ASSERT_TRUE(d);
    EXPECT_EQ(*d, "abc");
    EXPECT_EQ(decode_addr(std::span<const std::byte>(b.data(), n - 1)).code(),
              Errc::address_invalid);
    b[4] = std::byte{0};
    EXPECT_EQ(decode_addr(std::span<const std::byte>(b.data(), n)).code(), Errc::address_invalid)
        << "empty name";
}

TEST(SmWire, MemRoundTripAndRejects) {
    MemWire w{Access::read_write, 42, 7, 0x1000, 0x2000, 9, 0xfeed};
    std::array<std::byte, kMemWireSize> b{};
    encode_mem(w, b);
    auto d = decode_mem(b);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->access, Access::read_write);
    EXPECT_EQ(d->pid, 42u);
    EXPECT_EQ(d->instance, 7u);
    EXPECT_EQ(d->base, 0x1000u);
    EXPECT_EQ(d->length, 0x2000u);
    EXPECT_EQ(d->slot, 9u);
    EXPECT_EQ(d->key, 0xfeedu);
    // A registration's slot and key: both for a region, neither for an empty one.
    for (MemWire x : {MemWire{Access::read_only, 1, 1, 0x1000, 64, 0, 0},
                      MemWire{Access::read_only, 1, 1, 0x1000, 64, kMaxRegistrations, 5},
                      MemWire{Access::read_only, 1, 1, 0x1000, 0, 0, 5},
                      MemWire{Access::read_only, 1, 1, 0x1000, 0, 3, 0}}) {
        std::array<std::byte, kMemWireSize> y{};
        encode_mem(x, y);
        EXPECT_FALSE(decode_mem(y))
            << "slot " << x.slot << " key " << x.key << " length " << x.length;
    }
    EXPECT_TRUE(decode_mem([] {
        std::array<std::byte, kMemWireSize> y{};
        encode_mem(MemWire{Access::read_only, 1, 1, 0x1000, 0, 0, 0}, y);
        return y;
    }()));
    auto bad = b;
    bad[5] = std::byte{4};
    EXPECT_FALSE(decode_mem(bad)) << "access 4";
    MemWire over{Access::read_only, 1, 1, UINT64_MAX - 10, 100, 1, 1};
    encode_mem(over, bad);
    EXPECT_FALSE(decode_mem(bad)) << "base + length overflows";
    EXPECT_FALSE(decode_mem(std::span<const std::byte>(b.data(), kMemWireSize - 1)));
}

TEST(SmWire, FileNames) {
    pid_t pid;
    std::string_view rest;
    ASSERT_TRUE(parse_file_name("talaria-sm-123-srv.sock", pid, rest));
    EXPECT_EQ(pid, 123);
    EXPECT_EQ(rest, "srv.sock");
    ASSERT_TRUE(parse_file_name("talaria-sm-9-a-b.3.seg", pid, rest));
    EXPECT_EQ(pid, 9);
    EXPECT_EQ(rest, "a-b.3.seg");
    EXPECT_FALSE(parse_file_name("talaria-sm--x.sock", pid, rest));
    EXPECT_FALSE(parse_file_name("talaria-sm-12x.sock", pid, rest));
    EXPECT_FALSE(parse_file_name("talaria-sm-0-x.sock", pid, rest));
    EXPECT_FALSE(parse_file_name("other-12-x.sock", pid, rest));
    EXPECT_FALSE(parse_file_name("talaria-sm-99999999999-x", pid, rest));
}

}  // namespace
}  // namespace talaria::na::sm
