// What the hostile suite (hostile_test.cpp) and its server process (hostile_server.cpp) agree
// on: the server's procedures and the limits it runs with, small enough that a test can reach
// them without gigabytes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace talaria::hostile {

/// Replies with its argument bytes (the good client's call).
inline constexpr std::string_view kEcho = "echo";
/// Takes any arguments and replies with nothing (a procedure large arguments may go to).
inline constexpr std::string_view kSink = "sink";

/// core::Options of the server: the largest argument it accepts, the large-argument bytes it
/// holds at once (one kClaim fits, two do not), and how long a pull may take.
inline constexpr std::size_t kMaxPayload = std::size_t(64) << 20;
inline constexpr std::size_t kLargeBudget = std::size_t(96) << 20;
inline constexpr std::size_t kClaim = std::size_t(48) << 20;
inline constexpr auto kPullTimeout = std::chrono::milliseconds(1500);
/// When this environment variable names a key id, the server admits only peers holding the
/// secret of that key: kSecretByte repeated 32 times (tcp, ofi+tcp, ucx+tcp).
inline constexpr const char* kKeyVariable = "TALARIA_HOSTILE_KEY";
inline constexpr char kSecretByte = 's';
/// na::Options::hello_timeout of the server (tcp).
inline constexpr auto kHelloTimeout = std::chrono::seconds(2);

/// Keeps the request kHold, then replies with the number of requests the server held when it
/// took this one (4 bytes, little-endian): a handler that answers later, as API coroutines do.
inline constexpr std::string_view kHoldProc = "hold";
inline constexpr auto kHold = std::chrono::milliseconds(100);
/// Keeps the request and never answers it (until the server stops): calls that wait.
inline constexpr std::string_view kNever = "never";
/// Exposed memory (issue 10, item 3): `expose` registers two regions of one kExposedSize
/// buffer, filled with exposed_byte(i): [kReadOnlyAt, +kRegionSize) read-only and
/// [kWriteOnlyAt, +kRegionSize) write-only, and replies u64 base of each, then each handle
/// (u16 length, na::mem_serialize bytes); `peek` replies with the whole buffer; `drop`
/// deregisters the write-only region.
inline constexpr std::string_view kExpose = "expose";
inline constexpr std::string_view kPeek = "peek";
inline constexpr std::string_view kDrop = "drop";
inline constexpr std::size_t kExposedSize = 16384;
inline constexpr std::size_t kRegionSize = 4096;
inline constexpr std::size_t kReadOnlyAt = 4096;
inline constexpr std::size_t kWriteOnlyAt = 8192;
inline constexpr std::byte exposed_byte(std::size_t i) noexcept {
    return std::byte(uint8_t(i * 7 + 3));
}
/// Replies with the heap bytes the server's allocator holds in use (u64, little-endian:
/// mallinfo2's uordblks + hblkhd): what it allocated and did not free, whatever the allocator
/// keeps resident after a free. 0 under AddressSanitizer, whose allocator does not count.
inline constexpr std::string_view kHeap = "heap";
/// core::Options::max_requests and max_requests_per_peer of the server.
inline constexpr uint32_t kMaxRequests = 256;
inline constexpr uint32_t kMaxRequestsPerPeer = 64;

}  // namespace talaria::hostile
