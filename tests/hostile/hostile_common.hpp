// What the hostile suite (hostile_test.cpp) and its server process (hostile_server.cpp) agree
// on: the server's procedures and the limits it runs with, small enough that a test can reach
// them without gigabytes.
#pragma once

#include <chrono>
#include <cstddef>
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
/// na::Options::hello_timeout of the server (tcp).
inline constexpr auto kHelloTimeout = std::chrono::seconds(2);

}  // namespace talaria::hostile
