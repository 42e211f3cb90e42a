// The NA class as libna defines it, shared with libmercury (same build, same compiler): an
// hg_class opened over a program's NA class (HG_Init_opt2 with hg_init_info.na_class) borrows
// its transport and counts itself among its users, so that NA_Finalize answers NA_BUSY until
// HG_Finalize.
#pragma once

#include <atomic>
#include <climits>
#include <memory>
#include <string>

#include "na.h"
#include "talaria/na/na.hpp"

struct na_class {
    std::unique_ptr<talaria::na::Transport> t;
    std::string class_name;  // "na", "ofi", "ucx"
    std::string protocol;    // "sm", "tcp", "shm", ...
    bool listen = false;
    bool busy = false;         // na_init_info.progress_mode has NA_NO_BLOCK: progress spins
    std::atomic<int> live{0};  // contexts, addresses, memory handles, op ids, buffers, hg classes
};

namespace talaria::mercury {
/// The callbacks queued on `ctx`, as the unsigned int Mercury's completion counts are
/// (HG_Event_progress, NA_Poll, NA_Context_get_completion_count).
inline unsigned completion_count(const talaria::na::Context& ctx) noexcept {
    const std::size_t n = ctx.completion_count();
    return n > UINT_MAX ? UINT_MAX : static_cast<unsigned>(n);
}
}  // namespace talaria::mercury
