// ofi wire format: encoders and bounds-checked decoders (see ofi_wire.hpp).
#include "na/ofi/ofi_wire.hpp"

#include <cstring>

#include <fmt/format.h>

namespace talaria::na::ofi {

using detail::load_le;
using detail::store_le;

namespace {
constexpr uint8_t kMemVersion = 1;

bool printable(std::string_view s) noexcept {
    for (char c : s)
        if (c < 0x21 || c > 0x7e) return false;
    return true;
}
}  // namespace

std::size_t encode_msg_header(const MsgHeader& h, std::byte* out) noexcept {
    out[0] = std::byte(kMsgMagic);
    out[1] = std::byte(uint8_t(h.kind));
    out[2] = std::byte(h.context_id);
    out[3] = std::byte(uint8_t(h.raw_addr.size()));
    store_le(out + 4, h.tag, 4);
    store_le(out + 8, h.instance, 8);
    if (!h.raw_addr.empty()) std::memcpy(out + kMsgFixedSize, h.raw_addr.data(), h.raw_addr.size());
    return kMsgFixedSize + h.raw_addr.size();
}

Result<MsgHeader> decode_msg_header(std::span<const std::byte> in) {
    if (in.size() < kMsgFixedSize)
        return Error(Errc::protocol_error,
                     fmt::format("ofi message of {} bytes is shorter than its {}-byte header",
                                 in.size(), kMsgFixedSize));
    if (uint8_t(in[0]) != kMsgMagic)
        return Error(Errc::protocol_error,
                     fmt::format("ofi message with bad magic 0x{:02x}", uint8_t(in[0])));
    MsgHeader h;
    uint8_t kind = uint8_t(in[1]);
    if (kind < 1 || kind > 3)
        return Error(Errc::protocol_error, fmt::format("ofi message of unknown kind {}", kind));
    h.kind = MsgKind(kind);
    h.context_id = uint8_t(in[2]);
    std::size_t alen = uint8_t(in[3]);
    h.tag = uint32_t(load_le(in.data() + 4, 4));
    h.instance = load_le(in.data() + 8, 8);
    if (h.instance == 0) return Error(Errc::protocol_error, "ofi message with instance id 0");
    if (alen == 0 || alen > kMaxRawAddr)
        return Error(Errc::protocol_error,
                     fmt::format("ofi message with a {}-byte sender address (1..{} allowed)", alen,
                                 kMaxRawAddr));
    if (in.size() < kMsgFixedSize + alen)
        return Error(
            Errc::protocol_error,
            fmt::format("ofi message of {} bytes truncated inside its sender address", in.size()));
    h.raw_addr = in.subspan(kMsgFixedSize, alen);
    h.header_size = kMsgFixedSize + alen;
    if (h.kind == MsgKind::probe && in.size() != h.header_size)
        return Error(Errc::protocol_error, "ofi probe message with a payload");
    if (in.size() - h.header_size > kMaxMessageSize)
        return Error(Errc::protocol_error, fmt::format("ofi message payload of {} bytes exceeds {}",
                                                       in.size() - h.header_size, kMaxMessageSize));
    return h;
}

std::size_t addr_blob_size(std::string_view s) noexcept {
    return 2 + s.size();
}

void encode_addr_blob(std::string_view s, std::byte* out) noexcept {
    store_le(out, s.size(), 2);
    std::memcpy(out + 2, s.data(), s.size());
}

Result<std::string_view> decode_addr_blob(std::span<const std::byte> in) {
    if (in.size() < 2)
        return Error(Errc::address_invalid,
                     fmt::format("serialized ofi address of {} bytes: too short", in.size()));
    std::size_t n = load_le(in.data(), 2);
    if (n == 0 || n > kMaxAddrString)
        return Error(Errc::address_invalid,
                     fmt::format("serialized ofi address with length {} (1..{} allowed)", n,
                                 kMaxAddrString));
    if (in.size() != 2 + n)
        return Error(
            Errc::address_invalid,
            fmt::format("serialized ofi address: length {} but {} bytes follow", n, in.size() - 2));
    std::string_view s(reinterpret_cast<const char*>(in.data() + 2), n);
    if (!printable(s))
        return Error(Errc::address_invalid, "serialized ofi address with non-printable bytes");
    return s;
}

std::size_t mem_blob_size(std::string_view owner) noexcept {
    return kMemFixedSize + owner.size();
}

void encode_mem_blob(const MemBlob& b, std::byte* out) noexcept {
    out[0] = std::byte(kMemVersion);
    out[1] = std::byte(b.access);
    out[2] = std::byte(b.flags);
    out[3] = std::byte(uint8_t(b.owner.size()));
    store_le(out + 4, 0, 4);
    store_le(out + 8, b.base, 8);
    store_le(out + 16, b.length, 8);
    store_le(out + 24, b.key, 8);
    std::memcpy(out + kMemFixedSize, b.owner.data(), b.owner.size());
}

Result<MemBlob> decode_mem_blob(std::span<const std::byte> in) {
    if (in.size() < kMemFixedSize)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized ofi memory handle of {} bytes: too short", in.size()));
    if (uint8_t(in[0]) != kMemVersion)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized ofi memory handle of version {} (expected {})",
                                 uint8_t(in[0]), kMemVersion));
    MemBlob b;
    b.access = uint8_t(in[1]);
    b.flags = uint8_t(in[2]);
    std::size_t olen = uint8_t(in[3]);
    if (b.access < 1 || b.access > 3)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized ofi memory handle with access {}", b.access));
    if (b.flags & ~kMemVirtAddr)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized ofi memory handle with flags 0x{:02x}", b.flags));
    if (load_le(in.data() + 4, 4) != 0)
        return Error(Errc::invalid_argument, "serialized ofi memory handle: reserved bytes set");
    b.base = load_le(in.data() + 8, 8);
    b.length = load_le(in.data() + 16, 8);
    b.key = load_le(in.data() + 24, 8);
    if (b.base + b.length < b.base)
        return Error(Errc::invalid_argument,
                     "serialized ofi memory handle: the region wraps the address space");
    if (olen == 0 || in.size() != kMemFixedSize + olen)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized ofi memory handle: owner length {} but {} bytes "
                                 "follow",
                                 olen, in.size() - kMemFixedSize));
    b.owner = std::string_view(reinterpret_cast<const char*>(in.data() + kMemFixedSize), olen);
    if (!printable(b.owner))
        return Error(Errc::address_invalid,
                     "serialized ofi memory handle: owner address with non-printable bytes");
    return b;
}

}  // namespace talaria::na::ofi
