// Tells an object created before fork() that it now lives in the child, at the cost of one load.
//
// A process that forks while it has an Engine gives the child a copy of everything the engine
// holds: its memory, its descriptors (the same sockets, rings and files as the parent's), the
// state of its locks, but none of its threads. An engine used in the child would talk on the
// parent's connections with the parent's sequence numbers, and wait for threads that do not
// exist. So an engine keeps a ForkGuard and refuses to work in a child.
//
// How: one page mapped with MADV_WIPEONFORK (Linux 4.14) holding a mark; the child's copy of
// that page reads as zeros. Where the kernel refuses the advice, the guard compares the
// process id instead (a system call per check).
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace talaria {

class ForkGuard {
  public:
    ForkGuard() noexcept;
    ~ForkGuard();
    ForkGuard(const ForkGuard&) = delete;
    ForkGuard& operator=(const ForkGuard&) = delete;

    /// This object was created in another process: the calling process is a child that
    /// inherited it across fork().
    [[nodiscard]] bool inherited() const noexcept {
        if (page_) [[likely]]
            return page_->load(std::memory_order_relaxed) != kMark;
        return slow_inherited();
    }
    /// The process that created it.
    [[nodiscard]] pid_t creator() const noexcept { return pid_; }

  private:
    static constexpr uint64_t kMark = 0x7461'6c61'7269'6121ull;  // "talaria!"
    [[nodiscard]] bool slow_inherited() const noexcept;

    std::atomic<uint64_t>* page_ = nullptr;  ///< the wipe-on-fork page, or null (fallback)
    pid_t pid_;
};

}  // namespace talaria

#pragma GCC visibility pop
