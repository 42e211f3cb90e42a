// proc: round trips of every supported type, the exact bytes of the documented layout
// (docs/protocol.md, "proc"), and hostile input (truncations, corruptions, huge lengths, bad
// flags and indexes, deep nesting, trailing bytes), which must fail cleanly and cheaply.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "talaria/proc/proc.hpp"

// Counting allocator: the tests below check that hostile lengths allocate nothing big and that
// encoding scalars allocates nothing beyond the output vector. Single-threaded tests only read it.
namespace {
std::atomic<std::size_t> g_alloc_calls{0};
std::atomic<std::size_t> g_alloc_bytes{0};
}  // namespace

// GCC inlines these replacements into the test code and then sees a new-expression paired with
// free(): that is exactly how a replacement operator new/delete pair works, so not a mismatch.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
    g_alloc_calls.fetch_add(1, std::memory_order_relaxed);
    g_alloc_bytes.fetch_add(n, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
#pragma GCC diagnostic pop

namespace {

using talaria::Errc;
using talaria::Result;
namespace proc = talaria::proc;
using Bytes = std::vector<std::byte>;

struct AllocCount {
    std::size_t calls0 = g_alloc_calls.load();
    std::size_t bytes0 = g_alloc_bytes.load();
    [[nodiscard]] std::size_t calls() const { return g_alloc_calls.load() - calls0; }
    [[nodiscard]] std::size_t bytes() const { return g_alloc_bytes.load() - bytes0; }
};

Bytes bytes(std::initializer_list<int> v) {
    Bytes b;
    for (int x : v)
        b.push_back(static_cast<std::byte>(x));
    return b;
}

template <class... T>
Bytes enc(const T&... v) {
    Bytes out;
    auto r = proc::encode(out, v...);
    EXPECT_TRUE(r) << r.error().describe();
    return out;
}

template <class T>
T round_trip(const T& v) {
    Bytes b = enc(v);
    auto r = proc::decode_as<T>(b);
    EXPECT_TRUE(r) << r.error().describe();
    if (!r) return T{};
    // Canonical: the decoded value encodes to the same bytes.
    EXPECT_EQ(enc(*r), b);
    return std::move(*r);
}

// ---- user types ----------------------------------------------------------------------------

enum class Color : uint16_t { red = 1, green = 2, blue = 0x1234 };
enum Small : int8_t { kMinusOne = -1, kZero = 0 };
enum Unfixed { kUnfixedA, kUnfixedB };  // no fixed underlying type: not serializable

struct Point {
    int32_t x = 0;
    int32_t y = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(x, y);
    }
    bool operator==(const Point&) const = default;
};

}  // namespace

namespace geo {
// Free serialize, found by ADL.
struct Segment {
    std::string name;
    std::vector<Point> points;
    std::optional<Color> color;
    bool operator==(const Segment&) const = default;
};
template <class Archive>
void serialize(Archive& ar, Segment& s) {
    ar(s.name, s.points, s.color);
}
}  // namespace geo

// A global-namespace type with a free serialize (the global namespace is its ADL namespace).
struct GlobalThing {
    uint8_t a = 0;
    std::set<std::string> tags;
    bool operator==(const GlobalThing&) const = default;
};
template <class Archive>
void serialize(Archive& ar, GlobalThing& g) {
    ar& g.a& g.tags;
}

namespace {

// Recursive: only user types can nest without bound, and proc limits their depth.
struct Node {
    uint8_t tag = 0;
    std::vector<Node> children;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(tag, children);
    }
    bool operator==(const Node&) const = default;
};

Node chain(std::size_t depth) {
    Node root;
    Node* n = &root;
    for (std::size_t i = 1; i < depth; ++i) {
        n->children.emplace_back();
        n = &n->children.back();
        n->tag = static_cast<uint8_t>(i);
    }
    return root;
}

struct Everything {
    uint64_t id = 0;
    std::map<std::string, std::vector<std::optional<std::variant<int, std::string>>>> table;
    std::vector<geo::Segment> segments;
    std::tuple<int8_t, double, std::string> triple;
    std::pair<Small, std::byte> pair{};
    std::array<uint16_t, 3> fixed{};
    int16_t c_array[2] = {0, 0};
    std::chrono::milliseconds timeout{0};
    std::vector<bool> flags;
    GlobalThing global;
    Node tree;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(id, table, segments, triple, pair, fixed, c_array, timeout, flags, global, tree);
    }
    bool operator==(const Everything& o) const {
        return id == o.id && table == o.table && segments == o.segments && triple == o.triple &&
               pair == o.pair && fixed == o.fixed && c_array[0] == o.c_array[0] &&
               c_array[1] == o.c_array[1] && timeout == o.timeout && flags == o.flags &&
               global == o.global && tree == o.tree;
    }
};

Everything sample() {
    Everything e;
    e.id = 0x0123456789abcdefULL;
    e.table["alpha"] = {std::nullopt, 7, std::string("seven")};
    e.table["beta"] = {};
    e.table[""] = {std::variant<int, std::string>(std::string())};
    e.segments.push_back({"s1", {{1, 2}, {-3, 4}}, Color::blue});
    e.segments.push_back({"", {}, std::nullopt});
    e.triple = {-5, 2.5, "tri"};
    e.pair = {kMinusOne, std::byte{0xab}};
    e.fixed = {1, 0xffff, 3};
    e.c_array[0] = -1;
    e.c_array[1] = 300;
    e.timeout = std::chrono::milliseconds(-1500);
    e.flags = {true, false, true};
    e.global = {9, {"x", "y"}};
    e.tree = chain(5);
    e.tree.children.push_back(Node{42, {}});
    return e;
}

// Writes a length the encoder must refuse, without needing 4 GiB of memory.
struct HugeClaim {
    template <class Archive>
    void serialize(Archive& ar) {
        if constexpr (Archive::encoding) {
            ar.write_length(std::size_t{1} << 32);
        } else {
            (void)ar.read_length(1);
        }
    }
};

// Records the DecodeContext a decoder hands to serialize functions.
struct SeesContext {
    const void* transport = nullptr;
    template <class Archive>
    void serialize(Archive& ar) {
        if constexpr (Archive::decoding) transport = ar.context().transport;
    }
};

struct EncodeOnly {
    void serialize(proc::Encoder&) {}
};
struct NoSerialize {
    int x;
};

// ---- the concept and the minimum sizes -------------------------------------------------------

static_assert(proc::Serializable<int>);
static_assert(proc::Serializable<const bool&>);
static_assert(proc::Serializable<std::byte>);
static_assert(proc::Serializable<Color>);
static_assert(proc::Serializable<Small>);
static_assert(proc::Serializable<std::string>);
static_assert(proc::Serializable<std::vector<std::vector<std::byte>>>);
static_assert(proc::Serializable<Point>);
static_assert(proc::Serializable<geo::Segment>);
static_assert(proc::Serializable<GlobalThing>);
static_assert(proc::Serializable<Node>);
static_assert(proc::Serializable<Everything>);
static_assert(proc::Serializable<std::variant<std::monostate, Point, std::string>>);
static_assert(proc::Serializable<std::unordered_map<std::string, std::set<int>>>);
static_assert(proc::Serializable<std::chrono::nanoseconds>);
static_assert(proc::Serializable<int[4]>);
static_assert(!proc::Serializable<int*>);
static_assert(!proc::Serializable<const char*>);
static_assert(!proc::Serializable<long double>);
static_assert(!proc::Serializable<Unfixed>);
static_assert(!proc::Serializable<NoSerialize>);
static_assert(!proc::Serializable<EncodeOnly>);
static_assert(!proc::Serializable<std::vector<NoSerialize>>);
static_assert(!proc::Serializable<std::optional<std::map<int, NoSerialize>>>);
static_assert(!proc::Serializable<std::variant<int, NoSerialize>>);
static_assert(!proc::Serializable<std::tuple<int, NoSerialize>>);
static_assert(!proc::Serializable<std::pair<const int, int>>);
static_assert(!proc::Serializable<std::optional<const int>>);

static_assert(proc::min_encoded_size<bool>() == 1);
static_assert(proc::min_encoded_size<uint8_t>() == 1);
static_assert(proc::min_encoded_size<double>() == 8);
static_assert(proc::min_encoded_size<Color>() == 2);
static_assert(proc::min_encoded_size<std::string>() == 4);
static_assert(proc::min_encoded_size<std::vector<double>>() == 4);
static_assert(proc::min_encoded_size<std::map<int, int>>() == 4);
static_assert(proc::min_encoded_size<std::optional<double>>() == 1);
static_assert(proc::min_encoded_size<std::variant<double, char>>() == 4);
static_assert(proc::min_encoded_size<std::pair<int, std::string>>() == 8);
static_assert(proc::min_encoded_size<std::tuple<bool, int64_t, std::string>>() == 13);
static_assert(proc::min_encoded_size<std::array<int32_t, 5>>() == 20);
static_assert(proc::min_encoded_size<std::tuple<>>() == 0);
static_assert(proc::min_encoded_size<Point>() == 0);

// ---- round trips ---------------------------------------------------------------------------

// Encoder::take / give_back / mark / rollback: in the room while it fits, in the vector after
// a spill (the room's bytes moved first), a rollback dropping what followed its mark either way.
TEST(proc, EncoderTakeGiveBackAndRollback) {
    std::vector<std::byte> room(16), spill;
    proc::Encoder e(room, spill);
    e.write<uint32_t>(0xa1a2a3a4);
    auto m = e.mark();
    EXPECT_EQ(m, 4u);
    auto span = e.take(8);
    ASSERT_EQ(span.size(), 8u);
    EXPECT_EQ(span.data(), room.data() + 4) << "taken from the room";
    std::memset(span.data(), 0x5a, 3);
    e.give_back(5);
    EXPECT_EQ(e.in_place_size(), 7u);
    e.rollback(m);
    EXPECT_EQ(e.in_place_size(), 4u);
    // More than the room holds: the encoding moves to the vector, the room's bytes first.
    span = e.take(20);
    EXPECT_FALSE(e.in_place());
    ASSERT_EQ(spill.size(), 24u);
    EXPECT_EQ(span.data(), spill.data() + 4);
    uint32_t first = 0;
    std::memcpy(&first, spill.data(), 4);
    EXPECT_EQ(first, 0xa1a2a3a4u);
    e.give_back(16);
    EXPECT_EQ(spill.size(), 8u);
    e.rollback(m);  // a mark taken in the room still counts from the start
    EXPECT_EQ(spill.size(), 4u);
    // Vector mode appends after what the vector held.
    std::vector<std::byte> out(3);
    proc::Encoder v(out);
    EXPECT_EQ(v.mark(), 3u);
    auto s2 = v.take(5);
    EXPECT_EQ(s2.data(), out.data() + 3);
    v.rollback(3);
    EXPECT_EQ(out.size(), 3u);
}

TEST(proc, ArithmeticRoundTrip) {
    EXPECT_EQ(round_trip(true), true);
    EXPECT_EQ(round_trip(false), false);
    EXPECT_EQ(round_trip('z'), 'z');
    EXPECT_EQ(round_trip(std::numeric_limits<int8_t>::min()), std::numeric_limits<int8_t>::min());
    EXPECT_EQ(round_trip(std::numeric_limits<uint16_t>::max()), 0xffff);
    EXPECT_EQ(round_trip(std::numeric_limits<int32_t>::min()), std::numeric_limits<int32_t>::min());
    EXPECT_EQ(round_trip(std::numeric_limits<uint64_t>::max()), UINT64_MAX);
    EXPECT_EQ(round_trip(std::numeric_limits<int64_t>::min()), INT64_MIN);
    EXPECT_EQ(round_trip(-0.0f), 0.0f);
    EXPECT_TRUE(std::signbit(round_trip(-0.0)));
    EXPECT_EQ(round_trip(std::numeric_limits<double>::infinity()),
              std::numeric_limits<double>::infinity());
    EXPECT_EQ(round_trip(char8_t{0xf0}), char8_t{0xf0});
    EXPECT_EQ(round_trip(char32_t{0x1f600}), char32_t{0x1f600});
}

TEST(proc, NanKeepsItsBits) {
    uint64_t bits = 0x7ff4000000000123ULL;  // a signaling NaN with a payload
    double nan;
    std::memcpy(&nan, &bits, sizeof nan);
    double back = round_trip(nan);
    uint64_t back_bits;
    std::memcpy(&back_bits, &back, sizeof back);
    EXPECT_EQ(back_bits, bits);
}

TEST(proc, EnumRoundTrip) {
    EXPECT_EQ(round_trip(Color::blue), Color::blue);
    EXPECT_EQ(round_trip(kMinusOne), kMinusOne);
    EXPECT_EQ(round_trip(std::byte{0xfe}), std::byte{0xfe});
    // Any value of the fixed underlying type is a valid enum value, so it decodes.
    auto r = proc::decode_as<Color>(bytes({0x99, 0x00}));
    ASSERT_TRUE(r);
    EXPECT_EQ(static_cast<uint16_t>(*r), 0x99);
}

TEST(proc, StringsRoundTrip) {
    EXPECT_EQ(round_trip(std::string()), "");
    EXPECT_EQ(round_trip(std::string("hello")), "hello");
    std::string binary("a\0b\xff\x00z", 6);
    EXPECT_EQ(round_trip(binary), binary);
    std::string big(100000, 'q');
    EXPECT_EQ(round_trip(big), big);
    EXPECT_EQ(round_trip(std::u16string(u"h\u00e9llo")), u"h\u00e9llo");
}

TEST(proc, VectorsRoundTrip) {
    EXPECT_EQ(round_trip(std::vector<int>{}), std::vector<int>{});
    EXPECT_EQ(round_trip(std::vector<int>{1, -2, 3}), (std::vector<int>{1, -2, 3}));
    EXPECT_EQ(round_trip(std::vector<double>{1.5, -2.25}), (std::vector<double>{1.5, -2.25}));
    std::vector<std::byte> raw(1000);
    for (std::size_t i = 0; i < raw.size(); ++i)
        raw[i] = static_cast<std::byte>(i * 7);
    EXPECT_EQ(round_trip(raw), raw);
    EXPECT_EQ(round_trip(std::vector<bool>{true, false, false, true}),
              (std::vector<bool>{true, false, false, true}));
    std::vector<std::string> strs{"a", "", "ccc"};
    EXPECT_EQ(round_trip(strs), strs);
    std::vector<Color> colors{Color::red, Color::blue};
    EXPECT_EQ(round_trip(colors), colors);
    std::vector<std::vector<uint8_t>> nested{{}, {1}, {2, 3}};
    EXPECT_EQ(round_trip(nested), nested);
}

TEST(proc, ArraysPairsTuplesRoundTrip) {
    std::array<uint32_t, 3> a{1, 2, 3};
    EXPECT_EQ(round_trip(a), a);
    std::array<std::string, 2> s{"x", "yy"};
    EXPECT_EQ(round_trip(s), s);
    std::array<Point, 2> pts{Point{1, 2}, Point{3, 4}};
    EXPECT_EQ(round_trip(pts), pts);
    std::pair<std::string, int> p{"k", 5};
    EXPECT_EQ(round_trip(p), p);
    std::tuple<> empty;
    EXPECT_EQ(enc(empty).size(), 0u);
    EXPECT_EQ(round_trip(empty), empty);
    std::tuple<bool, std::string, std::vector<int>, Color> t{true, "t", {1, 2}, Color::green};
    EXPECT_EQ(round_trip(t), t);

    int c[3] = {7, -8, 9};
    Bytes b = enc(c);
    int back[3] = {};
    ASSERT_TRUE(proc::decode(b, {}, back));
    EXPECT_EQ(back[0], 7);
    EXPECT_EQ(back[1], -8);
    EXPECT_EQ(back[2], 9);
}

TEST(proc, OptionalAndVariantRoundTrip) {
    EXPECT_EQ(round_trip(std::optional<int>()), std::nullopt);
    EXPECT_EQ(round_trip(std::optional<int>(0)), 0);
    EXPECT_EQ(round_trip(std::optional<std::string>("s")), "s");
    using V = std::variant<std::monostate, int, std::string, Point>;
    EXPECT_EQ(round_trip(V{}), V{});
    EXPECT_EQ(round_trip(V{5}), V{5});
    EXPECT_EQ(round_trip(V{std::string("v")}), V{std::string("v")});
    EXPECT_EQ(round_trip(V{Point{1, 2}}), (V{Point{1, 2}}));
    // Same type twice: the index, not the type, says which alternative.
    using Twice = std::variant<int, int>;
    Twice second(std::in_place_index<1>, 9);
    auto back = round_trip(second);
    EXPECT_EQ(back.index(), 1u);
    EXPECT_EQ(std::get<1>(back), 9);
}

TEST(proc, MapsAndSetsRoundTrip) {
    std::map<std::string, int> m{{"b", 2}, {"a", 1}, {"c", 3}};
    EXPECT_EQ(round_trip(m), m);
    std::map<int, int, std::greater<>> desc{{1, 1}, {5, 5}, {3, 3}};
    EXPECT_EQ(round_trip(desc), desc);
    std::set<int> s{5, -1, 3};
    EXPECT_EQ(round_trip(s), s);
    std::unordered_map<std::string, std::vector<int>> um{{"x", {1}}, {"y", {}}, {"z", {2, 3}}};
    Bytes b = enc(um);
    auto r = proc::decode_as<decltype(um)>(b);
    ASSERT_TRUE(r) << r.error().describe();
    EXPECT_EQ(*r, um);
    std::unordered_set<uint64_t> us{1, 2, 99};
    auto rs = proc::decode_as<decltype(us)>(enc(us));
    ASSERT_TRUE(rs);
    EXPECT_EQ(*rs, us);
}

TEST(proc, DurationsRoundTrip) {
    using namespace std::chrono_literals;
    EXPECT_EQ(round_trip(std::chrono::nanoseconds(-123456789)), -123456789ns);
    EXPECT_EQ(round_trip(std::chrono::hours(3)), 3h);
    EXPECT_EQ(round_trip(std::chrono::duration<double>(0.25)), std::chrono::duration<double>(0.25));
}

TEST(proc, NestedStandardTypesRoundTrip) {
    std::map<std::string, std::vector<std::optional<std::variant<int, std::string>>>> m;
    m["one"] = {1, std::nullopt, std::string("two")};
    m["empty"] = {};
    m["nulls"] = {std::nullopt, std::nullopt};
    EXPECT_EQ(round_trip(m), m);
}

TEST(proc, UserTypesRoundTrip) {
    EXPECT_EQ(round_trip(Point{-1, 2}), (Point{-1, 2}));
    geo::Segment seg{"seg", {{1, 1}, {2, 2}}, Color::red};
    EXPECT_EQ(round_trip(seg), seg);
    GlobalThing g{3, {"a", "b"}};
    EXPECT_EQ(round_trip(g), g);
    Everything e = sample();
    EXPECT_EQ(round_trip(e), e);
}

TEST(proc, SeveralValuesInOneEncoding) {
    Bytes out;
    const std::string name = "op";
    const std::vector<int> args{1, 2};
    ASSERT_TRUE(proc::encode(out, name, args, Color::green, Point{5, 6}));
    std::string n2;
    std::vector<int> a2;
    Color c2{};
    Point p2;
    ASSERT_TRUE(proc::decode(out, {}, n2, a2, c2, p2));
    EXPECT_EQ(n2, name);
    EXPECT_EQ(a2, args);
    EXPECT_EQ(c2, Color::green);
    EXPECT_EQ(p2, (Point{5, 6}));
    // No values: nothing appended; decoding nothing needs an empty input.
    Bytes none;
    ASSERT_TRUE(proc::encode(none));
    EXPECT_TRUE(none.empty());
    EXPECT_TRUE(proc::decode(none, {}));
    EXPECT_FALSE(proc::decode(bytes({0}), {}));
}

TEST(proc, EncodeAppends) {
    Bytes out = bytes({0xaa});
    ASSERT_TRUE(proc::encode(out, uint8_t{1}));
    ASSERT_TRUE(proc::encode(out, uint16_t{0x0302}));
    EXPECT_EQ(out, bytes({0xaa, 0x01, 0x02, 0x03}));
}

TEST(proc, DecodeReplacesExistingContents) {
    std::vector<int> v{9, 9, 9};
    std::map<int, int> m{{9, 9}};
    std::optional<int> o = 4;
    std::string s = "old";
    Bytes b = enc(std::vector<int>{1}, std::map<int, int>{{1, 1}}, std::optional<int>(),
                  std::string("n"));
    ASSERT_TRUE(proc::decode(b, {}, v, m, o, s));
    EXPECT_EQ(v, std::vector<int>{1});
    EXPECT_EQ(m, (std::map<int, int>{{1, 1}}));
    EXPECT_EQ(o, std::nullopt);
    EXPECT_EQ(s, "n");
}

TEST(proc, DecodeContextReachesSerializeFunctions) {
    int dummy = 0;  // only its address is used, as a stand-in transport
    proc::DecodeContext ctx;
    ctx.transport = reinterpret_cast<talaria::na::Transport*>(&dummy);
    SeesContext sc;
    ASSERT_TRUE(proc::decode(Bytes{}, ctx, sc));
    EXPECT_EQ(sc.transport, static_cast<const void*>(&dummy));
}

// ---- exact layout ----------------------------------------------------------------------------

TEST(proc, LayoutOfScalars) {
    EXPECT_EQ(enc(uint32_t{0x01020304}), bytes({0x04, 0x03, 0x02, 0x01}));
    EXPECT_EQ(enc(int16_t{-2}), bytes({0xfe, 0xff}));
    EXPECT_EQ(enc(true, false), bytes({0x01, 0x00}));
    EXPECT_EQ(enc(1.0), bytes({0, 0, 0, 0, 0, 0, 0xf0, 0x3f}));
    EXPECT_EQ(enc(-1.0f), bytes({0, 0, 0x80, 0xbf}));
    EXPECT_EQ(enc(Color::blue), bytes({0x34, 0x12}));
    EXPECT_EQ(enc(kMinusOne), bytes({0xff}));
    EXPECT_EQ(enc(std::byte{0x7f}), bytes({0x7f}));
    EXPECT_EQ(enc(std::chrono::nanoseconds(258)), bytes({0x02, 0x01, 0, 0, 0, 0, 0, 0}));
}

TEST(proc, LayoutOfStandardTypes) {
    EXPECT_EQ(enc(std::string("ab")), bytes({2, 0, 0, 0, 'a', 'b'}));
    EXPECT_EQ(enc(std::vector<uint16_t>{1, 0x0203}), bytes({2, 0, 0, 0, 1, 0, 3, 2}));
    EXPECT_EQ(enc(std::vector<bool>{true, false}), bytes({2, 0, 0, 0, 1, 0}));
    EXPECT_EQ(enc(std::array<uint8_t, 3>{7, 8, 9}), bytes({7, 8, 9}));
    EXPECT_EQ(enc(std::optional<uint8_t>()), bytes({0}));
    EXPECT_EQ(enc(std::optional<uint8_t>(7)), bytes({1, 7}));
    EXPECT_EQ(enc(std::variant<int32_t, std::string>(std::string("x"))),
              bytes({1, 0, 0, 0, 1, 0, 0, 0, 'x'}));
    EXPECT_EQ(enc(std::pair<uint8_t, int16_t>(1, -1)), bytes({1, 0xff, 0xff}));
    EXPECT_EQ(enc(std::tuple<uint8_t, bool, uint8_t>(5, true, 6)), bytes({5, 1, 6}));
    EXPECT_EQ(enc(std::map<uint8_t, bool>{{2, false}, {1, true}}), bytes({2, 0, 0, 0, 1, 1, 2, 0}));
    EXPECT_EQ(enc(std::set<int8_t>{3, -1}), bytes({2, 0, 0, 0, 0xff, 3}));
    EXPECT_EQ(enc(Point{1, -1}), bytes({1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}));
    geo::Segment seg{"s", {{2, 3}}, Color::red};
    EXPECT_EQ(enc(seg), bytes({1, 0, 0, 0, 's', 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 1, 1, 0}));
}

TEST(proc, FixedSizeFastPathMatchesEncoder) {
    // encode() builds argument lists of fixed-size types on the stack; the Encoder writes
    // value by value. Both must give the same bytes.
    using namespace std::chrono_literals;
    std::array<Color, 2> colors{Color::red, Color::blue};
    int16_t c_array[2] = {-2, 2};
    auto pair = std::make_pair(true, std::byte{9});
    auto tuple = std::make_tuple(uint8_t{1}, -1.5, std::array<bool, 2>{false, true}, 7ms);
    Bytes fast = bytes({0xee});
    ASSERT_TRUE(proc::encode(fast, uint64_t{1} << 40, colors, c_array, pair, tuple, 'c'));
    Bytes slow = bytes({0xee});
    proc::Encoder e(slow);
    e(uint64_t{1} << 40, colors, c_array, pair, tuple, 'c');
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(fast, slow);
    EXPECT_EQ(fast.size(), 1u + 8 + 4 + 4 + 2 + 1 + 8 + 2 + 8 + 1);
}

// ---- hostile input ---------------------------------------------------------------------------

template <class T>
void expect_protocol_error(const Bytes& b, const char* what) {
    auto r = proc::decode_as<T>(b);
    ASSERT_FALSE(r) << what;
    EXPECT_EQ(r.error().code(), Errc::protocol_error) << what << ": " << r.error().describe();
    EXPECT_FALSE(r.error().message().empty()) << what;
}

TEST(proc, EveryTruncationFails) {
    Bytes full = enc(sample());
    ASSERT_GT(full.size(), 100u);
    for (std::size_t n = 0; n < full.size(); ++n) {
        Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
        auto r = proc::decode_as<Everything>(prefix);
        ASSERT_FALSE(r) << "a prefix of " << n << " bytes decoded";
        EXPECT_EQ(r.error().code(), Errc::protocol_error) << r.error().describe();
    }
    // Also for the nested standard types alone.
    std::map<std::string, std::vector<std::optional<std::variant<int, std::string>>>> m;
    m["k"] = {1, std::nullopt, std::string("v")};
    Bytes mb = enc(m);
    for (std::size_t n = 0; n < mb.size(); ++n)
        expect_protocol_error<decltype(m)>(Bytes(mb.begin(), mb.begin() + static_cast<long>(n)),
                                           "truncated map");
}

TEST(proc, EveryCorruptionFailsCleanlyOrStaysCanonical) {
    Bytes full = enc(sample());
    for (std::size_t i = 0; i < full.size(); ++i) {
        for (int v : {0x00, 0x01, 0x02, 0x7f, 0x80, 0xff}) {
            Bytes b = full;
            b[i] = static_cast<std::byte>(v);
            auto r = proc::decode_as<Everything>(b);
            if (r) {
                EXPECT_EQ(enc(*r), b) << "byte " << i << " = " << v;
            } else {
                EXPECT_EQ(r.error().code(), Errc::protocol_error) << r.error().describe();
            }
        }
    }
}

TEST(proc, HugeLengthsFailFastWithoutAllocating) {
    const Bytes claim = bytes({0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8});
    AllocCount count;
    auto start = std::chrono::steady_clock::now();
    expect_protocol_error<std::string>(claim, "string");
    expect_protocol_error<std::vector<uint64_t>>(claim, "vector<u64>");
    expect_protocol_error<std::vector<std::byte>>(claim, "vector<byte>");
    expect_protocol_error<std::vector<bool>>(claim, "vector<bool>");
    expect_protocol_error<std::vector<std::string>>(claim, "vector<string>");
    expect_protocol_error<std::vector<Point>>(claim, "vector<user type>");
    expect_protocol_error<std::vector<std::tuple<>>>(claim, "vector<tuple<>>");
    expect_protocol_error<std::map<int, int>>(claim, "map");
    expect_protocol_error<std::unordered_map<std::string, int>>(claim, "unordered_map");
    expect_protocol_error<std::set<std::string>>(claim, "set");
    expect_protocol_error<std::unordered_set<int>>(claim, "unordered_set");
    expect_protocol_error<std::vector<std::vector<int>>>(claim, "vector<vector>");
    // A plausible count (2^24 zero-size user elements) with no bytes behind it.
    expect_protocol_error<std::vector<Point>>(bytes({0, 0, 0, 1}), "2^24 points");
    // The same claim nested inside a value.
    Bytes nested = enc(std::string("ok"));
    nested.insert(nested.end(), claim.begin(), claim.end());
    auto r = proc::decode_as<std::pair<std::string, std::vector<int>>>(nested);
    EXPECT_FALSE(r);
    auto elapsed = std::chrono::steady_clock::now() - start;
    // Error messages allocate a little; nothing like the 4e9 elements claimed.
    EXPECT_LT(count.bytes(), std::size_t{64} << 10);
    EXPECT_LT(elapsed, std::chrono::seconds(2));
}

TEST(proc, LengthBeyondRemainingBytesFails) {
    // 3 elements of 4 bytes claimed, 8 bytes present.
    expect_protocol_error<std::vector<int32_t>>(bytes({3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0}),
                                                "vector short by one element");
    expect_protocol_error<std::string>(bytes({5, 0, 0, 0, 'a', 'b'}), "string short");
}

TEST(proc, BadBoolFails) {
    expect_protocol_error<bool>(bytes({2}), "bool 2");
    expect_protocol_error<bool>(bytes({0xff}), "bool 0xff");
    expect_protocol_error<std::vector<bool>>(bytes({2, 0, 0, 0, 1, 7}), "vector<bool>");
    expect_protocol_error<std::tuple<int8_t, bool>>(bytes({1, 0x80}), "bool in a tuple");
    auto r = proc::decode_as<bool>(bytes({2}));
    EXPECT_NE(r.error().message().find("bool"), std::string::npos);
}

TEST(proc, BadOptionalFlagFails) {
    for (int flag : {2, 0x80, 0xff}) {
        // Exactly one byte, so that only the flag itself can be the error.
        auto r = proc::decode_as<std::optional<int8_t>>(bytes({flag}));
        ASSERT_FALSE(r) << flag;
        EXPECT_EQ(r.error().code(), Errc::protocol_error);
        EXPECT_NE(r.error().message().find("optional's flag"), std::string::npos)
            << r.error().message();
    }
    expect_protocol_error<std::optional<int8_t>>(bytes({1}), "flag 1, no value");
}

TEST(proc, BadVariantIndexFails) {
    using V = std::variant<int8_t, std::string>;
    expect_protocol_error<V>(bytes({2, 0, 0, 0, 0}), "index 2 of 2");
    expect_protocol_error<V>(bytes({0xff, 0xff, 0xff, 0xff}), "index 2^32-1");
    expect_protocol_error<V>(bytes({0, 0, 0}), "short index");
    auto r = proc::decode_as<V>(bytes({7, 0, 0, 0}));
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message().find("variant index 7"), std::string::npos);
}

TEST(proc, UnorderedOrRepeatedKeysFail) {
    // Ordered containers have one encoding per value: keys strictly ascending.
    expect_protocol_error<std::map<uint8_t, uint8_t>>(bytes({2, 0, 0, 0, 2, 0, 1, 0}),
                                                      "map keys descending");
    expect_protocol_error<std::map<uint8_t, uint8_t>>(bytes({2, 0, 0, 0, 1, 0, 1, 5}),
                                                      "map key repeated");
    expect_protocol_error<std::set<uint8_t>>(bytes({2, 0, 0, 0, 1, 1}), "set key repeated");
    expect_protocol_error<std::unordered_map<uint8_t, uint8_t>>(bytes({2, 0, 0, 0, 1, 0, 1, 5}),
                                                                "unordered_map key repeated");
    expect_protocol_error<std::unordered_set<uint8_t>>(bytes({2, 0, 0, 0, 4, 4}),
                                                       "unordered_set key repeated");
    // Any order is fine for unordered containers.
    auto r = proc::decode_as<std::unordered_map<uint8_t, uint8_t>>(bytes({2, 0, 0, 0, 2, 0, 1, 0}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->size(), 2u);
}

TEST(proc, TrailingBytesFail) {
    Bytes b = enc(uint16_t{1});
    b.push_back(std::byte{0});
    b.push_back(std::byte{0});
    b.push_back(std::byte{0});
    auto r = proc::decode_as<uint16_t>(b);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::protocol_error);
    EXPECT_NE(r.error().message().find("3 trailing bytes"), std::string::npos)
        << r.error().message();
    uint16_t x = 0;
    EXPECT_FALSE(proc::decode(b, {}, x));
}

TEST(proc, FirstErrorWinsAndLaterReadsYieldZeros) {
    const Bytes in = bytes({2, 5, 6});  // the Decoder borrows it
    proc::Decoder d(in);
    bool flag = true;
    uint8_t after = 9;
    d(flag, after);
    EXPECT_FALSE(d.ok());
    EXPECT_NE(d.error().message().find("bool"), std::string::npos);
    EXPECT_EQ(after, 0);
    EXPECT_EQ(d.remaining(), 0u);
}

TEST(proc, NestingDepthIsLimited) {
    // The deepest allowed chain round-trips; one level more fails on both sides.
    Node ok = chain(proc::kMaxDepth);
    EXPECT_EQ(round_trip(ok), ok);
    Bytes out = bytes({0x5a});
    auto r = proc::encode(out, chain(proc::kMaxDepth + 1));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::invalid_argument);
    EXPECT_EQ(out, bytes({0x5a}));  // left as it was

    // A hostile encoding of a chain 100000 deep (tag 0, count 1, tag 0, count 1, ...): the
    // decoder stops at kMaxDepth instead of running off its stack.
    Bytes deep;
    for (int i = 0; i < 100000; ++i) {
        deep.push_back(std::byte{0});
        for (int v : {1, 0, 0, 0})
            deep.push_back(static_cast<std::byte>(v));
    }
    auto d = proc::decode_as<Node>(deep);
    ASSERT_FALSE(d);
    EXPECT_EQ(d.error().code(), Errc::protocol_error);
    EXPECT_NE(d.error().message().find("nested deeper"), std::string::npos);
}

TEST(proc, LengthAbove32BitsFailsEncodingAndLeavesOutput) {
    Bytes out = bytes({1, 2});
    auto r = proc::encode(out, uint8_t{3}, HugeClaim{});
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::message_too_large);
    EXPECT_EQ(out, bytes({1, 2}));
}

// Copying it throws: the way to get a valueless variant.
struct Throws {
    Throws() = default;
    Throws(const Throws&) { throw 1; }
    Throws& operator=(const Throws&) = default;
    template <class Archive>
    void serialize(Archive&) {}
};

TEST(proc, ValuelessVariantFailsEncoding) {
    std::variant<int, Throws> v;
    try {
        Throws t;
        v.emplace<1>(t);
    } catch (int) {
    }
    ASSERT_TRUE(v.valueless_by_exception());
    Bytes out;
    auto r = proc::encode(out, v);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::invalid_argument);
    EXPECT_TRUE(out.empty());
}

// ---- cost ------------------------------------------------------------------------------------

TEST(proc, ScalarsAllocateNothingBeyondTheOutput) {
    Bytes out;
    out.reserve(64);
    int32_t a = 0;
    int64_t b = 0;
    AllocCount count;
    for (int i = 0; i < 4; ++i) {
        out.clear();
        ASSERT_TRUE(proc::encode(out));
        ASSERT_TRUE(proc::encode(out, int32_t{i}, int64_t{-i}));
        ASSERT_TRUE(proc::decode(out, {}, a, b));
        EXPECT_EQ(a, i);
        EXPECT_EQ(b, -i);
        ASSERT_TRUE(proc::decode(std::span<const std::byte>{}, {}));
        auto r = proc::decode_as<std::pair<int32_t, int64_t>>(out);
        ASSERT_TRUE(r);
    }
    EXPECT_EQ(count.calls(), 0u);
}

TEST(proc, RepeatedAppendsGrowGeometrically) {
    Bytes out;
    AllocCount count;
    for (int i = 0; i < 10000; ++i)
        ASSERT_TRUE(proc::encode(out, int32_t{i}));
    EXPECT_EQ(out.size(), 40000u);
    EXPECT_LT(count.calls(), 40u);
}

// ---- encoding in place (into a send buffer's room) ------------------------------------------

/// Appends to the encoder's vector directly (as a bulk handle does): in room mode, what was
/// written so far moves to the vector first.
struct AppendsDirectly {
    uint8_t tag = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        if constexpr (Archive::encoding) {
            ar.buffer().push_back(std::byte{tag});
        } else {
            ar(tag);
        }
    }
};

TEST(proc, EncodeIntoWritesInTheRoomWhenItFits) {
    std::array<std::byte, 64> room{};
    Bytes spill = bytes({1, 2, 3});
    std::string s = "in place";
    std::vector<int32_t> v{1, 2, 3};
    AllocCount count;
    auto r = proc::encode_into(room, spill, int32_t{7}, s, v);
    EXPECT_EQ(count.calls(), 0u) << "encoding into a room that fits allocated";
    ASSERT_TRUE(r);
    EXPECT_EQ(r->data(), room.data()) << "not written in place";
    EXPECT_EQ(Bytes(r->begin(), r->end()), enc(int32_t{7}, s, v));
    EXPECT_TRUE(spill.empty()) << "the spill buffer is cleared";
    // All fixed-size values: the same, through the stack-free path.
    auto f = proc::encode_into(room, spill, int64_t{-1}, 2.5, Point{3, 4});
    ASSERT_TRUE(f);
    EXPECT_EQ(f->data(), room.data());
    EXPECT_EQ(Bytes(f->begin(), f->end()), enc(int64_t{-1}, 2.5, Point{3, 4}));
    auto none = proc::encode_into(room, spill);
    ASSERT_TRUE(none);
    EXPECT_TRUE(none->empty());
}

TEST(proc, EncodeIntoSpillsWhatOutgrowsTheRoom) {
    std::array<std::byte, 16> room{};
    Bytes spill;
    std::string big(40, 'x');
    auto r = proc::encode_into(room, spill, int32_t{1}, big, int32_t{2});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->data(), spill.data()) << "bytes that outgrow the room come from the spill";
    EXPECT_EQ(Bytes(r->begin(), r->end()), enc(int32_t{1}, big, int32_t{2}));
    auto f = proc::encode_into(std::span<std::byte>(room).first(4), spill, int64_t{5});
    ASSERT_TRUE(f);
    EXPECT_EQ(Bytes(f->begin(), f->end()), enc(int64_t{5}));
    // A type that appends to the vector itself: the encoding continues there, in order.
    auto d = proc::encode_into(room, spill, int32_t{9}, AppendsDirectly{0x5a}, int32_t{10});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->data(), spill.data());
    EXPECT_EQ(Bytes(d->begin(), d->end()), enc(int32_t{9}, AppendsDirectly{0x5a}, int32_t{10}));
}

TEST(proc, EncodeIntoReportsEncodeErrors) {
    std::array<std::byte, 64> room{};
    Bytes spill;
    Node deep = chain(proc::kMaxDepth + 1);
    auto r = proc::encode_into(room, spill, deep);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), talaria::Errc::invalid_argument);
}

}  // namespace
