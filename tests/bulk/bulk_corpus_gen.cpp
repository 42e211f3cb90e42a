// Writes the seed corpus of fuzz/fuzz_bulk_handle: `bulk_corpus_gen <dir>`.
//
// For each transport the fuzz target opens (inproc://fuzz, sm://, tcp://127.0.0.1:0, and tcp
// without listen, whose handles say their owner does not listen, relayed too): valid
// encodings (several segments in each access mode, an embedded owner, an inline handle), and
// from each a truncated, a flipped and an extended variant; plus a few garbage inputs. Run by
// hand when the encoding changes; the files are committed.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "talaria/bulk/bulk.hpp"
#include "talaria/proc/archive.hpp"
#include "talaria/util/log.hpp"

using namespace talaria;

namespace {

bool write_file(const std::string& path, const std::vector<std::byte>& b) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    return bool(out);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: bulk_corpus_gen <dir>\n");
        return 2;
    }
    log::configure("error");
    std::string dir = argv[1];
    int written = 0;
    std::vector<std::byte> mem(3 * 4096);
    auto put = [&](const std::string& name, const std::vector<std::byte>& b) {
        if (!write_file(dir + "/" + name + ".bin", b)) {
            std::fprintf(stderr, "cannot write %s/%s.bin\n", dir.c_str(), name.c_str());
            std::exit(1);
        }
        ++written;
    };
    struct Url {
        const char* url;
        bool listen;  // off: the owner-does-not-listen encodings (and their relays)
    };
    for (auto [url, listen] : {Url{"inproc://fuzz", true}, Url{"sm://", true},
                               Url{"tcp://127.0.0.1:0", true}, Url{"tcp://127.0.0.1:0", false}}) {
        na::Options o;
        o.listen = listen;
        auto t = na::open(url, o);
        if (!t) {
            std::fprintf(stderr, "skipping %s: %s\n", url, t.error().describe().c_str());
            continue;
        }
        std::string tn = std::string(t->get()->name()) + (listen ? "" : "-deaf");
        struct Kind {
            const char* name;
            std::vector<bulk::Segment> segs;
            na::Access access;
            bool owner;
        };
        std::vector<Kind> kinds{
            {"rw3",
             {{mem.data(), 1000}, {mem.data() + 1000, 1}, {mem.data() + 2000, 4096}},
             na::Access::read_write,
             false},
            {"ro1", {{mem.data(), 4096}}, na::Access::read_only, false},
            {"wo2", {{mem.data(), 600}, {mem.data() + 4096, 600}}, na::Access::write_only, false},
            {"owner", {{mem.data(), 700}, {mem.data() + 800, 9}}, na::Access::read_write, true},
            {"inline", {{mem.data(), 40}, {mem.data() + 100, 60}}, na::Access::read_only, false},
            {"inline-owner", {{mem.data(), 512}}, na::Access::read_only, true},
        };
        for (auto& k : kinds) {
            if (k.owner && !listen) continue;  // refused: nobody could reach the owner
            auto h = bulk::Handle::create(**t, k.segs, k.access, k.owner);
            if (!h) {
                std::fprintf(stderr, "%s: create: %s\n", url, h.error().describe().c_str());
                return 1;
            }
            std::vector<std::byte> enc;
            if (auto r = h->encode(enc); !r) {
                std::fprintf(stderr, "%s: encode: %s\n", url, r.error().describe().c_str());
                return 1;
            }
            std::string base = tn + "-" + k.name;
            put(base, enc);
            if (!listen) {
                // Received from its owner (the source), then relayed: 0x08 | 0x02, no address.
                na::Addr self = t->get()->addr_self();
                proc::Decoder d(enc, {t->get(), &self});
                auto got = bulk::Handle::decode(d);
                std::vector<std::byte> relay;
                if (!got || !got->encode(relay)) {
                    std::fprintf(stderr, "%s: relay of %s failed\n", url, k.name);
                    return 1;
                }
                put(base + ".relayed", relay);
            }
            put(base + ".trunc1", {enc.begin(), enc.end() - 1});
            put(base + ".half", {enc.begin(), enc.begin() + std::ptrdiff_t(enc.size() / 2)});
            auto flip = enc;
            flip[flip.size() / 3] ^= std::byte{0x5a};
            put(base + ".flip", flip);
            auto extra = enc;
            extra.push_back(std::byte{0xee});
            put(base + ".extra", extra);
            auto count = enc;  // a segment count far beyond the input
            count[2] = count[3] = count[4] = count[5] = std::byte{0xff};
            put(base + ".hugecount", count);
        }
    }
    put("garbage-empty", {});
    put("garbage-zeros", std::vector<std::byte>(64));
    put("garbage-ff", std::vector<std::byte>(64, std::byte{0xff}));
    std::vector<std::byte> noise(200);
    uint32_t x = 12345;
    for (auto& b : noise) {
        x = x * 1103515245 + 12345;
        b = std::byte(x >> 16);
    }
    noise[0] = std::byte{0x10};
    put("garbage-noise", noise);
    std::printf("%d corpus files written to %s\n", written, dir.c_str());
    return 0;
}
