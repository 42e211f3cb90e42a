// talaria-fuzz-seeds: writes the seed corpora of fuzz_addr and fuzz_mem_handle from real
// serialized addresses and memory handles of every transport that opens, plus truncated,
// extended and corrupted variants and address strings. Rerun it when a wire format changes:
//   talaria-fuzz-seeds <source>/fuzz/corpus
// (Not a test. It lives here because it is built with the tests; it uses only the public na
// interface.)
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "talaria/na/na.hpp"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;
using talaria::na::Access;
using talaria::na::Addr;
using talaria::na::Transport;

int g_written = 0;

void write(const fs::path& dir, const std::string& name, std::span<const std::byte> b) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    if (!out) {
        std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
        std::exit(1);
    }
    ++g_written;
}

void write_text(const fs::path& dir, const std::string& name, std::string_view s) {
    write(dir, name, std::as_bytes(std::span<const char>(s.data(), s.size())));
}

// The valid bytes, then variants a decoder must reject (or accept) without harm.
void write_variants(const fs::path& dir, const std::string& stem, const Bytes& b) {
    write(dir, stem + ".bin", b);
    if (b.empty()) return;
    write(dir, stem + ".trunc1.bin", std::span(b).first(b.size() - 1));
    write(dir, stem + ".half.bin", std::span(b).first(b.size() / 2));
    write(dir, stem + ".byte.bin", std::span(b).first(1));
    Bytes longer = b;
    longer.push_back(std::byte{0});
    write(dir, stem + ".extra.bin", longer);
    // Length and count fields sit near the front: saturate a window of bytes at a few places.
    for (std::size_t at : {std::size_t(2), std::size_t(4), b.size() / 2}) {
        if (at >= b.size()) continue;
        Bytes big = b;
        for (std::size_t i = at; i < at + 4 && i < big.size(); ++i)
            big[i] = std::byte{0xFF};
        write(dir, stem + ".ff" + std::to_string(at) + ".bin", big);
    }
    Bytes flipped = b;
    for (std::size_t i = 0; i < flipped.size(); i += 3)
        flipped[i] ^= std::byte{0x5A};
    write(dir, stem + ".flip.bin", flipped);
}

Bytes serialize_addr(Transport& t, const Addr& a) {
    Bytes b(t.addr_serialize_size(a));
    auto n = t.addr_serialize(a, b);
    if (!n) {
        std::fprintf(stderr, "%.*s: addr_serialize: %s\n", int(t.name().size()), t.name().data(),
                     n.error().describe().c_str());
        return {};
    }
    b.resize(*n);
    return b;
}

void addr_seeds(Transport& t, const fs::path& dir) {
    const std::string tn(t.name());
    Addr self = t.addr_self();
    write_variants(dir, tn + "-self", serialize_addr(t, self));
    std::string self_str = t.addr_to_string(self);
    write_text(dir, tn + "-self.txt", self_str);
    write_text(dir, tn + "-self-trunc.txt", self_str.substr(0, self_str.size() / 2));

    std::vector<std::string> peers;
    if (tn == "inproc") peers = {"inproc://peer-1", "inproc://a", "inproc://x.y_z:9-"};
    if (tn == "tcp") peers = {"tcp://127.0.0.1:5000", "tcp://[::1]:65535", "tcp://127.0.0.1:1"};
    if (tn == "sm") peers = {self_str + "0", "sm://peer"};
    int i = 0;
    for (const auto& p : peers) {
        auto a = t.addr_lookup(p);
        if (!a) {
            std::fprintf(stderr, "%s: lookup %s: %s\n", tn.c_str(), p.c_str(),
                         a.error().describe().c_str());
            continue;
        }
        std::string stem = tn + "-peer" + std::to_string(i++);
        write_variants(dir, stem, serialize_addr(t, *a));
        write_text(dir, stem + ".txt", p);
    }
}

void mem_seeds(Transport& t, const fs::path& dir) {
    const std::string tn(t.name());
    static std::vector<unsigned char> region(4096);
    const struct {
        Access access;
        const char* name;
    } modes[] = {{Access::read_only, "ro"}, {Access::write_only, "wo"}, {Access::read_write, "rw"}};
    for (const auto& m : modes) {
        auto h = t.mem_register(region.data(), region.size(), m.access);
        if (!h) {
            std::fprintf(stderr, "%s: mem_register: %s\n", tn.c_str(),
                         h.error().describe().c_str());
            return;
        }
        Bytes b(t.mem_serialize_size(*h));
        auto n = t.mem_serialize(*h, b);
        if (!n) {
            std::fprintf(stderr, "%s: mem_serialize: %s\n", tn.c_str(),
                         n.error().describe().c_str());
            return;
        }
        b.resize(*n);
        write_variants(dir, tn + "-" + m.name, b);
    }
    auto empty = t.mem_register(region.data(), 0, Access::read_write);
    if (empty) {
        Bytes b(t.mem_serialize_size(*empty));
        if (auto n = t.mem_serialize(*empty, b)) {
            b.resize(*n);
            write(dir, tn + "-empty.bin", b);
        }
    }
}

void garbage(const fs::path& dir) {
    Bytes zeros(64, std::byte{0});
    write(dir, "garbage-zeros.bin", zeros);
    Bytes ones(64, std::byte{0xFF});
    write(dir, "garbage-ff.bin", ones);
    Bytes noise(97);
    uint32_t x = 0x12345678;
    for (auto& b : noise) {
        x = x * 1664525u + 1013904223u;
        b = std::byte(x >> 24);
    }
    write(dir, "garbage-noise.bin", noise);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <source>/fuzz/corpus\n", argv[0]);
        return 2;
    }
    const fs::path root(argv[1]);
    const fs::path addr_dir = root / "fuzz_addr";
    const fs::path mem_dir = root / "fuzz_mem_handle";
    fs::create_directories(addr_dir);
    fs::create_directories(mem_dir);
    int opened = 0;
    // The same endpoints the fuzz targets open.
    for (const char* url : {"inproc://fuzz", "sm://", "tcp://127.0.0.1:0"}) {
        auto t = talaria::na::open(url);
        if (!t) {
            std::fprintf(stderr, "skipping %s: %s\n", url, t.error().describe().c_str());
            continue;
        }
        ++opened;
        addr_seeds(**t, addr_dir);
        mem_seeds(**t, mem_dir);
    }
    int k = 0;
    for (const char* s : {"inproc://", "tcp://", "sm://", "tcp://[::1", "tcp://1.2.3.4:99999",
                          "tcp://1:2:3", "tcp://0.0.0.0:0", "unknown://x", "://", ""})
        write_text(addr_dir, "text-bad" + std::to_string(k++) + ".txt", s);
    garbage(addr_dir);
    garbage(mem_dir);
    std::printf("%d transports opened, %d seed files written under %s\n", opened, g_written,
                root.c_str());
    return opened > 0 ? 0 : 1;
}
