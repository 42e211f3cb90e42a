// talaria-perf: page-aligned, pre-faulted memory for registration (na put/get, bulk handles).
// Owns the mapping; move-only is not needed (it lives in one back end), so it is not copyable.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "talaria/util/result.hpp"

namespace talaria::perf {

class Region {
  public:
    Region() = default;
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;
    ~Region() { reset(); }
    Result<void> allocate(std::size_t len, unsigned char fill) {
        reset();
        std::size_t n = std::max<std::size_t>(len, 1);
        void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED) return errno_error(fmt::format("mmap of {} bytes", len), errno);
        std::memset(p, fill, n);
        p_ = p;
        len_ = n;
        return ok();
    }
    void reset() noexcept {
        if (p_) ::munmap(p_, len_);
        p_ = nullptr;
        len_ = 0;
    }
    [[nodiscard]] void* data() const noexcept { return p_; }
    [[nodiscard]] std::size_t size() const noexcept { return len_; }

  private:
    void* p_ = nullptr;
    std::size_t len_ = 0;
};

}  // namespace talaria::perf
