// Per-procedure statistics of a core::Engine, as read (merged over its contexts).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "talaria/util/histogram.hpp"
#include "talaria/util/result.hpp"

#pragma GCC visibility push(default)

namespace talaria::core {

/// Errc values counted apart (every code up to kLastErrc).
inline constexpr std::size_t kErrcCount = std::size_t(kLastErrc) + 1;

/// A latency histogram as read: recorded in ticks (talaria::ticks(), util/clock.hpp), answered
/// in nanoseconds.
struct Latency {
    Histogram::Snapshot hist;  ///< in ticks
    double ns_per_tick = 1.0;

    [[nodiscard]] uint64_t count() const noexcept { return hist.count(); }
    /// As Histogram::Snapshot::quantile, in nanoseconds.
    [[nodiscard]] uint64_t quantile(double q) const noexcept { return ns(hist.quantile(q)); }
    [[nodiscard]] uint64_t max() const noexcept { return ns(hist.max); }
    [[nodiscard]] uint64_t sum() const noexcept { return ns(hist.sum); }
    [[nodiscard]] double mean() const noexcept { return hist.mean() * ns_per_tick; }
    [[nodiscard]] uint64_t ns(uint64_t t) const noexcept {
        return uint64_t(double(t) * ns_per_tick + 0.5);
    }
};

/// One side of a procedure (the calls this engine made, or those it served), summed over the
/// engine's contexts.
struct ProcSideStats {
    uint64_t calls = 0;      ///< client: calls made; server: requests handed to the procedure
    uint64_t ok = 0;         ///< completed with a result (client), answered ok (server)
    uint64_t bytes_out = 0;  ///< client: argument bytes; server: result bytes
    uint64_t bytes_in = 0;   ///< client: result bytes; server: argument bytes
    /// Ended with each error code (index: Errc). client: what the call completed with
    /// (timeout, canceled, disconnected, the handler's error, ...); server: what the handler
    /// answered (one-way requests count ok when their handler is done).
    std::array<uint64_t, kErrcCount> errors{};
    /// client: round trip, from forward() to the completion (every outcome); server: handler
    /// time, from the handler's start to its answer (one-way: to its end).
    Latency latency;

    [[nodiscard]] uint64_t failed() const noexcept {
        uint64_t n = 0;
        for (uint64_t e : errors)
            n += e;
        return n;
    }
};

/// A procedure seen by this engine, called or served, under one provider id.
struct ProcStats {
    std::string name;  ///< empty when the engine never learned it (a raw core RpcId)
    uint32_t id = 0;   ///< its RpcId
    uint16_t provider = 0;
    ProcSideStats client;
    ProcSideStats server;
    /// How long a request waited between its arrival on the context's thread and its
    /// handler's start on an executor (Engine::define with one); handlers that run on the
    /// progress thread start at once and are not counted here.
    Latency queue;
};

/// Bulk transfers of one direction through the API (Engine::pull/push, Request::pull/push),
/// summed over the engine (Engine::transfer_stats).
struct TransferStats {
    uint64_t transfers = 0;  ///< completed, either way: ok + failed
    uint64_t ok = 0;
    uint64_t failed = 0;
    uint64_t bytes = 0;  ///< of the transfers that succeeded
    Latency latency;     ///< from the start of a transfer to its completion
};

/// Calls one context has in flight to one peer (Engine::calls_in_flight).
struct PeerCalls {
    std::string peer;  ///< its address
    uint8_t context = 0;
    uint32_t in_flight = 0;  ///< sent or waiting for a credit, not completed
    uint32_t queued = 0;     ///< of which wait for a credit (Options::peer_window)
};

}  // namespace talaria::core

#pragma GCC visibility pop
