// The bulk suite: handles, their encoding, and transfers, instantiated for every transport in
// the build (test names end in the transport: bulk/Bulk.PullManySegments/tcp). Every wait is
// bounded (progress_until), so a broken transfer fails a test instead of hanging it.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "bulk_peer_protocol.hpp"
#include "harness.hpp"
#include "na/inproc/inproc_faults.hpp"
#include "peer_process.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/proc/archive.hpp"
#include "talaria/proc/proc.hpp"

namespace talaria::bulk::test {
namespace {

using namespace std::chrono_literals;
using na::Access;
using na::test::fill_pattern;
using na::test::pattern_mismatch;
using na::test::PeerProcess;
using na::test::progress_until;
using na::test::TransportKind;

// --- memory regions in several segments ----------------------------------------------------------

/// Caller-owned memory in segments of the given sizes, viewed as one logical byte range.
struct Region {
    std::vector<std::vector<std::byte>> bufs;
    std::vector<Segment> segs;

    explicit Region(std::initializer_list<std::size_t> sizes) : Region(std::vector(sizes)) {}
    explicit Region(const std::vector<std::size_t>& sizes) {
        for (std::size_t n : sizes)
            bufs.emplace_back(n);
        for (auto& b : bufs)
            segs.push_back({b.data(), b.size()});
    }
    [[nodiscard]] std::size_t size() const {
        std::size_t n = 0;
        for (auto& b : bufs)
            n += b.size();
        return n;
    }
    /// All bytes in handle order.
    [[nodiscard]] std::vector<std::byte> flat() const {
        std::vector<std::byte> out;
        for (auto& b : bufs)
            out.insert(out.end(), b.begin(), b.end());
        return out;
    }
    void fill(uint32_t seed) {
        std::size_t off = 0;
        for (auto& b : bufs) {
            fill_pattern(b, seed, off);
            off += b.size();
        }
    }
    void zero() {
        for (auto& b : bufs)
            std::fill(b.begin(), b.end(), std::byte{0});
    }
};

/// Offsets worth testing in a region of segments `sizes`: each boundary, one either side, the
/// ends.
std::vector<std::size_t> interesting_offsets(const std::vector<std::size_t>& sizes) {
    std::set<std::size_t> s{0, 1};
    std::size_t off = 0;
    for (std::size_t n : sizes) {
        off += n;
        for (std::size_t o : {off - 1, off, off + 1})
            s.insert(o);
    }
    std::vector<std::size_t> v;
    for (std::size_t o : s)
        if (o < off) v.push_back(o);
    return v;
}

// --- the fixture ---------------------------------------------------------------------------------

struct Side {
    std::unique_ptr<na::Transport> t;
    std::unique_ptr<na::Context> ctx;
    std::unique_ptr<bulk::Context> bulk;  ///< the transfers on ctx
    void close() {
        bulk.reset();
        ctx.reset();
        t.reset();
    }
};

/// How a transfer ended, as its callback saw it.
struct Outcome {
    int calls = 0;
    Errc code = Errc::internal;
    std::string message;
    [[nodiscard]] bool done() const { return calls > 0; }
};

DoneFn record(Outcome& o) {
    return [&o](Result<void>&& r) {
        ++o.calls;
        o.code = r.code();
        o.message = r ? std::string() : r.error().message();
    };
}

class Bulk : public ::testing::TestWithParam<TransportKind> {
  protected:
    static ::testing::AssertionResult open_side(Side& s, const na::Options& o = {}) {
        auto r = na::open(GetParam().address, o);
        if (!r)
            return ::testing::AssertionFailure()
                   << "open(" << GetParam().address << "): " << r.error().describe();
        s.t = std::move(*r);
        auto c = s.t->context_create(0);
        if (!c)
            return ::testing::AssertionFailure() << "context_create(0): " << c.error().describe();
        s.ctx = std::move(*c);
        s.bulk = std::make_unique<bulk::Context>(*s.ctx);
        return ::testing::AssertionSuccess();
    }

    void SetUp() override {
        ASSERT_TRUE(open_side(server_));
        ASSERT_TRUE(open_side(client_));
        auto a = client_.t->addr_lookup(server_.t->addr_to_string(server_.t->addr_self()));
        ASSERT_TRUE(a) << a.error().describe();
        server_addr_ = *a;
    }
    void TearDown() override {
        keep_.clear();
        server_addr_.reset();
        client_.close();
        server_.close();
    }

    /// `h` (a server handle) as the client sees it after the encoding travelled. The server's
    /// handle is kept (registered) until the test ends.
    Handle to_client(const Handle& h, bool with_source = true) {
        keep_.push_back(h);
        std::vector<std::byte> enc;
        auto e = h.encode(enc);
        EXPECT_TRUE(e) << e.error().describe();
        proc::Decoder d(enc, {client_.t.get(), with_source ? &server_addr_ : nullptr});
        auto r = Handle::decode(d);
        EXPECT_TRUE(r) << r.error().describe();
        EXPECT_EQ(d.remaining(), 0u);
        return r ? *r : Handle();
    }

    static Handle make(Side& s, Region& r, Access a, bool owner = false) {
        auto h = Handle::create(*s.t, r.segs, a, owner);
        EXPECT_TRUE(h) << h.error().describe();
        return h ? *h : Handle();
    }

    /// Run one transfer on the client to completion; its outcome (calls counts completions).
    Outcome run(Direction dir, const Handle& remote, std::size_t roff, const Handle& local,
                std::size_t loff, std::size_t len) {
        Outcome o;
        auto id =
            client_.bulk->transfer(dir, remote.owner(), remote, roff, local, loff, len, record(o));
        if (!id) {
            o.code = id.code();
            o.message = id.error().message();
            return o;
        }
        EXPECT_EQ(o.calls, 0) << "completed from inside transfer()";
        EXPECT_TRUE(progress_until(
            {client_.ctx.get(), server_.ctx.get()}, [&] { return o.done(); }, 20s))
            << "transfer did not complete";
        EXPECT_EQ(client_.bulk->cancel(*id).code(), Errc::not_found)
            << "id still live after completion";
        return o;
    }

    /// Pull and push every combination of interesting offsets between regions of these segment
    /// sizes, checking every byte (also that nothing outside the range changed).
    void many_segments(Direction dir, const std::vector<std::size_t>& remote_sizes,
                       const std::vector<std::size_t>& local_sizes);

    Side server_;
    Side client_;
    na::Addr server_addr_;      ///< the server, looked up on the client
    std::vector<Handle> keep_;  ///< server handles given to_client()
};

void Bulk::many_segments(Direction dir, const std::vector<std::size_t>& remote_sizes,
                         const std::vector<std::size_t>& local_sizes) {
    Region rr(remote_sizes), lr(local_sizes);
    Handle sh = make(server_, rr, Access::read_write);
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(sh && lh);
    Handle rh = to_client(sh);
    ASSERT_TRUE(rh);
    ASSERT_EQ(rh.segment_count(), remote_sizes.size());
    const std::size_t rsize = rr.size(), lsize = lr.size();
    auto roffs = interesting_offsets(remote_sizes);
    auto loffs = interesting_offsets(local_sizes);
    int n = 0;
    for (std::size_t roff : roffs) {
        for (std::size_t loff : loffs) {
            std::size_t max = std::min(rsize - roff, lsize - loff);
            for (std::size_t len : {max, max / 2 + 1, std::size_t(3)}) {
                if (len > max) continue;
                uint32_t seed = uint32_t(100 + n++);
                // Source gets a fresh pattern; the destination a different one, so bytes outside
                // the range can be checked to be untouched.
                Region& src = dir == Direction::pull ? rr : lr;
                Region& dst = dir == Direction::pull ? lr : rr;
                std::size_t soff = dir == Direction::pull ? roff : loff;
                std::size_t doff = dir == Direction::pull ? loff : roff;
                src.fill(seed);
                dst.fill(seed + 50000);
                Outcome o = run(dir, rh, roff, lh, loff, len);
                ASSERT_EQ(o.calls, 1);
                ASSERT_EQ(o.code, Errc::ok) << o.message;
                auto s = src.flat(), d = dst.flat();
                ASSERT_TRUE(std::equal(d.begin() + doff, d.begin() + doff + len, s.begin() + soff))
                    << "remote offset " << roff << ", local offset " << loff << ", " << len
                    << " bytes";
                auto before = std::span(d).first(doff);
                auto after = std::span(d).subspan(doff + len);
                ASSERT_FALSE(pattern_mismatch(before, seed + 50000, 0))
                    << "bytes before the range changed";
                ASSERT_FALSE(pattern_mismatch(after, seed + 50000, doff + len))
                    << "bytes after the range changed";
            }
        }
    }
    EXPECT_GT(n, 100);
}

// --- transfers -----------------------------------------------------------------------------------

const std::vector<std::size_t> kSeven{1, 5000, 17, 4096, 2, 999, 3333};
const std::vector<std::size_t> kThree{4500, 1, 8000};

TEST_P(Bulk, PullManySegments) {
    many_segments(Direction::pull, kSeven, kThree);
}

TEST_P(Bulk, PushManySegments) {
    many_segments(Direction::push, kSeven, kThree);
}

TEST_P(Bulk, PullIntoManyFromFew) {
    many_segments(Direction::pull, kThree, kSeven);
}

TEST_P(Bulk, LargeTransfers) {
    constexpr std::size_t kMiB = 1024 * 1024;
    // 16 MiB each side, segments not aligned with each other, and one single-segment pair.
    for (auto [rs, ls] :
         {std::pair<std::vector<std::size_t>, std::vector<std::size_t>>{{16 * kMiB}, {16 * kMiB}},
          {{4 * kMiB, 4 * kMiB, 4 * kMiB, 4 * kMiB}, {5 * kMiB + 3, 5 * kMiB - 3, 6 * kMiB}}}) {
        Region rr(rs), lr(ls);
        Handle sh = make(server_, rr, Access::read_write);
        Handle lh = make(client_, lr, Access::read_write);
        Handle rh = to_client(sh);
        ASSERT_TRUE(rh && lh);
        rr.fill(1);
        Outcome o = run(Direction::pull, rh, 0, lh, 0, 16 * kMiB);
        ASSERT_EQ(o.calls, 1);
        ASSERT_EQ(o.code, Errc::ok) << o.message;
        ASSERT_FALSE(pattern_mismatch(lr.flat(), 1)) << "pulled 16 MiB differ";
        lr.fill(2);
        o = run(Direction::push, rh, 0, lh, 0, 16 * kMiB);
        ASSERT_EQ(o.calls, 1);
        ASSERT_EQ(o.code, Errc::ok) << o.message;
        ASSERT_FALSE(pattern_mismatch(rr.flat(), 2)) << "pushed 16 MiB differ";
    }
}

TEST_P(Bulk, ZeroLengthCompletesOk) {
    Region rr{10, 10}, lr{5};
    Handle rh = to_client(make(server_, rr, Access::read_write));
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(rh && lh);
    for (Direction d : {Direction::pull, Direction::push})
        for (std::size_t off : {std::size_t(0), std::size_t(5)}) {
            Outcome o = run(d, rh, off + 15, lh, off, 0);
            EXPECT_EQ(o.calls, 1);
            EXPECT_EQ(o.code, Errc::ok) << o.message;
        }
}

TEST_P(Bulk, OutOfRangeRejected) {
    Region rr{100, 28}, lr{64, 64};
    Handle rh = to_client(make(server_, rr, Access::read_write));
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(rh && lh);
    const std::size_t kMax = SIZE_MAX;
    struct Case {
        std::size_t roff, loff, len;
        const char* side;
    };
    for (Case c :
         {Case{0, 0, 129, "remote"}, Case{128, 0, 1, "remote"}, Case{129, 0, 0, "remote"},
          Case{100, 0, 29, "remote"}, Case{kMax, 0, 2, "remote"}, Case{1, 0, kMax, "remote"},
          Case{0, 120, 9, "local"}, Case{0, kMax, 1, "local"}, Case{0, 1, 128, "local"}}) {
        for (Direction d : {Direction::pull, Direction::push}) {
            Outcome o;
            auto id =
                client_.bulk->transfer(d, rh.owner(), rh, c.roff, lh, c.loff, c.len, record(o));
            ASSERT_FALSE(id) << c.roff << "/" << c.loff << "/" << c.len;
            EXPECT_EQ(id.code(), Errc::out_of_range);
            EXPECT_NE(id.error().message().find(c.side), std::string::npos) << id.error().message();
            EXPECT_NE(id.error().message().find("outside"), std::string::npos)
                << id.error().message();
        }
    }
    na::test::progress_for({client_.ctx.get()}, 20ms);
}

TEST_P(Bulk, AccessModesEnforced) {
    Region rr{64, 64}, lr{128};
    auto remote_with = [&](Access a) { return to_client(make(server_, rr, a)); };
    struct Case {
        Direction dir;
        Access remote, local;
        bool ok;
        const char* says;  ///< a word the message must contain when refused
    };
    for (Case c : {Case{Direction::pull, Access::read_only, Access::read_write, true, ""},
                   Case{Direction::pull, Access::read_write, Access::write_only, true, ""},
                   Case{Direction::pull, Access::write_only, Access::read_write, false,
                        "remote handle is write_only"},
                   Case{Direction::pull, Access::read_write, Access::read_only, false,
                        "local handle is read_only"},
                   Case{Direction::push, Access::write_only, Access::read_only, true, ""},
                   Case{Direction::push, Access::read_write, Access::read_write, true, ""},
                   Case{Direction::push, Access::read_only, Access::read_write, false,
                        "remote handle is read_only"},
                   Case{Direction::push, Access::read_write, Access::write_only, false,
                        "local handle is write_only"}}) {
        Handle rh = remote_with(c.remote);
        Handle lh = make(client_, lr, c.local);
        ASSERT_TRUE(rh && lh);
        Outcome o = run(c.dir, rh, 0, lh, 0, 128);
        if (c.ok) {
            EXPECT_EQ(o.calls, 1);
            EXPECT_EQ(o.code, Errc::ok) << o.message;
        } else {
            EXPECT_EQ(o.calls, 0);
            EXPECT_EQ(o.code, Errc::access_denied);
            EXPECT_NE(o.message.find(c.says), std::string::npos) << o.message;
        }
    }
}

TEST_P(Bulk, WrongHandlesRejected) {
    Region rr{64}, lr{64};
    Handle sh = make(server_, rr, Access::read_write);
    Handle rh = to_client(sh);
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(sh && rh && lh);
    auto expect_invalid = [&](const Handle& remote, const Handle& local, const na::Addr& peer,
                              const char* says) {
        Outcome o;
        auto id = client_.bulk->transfer(Direction::pull, peer, remote, 0, local, 0, 8, record(o));
        ASSERT_FALSE(id) << says;
        EXPECT_EQ(id.code(), Errc::invalid_argument);
        EXPECT_NE(id.error().message().find(says), std::string::npos) << id.error().message();
    };
    // The server's own registration is a local handle of another transport.
    expect_invalid(sh, lh, server_addr_, "another transport");
    // The remote handle must be remote, the local one local.
    Handle lh2 = make(client_, rr, Access::read_write);
    expect_invalid(lh2, lh, server_addr_, "remote handle is a local registration");
    expect_invalid(rh, rh, server_addr_, "local handle was decoded");
    expect_invalid(Handle(), lh, server_addr_, "empty");
    expect_invalid(rh, Handle(), server_addr_, "empty");
    // A peer address of another transport, and none at all.
    expect_invalid(rh, lh, server_.t->addr_self(), "peer address belongs to another transport");
    expect_invalid(rh, lh, na::Addr(), "no peer address");
    // Handles of a third endpoint of the same kind: registered there, or decoded there.
    Side other;
    ASSERT_TRUE(open_side(other));
    {
        std::vector<std::byte> enc;
        ASSERT_TRUE(sh.encode(enc));
        Region small{8};
        auto foreign_local = Handle::create(*other.t, small.segs, Access::read_write);
        ASSERT_TRUE(foreign_local);
        expect_invalid(rh, *foreign_local, server_addr_, "local handle belongs to another");
        proc::Decoder d(enc, {other.t.get(), nullptr});
        auto foreign_remote = Handle::decode(d);
        ASSERT_TRUE(foreign_remote) << foreign_remote.error().describe();
        expect_invalid(*foreign_remote, lh, server_addr_, "remote handle belongs to another");
    }
    other.close();
    // Creating handles: no segments, or empty ones, make a zero-size handle; an empty segment
    // among others is skipped; bytes at a null pointer are refused.
    auto none = Handle::create(*client_.t, {}, Access::read_write);
    ASSERT_TRUE(none) << none.error().describe();
    EXPECT_TRUE(none->valid());
    EXPECT_EQ(none->size(), 0u);
    EXPECT_EQ(none->segment_count(), 0u);
    Segment some[] = {{lr.bufs[0].data(), 10}, {lr.bufs[0].data() + 10, 0}, {nullptr, 0}};
    auto skipped = Handle::create(*client_.t, some, Access::read_write);
    ASSERT_TRUE(skipped) << skipped.error().describe();
    EXPECT_EQ(skipped->size(), 10u);
    EXPECT_EQ(skipped->segment_count(), 1u);
    Segment bad[] = {{lr.bufs[0].data(), 10}, {nullptr, 5}};
    auto r = Handle::create(*client_.t, bad, Access::read_write);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::invalid_argument);
    EXPECT_NE(r.error().message().find("segment 1"), std::string::npos) << r.error().message();
}

// Issue 11: a null handle travels (one byte) and decodes as null; a zero-size handle travels
// and decodes as a valid handle of 0 bytes, and 0-byte transfers from and to it complete.
TEST_P(Bulk, NullAndZeroSizeHandlesTravel) {
    std::vector<std::byte> enc;
    ASSERT_TRUE(Handle().encode(enc));
    ASSERT_EQ(enc.size(), 1u);
    EXPECT_EQ(uint8_t(enc[0]), 0x14);
    proc::Decoder d(enc, {client_.t.get(), &server_addr_});
    auto null = Handle::decode(d);
    ASSERT_TRUE(null) << null.error().describe();
    EXPECT_FALSE(null->valid());
    EXPECT_EQ(d.remaining(), 0u);

    for (Access a : {Access::read_only, Access::read_write}) {
        auto zero = Handle::create(*server_.t, {}, a);
        ASSERT_TRUE(zero) << zero.error().describe();
        enc.clear();
        ASSERT_TRUE(zero->encode(enc));
        proc::Decoder z(enc, {client_.t.get(), &server_addr_});
        auto rz = Handle::decode(z);
        ASSERT_TRUE(rz) << rz.error().describe();
        EXPECT_TRUE(rz->valid());
        EXPECT_EQ(rz->size(), 0u);
        EXPECT_EQ(rz->access(), a);
        // 0 bytes from it into a zero-size local handle, and into a real one.
        Region lr{64};
        Handle lh = make(client_, lr, Access::read_write);
        auto lz = Handle::create(*client_.t, {}, Access::read_write);
        ASSERT_TRUE(lz);
        for (const Handle* local : {&*lz, &lh}) {
            auto o = run(Direction::pull, *rz, 0, *local, 0, 0);
            EXPECT_EQ(o.code, Errc::ok) << o.message;
            EXPECT_EQ(o.calls, 1);
        }
        // Anything past 0 bytes is out of range.
        EXPECT_EQ(run(Direction::pull, *rz, 0, lh, 0, 1).code, Errc::out_of_range);
    }
    // The null flag with another: refused.
    std::vector<std::byte> bad{std::byte{0x15}};
    proc::Decoder b(bad, {client_.t.get(), nullptr});
    EXPECT_EQ(Handle::decode(b).code(), Errc::protocol_error);
}

TEST_P(Bulk, InlineSmallHandle) {
    Region rr{40, 60};  // 100 bytes: travels inline
    rr.fill(9);
    Handle sh = make(server_, rr, Access::read_only);
    std::vector<std::byte> enc;
    ASSERT_TRUE(sh.encode(enc));
    EXPECT_GT(enc.size(), 100u);
    // The bytes are those at encoding time: change the server's memory afterwards.
    auto expect = rr.flat();
    rr.zero();
    proc::Decoder d(enc, {client_.t.get(), &server_addr_});
    auto rh = Handle::decode(d);
    ASSERT_TRUE(rh) << rh.error().describe();
    EXPECT_TRUE(rh->is_inline());
    EXPECT_EQ(rh->size(), 100u);
    EXPECT_EQ(rh->segment_count(), 2u);
    EXPECT_EQ(rh->access(), Access::read_only);
    Region lr{7, 93, 30};
    Handle lh = make(client_, lr, Access::read_write);
    Outcome o = run(Direction::pull, *rh, 0, lh, 3, 100);
    ASSERT_EQ(o.calls, 1);
    ASSERT_EQ(o.code, Errc::ok) << o.message;
    auto got = lr.flat();
    EXPECT_TRUE(std::equal(expect.begin(), expect.end(), got.begin() + 3));
    o = run(Direction::pull, *rh, 39, lh, 0, 2);
    ASSERT_EQ(o.code, Errc::ok) << o.message;
    EXPECT_EQ(lr.bufs[0][0], expect[39]);
    EXPECT_EQ(lr.bufs[0][1], expect[40]);
    // No peer address needed for an inline pull; push is refused (read_only).
    Outcome o2;
    auto id = client_.bulk->transfer(Direction::pull, na::Addr(), *rh, 0, lh, 0, 100, record(o2));
    ASSERT_TRUE(id) << id.error().describe();
    ASSERT_TRUE(progress_until({client_.ctx.get()}, [&] { return o2.done(); }));
    EXPECT_EQ(o2.code, Errc::ok);
    o = run(Direction::push, *rh, 0, lh, 0, 10);
    EXPECT_EQ(o.code, Errc::access_denied);
    // Re-encoding a decoded inline handle (decoded with no source: no owner to forward) gives
    // the same bytes.
    proc::Decoder d2(enc, {client_.t.get(), nullptr});
    auto rh2 = Handle::decode(d2);
    ASSERT_TRUE(rh2) << rh2.error().describe();
    std::vector<std::byte> enc2;
    ASSERT_TRUE(rh2->encode(enc2));
    EXPECT_EQ(enc2, enc);
    // Larger, or writable, handles do not travel inline.
    Region big{kInlineMax + 1};
    EXPECT_FALSE(to_client(make(server_, big, Access::read_only)).is_inline());
    EXPECT_FALSE(to_client(make(server_, rr, Access::read_write)).is_inline());
    Region edge{kInlineMax};
    EXPECT_TRUE(to_client(make(server_, edge, Access::read_only)).is_inline());
}

TEST_P(Bulk, EmbeddedOwner) {
    Region rr{300, 5}, lr{305};
    rr.fill(4);
    Handle sh = make(server_, rr, Access::read_write, true);
    EXPECT_FALSE(sh.owner().valid()) << "a local handle has no owner";
    // Decoded with no source: the owner comes from the encoding.
    Handle rh = to_client(sh, false);
    ASSERT_TRUE(rh);
    ASSERT_TRUE(rh.owner().valid());
    EXPECT_TRUE(rh.owner() == server_addr_) << "the embedded owner is not the server";
    Handle lh = make(client_, lr, Access::read_write);
    Outcome o = run(Direction::pull, rh, 0, lh, 0, 305);
    ASSERT_EQ(o.code, Errc::ok) << o.message;
    EXPECT_FALSE(pattern_mismatch(lr.flat(), 4));
    // Forwarding: re-encoded by the client, the owner still travels.
    std::vector<std::byte> enc;
    ASSERT_TRUE(rh.encode(enc));
    proc::Decoder d(enc, {client_.t.get(), nullptr});
    auto again = Handle::decode(d);
    ASSERT_TRUE(again) << again.error().describe();
    EXPECT_TRUE(again->owner() == server_addr_);
    // Without an embedded owner or a source there is no owner, and a transfer says so.
    Handle anon = to_client(make(server_, rr, Access::read_write), false);
    ASSERT_TRUE(anon);
    EXPECT_FALSE(anon.owner().valid());
    o = run(Direction::pull, anon, 0, lh, 0, 10);
    EXPECT_EQ(o.code, Errc::invalid_argument);
    EXPECT_NE(o.message.find("no peer address"), std::string::npos) << o.message;
    // With a source, it is the owner.
    EXPECT_TRUE(to_client(make(server_, rr, Access::read_write)).owner() == server_addr_);
}

TEST_P(Bulk, CancelLargeTransfer) {
    // 256 segments of 64 KiB: many windows of pieces, so a cancel lands mid-way.
    std::vector<std::size_t> sizes(256, 64 * 1024);
    Region rr(sizes), lr{16 * 1024 * 1024};
    Handle rh = to_client(make(server_, rr, Access::read_write));
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(rh && lh);
    std::set<Errc> seen;
    for (int round = 0; round < 4; ++round) {
        Outcome o;
        auto id = client_.bulk->transfer(round % 2 ? Direction::push : Direction::pull, rh.owner(),
                                         rh, 0, lh, 0, lr.size(), record(o));
        ASSERT_TRUE(id) << id.error().describe();
        if (round >= 2)  // let some pieces finish first
            (void)progress_until(
                {client_.ctx.get(), server_.ctx.get()}, [&] { return o.done(); }, 2ms);
        auto c = client_.bulk->cancel(*id);
        if (!c) {
            EXPECT_EQ(c.code(), Errc::not_found) << "cancel: " << c.error().describe();
        }
        EXPECT_TRUE(client_.bulk->cancel(*id) || o.done())
            << "a second cancel of a live transfer must be ok";
        ASSERT_TRUE(progress_until(
            {client_.ctx.get(), server_.ctx.get()}, [&] { return o.done(); }, 20s));
        na::test::progress_for({client_.ctx.get(), server_.ctx.get()}, 50ms);
        EXPECT_EQ(o.calls, 1) << "completed more than once";
        EXPECT_TRUE(o.code == Errc::canceled || o.code == Errc::ok) << errc_name(o.code);
        if (o.code == Errc::canceled) {
            EXPECT_NE(o.message.find("canceled"), std::string::npos) << o.message;
        }
        seen.insert(o.code);
        EXPECT_EQ(client_.bulk->cancel(*id).code(), Errc::not_found);
    }
    // Handles still work afterwards. A canceled push leaves the target's bytes undefined, and on
    // transports that serve put/get in the target's progress (tcp, ucx+tcp) the pieces already
    // sent may still land after the callback: a pull from the same context, served after them
    // on the same stream, is the barrier before the target's memory is reused.
    ASSERT_EQ(run(Direction::pull, rh, 0, lh, 0, lr.size()).code, Errc::ok);
    rr.fill(77);
    Outcome o = run(Direction::pull, rh, 0, lh, 0, lr.size());
    ASSERT_EQ(o.code, Errc::ok) << o.message;
    EXPECT_FALSE(pattern_mismatch(lr.flat(), 77));
    EXPECT_EQ(client_.bulk->cancel(TransferId{}).code(), Errc::invalid_argument);
}

TEST_P(Bulk, DestroyingTheContextCancelsAndDrainsItsTransfers) {
    // Transfers still in flight when their bulk::Context goes: each completes once (canceled,
    // or ok if it won the race) before the destructor returns, and nothing is left behind.
    std::vector<std::size_t> sizes(64, 64 * 1024);
    Region rr(sizes), lr{4 * 1024 * 1024};
    rr.fill(5);
    Handle rh = to_client(make(server_, rr, Access::read_write));
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(rh && lh);
    Outcome o[3];
    for (auto& x : o) {
        auto id =
            client_.bulk->transfer(Direction::pull, rh.owner(), rh, 0, lh, 0, lr.size(), record(x));
        ASSERT_TRUE(id) << id.error().describe();
    }
    EXPECT_EQ(client_.bulk->in_flight(), 3u);
    // The server serves gets on tcp-like transports: keep it progressing meanwhile.
    std::atomic<bool> stop{false};
    std::thread server([&] {
        while (!stop.load()) {
            (void)server_.ctx->progress(1ms);
            server_.ctx->trigger();
        }
    });
    auto t0 = Clock::now();
    client_.bulk.reset();
    auto took = Clock::now() - t0;
    stop = true;
    server.join();
    for (auto& x : o) {
        EXPECT_EQ(x.calls, 1) << "a transfer did not complete exactly once";
        EXPECT_TRUE(x.code == Errc::canceled || x.code == Errc::ok) << errc_name(x.code);
    }
    EXPECT_LT(took, 5s) << "the destructor waited long for canceled transfers";
    // A new context on the same na context works.
    client_.bulk = std::make_unique<bulk::Context>(*client_.ctx);
    rr.fill(6);
    Outcome again = run(Direction::pull, rh, 0, lh, 0, lr.size());
    EXPECT_EQ(again.code, Errc::ok) << again.message;
    EXPECT_FALSE(pattern_mismatch(lr.flat(), 6));
}

TEST_P(Bulk, BackPressureRetriesAreTimersOfTheContext) {
    // max_ops 1: one na operation at a time for the whole transport. Occupy it with a receive,
    // so every piece is refused with again until the receive is canceled. The retries are
    // timers of the transfer's own na context (post_at): no thread of bulk's runs them.
    Side tight;
    na::Options o;
    o.max_ops = 1;
    ASSERT_TRUE(open_side(tight, o));
    auto sa = tight.t->addr_lookup(server_.t->addr_to_string(server_.t->addr_self()));
    ASSERT_TRUE(sa);
    Region rr{3000, 1, 999, 4096}, lr{1000, 7096};
    rr.fill(31);
    Handle sh = make(server_, rr, Access::read_write);
    std::vector<std::byte> enc;
    ASSERT_TRUE(sh.encode(enc));
    proc::Decoder d(enc, {tight.t.get(), &*sa});
    auto rh = Handle::decode(d);
    ASSERT_TRUE(rh) << rh.error().describe();
    auto lh = Handle::create(*tight.t, lr.segs, Access::read_write);
    ASSERT_TRUE(lh);

    na::MsgBuffer rb = na::test::alloc_buf(*tight.t, 64);
    na::test::Recorder rec;
    auto rid = tight.t->post_recv_unexpected(*tight.ctx, na::test::record(rec), rb);
    ASSERT_TRUE(rid) << rid.error().describe();
    Outcome out;
    auto id =
        tight.bulk->transfer(Direction::pull, rh->owner(), *rh, 0, *lh, 0, rr.size(), record(out));
    ASSERT_TRUE(id) << id.error().describe();
    na::test::progress_for({tight.ctx.get(), server_.ctx.get()}, 30ms);
    EXPECT_FALSE(out.done()) << "completed while no operation could be posted: "
                             << errc_name(out.code) << " " << out.message;
    EXPECT_EQ(tight.ctx->timers_pending(), 1u) << "the next retry is not a timer of the context";
    EXPECT_EQ(tight.bulk->in_flight(), 1u);
    ASSERT_TRUE(tight.t->cancel(*rid));
    ASSERT_TRUE(progress_until(
        {tight.ctx.get(), server_.ctx.get()}, [&] { return out.done() && rec.done(); }, 20s));
    EXPECT_EQ(out.calls, 1);
    EXPECT_EQ(out.code, Errc::ok) << out.message;
    EXPECT_FALSE(pattern_mismatch(lr.flat(), 31));
    // Without the receive in the way, pieces go one at a time (again after each post).
    lr.zero();
    Outcome out2;
    id = tight.bulk->transfer(Direction::pull, rh->owner(), *rh, 5, *lh, 0, rr.size() - 5,
                              record(out2));
    ASSERT_TRUE(id);
    ASSERT_TRUE(progress_until(
        {tight.ctx.get(), server_.ctx.get()}, [&] { return out2.done(); }, 20s));
    EXPECT_EQ(out2.code, Errc::ok) << out2.message;
    auto got = lr.flat();
    EXPECT_FALSE(pattern_mismatch(std::span(got).first(rr.size() - 5), 31, 5));
    sa->reset();
    rh = Handle();
    lh = Handle();
    rb = na::MsgBuffer();
    tight.close();
}

TEST_P(Bulk, PieceErrorCompletesOnceAfterDrain) {
    if (GetParam().label != "inproc") GTEST_SKIP() << "fault injection is inproc's";
    Region rr{100, 100, 100, 100}, lr{400};
    Handle rh = to_client(make(server_, rr, Access::read_write));
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(rh && lh);
    // The first of three pieces fails; the other two still run, then one completion with the
    // error, naming where the piece was.
    ASSERT_TRUE(na::inproc::fail_next_ops(*client_.t, Errc::disconnected, 1));
    Outcome o = run(Direction::pull, rh, 150, lh, 0, 250);
    EXPECT_EQ(o.calls, 1);
    EXPECT_EQ(o.code, Errc::disconnected);
    EXPECT_NE(o.message.find("remote offset 150, segment 1"), std::string::npos) << o.message;
    // Fail all four: still one completion, with the first error.
    ASSERT_TRUE(na::inproc::fail_next_ops(*client_.t, Errc::access_denied, 4));
    o = run(Direction::push, rh, 0, lh, 0, 400);
    EXPECT_EQ(o.calls, 1);
    EXPECT_EQ(o.code, Errc::access_denied);
    EXPECT_NE(o.message.find("transfer offset 0"), std::string::npos) << o.message;
    // And the handles work afterwards.
    rr.fill(5);
    o = run(Direction::pull, rh, 0, lh, 0, 400);
    EXPECT_EQ(o.code, Errc::ok) << o.message;
    EXPECT_FALSE(pattern_mismatch(lr.flat(), 5));
}

// --- encoding ------------------------------------------------------------------------------------

TEST_P(Bulk, EncodeDecodeRoundTrip) {
    Region rr{1000, 1, 70000};
    for (Access a : {Access::read_only, Access::write_only, Access::read_write}) {
        for (bool owner : {false, true}) {
            Handle sh = make(server_, rr, a, owner);
            ASSERT_TRUE(sh);
            EXPECT_TRUE(sh.local());
            EXPECT_EQ(sh.size(), 71001u);
            EXPECT_EQ(sh.segment_count(), 3u);
            EXPECT_EQ(sh.transport(), server_.t.get());
            // Through the proc customisation point, after other bytes, with bytes following.
            std::vector<std::byte> buf;
            proc::Encoder e(buf);
            e.write<uint32_t>(0xabcdef01);
            serialize(e, sh);
            e.write<uint16_t>(0x5aa5);
            ASSERT_TRUE(e.ok()) << e.error().describe();
            proc::Decoder d(buf, {client_.t.get(), &server_addr_});
            EXPECT_EQ(d.read<uint32_t>(), 0xabcdef01u);
            Handle rh;
            serialize(d, rh);
            ASSERT_TRUE(d.ok()) << d.error().describe();
            EXPECT_EQ(d.read<uint16_t>(), 0x5aa5);
            EXPECT_EQ(d.remaining(), 0u);
            ASSERT_TRUE(rh);
            EXPECT_FALSE(rh.local());
            EXPECT_FALSE(rh.is_inline());
            EXPECT_EQ(rh.size(), sh.size());
            EXPECT_EQ(rh.access(), a);
            EXPECT_EQ(rh.segment_count(), 3u);
            EXPECT_EQ(rh.transport(), client_.t.get());
            EXPECT_TRUE(rh.owner() == server_addr_);
            // Copies share the registration; the handle outlives the original copy.
            Handle copy = rh;
            EXPECT_EQ(copy.impl(), rh.impl());
            // Re-encoding the decoded handle gives an equivalent handle.
            std::vector<std::byte> enc2;
            ASSERT_TRUE(rh.encode(enc2));
            proc::Decoder d2(enc2, {client_.t.get(), nullptr});
            auto rh2 = Handle::decode(d2);
            ASSERT_TRUE(rh2) << rh2.error().describe();
            EXPECT_EQ(rh2->size(), rh.size());
            EXPECT_EQ(rh2->access(), a);
            EXPECT_TRUE(rh2->owner() == server_addr_);
        }
    }
    // A null handle encodes as its one byte.
    std::vector<std::byte> out{std::byte{1}};
    EXPECT_TRUE(Handle().encode(out));
    EXPECT_EQ(out.size(), 2u);
}

// Handles inside arguments encode in place: in a send buffer's room when it has space (the
// same bytes as the vector encoding, nothing spilled), moving to the spill vector when it
// does not, and leaving nothing half-written when the handle cannot be encoded.
TEST_P(Bulk, HandlesEncodeInPlaceInARoom) {
    Region rr{1000, 24};
    Handle h = make(server_, rr, Access::read_write, true);
    Region small{100};
    small.fill(9);
    Handle inl = make(server_, small, Access::read_only);
    for (const Handle* hp : {&h, &inl}) {
        std::vector<std::byte> ref;
        ASSERT_TRUE(hp->encode(ref));
        uint64_t before = 0x0123456789abcdefULL;
        std::vector<std::byte> want;
        ASSERT_TRUE(proc::encode(want, before, *hp, uint32_t(7)));
        ASSERT_EQ(want.size(), 8 + ref.size() + 4);
        // A room with space: written there.
        std::vector<std::byte> room(want.size() + 64), spill;
        auto r = proc::encode_into(room, spill, before, *hp, uint32_t(7));
        ASSERT_TRUE(r) << r.error().describe();
        EXPECT_EQ(r->data(), room.data()) << "the handle spilled out of a room with space";
        EXPECT_TRUE(std::equal(r->begin(), r->end(), want.begin(), want.end()));
        // A room too small for the handle: everything moves to the spill vector, intact.
        std::vector<std::byte> tiny(12);
        r = proc::encode_into(tiny, spill, before, *hp, uint32_t(7));
        ASSERT_TRUE(r) << r.error().describe();
        EXPECT_EQ(r->data(), spill.data());
        EXPECT_TRUE(std::equal(r->begin(), r->end(), want.begin(), want.end()));
    }
    // A null handle encodes in place as its one byte.
    std::vector<std::byte> room(256), spill;
    proc::Encoder e(room, spill);
    e.write<uint32_t>(5);
    EXPECT_TRUE(Handle().encode(e));
    EXPECT_TRUE(e.in_place());
    EXPECT_EQ(e.in_place_size(), 5u);
}

/// The bytes docs/protocol.md ("bulk handle") describes, field by field.
TEST_P(Bulk, EncodingLayout) {
    auto u32_at = [](const std::vector<std::byte>& b, std::size_t at) {
        uint32_t v;
        std::memcpy(&v, b.data() + at, 4);
        return v;
    };
    auto u64_at = [](const std::vector<std::byte>& b, std::size_t at) {
        uint64_t v;
        std::memcpy(&v, b.data() + at, 8);
        return v;
    };
    // Inline: 100 read_only bytes in one segment, no owner: 122 bytes.
    Region small{100};
    small.fill(6);
    std::vector<std::byte> enc;
    ASSERT_TRUE(make(server_, small, Access::read_only).encode(enc));
    ASSERT_EQ(enc.size(), 122u);
    EXPECT_EQ(uint8_t(enc[0]), 0x11);
    EXPECT_EQ(uint8_t(enc[1]), 1);
    EXPECT_EQ(u32_at(enc, 2), 1u);
    EXPECT_EQ(u64_at(enc, 6), 100u);
    EXPECT_EQ(u64_at(enc, 14), 100u);
    EXPECT_FALSE(pattern_mismatch(std::span(enc).subspan(22), 6));
    // Memory handles: two read_write segments, owner embedded.
    Region rr{1000, 24};
    Handle h = make(server_, rr, Access::read_write, true);
    enc.clear();
    ASSERT_TRUE(h.encode(enc));
    na::Transport& t = *server_.t;
    EXPECT_EQ(uint8_t(enc[0]), 0x12);
    EXPECT_EQ(uint8_t(enc[1]), 3);
    EXPECT_EQ(u32_at(enc, 2), 2u);
    EXPECT_EQ(u64_at(enc, 6), 1024u);
    std::size_t at = 14;
    for (std::size_t len : {std::size_t(1000), std::size_t(24)}) {
        ASSERT_LE(at + 12, enc.size());
        EXPECT_EQ(u64_at(enc, at), len);
        uint32_t m = u32_at(enc, at + 8);
        ASSERT_LE(at + 12 + m, enc.size());
        auto mh = t.mem_deserialize(std::span(enc).subspan(at + 12, m));
        ASSERT_TRUE(mh) << mh.error().describe();
        EXPECT_EQ((*mh)->length(), len);
        EXPECT_EQ((*mh)->access(), Access::read_write);
        at += 12 + m;
    }
    uint32_t alen = u32_at(enc, at);
    ASSERT_EQ(at + 4 + alen, enc.size());
    auto owner = t.addr_deserialize(std::span(enc).subspan(at + 4, alen));
    ASSERT_TRUE(owner) << owner.error().describe();
    EXPECT_TRUE(*owner == t.addr_self());
}

// A handle whose owner does not listen (Options::listen off): embed_owner is refused; the
// encoding says so (flag 0x08), its receiver takes the sender for the owner, and relayed
// further it names no owner (0x08 | 0x02, no address), and a transfer over the network with it
// fails with unreachable whatever peer is named.
TEST_P(Bulk, OwnerThatDoesNotListen) {
    Side deaf;
    ASSERT_TRUE(open_side(deaf, na::Options{.listen = false}));
    EXPECT_FALSE(deaf.t->listens());
    EXPECT_TRUE(server_.t->listens());
    Region mem{1000}, small{50}, into{1000};
    auto bound = Handle::create(*deaf.t, mem.segs, Access::read_write, true);
    ASSERT_FALSE(bound);
    EXPECT_EQ(bound.code(), Errc::invalid_argument);
    EXPECT_NE(bound.error().message().find("Options::listen"), std::string::npos)
        << bound.error().describe();
    for (bool inl : {false, true}) {
        Handle h = make(deaf, inl ? small : mem, inl ? Access::read_only : Access::read_write);
        std::vector<std::byte> enc;
        ASSERT_TRUE(h.encode(enc));
        EXPECT_EQ(uint8_t(enc[0]), inl ? 0x19 : 0x18);
        // Received from its owner (here: as if the server were it): the sender is the owner.
        Handle got = to_client(h);
        EXPECT_TRUE(got.owner() == server_addr_);
        EXPECT_FALSE(got.owner_unreachable());
        // Relayed by the client: flagged, no address.
        std::vector<std::byte> relay;
        ASSERT_TRUE(got.encode(relay));
        EXPECT_EQ(uint8_t(relay[0]), inl ? 0x1b : 0x1a);
        EXPECT_EQ(relay.size(), enc.size()) << "a relayed handle carries no owner address";
        proc::Decoder d(relay, {server_.t.get(), nullptr});
        auto third = Handle::decode(d);
        ASSERT_TRUE(third) << third.error().describe();
        EXPECT_EQ(d.remaining(), 0u);
        EXPECT_FALSE(third->owner().valid());
        EXPECT_TRUE(third->owner_unreachable());
        std::vector<std::byte> again;
        ASSERT_TRUE(third->encode(again));
        EXPECT_EQ(again, relay) << "relayed again, it stays ownerless";
        Handle lh = make(server_, into, Access::read_write);
        for (const na::Addr& peer : {na::Addr(), server_.t->addr_self()}) {
            Outcome o;
            auto id =
                server_.bulk->transfer(Direction::pull, peer, *third, 0, lh, 0, 40, record(o));
            if (inl) {
                // Inline bytes need no network: the relay still reads them.
                ASSERT_TRUE(id) << id.error().describe();
                ASSERT_TRUE(progress_until(
                    {server_.ctx.get()}, [&] { return o.done(); }, 5s));
                EXPECT_EQ(o.code, Errc::ok) << o.message;
                continue;
            }
            ASSERT_FALSE(id);
            EXPECT_EQ(id.code(), Errc::unreachable);
            EXPECT_NE(id.error().message().find("owner does not listen"), std::string::npos)
                << id.error().describe();
        }
    }
    keep_.clear();  // deaf's registrations go before its transport
    deaf.close();
}

TEST_P(Bulk, DecodeHostileEncodings) {
    Region rr{1000, 1, 7000}, small{50};
    Handle sh = make(server_, rr, Access::read_write, true);
    Handle si = make(server_, small, Access::read_only);
    ASSERT_TRUE(sh && si);
    auto decode = [&](std::span<const std::byte> in, bool with_transport = true) {
        proc::Decoder d(in, {with_transport ? client_.t.get() : nullptr, nullptr});
        auto r = Handle::decode(d);
        EXPECT_EQ(bool(r), d.ok()) << "the decoder and the result disagree";
        return r;
    };
    for (const Handle* h : {&sh, &si}) {
        std::vector<std::byte> enc;
        ASSERT_TRUE(h->encode(enc));
        ASSERT_TRUE(decode(enc));
        // Every truncation fails cleanly with protocol_error.
        for (std::size_t n = 0; n < enc.size(); ++n) {
            auto r = decode(std::span(enc).first(n));
            ASSERT_FALSE(r) << "a " << n << "-byte prefix of " << enc.size() << " decoded";
            EXPECT_EQ(r.code(), Errc::protocol_error) << r.error().describe();
        }
        // No transport in the DecodeContext.
        EXPECT_EQ(decode(enc, false).code(), Errc::invalid_argument);
        // Every single-byte corruption: fails cleanly or decodes to something that re-encodes.
        for (std::size_t i = 0; i < enc.size(); ++i) {
            for (uint8_t x : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xff)}) {
                auto bad = enc;
                bad[i] ^= std::byte{x};
                auto r = decode(bad);
                if (r) {
                    std::vector<std::byte> again;
                    EXPECT_TRUE(r->encode(again)) << "byte " << i;
                }
            }
        }
    }
    std::vector<std::byte> enc;
    ASSERT_TRUE(sh.encode(enc));
    auto patched = [&](std::size_t at, auto value) {
        auto b = enc;
        std::memcpy(b.data() + at, &value, sizeof value);
        return b;
    };
    auto expect_bad = [&](const std::vector<std::byte>& b, const char* says) {
        auto r = decode(b);
        ASSERT_FALSE(r) << says;
        EXPECT_EQ(r.code(), Errc::protocol_error);
        EXPECT_NE(r.error().message().find(says), std::string::npos) << r.error().message();
    };
    // Layout: [0] version/flags, [1] access, [2..6) count, [6..14) total, [14..22) seg 0 length.
    expect_bad(patched(0, uint8_t(0x20 | (uint8_t(enc[0]) & 0x0f))), "version");
    expect_bad(patched(0, uint8_t(0x1c)), "the null flag with others");
    expect_bad(patched(1, uint8_t(0)), "invalid access");
    expect_bad(patched(1, uint8_t(7)), "invalid access");
    expect_bad(patched(2, uint32_t(0xffffffff)), "exceeds the bytes that remain");
    expect_bad(patched(2, uint32_t(1u << 28)), "exceeds the bytes that remain");
    expect_bad(patched(2, uint32_t(0)), "zero segments but a total of");
    expect_bad(patched(6, uint64_t(8000)), "add up to");
    expect_bad(patched(6, uint64_t(~0ull)), "");
    expect_bad(patched(14, uint64_t(0)), "length 0");
    expect_bad(patched(14, uint64_t(999)), "memory handle covers");
    expect_bad(patched(14, uint64_t(1) << 62), "more than the total");
    expect_bad(patched(22, uint32_t(0)), "empty memory handle");
    expect_bad(patched(22, uint32_t(0xfffffff0)), "truncated");
    // An inline encoding claiming more than kInlineMax, or write access.
    std::vector<std::byte> ienc;
    ASSERT_TRUE(si.encode(ienc));
    ASSERT_EQ(uint8_t(ienc[0]) & 1, 1);
    auto ipatch = [&](std::size_t at, auto value) {
        auto b = ienc;
        std::memcpy(b.data() + at, &value, sizeof value);
        return b;
    };
    expect_bad(ipatch(1, uint8_t(3)), "read_only");
    expect_bad(ipatch(6, uint64_t(kInlineMax + 1)), "exceeds the maximum");
    expect_bad(ipatch(14, uint64_t(51)), "more than the total");
    // Random garbage never crashes.
    std::mt19937 rng(42);
    for (int i = 0; i < 2000; ++i) {
        std::vector<std::byte> g(rng() % 64);
        for (auto& b : g)
            b = std::byte(rng());
        if (!g.empty()) g[0] = std::byte(0x10 | (rng() & 3));
        (void)decode(g);
    }
}

// --- two processes -------------------------------------------------------------------------------

/// Send an empty request with `tag` to the peer, wait for the expected reply (into `reply`).
Errc request(Side& s, const na::Addr& peer, na::Tag tag, std::vector<std::byte>* reply) {
    na::Transport& t = *s.t;
    na::MsgBuffer sb = na::test::alloc_buf(t, 1);
    na::MsgBuffer rb = na::test::alloc_buf(t, t.max_expected_size());
    if (!sb.valid() || !rb.valid()) return Errc::no_memory;
    na::test::Recorder rr, sr;
    auto rid = t.post_recv_expected(*s.ctx, na::test::record(rr), rb, peer, tag);
    if (!rid) return rid.code();
    auto sid = t.post_send_unexpected(*s.ctx, na::test::record(sr), sb, 0, peer, 0, tag);
    if (!sid) {
        (void)t.cancel(*rid);
        (void)progress_until(
            {s.ctx.get()}, [&] { return rr.done(); }, 2s);
        return sid.code();
    }
    if (!progress_until(
            {s.ctx.get()}, [&] { return rr.done() && sr.done(); }, 10s)) {
        (void)t.cancel(*rid);
        (void)t.cancel(*sid);
        (void)progress_until(
            {s.ctx.get()}, [&] { return rr.done() && sr.done(); }, 2s);
        return Errc::timeout;
    }
    if (sr.last.status != Errc::ok) return sr.last.status;
    if (rr.last.status == Errc::ok && reply) reply->assign(rb.data(), rb.data() + rr.last.size);
    return rr.last.status;
}

TEST_P(Bulk, TwoProcessesPullPush) {
    if (!GetParam().multi_process) GTEST_SKIP() << "inproc endpoints live in one process";
    std::string err;
    auto peer = PeerProcess::spawn(TALARIA_BULK_PEER_PATH, GetParam().address, &err);
    ASSERT_TRUE(peer) << err;
    auto pa = client_.t->addr_lookup(peer->address);
    ASSERT_TRUE(pa) << pa.error().describe();
    std::vector<std::size_t> sizes(std::begin(kPeerSegments), std::end(kPeerSegments));
    std::size_t total = 0;
    for (auto n : sizes)
        total += n;

    auto fetch = [&](na::Tag tag, const na::Addr* source) -> Handle {
        std::vector<std::byte> enc;
        Errc st = request(client_, *pa, tag, &enc);
        EXPECT_EQ(st, Errc::ok) << errc_name(st);
        proc::Decoder d(enc, {client_.t.get(), source});
        auto h = Handle::decode(d);
        EXPECT_TRUE(h) << h.error().describe();
        return h ? *h : Handle();
    };
    Handle rh = fetch(kGetHandle, &*pa);
    ASSERT_TRUE(rh);
    EXPECT_EQ(rh.size(), total);
    EXPECT_EQ(rh.segment_count(), sizes.size());
    EXPECT_TRUE(rh.owner() == *pa);

    Region lr{33333, 7, 80000};
    Handle lh = make(client_, lr, Access::read_write);
    ASSERT_TRUE(lh);
    auto run1 = [&](Direction dir, const Handle& remote, std::size_t roff, std::size_t loff,
                    std::size_t len) {
        Outcome o;
        auto id =
            client_.bulk->transfer(dir, remote.owner(), remote, roff, lh, loff, len, record(o));
        if (!id) return id.code();
        EXPECT_TRUE(progress_until(
            {client_.ctx.get()}, [&] { return o.done(); }, 20s));
        EXPECT_EQ(o.calls, 1);
        EXPECT_TRUE(o.code == Errc::ok) << o.message;
        return o.code;
    };
    // Pull the whole region, and pieces at odd offsets across its segments.
    ASSERT_EQ(run1(Direction::pull, rh, 0, 0, total), Errc::ok);
    auto got = lr.flat();
    EXPECT_FALSE(pattern_mismatch(std::span(got).first(total), kRegionSeed));
    for (auto [roff, loff, len] :
         {std::tuple<std::size_t, std::size_t, std::size_t>{70000, 3, 4097},
          {1, 13339, 100000},
          {74096, 0, 30001}}) {
        lr.zero();
        ASSERT_EQ(run1(Direction::pull, rh, roff, loff, len), Errc::ok);
        got = lr.flat();
        EXPECT_FALSE(pattern_mismatch(std::span(got).subspan(loff, len), kRegionSeed, roff))
            << roff << "/" << loff << "/" << len;
    }
    // Push a new pattern over a range crossing every peer segment; the peer's checksum agrees.
    std::vector<std::byte> expect(total);
    fill_pattern(expect, kRegionSeed);
    lr.fill(99);
    got = lr.flat();
    const std::size_t roff = 69990, loff = 33330, len = 30000;
    ASSERT_EQ(run1(Direction::push, rh, roff, loff, len), Errc::ok);
    std::memcpy(expect.data() + roff, got.data() + loff, len);
    std::vector<std::byte> sum;
    ASSERT_EQ(request(client_, *pa, kChecksum, &sum), Errc::ok);
    ASSERT_EQ(sum.size(), 8u);
    uint64_t h;
    std::memcpy(&h, sum.data(), 8);
    EXPECT_EQ(h, na::test::fnv1a(expect)) << "the peer's region is not what was pushed";
    // Out of range at the handle: refused before anything moves.
    EXPECT_EQ(run1(Direction::pull, rh, total - 10, 0, 11), Errc::out_of_range);

    // The inline handle: no network operation, bytes right.
    Handle ih = fetch(kGetInline, &*pa);
    ASSERT_TRUE(ih);
    EXPECT_TRUE(ih.is_inline());
    lr.zero();
    ASSERT_EQ(run1(Direction::pull, ih, 0, 11, kInlineSize), Errc::ok);
    got = lr.flat();
    EXPECT_FALSE(pattern_mismatch(std::span(got).subspan(11, kInlineSize), kInlineSeed));

    // The handle with its owner embedded, decoded without a source.
    Handle oh = fetch(kGetOwned, nullptr);
    ASSERT_TRUE(oh);
    EXPECT_TRUE(oh.owner() == *pa) << "the embedded owner is not the peer";
    lr.zero();
    ASSERT_EQ(run1(Direction::pull, oh, 0, 0, total), Errc::ok);
    got = lr.flat();
    EXPECT_FALSE(pattern_mismatch(std::span(got).first(roff), kRegionSeed));
    EXPECT_TRUE(std::equal(expect.begin(), expect.end(), got.begin()));

    rh = Handle();
    ih = Handle();
    oh = Handle();
    EXPECT_EQ(request(client_, *pa, kQuit, nullptr), Errc::ok);
    EXPECT_EQ(peer->wait_exit(10s), std::optional<int>(0)) << "the peer did not exit cleanly";
}

// --- threads -------------------------------------------------------------------------------------

TEST_P(Bulk, ThreadedTransfers) {
    constexpr int kThreads = 4;
    constexpr int kRounds = 40;
    // The server region: one slice per thread, in segments; each thread pulls its slice, pushes
    // it back changed, and checks. The server's context is progressed by its own thread.
    std::vector<std::size_t> sizes;
    for (int i = 0; i < kThreads * 3; ++i)
        sizes.push_back(std::size_t(3000 + 997 * i));
    Region rr(sizes);
    rr.fill(3);
    Handle rh = to_client(make(server_, rr, Access::read_write));
    ASSERT_TRUE(rh);
    std::vector<std::size_t> slice_start{0};
    for (int i = 0; i < kThreads; ++i)
        slice_start.push_back(slice_start.back() + sizes[3 * i] + sizes[3 * i + 1] +
                              sizes[3 * i + 2]);

    std::atomic<bool> stop{false};
    std::thread server([&] {
        while (!stop.load()) {
            (void)server_.ctx->progress(5ms);
            server_.ctx->trigger();
        }
    });
    // Contexts 1.. of the client, one per thread, created here (context_create is not a data
    // path call).
    std::vector<std::unique_ptr<na::Context>> ctxs;
    std::vector<std::unique_ptr<bulk::Context>> bctxs;  // the transfers of each
    for (int i = 0; i < kThreads; ++i) {
        auto c = client_.t->context_create(uint8_t(1 + i));
        ASSERT_TRUE(c) << c.error().describe();
        ctxs.push_back(std::move(*c));
        bctxs.push_back(std::make_unique<bulk::Context>(*ctxs.back()));
    }
    std::atomic<int> failures{0};
    std::mutex ids_mu;
    std::vector<std::pair<bulk::Context*, TransferId>> live;  // for the canceling thread
    std::atomic<int> cancels_ok{0};
    auto worker = [&](int w) {
        na::Context& ctx = *ctxs[w];
        bulk::Context& bctx = *bctxs[w];
        std::size_t base = slice_start[w], len = slice_start[w + 1] - base;
        Region lr{len / 3, len - len / 3};
        auto lh = Handle::create(*client_.t, lr.segs, Access::read_write);
        if (!lh) {
            ++failures;
            return;
        }
        auto fail = [&](const std::string& why) {
            ADD_FAILURE() << "thread " << w << ": " << why;
            ++failures;
        };
        for (int round = 0; round < kRounds && failures == 0; ++round) {
            Outcome o;
            auto id = bctx.transfer(Direction::pull, rh.owner(), rh, base, *lh, 0, len, record(o));
            if (!id) return fail(id.error().describe());
            if (!progress_until(
                    {&ctx}, [&] { return o.done(); }, 20s))
                return fail("pull hung");
            if (o.code != Errc::ok) return fail("pull: " + o.message);
            if (pattern_mismatch(lr.flat(), uint32_t(3 + round), base))
                return fail("pulled bytes differ in round " + std::to_string(round));
            // The next round expects pattern 4+round at the server slice: push it. Then a
            // throw-away pull that another thread may cancel.
            Outcome p;
            std::size_t moved = 0;
            for (auto& b : lr.bufs) {
                // Refill with the logical offsets of the server slice.
                fill_pattern(b, uint32_t(4 + round), base + moved);
                moved += b.size();
            }
            id = bctx.transfer(Direction::push, rh.owner(), rh, base, *lh, 0, len, record(p));
            if (!id) return fail(id.error().describe());
            if (!progress_until(
                    {&ctx}, [&] { return p.done(); }, 20s))
                return fail("push hung");
            if (p.code != Errc::ok) return fail("push: " + p.message);
            Outcome q;
            Region scratch{len};
            auto sh = Handle::create(*client_.t, scratch.segs, Access::read_write);
            if (!sh) return fail(sh.error().describe());
            id = bctx.transfer(Direction::pull, rh.owner(), rh, base, *sh, 0, len, record(q));
            if (!id) return fail(id.error().describe());
            {
                std::lock_guard g(ids_mu);
                live.emplace_back(&bctx, *id);
            }
            if (!progress_until(
                    {&ctx}, [&] { return q.done(); }, 20s))
                return fail("pull2 hung");
            if (q.calls != 1) return fail("completed " + std::to_string(q.calls) + " times");
            if (q.code != Errc::ok && q.code != Errc::canceled) return fail("pull2: " + q.message);
        }
    };
    std::thread canceler([&] {
        while (!stop.load()) {
            std::vector<std::pair<bulk::Context*, TransferId>> ids;
            {
                std::lock_guard g(ids_mu);
                ids.swap(live);
            }
            for (auto [bc, id] : ids) {
                auto r = bc->cancel(id);
                if (r)
                    ++cancels_ok;
                else if (r.code() != Errc::not_found)
                    ++failures;
            }
            std::this_thread::sleep_for(100us);
        }
    });
    std::vector<std::thread> threads;
    for (int w = 0; w < kThreads; ++w)
        threads.emplace_back(worker, w);
    for (auto& t : threads)
        t.join();
    stop = true;
    canceler.join();
    server.join();
    EXPECT_EQ(failures.load(), 0);
    // The server's bytes are the last pushed pattern, slice by slice.
    auto got = rr.flat();
    for (int w = 0; w < kThreads; ++w)
        EXPECT_FALSE(pattern_mismatch(
            std::span(got).subspan(slice_start[w], slice_start[w + 1] - slice_start[w]),
            uint32_t(4 + kRounds - 1), slice_start[w]))
            << "slice " << w;
    bctxs.clear();
    ctxs.clear();
}

std::string kind_name(const ::testing::TestParamInfo<TransportKind>& info) {
    return info.param.label;
}

INSTANTIATE_TEST_SUITE_P(bulk, Bulk, ::testing::ValuesIn(na::test::transport_kinds()), kind_name);

}  // namespace
}  // namespace talaria::bulk::test
