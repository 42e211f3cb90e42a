// Endpoint: a peer as the api layer names it (an na::Addr plus the engine that resolved it).
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <string>
#include <utility>

#include "talaria/na/na.hpp"

namespace talaria {

namespace detail {
class EngineState;
}

/// A peer address resolved by an Engine (Engine::lookup, Request::source). Cheap to copy (a
/// reference count). Valid while its engine lives.
class Endpoint {
  public:
    Endpoint() noexcept = default;
    Endpoint(detail::EngineState* engine, na::Addr addr) noexcept
        : engine_(engine), addr_(std::move(addr)) {}

    [[nodiscard]] bool valid() const noexcept { return addr_.valid(); }
    explicit operator bool() const noexcept { return valid(); }
    [[nodiscard]] const na::Addr& addr() const noexcept { return addr_; }
    [[nodiscard]] detail::EngineState* engine() const noexcept { return engine_; }
    /// The address string (what Engine::lookup accepts), or "<none>".
    [[nodiscard]] std::string to_string() const {
        if (!addr_.valid()) return "<none>";
        return addr_.impl()->transport()->addr_to_string(addr_);
    }
    /// Same peer (addresses are interned by the transport, so this is a pointer compare).
    friend bool operator==(const Endpoint& a, const Endpoint& b) noexcept {
        return a.addr_ == b.addr_;
    }

  private:
    detail::EngineState* engine_ = nullptr;
    na::Addr addr_;
};

}  // namespace talaria

#pragma GCC visibility pop
