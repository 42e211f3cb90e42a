// talaria-perf: decoders of the external baselines' output and hello (see ext_parse.hpp).
// Every input is untrusted: bounded scans, no allocation sized from the input, every number
// range-checked.
#include "ext_parse.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace talaria::perf {

namespace {

/// Split `line` at runs of any character of `seps` (at most `max` fields).
std::vector<std::string_view> fields(std::string_view line, std::string_view seps,
                                     std::size_t max = 32) {
    std::vector<std::string_view> out;
    std::size_t i = 0;
    while (i < line.size() && out.size() < max) {
        while (i < line.size() && seps.find(line[i]) != std::string_view::npos)
            ++i;
        if (i >= line.size()) break;
        std::size_t j = i;
        while (j < line.size() && seps.find(line[j]) == std::string_view::npos)
            ++j;
        out.push_back(line.substr(i, j - i));
        i = j;
    }
    return out;
}

/// A finite, non-negative decimal number (the whole field).
bool to_double(std::string_view s, double& v) {
    if (s.empty() || s.size() > 64) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && p == s.data() + s.size() && std::isfinite(v) && v >= 0;
}

bool to_u64(std::string_view s, uint64_t& v) {
    if (s.empty() || s.size() > 20) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && p == s.data() + s.size();
}

/// Call f(line) for every line (without '\r'), until f returns true.
template <class F>
bool each_line(std::string_view text, F&& f) {
    std::size_t pos = 0;
    while (pos < text.size()) {
        std::size_t nl = text.find('\n', pos);
        std::size_t end = nl == std::string_view::npos ? text.size() : nl;
        std::string_view line = text.substr(pos, end - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (f(line)) return true;
        pos = end + 1;
    }
    return false;
}

std::string excerpt(std::string_view s) {
    std::string e(s.substr(0, 200));
    for (char& c : e)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = ' ';
    return e;
}

void put32(std::byte* p, uint32_t v) noexcept {
    for (int i = 0; i < 4; ++i)
        p[i] = std::byte((v >> (8 * i)) & 0xff);
}
void put64(std::byte* p, uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i)
        p[i] = std::byte((v >> (8 * i)) & 0xff);
}
uint32_t get32(const std::byte* p) noexcept {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
        v |= uint32_t(p[i]) << (8 * i);
    return v;
}
uint64_t get64(const std::byte* p) noexcept {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
        v |= uint64_t(p[i]) << (8 * i);
    return v;
}

}  // namespace

Result<double> parse_fi_pingpong_round_trip(std::string_view output) {
    bool header = false;
    double usec = -1;
    each_line(output, [&](std::string_view line) {
        auto f = fields(line, " \t");
        if (!header) {
            // "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec"
            header = f.size() >= 7 && f[0] == "bytes" && f[6] == "usec/xfer";
            return false;
        }
        double v = 0;
        if (f.size() >= 7 && to_double(f[6], v)) {
            usec = v;
            return true;
        }
        return false;
    });
    if (!header)
        return Error(Errc::protocol_error,
                     fmt::format("fi_pingpong printed no result header ('bytes ... usec/xfer'): "
                                 "'{}'",
                                 excerpt(output)));
    if (usec <= 0)
        return Error(Errc::protocol_error,
                     fmt::format("fi_pingpong printed no usable usec/xfer: '{}'", excerpt(output)));
    return 2 * usec;
}

Result<UcxPerfResult> parse_ucx_perftest(std::string_view output) {
    bool header = false;
    UcxPerfResult r;
    bool found = false;
    each_line(output, [&](std::string_view line) {
        auto f = fields(line, ", \t");  // the result row is indented
        if (!header) {
            header = f.size() >= 4 && f[0] == "iterations" && f[3] == "overall_lat";
            return false;
        }
        // The final row; progress rows of threads start with "[thread N]".
        uint64_t it = 0;
        double lat = 0;
        if (f.size() >= 4 && to_u64(f[0], it) && to_double(f[3], lat) && it > 0) {
            r.iterations = it;
            r.overall_lat_us = lat;
            found = true;
        }
        return false;
    });
    if (!header)
        return Error(Errc::protocol_error,
                     fmt::format("ucx_perftest printed no CSV header ('iterations,...,"
                                 "overall_lat'): '{}'",
                                 excerpt(output)));
    if (!found || r.overall_lat_us <= 0)
        return Error(Errc::protocol_error,
                     fmt::format("ucx_perftest printed no result row: '{}'", excerpt(output)));
    return r;
}

std::array<std::byte, kRmaHelloSize> encode_rma_hello(const RmaHello& h) noexcept {
    std::array<std::byte, kRmaHelloSize> b{};
    put32(b.data(), kRmaHelloMagic);
    put32(b.data() + 4, 1);
    put64(b.data() + 8, h.addr);
    put64(b.data() + 16, h.key);
    put64(b.data() + 24, h.size);
    put32(b.data() + 32, h.name_len);
    put32(b.data() + 36, 0);
    std::memcpy(b.data() + 40, h.name.data(), kRmaNameMax);
    return b;
}

Result<RmaHello> decode_rma_hello(std::span<const std::byte> b) {
    if (b.size() != kRmaHelloSize)
        return Error(Errc::protocol_error, fmt::format("raw RMA hello of {} bytes (expected {})",
                                                       b.size(), kRmaHelloSize));
    if (get32(b.data()) != kRmaHelloMagic)
        return Error(Errc::protocol_error, "raw RMA hello: bad magic");
    if (get32(b.data() + 4) != 1)
        return Error(Errc::protocol_error,
                     fmt::format("raw RMA hello: version {} (expected 1)", get32(b.data() + 4)));
    RmaHello h;
    h.addr = get64(b.data() + 8);
    h.key = get64(b.data() + 16);
    h.size = get64(b.data() + 24);
    h.name_len = get32(b.data() + 32);
    if (h.name_len == 0 || h.name_len > kRmaNameMax)
        return Error(Errc::protocol_error,
                     fmt::format("raw RMA hello: endpoint name of {} bytes (1..{})", h.name_len,
                                 kRmaNameMax));
    if (get32(b.data() + 36) != 0)
        return Error(Errc::protocol_error, "raw RMA hello: reserved != 0");
    if (h.size == 0 || h.size > (uint64_t(1) << 30))
        return Error(Errc::protocol_error,
                     fmt::format("raw RMA hello: buffer of {} bytes (1 B..1 GiB)", h.size));
    if (h.addr > UINT64_MAX - h.size)
        return Error(Errc::protocol_error, "raw RMA hello: buffer address + size overflows");
    std::memcpy(h.name.data(), b.data() + 40, kRmaNameMax);
    return h;
}

Result<RmaResult> parse_raw_ofi_rma(std::string_view output) {
    RmaResult r;
    bool found = false;
    each_line(output, [&](std::string_view line) {
        auto f = fields(line, " ");
        if (f.empty() || f[0] != "talaria-raw-ofi-rma") return false;
        bool have_size = false, have_iters = false, have_ns = false;
        for (std::size_t i = 1; i < f.size(); ++i) {
            auto eq = f[i].find('=');
            if (eq == std::string_view::npos) continue;
            auto k = f[i].substr(0, eq), v = f[i].substr(eq + 1);
            if (k == "size") have_size = to_u64(v, r.size);
            if (k == "iters") have_iters = to_u64(v, r.iters);
            if (k == "ns") have_ns = to_u64(v, r.ns);
        }
        found = have_size && have_iters && have_ns && r.iters > 0 && r.ns > 0;
        return found;
    });
    if (!found)
        return Error(
            Errc::protocol_error,
            fmt::format("the raw RMA baseline printed no result line: '{}'", excerpt(output)));
    return r;
}

}  // namespace talaria::perf
