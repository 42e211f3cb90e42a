#include "core/wire.hpp"

#include <fmt/format.h>

#include <cstring>

#include "talaria/util/crc32c.hpp"

namespace talaria::core::wire {
namespace {

template <class T>
void put(std::byte* p, T v) noexcept {
    std::memcpy(p, &v, sizeof v);  // little-endian hosts only (static_assert in proc)
}
template <class T>
T get(const std::byte* p) noexcept {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

uint32_t message_crc(const std::byte* header, std::span<const std::byte> payload) noexcept {
    std::byte h[kHeaderSize];
    std::memcpy(h, header, kHeaderSize);
    std::memset(h + 20, 0, 4);
    uint32_t c = crc32c(0, h, kHeaderSize);
    return crc32c(c, payload.data(), payload.size());
}

}  // namespace

void encode_header(Header h, std::byte* out, std::span<const std::byte> payload) {
    put<uint16_t>(out, kMagic);
    put<uint8_t>(out + 2, kVersion);
    put<uint8_t>(out + 3, h.flags);
    put<uint32_t>(out + 4, h.rpc_id);
    put<uint32_t>(out + 8, h.seq);
    put<uint8_t>(out + 12, h.target_ctx);
    put<uint8_t>(out + 13, h.reply_ctx);
    put<uint16_t>(out + 14, h.status);
    put<uint32_t>(out + 16, h.payload_len);
    put<uint32_t>(out + 20, 0);
    put<uint16_t>(out + 24, h.provider);
    put<uint16_t>(out + 26, 0);
    put<uint32_t>(out + 28, h.budget_us);
    put<uint64_t>(out + 32, h.signature);
    put<uint64_t>(out + 40, h.trace);
    if (h.flags & kChecksum) put<uint32_t>(out + 20, message_crc(out, payload));
}

Result<Header> decode_header(std::span<const std::byte> msg) {
    if (msg.size() < kHeaderSize)
        return Error{Errc::protocol_error,
                     fmt::format("rpc message of {} bytes is shorter than its {}-byte header",
                                 msg.size(), kHeaderSize)};
    const std::byte* p = msg.data();
    if (get<uint16_t>(p) != kMagic)
        return Error{Errc::protocol_error,
                     fmt::format("rpc message with bad magic {:#06x}", get<uint16_t>(p))};
    if (get<uint8_t>(p + 2) != kVersion)
        return Error{Errc::protocol_error,
                     fmt::format("rpc message of protocol version {} (this is version {})",
                                 get<uint8_t>(p + 2), kVersion)};
    Header h;
    h.flags = get<uint8_t>(p + 3);
    h.rpc_id = get<uint32_t>(p + 4);
    h.seq = get<uint32_t>(p + 8);
    h.target_ctx = get<uint8_t>(p + 12);
    h.reply_ctx = get<uint8_t>(p + 13);
    h.status = get<uint16_t>(p + 14);
    h.payload_len = get<uint32_t>(p + 16);
    h.crc = get<uint32_t>(p + 20);
    h.provider = get<uint16_t>(p + 24);
    h.budget_us = get<uint32_t>(p + 28);
    h.signature = get<uint64_t>(p + 32);
    h.trace = get<uint64_t>(p + 40);
    if (h.flags & ~kKnownFlags)
        return Error{Errc::protocol_error,
                     fmt::format("rpc message with unknown flags {:#04x}", h.flags)};
    if ((h.flags & kResponse) && (h.flags & (kOneWay | kAck)))
        return Error{Errc::protocol_error, "rpc response flagged one-way or ack"};
    if (get<uint16_t>(p + 26) != 0)
        return Error{Errc::protocol_error,
                     fmt::format("rpc message with reserved bytes {:#06x} (must be 0)",
                                 get<uint16_t>(p + 26))};
    const bool request = (h.flags & (kResponse | kAck | kCancel)) == 0;
    if (!request && (h.provider != 0 || h.budget_us != 0 || h.signature != 0))
        return Error{Errc::protocol_error,
                     "rpc response, ack or cancel carrying a request's provider, deadline or "
                     "signature"};
    if ((h.flags & kCancel) &&
        ((h.flags & (kResponse | kAck | kOneWay | kMore | kRetryAfter)) || h.payload_len != 0 ||
         (h.status != static_cast<uint16_t>(Errc::canceled) &&
          h.status != static_cast<uint16_t>(Errc::timeout))))
        return Error{Errc::protocol_error,
                     "rpc cancel must carry no payload, no other kind flag, and status canceled "
                     "or timeout"};
    if (h.payload_len != msg.size() - kHeaderSize)
        return Error{Errc::protocol_error,
                     fmt::format("rpc header says {} payload bytes, {} arrived", h.payload_len,
                                 msg.size() - kHeaderSize)};
    if (h.status > static_cast<uint16_t>(kLastErrc))
        return Error{Errc::protocol_error, fmt::format("rpc status {} is unknown", h.status)};
    if ((h.flags & kRetryAfter) &&
        (!(h.flags & kResponse) || (h.flags & kMore) ||
         h.status != static_cast<uint16_t>(Errc::busy) || h.payload_len < 4))
        return Error{Errc::protocol_error,
                     "rpc retry-after hint on a message other than a busy response with room "
                     "for it"};
    if (h.flags & kChecksum) {
        uint32_t want = message_crc(p, msg.subspan(kHeaderSize));
        if (want != h.crc)
            return Error{Errc::protocol_error,
                         fmt::format("rpc message checksum {:#010x} does not match its bytes "
                                     "({:#010x}): corrupted in transit",
                                     h.crc, want)};
    }
    return h;
}

Result<MoreDescriptor> decode_more(std::span<const std::byte> payload) {
    if (payload.size() < kMoreFixedSize)
        return Error{Errc::protocol_error,
                     fmt::format("large-payload descriptor of {} bytes, at least {} needed",
                                 payload.size(), kMoreFixedSize)};
    MoreDescriptor d;
    d.total = get<uint64_t>(payload.data());
    d.data_crc = get<uint32_t>(payload.data() + 8);
    auto n = get<uint16_t>(payload.data() + 12);
    if (n == 0 || n != payload.size() - kMoreFixedSize)
        return Error{Errc::protocol_error,
                     fmt::format("large-payload descriptor names a {}-byte memory handle, {} "
                                 "bytes follow",
                                 n, payload.size() - kMoreFixedSize)};
    d.mem = payload.subspan(kMoreFixedSize, n);
    return d;
}

Result<std::size_t> encode_more(const MoreDescriptor& d, std::span<std::byte> out) {
    std::size_t need = kMoreFixedSize + d.mem.size();
    if (d.mem.size() > UINT16_MAX || need > out.size())
        return Error{Errc::message_too_large,
                     fmt::format("a large-payload descriptor needs {} bytes, the message has "
                                 "room for {}",
                                 need, out.size())};
    put<uint64_t>(out.data(), d.total);
    put<uint32_t>(out.data() + 8, d.data_crc);
    put<uint16_t>(out.data() + 12, static_cast<uint16_t>(d.mem.size()));
    std::memcpy(out.data() + kMoreFixedSize, d.mem.data(), d.mem.size());
    return need;
}

}  // namespace talaria::core::wire
