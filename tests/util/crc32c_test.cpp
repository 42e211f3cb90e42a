// CRC-32C: known vectors, incremental extension, and the hardware path against the portable
// one on every length 0..300 at every alignment 0..15.
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "talaria/util/crc32c.hpp"

namespace talaria {
namespace {

uint32_t crc_of(std::string_view s) {
    return crc32c(0, s.data(), s.size());
}

TEST(Crc32c, KnownVectors) {
    EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
    EXPECT_EQ(crc32c_portable(0, "123456789", 9), 0xE3069283u);
    EXPECT_EQ(crc_of(""), 0u);
    EXPECT_EQ(crc32c(0, nullptr, 0), 0u);
    EXPECT_EQ(crc_of("a"), 0xC1D04330u);
    EXPECT_EQ(crc_of("The quick brown fox jumps over the lazy dog"), 0x22620404u);
    // RFC 3720 (iSCSI) appendix B.4 test vectors.
    std::vector<uint8_t> buf(32, 0);
    EXPECT_EQ(crc32c(0, buf.data(), buf.size()), 0x8A9136AAu);
    std::fill(buf.begin(), buf.end(), 0xFF);
    EXPECT_EQ(crc32c(0, buf.data(), buf.size()), 0x62A8AB43u);
    for (int i = 0; i < 32; ++i)
        buf[i] = uint8_t(i);
    EXPECT_EQ(crc32c(0, buf.data(), buf.size()), 0x46DD794Eu);
    for (int i = 0; i < 32; ++i)
        buf[i] = uint8_t(31 - i);
    EXPECT_EQ(crc32c(0, buf.data(), buf.size()), 0x113FDB5Cu);
    EXPECT_EQ(crc32c_portable(0, buf.data(), buf.size()), 0x113FDB5Cu);
}

TEST(Crc32c, Incremental) {
    std::string_view s = "The quick brown fox jumps over the lazy dog";
    for (std::size_t cut = 0; cut <= s.size(); ++cut) {
        uint32_t c = crc32c(0, s.data(), cut);
        c = crc32c(c, s.data() + cut, s.size() - cut);
        EXPECT_EQ(c, 0x22620404u) << "split at " << cut;
        uint32_t p = crc32c_portable(0, s.data(), cut);
        p = crc32c_portable(p, s.data() + cut, s.size() - cut);
        EXPECT_EQ(p, 0x22620404u) << "split at " << cut;
    }
}

TEST(Crc32c, HardwareMatchesPortableEveryLengthAndAlignment) {
    if (!crc32c_hardware())
        GTEST_SKIP() << "CPU lacks SSE4.2: crc32c() is the portable code, nothing to compare";
    std::mt19937_64 rng(12345);
    std::vector<unsigned char> buf(300 + 16 + 8);
    for (auto& b : buf)
        b = static_cast<unsigned char>(rng());
    for (std::size_t len = 0; len <= 300; ++len) {
        for (std::size_t off = 0; off < 16; ++off) {
            const unsigned char* p = buf.data() + off;
            uint32_t seed = static_cast<uint32_t>(rng());
            ASSERT_EQ(crc32c(0, p, len), crc32c_portable(0, p, len))
                << "len " << len << " offset " << off;
            ASSERT_EQ(crc32c(seed, p, len), crc32c_portable(seed, p, len))
                << "len " << len << " offset " << off << " seed " << seed;
        }
    }
}

TEST(Crc32c, LargeBufferMatchesPortable) {
    std::mt19937_64 rng(99);
    std::vector<unsigned char> buf(1 << 20);
    for (auto& b : buf)
        b = static_cast<unsigned char>(rng());
    uint32_t whole = crc32c(0, buf.data(), buf.size());
    EXPECT_EQ(whole, crc32c_portable(0, buf.data(), buf.size()));
    // Flipping one bit changes the checksum.
    buf[buf.size() / 2] ^= 0x10;
    EXPECT_NE(crc32c(0, buf.data(), buf.size()), whole);
}

}  // namespace
}  // namespace talaria
