// ucx transport wire format: the decoders of bytes from peers, all bounds-checked.
#include "na/ucx/wire.hpp"

#include <cstring>

#include <fmt/format.h>

namespace talaria::na::ucx {

using detail::load_le;
using detail::store_le;

Result<MsgHeader> decode_msg_header(std::span<const std::byte> in) {
    if (in.size() != kMsgHeaderSize)
        return Error(Errc::protocol_error, fmt::format("ucx message header of {} bytes (expected "
                                                       "{})",
                                                       in.size(), kMsgHeaderSize));
    const std::byte* p = in.data();
    if (uint8_t(p[0]) != kWireVersion)
        return Error(Errc::protocol_error,
                     fmt::format("ucx message header version {} (expected {})", uint8_t(p[0]),
                                 kWireVersion));
    uint8_t kind = uint8_t(p[1]);
    if (kind < uint8_t(MsgKind::hello) || kind > uint8_t(MsgKind::rma_data))
        return Error(Errc::protocol_error, fmt::format("ucx message kind {} is unknown", kind));
    MsgHeader h;
    h.kind = MsgKind(kind);
    h.context_id = uint8_t(p[2]);
    h.source_ctx = uint8_t(p[3]);
    h.tag = uint32_t(load_le(p + 4, 4));
    h.instance = load_le(p + 8, 8);
    if (h.instance == 0) return Error(Errc::protocol_error, "ucx message header: instance 0");
    h.seq = uint32_t(load_le(p + 16, 4));
    h.stream = uint32_t(load_le(p + 20, 4));
    return h;
}

void encode_rma_header(const RmaHeader& r, std::byte* out) noexcept {
    store_le(out, r.key, 8);
    store_le(out + 8, r.address, 8);
    store_le(out + 16, r.cookie, 8);
    store_le(out + 24, r.length, 4);
    out[28] = std::byte(r.status);
    out[29] = out[30] = out[31] = std::byte{0};
}

Result<RmaHeader> decode_rma_header(std::span<const std::byte> in, bool is_request) {
    if (in.size() != kRmaHeaderSize)
        return Error(
            Errc::protocol_error,
            fmt::format("ucx put/get header of {} bytes (expected {})", in.size(), kRmaHeaderSize));
    const std::byte* p = in.data();
    RmaHeader r;
    r.key = load_le(p, 8);
    r.address = load_le(p + 8, 8);
    r.cookie = load_le(p + 16, 8);
    r.length = uint32_t(load_le(p + 24, 4));
    r.status = uint8_t(p[28]);
    if (r.length > kRmaChunk)
        return Error(
            Errc::protocol_error,
            fmt::format("ucx put/get of {} bytes in one request (limit {})", r.length, kRmaChunk));
    if (r.status > uint8_t(kLastErrc) || (is_request && r.status != 0))
        return Error(Errc::protocol_error, fmt::format("ucx put/get status {}", r.status));
    if (load_le(p + 29, 3) != 0)
        return Error(Errc::protocol_error, "ucx put/get header: reserved bytes are not zero");
    return r;
}

void encode_hello(std::string_view address, std::span<const std::byte> worker, std::byte* out,
                  uint32_t pid, uint32_t pidns) noexcept {
    store_le(out, address.size(), 2);
    if (!address.empty()) std::memcpy(out + 2, address.data(), address.size());
    std::byte* w = out + 2 + address.size();
    store_le(w, worker.size(), 2);
    if (!worker.empty()) std::memcpy(w + 2, worker.data(), worker.size());
    if (pidns != 0) {
        store_le(w + 2 + worker.size(), pid, 4);
        store_le(w + 6 + worker.size(), pidns, 4);
    }
}

Result<Hello> decode_hello(std::span<const std::byte> in, bool is_signed, bool has_process) {
    Hello h;
    if (is_signed) {
        if (in.size() < kHelloTailSize)
            return Error(Errc::protocol_error,
                         fmt::format("signed ucx hello payload of {} bytes has no room for its "
                                     "{}-byte tail",
                                     in.size(), kHelloTailSize));
        auto tail = in.last(kHelloTailSize);
        h.session = load_le(tail.data(), 8);
        h.mac = tail.subspan(8);
        in = in.first(in.size() - kHelloTailSize);
    }
    const std::span<const std::byte> body = in;
    if (has_process) {
        if (in.size() < kHelloProcessSize)
            return Error(Errc::protocol_error,
                         fmt::format("ucx hello payload of {} bytes has no room for its {}-byte "
                                     "process part",
                                     in.size(), kHelloProcessSize));
        auto part = in.last(kHelloProcessSize);
        h.pid = uint32_t(load_le(part.data(), 4));
        h.pidns = uint32_t(load_le(part.data() + 4, 4));
        if (h.pid == 0 || h.pidns == 0)
            return Error(Errc::protocol_error, "ucx hello process part names pid or namespace 0");
        in = in.first(in.size() - kHelloProcessSize);
    }
    if (in.size() < 4)
        return Error(Errc::protocol_error,
                     fmt::format("ucx hello payload of {} bytes is shorter than 4", in.size()));
    std::size_t len = load_le(in.data(), 2);
    if (len == 0 || len > kMaxAddrString || len > in.size() - 4)
        return Error(Errc::protocol_error,
                     fmt::format("ucx hello address length {} does not fit its {}-byte payload "
                                 "(or exceeds {})",
                                 len, in.size(), kMaxAddrString));
    std::size_t wlen = load_le(in.data() + 2 + len, 2);
    if (wlen == 0 || wlen > kMaxWorkerAddr || wlen != in.size() - 4 - len)
        return Error(Errc::protocol_error,
                     fmt::format("ucx hello worker address length {} does not match its {}-byte "
                                 "payload (or exceeds {})",
                                 wlen, in.size(), kMaxWorkerAddr));
    h.address = std::string_view(reinterpret_cast<const char*>(in.data()) + 2, len);
    h.body = body;
    h.worker = in.subspan(4 + len, wlen);
    return h;
}

Result<bool> decode_locate(std::span<const std::byte> in) {
    if (in.size() != kLocateSize || uint8_t(in[0]) > 1)
        return Error(
            Errc::protocol_error,
            fmt::format("ucx locate payload of {} bytes (expected one byte, 0 or 1)", in.size()));
    return in[0] == std::byte{0};
}

void encode_located(const Located& l, std::byte* out) noexcept {
    out[0] = std::byte(l.lane);
    out[1] = std::byte(l.unexpected ? 0 : 1);
    store_le(out + 2, l.worker.size(), 2);
    if (!l.worker.empty()) std::memcpy(out + 4, l.worker.data(), l.worker.size());
}

Result<Located> decode_located(std::span<const std::byte> in) {
    if (in.size() < 4)
        return Error(Errc::protocol_error,
                     fmt::format("ucx located payload of {} bytes is shorter than 4", in.size()));
    if (uint8_t(in[1]) > 1)
        return Error(Errc::protocol_error,
                     fmt::format("ucx located payload: kind {} is unknown", uint8_t(in[1])));
    std::size_t wlen = load_le(in.data() + 2, 2);
    if (wlen == 0 || wlen > kMaxWorkerAddr || wlen != in.size() - 4)
        return Error(Errc::protocol_error,
                     fmt::format("ucx located worker address length {} does not match its "
                                 "{}-byte payload (or exceeds {})",
                                 wlen, in.size(), kMaxWorkerAddr));
    Located l;
    l.lane = uint8_t(in[0]);
    l.unexpected = in[1] == std::byte{0};
    l.worker = in.subspan(4, wlen);
    return l;
}

void encode_boot_fixed(const BootFixed& f, std::byte* out) noexcept {
    store_le(out, kBootMagic, 4);
    out[4] = std::byte(kBootVersion);
    out[5] = std::byte(uint8_t(f.kind));
    store_le(out + 6, f.length, 2);
    store_le(out + 8, f.instance, 8);
}

Result<BootFixed> decode_boot_fixed(std::span<const std::byte> fixed) {
    if (fixed.size() != kBootFixedSize)
        return Error(
            Errc::protocol_error,
            fmt::format("ucx bootstrap frame of {} bytes is not a fixed part (expected {})",
                        fixed.size(), kBootFixedSize));
    if (load_le(fixed.data(), 4) != kBootMagic)
        return Error(Errc::protocol_error,
                     fmt::format("ucx bootstrap: bad magic {:#010x} (expected {:#010x}): the "
                                 "peer is not a talaria ucx+tcp endpoint",
                                 uint32_t(load_le(fixed.data(), 4)), kBootMagic));
    if (uint8_t(fixed[4]) != kBootVersion)
        return Error(Errc::protocol_error,
                     fmt::format("ucx bootstrap: version {} (this side speaks {})",
                                 uint8_t(fixed[4]), kBootVersion));
    BootFixed f;
    f.kind = BootKind(uint8_t(fixed[5]));
    f.length = load_le(fixed.data() + 6, 2);
    f.instance = load_le(fixed.data() + 8, 8);
    if (f.instance == 0) return Error(Errc::protocol_error, "ucx bootstrap: instance 0");
    bool fits = false;
    switch (f.kind) {
        case BootKind::request:
            fits = f.length == 0 ||
                   (f.length >= 2 + kBootNonceSize && f.length <= kBootMaxRequestBody);
            break;
        case BootKind::challenge:
            fits = f.length == kBootNonceSize + kBootProofSize;
            break;
        case BootKind::response:
            fits = f.length == kBootProofSize;
            break;
        case BootKind::answer:
            fits = f.length >= 1 && f.length <= kMaxWorkerAddr;
            break;
        case BootKind::refused:
            fits = f.length >= 1 && f.length <= kBootMaxReason;
            break;
        default:
            return Error(Errc::protocol_error,
                         fmt::format("ucx bootstrap: frame kind {} is unknown", uint8_t(fixed[5])));
    }
    if (!fits)
        return Error(Errc::protocol_error,
                     fmt::format("ucx bootstrap: a {}-byte body is out of bounds for kind {}",
                                 f.length, uint8_t(f.kind)));
    return f;
}

void encode_boot_request_body(std::string_view key_id, std::span<const std::byte> nonce,
                              std::byte* out) noexcept {
    if (key_id.empty()) return;
    out[0] = std::byte(uint8_t(key_id.size()));
    std::memcpy(out + 1, key_id.data(), key_id.size());
    std::memcpy(out + 1 + key_id.size(), nonce.data(), kBootNonceSize);
}

Result<BootRequest> decode_boot_request_body(std::span<const std::byte> body) {
    BootRequest r;
    if (body.empty()) return r;
    std::size_t klen = uint8_t(body[0]);
    if (klen == 0 || body.size() != 1 + klen + kBootNonceSize)
        return Error(Errc::protocol_error,
                     fmt::format("ucx bootstrap request: a {}-byte body does not hold a key id of "
                                 "{} bytes and a {}-byte nonce",
                                 body.size(), klen, kBootNonceSize));
    r.key_id = std::string_view(reinterpret_cast<const char*>(body.data() + 1), klen);
    r.nonce = body.subspan(1 + klen, kBootNonceSize);
    return r;
}

Result<std::string_view> decode_boot_refused(std::span<const std::byte> body) {
    for (std::byte b : body)
        if (uint8_t(b) < 0x20 || uint8_t(b) > 0x7e)
            return Error(Errc::protocol_error,
                         "ucx bootstrap refusal: its reason is not printable ASCII");
    if (body.empty() || body.size() > kBootMaxReason)
        return Error(Errc::protocol_error, "ucx bootstrap refusal: no reason, or too long");
    return std::string_view(reinterpret_cast<const char*>(body.data()), body.size());
}

Result<std::string_view> decode_addr_blob(std::span<const std::byte> in) {
    if (in.size() < 2)
        return Error(Errc::address_invalid, "serialized ucx address shorter than 2 bytes");
    std::size_t len = load_le(in.data(), 2);
    if (len == 0 || len > kMaxAddrString || in.size() < 2 + len)
        return Error(
            Errc::address_invalid,
            fmt::format("serialized ucx address length {} invalid for {} bytes", len, in.size()));
    return std::string_view(reinterpret_cast<const char*>(in.data()) + 2, len);
}

void encode_mem_blob(const MemBlob& m, std::byte* out) noexcept {
    store_le(out, kMemMagic, 4);
    out[4] = std::byte(kMemVersion);
    out[5] = std::byte(m.access);
    store_le(out + 6, 0, 2);
    store_le(out + 8, m.base, 8);
    store_le(out + 16, m.length, 8);
    store_le(out + 24, m.rkey.size(), 4);
    store_le(out + 28, m.owner.size(), 4);
    store_le(out + 32, m.pid, 4);
    store_le(out + 36, m.pidns, 4);
    store_le(out + 40, m.key, 8);
    if (!m.rkey.empty()) std::memcpy(out + kMemBlobFixedSize, m.rkey.data(), m.rkey.size());
    if (!m.owner.empty())
        std::memcpy(out + kMemBlobFixedSize + m.rkey.size(), m.owner.data(), m.owner.size());
}

Result<MemBlob> decode_mem_blob(std::span<const std::byte> in) {
    if (in.size() < kMemBlobFixedSize)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized ucx memory handle of {} bytes is shorter than {}",
                                 in.size(), kMemBlobFixedSize));
    const std::byte* p = in.data();
    if (load_le(p, 4) != kMemMagic)
        return Error(Errc::invalid_argument,
                     "not a serialized ucx memory handle (bad magic): was it made by another "
                     "transport?");
    if (uint8_t(p[4]) != kMemVersion)
        return Error(Errc::invalid_argument,
                     fmt::format("ucx memory handle version {} not supported (expected {})",
                                 uint8_t(p[4]), kMemVersion));
    MemBlob m;
    m.access = uint8_t(p[5]);
    if (m.access < 1 || m.access > 3)
        return Error(Errc::invalid_argument,
                     fmt::format("ucx memory handle access mode {} is invalid", m.access));
    if (load_le(p + 6, 2) != 0)
        return Error(Errc::invalid_argument, "ucx memory handle: reserved bytes are not zero");
    m.base = load_le(p + 8, 8);
    m.length = load_le(p + 16, 8);
    uint64_t rkey_len = load_le(p + 24, 4);
    uint64_t owner_len = load_le(p + 28, 4);
    m.pid = uint32_t(load_le(p + 32, 4));
    m.pidns = uint32_t(load_le(p + 36, 4));
    m.key = load_le(p + 40, 8);
    if ((m.pid == 0) != (m.pidns == 0) || m.pid > 0x7fffffffu)
        return Error(Errc::invalid_argument,
                     fmt::format("ucx memory handle owner process {} in pid namespace {} is "
                                 "invalid",
                                 m.pid, m.pidns));
    if (m.base + m.length < m.base)
        return Error(Errc::invalid_argument,
                     "ucx memory handle region wraps around the address space");
    if (rkey_len > kMaxRkeySize)
        return Error(Errc::invalid_argument,
                     fmt::format("ucx memory handle remote key of {} bytes exceeds {}", rkey_len,
                                 kMaxRkeySize));
    // A region has either a remote key (UCX moves the bytes) or a key its owner serves it by;
    // an empty one has neither.
    if (m.length == 0 ? (rkey_len != 0 || m.key != 0) : ((rkey_len == 0) == (m.key == 0)))
        return Error(Errc::invalid_argument,
                     fmt::format("ucx memory handle of {} bytes with a {}-byte remote key and "
                                 "key {:#x}",
                                 m.length, rkey_len, m.key));
    if (owner_len == 0 || owner_len > kMaxAddrString)
        return Error(Errc::invalid_argument,
                     fmt::format("ucx memory handle owner string of {} bytes", owner_len));
    if (in.size() - kMemBlobFixedSize < rkey_len + owner_len)
        return Error(Errc::invalid_argument,
                     fmt::format("ucx memory handle needs {} bytes, has {}",
                                 kMemBlobFixedSize + rkey_len + owner_len, in.size()));
    m.rkey = in.subspan(kMemBlobFixedSize, std::size_t(rkey_len));
    m.owner = std::string_view(reinterpret_cast<const char*>(p) + kMemBlobFixedSize + rkey_len,
                               std::size_t(owner_len));
    return m;
}

bool is_hex(std::string_view s) noexcept {
    if (s.empty() || s.size() % 2 != 0) return false;
    for (char c : s)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}

}  // namespace talaria::na::ucx
