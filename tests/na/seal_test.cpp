// The protected-record layer in src/na/base (seal.hpp), on its own: both modes round trip, and a
// record changed anywhere, replayed, reordered, sent the other way or opened under another key
// or mode fails its tag.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "na/base/seal.hpp"

namespace talaria::na::seal {
namespace {

std::array<std::byte, kKeySize> key_of(char fill) {
    std::array<std::byte, kKeySize> k{};
    k.fill(std::byte(fill));
    return k;
}

/// A record of `body` sealed by `d` (a buffer with room for the overhead).
std::vector<std::byte> sealed(Direction& d, const std::vector<std::byte>& body) {
    std::vector<std::byte> rec(body.size() + kRecordOverhead);
    std::memcpy(rec.data() + kRecordHeaderSize, body.data(), body.size());
    EXPECT_EQ(d.seal(rec.data(), body.size()), rec.size());
    return rec;
}

std::vector<std::byte> pattern(std::size_t n, int salt) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i)
        v[i] = std::byte(uint8_t(i * 31 + salt));
    return v;
}

TEST(Seal, BothModesRoundTripInOrder) {
    for (Protect mode : {Protect::integrity, Protect::encryption}) {
        SCOPED_TRACE(int(mode));
        Direction tx, rx;
        ASSERT_TRUE(tx.init(key_of('k'), 0, mode));
        ASSERT_TRUE(rx.init(key_of('k'), 0, mode));
        for (std::size_t n : {std::size_t{1}, std::size_t{100}, kMaxRecordBody}) {
            auto body = pattern(n, int(n));
            auto rec = sealed(tx, body);
            auto len = record_length(rec);
            ASSERT_TRUE(len);
            EXPECT_EQ(*len, n);
            // In clear with integrity only; not with encryption.
            const bool clear = std::memcmp(rec.data() + kRecordHeaderSize, body.data(), n) == 0;
            EXPECT_EQ(clear, mode == Protect::integrity);
            std::vector<std::byte> out(n);
            ASSERT_TRUE(rx.open(rec.data(), n, out.data()));
            EXPECT_EQ(out, body);
        }
    }
}

TEST(Seal, AnyChangeReplayOrMisdirectionFailsTheTag) {
    for (Protect mode : {Protect::integrity, Protect::encryption}) {
        SCOPED_TRACE(int(mode));
        Direction tx;
        ASSERT_TRUE(tx.init(key_of('k'), 0, mode));
        auto body = pattern(64, 5);
        auto first = sealed(tx, body);
        auto second = sealed(tx, body);
        std::vector<std::byte> out(64);
        // A flipped bit in the header, the body or the tag.
        for (std::size_t at : {std::size_t{6}, kRecordHeaderSize + 3, first.size() - 1}) {
            Direction rx;
            ASSERT_TRUE(rx.init(key_of('k'), 0, mode));
            auto bad = first;
            bad[at] ^= std::byte{0x10};
            EXPECT_FALSE(rx.open(bad.data(), 64, out.data())) << at;
        }
        {
            // Out of order (the second before the first), and the first twice (a replay).
            Direction rx;
            ASSERT_TRUE(rx.init(key_of('k'), 0, mode));
            EXPECT_FALSE(rx.open(second.data(), 64, out.data()));
            ASSERT_TRUE(rx.open(first.data(), 64, out.data()));
            EXPECT_FALSE(rx.open(first.data(), 64, out.data()));
            EXPECT_TRUE(rx.open(second.data(), 64, out.data()));
        }
        // The other direction, another key, the other mode.
        Direction other_dir, other_key, other_mode;
        ASSERT_TRUE(other_dir.init(key_of('k'), 1, mode));
        ASSERT_TRUE(other_key.init(key_of('j'), 0, mode));
        ASSERT_TRUE(other_mode.init(
            key_of('k'), 0, mode == Protect::integrity ? Protect::encryption : Protect::integrity));
        EXPECT_FALSE(other_dir.open(first.data(), 64, out.data()));
        EXPECT_FALSE(other_key.open(first.data(), 64, out.data()));
        EXPECT_FALSE(other_mode.open(first.data(), 64, out.data()));
    }
}

TEST(Seal, RecordHeadersAreBounded) {
    std::array<std::byte, kRecordHeaderSize> h{};
    auto put = [&](uint32_t magic, uint32_t n) {
        for (int i = 0; i < 4; ++i) {
            h[std::size_t(i)] = std::byte(uint8_t(magic >> (8 * i)));
            h[std::size_t(4 + i)] = std::byte(uint8_t(n >> (8 * i)));
        }
        return record_length(h);
    };
    EXPECT_TRUE(put(kRecordMagic, 1));
    EXPECT_TRUE(put(kRecordMagic, uint32_t(kMaxRecordBody)));
    EXPECT_FALSE(put(kRecordMagic, 0));
    EXPECT_FALSE(put(kRecordMagic, uint32_t(kMaxRecordBody + 1)));
    EXPECT_FALSE(put(0x54524c54u, 16));  // a plain tcp frame's magic
    EXPECT_FALSE(record_length(std::span(h).first(7)));
    Direction d;
    EXPECT_FALSE(d.init(std::span(h).first(8), 0, Protect::encryption)) << "a short key";
    EXPECT_FALSE(d.init(key_of('k'), 0, Protect::none));
}

}  // namespace
}  // namespace talaria::na::seal
