// Touch tracing: which locks and pools each thread takes, for the test that proves contexts
// share nothing on the call path (issue 9). Compiled in only where the build's config.hpp
// defines TALARIA_TOUCH_TRACE (CMake option, on in the asan and tsan presets); elsewhere every
// call is empty and costs nothing.
//
// Each thread keeps its own log (thread-local: no state shared between threads). A test turns
// its threads' logs on, runs, and compares them: an object in two threads' logs was touched by
// both. Housekeeping that runs on a timer rather than per call (sm's look at the sockets every
// 100 µs) marks itself with a Pause so that it is not counted as the call path.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <algorithm>
#include <vector>

#include "talaria/config.hpp"

namespace talaria::touch {

#if defined(TALARIA_TOUCH_TRACE)
inline constexpr bool kEnabled = true;

struct Log {
    bool on = false;
    int paused = 0;
    std::vector<const void*> seen;  ///< distinct objects, in first-touch order
};

/// The calling thread's log.
inline Log& log() noexcept {
    thread_local Log l;
    return l;
}

/// Record that the calling thread took lock or pool `obj`.
inline void note(const void* obj) noexcept {
    Log& l = log();
    if (!l.on || l.paused != 0) return;
    if (std::find(l.seen.begin(), l.seen.end(), obj) != l.seen.end()) return;
    try {
        l.seen.push_back(obj);
    } catch (...) {  // out of memory: the trace misses one object, the program goes on
    }
}

/// Start (clearing it) or stop the calling thread's log.
inline void record(bool on) noexcept {
    Log& l = log();
    if (on) l.seen.clear();
    l.on = on;
}

/// While alive, the calling thread's touches are not recorded (off the call path).
struct Pause {
    Pause() noexcept { ++log().paused; }
    ~Pause() { --log().paused; }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;
};
#else
inline constexpr bool kEnabled = false;
inline void note(const void*) noexcept {}
inline void record(bool) noexcept {}
struct Pause {
    Pause() noexcept {}
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;
};
#endif

}  // namespace talaria::touch

#pragma GCC visibility pop
