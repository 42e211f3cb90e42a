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
    out[16] = std::byte(h.source_ctx);
    out[17] = std::byte(uint8_t(h.lane_addr.size()));
    out[18] = std::byte(h.flags);
    out[19] = std::byte(0);
    std::size_t n = kMsgFixedSize;
    if (h.flags & kFlagToken) {
        store_le(out + n, h.token, kTokenSize);
        n += kTokenSize;
    }
    if (!h.raw_addr.empty()) std::memcpy(out + n, h.raw_addr.data(), h.raw_addr.size());
    n += h.raw_addr.size();
    if (!h.lane_addr.empty()) std::memcpy(out + n, h.lane_addr.data(), h.lane_addr.size());
    return n + h.lane_addr.size();
}

Result<MsgHeader> decode_msg_header(std::span<const std::byte> in) {
    if (in.size() < kMsgFixedSize)
        return Error(Errc::protocol_error,
                     fmt::format("ofi message of {} bytes is shorter than its {}-byte header",
                                 in.size(), kMsgFixedSize));
    if (uint8_t(in[0]) != kMsgMagic)
        return Error(Errc::protocol_error,
                     fmt::format("ofi message with bad magic/version 0x{:02x} (expected 0x{:02x}: "
                                 "both peers must run the same Talaria wire version)",
                                 uint8_t(in[0]), kMsgMagic));
    MsgHeader h;
    uint8_t kind = uint8_t(in[1]);
    if (kind < 1 || kind > uint8_t(MsgKind::auth))
        return Error(Errc::protocol_error, fmt::format("ofi message of unknown kind {}", kind));
    h.kind = MsgKind(kind);
    h.context_id = uint8_t(in[2]);
    std::size_t alen = uint8_t(in[3]);
    h.tag = uint32_t(load_le(in.data() + 4, 4));
    h.instance = load_le(in.data() + 8, 8);
    h.source_ctx = uint8_t(in[16]);
    std::size_t llen = uint8_t(in[17]);
    h.flags = uint8_t(in[18]);
    if (h.instance == 0) return Error(Errc::protocol_error, "ofi message with instance id 0");
    if ((h.flags & ~(kFlagServes | kFlagToken)) != 0 || uint8_t(in[19]) != 0)
        return Error(
            Errc::protocol_error,
            fmt::format("ofi message with unknown flags 0x{:02x} or reserved byte 0x{:02x}",
                        h.flags, uint8_t(in[19])));
    if (alen == 0 || alen > kMaxRawAddr || llen > kMaxRawAddr)
        return Error(Errc::protocol_error,
                     fmt::format("ofi message with a {}-byte sender address and a {}-byte lane "
                                 "address (1..{} and 0..{} allowed)",
                                 alen, llen, kMaxRawAddr, kMaxRawAddr));
    const std::size_t tok = (h.flags & kFlagToken) ? kTokenSize : 0;
    if (in.size() < kMsgFixedSize + tok + alen + llen)
        return Error(Errc::protocol_error,
                     fmt::format("ofi message of {} bytes truncated inside its sender addresses",
                                 in.size()));
    if (tok) h.token = load_le(in.data() + kMsgFixedSize, kTokenSize);
    h.raw_addr = in.subspan(kMsgFixedSize + tok, alen);
    h.lane_addr = in.subspan(kMsgFixedSize + tok + alen, llen);
    h.header_size = kMsgFixedSize + tok + alen + llen;
    if (h.kind == MsgKind::probe && in.size() != h.header_size)
        return Error(Errc::protocol_error, "ofi probe message with a payload");
    if (in.size() - h.header_size > kMaxMessageSize)
        return Error(Errc::protocol_error, fmt::format("ofi message payload of {} bytes exceeds {}",
                                                       in.size() - h.header_size, kMaxMessageSize));
    return h;
}

std::size_t encode_auth_request(std::string_view key_id, std::span<const std::byte> nonce,
                                std::byte* out) noexcept {
    out[0] = std::byte(uint8_t(key_id.size()));
    std::memcpy(out + 1, key_id.data(), key_id.size());
    std::memcpy(out + 1 + key_id.size(), nonce.data(), kAuthNonceSize);
    return 1 + key_id.size() + kAuthNonceSize;
}

Result<AuthMsg> decode_auth(uint32_t tag, std::span<const std::byte> in) {
    AuthMsg m;
    m.step = AuthStep(tag);
    auto bad = [&](std::string_view what) {
        return Error(
            Errc::protocol_error,
            fmt::format("ofi auth step {} with a {}-byte payload: {}", tag, in.size(), what));
    };
    switch (m.step) {
        case AuthStep::request: {
            if (in.empty()) return bad("no key id");
            std::size_t k = uint8_t(in[0]);
            if (k == 0 || in.size() != 1 + k + kAuthNonceSize)
                return bad("not a key id and a nonce");
            m.key_id = std::string_view(reinterpret_cast<const char*>(in.data() + 1), k);
            m.nonce = in.subspan(1 + k, kAuthNonceSize);
            return m;
        }
        case AuthStep::challenge:
            if (in.size() != kAuthNonceSize + kAuthProofSize) return bad("not a nonce and a proof");
            m.nonce = in.first(kAuthNonceSize);
            m.proof = in.subspan(kAuthNonceSize);
            return m;
        case AuthStep::response:
            if (in.size() != kAuthProofSize) return bad("not a proof");
            m.proof = in;
            return m;
        case AuthStep::ok:
            if (!in.empty()) return bad("an ok carries nothing");
            return m;
        case AuthStep::refused:
            if (in.empty() || in.size() > kAuthMaxReason) return bad("no reason, or too long");
            for (std::byte b : in)
                if (uint8_t(b) < 0x20 || uint8_t(b) > 0x7e) return bad("a reason not printable");
            m.reason = std::string_view(reinterpret_cast<const char*>(in.data()), in.size());
            return m;
    }
    return bad("unknown step");
}

void encode_locate(const Locate& l, std::byte* out) noexcept {
    out[0] = std::byte(l.ctx);
    out[1] = std::byte(uint8_t(l.unexpected ? MsgKind::unexpected : MsgKind::expected));
}

Result<Locate> decode_locate(std::span<const std::byte> in) {
    if (in.size() != kLocateSize)
        return Error(Errc::protocol_error,
                     fmt::format("ofi locate of {} bytes ({} expected)", in.size(), kLocateSize));
    uint8_t kind = uint8_t(in[1]);
    if (kind != uint8_t(MsgKind::unexpected) && kind != uint8_t(MsgKind::expected))
        return Error(Errc::protocol_error,
                     fmt::format("ofi locate for a message kind {} (1 or 2 allowed)", kind));
    return Locate{uint8_t(in[0]), kind == uint8_t(MsgKind::unexpected)};
}

std::size_t encode_located(const Located& l, std::byte* out) noexcept {
    out[0] = std::byte(l.ctx);
    out[1] = std::byte(uint8_t(l.unexpected ? MsgKind::unexpected : MsgKind::expected));
    out[2] = std::byte(l.found ? 1 : 0);
    out[3] = std::byte(l.found ? l.lane : 0);
    out[4] = std::byte(uint8_t(l.found ? l.raw.size() : 0));
    if (l.found && !l.raw.empty()) std::memcpy(out + kLocatedFixedSize, l.raw.data(), l.raw.size());
    return kLocatedFixedSize + (l.found ? l.raw.size() : 0);
}

Result<Located> decode_located(std::span<const std::byte> in) {
    if (in.size() < kLocatedFixedSize)
        return Error(Errc::protocol_error,
                     fmt::format("ofi located answer of {} bytes is shorter than {}", in.size(),
                                 kLocatedFixedSize));
    Located l;
    l.ctx = uint8_t(in[0]);
    uint8_t kind = uint8_t(in[1]);
    uint8_t found = uint8_t(in[2]);
    l.lane = uint8_t(in[3]);
    std::size_t n = uint8_t(in[4]);
    if (kind != uint8_t(MsgKind::unexpected) && kind != uint8_t(MsgKind::expected))
        return Error(
            Errc::protocol_error,
            fmt::format("ofi located answer for a message kind {} (1 or 2 allowed)", kind));
    l.unexpected = kind == uint8_t(MsgKind::unexpected);
    if (found > 1) return Error(Errc::protocol_error, "ofi located answer with a bad status");
    l.found = found == 1;
    if (!l.found && (n != 0 || l.lane != 0))
        return Error(Errc::protocol_error, "ofi located answer 'none' carrying an endpoint");
    if (l.found && (n == 0 || n > kMaxRawAddr))
        return Error(Errc::protocol_error,
                     fmt::format("ofi located answer with a {}-byte address (1..{} allowed)", n,
                                 kMaxRawAddr));
    if (in.size() != kLocatedFixedSize + n)
        return Error(Errc::protocol_error,
                     fmt::format("ofi located answer of {} bytes ({} expected)", in.size(),
                                 kLocatedFixedSize + n));
    l.raw = in.subspan(kLocatedFixedSize, n);
    return l;
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
