// Helpers shared by the na conformance suite and its peer process: the list of transports to
// run against, bounded progress loops, completion recorders and byte patterns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "talaria/na/na.hpp"

namespace talaria::na::test {

using namespace std::chrono_literals;

/// One instance of the suite: a transport and the address to open it with.
struct TransportKind {
    std::string label;    ///< test-name suffix: "inproc", "sm", "tcp", "tcp_ipv6", "ofi_tcp", ...
    std::string address;  ///< what na::open gets ("inproc://", "sm://", "tcp://127.0.0.1:0")
    bool multi_process;   ///< can talk to another process (inproc cannot)
};

/// gtest prints the parameter with this (instead of its bytes).
inline void PrintTo(const TransportKind& k, std::ostream* os) {
    *os << k.label << " (" << k.address << ")";
}

/// Set the libfabric provider variables docs/transports.md recommends, unless already set
/// (transport_kinds() calls it first, so every suite and the peers it spawns run with them).
void use_recommended_provider_env();
/// Every transport compiled in (na::transports_built()), plus tcp over [::1] when ::1 can be
/// bound here.
std::vector<TransportKind> transport_kinds();
/// Those of transport_kinds() that can talk to another process (all but inproc).
std::vector<TransportKind> multi_process_kinds();

/// A numbered flood (the back-pressure tests): message i carries tag kFloodTag + i, and its
/// bytes are i & 0xff but for the first four, which hold i.
inline constexpr Tag kFloodTag = 1000;
void fill_flood(std::span<std::byte> b, int i);
/// Receives a flood one message at a time, checking that each is whole and next in line.
struct FloodOrder {
    int next = 0;  ///< messages taken so far
    /// Message `c`, received into `buf`: empty when it is the next one, whole (and then
    /// counted), else what is wrong with it.
    std::string take(const Completion& c, std::span<const std::byte> buf);
};

/// The completions of many sends (post_counted_sends), each expected to succeed.
struct SendCount {
    int done = 0;    ///< completed, whatever the status
    int failed = 0;  ///< of those, not ok
};
/// Post `n` unexpected sends from `ctx` of `t` to context 0 of `dest`: send i carries `len`
/// bytes of `bufs[i % bufs.size()]` and tag `tag`, plus i when `numbered` (a flood). Their
/// completions count in `*count` (which must outlive them). The first failed post, else ok.
Result<void> post_counted_sends(Transport& t, Context& ctx, std::span<const MsgBuffer> bufs,
                                std::size_t len, const Addr& dest, int n, Tag tag, bool numbered,
                                SendCount* count);

/// Records the completions of one operation.
struct Recorder {
    int count = 0;
    Completion last;
    [[nodiscard]] bool done() const noexcept { return count > 0; }
};
inline Callback record(Recorder& r) {
    return [&r](const Completion& c) {
        ++r.count;
        r.last = c;
    };
}

/// Progress and trigger `ctxs` until `pred()` holds or `timeout` passes. Every wait in the
/// suite goes through here, so a failure is a bounded timeout, never a hang.
bool progress_until(std::initializer_list<Context*> ctxs, const std::function<bool()>& pred,
                    Duration timeout = 10s);
/// Progress and trigger for `d` regardless (to let stray completions show up).
void progress_for(std::initializer_list<Context*> ctxs, Duration d);

/// A message buffer of `size` bytes, or a test failure.
MsgBuffer alloc_buf(Transport& t, std::size_t size);

/// The calling thread's touch trace (talaria/util/touch_trace.hpp): the locks and pools it took
/// while recording; empty where tracing is not compiled in.
std::vector<const void*> my_touches();
/// The objects two threads' traces have in common.
std::vector<const void*> both_touched(std::vector<const void*> a, std::vector<const void*> b);

/// Deterministic bytes: the same (seed, index) always gives the same byte.
void fill_pattern(std::span<std::byte> s, uint32_t seed, std::size_t start = 0);
/// First index where `s` differs from the pattern, or nullopt when it matches.
std::optional<std::size_t> pattern_mismatch(std::span<const std::byte> s, uint32_t seed,
                                            std::size_t start = 0);

std::string to_hex(std::span<const std::byte> s);
std::optional<std::vector<std::byte>> from_hex(std::string_view s);

/// The tags of the peer protocol (tests/na/conformance/na_peer.cpp). Requests are unexpected
/// messages to the peer's context 0; replies are expected messages to the requester's context 0
/// with the request's tag.
enum PeerTag : Tag {
    kPeerEcho = 1,         ///< reply with the same payload
    kPeerChecksum = 2,     ///< reply with the 8-byte FNV-1a of the peer's whole region
    kPeerQuit = 3,         ///< reply with an empty message, then exit 0
    kPeerDelayedEcho = 4,  ///< like echo, but 300 ms later (the requester blocks meanwhile)
};

/// FNV-1a 64 over `s`.
uint64_t fnv1a(std::span<const std::byte> s);

}  // namespace talaria::na::test
