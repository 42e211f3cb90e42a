// CRC-32C (Castagnoli), SSE4.2 instructions where the CPU has them, a table otherwise.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cstddef>
#include <cstdint>

namespace talaria {

/// Extend `crc` (start with 0) over `len` bytes. crc32c("123456789") == 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* data, std::size_t len) noexcept;

/// The portable implementation (always available; tests compare both).
uint32_t crc32c_portable(uint32_t crc, const void* data, std::size_t len) noexcept;

/// Whether crc32c() uses the SSE4.2 instruction on this CPU.
bool crc32c_hardware() noexcept;

}  // namespace talaria

#pragma GCC visibility pop
