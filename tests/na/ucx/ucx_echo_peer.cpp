// `ucx_echo_peer <address>`: a busy-polling echo peer for the latency test (na_peer blocks in
// progress between requests, which measures wake-ups, not the data path). Prints its address,
// then answers every unexpected message with an expected one (same tag, same bytes) to its
// source, until its stdin closes (or 60 s pass).
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "peer_process.hpp"
#include "talaria/na/na.hpp"

using namespace talaria;
using namespace talaria::na;

int main(int argc, char** argv) {
    auto address = test::peer_start("ucx_echo_peer", argc, argv);
    if (!address) return 2;
    auto t = open(*address);
    if (!t) {
        std::fprintf(stderr, "ucx_echo_peer: open %s: %s\n", address->c_str(),
                     t.error().describe().c_str());
        return 1;
    }
    auto ctx = (*t)->context_create(0);
    if (!ctx) return 1;
    Transport& tr = **t;
    Context& c = **ctx;
    constexpr int kSlots = 16;
    std::vector<MsgBuffer> bufs;
    for (int i = 0; i < kSlots; ++i) {
        auto b = tr.msg_buf_alloc(tr.max_unexpected_size());
        if (!b) return 1;
        bufs.push_back(std::move(*b));
    }
    std::vector<MsgBuffer> out;
    for (int i = 0; i < kSlots; ++i) {
        auto b = tr.msg_buf_alloc(tr.max_expected_size());
        if (!b) return 1;
        out.push_back(std::move(*b));
    }
    struct State {
        Transport& tr;
        Context& c;
        std::vector<MsgBuffer>& in;
        std::vector<MsgBuffer>& out;
        bool failed = false;
        void post(int i) {
            auto r = tr.post_recv_unexpected(
                c, [this, i](const Completion& done) { echo(i, done); }, in[i]);
            if (!r) failed = true;
        }
        void echo(int i, const Completion& done) {
            if (done.status != Errc::ok) return;
            std::memcpy(out[i].data(), in[i].data(), done.size);
            auto s = tr.post_send_expected(
                c, [](const Completion&) {}, out[i], done.size, done.source, 0, done.tag);
            if (!s) failed = true;
            post(i);
        }
    } st{tr, c, bufs, out};
    auto post = [&](int i) { st.post(i); };
    bool& failed = st.failed;
    for (int i = 0; i < kSlots; ++i)
        post(i);
    test::print_line(tr.addr_to_string(tr.addr_self()));
    unsigned n = 0;
    while (!failed) {
        (void)c.progress(Duration::zero());
        c.trigger();
        if ((++n & 0xfff) == 0 && test::stdin_closed()) break;
    }
    return failed ? 1 : 0;
}
