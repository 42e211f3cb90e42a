// bulk::Context: one transfer split into na put/get pieces, one per overlapping pair of remote
// and local segments, at most kMaxInflight of them posted at once.
//
// Each transfer lives in a TransferState taken from its Context's pool. States are freed only
// with the Context, and recycled with a new generation meanwhile, so a TransferId that outlived
// its transfer still points at valid memory and cancel() can tell it is stale (not_found) by the
// generation. The pool is a lock-free stack (an index plus an ABA tag in one 64-bit word):
// taking and returning a state costs one compare-and-swap, and no lock is shared between
// transfers, nor between contexts. Everything else about a transfer is guarded by its own small
// mutex, so transfer() and cancel() may run on any thread while the context's thread runs the
// piece completions.
//
// Completion: a transfer completes exactly once, from its context's trigger(): from the last
// piece's completion, or from a callback queued with na::Context::post() when nothing is in
// flight (zero length, inline handles, an error before any piece was posted, back-pressure).
//
// Back-pressure (na says `again`): with pieces of this transfer in flight, the next completion
// posts again. With none, a retry is queued with ctx.post(); if that retry is refused too, the
// next ones are timers of the same na context (post_at) after a short, growing delay. Queuing
// them straight from the retry callback would never let trigger() return (it runs callbacks
// queued meanwhile in the same call), and the operations holding the transport's max_ops could
// then never complete on a single-threaded context.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bulk/handle_impl.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/util/log.hpp"

namespace talaria::bulk {

namespace {

/// Pieces of one transfer posted to na at a time. Enough to keep a link busy, few enough that
/// one large transfer does not take the transport's whole max_ops.
constexpr unsigned kMaxInflight = 64;
static_assert(kMaxInflight <= 64, "the free-slot set is one 64-bit mask");

/// One posted na operation of a transfer, kept for cancel() and for error messages.
struct Piece {
    na::OpId id;
    uint64_t pos = 0;  ///< offset within the transfer
    uint64_t len = 0;
    uint32_t rseg = 0;  ///< remote segment index, and the offset within it
    uint64_t roff = 0;
    uint32_t lseg = 0;
    uint64_t loff = 0;
};

class StatePool;

struct TransferState {
    // --- pool bookkeeping (never changes / atomic) ---
    StatePool* pool = nullptr;           ///< the owner's pool (released into it)
    uint32_t index = 0;                  ///< position in the pool
    std::atomic<uint32_t> next_free{0};  ///< pool stack link: index + 1 of the next, 0 = none

    // --- everything below is guarded by `mu` ---
    std::mutex mu;
    uint64_t gen = 0;  ///< bumped when a transfer starts and when it completes
    bool active = false;

    na::Context* ctx = nullptr;
    na::Transport* t = nullptr;
    Direction dir = Direction::pull;
    na::Addr peer;
    Handle remote;  ///< kept alive until completion (the registrations stay valid)
    Handle local;
    DoneFn done;

    uint64_t remote_start = 0;  ///< the caller's offsets, for messages
    uint64_t local_start = 0;
    uint64_t len = 0;
    // Cursor: bytes posted so far, and where the next piece starts on each side.
    uint64_t pos = 0;
    uint32_t ri = 0;
    uint64_t roff = 0;
    uint32_t li = 0;
    uint64_t loff = 0;

    unsigned inflight = 0;
    uint64_t free_slots = 0;  ///< bit i set: pieces[i] is free
    std::array<Piece, kMaxInflight> pieces;

    bool failed = false;  ///< `error` holds the first error
    Error error{Errc::ok};
    bool canceled = false;       ///< cancel() was called
    bool saw_canceled = false;   ///< a piece completed with canceled after cancel()
    bool retry_pending = false;  ///< a retry is queued (ctx->post() or post_at())
    unsigned retries = 0;        ///< retries in a row that met back-pressure again
};

// --- the state pool ------------------------------------------------------------------------------

class StatePool {
  public:
    StatePool() = default;
    StatePool(const StatePool&) = delete;
    StatePool& operator=(const StatePool&) = delete;
    ~StatePool() {
        for (auto& c : chunks_)
            delete[] c.load(std::memory_order_relaxed);
    }

    /// A free state, or nullptr when kMaxChunks * kChunk transfers are in flight.
    TransferState* acquire() {
        uint64_t h = head_.load(std::memory_order_acquire);
        for (;;) {
            auto idx = static_cast<uint32_t>(h);
            if (idx == 0) return counted(grow());
            TransferState* s = at(idx - 1);
            // `s` may be taken by another thread meanwhile: then `next` is stale, but the tag in
            // `h` has changed too and the exchange fails.
            uint32_t next = s->next_free.load(std::memory_order_relaxed);
            if (head_.compare_exchange_weak(h, tagged(h, next), std::memory_order_acquire,
                                            std::memory_order_acquire))
                return counted(s);
        }
    }

    void release(TransferState* s) noexcept {
        push_chain(s, s);
        active_.fetch_sub(1, std::memory_order_release);
    }
    [[nodiscard]] std::size_t active() const noexcept {
        return active_.load(std::memory_order_acquire);
    }

    /// Call f(state) for every state ever created (any thread; states are never freed while
    /// the pool lives).
    template <class F>
    void for_each(F&& f) {
        uint32_t n = nchunks_.load(std::memory_order_acquire);
        for (uint32_t c = 0; c < n; ++c) {
            TransferState* chunk = chunks_[c].load(std::memory_order_acquire);
            for (uint32_t i = 0; i < kChunk; ++i)
                f(&chunk[i]);
        }
    }

  private:
    TransferState* counted(TransferState* s) noexcept {
        if (s) active_.fetch_add(1, std::memory_order_relaxed);
        return s;
    }

    static constexpr uint32_t kChunk = 256;
    static constexpr uint32_t kMaxChunks = 1024;  // 256 Ki transfers in flight per context

    static uint64_t tagged(uint64_t old_head, uint32_t idx1) noexcept {
        return ((old_head >> 32) + 1) << 32 | idx1;
    }

    TransferState* at(uint32_t idx) const noexcept {
        return &chunks_[idx / kChunk].load(std::memory_order_acquire)[idx % kChunk];
    }

    /// Push the chain first..last (already linked through next_free) onto the free stack.
    void push_chain(TransferState* first, TransferState* last) noexcept {
        uint64_t h = head_.load(std::memory_order_relaxed);
        do {
            last->next_free.store(static_cast<uint32_t>(h), std::memory_order_relaxed);
        } while (!head_.compare_exchange_weak(
            h, tagged(h, first->index + 1), std::memory_order_release, std::memory_order_relaxed));
    }

    /// Add a chunk: return its first state, push the others. Rare (once per kChunk states ever
    /// in flight at once), so a mutex is fine here.
    TransferState* grow() {
        std::lock_guard g(grow_mu_);
        uint32_t n = nchunks_.load(std::memory_order_relaxed);
        if (n == kMaxChunks) return nullptr;
        auto* chunk = new (std::nothrow) TransferState[kChunk];
        if (!chunk) return nullptr;
        for (uint32_t i = 0; i < kChunk; ++i) {
            chunk[i].pool = this;
            chunk[i].index = n * kChunk + i;
            if (i > 1) chunk[i - 1].next_free.store(chunk[i].index + 1, std::memory_order_relaxed);
        }
        chunks_[n].store(chunk, std::memory_order_release);
        nchunks_.store(n + 1, std::memory_order_relaxed);
        push_chain(&chunk[1], &chunk[kChunk - 1]);
        return &chunk[0];
    }

    std::atomic<uint64_t> head_{0};  ///< (ABA tag << 32) | (index + 1), 0 = empty
    std::mutex grow_mu_;
    std::atomic<uint32_t> nchunks_{0};
    std::atomic<std::size_t> active_{0};  ///< acquired and not released
    std::array<std::atomic<TransferState*>, kMaxChunks> chunks_{};
};

// --- helpers -------------------------------------------------------------------------------------

void on_retry(TransferState* s);

// --- helpers -------------------------------------------------------------------------------------

const char* dir_name(Direction d) noexcept {
    return d == Direction::pull ? "pull" : "push";
}

bool readable(Access a) noexcept {
    return (static_cast<uint8_t>(a) & static_cast<uint8_t>(Access::read_only)) != 0;
}
bool writable(Access a) noexcept {
    return (static_cast<uint8_t>(a) & static_cast<uint8_t>(Access::write_only)) != 0;
}
const char* access_name(Access a) noexcept {
    switch (a) {
        case Access::read_only:
            return "read_only";
        case Access::write_only:
            return "write_only";
        case Access::read_write:
            return "read_write";
    }
    return "invalid";
}

std::string piece_desc(const TransferState& s, const Piece& p) {
    return fmt::format(
        "the {}-byte piece at transfer offset {} (remote offset {}, segment {} +{}; local "
        "offset {}, segment {} +{})",
        p.len, p.pos, s.remote_start + p.pos, p.rseg, p.roff, s.local_start + p.pos, p.lseg,
        p.loff);
}

enum class Next {
    wait,    ///< pieces are in flight; their completions carry on
    finish,  ///< nothing in flight and nothing more to post: complete now
    retry,   ///< back-pressure with nothing in flight: try again from a posted callback
};

void on_piece_done(TransferState* s, unsigned slot, const na::Completion& c);

/// Post pieces until the window is full, everything is posted, or something stops us.
Next pump_locked(TransferState* s) {
    const Handle::Impl& rim = *s->remote.impl();
    const Handle::Impl& lim = *s->local.impl();
    while (!s->failed && !s->canceled && s->pos < s->len && s->inflight < kMaxInflight) {
        const Handle::Impl::Seg& rs = rim.segs[s->ri];
        const Handle::Impl::Seg& ls = lim.segs[s->li];
        uint64_t n = std::min({s->len - s->pos, rs.size - s->roff, ls.size - s->loff});
        auto slot = static_cast<unsigned>(std::countr_zero(s->free_slots));
        Piece& p = s->pieces[slot];
        p = Piece{{}, s->pos, n, s->ri, s->roff, s->li, s->loff};
        na::Callback cb = [s, slot](const na::Completion& c) { on_piece_done(s, slot, c); };
        auto r = s->dir == Direction::pull ? s->t->post_get(*s->ctx, std::move(cb), ls.mem, s->loff,
                                                            rs.mem, s->roff, n, s->peer)
                                           : s->t->post_put(*s->ctx, std::move(cb), ls.mem, s->loff,
                                                            rs.mem, s->roff, n, s->peer);
        if (!r) {
            if (r.code() == Errc::again) {
                TALARIA_LOG(bulk, debug, "bulk {}: back-pressure at transfer offset {} ({})",
                            dir_name(s->dir), s->pos, r.error().describe());
                return s->inflight > 0 ? Next::wait : Next::retry;
            }
            s->failed = true;
            s->error =
                Error(r.code(), fmt::format("bulk {}: posting {} failed: {}", dir_name(s->dir),
                                            piece_desc(*s, p), r.error().describe()));
            break;
        }
        p.id = *r;
        s->retries = 0;
        s->free_slots &= ~(uint64_t(1) << slot);
        ++s->inflight;
        s->pos += n;
        if ((s->roff += n) == rs.size) {
            ++s->ri;
            s->roff = 0;
        }
        if ((s->loff += n) == ls.size) {
            ++s->li;
            s->loff = 0;
        }
    }
    return s->inflight == 0 ? Next::finish : Next::wait;
}

/// Complete the transfer: release the state, then run the callback. Called from the context's
/// trigger() with `lk` held; returns with it released (the state may be reused at once).
void finish(TransferState* s, std::unique_lock<std::mutex>& lk) {
    Result<void> r;
    if (s->failed) {
        r = std::move(s->error);
    } else if (s->canceled && (s->pos < s->len || s->saw_canceled)) {
        r = Error(Errc::canceled, fmt::format("bulk {}: canceled ({} of {} bytes had been posted)",
                                              dir_name(s->dir), s->pos, s->len));
    }
    DoneFn done = std::move(s->done);
    // Let go of the handles before the callback runs: it may free the memory behind them.
    Handle remote = std::move(s->remote);
    Handle local = std::move(s->local);
    na::Addr peer = std::move(s->peer);
    s->error = Error(Errc::ok);
    s->active = false;
    ++s->gen;
    lk.unlock();
    remote = Handle();
    local = Handle();
    peer.reset();
    s->pool->release(s);
    done(std::move(r));
}

/// After pump_locked() from the context's trigger(): carry on as it says.
void continue_in_trigger(TransferState* s, std::unique_lock<std::mutex>& lk, Next next) {
    if (next == Next::retry) {
        // The first retry in a row goes straight to the context; later ones wait a little
        // (50 us, doubling up to 1.6 ms) so that trigger() returns and progress can free slots.
        unsigned k = s->retries++;
        na::Callback cb = [s](const na::Completion&) { on_retry(s); };
        Result<void> r;
        if (k > 0) {
            auto delay = std::chrono::microseconds(50u << std::min(k - 1, 5u));
            r = s->ctx->post_at(Clock::now() + delay, std::move(cb));
        } else {
            r = s->ctx->post(std::move(cb));
        }
        if (r) {
            s->retry_pending = true;
            return;
        }
        s->failed = true;
        s->error = Error(r.code(), fmt::format("bulk {}: cannot queue a retry after "
                                               "back-pressure: {}",
                                               dir_name(s->dir), r.error().describe()));
        next = Next::finish;
    }
    if (next == Next::finish) finish(s, lk);
}

void on_retry(TransferState* s) {
    std::unique_lock lk(s->mu);
    s->retry_pending = false;
    continue_in_trigger(s, lk, pump_locked(s));
}

void on_piece_done(TransferState* s, unsigned slot, const na::Completion& c) {
    std::unique_lock lk(s->mu);
    Piece& p = s->pieces[slot];
    s->free_slots |= uint64_t(1) << slot;
    --s->inflight;
    if (c.status != Errc::ok) {
        if (c.status == Errc::canceled && s->canceled) {
            s->saw_canceled = true;
        } else if (!s->failed) {
            s->failed = true;
            // Transports that check at the target answer invalid_argument for a key they hold
            // no region under; libfabric's providers answer access_denied for it, as for an
            // access the region does not allow.
            constexpr std::string_view kGone =
                "the remote memory is no longer exposed (its owner dropped the last "
                "talaria::Bulk of it, which ends the exposure: keep one until the peer's "
                "transfers are done)";
            std::string why =
                c.status == Errc::invalid_argument
                    ? fmt::format("invalid_argument: {}, or the handle was never that peer's",
                                  kGone)
                : c.status == Errc::access_denied
                    ? fmt::format(
                          "access_denied: the remote memory does not allow a {} (it was "
                          "exposed {}), or {}",
                          s->dir == Direction::pull ? "read" : "write",
                          s->dir == Direction::pull ? "write_only" : "read_only", kGone)
                    : std::string(errc_name(c.status));
            s->error = Error(c.status, fmt::format("bulk {}: {} failed: {}", dir_name(s->dir),
                                                   piece_desc(*s, p), why));
            TALARIA_LOG(bulk, debug, "{}", s->error.message());
        }
    }
    // A pending retry owns the restart; otherwise post more (or finish) from here.
    if (s->retry_pending) {
        return;
    }
    continue_in_trigger(s, lk, pump_locked(s));
}

/// Copy from an inline remote handle into local segments (a pull needs no network).
void copy_inline(const Handle::Impl& rim, uint64_t roff, const Handle::Impl& lim, uint64_t loff,
                 uint64_t len) {
    std::size_t li = lim.segment_at(loff);
    uint64_t in_seg = loff - lim.segs[li].offset;
    const std::byte* src = rim.bytes.data() + roff;
    while (len > 0) {
        const Handle::Impl::Seg& ls = lim.segs[li];
        uint64_t n = std::min(len, ls.size - in_seg);
        std::memcpy(ls.data + in_seg, src, static_cast<std::size_t>(n));
        src += n;
        len -= n;
        ++li;
        in_seg = 0;
    }
}

}  // namespace

// --- the public functions ------------------------------------------------------------------------

struct Context::Impl {
    explicit Impl(na::Context& c) noexcept : ctx(c) {}
    na::Context& ctx;
    StatePool pool;
};

namespace {
/// How long the destructor waits for canceled transfers to complete.
constexpr Duration kDrainLimit = std::chrono::seconds(10);
Result<void> cancel_locked(TransferState* s, uint64_t gen);
}  // namespace

Context::Context(na::Context& ctx) : impl_(std::make_unique<Impl>(ctx)) {}

Context::~Context() {
    if (!impl_ || impl_->pool.active() == 0) return;
    if (impl_->ctx.transport().inherited()) {
        (void)impl_.release();  // a child across fork(): the transfers are the parent's
        return;
    }
    std::size_t n = cancel_all();
    TALARIA_LOG(bulk, debug, "bulk context: canceled {} transfers still in flight", n);
    na::Context& ctx = impl_->ctx;
    TimePoint limit = deadline_after(kDrainLimit);
    for (;;) {
        ctx.trigger();
        if (impl_->pool.active() == 0) return;
        if (deadline_passed(limit)) break;
        (void)ctx.progress(std::chrono::milliseconds(10));
    }
    // Their na operations may still complete and run callbacks that touch the states: keep
    // the states (a leak) rather than free memory under them.
    TALARIA_LOG(bulk, error,
                "bulk context: {} canceled transfers did not complete within {} s; their "
                "states are leaked so that late completions stay safe",
                impl_->pool.active(),
                std::chrono::duration_cast<std::chrono::seconds>(kDrainLimit).count());
    (void)impl_.release();
}

na::Context& Context::na_context() const noexcept {
    return impl_->ctx;
}

std::size_t Context::in_flight() const noexcept {
    return impl_->pool.active();
}

std::size_t Context::cancel_all() {
    std::size_t n = 0;
    impl_->pool.for_each([&](TransferState* s) {
        std::lock_guard g(s->mu);
        if (s->active && cancel_locked(s, s->gen)) ++n;
    });
    return n;
}

Result<TransferId> Context::transfer(Direction dir, const na::Addr& peer, const Handle& remote,
                                     std::size_t remote_off, const Handle& local,
                                     std::size_t local_off, std::size_t len, DoneFn done) {
    na::Context& ctx = impl_->ctx;
    if (ctx.transport().inherited()) [[unlikely]]
        return Error(Errc::invalid_state,
                     fmt::format("bulk transfer: its transport was opened by process {} and "
                                 "inherited across fork; open an engine in this process",
                                 ctx.transport().opened_by()));
    if (dir != Direction::pull && dir != Direction::push)
        return Error(Errc::invalid_argument,
                     fmt::format("bulk transfer: invalid direction {}", unsigned(dir)));
    const char* dn = dir_name(dir);
    if (!remote || !local)
        return Error(Errc::invalid_argument, fmt::format("bulk {}: the {} handle is empty", dn,
                                                         remote ? "local" : "remote"));
    if (!done)
        return Error(Errc::invalid_argument, fmt::format("bulk {}: no completion callback", dn));
    na::Transport* t = &ctx.transport();
    for (const Handle* h : {&remote, &local})
        if (h->transport() != t)
            return Error(Errc::invalid_argument,
                         fmt::format("bulk {}: the {} handle belongs to another transport ({}) "
                                     "than the context's ({})",
                                     dn, h == &remote ? "remote" : "local", h->transport()->name(),
                                     t->name()));
    if (remote.local())
        return Error(Errc::invalid_argument,
                     fmt::format("bulk {}: the remote handle is a local registration (decode the "
                                 "peer's encoding to get a remote handle)",
                                 dn));
    if (!local.local())
        return Error(Errc::invalid_argument,
                     fmt::format("bulk {}: the local handle was decoded from a peer (register "
                                 "local memory with Handle::create)",
                                 dn));
    if (remote_off > remote.size() || len > remote.size() - remote_off)
        return Error(Errc::out_of_range,
                     fmt::format("bulk {}: remote range [{}, +{}) is outside the {}-byte handle",
                                 dn, remote_off, len, remote.size()));
    if (local_off > local.size() || len > local.size() - local_off)
        return Error(Errc::out_of_range,
                     fmt::format("bulk {}: local range [{}, +{}) is outside the {}-byte handle", dn,
                                 local_off, len, local.size()));
    bool pull = dir == Direction::pull;
    Access src = pull ? remote.access() : local.access();
    Access dst = pull ? local.access() : remote.access();
    if (!readable(src))
        return Error(Errc::access_denied,
                     fmt::format("bulk {}: the {} handle is {}, not readable", dn,
                                 pull ? "remote" : "local", access_name(src)));
    if (!writable(dst))
        return Error(Errc::access_denied,
                     fmt::format("bulk {}: the {} handle is {}, not writable", dn,
                                 pull ? "local" : "remote", access_name(dst)));
    const Handle::Impl& rim = *remote.impl();
    bool net = len > 0 && !rim.is_inline;
    if (net && rim.relayed)
        return Error(Errc::unreachable,
                     fmt::format("bulk {}: the remote handle's owner does not listen, and the "
                                 "handle was relayed here by another process: only the process "
                                 "its owner sent it to can reach the owner (transfer there, or "
                                 "open the owner's engine with listen and bind the handle to it)",
                                 dn));
    if (net && (!peer || peer.impl()->transport() != t))
        return Error(
            Errc::invalid_argument,
            fmt::format(
                "bulk {}: {} (pass remote.owner(), or look the owner up on this "
                "transport)",
                dn, peer ? "the peer address belongs to another transport" : "no peer address"));

    TransferState* s = impl_->pool.acquire();
    if (!s)
        return Error(Errc::again,
                     fmt::format("bulk {}: {} transfers already in flight on this context (the "
                                 "most one bulk::Context holds, or memory ran out for more "
                                 "states): wait for some to complete, then retry",
                                 dn, impl_->pool.active()));
    std::unique_lock lk(s->mu);
    s->active = true;
    TransferId id{s, ++s->gen};
    s->ctx = &ctx;
    s->t = t;
    s->dir = dir;
    s->peer = peer;
    s->remote = remote;
    s->local = local;
    s->done = std::move(done);
    s->remote_start = remote_off;
    s->local_start = local_off;
    s->len = len;
    s->pos = 0;
    s->inflight = 0;
    s->free_slots = ~uint64_t(0);
    s->failed = false;
    s->canceled = false;
    s->saw_canceled = false;
    s->retry_pending = false;
    s->retries = 0;

    Next next = Next::finish;
    if (len > 0 && rim.is_inline) {
        copy_inline(rim, remote_off, *local.impl(), local_off, len);
        s->pos = len;
    } else if (len > 0) {
        const Handle::Impl& lim = *local.impl();
        s->ri = static_cast<uint32_t>(rim.segment_at(remote_off));
        s->roff = remote_off - rim.segs[s->ri].offset;
        s->li = static_cast<uint32_t>(lim.segment_at(local_off));
        s->loff = local_off - lim.segs[s->li].offset;
        next = pump_locked(s);
    }
    if (next == Next::wait) return id;

    // Nothing in flight: complete (or retry) from the context's trigger(), never from here.
    na::Callback cb;
    if (next == Next::retry)
        cb = [s](const na::Completion&) { on_retry(s); };
    else
        cb = [s](const na::Completion&) {
            std::unique_lock l(s->mu);
            finish(s, l);
        };
    auto r = ctx.post(std::move(cb));
    if (!r) {
        // Nothing was posted and the callback will not run: hand the error back instead.
        s->done = nullptr;
        s->remote = Handle();
        s->local = Handle();
        s->peer.reset();
        s->error = Error(Errc::ok);
        s->active = false;
        ++s->gen;
        lk.unlock();
        impl_->pool.release(s);
        return Error(r.code(), fmt::format("bulk {}: cannot queue the completion: {}", dn,
                                           r.error().describe()));
    }
    if (next == Next::retry) {
        s->retry_pending = true;
        s->retries = 1;
    }
    return id;
}

namespace {
/// cancel() with the state's mutex held.
Result<void> cancel_locked(TransferState* s, uint64_t gen) {
    if (!s->active || s->gen != gen)
        return Error(Errc::not_found, "bulk cancel: the transfer already completed");
    if (s->canceled) return ok();
    s->canceled = true;
    // Stop posting (pump_locked checks `canceled`) and ask na to stop what is in flight; each
    // piece still completes once, canceled or not, and the last one completes the transfer.
    uint64_t busy = ~s->free_slots;
    while (busy) {
        auto slot = static_cast<unsigned>(std::countr_zero(busy));
        busy &= busy - 1;
        (void)s->t->cancel(s->pieces[slot].id);
    }
    TALARIA_LOG(bulk, debug, "bulk {}: cancel with {} pieces in flight", dir_name(s->dir),
                s->inflight);
    return ok();
}
}  // namespace

Result<void> Context::cancel(TransferId id) {
    if (!id.valid()) return Error(Errc::invalid_argument, "bulk cancel: empty TransferId");
    auto* s = static_cast<TransferState*>(id.state);
    std::lock_guard g(s->mu);
    return cancel_locked(s, id.gen);
}

}  // namespace talaria::bulk
