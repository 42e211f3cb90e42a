// Fuzz target: serialized addresses and address strings, for every transport that is built.
//
// Feeds the input to addr_deserialize() of each transport that opens, and the input as a
// string to addr_lookup() (as given, and with each transport's "scheme://" in front). What
// comes back must be well-formed: an address that deserializes must serialize into at most
// addr_serialize_size() bytes, deserialize again to the same interned Addr, and name itself
// with a string that looks it up to that same Addr. Any violation aborts (a finding).
//
// Transports are opened once (function-local static) and never destroyed, since libFuzzer
// may exit from anywhere; the open/close lifecycle is the conformance suite's job. A transport
// that fails to open is skipped.
#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.hpp"
#include "talaria/na/na.hpp"

namespace {

using talaria::na::Addr;
using talaria::na::Transport;

constexpr const char* kTarget = "fuzz_addr";

[[noreturn]] void fail(const Transport& t, const char* what, std::string_view detail = {}) {
    talaria::fuzz::fail(kTarget, t, what, detail);
}

// True when `s`, as the tcp transport would parse it, names its host numerically (or not at
// all). Host names go to getaddrinfo, i.e. to DNS: slow, and not something to send random
// bytes to, so those strings are not looked up.
bool tcp_host_is_numeric(std::string_view s) {
    if (s.substr(0, 6) == "tcp://") s.remove_prefix(6);
    std::string host;
    if (!s.empty() && s.front() == '[') {
        auto close = s.find(']');
        if (close == std::string_view::npos) return true;  // rejected before any resolution
        host = std::string(s.substr(1, close - 1));
    } else {
        auto colon = s.rfind(':');
        host = std::string(s.substr(0, colon));
    }
    host = host.c_str();  // what getaddrinfo would see: up to the first NUL
    if (host.empty() || host == "localhost") return true;
    unsigned char buf[sizeof(in6_addr)];
    return inet_pton(AF_INET, host.c_str(), buf) == 1 ||
           inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

void check_addr(Transport& t, const Addr& a) {
    if (!a) fail(t, "a successful call returned an empty Addr");
    if (a.impl()->transport() != &t) fail(t, "Addr belongs to another transport");
    std::size_t n = t.addr_serialize_size(a);
    if (n == 0 || n > (1u << 20)) fail(t, "implausible addr_serialize_size");
    std::vector<std::byte> buf(n);
    auto w = t.addr_serialize(a, buf);
    if (!w) fail(t, "cannot re-serialize a valid address", w.error().describe());
    if (*w == 0 || *w > n) fail(t, "addr_serialize wrote more than addr_serialize_size");
    auto back = t.addr_deserialize(std::span<const std::byte>(buf.data(), *w));
    if (!back) fail(t, "own serialization does not deserialize", back.error().describe());
    if (!(*back == a)) fail(t, "round trip yields a different Addr (not interned)");
    // A serialization into a buffer one byte short must fail cleanly.
    if (*w > 0) {
        std::vector<std::byte> small(*w - 1);
        if (t.addr_serialize(a, small)) fail(t, "addr_serialize succeeded into a short buffer");
    }
    std::string s = t.addr_to_string(a);
    if (s.empty()) fail(t, "addr_to_string of a valid address is empty");
    if (t.name() != "tcp" || tcp_host_is_numeric(s)) {
        auto l = t.addr_lookup(s);
        if (!l) fail(t, "addr_to_string result does not look up", s);
        if (!(*l == a)) fail(t, "lookup of addr_to_string yields a different Addr", s);
    }
}

void lookup(Transport& t, std::string_view s) {
    if (t.name() == "tcp" && !tcp_host_is_numeric(s)) return;
    auto r = t.addr_lookup(s);
    if (r) check_addr(t, *r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
    std::string_view text(reinterpret_cast<const char*>(data), size);
    for (auto& t : talaria::fuzz::transports(kTarget)) {
        auto r = t->addr_deserialize(in);
        if (r) check_addr(*t, *r);
        lookup(*t, text);
        if (text.find("://") == std::string_view::npos) {
            std::string with_scheme = std::string(t->name()) + "://";
            with_scheme.append(text);
            lookup(*t, with_scheme);
        }
    }
    return 0;
}
