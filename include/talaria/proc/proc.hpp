// proc: what turns values into bytes and back -- the dispatch behind Encoder/Decoder, the
// standard types supported out of the box, and the top-level encode/decode helpers.
//
// Each value is serialized by the first of these that applies:
//   1. arithmetic types: fixed width, little-endian (bool: one byte, 0 or 1);
//   2. enums with a fixed underlying type: as the underlying type;
//   3. the standard types below (std::string, vector, array, map, set, optional, variant, ...);
//   4. a member `template <class Archive> void serialize(Archive& ar)`;
//   5. a free `serialize(Archive& ar, T& v)` found by argument-dependent lookup.
// The byte layout of every type is in docs/protocol.md ("proc"). Everything here is inline: an
// encoding of two ints is two memcpy calls into the output vector.
//
// Why encoding takes `const T&` but calls `serialize(Archive&, T&)`: one function serves both
// directions, so it cannot take a const object. The Encoder hands it the object through a
// const_cast; that is safe because with an Encoder the function only reads (every Encoder
// operation takes its arguments by value or const reference), and writing through the result
// of a const_cast is the only thing that would be undefined. A serialize function must
// therefore not modify the object when `Archive::encoding`.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "talaria/proc/archive.hpp"
#include "talaria/util/result.hpp"

namespace talaria::proc {

namespace detail {

template <class>
inline constexpr bool kAlwaysFalse = false;

// An enum can be list-initialized from its underlying type only when that type is fixed
// (`enum class E`, `enum E : uint8_t`). Only then is every value of the underlying type a
// valid E, so only then may a decoder store whatever integer the wire carries.
template <class T>
concept FixedEnum = std::is_enum_v<T> && requires {
    T{std::underlying_type_t<T>{}};
};

// Types whose every bit pattern is a valid value: copied in bulk by memcpy.
// (bool is not one: only 0 and 1 are valid.)
template <class T>
inline constexpr bool kBitwise = (std::is_arithmetic_v<T> && !std::is_same_v<T, bool> &&
                                  !std::is_same_v<T, long double>) ||
                                 FixedEnum<T>;

template <class T>
concept MemberEncode = requires(T& v, Encoder& e) {
    v.serialize(e);
};
template <class T>
concept MemberDecode = requires(T& v, Decoder& d) {
    v.serialize(d);
};

namespace adl {
// Stops unqualified lookup here, so only argument-dependent lookup finds `serialize`.
void serialize() = delete;

template <class T, class Archive>
concept Has = requires(Archive& ar, T& v) {
    serialize(ar, v);
};

template <class Archive, class T>
inline void call(Archive& ar, T& v) {
    serialize(ar, v);
}
}  // namespace adl

/// The codec of one type: kSupported (both directions work), kMinSize (the fewest bytes any
/// value encodes to; 0 when unknown), encode() and decode(). The primary template covers
/// scalars and user types; the standard types are partial specializations below.
template <class T>
struct Codec {
    static constexpr bool kArithmetic = std::is_arithmetic_v<T> && !std::is_same_v<T, long double>;
    static constexpr bool kEnum = FixedEnum<T>;
    static constexpr bool kUserType = std::is_class_v<T> || std::is_union_v<T>;
    static constexpr bool kEncodable = MemberEncode<T> || adl::Has<T, Encoder>;
    static constexpr bool kDecodable = MemberDecode<T> || adl::Has<T, Decoder>;
    // const elements (pair<const K, V>) can be encoded but not decoded into.
    static constexpr bool kSupported =
        !std::is_const_v<T> && (kArithmetic || kEnum || (kUserType && kEncodable && kDecodable));

    static constexpr std::size_t min_size() noexcept {
        if constexpr (kArithmetic || kEnum)
            return sizeof(T);
        else
            return 0;  // user types: unknown (so containers of them never reserve by count)
    }
    static constexpr std::size_t kMinSize = min_size();

    // Reached only for a type that cannot be serialized (in this direction): say why.
    static void unsupported() {
        static_assert(!std::is_same_v<T, long double>,
                      "talaria::proc: long double has no portable layout (padding bytes, "
                      "80/128-bit formats); send a double");
        static_assert(!std::is_enum_v<T>,
                      "talaria::proc: give the enum a fixed underlying type (`enum class E` or "
                      "`enum E : uint32_t`) so that every value on the wire is a valid E");
        static_assert(!std::is_pointer_v<T>,
                      "talaria::proc: pointers cannot be serialized; send the value, or a "
                      "bulk::Handle for memory");
        static_assert(std::is_same_v<T, long double> || std::is_enum_v<T> || std::is_pointer_v<T> ||
                          kAlwaysFalse<T>,
                      "talaria::proc: no serialization for this type (in this direction): give "
                      "it a member `template <class Archive> void serialize(Archive& ar)` or a "
                      "free `template <class Archive> void serialize(Archive& ar, T& v)` in its "
                      "namespace");
    }

    static void encode(Encoder& e, const T& v) {
        if constexpr (kArithmetic) {
            static_assert(!std::is_same_v<T, bool> || sizeof(bool) == 1);
            e.write(v);
        } else if constexpr (kEnum) {
            e.write(static_cast<std::underlying_type_t<T>>(v));
        } else if constexpr (kUserType && MemberEncode<T>) {
            if (!e.enter_nested()) return;
            const_cast<T&>(v).serialize(e);  // safe: an Encoder only reads (see the top)
            e.leave_nested();
        } else if constexpr (kUserType && adl::Has<T, Encoder>) {
            if (!e.enter_nested()) return;
            adl::call(e, const_cast<T&>(v));  // safe: an Encoder only reads (see the top)
            e.leave_nested();
        } else {
            unsupported();
        }
    }

    static void decode(Decoder& d, T& v) {
        if constexpr (kArithmetic) {
            v = d.read<T>();
        } else if constexpr (kEnum) {
            v = static_cast<T>(d.read<std::underlying_type_t<T>>());
        } else if constexpr (kUserType && MemberDecode<T>) {
            if (!d.enter_nested()) return;
            v.serialize(d);
            d.leave_nested();
        } else if constexpr (kUserType && adl::Has<T, Decoder>) {
            if (!d.enter_nested()) return;
            adl::call(d, v);
            d.leave_nested();
        } else {
            unsupported();
        }
    }
};

// Containers decode into default-constructed elements.
template <class T>
inline constexpr bool kElement = std::default_initializable<T>&& Codec<T>::kSupported;

// Most elements reserved at once, in bytes of element storage: a length is already bounded
// by the bytes that remain, but an element can be much larger in memory than on the wire
// (an optional of a large array encodes to one byte); beyond this, the vector grows as the
// elements actually arrive.
inline constexpr std::size_t kMaxReserveBytes = std::size_t{1} << 20;

template <class T>
inline void reserve_for(std::vector<T>& v, std::size_t n) {
    if constexpr (Codec<T>::kMinSize > 0)
        v.reserve(std::min(n, std::max<std::size_t>(1, kMaxReserveBytes / sizeof(T))));
}

// The fewest bytes of a sequence of values.
template <class... T>
inline constexpr std::size_t kSumMinSize = (std::size_t{0} + ... + Codec<T>::kMinSize);

// ---- strings -------------------------------------------------------------------------------
// u32 count of code units, then the units (1 byte each for std::string).
template <class C, class Traits, class A>
requires kBitwise<C>
struct Codec<std::basic_string<C, Traits, A>> {
    using T = std::basic_string<C, Traits, A>;
    static constexpr bool kSupported = true;
    static constexpr std::size_t kMinSize = 4;
    static void encode(Encoder& e, const T& s) {
        e.write_length(s.size());
        if (e.ok()) e.write_bytes(s.data(), s.size() * sizeof(C));
    }
    static void decode(Decoder& d, T& s) {
        std::size_t n = d.read_length(sizeof(C));
        auto bytes = d.take(n * sizeof(C));
        if (!d.ok()) {
            s.clear();
            return;
        }
        if constexpr (std::is_same_v<C, char>) {
            s.assign(reinterpret_cast<const char*>(bytes.data()), n);  // char may alias bytes
        } else {
            s.resize(n);  // wider units: the input may not be aligned for C
            if (n) std::memcpy(s.data(), bytes.data(), bytes.size());
        }
    }
};

// ---- vector --------------------------------------------------------------------------------
// u32 count, then the elements (bitwise element types as one block of count*sizeof bytes).
template <class E, class A>
struct Codec<std::vector<E, A>> {
    using T = std::vector<E, A>;
    static constexpr bool kSupported = kElement<E>;
    static constexpr std::size_t kMinSize = 4;
    static void encode(Encoder& e, const T& v) {
        e.write_length(v.size());
        if (!e.ok()) return;
        if constexpr (kBitwise<E>) {
            e.write_bytes(v.data(), v.size() * sizeof(E));
        } else {
            for (const auto& x : v)
                Codec<E>::encode(e, x);  // also vector<bool>'s proxies
        }
    }
    static void decode(Decoder& d, T& v) {
        std::size_t n = d.read_length(Codec<E>::kMinSize);
        v.clear();
        if constexpr (kBitwise<E>) {
            // n <= remaining()/sizeof(E): take() cannot fail, and the size is what was sent.
            auto bytes = d.take(n * sizeof(E));
            if (!d.ok()) return;
            if constexpr (std::is_same_v<E, std::byte>) {
                v.assign(bytes.begin(), bytes.end());
            } else {
                v.resize(n);
                if (n) std::memcpy(v.data(), bytes.data(), bytes.size());
            }
        } else if constexpr (std::is_same_v<E, bool>) {
            reserve_for(v, n);
            for (std::size_t i = 0; i < n && d.ok(); ++i)
                v.push_back(d.read<bool>());
            if (!d.ok()) v.clear();
        } else {
            reserve_for(v, n);
            for (std::size_t i = 0; i < n && d.ok(); ++i)
                Codec<E>::decode(d, v.emplace_back());
            if (!d.ok()) v.clear();
        }
    }
};

// ---- fixed-size arrays -------------------------------------------------------------------
// N elements, no count (both sides know N).
template <class E, std::size_t N>
struct ArrayCodec {
    static constexpr bool kSupported = Codec<E>::kSupported;
    static constexpr std::size_t kMinSize = N * Codec<E>::kMinSize;
    static void encode(Encoder& e, const E* p) {
        if constexpr (kBitwise<E>) {
            e.write_bytes(p, N * sizeof(E));
        } else {
            for (std::size_t i = 0; i < N; ++i)
                Codec<E>::encode(e, p[i]);
        }
    }
    static void decode(Decoder& d, E* p) {
        if constexpr (kBitwise<E>) {
            d.read_bytes(p, N * sizeof(E));
        } else {
            for (std::size_t i = 0; i < N; ++i)
                Codec<E>::decode(d, p[i]);
        }
    }
};

template <class E, std::size_t N>
struct Codec<std::array<E, N>> {
    using T = std::array<E, N>;
    static constexpr bool kSupported = ArrayCodec<E, N>::kSupported;
    static constexpr std::size_t kMinSize = ArrayCodec<E, N>::kMinSize;
    static void encode(Encoder& e, const T& v) { ArrayCodec<E, N>::encode(e, v.data()); }
    static void decode(Decoder& d, T& v) { ArrayCodec<E, N>::decode(d, v.data()); }
};

template <class E, std::size_t N>
struct Codec<E[N]> {
    static constexpr bool kSupported = ArrayCodec<E, N>::kSupported;
    static constexpr std::size_t kMinSize = ArrayCodec<E, N>::kMinSize;
    static void encode(Encoder& e, const E (&v)[N]) { ArrayCodec<E, N>::encode(e, v); }
    static void decode(Decoder& d, E (&v)[N]) { ArrayCodec<E, N>::decode(d, v); }
};

// ---- pair and tuple ------------------------------------------------------------------------
// The members in order, nothing else.
template <class A, class B>
struct Codec<std::pair<A, B>> {
    using T = std::pair<A, B>;
    static constexpr bool kSupported = Codec<A>::kSupported && Codec<B>::kSupported;
    static constexpr std::size_t kMinSize = kSumMinSize<A, B>;
    static void encode(Encoder& e, const T& v) {
        Codec<A>::encode(e, v.first);
        Codec<B>::encode(e, v.second);
    }
    static void decode(Decoder& d, T& v) {
        Codec<A>::decode(d, v.first);
        Codec<B>::decode(d, v.second);
    }
};

template <class... E>
struct Codec<std::tuple<E...>> {
    using T = std::tuple<E...>;
    static constexpr bool kSupported = (true && ... && Codec<E>::kSupported);
    static constexpr std::size_t kMinSize = kSumMinSize<E...>;
    // [&]: an empty tuple's lambda uses neither (clang's -Wunused-lambda-capture).
    static void encode(Encoder& e, const T& v) {
        std::apply([&](const E&... x) { (Codec<E>::encode(e, x), ...); }, v);
    }
    static void decode(Decoder& d, T& v) {
        std::apply([&](E&... x) { (Codec<E>::decode(d, x), ...); }, v);
    }
};

// ---- optional ------------------------------------------------------------------------------
// u8 flag (0 empty, 1 present; anything else is an error), then the value if present.
template <class E>
struct Codec<std::optional<E>> {
    using T = std::optional<E>;
    static constexpr bool kSupported = kElement<E>;
    static constexpr std::size_t kMinSize = 1;
    static void encode(Encoder& e, const T& v) {
        e.write(static_cast<uint8_t>(v.has_value()));
        if (v) Codec<E>::encode(e, *v);
    }
    static void decode(Decoder& d, T& v) {
        auto flag = d.read<uint8_t>();
        if (flag == 1) {
            Codec<E>::decode(d, v.emplace());
            if (!d.ok()) v.reset();
            return;
        }
        v.reset();
        if (flag > 1)
            d.fail(Errc::protocol_error, "proc: an optional's flag must be 0 or 1, not " +
                                             std::to_string(unsigned{flag}));
    }
};

// ---- variant -------------------------------------------------------------------------------
// u32 index of the alternative (checked against the number of alternatives), then its value.
template <>
struct Codec<std::monostate> {
    static constexpr bool kSupported = true;
    static constexpr std::size_t kMinSize = 0;
    static void encode(Encoder&, const std::monostate&) noexcept {}
    static void decode(Decoder&, std::monostate&) noexcept {}
};

template <class... E>
struct Codec<std::variant<E...>> {
    using T = std::variant<E...>;
    static constexpr bool kSupported = (true && ... && kElement<E>);
    static constexpr std::size_t kMinSize = 4;
    static void encode(Encoder& e, const T& v) {
        if (v.valueless_by_exception()) {
            e.fail(Errc::invalid_argument, "proc: a valueless variant cannot be encoded");
            return;
        }
        e.write(static_cast<uint32_t>(v.index()));
        std::visit([&e](const auto& x) { Codec<std::remove_cvref_t<decltype(x)>>::encode(e, x); },
                   v);
    }
    static void decode(Decoder& d, T& v) {
        auto index = d.read<uint32_t>();
        if (!d.ok()) return;
        if (index >= sizeof...(E)) {
            d.fail(Errc::protocol_error, "proc: variant index " + std::to_string(index) +
                                             " but only " + std::to_string(sizeof...(E)) +
                                             " alternatives");
            return;
        }
        decode_index(d, v, index, std::index_sequence_for<E...>{});
    }

  private:
    template <std::size_t... I>
    static void decode_index(Decoder& d, T& v, uint32_t index, std::index_sequence<I...>) {
        (void)((index == I ? (decode_alternative<I>(d, v), true) : false) || ...);
    }
    template <std::size_t I>
    static void decode_alternative(Decoder& d, T& v) {
        using A = std::variant_alternative_t<I, T>;
        Codec<A>::decode(d, v.template emplace<I>());
    }
};

// ---- maps and sets -------------------------------------------------------------------------
// u32 count, then the entries (key then value for maps). Ordered containers are written in
// their order, and decoding requires strictly ascending keys, so each value has exactly one
// encoding and duplicates cannot arrive; unordered ones come in any order, without duplicates.
/// map, set, unordered_map and unordered_set share one codec; `V` is void for the sets.
template <class T, class K, class V, bool kOrdered>
struct KeyedCodec {
    static constexpr bool kIsMap = !std::is_void_v<V>;
    using Value = std::conditional_t<kIsMap, V, char>;  // char: a placeholder for sets
    static constexpr bool kSupported = kElement<K> && (!kIsMap || kElement<Value>);
    static constexpr std::size_t kMinSize = 4;
    static constexpr std::size_t entry_min_size() {
        if constexpr (kIsMap)
            return kSumMinSize<K, Value>;
        else
            return Codec<K>::kMinSize;
    }
    static const K& key_of(const typename T::value_type& x) {
        if constexpr (kIsMap)
            return x.first;
        else
            return x;
    }

    static void encode(Encoder& e, const T& c) {
        e.write_length(c.size());
        if (!e.ok()) return;
        for (const auto& x : c) {
            Codec<K>::encode(e, key_of(x));
            if constexpr (kIsMap) Codec<V>::encode(e, x.second);
        }
    }
    static void decode(Decoder& d, T& c) {
        std::size_t n = d.read_length(entry_min_size());
        c.clear();
        if constexpr (!kOrdered && entry_min_size() > 0)
            c.reserve(std::min<std::size_t>(n, kMaxReserveBytes / 64));
        for (std::size_t i = 0; i < n && d.ok(); ++i) {
            K k{};
            [[maybe_unused]] Value v{};
            Codec<K>::decode(d, k);
            if constexpr (kIsMap) Codec<V>::decode(d, v);
            if (!d.ok()) break;
            if (!insert(c, std::move(k), std::move(v))) {
                const char* kind = kIsMap ? "map" : "set";
                d.fail(Errc::protocol_error,
                       kOrdered
                           ? fmt_msg("proc: ", kind, " keys out of order or repeated at entry ", i)
                           : fmt_msg("proc: repeated key in an unordered ", kind, " at entry ", i));
                break;
            }
        }
        if (!d.ok()) c.clear();
    }

  private:
    /// Ordered: only strictly after the last key (one encoding per value); unordered: no repeat.
    static bool insert(T& c, K&& k, [[maybe_unused]] Value&& v) {
        if constexpr (kOrdered) {
            if (!c.empty() && !c.key_comp()(key_of(*std::prev(c.end())), k)) return false;
            if constexpr (kIsMap)
                c.emplace_hint(c.end(), std::move(k), std::move(v));
            else
                c.emplace_hint(c.end(), std::move(k));
            return true;
        } else if constexpr (kIsMap) {
            return c.try_emplace(std::move(k), std::move(v)).second;
        } else {
            return c.insert(std::move(k)).second;
        }
    }
    static std::string fmt_msg(const char* a, const char* kind, const char* b, std::size_t i) {
        return std::string(a) + kind + b + std::to_string(i);
    }
};

template <class K, class V, class C, class A>
struct Codec<std::map<K, V, C, A>> : KeyedCodec<std::map<K, V, C, A>, K, V, true> {};
template <class K, class C, class A>
struct Codec<std::set<K, C, A>> : KeyedCodec<std::set<K, C, A>, K, void, true> {};
template <class K, class V, class H, class Eq, class A>
struct Codec<std::unordered_map<K, V, H, Eq, A>>
    : KeyedCodec<std::unordered_map<K, V, H, Eq, A>, K, V, false> {};
template <class K, class H, class Eq, class A>
struct Codec<std::unordered_set<K, H, Eq, A>>
    : KeyedCodec<std::unordered_set<K, H, Eq, A>, K, void, false> {};

// ---- durations -----------------------------------------------------------------------------
// The count, as its representation type (i64 for std::chrono::nanoseconds ... hours). The
// period is not on the wire: both sides use the same duration type.
template <class Rep, class Period>
struct Codec<std::chrono::duration<Rep, Period>> {
    using T = std::chrono::duration<Rep, Period>;
    static constexpr bool kSupported = Codec<Rep>::kSupported;
    static constexpr std::size_t kMinSize = Codec<Rep>::kMinSize;
    static void encode(Encoder& e, const T& v) { Codec<Rep>::encode(e, v.count()); }
    static void decode(Decoder& d, T& v) {
        Rep r{};
        Codec<Rep>::decode(d, r);
        v = T(r);
    }
};

// ---- fixed-size fast path ------------------------------------------------------------------
// Types whose encoding always has the same size (scalars, and arrays, pairs, tuples and
// durations of them): an argument list of only these is built on the stack and appended to the
// output at once, instead of value by value. kFixedSize is 0 for every other type.
template <class T>
struct FixedSize : std::integral_constant<std::size_t, 0> {};
template <class T>
inline constexpr bool kScalar =
    (std::is_arithmetic_v<T> && !std::is_same_v<T, long double>) || FixedEnum<T>;
template <class T>
requires kScalar<T>
struct FixedSize<T> : std::integral_constant<std::size_t, sizeof(T)> {
};
template <class T>
inline constexpr std::size_t kFixedSize = FixedSize<T>::value;

template <class... T>
inline constexpr bool kAllFixed = (true && ... && (kFixedSize<T> > 0));
template <class... T>
inline constexpr std::size_t kSumFixedSize = (std::size_t{0} + ... + kFixedSize<T>);

template <class E, std::size_t N>
requires(kFixedSize<E> > 0 && N > 0) struct FixedSize<std::array<E, N>>
    : std::integral_constant<std::size_t, N * kFixedSize<E>> {
};
template <class E, std::size_t N>
requires(kFixedSize<E> > 0 && N > 0) struct FixedSize<E[N]>
    : std::integral_constant<std::size_t, N * kFixedSize<E>> {
};
template <class A, class B>
requires kAllFixed<A, B>
struct FixedSize<std::pair<A, B>> : std::integral_constant<std::size_t, kSumFixedSize<A, B>> {
};
template <class... E>
requires(sizeof...(E) > 0 && kAllFixed<E...>) struct FixedSize<std::tuple<E...>>
    : std::integral_constant<std::size_t, kSumFixedSize<E...>> {
};
template <class Rep, class Period>
requires(kFixedSize<Rep> > 0) struct FixedSize<std::chrono::duration<Rep, Period>>
    : std::integral_constant<std::size_t, kFixedSize<Rep>> {
};

// Store the encoding of a fixed-size value at p (exactly kFixedSize<T> bytes) and advance p.
template <class T>
inline void put_fixed(std::byte*& p, const T& v) noexcept {
    if constexpr (kScalar<T>) {
        std::memcpy(p, &v, sizeof v);  // bool is one byte, 0 or 1, as on the wire
        p += sizeof v;
    } else if constexpr (std::is_array_v<T>) {
        for (const auto& x : v)
            put_fixed(p, x);
    } else if constexpr (requires {
                             typename T::value_type;
                             std::tuple_size<T>::value;
                         }) {
        for (const auto& x : v)
            put_fixed(p, x);  // std::array
    } else if constexpr (requires { v.count(); }) {
        put_fixed(p, v.count());
    } else {
        std::apply([&p](const auto&... x) { (put_fixed(p, x), ...); }, v);  // pair, tuple
    }
}

}  // namespace detail

/// True when T (ignoring const and references) can be both encoded and decoded.
template <class T>
concept Serializable = detail::Codec<std::remove_cvref_t<T>>::kSupported;

/// The fewest bytes any value of T encodes to (0 when unknown, as for user types).
template <class T>
constexpr std::size_t min_encoded_size() noexcept {
    return detail::Codec<std::remove_cvref_t<T>>::kMinSize;
}

template <class... T>
inline Encoder& Encoder::operator()(T&&... v) {
    (detail::Codec<std::remove_cvref_t<T>>::encode(*this, v), ...);
    return *this;
}

template <class... T>
inline Decoder& Decoder::operator()(T&... v) {
    static_assert((true && ... && !std::is_const_v<T>), "talaria::proc: cannot decode into const");
    (detail::Codec<std::remove_cv_t<T>>::decode(*this, v), ...);
    return *this;
}

/// Append the encodings of `v...` to `out`. Fails only for a length above 2^32-1 (or nesting
/// deeper than kMaxDepth, or a valueless variant); `out` is then left as it was.
template <class... T>
inline Result<void> encode(std::vector<std::byte>& out, const T&... v) {
    if constexpr (sizeof...(T) == 0) {
        return {};
    } else if constexpr (detail::kAllFixed<T...>) {
        // Cannot fail: no lengths, no user types. Built on the stack, appended at once.
        std::array<std::byte, detail::kSumFixedSize<T...>> buf;
        std::byte* p = buf.data();
        (detail::put_fixed(p, v), ...);
        detail::append_bytes(out, buf.data(), buf.size());
        return {};
    } else {
        // Room for the fixed part at once, keeping geometric growth for repeated appends.
        constexpr std::size_t kMin = (std::size_t{0} + ... + min_encoded_size<T>());
        std::size_t start = out.size();
        if (out.capacity() - start < kMin) out.reserve(std::max(start + kMin, 2 * start));
        Encoder e(out);
        e(v...);
        if (!e.ok()) [[unlikely]] {
            out.resize(start);
            return e.error();
        }
        return {};
    }
}

/// Encode `v...` straight into `room` (a send buffer) when they fit: returns the prefix of
/// `room` written. When they do not fit, into `spill` (cleared first): returns all of `spill`.
/// Nothing is allocated when they fit. The errors are encode()'s.
template <class... T>
inline Result<std::span<const std::byte>> encode_into(std::span<std::byte> room,
                                                      std::vector<std::byte>& spill,
                                                      const T&... v) {
    if constexpr (sizeof...(T) == 0) {
        return std::span<const std::byte>(room.data(), 0);
    } else if constexpr (detail::kAllFixed<T...>) {
        constexpr std::size_t kSize = detail::kSumFixedSize<T...>;
        if (room.size() >= kSize) [[likely]] {
            std::byte* p = room.data();
            (detail::put_fixed(p, v), ...);
            return std::span<const std::byte>(room.data(), kSize);
        }
        spill.clear();
        TALARIA_CHECK(encode(spill, v...));
        return std::span<const std::byte>(spill);
    } else {
        Encoder e(room, spill);
        e(v...);
        if (!e.ok()) [[unlikely]]
            return e.error();
        if (e.in_place()) return std::span<const std::byte>(room.data(), e.in_place_size());
        return std::span<const std::byte>(spill);
    }
}

/// Decode `v...` from `in`, which must hold exactly their encodings: trailing bytes are a
/// protocol_error. On error the values are in a valid but unspecified state.
template <class... T>
inline Result<void> decode(std::span<const std::byte> in, const DecodeContext& ctx, T&... v) {
    Decoder d(in, ctx);
    d(v...);
    if (!d.ok()) [[unlikely]]
        return d.error();
    if (d.remaining() != 0) [[unlikely]]
        return Error(Errc::protocol_error, "proc: " + std::to_string(d.remaining()) +
                                               " trailing bytes after the last value (at offset " +
                                               std::to_string(d.position()) + ")");
    return {};
}

/// Decode one T (default-constructed, then filled) from exactly the bytes of `in`.
template <class T>
inline Result<T> decode_as(std::span<const std::byte> in, const DecodeContext& ctx = {}) {
    static_assert(Serializable<T>, "talaria::proc: decode_as<T> needs a Serializable T");
    static_assert(std::default_initializable<T>, "talaria::proc: decode_as<T> builds a T{} first");
    T v{};
    if (auto r = decode(in, ctx, v); !r) [[unlikely]]
        return std::move(r).error();
    return v;
}

}  // namespace talaria::proc

#pragma GCC visibility pop
