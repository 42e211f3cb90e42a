// The ofi transport's wire format: the header in front of every message, and the serialized
// address and memory handle. Pure encoders/decoders (no libfabric), also used by
// fuzz/fuzz_ofi_wire.cpp. Byte layouts: docs/protocol.md (ofi); all integers little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "talaria/util/result.hpp"

namespace talaria::na::ofi {

/// First byte of every message header (also the format version: 2, lanes).
inline constexpr uint8_t kMsgMagic = 0xa8;
/// Fixed part of the header; the sender's raw provider addresses follow it.
inline constexpr std::size_t kMsgFixedSize = 20;
/// Longest raw provider address carried in a header (sockaddr_in6 is 28 bytes, shm names are
/// at most kMaxShmName characters).
inline constexpr std::size_t kMaxRawAddr = 64;
/// Room reserved in front of every message buffer for the header (fixed part + the sender's
/// two raw addresses, rounded up to a cache line so the payload stays aligned).
inline constexpr std::size_t kHeaderRoom = 192;
/// Largest message payload (unexpected and expected).
inline constexpr std::size_t kMaxMessageSize = 64 * 1024;
/// Longest address string ("ofi+<provider>://...") in a serialized address or memory handle.
inline constexpr std::size_t kMaxAddrString = 255;

enum class MsgKind : uint8_t {
    unexpected = 1,
    expected = 2,
    probe = 3,
    locate = 4,
    located = 5,
    auth = 6,  ///< authentication (Options::auth): the step is in the tag (AuthStep)
};
/// MsgHeader::flags: the sending context takes unexpected messages; the header carries the
/// token of the sender's authenticated session with the receiver (Options::auth), 8 bytes after
/// the fixed part.
inline constexpr uint8_t kFlagServes = 1;
inline constexpr uint8_t kFlagToken = 2;
inline constexpr std::size_t kTokenSize = 8;
static_assert(kMsgFixedSize + kTokenSize + 2 * kMaxRawAddr <= kHeaderRoom);

struct MsgHeader {
    MsgKind kind = MsgKind::unexpected;
    uint8_t context_id = 0;                ///< the destination context
    uint8_t source_ctx = 0;                ///< the sender's context (the lane it sent from)
    uint8_t flags = 0;                     ///< kFlagServes, kFlagToken
    uint64_t token = 0;                    ///< with kFlagToken
    uint32_t tag = 0;                      ///< na tag; locate/located: the token
    uint64_t instance = 0;                 ///< the sender's random transport instance (nonzero)
    std::span<const std::byte> raw_addr;   ///< the sender's transport address (its context 0)
    std::span<const std::byte> lane_addr;  ///< the sending lane's address; empty: raw_addr
    /// kMsgFixedSize (+ kTokenSize with kFlagToken) + raw_addr.size() + lane_addr.size()
    std::size_t header_size = 0;
};

/// Encode into `out` (at least header_size bytes); returns the size.
std::size_t encode_msg_header(const MsgHeader& h, std::byte* out) noexcept;
/// Decode a received message; the payload is in[header_size ..]. protocol_error on any
/// violation (bad magic, kind or flags, reserved byte set, zero instance, address length 0 or
/// above kMaxRawAddr, lane address above kMaxRawAddr, truncation, a probe with a payload, a
/// payload above kMaxMessageSize).
Result<MsgHeader> decode_msg_header(std::span<const std::byte> in);

/// A locate asks a peer which of its endpoints serves one kind of message for one context.
struct Locate {
    uint8_t ctx = 0;
    bool unexpected = true;
};
inline constexpr std::size_t kLocateSize = 2;
void encode_locate(const Locate& l, std::byte* out) noexcept;
Result<Locate> decode_locate(std::span<const std::byte> in);

/// Its answer: the endpoint (lane `lane`, address `raw`) that serves (ctx, kind), or
/// found = false when no context there does.
struct Located {
    uint8_t ctx = 0;
    bool unexpected = true;
    bool found = false;
    uint8_t lane = 0;
    std::span<const std::byte> raw;  ///< 1..kMaxRawAddr bytes when found, else empty
};
inline constexpr std::size_t kLocatedFixedSize = 5;
std::size_t encode_located(const Located& l, std::byte* out) noexcept;
Result<Located> decode_located(std::span<const std::byte> in);

/// Authentication (Options::auth; docs/protocol.md, ofi "auth"): the steps of the handshake
/// between two processes, in the header's tag. Payloads: request: u8 key id length (1..255),
/// key id, the connector's nonce (32); challenge: the acceptor's nonce (32), its proof (32);
/// response: the connector's proof (32); ok: empty; refused: why, printable ASCII (1..255).
enum class AuthStep : uint32_t { request = 1, challenge = 2, response = 3, ok = 4, refused = 5 };
inline constexpr std::size_t kAuthNonceSize = 32;
inline constexpr std::size_t kAuthProofSize = 32;
inline constexpr std::size_t kAuthMaxReason = 255;
/// Largest authentication payload: a request with a key id of 255 bytes.
inline constexpr std::size_t kAuthMaxPayload = 1 + 255 + kAuthNonceSize;
struct AuthMsg {
    AuthStep step = AuthStep::request;
    std::string_view key_id;           ///< request
    std::span<const std::byte> nonce;  ///< request, challenge
    std::span<const std::byte> proof;  ///< challenge, response
    std::string_view reason;           ///< refused
};
/// Encode a request's payload; returns its size.
std::size_t encode_auth_request(std::string_view key_id, std::span<const std::byte> nonce,
                                std::byte* out) noexcept;
/// The payload of an auth message of step `tag` (views `in`); protocol_error on an unknown step
/// or a payload that is not that step's.
Result<AuthMsg> decode_auth(uint32_t tag, std::span<const std::byte> in);

/// Serialized address: u16 length, then that many bytes of the address string.
std::size_t addr_blob_size(std::string_view s) noexcept;
void encode_addr_blob(std::string_view s, std::byte* out) noexcept;
/// The address string inside a blob (a view into `in`): address_invalid when malformed
/// (length 0 or above kMaxAddrString, truncated, trailing bytes, bytes outside printable ASCII).
Result<std::string_view> decode_addr_blob(std::span<const std::byte> in);

/// Serialized memory handle.
struct MemBlob {
    uint8_t access = 0;      ///< na::Access (1, 2 or 3)
    uint8_t flags = 0;       ///< kMemVirtAddr: RMA addresses are virtual addresses
    uint64_t base = 0;       ///< the region's virtual address at its owner
    uint64_t length = 0;     ///< bytes
    uint64_t key = 0;        ///< the provider's remote key
    std::string_view owner;  ///< the owner's address string
};
inline constexpr uint8_t kMemVirtAddr = 1;
inline constexpr std::size_t kMemFixedSize = 32;
std::size_t mem_blob_size(std::string_view owner) noexcept;
void encode_mem_blob(const MemBlob& b, std::byte* out) noexcept;
/// invalid_argument / address_invalid on malformed input (bad version, access or flags, a
/// region that wraps, a bad owner string, truncation, trailing bytes).
Result<MemBlob> decode_mem_blob(std::span<const std::byte> in);

namespace detail {
inline void store_le(std::byte* p, uint64_t v, int n) noexcept {
    for (int i = 0; i < n; ++i)
        p[i] = std::byte(uint8_t(v >> (8 * i)));
}
inline uint64_t load_le(const std::byte* p, int n) noexcept {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v |= uint64_t(p[i]) << (8 * i);
    return v;
}
}  // namespace detail

}  // namespace talaria::na::ofi
