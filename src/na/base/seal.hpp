// Protected streams (na::Auth::protect; docs/protocol.md, tcp "records"): once a connection is
// authenticated, each direction carries records, each its own AES-256-GCM message under a key of
// that direction derived from the handshake (na/base/auth.hpp), so that a byte changed, dropped,
// replayed or moved between directions fails the record's tag. With Protect::encryption the body
// is encrypted; with Protect::integrity it travels in clear and the tag covers it (GMAC). Over
// OpenSSL's libcrypto, which uses AES-NI and carry-less multiplication where the CPU has them.
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "talaria/na/na.hpp"
#include "talaria/util/result.hpp"

namespace talaria::na::seal {

/// Record: u32 kRecordMagic, u32 n (1..kMaxRecordBody), n bytes of body, 16 bytes of tag.
/// The 8-byte header is authenticated with the body.
inline constexpr uint32_t kRecordMagic = 0x53524c54u;  // "TLRS"
inline constexpr std::size_t kRecordHeaderSize = 8;
inline constexpr std::size_t kRecordTagSize = 16;
inline constexpr std::size_t kRecordOverhead = kRecordHeaderSize + kRecordTagSize;
inline constexpr std::size_t kMaxRecordBody = 32 * 1024;
inline constexpr std::size_t kKeySize = 32;

/// The body length a record header announces; protocol_error unless it is a record's (magic,
/// 1..kMaxRecordBody).
Result<std::size_t> record_length(std::span<const std::byte> header);

/// One direction of a protected stream: its key, its mode and the sequence number of its next
/// record (the nonce is the direction and that number, so no two records share one).
class Direction {
  public:
    Direction() = default;
    ~Direction();
    Direction(const Direction&) = delete;
    Direction& operator=(const Direction&) = delete;

    /// `direction`: 0 connector to acceptor, 1 the other way (part of every nonce).
    Result<void> init(std::span<const std::byte> key, uint32_t direction, Protect mode);
    [[nodiscard]] bool ready() const noexcept { return ctx_ != nullptr; }

    /// Seal the `n` body bytes at rec + kRecordHeaderSize in place: writes the header in front
    /// and the tag behind. Returns the record's size (n + kRecordOverhead).
    std::size_t seal(std::byte* rec, std::size_t n);
    /// The same, gathering the body from wherever it is (no copy before the cipher): begin a
    /// record of `n` body bytes at `rec`, add() exactly `n` bytes in pieces, finish() it.
    void begin(std::byte* rec, std::size_t n);
    void add(const std::byte* src, std::size_t len);
    std::size_t finish();
    /// Verify the whole record at `rec` (its body `n` bytes, as record_length said) and write
    /// its plaintext body to `out`; false (and nothing trustworthy in `out`) when its tag does
    /// not match: a changed, dropped, replayed or misdirected record, or another key or mode.
    bool open(const std::byte* rec, std::size_t n, std::byte* out);

  private:
    void nonce(unsigned char iv[12]) const noexcept;

    EVP_CIPHER_CTX* ctx_ = nullptr;
    std::byte* rec_ = nullptr;  ///< the record being sealed (begin .. finish)
    std::size_t n_ = 0, added_ = 0;
    uint32_t dir_ = 0;
    uint64_t seq_ = 0;
    Protect mode_ = Protect::none;
};

}  // namespace talaria::na::seal
