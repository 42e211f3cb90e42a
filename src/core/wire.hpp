// The RPC core's wire format (docs/protocol.md, "RPC messages"): a 48-byte header in front of
// every message the core sends, and the descriptor of a payload too large to send eagerly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "talaria/na/na.hpp"
#include "talaria/util/result.hpp"

namespace talaria::core::wire {

inline constexpr uint16_t kMagic = 0x5254;  // bytes "TR"
inline constexpr uint8_t kVersion = 3;
inline constexpr std::size_t kHeaderSize = 48;

/// Header flags.
enum : uint8_t {
    kResponse = 0x01,  ///< a response (else a request or an ack)
    kOneWay = 0x02,    ///< request: no response wanted
    kMore = 0x04,      ///< the payload is a MoreDescriptor: pull the real bytes
    kChecksum = 0x08,  ///< crc holds crc32c of the header (crc = 0) and the payload
    kAck = 0x10,       ///< the receiver of a kMore payload has pulled it
    /// A busy response whose payload starts with a u32: how many milliseconds the caller
    /// should wait at least before it sends the call again (Options::busy_retry_after).
    kRetryAfter = 0x20,
    /// The caller gave up on its call `seq` (Future::cancel): no payload, nothing answers it;
    /// the target's Request::cancelled() turns true.
    kCancel = 0x40,
};
inline constexpr uint8_t kKnownFlags = 0x7F;

/// The largest deadline budget a request carries (microseconds, about 71 minutes); a longer
/// one travels as this.
inline constexpr uint32_t kMaxBudgetUs = 0xFFFFFFFFu;

/// The na tag of every core message, and the tag of the peer watch (never sent).
inline constexpr na::Tag kMessageTag = 0x54520001;
inline constexpr na::Tag kWatchTag = 0xFFFFFFFF;

struct Header {
    uint8_t flags = 0;
    uint32_t rpc_id = 0;
    uint32_t seq = 0;
    uint8_t target_ctx = 0;  ///< context of the receiver that handles this message
    uint8_t reply_ctx = 0;   ///< context of the sender (responses and acks go there)
    uint16_t status = 0;     ///< responses: an Errc (0 = ok)
    uint32_t payload_len = 0;
    uint32_t crc = 0;
    // Requests only (0 in responses, acks and cancels):
    uint16_t provider = 0;   ///< which instance of the procedure (0: the default one)
    uint32_t budget_us = 0;  ///< time left of the caller's deadline when sent (0: none)
    uint64_t signature = 0;  ///< hash of the caller's argument and result types (0: unchecked)
    // Any message: the call's trace id (CallOptions::trace_id; 0: none). A response carries
    // its request's.
    uint64_t trace = 0;
};

/// Write `h` into out[0..kHeaderSize). When h.flags has kChecksum, `payload` must be the bytes
/// that follow and the crc is computed here.
void encode_header(Header h, std::byte* out, std::span<const std::byte> payload);

/// Parse and validate a received message: magic, version, known flags, payload length equal to
/// what arrived, status a known Errc, the request-only fields 0 elsewhere, checksum when flagged.
/// protocol_error says which.
Result<Header> decode_header(std::span<const std::byte> msg);

/// The payload of a kMore message: where to pull the real payload from.
///   u64 total length, u32 crc32c of the real payload (0 when not checksummed),
///   u16 length of the memory handle, the na mem_serialize bytes.
struct MoreDescriptor {
    uint64_t total = 0;
    uint32_t data_crc = 0;
    std::span<const std::byte> mem;  ///< points into the message
};
inline constexpr std::size_t kMoreFixedSize = 14;

Result<MoreDescriptor> decode_more(std::span<const std::byte> payload);
/// Write a descriptor; returns bytes written or message_too_large if it does not fit.
Result<std::size_t> encode_more(const MoreDescriptor& d, std::span<std::byte> out);

}  // namespace talaria::core::wire
