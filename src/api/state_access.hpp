// What the API's other files ask of an engine's state (engine.cpp), where they keep the
// state an Endpoint names instead of an Engine (which may move).
#pragma once

#include <string_view>

#include "talaria/api/endpoint.hpp"
#include "talaria/util/result.hpp"

namespace talaria::detail {

/// Engine::try_lookup through `state`.
Result<Endpoint> lookup_through(EngineState* state, std::string_view address);

/// Whether the engine of `state` was opened to accept connections (talaria::listen).
bool listens(const EngineState& state) noexcept;

/// Engine::try_undefine through `state` (provider 0).
Result<void> undefine_through(EngineState* state, std::string_view name);

}  // namespace talaria::detail
