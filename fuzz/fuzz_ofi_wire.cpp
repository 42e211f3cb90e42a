// Fuzz the ofi transport's decoders of peer bytes (src/na/ofi/ofi_wire.hpp): the header in front
// of every message (read straight out of a receive buffer), the locate request and answer, the
// authentication steps, the serialized address and the serialized memory handle. None may crash
// or accept what the encoders would not produce.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "na/ofi/ofi_wire.hpp"

using namespace talaria::na::ofi;

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

void header(std::span<const std::byte> in) {
    auto h = decode_msg_header(in);
    if (!h) return;
    check(h->header_size == kMsgFixedSize + ((h->flags & kFlagToken) ? kTokenSize : 0) +
                                h->raw_addr.size() + h->lane_addr.size());
    check(h->header_size <= in.size());
    check(!h->raw_addr.empty() && h->raw_addr.size() <= kMaxRawAddr);
    check(h->lane_addr.size() <= kMaxRawAddr);
    check(in.size() - h->header_size <= kMaxMessageSize);
    check(h->instance != 0);
    std::byte again[kHeaderRoom];
    std::size_t n = encode_msg_header(*h, again);
    check(n == h->header_size);
    check(std::memcmp(again, in.data(), n) == 0);
}

void locate(std::span<const std::byte> in) {
    auto l = decode_locate(in);
    if (l) {
        std::byte again[kLocateSize];
        encode_locate(*l, again);
        check(std::memcmp(again, in.data(), kLocateSize) == 0);
    }
    auto d = decode_located(in);
    if (!d) return;
    check(d->found == !d->raw.empty() && d->raw.size() <= kMaxRawAddr);
    std::byte again[kLocatedFixedSize + kMaxRawAddr];
    std::size_t n = encode_located(*d, again);
    check(n == in.size() && std::memcmp(again, in.data(), n) == 0);
}

/// An auth payload of step `tag` (the header's tag): what decodes lies inside it, and a request
/// re-encodes to itself.
void auth(uint32_t tag, std::span<const std::byte> in) {
    auto m = decode_auth(tag, in);
    if (!m) return;
    auto inside = [&](const void* p, std::size_t n) {
        auto* b = static_cast<const std::byte*>(p);
        return n == 0 || (b >= in.data() && b + n <= in.data() + in.size());
    };
    check(inside(m->key_id.data(), m->key_id.size()) && inside(m->nonce.data(), m->nonce.size()) &&
          inside(m->proof.data(), m->proof.size()) && inside(m->reason.data(), m->reason.size()));
    switch (m->step) {
        case AuthStep::request: {
            check(!m->key_id.empty() && m->nonce.size() == kAuthNonceSize);
            std::byte again[kAuthMaxPayload];
            std::size_t n = encode_auth_request(m->key_id, m->nonce, again);
            check(n == in.size() && std::memcmp(again, in.data(), n) == 0);
            break;
        }
        case AuthStep::challenge:
            check(m->nonce.size() == kAuthNonceSize && m->proof.size() == kAuthProofSize);
            break;
        case AuthStep::response:
            check(m->proof.size() == kAuthProofSize);
            break;
        case AuthStep::ok:
            check(in.empty());
            break;
        case AuthStep::refused:
            check(!m->reason.empty() && m->reason.size() <= kAuthMaxReason);
            for (char c : m->reason)
                check(c >= 0x20 && c <= 0x7e);
            break;
        default:
            check(false);
    }
}

void addr(std::span<const std::byte> in) {
    auto s = decode_addr_blob(in);
    if (!s) return;
    check(!s->empty() && s->size() <= kMaxAddrString);
    std::vector<std::byte> again(addr_blob_size(*s));
    encode_addr_blob(*s, again.data());
    check(again.size() == in.size() && std::memcmp(again.data(), in.data(), in.size()) == 0);
}

void mem(std::span<const std::byte> in) {
    auto m = decode_mem_blob(in);
    if (!m) return;
    check(m->access >= 1 && m->access <= 3);
    check(m->base + m->length >= m->base);
    std::vector<std::byte> again(mem_blob_size(m->owner));
    encode_mem_blob(*m, again.data());
    check(again.size() == in.size() && std::memcmp(again.data(), in.data(), in.size()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    std::span<const std::byte> all(reinterpret_cast<const std::byte*>(data), size);
    // The first byte picks the decoder the rest is meant for; every decoder also sees it all.
    auto rest = all.subspan(1);
    switch (data[0] % 4) {
        case 0:
            header(rest);
            break;
        case 2:
            locate(rest);
            break;
        case 1:
            addr(rest);
            break;
        default:
            mem(rest);
            break;
    }
    header(all);
    if (auto h = decode_msg_header(all); h && h->kind == MsgKind::auth)
        auth(h->tag, all.subspan(h->header_size));
    auth(data[0] % 6, rest);
    locate(all);
    addr(all);
    mem(all);
    return 0;
}
