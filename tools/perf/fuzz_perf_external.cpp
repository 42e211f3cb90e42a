// Fuzz target: the decoders of bytes from other processes in the external baselines
// (ext_parse.hpp): fi_pingpong and ucx_perftest output, the raw RMA baseline's result line, and
// its out-of-band hello. The whole input goes through every decoder; a hello that decodes must
// re-encode to the same bytes and respect its bounds; a parsed number must be positive and
// finite. Any violation aborts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

#include "ext_parse.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz_perf_external: %s\n", what);
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace talaria::perf;
    std::string_view text(reinterpret_cast<const char*>(data), data ? size : 0);
    if (auto rtt = parse_fi_pingpong_round_trip(text); rtt)
        if (!(*rtt > 0) || !std::isfinite(*rtt)) fail("fi_pingpong: a non-positive round trip");
    if (auto r = parse_ucx_perftest(text); r)
        if (r->iterations == 0 || !(r->overall_lat_us > 0) || !std::isfinite(r->overall_lat_us))
            fail("ucx_perftest: an impossible result");
    if (auto r = parse_raw_ofi_rma(text); r)
        if (r->iters == 0 || r->ns == 0) fail("raw-ofi-rma: an impossible result");
    std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), data ? size : 0);
    if (auto h = decode_rma_hello(bytes); h) {
        if (h->name_len == 0 || h->name_len > kRmaNameMax) fail("hello: name length out of range");
        if (h->size == 0 || h->addr > UINT64_MAX - h->size) fail("hello: bad buffer bounds");
        auto again = encode_rma_hello(*h);
        if (std::memcmp(again.data(), data, kRmaHelloSize) != 0)
            fail("hello: a decoded hello does not re-encode to the same bytes");
    }
    return 0;
}
