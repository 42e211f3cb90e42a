// What the RPC suite (rpc_test.cpp) and its peer process (rpc_peer.cpp) agree on: the names of
// the peer's procedures and the size and pattern of its large result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace talaria::core::test {

/// Replies with its argument bytes.
inline constexpr std::string_view kPeerEcho = "echo";
/// Never responds: the peer keeps the Request and prints "hang <n>" on stdout when it has it,
/// so the test knows the call arrived before it kills the peer.
inline constexpr std::string_view kPeerHang = "hang";
/// Replies with kPeerLargeSize bytes of pattern kPeerLargeSeed (na::test::fill_pattern).
inline constexpr std::string_view kPeerLarge = "large";

/// Replies with kPeerHugeSize bytes of pattern kPeerLargeSeed, then prints "huge" on stdout (the
/// test kills the peer then, while the caller is likely still pulling the result).
inline constexpr std::string_view kPeerHuge = "huge";

inline constexpr std::size_t kPeerLargeSize = std::size_t(4) << 20;
inline constexpr std::size_t kPeerHugeSize = std::size_t(64) << 20;
inline constexpr uint32_t kPeerLargeSeed = 11;

}  // namespace talaria::core::test
