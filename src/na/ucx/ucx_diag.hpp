// Diagnostics of the ucx transport for code that must not see UCX's headers (tests built
// against talaria_na only).
#pragma once

#include <cstddef>
#include <optional>

#include "talaria/na/na.hpp"

namespace talaria::na::ucx {

/// Interned addresses alive in `t` (self included), or nullopt if `t` is not a ucx transport.
std::optional<std::size_t> live_addrs(Transport& t);

}  // namespace talaria::na::ucx
