#include "talaria/util/fork_guard.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "talaria/util/log.hpp"

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18  // Linux 4.14; older C libraries lack the name
#endif

namespace talaria {

ForkGuard::ForkGuard() noexcept : pid_(::getpid()) {
    const long page = ::sysconf(_SC_PAGESIZE);
    void* p = ::mmap(nullptr, std::size_t(page), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        TALARIA_LOG(util, debug, "fork guard: mmap failed ({}); comparing process ids instead",
                    std::strerror(errno));
        return;
    }
    if (::madvise(p, std::size_t(page), MADV_WIPEONFORK) != 0) {
        // Kernels before 4.14: the process id it is (one getpid() per check).
        TALARIA_LOG(util, debug,
                    "fork guard: madvise(MADV_WIPEONFORK) failed ({}); comparing process ids "
                    "instead",
                    std::strerror(errno));
        ::munmap(p, std::size_t(page));
        return;
    }
    page_ = new (p) std::atomic<uint64_t>(kMark);
}

ForkGuard::~ForkGuard() {
    if (page_) ::munmap(page_, std::size_t(::sysconf(_SC_PAGESIZE)));
}

bool ForkGuard::slow_inherited() const noexcept {
    return ::getpid() != pid_;
}

}  // namespace talaria
