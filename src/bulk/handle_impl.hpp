// The shared state behind bulk::Handle (private to the bulk layer).
//
// Immutable once built: copies of a Handle share one Impl through a shared_ptr<const Impl>, so
// any thread may read it without a lock. Destroying the last copy destroys the MemHandles,
// which deregisters a local handle's segments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "talaria/bulk/bulk.hpp"
#include "talaria/na/na.hpp"

namespace talaria::bulk {

/// Encoding constants (docs/protocol.md, "bulk handle").
inline constexpr uint8_t kEncodingVersion = 1;  ///< high nibble of the first byte
inline constexpr uint8_t kFlagInline = 0x01;    ///< segment bytes follow instead of mem handles
inline constexpr uint8_t kFlagHasOwner = 0x02;  ///< an owner address follows the segments
/// A null handle (Handle{}): this byte is the whole encoding, no other flag with it.
inline constexpr uint8_t kFlagNull = 0x04;
/// The owner does not listen (na::Transport::listens): only the process it sent the handle to
/// can reach it. Without kFlagHasOwner the sender is the owner; with it, the handle was relayed
/// by another process, and no address follows (nobody here can reach the owner).
inline constexpr uint8_t kFlagOwnerDoesNotListen = 0x08;
inline constexpr uint8_t kFlagsKnown =
    kFlagInline | kFlagHasOwner | kFlagNull | kFlagOwnerDoesNotListen;

struct Handle::Impl {
    struct Seg {
        uint64_t offset = 0;        ///< of the segment's first byte within the handle
        uint64_t size = 0;          ///< at least 1
        std::byte* data = nullptr;  ///< local handles: the caller's memory (not owned)
        na::MemHandle mem;  ///< the registration (local) or the peer's (remote); none inline
    };

    na::Transport* transport = nullptr;
    Access access = Access::read_only;
    bool local = false;
    bool is_inline = false;        ///< decoded with its bytes inline (then `bytes` holds them)
    bool embed_owner = false;      ///< local: put addr_self() into the encoding
    uint64_t size = 0;             ///< sum of the segment sizes
    std::vector<Seg> segs;         ///< in handle order; offsets ascending
    std::vector<std::byte> bytes;  ///< inline handles: all `size` bytes
    na::Addr owner;                ///< remote: embedded owner, else the decoder's source
    /// remote: the owner does not listen (it sent the handle here itself: owner is the source;
    /// relayed onward, the handle names no owner)
    bool owner_does_not_listen = false;
    /// remote: relayed here by a process other than its owner, which does not listen: no
    /// transfer over the network can reach the owner from here
    bool relayed = false;

    /// Index of the segment holding handle offset `off` (< size).
    [[nodiscard]] std::size_t segment_at(uint64_t off) const noexcept;
};

}  // namespace talaria::bulk
