// Fuzz target: serialized memory handles, for every transport that is built.
//
// Feeds the input to mem_deserialize() of each transport that opens. A handle that
// deserializes must be a remote handle of that transport with a sane extent and access, and
// must serialize into at most mem_serialize_size() bytes that deserialize to the same base,
// length and access. Any violation aborts (a finding). Nothing is ever read or written
// through a fuzzed handle here: bounds on put/get are the conformance suite's job.
//
// Transports are opened once and never destroyed (libFuzzer may exit from anywhere); one
// that fails to open is skipped.
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

using talaria::na::Access;
using talaria::na::MemHandle;
using talaria::na::Transport;

constexpr const char* kTarget = "fuzz_mem_handle";

[[noreturn]] void fail(const Transport& t, const char* what, std::string_view detail = {}) {
    talaria::fuzz::fail(kTarget, t, what, detail);
}

bool valid_access(Access a) {
    return a == Access::read_only || a == Access::write_only || a == Access::read_write;
}

void check_handle(Transport& t, const MemHandle& h) {
    if (!h) fail(t, "a successful mem_deserialize returned an empty handle");
    if (h->transport() != &t) fail(t, "handle belongs to another transport");
    if (h->local()) fail(t, "a deserialized handle claims to be local");
    if (!valid_access(h->access())) fail(t, "deserialized handle has an invalid access mode");
    if (h->length() > UINT64_MAX - h->base()) fail(t, "handle extent wraps around");
    std::size_t n = t.mem_serialize_size(h);
    if (n == 0 || n > (1u << 20)) fail(t, "implausible mem_serialize_size");
    std::vector<std::byte> buf(n);
    auto w = t.mem_serialize(h, buf);
    if (!w) fail(t, "cannot re-serialize a deserialized handle", w.error().describe());
    if (*w == 0 || *w > n) fail(t, "mem_serialize wrote more than mem_serialize_size");
    auto back = t.mem_deserialize(std::span<const std::byte>(buf.data(), *w));
    if (!back) fail(t, "own serialization does not deserialize", back.error().describe());
    if ((*back)->base() != h->base() || (*back)->length() != h->length() ||
        (*back)->access() != h->access())
        fail(t, "round trip changes base, length or access");
    std::vector<std::byte> small(*w - 1);
    if (t.mem_serialize(h, small)) fail(t, "mem_serialize succeeded into a short buffer");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
    for (auto& t : talaria::fuzz::transports(kTarget)) {
        auto r = t->mem_deserialize(in);
        if (r) check_handle(*t, *r);
    }
    return 0;
}
