#include "harness.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "talaria/util/touch_trace.hpp"

namespace talaria::na::test {

namespace {
bool ipv6_loopback_works() {
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}
}  // namespace

void use_recommended_provider_env() {
    // The test programs are applications: they set what docs/transports.md asks of one (the
    // library never changes the environment). A value already set wins. Peer processes
    // spawned later inherit it.
    for (const auto& e : talaria::na::recommended_env())
        ::setenv(e.name, e.value, 0);
}

std::vector<TransportKind> multi_process_kinds() {
    std::vector<TransportKind> v;
    for (auto& k : transport_kinds())
        if (k.multi_process) v.push_back(k);
    return v;
}

std::vector<TransportKind> transport_kinds() {
    use_recommended_provider_env();
    std::vector<TransportKind> v;
    for (auto name : transports_built()) {
        if (name == "inproc") {
            v.push_back({"inproc", "inproc://", false});
        } else if (name == "sm") {
            v.push_back({"sm", "sm://", true});
        } else if (name == "tcp") {
            v.push_back({"tcp", "tcp://127.0.0.1:0", true});
            if (ipv6_loopback_works()) v.push_back({"tcp_ipv6", "tcp://[::1]:0", true});
        } else if (name == "ofi") {
            v.push_back({"ofi_tcp", "ofi+tcp://127.0.0.1:0", true});
            v.push_back({"ofi_shm", "ofi+shm://", true});
        } else if (name == "ucx") {
            v.push_back({"ucx_tcp", "ucx+tcp://127.0.0.1:0", true});
            v.push_back({"ucx_sm", "ucx+sm://", true});
        } else {
            std::fprintf(stderr, "conformance: transport '%.*s' has no entry in harness.cpp\n",
                         int(name.size()), name.data());
        }
    }
    return v;
}

bool progress_until(std::initializer_list<Context*> ctxs, const std::function<bool()>& pred,
                    Duration timeout) {
    auto deadline = Clock::now() + timeout;
    // One context may block up to 50 ms at a time; several share the thread, 1 ms each.
    Duration slice = ctxs.size() == 1 ? Duration(50ms) : Duration(1ms);
    for (;;) {
        for (Context* c : ctxs)
            c->trigger();
        if (pred()) return true;
        auto now = Clock::now();
        if (now >= deadline) return false;
        for (Context* c : ctxs) {
            auto r = c->progress(std::min<Duration>(slice, deadline - now));
            if (!r && r.code() != Errc::timeout) {
                std::fprintf(stderr, "progress_until: progress failed: %s\n",
                             r.error().describe().c_str());
                return false;
            }
            c->trigger();
        }
    }
}

void progress_for(std::initializer_list<Context*> ctxs, Duration d) {
    progress_until(
        ctxs, [] { return false; }, d);
}

MsgBuffer alloc_buf(Transport& t, std::size_t size) {
    auto b = t.msg_buf_alloc(size);
    if (!b) {
        std::fprintf(stderr, "alloc_buf: msg_buf_alloc(%zu): %s\n", size,
                     b.error().describe().c_str());
        return {};
    }
    return std::move(*b);
}

static std::byte pattern_byte(uint32_t seed, std::size_t i) {
    uint32_t x = seed * 2654435761u ^ uint32_t(i) * 40503u ^ uint32_t(i >> 16) * 97u;
    x ^= x >> 13;
    return std::byte(x & 0xff);
}

void fill_pattern(std::span<std::byte> s, uint32_t seed, std::size_t start) {
    for (std::size_t i = 0; i < s.size(); ++i)
        s[i] = pattern_byte(seed, start + i);
}

std::optional<std::size_t> pattern_mismatch(std::span<const std::byte> s, uint32_t seed,
                                            std::size_t start) {
    for (std::size_t i = 0; i < s.size(); ++i)
        if (s[i] != pattern_byte(seed, start + i)) return i;
    return std::nullopt;
}

std::string to_hex(std::span<const std::byte> s) {
    static const char* d = "0123456789abcdef";
    std::string out;
    out.reserve(s.size() * 2);
    for (auto b : s) {
        out.push_back(d[uint8_t(b) >> 4]);
        out.push_back(d[uint8_t(b) & 15]);
    }
    return out;
}

std::optional<std::vector<std::byte>> from_hex(std::string_view s) {
    if (s.size() % 2) return std::nullopt;
    auto nib = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    std::vector<std::byte> out;
    for (std::size_t i = 0; i < s.size(); i += 2) {
        int hi = nib(s[i]), lo = nib(s[i + 1]);
        if (hi < 0 || lo < 0) return std::nullopt;
        out.push_back(std::byte(hi * 16 + lo));
    }
    return out;
}

uint64_t fnv1a(std::span<const std::byte> s) {
    uint64_t h = 1469598103934665603ull;
    for (auto b : s) {
        h ^= uint8_t(b);
        h *= 1099511628211ull;
    }
    return h;
}

std::vector<const void*> my_touches() {
#if defined(TALARIA_TOUCH_TRACE)
    return touch::log().seen;
#else
    return {};
#endif
}

std::vector<const void*> both_touched(std::vector<const void*> a, std::vector<const void*> b) {
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::vector<const void*> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    return both;
}

void fill_flood(std::span<std::byte> b, int i) {
    std::memset(b.data(), i & 0xff, b.size());
    std::memcpy(b.data(), &i, sizeof i);
}

Result<void> post_counted_sends(Transport& t, Context& ctx, std::span<const MsgBuffer> bufs,
                                std::size_t len, const Addr& dest, int n, Tag tag, bool numbered,
                                SendCount* count) {
    for (int i = 0; i < n; ++i) {
        auto r = t.post_send_unexpected(
            ctx,
            [count](const Completion& c) {
                ++count->done;
                count->failed += c.status != Errc::ok;
            },
            bufs[std::size_t(i) % bufs.size()], len, dest, 0, tag + (numbered ? Tag(i) : 0));
        if (!r) return r.error();
    }
    return ok();
}

std::string FloodOrder::take(const Completion& c, std::span<const std::byte> buf) {
    int idx = -1;
    if (c.size >= sizeof idx) std::memcpy(&idx, buf.data(), sizeof idx);
    if (idx != next || c.tag != kFloodTag + Tag(next))
        return fmt::format("message {} (tag {}) came where {} was due: lost or reordered", idx,
                           c.tag, next);
    if (c.size != buf.size() || buf[buf.size() - 1] != std::byte(next & 0xff))
        return fmt::format("message {} is not whole ({} of {} bytes)", next, c.size, buf.size());
    ++next;
    return {};
}

}  // namespace talaria::na::test
