// The api layer's exception, and the bridge from errors as values (every layer below) to it.
// Only this layer throws; every throwing call has a try_ twin that returns the Result instead.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <stdexcept>
#include <string>
#include <utility>

#include "talaria/util/result.hpp"

namespace talaria {

/// What the C++ API throws: the Error of the layer below, kept whole (code() and error()),
/// with what() = "code_name: message".
class Exception : public std::runtime_error {
  public:
    explicit Exception(Error e) : std::runtime_error(e.describe()), error_(std::move(e)) {}
    Exception(Errc code, std::string message) : Exception(Error(code, std::move(message))) {}

    [[nodiscard]] Errc code() const noexcept { return error_.code(); }
    [[nodiscard]] const Error& error() const noexcept { return error_; }

  private:
    Error error_;
};

namespace detail {

/// The value of `r`, or throw its error as an Exception.
template <class T>
T value_or_throw(Result<T>&& r) {
    if (!r) throw Exception(std::move(r).error());
    return std::move(r).value();
}
inline void value_or_throw(Result<void>&& r) {
    if (!r) throw Exception(std::move(r).error());
}

}  // namespace detail
}  // namespace talaria

#pragma GCC visibility pop
