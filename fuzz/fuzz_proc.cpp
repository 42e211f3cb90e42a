// Fuzz target: proc decoding of arbitrary bytes as several representative types.
//
// The input is decoded, whole, as each type below (nested user types with member and free
// serialize, strings, vectors, maps, sets, optional, variant, tuples, a recursive tree, several
// values at once). Decoding may fail, but only with protocol_error and a message. When it
// succeeds, proc's encoding is canonical, so encoding the decoded value must give back exactly
// the input bytes (for unordered containers, whose order is not kept: the same size, and a
// value that decodes back equal). Any violation aborts (a finding). Crashes, hangs and
// over-allocation are caught by libFuzzer and the sanitizers.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "talaria/proc/proc.hpp"

namespace {

namespace proc = talaria::proc;
using Bytes = std::vector<std::byte>;

enum class Kind : uint8_t { file, directory, link };

// Recursive, so the nesting limit is exercised.
struct Tree {
    uint16_t label = 0;
    std::vector<Tree> kids;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(label, kids);
    }
};

using Extra = std::variant<int64_t, std::string, std::vector<std::byte>>;

struct Entry {
    std::string name;
    std::vector<uint32_t> ids;
    std::optional<Extra> extra;
    bool flag = false;
    Kind kind = Kind::file;
    std::array<int16_t, 2> pos{};
};

// Free serialize, found by ADL.
template <class Archive>
void serialize(Archive& ar, Entry& e) {
    ar(e.name, e.ids, e.extra, e.flag, e.kind, e.pos);
}

using Table = std::map<std::string, std::vector<std::optional<std::variant<int32_t, std::string>>>>;

struct Record {
    uint64_t id = 0;
    Table table;
    std::vector<Entry> entries;
    std::set<int32_t> tags;
    std::pair<std::string, double> note;
    std::tuple<int8_t, bool, std::chrono::nanoseconds> misc;
    std::vector<bool> bits;
    Tree tree;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(id, table, entries, tags, note, misc, bits, tree);
    }
};

using Flat = std::tuple<std::string, std::vector<float>, std::optional<uint64_t>, std::u16string>;
using Unordered = std::unordered_map<std::string, std::unordered_set<uint16_t>>;

[[noreturn]] void fail(const char* type, const char* what, const std::string& detail = {}) {
    std::fprintf(stderr, "fuzz_proc: %s: %s%s%s\n", type, what, detail.empty() ? "" : ": ",
                 detail.c_str());
    std::abort();
}

void check_failure(const char* type, const talaria::Error& e) {
    if (e.code() != talaria::Errc::protocol_error)
        fail(type, "decoding failed with a code other than protocol_error", e.describe());
    if (e.message().empty()) fail(type, "decoding failed without a message");
}

template <class... T>
void check_reencode(const char* type, std::span<const std::byte> in, const T&... v) {
    Bytes out;
    auto r = proc::encode(out, v...);
    if (!r) fail(type, "a decoded value does not encode", r.error().describe());
    if (out.size() != in.size() || !std::equal(out.begin(), out.end(), in.begin()))
        fail(type, "re-encoding a decoded value gives other bytes");
}

template <class T>
void check_one(const char* type, std::span<const std::byte> in) {
    auto r = proc::decode_as<T>(in);
    if (!r) return check_failure(type, r.error());
    check_reencode(type, in, *r);
}

// Several values in one encoding, as RPC arguments travel.
void check_several(std::span<const std::byte> in) {
    uint32_t op = 0;
    std::string name;
    std::vector<Entry> entries;
    std::optional<Kind> kind;
    auto r = proc::decode(in, {}, op, name, entries, kind);
    if (!r) return check_failure("several", r.error());
    check_reencode("several", in, op, name, entries, kind);
}

void check_unordered(std::span<const std::byte> in) {
    auto r = proc::decode_as<Unordered>(in);
    if (!r) return check_failure("unordered", r.error());
    Bytes out;
    if (!proc::encode(out, *r)) fail("unordered", "a decoded value does not encode");
    if (out.size() != in.size()) fail("unordered", "re-encoding changes the size");
    auto back = proc::decode_as<Unordered>(out);
    if (!back) fail("unordered", "re-encoding does not decode", back.error().describe());
    if (*back != *r) fail("unordered", "re-encoding decodes to another value");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
    check_one<Record>("Record", in);
    check_one<Entry>("Entry", in);
    check_one<Tree>("Tree", in);
    check_one<Table>("Table", in);
    check_one<Flat>("Flat", in);
    check_several(in);
    check_unordered(in);
    return 0;
}
