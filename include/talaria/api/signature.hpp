// The signature of a procedure, R(Args...), spelled the same way in every process and hashed at
// compile time: a call carries the caller's hash, a procedure defined with Engine::define keeps
// its own, and a target whose hash differs answers invalid_argument instead of decoding the
// arguments as the wrong types (docs/protocol.md, "Signatures").
//
// The spelling names what the proc encoding depends on, not how a compiler prints a type:
// integers by width and sign ("i32", "u64"), "f32"/"f64", "bool", "char", "byte", "string",
// "vector<T>", "array<T,N>" (and T[N]), "pair<A,B>", "tuple<...>", "optional<T>",
// "variant<...>", "monostate", "map<K,V>"/"set<K>" (ordered or not: the same bytes),
// "duration<Rep,num/den>". Any other type (a user's struct or enum, talaria::Bulk) is spelled by
// its qualified name as the compiler prints it (GCC and clang agree for classes that are not
// templates). References and cv-qualifiers do not count. So `int(int, int)` is "i32(i32,i32)",
// and a caller's float(float, float) against it is refused.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

namespace talaria::detail {

/// The qualified name of T as the compiler prints it (from __PRETTY_FUNCTION__).
template <class T>
constexpr std::string_view type_name() noexcept {
    std::string_view p = __PRETTY_FUNCTION__;
    auto start = p.find("T = ");
    if (start == std::string_view::npos) return "?";
    start += 4;
    auto end = p.find_first_of(";]", start);
    return p.substr(start, end - start);
}

/// 64-bit FNV-1a over the spelling, fed piece by piece.
struct SignatureHash {
    uint64_t h = 14695981039346656037ull;
    constexpr void operator()(std::string_view s) noexcept {
        for (char c : s) {
            h ^= static_cast<uint8_t>(c);
            h *= 1099511628211ull;
        }
    }
};
/// The spelling itself, for messages.
struct SignatureText {
    std::string s;
    void operator()(std::string_view v) { s += v; }
};

template <class Sink>
constexpr void spell_number(Sink& out, uint64_t n) {
    char digits[20] = {};
    int i = 20;
    do {
        digits[--i] = static_cast<char>('0' + n % 10);
        n /= 10;
    } while (n != 0);
    out(std::string_view(digits + i, std::size_t(20 - i)));
}

template <class T, class Sink>
constexpr void spell(Sink& out);

template <class... T, class Sink>
constexpr void spell_list(Sink& out) {
    bool first = true;
    ((out(first ? "" : ","), spell<T>(out), first = false), ...);
}

template <class T>
struct Spelling {  // a user's type: its name
    template <class Sink>
    static constexpr void to(Sink& out) {
        out(type_name<T>());
    }
};
template <class C, class Tr, class A>
struct Spelling<std::basic_string<C, Tr, A>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        if constexpr (std::is_same_v<C, char>) {
            out("string");
        } else {
            out("string<");
            spell<C>(out);
            out(">");
        }
    }
};
template <class E, class A>
struct Spelling<std::vector<E, A>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("vector<");
        spell<E>(out);
        out(">");
    }
};
template <class E, std::size_t N>
struct Spelling<std::array<E, N>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("array<");
        spell<E>(out);
        out(",");
        spell_number(out, N);
        out(">");
    }
};
template <class E, std::size_t N>
struct Spelling<E[N]> : Spelling<std::array<E, N>> {};
template <class A, class B>
struct Spelling<std::pair<A, B>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("pair<");
        spell_list<A, B>(out);
        out(">");
    }
};
template <class... E>
struct Spelling<std::tuple<E...>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("tuple<");
        spell_list<E...>(out);
        out(">");
    }
};
template <class E>
struct Spelling<std::optional<E>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("optional<");
        spell<E>(out);
        out(">");
    }
};
template <class... E>
struct Spelling<std::variant<E...>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("variant<");
        spell_list<E...>(out);
        out(">");
    }
};
template <>
struct Spelling<std::monostate> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("monostate");
    }
};
template <class K, class V>
struct KeyedSpelling {
    template <class Sink>
    static constexpr void to(Sink& out) {
        if constexpr (std::is_void_v<V>) {
            out("set<");
            spell<K>(out);
        } else {
            out("map<");
            spell_list<K, V>(out);
        }
        out(">");
    }
};
template <class K, class V, class C, class A>
struct Spelling<std::map<K, V, C, A>> : KeyedSpelling<K, V> {};
template <class K, class C, class A>
struct Spelling<std::set<K, C, A>> : KeyedSpelling<K, void> {};
template <class K, class V, class H, class Eq, class A>
struct Spelling<std::unordered_map<K, V, H, Eq, A>> : KeyedSpelling<K, V> {};
template <class K, class H, class Eq, class A>
struct Spelling<std::unordered_set<K, H, Eq, A>> : KeyedSpelling<K, void> {};
template <class Rep, class Period>
struct Spelling<std::chrono::duration<Rep, Period>> {
    template <class Sink>
    static constexpr void to(Sink& out) {
        out("duration<");
        spell<Rep>(out);
        out(",");
        spell_number(out, uint64_t(Period::num));
        out("/");
        spell_number(out, uint64_t(Period::den));
        out(">");
    }
};

template <class T, class Sink>
constexpr void spell(Sink& out) {
    using U = std::remove_cvref_t<T>;
    if constexpr (std::is_void_v<U>) {
        out("void");
    } else if constexpr (std::is_same_v<U, bool>) {
        out("bool");
    } else if constexpr (std::is_same_v<U, char>) {
        out("char");
    } else if constexpr (std::is_same_v<U, std::byte>) {
        out("byte");
    } else if constexpr (std::is_integral_v<U>) {
        out(std::is_signed_v<U> ? "i" : "u");
        spell_number(out, sizeof(U) * 8);
    } else if constexpr (std::is_floating_point_v<U>) {
        out("f");
        spell_number(out, sizeof(U) * 8);
    } else {
        Spelling<U>::to(out);
    }
}

/// "R(A,B)" into `out`.
template <class R, class... Args, class Sink>
constexpr void spell_signature(Sink& out) {
    spell<R>(out);
    out("(");
    spell_list<Args...>(out);
    out(")");
}

template <class R, class... Args>
constexpr uint64_t signature_hash() noexcept {
    SignatureHash h;
    spell_signature<R, Args...>(h);
    return h.h == 0 ? 1 : h.h;  // 0 means "not checked" on the wire
}
/// The hash of R(Args...), computed by the compiler.
template <class R, class... Args>
inline constexpr uint64_t kSignatureHash = signature_hash<R, Args...>();

template <class R, class... Args>
std::string signature_text() {
    SignatureText t;
    spell_signature<R, Args...>(t);
    return std::move(t.s);
}

}  // namespace talaria::detail

#pragma GCC visibility pop
