// The bulk suite's peer process: `bulk_peer <address>` opens a transport, registers a
// multi-segment read_write region (bulk_peer_protocol.hpp) and a 100-byte read_only handle,
// prints its address on one line, and serves the requests of bulk_peer_protocol.hpp until
// asked to quit, its stdin closes (the test died) or 60 seconds pass. Exit status 0 only after
// a quit with no errors.
#include <cstdio>
#include <cstring>
#include <list>
#include <vector>

#include "bulk_peer_protocol.hpp"
#include "harness.hpp"
#include "peer_process.hpp"
#include "talaria/bulk/bulk.hpp"

using namespace talaria;
using namespace talaria::na;
using namespace talaria::na::test;
using namespace talaria::bulk::test;

namespace {

constexpr int kRecvs = 4;

struct Peer {
    Transport& t;
    Context& ctx;
    std::vector<std::vector<std::byte>>& region;
    bulk::Handle handle;
    bulk::Handle owned;
    bulk::Handle small;
    std::vector<MsgBuffer> rbufs;
    std::vector<OpId> rids;
    std::list<MsgBuffer> replies;  // in flight until their send completes
    bool quit = false;
    bool quit_acked = false;
    int errors = 0;

    void post_recv(int i) {
        auto r = t.post_recv_unexpected(
            ctx, [this, i](const Completion& c) { on_recv(i, c); }, rbufs[i]);
        if (!r) {
            std::fprintf(stderr, "bulk_peer: post_recv_unexpected: %s\n",
                         r.error().describe().c_str());
            ++errors;
            return;
        }
        rids[i] = *r;
    }

    void reply(const Addr& to, Tag tag, std::span<const std::byte> data) {
        bool is_quit = tag == kQuit;
        auto b = t.msg_buf_alloc(std::max<std::size_t>(data.size(), 1));
        if (!b || b->size() < data.size()) {
            std::fprintf(stderr, "bulk_peer: no message buffer for %zu bytes\n", data.size());
            ++errors;
            if (is_quit) quit_acked = true;
            return;
        }
        if (!data.empty()) std::memcpy(b->data(), data.data(), data.size());
        replies.push_back(std::move(*b));
        auto it = std::prev(replies.end());
        auto r = t.post_send_expected(
            ctx,
            [this, it, is_quit](const Completion& c) {
                if (c.status != Errc::ok) {
                    std::fprintf(stderr, "bulk_peer: reply failed: %s\n",
                                 std::string(errc_name(c.status)).c_str());
                    ++errors;
                }
                replies.erase(it);
                if (is_quit) quit_acked = true;
            },
            *it, data.size(), to, 0, tag);
        if (!r) {
            std::fprintf(stderr, "bulk_peer: post_send_expected: %s\n",
                         r.error().describe().c_str());
            replies.erase(it);
            ++errors;
            if (is_quit) quit_acked = true;
        }
    }

    void reply_handle(const Addr& to, Tag tag, const bulk::Handle& h) {
        std::vector<std::byte> enc;
        if (auto r = h.encode(enc); !r) {
            std::fprintf(stderr, "bulk_peer: encode: %s\n", r.error().describe().c_str());
            ++errors;
            enc.clear();
        }
        reply(to, tag, enc);
    }

    void on_recv(int i, const Completion& c) {
        rids[i] = {};
        if (c.status == Errc::canceled) return;
        if (c.status != Errc::ok) {
            std::fprintf(stderr, "bulk_peer: receive failed: %s\n",
                         std::string(errc_name(c.status)).c_str());
            if (!quit) post_recv(i);
            return;
        }
        switch (c.tag) {
            case kGetHandle:
                reply_handle(c.source, c.tag, handle);
                break;
            case kGetOwned:
                reply_handle(c.source, c.tag, owned);
                break;
            case kGetInline:
                reply_handle(c.source, c.tag, small);
                break;
            case kChecksum: {
                std::vector<std::byte> all;
                for (auto& seg : region)
                    all.insert(all.end(), seg.begin(), seg.end());
                uint64_t h = fnv1a(all);
                std::byte out[8];
                std::memcpy(out, &h, 8);
                reply(c.source, c.tag, out);
                break;
            }
            case kQuit:
                quit = true;
                reply(c.source, c.tag, {});
                break;
            default:
                std::fprintf(stderr, "bulk_peer: unknown request tag %u\n", c.tag);
                ++errors;
        }
        if (!quit) post_recv(i);
    }
};

int run(Transport& t) {
    auto cr = t.context_create(0);
    if (!cr) {
        std::fprintf(stderr, "bulk_peer: context_create: %s\n", cr.error().describe().c_str());
        return 1;
    }
    Context& ctx = **cr;

    std::vector<std::vector<std::byte>> region;
    std::vector<bulk::Segment> segs;
    std::size_t off = 0;
    for (std::size_t n : kPeerSegments) {
        region.emplace_back(n);
        fill_pattern(region.back(), kRegionSeed, off);
        off += n;
    }
    for (auto& r : region)
        segs.push_back({r.data(), r.size()});
    std::vector<std::byte> small(kInlineSize);
    fill_pattern(small, kInlineSeed);
    bulk::Segment small_seg{small.data(), small.size()};

    auto h = bulk::Handle::create(t, segs, Access::read_write);
    auto ho = bulk::Handle::create(t, segs, Access::read_write, true);
    auto hs = bulk::Handle::create(t, {&small_seg, 1}, Access::read_only);
    if (!h || !ho || !hs) {
        std::fprintf(stderr, "bulk_peer: Handle::create failed\n");
        return 1;
    }

    int status = 1;
    {
        Peer p{t, ctx, region, *h, *ho, *hs, {}, {}, {}};
        p.rids.resize(kRecvs);
        for (int i = 0; i < kRecvs; ++i) {
            p.rbufs.push_back(alloc_buf(t, t.max_unexpected_size()));
            if (!p.rbufs.back().valid()) return 1;
        }
        for (int i = 0; i < kRecvs; ++i)
            p.post_recv(i);

        print_line(t.addr_to_string(t.addr_self()));

        (void)serve_until_stdin_closed(ctx, "bulk_peer", [&]() -> std::optional<Duration> {
            if (p.quit_acked) return std::nullopt;
            return std::chrono::milliseconds(20);
        });
        for (auto& id : p.rids)
            if (id.valid()) (void)t.cancel(id);
        progress_until(
            {&ctx},
            [&] {
                for (auto& id : p.rids)
                    if (id.valid()) return false;
                return p.replies.empty();
            },
            std::chrono::seconds(2));
        status = p.quit_acked && p.errors == 0 ? 0 : 1;
    }
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    auto address = peer_start("bulk_peer", argc, argv);
    if (!address) return 2;
    auto tr = na::open(*address);
    if (!tr) {
        std::fprintf(stderr, "bulk_peer: open %s: %s\n", address->c_str(),
                     tr.error().describe().c_str());
        return 1;
    }
    return run(**tr);  // contexts and handles go before the transport
}
