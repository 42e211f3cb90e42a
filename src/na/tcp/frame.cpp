// Decoders of the tcp wire format: every field that comes off a socket is checked here before
// the transport uses it.
#include "na/tcp/frame.hpp"

#include <fmt/format.h>

namespace talaria::na::tcp {

using detail::load_le;
using detail::store_le;

Result<FrameHeader> decode_frame_header(std::span<const std::byte> in) {
    if (in.size() < kFrameHeaderSize)
        return Error(Errc::again, fmt::format("frame header needs {} bytes, have {}",
                                              kFrameHeaderSize, in.size()));
    const std::byte* p = in.data();
    uint32_t magic = uint32_t(load_le(p, 4));
    if (magic != kFrameMagic)
        return Error(Errc::protocol_error,
                     magic == 0x53524c54u  // "TLRS": a protected record (na/base/seal.hpp)
                         ? std::string("a protected record where a frame belongs: the peer "
                                       "protects its stream and this side does not (set the "
                                       "same na::Auth::protect on both sides)")
                         : fmt::format("bad frame magic {:#010x} (expected {:#010x}): the peer "
                                       "is not a talaria tcp endpoint or the stream is out of "
                                       "sync",
                                       magic, kFrameMagic));
    uint8_t version = uint8_t(p[4]);
    if (version != kFrameVersion)
        return Error(Errc::protocol_error,
                     fmt::format("frame version {} not supported (this build speaks {})", version,
                                 kFrameVersion));
    FrameHeader h;
    uint8_t type = uint8_t(p[5]);
    if (type < uint8_t(FrameType::hello) || type > uint8_t(FrameType::auth))
        return Error(Errc::protocol_error, fmt::format("unknown frame type {}", type));
    h.type = FrameType(type);
    h.context_id = uint8_t(p[6]);
    uint8_t status = uint8_t(p[7]);
    if (status > uint8_t(Errc::internal))
        return Error(Errc::protocol_error, fmt::format("unknown status code {}", status));
    h.status = Errc(status);
    h.tag = uint32_t(load_le(p + 8, 4));
    if (load_le(p + 12, 4) != 0)
        return Error(Errc::protocol_error, "reserved header bytes 12..15 are not zero");
    h.length = load_le(p + 16, 8);
    h.cookie = load_le(p + 24, 8);
    h.key = load_le(p + 32, 8);
    h.address = load_le(p + 40, 8);
    h.rma_length = load_le(p + 48, 8);

    auto bad = [&](std::string_view why) {
        return Error(Errc::protocol_error,
                     fmt::format("frame type {} with length {} rma_length {} status {}: {}", type,
                                 h.length, h.rma_length, status, why));
    };
    switch (h.type) {
        case FrameType::hello:
            if (h.length < kHelloFixedSize || h.length > kMaxHelloPayload)
                return bad("hello payload size out of bounds");
            break;
        case FrameType::msg_unexpected:
        case FrameType::msg_expected:
            if (h.length > kMaxMessageSize) return bad("message larger than 64 KiB");
            break;
        case FrameType::put_req:
            if (h.rma_length > kMaxRmaLength) return bad("put larger than 1 TiB");
            if (h.length != h.rma_length) return bad("put data length differs from rma_length");
            break;
        case FrameType::get_req:
            if (h.rma_length > kMaxRmaLength) return bad("get larger than 1 TiB");
            if (h.length != 0) return bad("get request carries a payload");
            break;
        case FrameType::put_resp:
            if (h.length != 0) return bad("put response carries a payload");
            break;
        case FrameType::get_resp:
            if (h.length > kMaxRmaLength) return bad("get response larger than 1 TiB");
            if (h.status != Errc::ok && h.length != 0) return bad("failed get carries data");
            break;
        case FrameType::auth:
            switch (AuthStep(h.context_id)) {
                case AuthStep::challenge:
                    if (h.length != kAuthNonceSize + kAuthProofSize)
                        return bad("auth challenge is not a nonce and a proof");
                    break;
                case AuthStep::response:
                    if (h.length != kAuthProofSize) return bad("auth response is not a proof");
                    break;
                case AuthStep::refused:
                    if (h.length > kMaxAuthReason) return bad("auth refusal reason too long");
                    if (h.status == Errc::ok) return bad("auth refusal without a status");
                    break;
                default:
                    return bad("unknown auth step");
            }
            break;
    }
    const bool may_have_status = h.type == FrameType::put_resp || h.type == FrameType::get_resp ||
                                 (h.type == FrameType::auth && h.context_id == 3);
    if (!may_have_status && h.status != Errc::ok)
        return bad("status set on a frame that is not a response");
    return h;
}

void encode_hello(const Hello& h, std::byte* out) noexcept {
    store_le(out, h.instance, 8);
    store_le(out + 8, h.address.size(), 2);
    if (!h.address.empty()) std::memcpy(out + kHelloFixedSize, h.address.data(), h.address.size());
    if (!h.auth) return;
    std::byte* p = out + kHelloFixedSize + h.address.size();
    *p++ = std::byte(uint8_t(h.key_id.size()));
    if (!h.key_id.empty()) std::memcpy(p, h.key_id.data(), h.key_id.size());
    p += h.key_id.size();
    std::memcpy(p, h.nonce, kAuthNonceSize);
}

Result<Hello> decode_hello(std::span<const std::byte> in) {
    if (in.size() < kHelloFixedSize || in.size() > kMaxHelloPayload)
        return Error(Errc::protocol_error,
                     fmt::format("hello payload of {} bytes (expected {}..{})", in.size(),
                                 kHelloFixedSize, kMaxHelloPayload));
    Hello h;
    h.instance = load_le(in.data(), 8);
    std::size_t len = load_le(in.data() + 8, 2);
    if (len > kMaxAddrString || len > in.size() - kHelloFixedSize)
        return Error(Errc::protocol_error,
                     fmt::format("hello address length {} does not fit the payload ({} bytes)", len,
                                 in.size() - kHelloFixedSize));
    h.address = std::string_view(reinterpret_cast<const char*>(in.data()) + kHelloFixedSize, len);
    std::size_t rest = in.size() - kHelloFixedSize - len;
    if (rest == 0) return h;
    // The authentication part: key id length, key id, nonce, and nothing after.
    const std::byte* p = in.data() + kHelloFixedSize + len;
    std::size_t key_len = uint8_t(p[0]);
    if (rest != 1 + key_len + kAuthNonceSize)
        return Error(Errc::protocol_error,
                     fmt::format("hello authentication part of {} bytes does not hold a key id of "
                                 "{} bytes and a {}-byte nonce",
                                 rest, key_len, kAuthNonceSize));
    h.auth = true;
    h.key_id = std::string_view(reinterpret_cast<const char*>(p + 1), key_len);
    h.nonce = p + 1 + key_len;
    return h;
}

void encode_mem_blob(const MemBlob& m, std::byte* out) noexcept {
    store_le(out, kMemMagic, 4);
    out[4] = std::byte(kFrameVersion);
    out[5] = std::byte(m.access);
    store_le(out + 6, m.owner.size(), 2);
    store_le(out + 8, m.base, 8);
    store_le(out + 16, m.length, 8);
    store_le(out + 24, m.key, 8);
    if (!m.owner.empty()) std::memcpy(out + kMemBlobFixedSize, m.owner.data(), m.owner.size());
}

Result<MemBlob> decode_mem_blob(std::span<const std::byte> in) {
    if (in.size() < kMemBlobFixedSize)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized tcp memory handle of {} bytes is shorter than {}",
                                 in.size(), kMemBlobFixedSize));
    const std::byte* p = in.data();
    if (load_le(p, 4) != kMemMagic)
        return Error(Errc::invalid_argument,
                     "not a serialized tcp memory handle (bad magic): was it made by another "
                     "transport?");
    if (uint8_t(p[4]) != kFrameVersion)
        return Error(Errc::invalid_argument,
                     fmt::format("memory handle version {} not supported", uint8_t(p[4])));
    MemBlob m;
    m.access = uint8_t(p[5]);
    if (m.access < 1 || m.access > 3)
        return Error(Errc::invalid_argument,
                     fmt::format("memory handle access mode {} is invalid", m.access));
    std::size_t owner_len = load_le(p + 6, 2);
    if (owner_len > kMaxAddrString || in.size() < kMemBlobFixedSize + owner_len)
        return Error(Errc::invalid_argument,
                     fmt::format("memory handle owner string of {} bytes does not fit in {} bytes",
                                 owner_len, in.size()));
    m.base = load_le(p + 8, 8);
    m.length = load_le(p + 16, 8);
    m.key = load_le(p + 24, 8);
    if (m.base + m.length < m.base)
        return Error(Errc::invalid_argument, "memory handle region wraps around the address space");
    m.owner = std::string_view(reinterpret_cast<const char*>(p) + kMemBlobFixedSize, owner_len);
    return m;
}

Result<std::string_view> decode_addr_blob(std::span<const std::byte> in) {
    if (in.size() < 2)
        return Error(Errc::address_invalid, "serialized tcp address shorter than 2 bytes");
    std::size_t len = load_le(in.data(), 2);
    if (len == 0 || len > kMaxAddrString || in.size() < 2 + len)
        return Error(
            Errc::address_invalid,
            fmt::format("serialized tcp address length {} invalid for {} bytes", len, in.size()));
    return std::string_view(reinterpret_cast<const char*>(in.data()) + 2, len);
}

}  // namespace talaria::na::tcp
