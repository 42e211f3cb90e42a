// proc: the archives that serialize(Archive&, T&) writes to and reads from.
//
// One customisation point serves both directions: a type provides either a member
//   template <class Archive> void serialize(Archive& ar) { ar(x, y, z); }
// or a free function found by ADL
//   template <class Archive> void serialize(Archive& ar, T& v) { ar(v.x, v.y); }
// The same function encodes (Archive = Encoder; the object is only read) and decodes
// (Archive = Decoder; the object is assigned). `Archive::encoding` tells which, for the rare
// type that must differ.
//
// Layout (docs/protocol.md, "proc"): little-endian, no padding, no type tags; arithmetic types
// at their fixed width, bool as one byte 0/1, lengths as u32. Decoding is bounds-checked: a
// short or hostile buffer sets an error on the Decoder (first error wins; later reads yield
// zeros and do nothing), never reads past the end, and never allocates more than the bytes
// that remain could encode. Nesting of user types is limited to kMaxDepth in both directions,
// so hostile input cannot exhaust the stack through a recursive type.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "talaria/util/result.hpp"

namespace talaria::na {
class Transport;
class Addr;
}  // namespace talaria::na

namespace talaria::proc {

static_assert(std::endian::native == std::endian::little,
              "proc writes little-endian by memcpy; add byte swaps for big-endian hosts");

/// How many user types (member or ADL serialize) may be nested inside one another. Only a
/// recursive type (a struct holding a vector of itself) can come near it; the limit keeps a
/// hostile encoding from recursing the decoder off its stack (at most a few hundred bytes of
/// stack per level, also on the small stacks of handler threads). The encoder refuses what the
/// decoder would, so the error shows up at the sender.
inline constexpr uint32_t kMaxDepth = 64;

namespace detail {
/// Append n bytes at p to out. insert() of a byte range inlines to a capacity check and a
/// memcpy, where resize() would zero-fill out of line first (5x the instructions for a small
/// value). GCC 12 warns falsely about insert's reallocation path when it is inlined after a
/// caller's clear() (known -Wstringop-overflow and, at -O3, -Warray-bounds false positives):
/// silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif
inline void append_bytes(std::vector<std::byte>& out, const std::byte* p, std::size_t n) {
    out.insert(out.end(), p, p + n);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}  // namespace detail

/// Appends the encoding of values to a byte vector (which it does not clear), or writes them
/// into a fixed room (a send buffer) and moves to a vector only if they outgrow it.
class Encoder {
  public:
    static constexpr bool encoding = true;
    static constexpr bool decoding = false;

    explicit Encoder(std::vector<std::byte>& out) noexcept : out_(&out) {}
    /// Writes into `room` while the bytes fit; the first write that does not fit moves what
    /// was written into `spill` (cleared here) and appends there from then on.
    Encoder(std::span<std::byte> room, std::vector<std::byte>& spill) noexcept
        : out_(&spill), begin_(room.data()), cur_(room.data()), end_(room.data() + room.size()) {
        spill.clear();
    }

    /// Raw bytes, no length prefix. (`p` must not point into the output.)
    void write_bytes(const void* p, std::size_t n) {
        if (n == 0) return;  // p may be null then
        if (cur_) {
            if (n <= std::size_t(end_ - cur_)) {
                std::memcpy(cur_, p, n);
                cur_ += n;
                return;
            }
            spill();
        }
        detail::append_bytes(*out_, static_cast<const std::byte*>(p), n);
    }
    /// `n` writable bytes at the end of the output, in the room while they fit (else the
    /// encoding moves to the vector first). Valid until the next write; give unused ones back
    /// with give_back().
    [[nodiscard]] std::span<std::byte> take(std::size_t n) {
        if (cur_) {
            if (n <= std::size_t(end_ - cur_)) {
                std::byte* p = cur_;
                cur_ += n;
                return {p, n};
            }
            spill();
        }
        std::size_t at = out_->size();
        out_->resize(at + n);
        return {out_->data() + at, n};
    }
    /// Drop the last `n` bytes written (n at most what take() just gave).
    void give_back(std::size_t n) noexcept {
        if (cur_)
            cur_ -= n;
        else
            out_->resize(out_->size() - n);
    }
    /// Where the output ends now, for rollback(): everything written after it is dropped
    /// (also when the encoding moved to the vector meanwhile: the room's bytes go first there).
    [[nodiscard]] std::size_t mark() const noexcept {
        return cur_ ? std::size_t(cur_ - begin_) : out_->size();
    }
    void rollback(std::size_t m) noexcept {
        if (cur_)
            cur_ = begin_ + m;
        else
            out_->resize(m);
    }
    /// Room mode: true while everything written is still in the room (its first
    /// `in_place_size()` bytes); false once it spilled (everything is in the vector).
    [[nodiscard]] bool in_place() const noexcept { return cur_ != nullptr; }
    [[nodiscard]] std::size_t in_place_size() const noexcept { return std::size_t(cur_ - begin_); }
    template <class T>
    requires std::is_arithmetic_v<T>
    void write(T v) { write_bytes(&v, sizeof v); }
    /// A u32 length prefix; lengths above UINT32_MAX fail the encoding (message_too_large).
    void write_length(std::size_t n) {
        if (n > UINT32_MAX) {
            fail(Errc::message_too_large, "proc: a length above 2^32-1 cannot be encoded");
            n = 0;
        }
        write(static_cast<uint32_t>(n));
    }

    /// Serialize each argument in order (defined in proc.hpp).
    template <class... T>
    Encoder& operator()(T&&... v);
    template <class T>
    Encoder& operator&(T&& v) {
        return (*this)(std::forward<T>(v));
    }

    void fail(Errc code, std::string message) {
        if (error_.code() == Errc::ok) error_ = Error{code, std::move(message)};
    }
    [[nodiscard]] bool ok() const noexcept { return error_.code() == Errc::ok; }
    [[nodiscard]] const Error& error() const noexcept { return error_; }
    /// The output vector, to append to directly (in room mode, what was written moves there
    /// first: the encoding continues in the vector).
    [[nodiscard]] std::vector<std::byte>& buffer() {
        if (cur_) spill();
        return *out_;
    }

    /// Enter one more level of user-type nesting: false (and the encoding fails,
    /// invalid_argument) beyond kMaxDepth. Every true is paired with leave_nested().
    bool enter_nested() {
        if (depth_ >= kMaxDepth) {
            fail(Errc::invalid_argument, "proc: user types nested deeper than " +
                                             std::to_string(kMaxDepth) +
                                             " levels cannot be decoded by the peer");
            return false;
        }
        ++depth_;
        return true;
    }
    void leave_nested() noexcept { --depth_; }

  private:
    void spill() {
        out_->assign(begin_, cur_);
        cur_ = nullptr;
    }

    std::vector<std::byte>* out_;
    std::byte* begin_ = nullptr;  ///< room mode: the room, and the write position in it
    std::byte* cur_ = nullptr;    ///< (null: vector mode, or spilled)
    std::byte* end_ = nullptr;
    Error error_{Errc::ok};
    uint32_t depth_ = 0;
};

/// What a decoder may need to rebuild handles that refer to the network: the transport that
/// deserializes addresses and memory handles, and the peer the bytes came from (the default
/// owner of a bulk handle that does not carry its owner's address).
struct DecodeContext {
    na::Transport* transport = nullptr;
    const na::Addr* source = nullptr;
};

/// Reads values back from a byte span.
class Decoder {
  public:
    static constexpr bool encoding = false;
    static constexpr bool decoding = true;

    explicit Decoder(std::span<const std::byte> in, DecodeContext ctx = {}) noexcept
        : in_(in), ctx_(ctx) {}

    /// Copy `n` raw bytes out, or fail (protocol_error) and zero-fill if fewer remain.
    void read_bytes(void* p, std::size_t n) {
        if (n > remaining()) {
            fail_short(n);
            if (n) std::memset(p, 0, n);
            return;
        }
        if (n) std::memcpy(p, in_.data() + pos_, n);
        pos_ += n;
    }
    /// Borrow `n` bytes in place (valid as long as the input), or an empty span on failure.
    std::span<const std::byte> take(std::size_t n) {
        if (n > remaining()) {
            fail_short(n);
            return {};
        }
        auto s = in_.subspan(pos_, n);
        pos_ += n;
        return s;
    }
    /// A fixed-width value; a bool must be the byte 0 or 1 (anything else fails, protocol_error,
    /// and yields false: copying such a byte into a bool would be undefined behaviour).
    template <class T>
    requires std::is_arithmetic_v<T> T read() {
        if constexpr (std::is_same_v<T, bool>) {
            auto b = read<uint8_t>();
            if (b > 1) {
                fail(Errc::protocol_error,
                     "proc: a bool must be 0 or 1, not " + std::to_string(unsigned{b}));
                return false;
            }
            return b != 0;
        } else {
            T v{};
            read_bytes(&v, sizeof v);
            return v;
        }
    }
    /// A u32 length prefix, checked against what remains: each element needs at least
    /// `min_element_size` bytes (0 for elements that may encode to nothing: then the length is
    /// capped at 2^24, and callers must not reserve by it).
    std::size_t read_length(std::size_t min_element_size) {
        uint32_t n = read<uint32_t>();
        if (!ok()) return 0;
        if (min_element_size > 0 ? n > remaining() / min_element_size : n > (1u << 24)) {
            fail(Errc::protocol_error, "proc: a length of " + std::to_string(n) +
                                           " exceeds the bytes that remain (" +
                                           std::to_string(remaining()) + ")");
            return 0;
        }
        return n;
    }

    /// Deserialize into each argument in order (defined in proc.hpp).
    template <class... T>
    Decoder& operator()(T&... v);
    template <class T>
    Decoder& operator&(T& v) {
        return (*this)(v);
    }

    void fail(Errc code, std::string message) {
        if (error_.code() == Errc::ok) error_ = Error{code, std::move(message)};
        pos_ = in_.size();  // stop: every later read fails fast
    }
    [[nodiscard]] bool ok() const noexcept { return error_.code() == Errc::ok; }
    [[nodiscard]] const Error& error() const noexcept { return error_; }
    [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }
    [[nodiscard]] std::size_t position() const noexcept { return pos_; }
    [[nodiscard]] const DecodeContext& context() const noexcept { return ctx_; }

    /// Enter one more level of user-type nesting: false (and decoding fails, protocol_error)
    /// beyond kMaxDepth. Every true is paired with leave_nested().
    bool enter_nested() {
        if (depth_ >= kMaxDepth) {
            fail(Errc::protocol_error,
                 "proc: user types nested deeper than " + std::to_string(kMaxDepth) + " levels");
            return false;
        }
        ++depth_;
        return true;
    }
    void leave_nested() noexcept { --depth_; }

  private:
    void fail_short(std::size_t n) {
        fail(Errc::protocol_error, "proc: truncated input: " + std::to_string(n) +
                                       " bytes needed at offset " + std::to_string(pos_) + ", " +
                                       std::to_string(remaining()) + " remain");
    }
    std::span<const std::byte> in_;
    std::size_t pos_ = 0;
    DecodeContext ctx_;
    Error error_{Errc::ok};
    uint32_t depth_ = 0;
};

}  // namespace talaria::proc

#pragma GCC visibility pop
