// The tcp transport's wire format (docs/protocol.md (tcp)): a fixed 56-byte little-endian frame
// header, optionally followed by a payload. Everything here is pure (no I/O, no allocation) so
// that the fuzz target can drive the decoders with arbitrary bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "talaria/util/result.hpp"

namespace talaria::na::tcp {

/// "TLRT" read as a little-endian u32.
inline constexpr uint32_t kFrameMagic = 0x54524c54u;
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr std::size_t kFrameHeaderSize = 56;

/// Largest message payload (unexpected and expected): max_*_size() of the transport.
inline constexpr std::size_t kMaxMessageSize = 64 * 1024;
/// Largest put/get moved by one frame (1 TiB): bounds what a peer can make us read or discard.
inline constexpr uint64_t kMaxRmaLength = uint64_t(1) << 40;
/// Longest address string carried in a hello frame or a serialized handle.
inline constexpr std::size_t kMaxAddrString = 255;
/// Hello payload: u64 instance id, u16 address length, address bytes; then, from a connector
/// that authenticates (na::Options::auth), u8 key id length, key id bytes, its 32-byte nonce.
inline constexpr std::size_t kHelloFixedSize = 10;
inline constexpr std::size_t kMaxKeyId = 255;
/// Nonces and HMAC-SHA256 proofs of the authentication frames.
inline constexpr std::size_t kAuthNonceSize = 32;
inline constexpr std::size_t kAuthProofSize = 32;
inline constexpr std::size_t kMaxHelloPayload =
    kHelloFixedSize + kMaxAddrString + 1 + kMaxKeyId + kAuthNonceSize;
/// The longest reason an auth `refused` frame carries.
inline constexpr std::size_t kMaxAuthReason = 255;

enum class FrameType : uint8_t {
    hello = 1,           ///< first frame of a connection, from the side that connected
    msg_unexpected = 2,  ///< unexpected message for context `context_id`
    msg_expected = 3,    ///< expected message, matched on (source, tag)
    put_req = 4,         ///< put: `rma_length` bytes of data follow, written at key/address
    put_resp = 5,        ///< put finished at the target with `status`
    get_req = 6,         ///< get: read `rma_length` bytes at key/address
    get_resp = 7,        ///< get reply: `status`, then the data when status is ok
    auth = 8,            ///< authentication step `context_id` (AuthStep), before any other
};

/// The steps of an auth frame (its header's context_id).
enum class AuthStep : uint8_t {
    challenge = 1,  ///< acceptor -> connector: its nonce, then its proof
    response = 2,   ///< connector -> acceptor: its proof
    refused = 3,    ///< either way: `status` says why (access_denied), the payload a reason
};

struct FrameHeader {
    FrameType type = FrameType::hello;
    uint8_t context_id = 0;
    Errc status = Errc::ok;
    uint32_t tag = 0;
    uint64_t length = 0;      ///< payload bytes that follow the header
    uint64_t cookie = 0;      ///< origin's id of a put/get, echoed by the response
    uint64_t key = 0;         ///< registration key (put_req, get_req)
    uint64_t address = 0;     ///< target virtual address (put_req, get_req)
    uint64_t rma_length = 0;  ///< bytes to move (put_req, get_req)
};

namespace detail {
inline void store_le(std::byte* p, uint64_t v, int n) noexcept {
    for (int i = 0; i < n; ++i)
        p[i] = std::byte(uint8_t(v >> (8 * i)));
}
inline uint64_t load_le(const std::byte* p, int n) noexcept {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v |= uint64_t(uint8_t(p[i])) << (8 * i);
    return v;
}
}  // namespace detail

/// Write `h` into out[0..kFrameHeaderSize).
inline void encode_frame_header(const FrameHeader& h, std::byte* out) noexcept {
    using detail::store_le;
    store_le(out + 0, kFrameMagic, 4);
    out[4] = std::byte(kFrameVersion);
    out[5] = std::byte(uint8_t(h.type));
    out[6] = std::byte(h.context_id);
    out[7] = std::byte(uint8_t(h.status));
    store_le(out + 8, h.tag, 4);
    store_le(out + 12, 0, 4);
    store_le(out + 16, h.length, 8);
    store_le(out + 24, h.cookie, 8);
    store_le(out + 32, h.key, 8);
    store_le(out + 40, h.address, 8);
    store_le(out + 48, h.rma_length, 8);
}

/// Decode and validate a frame header from the first kFrameHeaderSize bytes of `in`: magic,
/// version, type, reserved bits, status, and every length against its maximum for the type.
/// Errc::again when fewer than kFrameHeaderSize bytes are given, protocol_error otherwise.
Result<FrameHeader> decode_frame_header(std::span<const std::byte> in);

/// Hello payload contents.
struct Hello {
    uint64_t instance = 0;
    std::string_view address;  ///< "tcp://host:port", or empty for a client that does not listen
    /// The connector authenticates: the key id it names and its nonce (kAuthNonceSize bytes).
    bool auth = false;
    std::string_view key_id;
    const std::byte* nonce = nullptr;
};
/// Bytes of a hello payload for `address` (with the authentication part when `auth`).
inline std::size_t hello_size(std::string_view address, bool auth = false,
                              std::string_view key_id = {}) noexcept {
    return kHelloFixedSize + address.size() + (auth ? 1 + key_id.size() + kAuthNonceSize : 0);
}
/// Encode into out (at least hello_size(address) bytes; address at most kMaxAddrString).
void encode_hello(const Hello& h, std::byte* out) noexcept;
/// Decode a whole hello payload; the address views `in`.
Result<Hello> decode_hello(std::span<const std::byte> in);

/// Serialized memory handle: the owner's identity plus what the target checks.
struct MemBlob {
    uint64_t base = 0;
    uint64_t length = 0;
    uint64_t key = 0;
    uint8_t access = 0;
    std::string_view owner;  ///< owner's address string (views the input when decoded)
};
inline constexpr uint32_t kMemMagic = 0x4d524c54u;  // "TLRM"
inline constexpr std::size_t kMemBlobFixedSize = 32;
inline std::size_t mem_blob_size(std::string_view owner) noexcept {
    return kMemBlobFixedSize + owner.size();
}
void encode_mem_blob(const MemBlob& m, std::byte* out) noexcept;
Result<MemBlob> decode_mem_blob(std::span<const std::byte> in);

/// Serialized address: u16 length, then the address string.
Result<std::string_view> decode_addr_blob(std::span<const std::byte> in);

}  // namespace talaria::na::tcp
