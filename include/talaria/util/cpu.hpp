// CPU hints for spin loops.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

namespace talaria {

/// Tell the CPU we are spinning (x86 `pause`, Arm `yield`): saves power and lets the sibling
/// hyper-thread run, without giving up the time slice.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

}  // namespace talaria

#pragma GCC visibility pop
