// The Mercury C API meets Talaria's C++ API (C++ only; link libmercury and libtalaria).
//
//   #include <mercury.h>
//   #include <mercury_talaria.hpp>
//   talaria::Engine& e = *talaria::mercury::engine(hg_class);
//   e.define("sum", [](int a, int b) { return a + b; });  // called by remote<int(int, int)>
//
// An HG class is a talaria::Engine in manual progress: its contexts are the HG contexts of the
// same ids, so what the engine defines runs in HG_Trigger, the calls it makes complete there,
// and a thread waiting in Future::get() or sync_wait progresses and triggers the context as
// HG_Progress and HG_Trigger do, safely beside the program's threads in them. Statistics,
// providers, executors, deadlines, exposing memory and the rest of the engine are the class's
// too. Engine::pull and push have a transfer context of their own (the class's one more
// transport context); a class opened over an NA class of the program's has it only where that
// NA class has a context id free above the HG class's contexts (else they answer
// not_supported). The engine is the class's: valid until HG_Finalize, never destroyed or moved
// from by the program.
#pragma once

#include "mercury_types.h"
#include "talaria/api/engine.hpp"

namespace talaria::mercury {

/// The talaria::Engine of `hg_class` (null for a null class).
HG_PUBLIC talaria::Engine* engine(hg_class_t* hg_class) noexcept;

}  // namespace talaria::mercury
