// The ucx wire format's pure decoders: round trips and rejection of every malformed field.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "na/ucx/wire.hpp"

namespace talaria::na::ucx {
namespace {

std::array<std::byte, kMsgHeaderSize> encode(const MsgHeader& h) {
    std::array<std::byte, kMsgHeaderSize> b{};
    encode_msg_header(h, b.data());
    return b;
}

MsgHeader sample() {
    MsgHeader h;
    h.kind = MsgKind::expected;
    h.context_id = 7;
    h.source_ctx = 5;
    h.tag = 0xdeadbeef;
    h.instance = 0x0102030405060708ull;
    h.seq = 0xfffffffe;
    h.stream = 0x0a0b0c0d;
    return h;
}

TEST(UcxWire, HeaderRoundTripLittleEndian) {
    auto b = encode(sample());
    EXPECT_EQ(uint8_t(b[0]), kWireVersion);
    EXPECT_EQ(uint8_t(b[1]), 3);
    EXPECT_EQ(uint8_t(b[2]), 7);
    EXPECT_EQ(uint8_t(b[3]), 5);     // the sending context
    EXPECT_EQ(uint8_t(b[4]), 0xef);  // tag, little-endian
    EXPECT_EQ(uint8_t(b[8]), 0x08);  // instance, little-endian
    EXPECT_EQ(uint8_t(b[16]), 0xfe);
    EXPECT_EQ(uint8_t(b[20]), 0x0d);  // the sender's endpoint, little-endian
    auto d = decode_msg_header(b);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->kind, MsgKind::expected);
    EXPECT_EQ(d->context_id, 7);
    EXPECT_EQ(d->source_ctx, 5);
    EXPECT_EQ(d->tag, 0xdeadbeefu);
    EXPECT_EQ(d->instance, 0x0102030405060708ull);
    EXPECT_EQ(d->seq, 0xfffffffeu);
    EXPECT_EQ(d->stream, 0x0a0b0c0du);
}

TEST(UcxWire, HeaderRejectsEveryBadField) {
    const auto good = encode(sample());
    auto bad = [&](std::size_t at, uint8_t v) {
        auto b = good;
        b[at] = std::byte(v);
        auto d = decode_msg_header(b);
        EXPECT_FALSE(d) << "byte " << at << " = " << int(v) << " accepted";
        if (!d) {
            EXPECT_EQ(d.code(), Errc::protocol_error);
        }
    };
    bad(0, 0);     // version
    bad(0, 1);     // version (before contexts had workers of their own)
    bad(0, 2);     // version (before served put/get)
    bad(0, 4);     // version
    bad(1, 0);     // kind
    bad(1, 11);    // kind
    bad(1, 0xff);  // kind
    auto zero_instance = sample();
    zero_instance.instance = 0;
    EXPECT_FALSE(decode_msg_header(encode(zero_instance)));
    // Any other length is refused: short, long, empty.
    EXPECT_FALSE(decode_msg_header(std::span(good.data(), kMsgHeaderSize - 1)));
    std::vector<std::byte> longer(good.begin(), good.end());
    longer.push_back(std::byte{0});
    EXPECT_FALSE(decode_msg_header(longer));
    EXPECT_FALSE(decode_msg_header({}));
}

TEST(UcxWire, HelloBounds) {
    std::string a = "ucx+tcp://127.0.0.1:5000";
    std::vector<std::byte> w(40, std::byte{0x11});
    std::vector<std::byte> b(hello_size(a, w.size()));
    encode_hello(a, w, b.data());
    auto d = decode_hello(b);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->address, a);
    EXPECT_TRUE(std::equal(d->worker.begin(), d->worker.end(), w.begin(), w.end()));
    // Truncated at every length, one byte too many, an empty address or worker, a length over
    // the limit.
    for (std::size_t n = 0; n < b.size(); ++n)
        EXPECT_FALSE(decode_hello(std::span(b.data(), n))) << n;
    auto more = b;
    more.push_back(std::byte{'x'});
    EXPECT_FALSE(decode_hello(more));
    std::vector<std::byte> no_worker(hello_size(a, 0));
    encode_hello(a, {}, no_worker.data());
    EXPECT_FALSE(decode_hello(no_worker));
    std::vector<std::byte> no_addr(hello_size("", w.size()));
    encode_hello("", w, no_addr.data());
    EXPECT_FALSE(decode_hello(no_addr));
    std::vector<std::byte> huge(4 + kMaxAddrString + 1 + 1, std::byte{'a'});
    detail::store_le(huge.data(), kMaxAddrString + 1, 2);
    detail::store_le(huge.data() + 2 + kMaxAddrString + 1, 1, 2);
    EXPECT_FALSE(decode_hello(huge));
    std::vector<std::byte> big_worker(kMaxWorkerAddr + 1, std::byte{1});
    std::vector<std::byte> hw(hello_size(a, big_worker.size()));
    encode_hello(a, big_worker, hw.data());
    EXPECT_FALSE(decode_hello(hw));
}

TEST(UcxWire, SignedHelloCarriesItsTail) {
    std::string a = "ucx+tcp://~0123456789abcdef";
    std::vector<std::byte> w(40, std::byte{0x11});
    std::vector<std::byte> b(hello_size(a, w.size()) + kHelloTailSize, std::byte{0x5a});
    encode_hello(a, w, b.data());
    detail::store_le(b.data() + hello_size(a, w.size()), 0x1122334455667788ull, 8);
    auto d = decode_hello(b, true);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->address, a);
    EXPECT_EQ(d->session, 0x1122334455667788ull);
    EXPECT_EQ(d->mac.size(), 32u);
    EXPECT_EQ(d->body.size(), hello_size(a, w.size()));
    EXPECT_EQ(d->mac.data(), b.data() + b.size() - 32);
    // Read unsigned, the tail does not belong; read signed, an unsigned hello lacks it.
    EXPECT_FALSE(decode_hello(b, false));
    std::vector<std::byte> plain(hello_size(a, w.size()));
    encode_hello(a, w, plain.data());
    EXPECT_FALSE(decode_hello(plain, true));
    for (std::size_t n = 0; n < b.size(); ++n)
        EXPECT_FALSE(decode_hello(std::span(b.data(), n), true)) << n;
}

TEST(UcxWire, HelloProcessPartNamesTheSendersProcess) {
    std::string a = "ucx+sm://00ff";
    std::vector<std::byte> w(40, std::byte{0x11});
    std::vector<std::byte> b(hello_size(a, w.size(), true) + kHelloTailSize);
    EXPECT_EQ(b.size(), hello_size(a, w.size()) + kHelloProcessSize + kHelloTailSize);
    encode_hello(a, w, b.data(), 4242, 0xeffff001u);
    auto d = decode_hello(b, true, true);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->address, a);
    EXPECT_EQ(d->worker.size(), w.size());
    EXPECT_EQ(d->pid, 4242u);
    EXPECT_EQ(d->pidns, 0xeffff001u);
    EXPECT_EQ(d->body.size(), b.size() - kHelloTailSize) << "the signature covers the process part";
    // Without the flag the part does not belong; with it, a hello without the part lacks it.
    EXPECT_FALSE(decode_hello(b, true, false));
    std::vector<std::byte> plain(hello_size(a, w.size()));
    encode_hello(a, w, plain.data());
    EXPECT_FALSE(decode_hello(plain, false, true));
    // A process part naming pid or namespace 0 is malformed.
    for (auto [pid, ns] : {std::pair<uint32_t, uint32_t>{0, 7}, {7, 0}}) {
        std::vector<std::byte> z(hello_size(a, w.size(), true));
        encode_hello(a, w, z.data(), pid, 1);
        if (ns == 0) detail::store_le(z.data() + z.size() - 4, 0, 4);
        EXPECT_FALSE(decode_hello(z, false, true)) << pid << " " << ns;
    }
}

std::vector<std::byte> boot_frame(BootKind k, std::size_t len, uint64_t instance = 9) {
    std::vector<std::byte> f(kBootFixedSize + len, std::byte{'r'});
    encode_boot_fixed({k, len, instance}, f.data());
    return f;
}

TEST(UcxWire, BootFramesAreBoundedByKind) {
    // Each kind's smallest and largest body decode; one byte beyond either end does not.
    struct Bounds {
        BootKind kind;
        std::size_t lo, hi;
    };
    for (Bounds b : {Bounds{BootKind::request, 2 + kBootNonceSize, kBootMaxRequestBody},
                     Bounds{BootKind::challenge, 64, 64}, Bounds{BootKind::response, 32, 32},
                     Bounds{BootKind::answer, 1, kMaxWorkerAddr},
                     Bounds{BootKind::refused, 1, kBootMaxReason}}) {
        SCOPED_TRACE(int(b.kind));
        for (std::size_t len : {b.lo, b.hi}) {
            auto f = boot_frame(b.kind, len);
            auto d = decode_boot_fixed(std::span(f).first(kBootFixedSize));
            ASSERT_TRUE(d) << d.error().describe();
            EXPECT_EQ(d->kind, b.kind);
            EXPECT_EQ(d->length, len);
            EXPECT_EQ(d->instance, 9u);
        }
        auto under = boot_frame(b.kind, b.lo - 1), over = boot_frame(b.kind, b.hi + 1);
        if (b.kind != BootKind::request) {  // an empty request is one without authentication
            EXPECT_FALSE(decode_boot_fixed(std::span(under).first(16)));
        }
        EXPECT_FALSE(decode_boot_fixed(std::span(over).first(16)));
    }
    auto no_auth = boot_frame(BootKind::request, 0);
    EXPECT_TRUE(decode_boot_fixed(std::span(no_auth).first(16)));
    auto one = boot_frame(BootKind::request, 1);
    EXPECT_FALSE(decode_boot_fixed(std::span(one).first(16)));
    // Unknown kinds, instance 0, another magic or version, a short fixed part.
    for (uint8_t k : {0, 6, 255}) {
        auto f = boot_frame(BootKind::answer, 8);
        f[5] = std::byte{k};
        EXPECT_FALSE(decode_boot_fixed(std::span(f).first(16))) << int(k);
    }
    auto zero = boot_frame(BootKind::answer, 8, 0);
    EXPECT_FALSE(decode_boot_fixed(std::span(zero).first(16)));
    for (std::size_t at : {0, 3, 4}) {
        auto f = boot_frame(BootKind::answer, 8);
        f[at] ^= std::byte{1};
        EXPECT_FALSE(decode_boot_fixed(std::span(f).first(16))) << at;
    }
    auto f = boot_frame(BootKind::answer, 8);
    EXPECT_FALSE(decode_boot_fixed(std::span(f).first(15)));
}

TEST(UcxWire, BootRequestAndRefusalBodies) {
    std::array<std::byte, kBootNonceSize> nonce{};
    nonce.fill(std::byte{3});
    std::string key = "cluster-7";
    std::vector<std::byte> body(boot_request_body_size(key));
    encode_boot_request_body(key, nonce, body.data());
    auto r = decode_boot_request_body(body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->key_id, key);
    EXPECT_TRUE(std::equal(r->nonce.begin(), r->nonce.end(), nonce.begin(), nonce.end()));
    auto none = decode_boot_request_body({});
    ASSERT_TRUE(none);
    EXPECT_TRUE(none->key_id.empty());
    // A key id length that disagrees with the body, or 0.
    for (uint8_t k : {0, 8, 10, 255}) {
        auto bad = body;
        bad[0] = std::byte{k};
        EXPECT_FALSE(decode_boot_request_body(bad)) << int(k);
    }
    std::string why = "refused: key 'k'";
    auto w = std::as_bytes(std::span(why));
    auto d = decode_boot_refused(w);
    ASSERT_TRUE(d);
    EXPECT_EQ(*d, why);
    std::vector<std::byte> ctrl(w.begin(), w.end());
    ctrl[3] = std::byte{'\n'};
    EXPECT_FALSE(decode_boot_refused(ctrl));
    EXPECT_FALSE(decode_boot_refused({}));
}

TEST(UcxWire, LocatedBounds) {
    std::vector<std::byte> w(33, std::byte{0x22});
    Located l;
    l.lane = 3;
    l.unexpected = false;
    l.worker = w;
    std::vector<std::byte> b(located_size(w.size()));
    encode_located(l, b.data());
    auto d = decode_located(b);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->lane, 3);
    EXPECT_FALSE(d->unexpected);
    EXPECT_EQ(d->worker.size(), w.size());
    for (std::size_t n = 0; n < b.size(); ++n)
        EXPECT_FALSE(decode_located(std::span(b.data(), n))) << n;
    auto more = b;
    more.push_back(std::byte{0});
    EXPECT_FALSE(decode_located(more));
    auto kind = b;
    kind[1] = std::byte{2};
    EXPECT_FALSE(decode_located(kind));
    // Locate: one byte, 0 (unexpected) or 1 (expected).
    std::byte k0[1] = {std::byte{0}}, k1[1] = {std::byte{1}}, k2[1] = {std::byte{2}};
    ASSERT_TRUE(decode_locate(k0));
    EXPECT_TRUE(*decode_locate(k0));
    ASSERT_TRUE(decode_locate(k1));
    EXPECT_FALSE(*decode_locate(k1));
    EXPECT_FALSE(decode_locate(k2));
    EXPECT_FALSE(decode_locate({}));
    EXPECT_FALSE(decode_locate(b));
    std::vector<std::byte> empty(located_size(0));
    l.worker = {};
    encode_located(l, empty.data());
    EXPECT_FALSE(decode_located(empty));
}

TEST(UcxWire, AddrBlobBounds) {
    std::vector<std::byte> b = {std::byte{3}, std::byte{0}, std::byte{'a'}, std::byte{'b'},
                                std::byte{'c'}};
    auto d = decode_addr_blob(b);
    ASSERT_TRUE(d);
    EXPECT_EQ(*d, "abc");
    EXPECT_FALSE(decode_addr_blob(std::span(b.data(), 4)));
    EXPECT_FALSE(decode_addr_blob(std::span(b.data(), 1)));
    b[0] = std::byte{0};
    EXPECT_FALSE(decode_addr_blob(b)) << "empty address accepted";
}

std::vector<std::byte> mem(uint64_t base, uint64_t len, uint8_t access, std::size_t rkey_len,
                           std::string_view owner, uint32_t pid = 0, uint32_t pidns = 0,
                           uint64_t key = 0) {
    std::vector<std::byte> rkey(rkey_len, std::byte{0x5a});
    MemBlob m;
    m.base = base;
    m.length = len;
    m.access = access;
    m.rkey = rkey;
    m.owner = owner;
    m.pid = pid;
    m.pidns = pidns;
    m.key = key;
    std::vector<std::byte> out(mem_blob_size(rkey.size(), owner.size()));
    encode_mem_blob(m, out.data());
    return out;
}

TEST(UcxWire, MemBlobRoundTrip) {
    auto b = mem(0x1000, 64, 3, 40, "ucx+sm://00ff");
    auto d = decode_mem_blob(b);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->base, 0x1000u);
    EXPECT_EQ(d->length, 64u);
    EXPECT_EQ(d->access, 3);
    EXPECT_EQ(d->rkey.size(), 40u);
    EXPECT_EQ(uint8_t(d->rkey[39]), 0x5a);
    EXPECT_EQ(d->owner, "ucx+sm://00ff");
    EXPECT_EQ(d->pid, 0u);
    EXPECT_EQ(d->pidns, 0u);
    // The owner's process, for direct copies between ucx+sm peers.
    auto p = decode_mem_blob(mem(0x1000, 64, 3, 40, "ucx+sm://00ff", 4321, 0xeffffffcu));
    ASSERT_TRUE(p) << p.error().describe();
    EXPECT_EQ(p->pid, 4321u);
    EXPECT_EQ(p->pidns, 0xeffffffcu);
    // A zero-length region carries no key.
    EXPECT_TRUE(decode_mem_blob(mem(0x1000, 0, 1, 0, "o")));
    // A served region: its owner's key instead of a remote key.
    auto k = decode_mem_blob(mem(0x1000, 64, 2, 0, "ucx+tcp://1.2.3.4:5", 0, 0, 0xfeedu));
    ASSERT_TRUE(k) << k.error().describe();
    EXPECT_EQ(k->key, 0xfeedu);
    EXPECT_TRUE(k->rkey.empty());
}

TEST(UcxWire, MemBlobRejectsEveryBadField) {
    auto good = mem(0x1000, 64, 3, 40, "owner");
    for (std::size_t n = 0; n < good.size(); ++n)
        EXPECT_FALSE(decode_mem_blob(std::span(good.data(), n))) << "truncated to " << n;
    auto with = [&](std::size_t at, uint8_t v) {
        auto b = good;
        b[at] = std::byte(v);
        return b;
    };
    EXPECT_FALSE(decode_mem_blob(with(0, 0))) << "magic";
    EXPECT_FALSE(decode_mem_blob(with(4, 9))) << "version";
    EXPECT_FALSE(decode_mem_blob(with(5, 0))) << "access 0";
    EXPECT_FALSE(decode_mem_blob(with(5, 4))) << "access 4";
    EXPECT_FALSE(decode_mem_blob(with(6, 1))) << "reserved";
    EXPECT_FALSE(decode_mem_blob(with(4, 1))) << "version 1 (no owner process fields)";
    EXPECT_FALSE(decode_mem_blob(with(4, 2))) << "version 2 (no key)";
    // Both a remote key and a served key, or a served key for an empty region.
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 64, 3, 8, "o", 0, 0, 5)));
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 0, 3, 0, "o", 0, 0, 5)));
    // Owner process: a pid without a namespace, a namespace without a pid, a negative pid.
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 64, 3, 8, "o", 7, 0)));
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 64, 3, 8, "o", 0, 7)));
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 64, 3, 8, "o", 0x80000000u, 7)));
    // rkey length: beyond the limit, beyond the input, and zero for a non-empty region.
    auto b = good;
    detail::store_le(b.data() + 24, kMaxRkeySize + 1, 4);
    EXPECT_FALSE(decode_mem_blob(b));
    detail::store_le(b.data() + 24, 0xffffffffu, 4);
    EXPECT_FALSE(decode_mem_blob(b));
    detail::store_le(b.data() + 24, 41, 4);
    EXPECT_FALSE(decode_mem_blob(b)) << "rkey + owner longer than the input";
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 64, 3, 0, "o"))) << "no key for 64 bytes";
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 0, 3, 8, "o"))) << "a key for 0 bytes";
    // owner length: zero, beyond the limit, beyond the input.
    EXPECT_FALSE(decode_mem_blob(mem(0x1000, 64, 3, 8, "")));
    b = good;
    detail::store_le(b.data() + 28, 0xffffffffu, 4);
    EXPECT_FALSE(decode_mem_blob(b));
    // A region that wraps around the address space.
    EXPECT_FALSE(decode_mem_blob(mem(~uint64_t(0) - 10, 64, 3, 8, "o")));
}

TEST(UcxWire, RmaHeaderRoundTripAndBadFields) {
    RmaHeader r;
    r.key = 0x1122334455667788u;
    r.address = 0x7f0000001000u;
    r.cookie = 0xabcdef0123456789u;
    r.length = uint32_t(kRmaChunk);
    std::byte b[kRmaHeaderSize];
    encode_rma_header(r, b);
    auto d = decode_rma_header(b, true);
    ASSERT_TRUE(d) << d.error().describe();
    EXPECT_EQ(d->key, r.key);
    EXPECT_EQ(d->address, r.address);
    EXPECT_EQ(d->cookie, r.cookie);
    EXPECT_EQ(d->length, r.length);
    EXPECT_EQ(d->status, 0);
    // An answer's status; a request must carry none.
    r.status = uint8_t(Errc::access_denied);
    encode_rma_header(r, b);
    EXPECT_TRUE(decode_rma_header(b, false));
    EXPECT_FALSE(decode_rma_header(b, true));
    r.status = uint8_t(kLastErrc) + 1;
    encode_rma_header(r, b);
    EXPECT_FALSE(decode_rma_header(b, false)) << "unknown status";
    r.status = 0;
    r.length = uint32_t(kRmaChunk) + 1;
    encode_rma_header(r, b);
    EXPECT_FALSE(decode_rma_header(b, true)) << "longer than a chunk";
    r.length = 1;
    encode_rma_header(r, b);
    b[30] = std::byte{1};
    EXPECT_FALSE(decode_rma_header(b, true)) << "reserved";
    EXPECT_FALSE(decode_rma_header(std::span(b, kRmaHeaderSize - 1), true)) << "short";
}

TEST(UcxWire, IsHex) {
    EXPECT_TRUE(is_hex("00ff"));
    EXPECT_FALSE(is_hex(""));
    EXPECT_FALSE(is_hex("0"));
    EXPECT_FALSE(is_hex("00FF"));
    EXPECT_FALSE(is_hex("0g"));
}

}  // namespace
}  // namespace talaria::na::ucx
