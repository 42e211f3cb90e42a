// The sm transport's bytes: the shared segment and ring layout, the ring slot header, the
// handshake messages on the UNIX socket, and the serialized address and memory handle. Every
// decoder here is pure (bytes in, value or rejection out) so that fuzz_sm_header can drive it;
// everything that comes from a peer goes through one of them before use. docs/protocol.md (sm)
// describes the same layout for humans.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "talaria/na/na.hpp"
#include "talaria/util/result.hpp"

namespace talaria::na::sm {

// --- sizes -------------------------------------------------------------------------------------

inline constexpr std::size_t kCacheLine = 64;
/// Largest message (unexpected and expected alike): one slot's payload.
inline constexpr uint32_t kMaxMsgSize = 4096;
/// Bytes before the payload in every slot.
inline constexpr uint32_t kSlotHeaderSize = 16;
/// A slot: header plus payload, rounded up to whole cache lines.
inline constexpr uint32_t kSlotSize =
    (kSlotHeaderSize + kMaxMsgSize + kCacheLine - 1) / kCacheLine * kCacheLine;
/// Slots per ring (a power of two: the index of sequence number s is s % kRingSlots).
inline constexpr uint32_t kRingSlots = 64;
static_assert((kRingSlots & (kRingSlots - 1)) == 0);

/// Longest endpoint name ("sm://<name>"); keeps the socket path below sun_path's 108 bytes.
inline constexpr std::size_t kMaxNameLen = 64;

// --- the shared segment --------------------------------------------------------------------------

/// Control block of one single-producer single-consumer ring. There is no shared tail: a slot
/// is published by the sequence number in its own header (written last), so a consumer polling
/// for the next message touches only that slot's cache line. Each field has its own line.
struct RingCtl {
    /// Sequence number of the next slot the consumer reads (written by the consumer only).
    alignas(kCacheLine) std::atomic<uint64_t> head;
    /// Non-zero while the consumer is about to sleep (or asleep): the producer, after
    /// publishing a slot, swaps it to 0 and rings the consumer's eventfd if it was set. A ring
    /// has exactly one consumer context (the connection's), so one flag says it all.
    alignas(kCacheLine) std::atomic<uint64_t> waiting;
    /// Set by the producer before it sleeps on a full ring; the consumer clears it and rings
    /// the producer's eventfd after freeing slots.
    alignas(kCacheLine) std::atomic<uint32_t> space_wanted;
};
static_assert(sizeof(RingCtl) == 3 * kCacheLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

inline constexpr uint32_t kSegMagic = 0x47534d54;  // "TMSG" little-endian: 'T','M','S','G'
/// 3: a connection joins one context of each side (hello names both), RingCtl::waiting is a
/// flag again (one consumer context per ring). 4: registrations live in a table peers map and
/// check before each put/get (its memfd travels with hello and ack; memory handle slot and key).
inline constexpr uint32_t kVersion = 4;

/// First cache line of a segment (written once by the connecting side before the handshake).
struct SegHeader {
    uint32_t magic;
    uint32_t version;
    uint32_t ring_slots;
    uint32_t slot_size;
    uint64_t segment_size;
    uint32_t creator_pid;
    uint32_t reserved;
    unsigned char pad[kCacheLine - 32];
};
static_assert(sizeof(SegHeader) == kCacheLine);

/// Offsets inside a segment. Ring 0 carries connector -> acceptor, ring 1 acceptor -> connector.
inline constexpr std::size_t kRingCtlOffset[2] = {kCacheLine, kCacheLine + sizeof(RingCtl)};
inline constexpr std::size_t kSlotsOffset0 = kCacheLine + 2 * sizeof(RingCtl);
inline constexpr std::size_t kRingBytes = std::size_t(kRingSlots) * kSlotSize;
inline constexpr std::size_t kSlotsOffset[2] = {kSlotsOffset0, kSlotsOffset0 + kRingBytes};
inline constexpr std::size_t kSegmentSize = (kSlotsOffset0 + 2 * kRingBytes + 4095) / 4096 * 4096;

/// Checks a mapped segment's header against this build's layout.
bool seg_header_valid(const SegHeader& h) noexcept;

// --- ring slots --------------------------------------------------------------------------------

enum class MsgKind : uint8_t { unexpected = 1, expected = 2 };

/// A validated slot header.
struct SlotHeader {
    uint32_t len = 0;
    Tag tag = 0;
    MsgKind kind = MsgKind::unexpected;
    uint8_t ctx = 0;
    /// Low 32 bits of (sequence number + 1): the slot holds message s when seq == uint32_t(s+1).
    uint32_t seq = 0;
};

/// Offset of the publishing sequence word in a slot header.
inline constexpr std::size_t kSlotSeqOffset = 12;

/// Slot header bytes: 0 u32 len | 4 u32 tag | 8 u8 kind | 9 u8 ctx | 10 u16 zero | 12 u32 seq.
/// Writes all 16 bytes plainly; the ring publishes with slot_seq_publish() instead.
inline void encode_slot_header(std::byte* out, const SlotHeader& h) noexcept {
    unsigned char b[kSlotHeaderSize] = {};
    std::memcpy(b, &h.len, 4);
    std::memcpy(b + 4, &h.tag, 4);
    b[8] = static_cast<unsigned char>(h.kind);
    b[9] = h.ctx;
    std::memcpy(b + kSlotSeqOffset, &h.seq, 4);
    std::memcpy(out, b, kSlotHeaderSize);
}

/// The sequence word of a slot, for atomic access (slots are cache-line aligned).
inline std::atomic_ref<uint32_t> slot_seq(std::byte* slot) noexcept {
    return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(slot + kSlotSeqOffset));
}
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

/// Decode a slot header read from a ring (the peer may have written anything there). `in`
/// must hold at least kSlotHeaderSize bytes. Returns false for a header no correct peer
/// writes: length above kMaxMsgSize, unknown kind, non-zero reserved bytes. The caller checks
/// the sequence number.
inline bool decode_slot_header(const std::byte* in, SlotHeader& out) noexcept {
    unsigned char b[kSlotHeaderSize];
    std::memcpy(b, in, kSlotHeaderSize);  // one snapshot: the peer may be writing meanwhile
    uint32_t len;
    std::memcpy(&len, b, 4);
    if (len > kMaxMsgSize) return false;
    if (b[8] != uint8_t(MsgKind::unexpected) && b[8] != uint8_t(MsgKind::expected)) return false;
    if (b[10] != 0 || b[11] != 0) return false;
    out.len = len;
    std::memcpy(&out.tag, b + 4, 4);
    out.kind = static_cast<MsgKind>(b[8]);
    out.ctx = b[9];
    std::memcpy(&out.seq, b + kSlotSeqOffset, 4);
    return true;
}

/// A consumer head read by the producer against its own tail: the number of filled slots, or
/// -1 when the pair is impossible (more than kRingSlots apart, or head ahead of tail).
inline int64_t ring_fill(uint64_t head, uint64_t tail) noexcept {
    uint64_t n = tail - head;
    return n > kRingSlots ? -1 : int64_t(n);
}

// --- handshake messages (SOCK_SEQPACKET, one message per packet) -------------------------------

enum class HsType : uint8_t { hello = 1, ack = 2, wake = 3 };
inline constexpr uint32_t kHsMagic = 0x48534d54;  // 'T','M','S','H'
inline constexpr std::size_t kHsFixedSize = 48;
inline constexpr std::size_t kHsMaxSize = kHsFixedSize + kMaxNameLen;

/// A handshake message. hello: connector -> acceptor with fds [segment, doorbell eventfd of
/// the connector's context, its registration table]; ack: acceptor -> connector with fds
/// [doorbell of the acceptor's context, its registration table] (none when refused); wake: either
/// way, no fds, only makes the receiver poll its rings (used while the peer's eventfd is not known
/// yet).
struct Handshake {
    HsType type = HsType::wake;
    uint8_t status = 0;   ///< ack: 0 accepted, otherwise the Errc of the refusal
    uint8_t src_ctx = 0;  ///< hello: the connector's context; ack: the acceptor's
    uint8_t dst_ctx = 0;  ///< hello: the context asked for; ack: the connector's
    uint32_t pid = 0;
    uint64_t instance = 0;    ///< random per transport instance
    uint64_t probe_addr = 0;  ///< address of an 8-byte word holding `instance` in the sender
    std::string_view name;    ///< the sender's endpoint name (points into the decoded bytes)
};

/// Encode into `out` (at least kHsMaxSize bytes); returns the byte count.
std::size_t encode_handshake(const Handshake& m, std::span<std::byte> out) noexcept;
/// Decode one packet. Rejects wrong magic/version/type, a layout different from this build's,
/// a bad name, and any size other than exactly the encoded size.
Result<Handshake> decode_handshake(std::span<const std::byte> in);

/// Endpoint names: 1..kMaxNameLen characters of [A-Za-z0-9._-].
bool name_valid(std::string_view name) noexcept;

// --- serialized address and memory handle ------------------------------------------------------

inline constexpr uint32_t kAddrMagic = 0x41534d54;  // 'T','M','S','A'
/// Address: 0 u32 magic | 4 u8 name_len | 5 name bytes.
std::size_t addr_wire_size(std::string_view name) noexcept;
std::size_t encode_addr(std::string_view name, std::span<std::byte> out) noexcept;
Result<std::string_view> decode_addr(std::span<const std::byte> in);

inline constexpr uint32_t kMemMagic = 0x524d4d54;  // 'T','M','M','R'
inline constexpr std::size_t kMemWireSize = 48;
/// Registrations one sm transport holds at most (its table: kMaxRegistrations RegEntry).
inline constexpr uint32_t kMaxRegistrations = 1u << 16;
struct MemWire {
    Access access = Access::read_only;
    uint32_t pid = 0;
    uint64_t instance = 0;
    uint64_t base = 0;
    uint64_t length = 0;
    uint32_t slot = 0;  ///< its entry in the owner's registration table
    uint64_t key = 0;   ///< what that entry holds while the registration lives (0: empty region)
};
/// Memory handle: 0 u32 magic | 4 u8 version | 5 u8 access | 6 u16 0 | 8 u32 pid | 12 u32 slot
/// | 16 u64 instance | 24 u64 base | 32 u64 length | 40 u64 key. A non-empty region has a
/// nonzero key and a slot below kMaxRegistrations; an empty one has neither.
void encode_mem(const MemWire& m, std::span<std::byte, kMemWireSize> out) noexcept;
Result<MemWire> decode_mem(std::span<const std::byte> in);

/// One entry of a transport's registration table (a sealed memfd of kRegsBytes that its
/// peers map read-only and check before each put/get, docs/protocol.md sm). `key` is 0 while
/// the slot is free; the owner writes base, length and access first and the key last, and
/// zeroes the key first when it deregisters. Read and written with atomic builtins.
struct RegEntry {
    uint64_t key;
    uint64_t base;
    uint64_t length;
    uint64_t access;
};
static_assert(sizeof(RegEntry) == 32);
inline constexpr std::size_t kRegsBytes = std::size_t(kMaxRegistrations) * sizeof(RegEntry);

}  // namespace talaria::na::sm
