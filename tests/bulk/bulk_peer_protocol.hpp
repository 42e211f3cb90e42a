// The requests bulk_test sends to bulk_peer: unexpected messages to the peer's context 0, each
// answered by an expected message to the requester's context 0 with the request's tag.
#pragma once

#include <cstddef>
#include <cstdint>

#include "talaria/na/na.hpp"

namespace talaria::bulk::test {

enum BulkPeerTag : na::Tag {
    kGetHandle = 10,  ///< reply: the encoding of the peer's read_write multi-segment handle
    kGetInline = 11,  ///< reply: the encoding of a 100-byte read_only handle (travels inline)
    kGetOwned = 12,   ///< reply: the region's handle again, with its owner embedded
    kChecksum = 13,   ///< reply: FNV-1a 64 (8 bytes) over the region's bytes in handle order
    kQuit = 14,       ///< reply: empty, then the peer exits 0
};

/// The peer's region: these segment sizes, filled with fill_pattern(seed kRegionSeed) at
/// their offset within the handle.
inline constexpr std::size_t kPeerSegments[] = {70001, 1, 4095, 30000};
inline constexpr uint32_t kRegionSeed = 11;
inline constexpr std::size_t kInlineSize = 100;
inline constexpr uint32_t kInlineSeed = 12;

}  // namespace talaria::bulk::test
