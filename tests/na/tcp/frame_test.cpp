// The tcp wire format's pure decoders: round trips and rejection of every malformed field.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "na/tcp/frame.hpp"

namespace talaria::na::tcp {
namespace {

std::array<std::byte, kFrameHeaderSize> encode(const FrameHeader& h) {
    std::array<std::byte, kFrameHeaderSize> b{};
    encode_frame_header(h, b.data());
    return b;
}

TEST(TcpFrame, HeaderRoundTrip) {
    FrameHeader h;
    h.type = FrameType::put_req;
    h.context_id = 7;
    h.tag = 0xdeadbeef;
    h.length = 12345;
    h.rma_length = 12345;
    h.cookie = 0x0102030405060708ull;
    h.key = 0x1122334455667788ull;
    h.address = 0x7fff00001000ull;
    auto b = encode(h);
    // Little-endian on the wire, whatever the host.
    EXPECT_EQ(uint8_t(b[0]), 'T');
    EXPECT_EQ(uint8_t(b[1]), 'L');
    EXPECT_EQ(uint8_t(b[2]), 'R');
    EXPECT_EQ(uint8_t(b[3]), 'T');
    EXPECT_EQ(uint8_t(b[8]), 0xef);
    EXPECT_EQ(uint8_t(b[24]), 0x08);
    auto d = decode_frame_header(b);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->type, FrameType::put_req);
    EXPECT_EQ(d->context_id, 7);
    EXPECT_EQ(d->tag, 0xdeadbeefu);
    EXPECT_EQ(d->length, 12345u);
    EXPECT_EQ(d->cookie, h.cookie);
    EXPECT_EQ(d->key, h.key);
    EXPECT_EQ(d->address, h.address);
    EXPECT_EQ(d->rma_length, 12345u);
}

TEST(TcpFrame, ShortInputIsAgain) {
    auto b = encode(FrameHeader{});
    EXPECT_EQ(decode_frame_header(std::span(b).first(kFrameHeaderSize - 1)).code(), Errc::again);
    EXPECT_EQ(decode_frame_header({}).code(), Errc::again);
}

TEST(TcpFrame, RejectsBadFields) {
    FrameHeader msg;
    msg.type = FrameType::msg_unexpected;
    msg.length = 10;
    auto good = encode(msg);
    ASSERT_TRUE(decode_frame_header(good));

    auto bad = good;
    bad[0] = std::byte{'X'};
    EXPECT_EQ(decode_frame_header(bad).code(), Errc::protocol_error);
    bad = good;
    bad[4] = std::byte{2};  // version
    EXPECT_EQ(decode_frame_header(bad).code(), Errc::protocol_error);
    bad = good;
    bad[5] = std::byte{0};  // type
    EXPECT_EQ(decode_frame_header(bad).code(), Errc::protocol_error);
    bad[5] = std::byte{8};
    EXPECT_EQ(decode_frame_header(bad).code(), Errc::protocol_error);
    bad = good;
    bad[7] = std::byte{uint8_t(Errc::internal) + 1};  // status
    EXPECT_EQ(decode_frame_header(bad).code(), Errc::protocol_error);
    bad = good;
    bad[7] = std::byte{uint8_t(Errc::access_denied)};  // status on a non-response
    EXPECT_EQ(decode_frame_header(bad).code(), Errc::protocol_error);
    bad = good;
    bad[13] = std::byte{1};  // reserved
    EXPECT_EQ(decode_frame_header(bad).code(), Errc::protocol_error);

    msg.length = kMaxMessageSize + 1;
    EXPECT_EQ(decode_frame_header(encode(msg)).code(), Errc::protocol_error);
    msg.length = kMaxMessageSize;
    EXPECT_TRUE(decode_frame_header(encode(msg)));
    msg.length = UINT64_MAX;
    EXPECT_EQ(decode_frame_header(encode(msg)).code(), Errc::protocol_error);
}

TEST(TcpFrame, PerTypeLengthRules) {
    FrameHeader h;
    h.type = FrameType::hello;
    h.length = kHelloFixedSize - 1;
    EXPECT_FALSE(decode_frame_header(encode(h)));
    h.length = kMaxHelloPayload + 1;
    EXPECT_FALSE(decode_frame_header(encode(h)));
    h.length = kHelloFixedSize;
    EXPECT_TRUE(decode_frame_header(encode(h)));

    h = FrameHeader{};
    h.type = FrameType::put_req;
    h.rma_length = 100;
    h.length = 99;
    EXPECT_FALSE(decode_frame_header(encode(h)));
    h.length = h.rma_length = kMaxRmaLength + 1;
    EXPECT_FALSE(decode_frame_header(encode(h)));

    h = FrameHeader{};
    h.type = FrameType::get_req;
    h.rma_length = 100;
    h.length = 1;
    EXPECT_FALSE(decode_frame_header(encode(h)));
    h.length = 0;
    EXPECT_TRUE(decode_frame_header(encode(h)));

    h = FrameHeader{};
    h.type = FrameType::put_resp;
    h.length = 1;
    EXPECT_FALSE(decode_frame_header(encode(h)));

    h = FrameHeader{};
    h.type = FrameType::get_resp;
    h.status = Errc::out_of_range;
    h.length = 4;
    EXPECT_FALSE(decode_frame_header(encode(h)));
    h.length = 0;
    EXPECT_TRUE(decode_frame_header(encode(h)));
}

TEST(TcpFrame, Hello) {
    std::string addr = "tcp://127.0.0.1:4000";
    std::vector<std::byte> b(hello_size(addr));
    encode_hello(Hello{42, addr}, b.data());
    auto h = decode_hello(b);
    ASSERT_TRUE(h);
    EXPECT_EQ(h->instance, 42u);
    EXPECT_EQ(h->address, addr);
    // The inner length must match the payload exactly.
    b[8] = std::byte{uint8_t(addr.size() + 1)};
    EXPECT_EQ(decode_hello(b).code(), Errc::protocol_error);
    EXPECT_EQ(decode_hello(std::span(b).first(5)).code(), Errc::protocol_error);
    std::vector<std::byte> anon(hello_size(""));
    encode_hello(Hello{7, ""}, anon.data());
    ASSERT_TRUE(decode_hello(anon));
    EXPECT_TRUE(decode_hello(anon)->address.empty());
}

TEST(TcpFrame, MemBlob) {
    MemBlob m;
    m.base = 0x1000;
    m.length = 4096;
    m.key = 99;
    m.access = 3;
    m.owner = "tcp://[::1]:5000";
    std::vector<std::byte> b(mem_blob_size(m.owner));
    encode_mem_blob(m, b.data());
    auto d = decode_mem_blob(b);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->base, m.base);
    EXPECT_EQ(d->length, m.length);
    EXPECT_EQ(d->key, m.key);
    EXPECT_EQ(d->access, 3);
    EXPECT_EQ(d->owner, m.owner);
    EXPECT_FALSE(decode_mem_blob(std::span(b).first(b.size() - 1)));  // truncated owner
    auto bad = b;
    bad[5] = std::byte{4};
    EXPECT_FALSE(decode_mem_blob(bad));
    bad = b;
    bad[15] = std::byte{0xff};  // base near the top: base + length wraps
    bad[23] = std::byte{0xff};
    EXPECT_FALSE(decode_mem_blob(bad));
}

}  // namespace
}  // namespace talaria::na::tcp
