// Encoders and pure decoders of the sm transport's bytes (see sm_wire.hpp).
#include "na/sm/sm_wire.hpp"

#include <fmt/format.h>

namespace talaria::na::sm {

namespace {
template <class T>
T load(const std::byte* p) noexcept {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <class T>
void store(std::byte* p, T v) noexcept {
    std::memcpy(p, &v, sizeof v);
}
}  // namespace

bool seg_header_valid(const SegHeader& h) noexcept {
    return h.magic == kSegMagic && h.version == kVersion && h.ring_slots == kRingSlots &&
           h.slot_size == kSlotSize && h.segment_size == kSegmentSize;
}

bool name_valid(std::string_view name) noexcept {
    if (name.empty() || name.size() > kMaxNameLen) return false;
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

// Handshake layout (host byte order: both ends run on the same host):
//   0 u32 magic | 4 u16 version | 6 u8 type | 7 u8 status | 8 u32 pid | 12 u32 ring_slots |
//  16 u64 instance | 24 u32 slot_size | 28 u16 name_len | 30 u16 0 | 32 u64 segment_size |
//  40 u64 probe_addr | 48 name bytes
std::size_t encode_handshake(const Handshake& m, std::span<std::byte> out) noexcept {
    std::size_t n = kHsFixedSize + m.name.size();
    if (out.size() < n || m.name.size() > kMaxNameLen) return 0;
    std::byte* p = out.data();
    std::memset(p, 0, kHsFixedSize);
    store<uint32_t>(p, kHsMagic);
    store<uint16_t>(p + 4, uint16_t(kVersion));
    store<uint8_t>(p + 6, uint8_t(m.type));
    store<uint8_t>(p + 7, m.status);
    store<uint32_t>(p + 8, m.pid);
    store<uint32_t>(p + 12, kRingSlots);
    store<uint64_t>(p + 16, m.instance);
    store<uint32_t>(p + 24, kSlotSize);
    store<uint16_t>(p + 28, uint16_t(m.name.size()));
    store<uint8_t>(p + 30, m.src_ctx);
    store<uint8_t>(p + 31, m.dst_ctx);
    store<uint64_t>(p + 32, uint64_t(kSegmentSize));
    store<uint64_t>(p + 40, m.probe_addr);
    if (!m.name.empty()) std::memcpy(p + kHsFixedSize, m.name.data(), m.name.size());
    return n;
}

Result<Handshake> decode_handshake(std::span<const std::byte> in) {
    if (in.size() < kHsFixedSize)
        return Error(Errc::protocol_error,
                     fmt::format("sm handshake packet of {} bytes is shorter than its {}-byte "
                                 "fixed part",
                                 in.size(), kHsFixedSize));
    const std::byte* p = in.data();
    if (load<uint32_t>(p) != kHsMagic)
        return Error(Errc::protocol_error,
                     fmt::format("sm handshake magic {:#010x} is not {:#010x}: the peer is not a "
                                 "talaria sm endpoint",
                                 load<uint32_t>(p), kHsMagic));
    if (load<uint16_t>(p + 4) != kVersion)
        return Error(Errc::protocol_error,
                     fmt::format("sm handshake version {} is not {}: peer built from another "
                                 "talaria version",
                                 load<uint16_t>(p + 4), kVersion));
    Handshake m;
    uint8_t type = load<uint8_t>(p + 6);
    if (type < uint8_t(HsType::hello) || type > uint8_t(HsType::wake))
        return Error(Errc::protocol_error, fmt::format("sm handshake type {} is unknown", type));
    m.type = HsType(type);
    m.status = load<uint8_t>(p + 7);
    m.pid = load<uint32_t>(p + 8);
    m.instance = load<uint64_t>(p + 16);
    m.probe_addr = load<uint64_t>(p + 40);
    if (load<uint32_t>(p + 12) != kRingSlots || load<uint32_t>(p + 24) != kSlotSize ||
        load<uint64_t>(p + 32) != kSegmentSize)
        return Error(Errc::protocol_error,
                     fmt::format("sm handshake ring layout ({} slots of {} bytes, segment {}) "
                                 "differs from this build's ({} of {}, {})",
                                 load<uint32_t>(p + 12), load<uint32_t>(p + 24),
                                 load<uint64_t>(p + 32), kRingSlots, kSlotSize, kSegmentSize));
    m.src_ctx = load<uint8_t>(p + 30);
    m.dst_ctx = load<uint8_t>(p + 31);
    std::size_t name_len = load<uint16_t>(p + 28);
    if (in.size() != kHsFixedSize + name_len)
        return Error(Errc::protocol_error,
                     fmt::format("sm handshake packet is {} bytes but its name length {} needs {}",
                                 in.size(), name_len, kHsFixedSize + name_len));
    m.name = std::string_view(reinterpret_cast<const char*>(p + kHsFixedSize), name_len);
    if (m.type != HsType::wake) {
        if (!name_valid(m.name))
            return Error(Errc::protocol_error,
                         "sm handshake names an invalid endpoint (1-64 of [A-Za-z0-9._-])");
        if (m.pid == 0 || m.instance == 0)
            return Error(Errc::protocol_error, "sm handshake has a zero pid or instance");
    } else if (name_len != 0) {
        return Error(Errc::protocol_error, "sm wake packet carries a name");
    }
    return m;
}

std::size_t addr_wire_size(std::string_view name) noexcept {
    return 5 + name.size();
}

std::size_t encode_addr(std::string_view name, std::span<std::byte> out) noexcept {
    if (out.size() < addr_wire_size(name) || name.size() > kMaxNameLen) return 0;
    store<uint32_t>(out.data(), kAddrMagic);
    store<uint8_t>(out.data() + 4, uint8_t(name.size()));
    std::memcpy(out.data() + 5, name.data(), name.size());
    return addr_wire_size(name);
}

Result<std::string_view> decode_addr(std::span<const std::byte> in) {
    if (in.size() < 5 || load<uint32_t>(in.data()) != kAddrMagic)
        return Error(Errc::address_invalid,
                     "serialized sm address: too short or wrong magic (not an sm address)");
    std::size_t len = load<uint8_t>(in.data() + 4);
    if (in.size() < 5 + len)
        return Error(Errc::address_invalid,
                     fmt::format("serialized sm address: name of {} bytes but only {} follow", len,
                                 in.size() - 5));
    std::string_view name(reinterpret_cast<const char*>(in.data() + 5), len);
    if (!name_valid(name))
        return Error(Errc::address_invalid,
                     "serialized sm address: invalid name (1-64 of [A-Za-z0-9._-])");
    return name;
}

void encode_mem(const MemWire& m, std::span<std::byte, kMemWireSize> out) noexcept {
    std::byte* p = out.data();
    std::memset(p, 0, kMemWireSize);
    store<uint32_t>(p, kMemMagic);
    store<uint8_t>(p + 4, uint8_t(kVersion));
    store<uint8_t>(p + 5, uint8_t(m.access));
    store<uint32_t>(p + 8, m.pid);
    store<uint32_t>(p + 12, m.slot);
    store<uint64_t>(p + 16, m.instance);
    store<uint64_t>(p + 24, m.base);
    store<uint64_t>(p + 32, m.length);
    store<uint64_t>(p + 40, m.key);
}

Result<MemWire> decode_mem(std::span<const std::byte> in) {
    if (in.size() < kMemWireSize)
        return Error(
            Errc::invalid_argument,
            fmt::format("serialized sm memory handle: {} bytes, need {}", in.size(), kMemWireSize));
    const std::byte* p = in.data();
    if (load<uint32_t>(p) != kMemMagic || load<uint8_t>(p + 4) != kVersion)
        return Error(Errc::invalid_argument,
                     "serialized sm memory handle: wrong magic or version (not from an sm "
                     "transport of this version)");
    uint8_t access = load<uint8_t>(p + 5);
    if (access < 1 || access > 3)
        return Error(Errc::invalid_argument,
                     fmt::format("serialized sm memory handle: access {} is not 1-3", access));
    if (load<uint16_t>(p + 6) != 0)
        return Error(Errc::invalid_argument, "serialized sm memory handle: reserved bytes set");
    MemWire m;
    m.access = Access(access);
    m.pid = load<uint32_t>(p + 8);
    m.instance = load<uint64_t>(p + 16);
    m.base = load<uint64_t>(p + 24);
    m.length = load<uint64_t>(p + 32);
    m.slot = load<uint32_t>(p + 12);
    m.key = load<uint64_t>(p + 40);
    if (m.length == 0 ? (m.slot != 0 || m.key != 0) : (m.key == 0 || m.slot >= kMaxRegistrations))
        return Error(Errc::invalid_argument,
                     fmt::format("serialized sm memory handle: registration slot {} key {:#x} for "
                                 "{} bytes",
                                 m.slot, m.key, m.length));
    if (m.pid == 0 || m.instance == 0)
        return Error(Errc::invalid_argument, "serialized sm memory handle: zero pid or instance");
    if (m.base + m.length < m.base)
        return Error(Errc::invalid_argument,
                     "serialized sm memory handle: base + length overflows the address space");
    return m;
}

}  // namespace talaria::na::sm
