// ofi wire format: header, serialized address and memory handle round trips and rejections.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "na/ofi/ofi_wire.hpp"

namespace talaria::na::ofi {
namespace {

TEST(OfiWire, HeaderRoundTrip) {
    std::byte raw[16];
    for (int i = 0; i < 16; ++i)
        raw[i] = std::byte(i + 1);
    MsgHeader h;
    h.kind = MsgKind::expected;
    h.context_id = 7;
    h.tag = 0xdeadbeef;
    h.instance = 0x1122334455667788ull;
    h.raw_addr = raw;
    std::vector<std::byte> buf(kHeaderRoom + 10);
    std::size_t n = encode_msg_header(h, buf.data());
    EXPECT_EQ(n, kMsgFixedSize + 16);
    auto d = decode_msg_header(std::span(buf.data(), n + 10));
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->kind, MsgKind::expected);
    EXPECT_EQ(d->context_id, 7);
    EXPECT_EQ(d->tag, 0xdeadbeefu);
    EXPECT_EQ(d->instance, h.instance);
    EXPECT_EQ(d->header_size, n);
    EXPECT_EQ(std::memcmp(d->raw_addr.data(), raw, 16), 0);
}

TEST(OfiWire, HeaderRejections) {
    std::byte raw[4] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
    MsgHeader h;
    h.instance = 9;
    h.raw_addr = raw;
    std::vector<std::byte> ok(kHeaderRoom);
    std::size_t n = encode_msg_header(h, ok.data());
    ok.resize(n);
    ASSERT_TRUE(decode_msg_header(ok));
    for (std::size_t cut = 0; cut < n; ++cut)
        EXPECT_FALSE(decode_msg_header(std::span(ok.data(), cut))) << "truncated to " << cut;
    auto bad = [&](std::size_t at, uint8_t v) {
        auto b = ok;
        b[at] = std::byte(v);
        return decode_msg_header(b);
    };
    EXPECT_FALSE(bad(0, 0xa7)) << "magic of version 1";
    EXPECT_FALSE(bad(1, 0)) << "kind 0";
    EXPECT_TRUE(bad(1, 6)) << "kind 6 (auth)";
    EXPECT_FALSE(bad(1, 7)) << "kind 7";
    EXPECT_FALSE(bad(17, 65)) << "lane address length above the maximum";
    EXPECT_FALSE(bad(17, 1)) << "lane address longer than the message";
    EXPECT_FALSE(bad(18, 4)) << "unknown flag";
    EXPECT_FALSE(bad(19, 1)) << "reserved byte";
    EXPECT_FALSE(bad(3, 0)) << "address length 0";
    EXPECT_FALSE(bad(3, 65)) << "address length above the maximum";
    EXPECT_FALSE(bad(3, 5)) << "address longer than the message";
    auto zero = ok;
    for (int i = 8; i < 16; ++i)
        zero[i] = std::byte{0};
    EXPECT_FALSE(decode_msg_header(zero)) << "instance 0";
    // A probe has no payload; a message no more than the maximum.
    h.kind = MsgKind::probe;
    std::vector<std::byte> p(kHeaderRoom + 1);
    n = encode_msg_header(h, p.data());
    EXPECT_TRUE(decode_msg_header(std::span(p.data(), n)));
    EXPECT_FALSE(decode_msg_header(std::span(p.data(), n + 1)));
    h.kind = MsgKind::unexpected;
    std::vector<std::byte> big(kMsgFixedSize + 4 + kMaxMessageSize + 1);
    n = encode_msg_header(h, big.data());
    EXPECT_TRUE(decode_msg_header(std::span(big.data(), big.size() - 1)));
    EXPECT_FALSE(decode_msg_header(big));
}

TEST(OfiWire, HeaderWithALaneAddress) {
    std::byte raw[16], lane[28];
    for (int i = 0; i < 16; ++i)
        raw[i] = std::byte(i + 1);
    for (int i = 0; i < 28; ++i)
        lane[i] = std::byte(0x40 + i);
    MsgHeader h;
    h.kind = MsgKind::unexpected;
    h.context_id = 3;
    h.source_ctx = 5;
    h.flags = kFlagServes;
    h.tag = 77;
    h.instance = 1;
    h.raw_addr = raw;
    h.lane_addr = lane;
    std::vector<std::byte> buf(kHeaderRoom + 4);
    std::size_t n = encode_msg_header(h, buf.data());
    EXPECT_EQ(n, kMsgFixedSize + 16 + 28);
    auto d = decode_msg_header(std::span(buf.data(), n + 4));
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->source_ctx, 5);
    EXPECT_EQ(d->flags, kFlagServes);
    EXPECT_EQ(d->header_size, n);
    ASSERT_EQ(d->lane_addr.size(), 28u);
    EXPECT_EQ(std::memcmp(d->lane_addr.data(), lane, 28), 0);
    EXPECT_EQ(std::memcmp(d->raw_addr.data(), raw, 16), 0);
}

TEST(OfiWire, LocateAndLocated) {
    std::byte b[kLocatedFixedSize + kMaxRawAddr];
    encode_locate(Locate{7, false}, b);
    auto q = decode_locate(std::span(b, kLocateSize));
    ASSERT_TRUE(q) << q.error().describe();
    EXPECT_EQ(q->ctx, 7);
    EXPECT_FALSE(q->unexpected);
    EXPECT_FALSE(decode_locate(std::span(b, 1)));
    b[1] = std::byte{3};
    EXPECT_FALSE(decode_locate(std::span(b, kLocateSize))) << "kind 3";

    std::byte raw[16];
    std::memset(raw, 0x5a, sizeof raw);
    Located ans;
    ans.ctx = 4;
    ans.unexpected = true;
    ans.found = true;
    ans.lane = 0;
    ans.raw = raw;
    std::size_t n = encode_located(ans, b);
    EXPECT_EQ(n, kLocatedFixedSize + 16);
    auto d = decode_located(std::span(b, n));
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_TRUE(d->found);
    EXPECT_EQ(d->ctx, 4);
    EXPECT_EQ(d->raw.size(), 16u);
    for (std::size_t cut = 0; cut < n; ++cut)
        EXPECT_FALSE(decode_located(std::span(b, cut))) << cut;
    b[4] = std::byte{0};
    EXPECT_FALSE(decode_located(std::span(b, kLocatedFixedSize))) << "found, empty address";
    Located none;
    none.ctx = 9;
    n = encode_located(none, b);
    d = decode_located(std::span(b, n));
    ASSERT_TRUE(d);
    EXPECT_FALSE(d->found);
    b[3] = std::byte{1};
    EXPECT_FALSE(decode_located(std::span(b, n))) << "none naming a lane";
}

TEST(OfiWire, HeaderWithASessionToken) {
    std::byte raw[16], lane[16];
    std::memset(raw, 0x11, sizeof raw);
    std::memset(lane, 0x22, sizeof lane);
    MsgHeader h;
    h.kind = MsgKind::expected;
    h.instance = 9;
    h.flags = kFlagToken | kFlagServes;
    h.token = 0x0102030405060708ull;
    h.raw_addr = raw;
    h.lane_addr = lane;
    std::byte b[kHeaderRoom];
    std::size_t n = encode_msg_header(h, b);
    EXPECT_EQ(n, kMsgFixedSize + kTokenSize + 32);
    auto d = decode_msg_header(std::span(b, n));
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->token, h.token);
    EXPECT_EQ(d->header_size, n);
    EXPECT_EQ(std::memcmp(d->raw_addr.data(), raw, 16), 0);
    EXPECT_EQ(std::memcmp(d->lane_addr.data(), lane, 16), 0);
    for (std::size_t cut = 0; cut < n; ++cut)
        EXPECT_FALSE(decode_msg_header(std::span(b, cut))) << cut;
}

TEST(OfiWire, AuthStepsAndTheirBounds) {
    std::array<std::byte, kAuthNonceSize> nonce{};
    nonce.fill(std::byte{9});
    std::byte b[kAuthMaxPayload + 1];
    std::size_t n = encode_auth_request("cluster-1", nonce, b);
    EXPECT_EQ(n, 1 + 9 + kAuthNonceSize);
    auto r = decode_auth(uint32_t(AuthStep::request), std::span(b, n));
    ASSERT_TRUE(r) << r.error().describe();
    EXPECT_EQ(r->key_id, "cluster-1");
    EXPECT_EQ(r->nonce.size(), kAuthNonceSize);
    for (std::size_t cut = 0; cut < n; ++cut)
        EXPECT_FALSE(decode_auth(uint32_t(AuthStep::request), std::span(b, cut))) << cut;
    EXPECT_FALSE(decode_auth(uint32_t(AuthStep::request), std::span(b, n + 1)));
    b[0] = std::byte{0};
    EXPECT_FALSE(decode_auth(uint32_t(AuthStep::request), std::span(b, n))) << "empty key id";
    // Fixed sizes: a challenge of 64, a response of 32, an ok of nothing; one byte off fails.
    for (auto [step, size] : {std::pair{AuthStep::challenge, std::size_t{64}},
                              std::pair{AuthStep::response, std::size_t{32}},
                              std::pair{AuthStep::ok, std::size_t{0}}}) {
        EXPECT_TRUE(decode_auth(uint32_t(step), std::span(b, size))) << int(step);
        EXPECT_FALSE(decode_auth(uint32_t(step), std::span(b, size + 1))) << int(step);
        if (size > 0) {
            EXPECT_FALSE(decode_auth(uint32_t(step), std::span(b, size - 1))) << int(step);
        }
    }
    std::string why = "refused: key 'k'";
    auto ok = decode_auth(uint32_t(AuthStep::refused), std::as_bytes(std::span(why)));
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->reason, why);
    why[2] = '\x01';
    EXPECT_FALSE(decode_auth(uint32_t(AuthStep::refused), std::as_bytes(std::span(why))));
    EXPECT_FALSE(decode_auth(uint32_t(AuthStep::refused), {})) << "no reason";
    EXPECT_FALSE(decode_auth(0, {})) << "step 0";
    EXPECT_FALSE(decode_auth(6, {})) << "step 6";
}

TEST(OfiWire, AddrBlob) {
    std::string_view s = "ofi+tcp://127.0.0.1:5000";
    std::vector<std::byte> b(addr_blob_size(s));
    encode_addr_blob(s, b.data());
    auto d = decode_addr_blob(b);
    ASSERT_TRUE(d);
    EXPECT_EQ(*d, s);
    EXPECT_FALSE(decode_addr_blob({}));
    EXPECT_FALSE(decode_addr_blob(std::span(b.data(), b.size() - 1)));
    auto extra = b;
    extra.push_back(std::byte{'x'});
    EXPECT_FALSE(decode_addr_blob(extra));
    auto nul = b;
    nul[5] = std::byte{0};
    EXPECT_FALSE(decode_addr_blob(nul));
    std::vector<std::byte> empty(2, std::byte{0});
    EXPECT_FALSE(decode_addr_blob(empty));
}

TEST(OfiWire, MemBlob) {
    MemBlob m;
    m.access = 3;
    m.flags = kMemVirtAddr;
    m.base = 0x7f0000001000;
    m.length = 4096;
    m.key = 42;
    m.owner = "ofi+shm://talaria-1-00000001";
    std::vector<std::byte> b(mem_blob_size(m.owner));
    encode_mem_blob(m, b.data());
    auto d = decode_mem_blob(b);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->access, 3);
    EXPECT_EQ(d->flags, kMemVirtAddr);
    EXPECT_EQ(d->base, m.base);
    EXPECT_EQ(d->length, m.length);
    EXPECT_EQ(d->key, 42u);
    EXPECT_EQ(d->owner, m.owner);
    for (std::size_t cut = 0; cut < b.size(); ++cut)
        EXPECT_FALSE(decode_mem_blob(std::span(b.data(), cut))) << cut;
    auto bad = [&](std::size_t at, uint8_t v) {
        auto c = b;
        c[at] = std::byte(v);
        return decode_mem_blob(c);
    };
    EXPECT_FALSE(bad(0, 2)) << "version";
    EXPECT_FALSE(bad(1, 0)) << "access 0";
    EXPECT_FALSE(bad(1, 4)) << "access 4";
    EXPECT_FALSE(bad(2, 2)) << "unknown flag";
    EXPECT_FALSE(bad(4, 1)) << "reserved";
    EXPECT_FALSE(bad(3, 0)) << "owner length 0";
    m.base = ~uint64_t(0) - 10;
    encode_mem_blob(m, b.data());
    EXPECT_FALSE(decode_mem_blob(b)) << "a region that wraps";
}

}  // namespace
}  // namespace talaria::na::ofi
