// The conformance suite's peer process: `na_peer <address>` opens a transport, registers a
// 64 KiB read-write region filled with pattern 7, prints two lines on stdout
//     <its address string>
//     <its serialized memory handle, hex>
// and then serves the requests of harness.hpp (echo, checksum, quit) until asked to quit, its
// stdin closes (the test process died) or 60 seconds pass. Exit status 0 only after a quit.
#include <cstdio>
#include <cstring>
#include <list>
#include <vector>

#include "harness.hpp"
#include "peer_process.hpp"

using namespace talaria;
using namespace talaria::na;
using namespace talaria::na::test;

namespace {

constexpr std::size_t kRegionSize = 64 * 1024;
constexpr int kRecvs = 8;

struct Peer {
    Transport& t;
    Context& ctx;
    std::vector<std::byte>& region;
    std::vector<MsgBuffer> rbufs;
    std::vector<OpId> rids;
    std::list<MsgBuffer> replies;  // in flight until their send completes
    struct Delayed {
        Addr to;
        std::vector<std::byte> data;
        TimePoint due;
    };
    std::vector<Delayed> delayed;
    bool quit = false;
    bool quit_acked = false;
    int errors = 0;

    void post_recv(int i) {
        auto r = t.post_recv_unexpected(
            ctx, [this, i](const Completion& c) { on_recv(i, c); }, rbufs[i]);
        if (!r) {
            std::fprintf(stderr, "na_peer: post_recv_unexpected: %s\n",
                         r.error().describe().c_str());
            ++errors;
            return;
        }
        rids[i] = *r;
    }

    void reply(const Addr& to, Tag tag, std::span<const std::byte> data) {
        auto b = t.msg_buf_alloc(std::max<std::size_t>(data.size(), 1));
        if (!b) {
            std::fprintf(stderr, "na_peer: msg_buf_alloc: %s\n", b.error().describe().c_str());
            ++errors;
            return;
        }
        if (!data.empty()) std::memcpy(b->data(), data.data(), data.size());
        replies.push_back(std::move(*b));
        auto it = std::prev(replies.end());
        bool is_quit = tag == kPeerQuit;
        auto r = t.post_send_expected(
            ctx,
            [this, it, is_quit](const Completion& c) {
                if (c.status != Errc::ok)
                    std::fprintf(stderr, "na_peer: reply failed: %s\n",
                                 std::string(errc_name(c.status)).c_str());
                replies.erase(it);
                if (is_quit) quit_acked = true;
            },
            *it, data.size(), to, 0, tag);
        if (!r) {
            std::fprintf(stderr, "na_peer: post_send_expected: %s\n", r.error().describe().c_str());
            replies.erase(it);
            ++errors;
            if (is_quit) quit_acked = true;
        }
    }

    void on_recv(int i, const Completion& c) {
        rids[i] = {};
        if (c.status == Errc::canceled) return;
        if (c.status != Errc::ok) {
            std::fprintf(stderr, "na_peer: receive failed: %s\n",
                         std::string(errc_name(c.status)).c_str());
            if (!quit) post_recv(i);
            return;
        }
        std::span<const std::byte> data(rbufs[i].data(), c.size);
        switch (c.tag) {
            case kPeerEcho:
                reply(c.source, kPeerEcho, data);
                break;
            case kPeerDelayedEcho:
                delayed.push_back({c.source, {data.begin(), data.end()}, Clock::now() + 300ms});
                break;
            case kPeerChecksum: {
                uint64_t h = fnv1a(region);
                std::byte out[8];
                std::memcpy(out, &h, 8);
                reply(c.source, kPeerChecksum, out);
                break;
            }
            case kPeerQuit:
                quit = true;
                reply(c.source, kPeerQuit, {});
                break;
            default:
                std::fprintf(stderr, "na_peer: unknown request tag %u\n", c.tag);
        }
        if (!quit) post_recv(i);
    }
};

}  // namespace

int main(int argc, char** argv) {
    auto address = peer_start("na_peer", argc, argv);
    if (!address) return 2;
    std::vector<std::byte> region(kRegionSize);
    fill_pattern(region, 7);

    auto tr = na::open(*address);
    if (!tr) {
        std::fprintf(stderr, "na_peer: open %s: %s\n", address->c_str(),
                     tr.error().describe().c_str());
        return 1;
    }
    Transport& t = **tr;
    int status = 1;
    {
        auto cr = t.context_create(0);
        if (!cr) {
            std::fprintf(stderr, "na_peer: context_create: %s\n", cr.error().describe().c_str());
            return 1;
        }
        Context& ctx = **cr;
        auto mh = t.mem_register(region.data(), region.size(), Access::read_write);
        if (!mh) {
            std::fprintf(stderr, "na_peer: mem_register: %s\n", mh.error().describe().c_str());
            return 1;
        }
        std::vector<std::byte> mser(t.mem_serialize_size(*mh));
        auto mw = t.mem_serialize(*mh, mser);
        if (!mw) {
            std::fprintf(stderr, "na_peer: mem_serialize: %s\n", mw.error().describe().c_str());
            return 1;
        }
        mser.resize(*mw);

        Peer p{t, ctx, region, {}, {}, {}};
        p.rids.resize(kRecvs);
        for (int i = 0; i < kRecvs; ++i) {
            p.rbufs.push_back(alloc_buf(t, t.max_unexpected_size()));
            if (!p.rbufs.back().valid()) return 1;
        }
        for (int i = 0; i < kRecvs; ++i)
            p.post_recv(i);

        print_line(t.addr_to_string(t.addr_self()));
        print_line(to_hex(mser));

        (void)serve_until_stdin_closed(ctx, "na_peer", [&]() -> std::optional<Duration> {
            if (p.quit_acked) return std::nullopt;
            auto now = Clock::now();
            for (auto it = p.delayed.begin(); it != p.delayed.end();) {
                if (it->due > now) {
                    ++it;
                    continue;
                }
                p.reply(it->to, kPeerDelayedEcho, it->data);
                it = p.delayed.erase(it);
            }
            return p.delayed.empty() ? 50ms : 5ms;
        });
        // Cancel what is still posted and drain before tearing down.
        for (auto& id : p.rids)
            if (id.valid()) (void)t.cancel(id);
        progress_until(
            {&ctx},
            [&] {
                for (auto& id : p.rids)
                    if (id.valid()) return false;
                return p.replies.empty();
            },
            2s);
        p.delayed.clear();
        status = p.quit_acked && p.errors == 0 ? 0 : 1;
    }
    return status;
}
