// CRC-32C. The hardware path uses the SSE4.2 crc32 instruction, 8 bytes at a time, selected at
// run time with __builtin_cpu_supports so the binary still runs on CPUs without it.
#include "talaria/util/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace talaria {

namespace {
constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> make_table() {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k)
            c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
        t[i] = c;
    }
    return t;
}
constexpr auto kTable = make_table();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const void* data,
                                                        std::size_t len) noexcept {
    auto* p = static_cast<const unsigned char*>(data);
    uint64_t c = ~crc;
    while (len >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    auto c32 = static_cast<uint32_t>(c);
    while (len--)
        c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

using Fn = uint32_t (*)(uint32_t, const void*, std::size_t) noexcept;
Fn select() noexcept {
#if defined(__x86_64__)
    // We run from a static initializer, possibly before libgcc's CPU detection constructor:
    // GCC requires __builtin_cpu_init() first in that case (else the feature reads as absent).
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) return &crc32c_sse42;
#endif
    return &crc32c_portable;
}
const Fn g_impl = select();
}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, std::size_t len) noexcept {
    auto* p = static_cast<const unsigned char*>(data);
    uint32_t c = ~crc;
    while (len--)
        c = kTable[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

uint32_t crc32c(uint32_t crc, const void* data, std::size_t len) noexcept {
    return g_impl(crc, data, len);
}

bool crc32c_hardware() noexcept {
    return g_impl != &crc32c_portable;
}

}  // namespace talaria
