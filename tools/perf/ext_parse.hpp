// talaria-perf: every decoder of bytes that come from another process in the external
// baselines, kept free of libfabric/UCX so the fuzz target (fuzz_perf_external.cpp) runs them
// all: the output of fi_pingpong and ucx_perftest, and the raw libfabric RMA baseline's
// out-of-band hello (exchanged over a TCP socket between its two halves) and result line.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "talaria/util/result.hpp"

namespace talaria::perf {

/// fi_pingpong's result row: "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec".
/// usec/xfer is elapsed / (iterations * 2) (fabtests' show_perf with two transfers per
/// iteration): half a round trip. Returns the round trip in microseconds (2 * usec/xfer).
Result<double> parse_fi_pingpong_round_trip(std::string_view output);

/// ucx_perftest -v (CSV) result: "iterations,50.0_percentile_lat,avg_lat,overall_lat,...".
/// overall_lat is elapsed / iterations, divided by 2 for ping-pong tests (tag_lat:
/// ucx_perf_calc_result's factor): returns overall_lat in microseconds as printed.
struct UcxPerfResult {
    uint64_t iterations = 0;
    double overall_lat_us = 0;
};
Result<UcxPerfResult> parse_ucx_perftest(std::string_view output);

/// The raw RMA baseline's hello: what a peer needs to reach our registered buffer.
/// Layout (little-endian, 296 bytes): u32 magic "TROF", u32 version 1, u64 buffer address
/// (0 unless the provider uses FI_MR_VIRT_ADDR), u64 key, u64 size, u32 name length (1..256),
/// u32 reserved (0), u8 name[256] (the endpoint name from fi_getname, zero-padded).
inline constexpr uint32_t kRmaHelloMagic = 0x464f5254;  // "TROF"
inline constexpr std::size_t kRmaNameMax = 256;
inline constexpr std::size_t kRmaHelloSize = 40 + kRmaNameMax;
struct RmaHello {
    uint64_t addr = 0;
    uint64_t key = 0;
    uint64_t size = 0;
    uint32_t name_len = 0;
    std::array<std::byte, kRmaNameMax> name{};
};
std::array<std::byte, kRmaHelloSize> encode_rma_hello(const RmaHello& h) noexcept;
Result<RmaHello> decode_rma_hello(std::span<const std::byte> bytes);

/// The raw RMA baseline client's result line:
/// "talaria-raw-ofi-rma op=<read|write> size=<bytes> iters=<n> inflight=<n> ns=<elapsed>".
struct RmaResult {
    uint64_t size = 0;
    uint64_t iters = 0;
    uint64_t ns = 0;
};
Result<RmaResult> parse_raw_ofi_rma(std::string_view output);

}  // namespace talaria::perf
