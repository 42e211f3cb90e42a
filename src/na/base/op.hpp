// Operation records shared by all transports: an Op carries the callback and completion of one
// posted operation; transports derive their own op type from it and allocate from an OpPool.
#pragma once

#include <cstdint>
#include <mutex>

#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"
#include "talaria/util/pool.hpp"

namespace talaria::na {

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

/// A mutex that locks only when the transport is thread-safe.
class MaybeMutex {
  public:
    explicit MaybeMutex(bool enabled) noexcept : enabled_(enabled) {}
    void lock() {
        if (enabled_) m_.lock();
    }
    void unlock() {
        if (enabled_) m_.unlock();
    }
    bool try_lock() { return enabled_ ? m_.try_lock() : true; }
    [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  private:
    std::mutex m_;
    bool enabled_;
};

/// A fixed pool of T (derived from Op). acquire() stamps a fresh generation; release() is
/// called by Context::trigger() after the callback was moved out. Thread-safe when asked.
template <class T>
class OpPool final : public OpReleaser {
  public:
    OpPool(std::size_t capacity, bool thread_safe) : pool_(capacity), mu_(thread_safe) {}

    /// nullptr when max_ops operations are already in flight (report Errc::again).
    T* acquire(Context& ctx, Callback&& cb, OpType type) {
        std::lock_guard g(mu_);
        T* op = pool_.acquire();
        if (!op) return nullptr;
        op->cb = std::move(cb);
        op->completion = Completion{};
        op->completion.type = type;
        op->ctx = &ctx;
        op->gen = ++gen_;
        op->releaser = this;
        op->completed = false;
        return op;
    }
    void release(Op* op) noexcept override {
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
        if (op->releaser != this || op->gen != id.gen || op->completed) return nullptr;
        return op;
    }
    [[nodiscard]] std::size_t in_use() noexcept {
        std::lock_guard g(mu_);
        return pool_.in_use();
    }

  private:
    ObjectPool<T> pool_;
    MaybeMutex mu_;
    uint64_t gen_ = 0;
};

/// Finish `op` with `status`: mark it and queue it on its context (exactly once).
inline void complete_op(Op* op, Errc status) noexcept {
    if (op->completed) return;
    op->completed = true;
    op->completion.status = status;
    op->ctx->enqueue(op);
}

}  // namespace talaria::na
