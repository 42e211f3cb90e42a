// Errors as values: Errc, Error and Result<T>, shaped like std::expected (which GCC 12 lacks).
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace talaria {

/// Every error the library reports. `again` means back-pressure: retry later.
/// Keep errc_name() in result.cpp in step with this list.
enum class Errc : uint8_t {
    ok = 0,
    again,              ///< resource temporarily exhausted (queue full): retry after progress
    timeout,            ///< a deadline or progress timeout passed
    canceled,           ///< the operation was canceled
    disconnected,       ///< the peer closed, died, or the connection broke
    invalid_argument,   ///< a caller passed a bad value
    out_of_range,       ///< offset/length outside a registered region or buffer
    access_denied,      ///< access mode of a region forbids the operation (e.g. put to read-only)
    permission_denied,  ///< the operating system refused (e.g. ptrace scope for process_vm_*)
    no_memory,          ///< allocation or pool exhausted
    not_supported,      ///< the transport or build lacks this feature
    address_in_use,     ///< bind/listen failed because the address is taken
    address_invalid,    ///< an address string or serialized address could not be parsed
    unreachable,        ///< lookup/connect failed: nobody at that address
    protocol_error,     ///< bytes from a wire or ring violate the protocol
    message_too_large,  ///< a message exceeds the transport's maximum size
    busy,               ///< in use (a region deregistered with ops in flight), or the peer is
                        ///< over a limit (core::Options::large_budget): retry later
    not_found,          ///< a lookup by name or id found nothing
    already_exists,     ///< registering a name or id twice
    io_error,           ///< an unexpected system call failure (errno is in the message)
    shutdown,           ///< the transport or context is closing
    internal,           ///< a bug: an invariant did not hold
    invalid_state,      ///< the object cannot be used in this state: an engine inherited by a
                        ///< child across fork() (open a new one in the child)
};

/// The last code: statuses on a wire are at most this.
inline constexpr Errc kLastErrc = Errc::invalid_state;

/// A short, stable, lower-case name for every code ("disconnected", "access_denied", ...).
std::string_view errc_name(Errc code) noexcept;

/// An error: a code, plus an optional message naming the cause for a human.
/// The message is built only on error paths, never on the fast path.
class Error {
  public:
    Error() = default;
    Error(Errc code) : code_(code) {}  // NOLINT: implicit by design, `return Errc::timeout;`
    Error(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

    [[nodiscard]] Errc code() const noexcept { return code_; }
    [[nodiscard]] const std::string& message() const noexcept { return message_; }
    /// "code_name: message" (or just the code name when there is no message).
    [[nodiscard]] std::string describe() const;

    friend bool operator==(const Error& e, Errc c) noexcept { return e.code_ == c; }

  private:
    Errc code_ = Errc::internal;
    std::string message_;
};

/// Error built from errno after a failed system call: code chosen from errno, message
/// "<what>: <strerror>".
Error errno_error(std::string_view what, int err);

/// Result<T>: either a T or an Error. Result<void> carries only success or an Error.
template <class T>
class [[nodiscard]] Result {
  public:
    Result(const T& v) : v_(std::in_place_index<0>, v) {}                  // NOLINT
    Result(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}            // NOLINT
    Result(Error e) : v_(std::in_place_index<1>, not_ok(std::move(e))) {}  // NOLINT
    Result(Errc c) : v_(std::in_place_index<1>, not_ok(Error(c))) {}       // NOLINT
    template <class U>
    requires(std::is_convertible_v<U&&, T> && !std::is_same_v<std::decay_t<U>, T> &&
             !std::is_same_v<std::decay_t<U>, Error> && !std::is_same_v<std::decay_t<U>, Errc>)
        Result(U&& v)
        : v_(std::in_place_index<0>, T(std::forward<U>(v))) {}  // NOLINT

    [[nodiscard]] bool has_value() const noexcept { return v_.index() == 0; }
    explicit operator bool() const noexcept { return has_value(); }

    T& value() & { return std::get<0>(v_); }
    const T& value() const& { return std::get<0>(v_); }
    T&& value() && { return std::get<0>(std::move(v_)); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

    const Error& error() const& { return std::get<1>(v_); }
    Error&& error() && { return std::get<1>(std::move(v_)); }
    /// Errc::ok when holding a value.
    [[nodiscard]] Errc code() const noexcept { return has_value() ? Errc::ok : error().code(); }

  private:
    // An Error holding Errc::ok carries no value: keep code() from claiming success.
    static Error not_ok(Error e) {
        if (e.code() != Errc::ok) return e;
        return Error(Errc::internal, "Result<T> built from Errc::ok without a value");
    }
    std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
  public:
    Result() = default;
    Result(Error e) : err_(std::move(e)), ok_(err_.code() == Errc::ok) {}  // NOLINT
    Result(Errc c) : err_(c), ok_(c == Errc::ok) {}                        // NOLINT

    [[nodiscard]] bool has_value() const noexcept { return ok_; }
    explicit operator bool() const noexcept { return ok_; }
    void value() const {}
    const Error& error() const& { return err_; }
    Error&& error() && { return std::move(err_); }
    [[nodiscard]] Errc code() const noexcept { return ok_ ? Errc::ok : err_.code(); }

  private:
    Error err_{Errc::ok};
    bool ok_ = true;
};

/// `return ok();` from a Result<void> function.
inline Result<void> ok() {
    return {};
}

}  // namespace talaria

/// Propagate an error: `TALARIA_TRY(x, expr);` declares `x` from a Result, returning its error.
#define TALARIA_TRY_CONCAT_(a, b) a##b
#define TALARIA_TRY_CONCAT(a, b) TALARIA_TRY_CONCAT_(a, b)
#define TALARIA_TRY(var, expr)                                                \
    auto TALARIA_TRY_CONCAT(talaria_try_, __LINE__) = (expr);                 \
    if (!TALARIA_TRY_CONCAT(talaria_try_, __LINE__))                          \
        return std::move(TALARIA_TRY_CONCAT(talaria_try_, __LINE__)).error(); \
    auto&& var = std::move(TALARIA_TRY_CONCAT(talaria_try_, __LINE__)).value()

/// Propagate the error of a Result<void> expression.
#define TALARIA_CHECK(expr)                                    \
    do {                                                       \
        if (auto talaria_check_r_ = (expr); !talaria_check_r_) \
            return std::move(talaria_check_r_).error();        \
    } while (0)

#pragma GCC visibility pop
