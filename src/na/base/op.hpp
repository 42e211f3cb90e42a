// Operation records shared by all transports: an Op carries the callback and completion of one
// posted operation; transports derive their own op type from it and allocate from an OpPool.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include <string_view>

#include "talaria/na/na.hpp"
#include "talaria/util/cpu.hpp"
#include "talaria/util/intrusive_list.hpp"
#include "talaria/util/pool.hpp"
#include "talaria/util/spin_lock.hpp"

namespace talaria::na {

/// A target's verdict on a put (`write`) or get of `len` bytes at `addr` against a registration
/// [base, +length) with `access`, as every transport that checks gives it: the access first
/// (access_denied), then the bounds (out_of_range, without overflow), else ok.
inline Errc check_region(Access access, uint64_t base, uint64_t length, bool write, uint64_t addr,
                         uint64_t len) noexcept {
    const uint8_t need = write ? uint8_t(Access::write_only) : uint8_t(Access::read_only);
    if (!(uint8_t(access) & need)) return Errc::access_denied;
    if (addr < base || addr - base > length || len > length - (addr - base))
        return Errc::out_of_range;
    return Errc::ok;
}

/// Where an unexpected message naming context `id` goes (docs/architecture.md, "Messages"):
/// slot `id` when its context exists and takes unexpected messages, else the lowest slot whose
/// context does; nullptr when none does. `slots` is indexable by id and iterable in id order;
/// `ctx_of(slot)` is the slot's Context* (nullptr: none). Call under the transport's lock.
template <class Slots, class CtxOf>
auto* route_unexpected(Slots& slots, std::size_t n, uint8_t id, CtxOf ctx_of) noexcept {
    auto takes = [&](std::size_t i) {
        const Context* c = ctx_of(slots[i]);
        return c != nullptr && c->takes_unexpected();
    };
    if (id < n && takes(id)) return &slots[id];
    for (std::size_t i = 0; i < n; ++i)
        if (takes(i)) return &slots[i];
    return static_cast<decltype(&slots[0])>(nullptr);
}

class OpReleaser {
  public:
    virtual void release(Op* op) noexcept = 0;

  protected:
    ~OpReleaser() = default;
};

/// One posted operation. The hook links it either into a transport's pending list or into its
/// context's completion queue, never both.
struct Op : ListHook<> {
    Callback cb;
    Completion completion;
    Context* ctx = nullptr;
    uint64_t gen = 0;
    OpReleaser* releaser = nullptr;
    bool completed = false;  ///< set when queued for completion (guards double completion)

    [[nodiscard]] OpId id() noexcept { return {this, gen}; }
};

/// A fixed pool of T (derived from Op). acquire() stamps a fresh generation; release() is
/// called by Context::trigger() after the callback was moved out. Thread-safe when asked.
///
/// A transport that already holds its own lock around every acquire(), lookup() and release()
/// of its own can pass thread_safe=false and a `releaser`: ops then name `releaser` (which must
/// take that lock and call release()) instead of the pool, and the pool takes no lock of its own.
template <class T>
class OpPool final : public OpReleaser {
  public:
    OpPool(std::size_t capacity, bool thread_safe, OpReleaser* releaser = nullptr)
        : pool_(capacity), mu_(thread_safe), releaser_(releaser ? releaser : this) {}

    /// nullptr when max_ops operations are already in flight (report Errc::again).
    T* acquire(Context& ctx, Callback&& cb, OpType type) {
        touch::note(this);
        T* op;
        {
            std::lock_guard g(mu_);
            // Default-initialized: the member initializers run, without zero-filling the whole
            // object first.
            op = pool_.acquire_default();
            if (!op) return nullptr;
            op->completion.type = type;
            op->ctx = &ctx;
            op->gen = ++gen_;
            op->releaser = releaser_;
        }
        // lookup() never reads the callback: move it in outside the lock.
        op->cb = std::move(cb);
        return op;
    }
    void release(Op* op) noexcept override {
        touch::note(this);
        std::lock_guard g(mu_);
        pool_.release(static_cast<T*>(op));
    }
    /// Does `id` still name a live operation of this pool? Call under the transport's lock.
    T* lookup(OpId id) noexcept {
        std::lock_guard g(mu_);
        auto* op = static_cast<T*>(id.op);
        if (!op || !pool_.owns(op)) return nullptr;
        // A free slot's storage is overwritten by the free-list link, so compare the
        // generation only for slots in use: gen values are never reused.
        if (op->releaser != releaser_ || op->gen != id.gen || op->completed) return nullptr;
        return op;
    }
    /// Is `op` a slot of this pool (in use or not)? No lock: the slots never move.
    [[nodiscard]] bool owns(const Op* op) const noexcept {
        return pool_.owns(static_cast<const T*>(op));
    }
    [[nodiscard]] std::size_t in_use() noexcept {
        std::lock_guard g(mu_);
        return pool_.in_use();
    }

  private:
    ObjectPool<T> pool_;
    MaybeSpinLock mu_;
    OpReleaser* releaser_;
    uint64_t gen_ = 0;
};

/// The error of a post refused because Options::max_ops operations are in flight (out of line:
/// error path only). `who` names the transport and operation, e.g. "sm send".
[[gnu::cold]] Error ops_exhausted(std::string_view who, std::size_t max_ops);

/// The checks every post_put/post_get makes before anything moves: the context, address and
/// handles belong to transport `t` (`scheme`, e.g. "ofi+tcp"), the local handle is registered
/// here, and [local_off, +len) lies inside it. `what` is "post_put" or "post_get". Errors say
/// which argument is wrong (invalid_argument, out_of_range). Defined in support.cpp.
Result<void> check_rma_args(const Transport* t, std::string_view scheme, std::string_view what,
                            const Context& ctx, const MemHandle& local, std::size_t local_off,
                            const MemHandle& remote, std::size_t len, const Addr& remote_addr);

/// Whether process `pid` has ended: it no longer exists (kill: ESRCH), or it is a zombie, dead
/// and not yet reaped by its parent, which kill(pid, 0) still finds (its /proc state is Z or
/// X). A process that exists and cannot be read counts as alive. For the transports that
/// watch a peer by its pid (ofi+shm, ucx+sm): a client that forked its server and has not
/// reaped it must still see it die. Defined in support.cpp.
[[nodiscard]] bool process_gone(pid_t pid) noexcept;

/// Finish `op` with `status`: mark it and queue it on its context (exactly once).
inline void complete_op(Op* op, Errc status) noexcept {
    if (op->completed) return;
    op->completed = true;
    op->completion.status = status;
    op->ctx->enqueue(op);
}

}  // namespace talaria::na
