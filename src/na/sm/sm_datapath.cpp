// sm transport hot path: posting sends and receives, the rings, progress, put/get and cancel.
// A busy-polling pair makes no system call per message: a send is a copy into a ring slot and
// a release store; the receiver finds it by polling the ring. Eventfds are rung only when the
// receiver announced it is about to sleep (RingCtl::waiting).
#include <poll.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "na/sm/sm_transport.hpp"
#include "talaria/util/cpu.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::sm {

namespace {

/// Spin-poll the rings this long before sleeping in epoll.
constexpr auto kSpin = std::chrono::microseconds(30);
/// While busy-polling, look at the sockets (accepts, handshakes, hang-ups) this often.
constexpr uint64_t kFdPollIntervalNs = 100'000;
/// put/get: bytes per iovec and iovecs per system call.
constexpr std::size_t kIovChunk = std::size_t(1) << 30;
constexpr std::size_t kIovBatch = 16;

/// memcpy for non-overlapping buffers, inline for the small messages of a busy round trip (a
/// library call costs more than copying 8 bytes).
inline void copy_msg(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
    if (n > 16) [[unlikely]] {
        std::memcpy(dst, src, n);
    } else if (n >= 8) {
        uint64_t a;
        uint64_t b;
        std::memcpy(&a, src, 8);
        std::memcpy(&b, src + n - 8, 8);
        std::memcpy(dst, &a, 8);
        std::memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4) {
        uint32_t a;
        uint32_t b;
        std::memcpy(&a, src, 4);
        std::memcpy(&b, src + n - 4, 4);
        std::memcpy(dst, &a, 4);
        std::memcpy(dst + n - 4, &b, 4);
    } else if (n != 0) {
        std::byte first = src[0];
        std::byte mid = src[n / 2];
        std::byte last = src[n - 1];
        dst[0] = first;
        dst[n / 2] = mid;
        dst[n - 1] = last;
    }
}

}  // namespace

// --- messages ------------------------------------------------------------------------------------

Result<OpId> SmTransport::post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                               std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                               Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, MsgKind::unexpected);
}

Result<OpId> SmTransport::post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                             std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                             Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, MsgKind::expected);
}

Result<OpId> SmTransport::post_send(Context& ctx, Callback&& cb, const MsgBuffer& buf,
                                    std::size_t len, const Addr& dest, uint8_t dest_ctx, Tag tag,
                                    MsgKind kind) {
    if (len > kMaxMsgSize || len > buf.size()) [[unlikely]]
        return Error(len > kMaxMsgSize ? Errc::message_too_large : Errc::invalid_argument,
                     fmt::format("sm send of {} bytes: {}", len,
                                 len > kMaxMsgSize
                                     ? fmt::format("the maximum message size is {}", kMaxMsgSize)
                                     : fmt::format("the buffer holds only {}", buf.size())));
    if (!dest || dest.impl()->transport() != this || &ctx.transport() != this) [[unlikely]]
        return Error(Errc::invalid_argument,
                     "sm send: the destination address or the context is not of this transport");
    auto* peer = dest.as<Peer>();
    std::lock_guard g(mu_);
    SmOp* op = pool_.acquire(
        ctx, std::move(cb),
        kind == MsgKind::unexpected ? OpType::send_unexpected : OpType::send_expected);
    if (!op) [[unlikely]]
        return ops_exhausted("sm", opts_.max_ops);
    op->peer = peer;
    op->data = buf.data();
    op->len = len;
    op->tag = tag;
    op->dest_ctx = dest_ctx;
    op->kind = kind;
    OpId id = op->id();
    if (peer->dead) [[unlikely]] {
        complete_op(op, Errc::disconnected);
        return id;
    }
    Conn* c = peer->send_conn;
    if (!c) [[unlikely]] {
        auto r = connect_locked(peer);
        if (!r) {
            pool_.release(op);
            return std::move(r).error();
        }
        c = *r;
    }
    if (c->pending_sends.empty() && ring_push(c, *op)) [[likely]] {
        complete_op(op, Errc::ok);  // copied into the ring: the buffer is free again
    } else {
        c->pending_sends.push_back(*op);
        op->list = &c->pending_sends;
        ++pending_sends_;
    }
    return id;
}

void SmTransport::Releaser::release(Op* op) noexcept {
    std::lock_guard g(t->mu_);
    t->pool_.release(op);
}

Errc SmTransport::fill_recv(SmOp* op, Addr&& source, Tag tag, uint8_t ctx, const std::byte* data,
                            std::size_t len) noexcept {
    op->completion.tag = tag;
    op->completion.context_id = ctx;
    op->completion.size = len;
    op->completion.source = std::move(source);  // one refcount increment per message
    if (len > op->len) return Errc::message_too_large;
    copy_msg(op->data, data, len);
    return Errc::ok;
}

Result<OpId> SmTransport::post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) {
    if (&ctx.transport() != this) [[unlikely]]
        return Error(Errc::invalid_argument, "sm recv: the context is not of this transport");
    std::lock_guard g(mu_);
    SmOp* op = pool_.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) [[unlikely]]
        return ops_exhausted("sm", opts_.max_ops);
    op->data = buf.data();
    op->len = buf.size();
    OpId id = op->id();
    CtxState& cs = ctxs_[ctx.id()];
    if (Stashed* s = cs.msgs.pop_front()) {
        Errc st = fill_recv(op, std::move(s->source), s->tag, s->ctx, s->data, s->len);
        stash_free(s);
        complete_op(op, st);
    } else {
        cs.recvs.push_back(*op);
        op->list = &cs.recvs;
    }
    return id;
}

Result<OpId> SmTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                             const Addr& source, Tag tag) {
    if (!source || source.impl()->transport() != this || &ctx.transport() != this) [[unlikely]]
        return Error(Errc::invalid_argument,
                     "sm recv_expected: the source address or the context is not of this "
                     "transport");
    auto* peer = source.as<Peer>();
    std::lock_guard g(mu_);
    SmOp* op = pool_.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) [[unlikely]]
        return ops_exhausted("sm", opts_.max_ops);
    op->data = buf.data();
    op->len = buf.size();
    op->peer = peer;
    op->tag = tag;
    OpId id = op->id();
    for (Stashed& s : expected_msgs_) {
        if (s.source.impl() != peer || s.tag != tag) continue;
        expected_msgs_.erase(s);
        Errc st = fill_recv(op, std::move(s.source), s.tag, s.ctx, s.data, s.len);
        stash_free(&s);
        complete_op(op, st);
        return id;
    }
    if (peer->dead) {
        complete_op(op, Errc::disconnected);
        return id;
    }
    expected_recvs_.push_back(*op);
    op->list = &expected_recvs_;
    return id;
}

Stashed* SmTransport::stash_alloc() noexcept {
    if (!stash_free_.empty()) {
        Stashed* s = stash_free_.back();
        stash_free_.pop_back();
        return s;
    }
    try {
        stash_all_.push_back(std::make_unique<Stashed>());
        stash_free_.reserve(stash_all_.size());
        return stash_all_.back().get();
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}

void SmTransport::stash_free(Stashed* s) noexcept {
    s->source.reset();
    stash_free_.push_back(s);  // cannot throw: reserved in stash_alloc
}

// --- rings ---------------------------------------------------------------------------------------

void SmTransport::ring_bell(Conn* c) noexcept {
    if (c->peer_evfd >= 0) {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t r = ::write(c->peer_evfd, &one, sizeof one);
    } else {
        send_wake_locked(c);  // handshake not finished: its socket is the only way to wake it
    }
}

bool SmTransport::ring_push(Conn* c, const SmOp& op) noexcept {
    if (c->broken) [[unlikely]]
        return false;
    uint64_t tail = c->tx_tail;
    if (tail - c->tx_head_cache >= kRingSlots) {
        uint64_t head = c->tx->head.load(std::memory_order_acquire);
        if (ring_fill(head, tail) < 0) [[unlikely]] {
            fail_conn_later(
                c, Errc::protocol_error,
                fmt::format("the peer set its ring head to {} with our tail at {}", head, tail));
            return false;
        }
        c->tx_head_cache = head;
        if (tail - head >= kRingSlots) return false;
    }
    std::byte* slot = c->tx_slots + (tail % kRingSlots) * kSlotSize;
    copy_msg(slot + kSlotHeaderSize, op.data, op.len);
    std::byte hdr[kSlotHeaderSize];
    encode_slot_header(hdr, SlotHeader{uint32_t(op.len), op.tag, op.kind, op.dest_ctx, 0});
    std::memcpy(slot, hdr, kSlotSeqOffset);  // everything but the sequence word
    c->tx_tail = tail + 1;
    // Publish: the sequence word last. Dekker with the consumer's arm_locked() (all seq_cst):
    // our publish before our flag load, its flag store before its slot check, so one of us
    // sees the other. On x86 this is one xchg. Only a sleeping consumer costs a system call.
    slot_seq(slot).store(uint32_t(tail + 1), std::memory_order_seq_cst);
    const uint64_t bit = wake_bit(op.dest_ctx);
    if (c->tx->waiting.load(std::memory_order_seq_cst) & bit) [[unlikely]] {
        if (c->tx->waiting.fetch_and(~bit, std::memory_order_acq_rel) & bit) ring_bell(c);
    }
    return true;
}

inline bool SmTransport::ring_ready(const Conn* c) noexcept {
    auto* slot = const_cast<std::byte*>(c->rx_slots) + (c->rx_head % kRingSlots) * kSlotSize;
    // seq_cst: arm_locked() re-checks with it after its flag stores (Dekker with ring_push).
    return slot_seq(slot).load(std::memory_order_seq_cst) == uint32_t(c->rx_head + 1);
}

void SmTransport::ring_drain(Conn* c) noexcept {
    uint64_t head = c->rx_head;
    // At most one ringful per call: a peer rewriting slots as fast as we read cannot keep us
    // here, and other connections get their turn.
    const uint64_t end = head + kRingSlots;
    while (head != end) {
        auto* slot = const_cast<std::byte*>(c->rx_slots) + (head % kRingSlots) * kSlotSize;
        if (slot_seq(slot).load(std::memory_order_acquire) != uint32_t(head + 1)) break;
        SlotHeader h;
        if (!decode_slot_header(slot, h)) [[unlikely]] {
            fail_conn_later(c, Errc::protocol_error,
                            fmt::format("corrupt header in ring slot {} (length above {}, unknown "
                                        "kind, or reserved bytes set)",
                                        head, kMaxMsgSize));
            break;
        }
        deliver_locked(c, h, slot + kSlotHeaderSize);
        ++head;
    }
    if (head == c->rx_head) return;
    const bool was_full = head == end;
    c->rx_head = head;
    // Free the slots. A producer that found the ring full sets space_wanted, then re-reads head
    // (seq_cst): a Dekker handshake, which needs a store-load fence here too. Paying it for every
    // message would put an atomic read-modify-write on the busy round trip, so: only when we
    // drained a whole ringful (the ring may have been full) do we store seq_cst; otherwise a
    // release store, and the rare producer that armed just as we freed space is caught by
    // check_space_wanted_locked(), run with a fence every few dozen polls and before we sleep.
    if (was_full) [[unlikely]] {
        c->rx->head.store(head, std::memory_order_seq_cst);
    } else {
        c->rx->head.store(head, std::memory_order_release);
    }
    if (c->rx->space_wanted.load(was_full ? std::memory_order_seq_cst
                                          : std::memory_order_relaxed) != 0) [[unlikely]] {
        if (c->rx->space_wanted.exchange(0, std::memory_order_acq_rel) != 0) ring_bell(c);
    }
}

void SmTransport::check_space_wanted_locked() noexcept {
    // Pairs with the producer's seq_cst space_wanted store and head re-load: after this fence,
    // either we see its flag or it sees every head we published before it.
#if defined(__SANITIZE_THREAD__)
    // GCC's TSan does not support fences (-Wtsan): a seq_cst read-modify-write is the same full
    // barrier on the hardware, and TSan checks data races, not this ordering.
    fence_word_.fetch_add(1, std::memory_order_seq_cst);
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
    for (Conn* c : active_) {
        if (c->broken) continue;
        if (c->rx->space_wanted.load(std::memory_order_relaxed) != 0) [[unlikely]] {
            if (c->rx->space_wanted.exchange(0, std::memory_order_acq_rel) != 0) ring_bell(c);
        }
    }
}

void SmTransport::deliver_locked(Conn* c, const SlotHeader& h, const std::byte* payload) noexcept {
    Peer* p = c->peer;
    if (h.kind == MsgKind::unexpected) {
        // A context that does not exist (or takes no unexpected messages): the lowest one that
        // takes them gets the message (Completion::context_id still names the one asked for),
        // so the layer above can answer the sender instead of leaving it waiting.
        CtxState* csp =
            route_unexpected(ctxs_, ctxs_.size(), h.ctx, [](const CtxState& cs) { return cs.ctx; });
        if (!csp) [[unlikely]] {
            TALARIA_LOG(sm, warn,
                        "sm://{}: dropped an unexpected message (tag {}, {} bytes) from sm://{} "
                        "for context {}: no context exists here",
                        name_, h.tag, h.len, p->name, h.ctx);
            return;
        }
        CtxState& cs = *csp;
        if (SmOp* op = cs.recvs.pop_front()) [[likely]] {
            op->list = nullptr;
            complete_op(op, fill_recv(op, Addr(p), h.tag, h.ctx, payload, h.len));
            return;
        }
        if (Stashed* s = stash_copy_locked(p, h, payload)) cs.msgs.push_back(*s);
        return;
    }
    for (SmOp& op : expected_recvs_) {
        if (op.peer != p || op.tag != h.tag) continue;
        expected_recvs_.erase(op);
        op.list = nullptr;
        complete_op(&op, fill_recv(&op, Addr(p), h.tag, h.ctx, payload, h.len));
        return;
    }
    if (Stashed* s = stash_copy_locked(p, h, payload)) expected_msgs_.push_back(*s);
}

Stashed* SmTransport::stash_copy_locked(Peer* p, const SlotHeader& h,
                                        const std::byte* payload) noexcept {
    // A message nobody has posted a receive for yet: copy it out so the ring slot is freed.
    Stashed* s = stash_alloc();
    if (!s) [[unlikely]] {
        TALARIA_LOG(sm, error, "sm://{}: out of memory: dropped a message from sm://{}", name_,
                    p->name);
        return nullptr;
    }
    s->source = Addr(p);
    s->tag = h.tag;
    s->ctx = h.ctx;
    s->len = h.len;
    std::memcpy(s->data, payload, h.len);
    return s;
}

void SmTransport::retry_sends_locked() noexcept {
    for (std::size_t i = 0; i < active_.size() && pending_sends_ != 0; ++i) {
        Conn* c = active_[i];
        while (SmOp* op = c->pending_sends.front()) {
            if (!ring_push(c, *op)) break;
            c->pending_sends.pop_front();
            op->list = nullptr;
            --pending_sends_;
            complete_op(op, Errc::ok);
        }
    }
}

void SmTransport::poll_rings_locked() noexcept {
    for (std::size_t i = 0; i < active_.size(); ++i) {
        Conn* c = active_[i];
        // An empty ring costs one load of its next slot's sequence word (no call).
        if (!c->broken && ring_ready(c)) ring_drain(c);
    }
    if (pending_sends_ != 0) [[unlikely]]
        retry_sends_locked();
}

uint64_t SmTransport::wake_bits_locked(const Context& ctx) const noexcept {
    uint64_t bits = wake_bit(ctx.id());
    // Messages for a context id nobody has (or whose context takes no unexpected messages) go
    // to the lowest context that takes them (route_unexpected): its sleeper also answers for
    // those ids.
    auto ctx_of = [](const CtxState& cs) { return cs.ctx; };
    // The context an id nobody takes is routed to (UINT8_MAX is never a context id).
    if (route_unexpected(ctxs_, ctxs_.size(), UINT8_MAX, ctx_of) != &ctxs_[ctx.id()]) return bits;
    uint64_t present = 0;
    for (std::size_t i = 0; i < ctxs_.size(); ++i)
        if (ctxs_[i].ctx && ctxs_[i].ctx->takes_unexpected()) present |= wake_bit(uint8_t(i));
    return bits | ~present;
}

bool SmTransport::arm_locked(uint64_t bits) noexcept {
    armed_ |= bits;
    // Dekker with ring_push()/ring_drain() on the other side, all seq_cst: flags before the
    // re-check.
    for (Conn* c : active_) {
        c->rx->waiting.fetch_or(bits, std::memory_order_seq_cst);
        if (!c->pending_sends.empty()) c->tx->space_wanted.store(1, std::memory_order_seq_cst);
    }
    // A producer waiting for space we freed with a release store must hear of it before we
    // sleep (the waiting stores above are seq_cst; the fence makes the pairing explicit).
    check_space_wanted_locked();
    if (!broken_.empty()) return false;
    for (Conn* c : active_) {
        if (ring_ready(c)) return false;
        if (!c->pending_sends.empty() &&
            c->tx_tail - c->tx->head.load(std::memory_order_seq_cst) < kRingSlots)
            return false;
    }
    return true;
}

void SmTransport::disarm_locked(uint64_t bits) noexcept {
    // Only these bits: other contexts' sleepers keep theirs (a waking thread that cleared every
    // flag left the others asleep with nobody to ring them: issue 9's ~100 ms stalls).
    // space_wanted stays set: the peer clears it when it rings (one spurious bell at most).
    uint64_t keep = try_armed_;  // bits another sleeper still needs (ids >= 63 share a bit)
    for (const auto& cs : ctxs_)
        keep |= cs.armed;
    armed_ = keep;
    bits &= ~keep;
    if (bits == 0) return;
    for (Conn* c : active_)
        c->rx->waiting.fetch_and(~bits, std::memory_order_relaxed);
}

// --- progress ------------------------------------------------------------------------------------

Result<void> SmTransport::progress(Context& ctx, TimePoint deadline) {
    TimePoint spin_end{};
    for (;;) {
        bool periodic;
        {
            std::lock_guard g(mu_);
            periodic = (++busy_polls_ & 63) == 0;
            if (try_armed_) [[unlikely]] {
                // try_wait() armed us, so someone may have slept on our fds: look at them now.
                uint64_t bits = try_armed_;
                try_armed_ = 0;
                disarm_locked(bits);
                poll_fds_locked();
                last_fd_poll_ns_ = now_ns();
            }
            poll_rings_locked();
        }
        if (ctx.has_completions()) {
            // Busy: no clock read here, but look at the sockets every so often all the same.
            if (periodic) [[unlikely]] {
                std::lock_guard g(mu_);
                check_space_wanted_locked();
                uint64_t t = now_ns();
                if (t - last_fd_poll_ns_ >= kFdPollIntervalNs) {
                    last_fd_poll_ns_ = t;
                    poll_fds_locked();
                }
            }
            return ok();
        }
        if (deadline == TimePoint::min()) {
            // "Poll once", said without a clock read (reading it costs as much as a poll).
            if (periodic) [[unlikely]] {
                std::lock_guard g(mu_);
                check_space_wanted_locked();
                uint64_t t = now_ns();
                if (t - last_fd_poll_ns_ >= kFdPollIntervalNs || !broken_.empty()) {
                    last_fd_poll_ns_ = t;
                    poll_fds_locked();
                }
                return ctx.has_completions() ? ok() : Result<void>(Errc::timeout);
            }
            return Errc::timeout;  // nothing was queued by the poll above (checked just now)
        }
        TimePoint now = Clock::now();
        {
            auto t = uint64_t(
                std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch())
                    .count());
            std::lock_guard g(mu_);
            if (periodic) [[unlikely]]
                check_space_wanted_locked();
            if (t - last_fd_poll_ns_ >= kFdPollIntervalNs || !broken_.empty()) {
                last_fd_poll_ns_ = t;
                poll_fds_locked();
            }
        }
        if (ctx.has_completions()) return ok();
        if (now >= deadline) return Errc::timeout;
        if (spin_end == TimePoint{}) spin_end = now + kSpin;
        if (now < spin_end) {
            cpu_relax();
            continue;
        }
        // Sleep until a doorbell for this context, a socket event, a completion queued by
        // another thread, or the deadline. Each sleeper waits on its own context's eventfd
        // (which no other thread reads) and on the transport's epoll fd (level: every sleeper
        // sees it readable), so a wake-up meant for one context is never taken by another.
        if (!ctx.prepare_block()) return ok();
        bool idle;
        uint64_t bits;
        {
            std::lock_guard g(mu_);
            bits = wake_bits_locked(ctx);
            ctxs_[ctx.id()].armed = bits;
            idle = arm_locked(bits);
        }
        pollfd fds[2] = {{ctx.event_fd(), POLLIN, 0}, {epfd_, POLLIN, 0}};
        int n = idle ? ::poll(fds, 2, ms_until(deadline)) : 0;
        ctx.end_block();
        ctx.drain_event_fd();
        std::lock_guard g(mu_);
        ctxs_[ctx.id()].armed = 0;
        disarm_locked(bits);
        if (n > 0 && (fds[1].revents & POLLIN)) poll_fds_locked();
        process_broken_locked();
        last_fd_poll_ns_ = now_ns();
    }
}

bool SmTransport::try_wait() {
    // No context named: arm for every context (the caller blocks on a context's wait_fd, which
    // nests the transport's epoll fd); the next progress() withdraws these bits.
    std::lock_guard g(mu_);
    try_armed_ = ~uint64_t{0};
    if (arm_locked(try_armed_)) return true;
    uint64_t bits = try_armed_;
    try_armed_ = 0;
    disarm_locked(bits);
    return false;
}

// --- put/get -------------------------------------------------------------------------------------

Result<OpId> SmTransport::post_put(Context& ctx, Callback cb, const MemHandle& local,
                                   std::size_t local_off, const MemHandle& remote,
                                   std::size_t remote_off, std::size_t len,
                                   const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), local, local_off, remote, remote_off, len, remote_addr,
                    true);
}

Result<OpId> SmTransport::post_get(Context& ctx, Callback cb, const MemHandle& local,
                                   std::size_t local_off, const MemHandle& remote,
                                   std::size_t remote_off, std::size_t len,
                                   const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), local, local_off, remote, remote_off, len, remote_addr,
                    false);
}

Result<OpId> SmTransport::post_rma(Context& ctx, Callback&& cb, const MemHandle& local,
                                   std::size_t local_off, const MemHandle& remote,
                                   std::size_t remote_off, std::size_t len, const Addr& remote_addr,
                                   bool is_put) {
    const char* what = is_put ? "put" : "get";
    if (!local || local->transport() != this || !local->local())
        return Error(
            Errc::invalid_argument,
            fmt::format("sm {}: the local handle must be registered with this transport", what));
    if (!remote || remote->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("sm {}: the remote handle is not of this transport", what));
    if (!remote_addr || remote_addr.impl()->transport() != this || &ctx.transport() != this)
        return Error(
            Errc::invalid_argument,
            fmt::format("sm {}: the address or the context is not of this transport", what));
    auto* peer = remote_addr.as<Peer>();
    const auto* rm = remote.as<SmMem>();
    // Bounds and access are checked here, at the origin: the target is never touched when
    // they fail. The status is the completion's, like a target-side check would give.
    Errc st = Errc::ok;
    if (local_off > local->length() || len > local->length() - local_off) {
        TALARIA_LOG(sm, debug, "sm {}: local [{}, +{}) outside the {}-byte region", what, local_off,
                    len, local->length());
        st = Errc::out_of_range;
    } else if (remote_off > remote->length() || len > remote->length() - remote_off) {
        TALARIA_LOG(sm, debug, "sm {}: remote [{}, +{}) outside the {}-byte region", what,
                    remote_off, len, remote->length());
        st = Errc::out_of_range;
    } else if ((uint8_t(remote->access()) &
                (is_put ? uint8_t(Access::write_only) : uint8_t(Access::read_only))) == 0) {
        TALARIA_LOG(sm, debug, "sm {}: the remote region does not allow it", what);
        st = Errc::access_denied;
    }
    std::unique_lock g(mu_);
    SmOp* op = pool_.acquire(ctx, std::move(cb), is_put ? OpType::put : OpType::get);
    if (!op) return ops_exhausted("sm", opts_.max_ops);
    op->peer = peer;
    op->is_put = is_put;
    op->local = reinterpret_cast<std::byte*>(local->base()) + (st == Errc::ok ? local_off : 0);
    op->remote = rm->base() + (st == Errc::ok ? remote_off : 0);
    op->len = len;
    op->remote_pid = rm->pid;
    op->remote_instance = rm->instance;
    OpId id = op->id();
    if (st == Errc::ok && peer->dead) st = Errc::disconnected;
    if (st != Errc::ok || len == 0) {
        if (st == Errc::ok) op->completion.size = 0;
        complete_op(op, st);
        return id;
    }
    if (peer->self || (peer->identified && peer->probed)) {
        if (peer->rma_errc != Errc::ok) {
            pool_.release(op);
            return Error(peer->rma_errc, peer->rma_error);
        }
        if (rm->pid != peer->pid || rm->instance != peer->instance) {
            pool_.release(op);
            return Error(
                Errc::invalid_argument,
                fmt::format("sm {}: the remote handle belongs to pid {} (instance "
                            "{:#x}), not to sm://{} (pid {}, instance {:#x}): pass the "
                            "address of the process that registered it",
                            what, rm->pid, rm->instance, peer->name, peer->pid, peer->instance));
        }
        g.unlock();  // a large copy must not hold up other threads' progress
        st = exec_rma(*op);
        g.lock();
        complete_op(op, st);
        return id;
    }
    // Handshake not done yet: the peer's pid is not verified. Connect, run it on the ack.
    if (!peer->send_conn) {
        auto r = connect_locked(peer);
        if (!r) {
            pool_.release(op);
            return std::move(r).error();
        }
    }
    peer->pending_rma.push_back(*op);
    op->list = &peer->pending_rma;
    return id;
}

Errc SmTransport::exec_rma(SmOp& op) noexcept {
    if (op.peer->self) {
        auto* remote = reinterpret_cast<std::byte*>(op.remote);
        if (op.is_put)
            std::memmove(remote, op.local, op.len);
        else
            std::memmove(op.local, remote, op.len);
        op.completion.size = op.len;
        return Errc::ok;
    }
    std::size_t done = 0;
    while (done < op.len) {
        iovec l[kIovBatch];
        iovec r[kIovBatch];
        std::size_t k = 0;
        for (std::size_t off = done; off < op.len && k < kIovBatch; ++k) {
            std::size_t n = std::min(kIovChunk, op.len - off);
            l[k] = iovec{op.local + off, n};
            r[k] = iovec{reinterpret_cast<void*>(op.remote + off), n};
            off += n;
        }
        ssize_t n = op.is_put ? ::process_vm_writev(pid_t(op.remote_pid), l, k, r, k, 0)
                              : ::process_vm_readv(pid_t(op.remote_pid), l, k, r, k, 0);
        if (n > 0) {
            done += std::size_t(n);  // partial transfers continue where they stopped
            continue;
        }
        int err = n < 0 ? errno : EIO;
        if (err == EINTR) continue;
        Errc e;
        switch (err) {
            case EPERM:
                e = Errc::permission_denied;
                break;
            case ESRCH:
                e = Errc::disconnected;
                break;
            case EFAULT:
                e = Errc::out_of_range;
                break;
            case ENOMEM:
                e = Errc::no_memory;
                break;
            default:
                e = Errc::io_error;
        }
        TALARIA_LOG(sm, warn,
                    "sm {} of {} bytes with sm://{} (pid {}) failed after {} bytes: {}: {}{}",
                    op.is_put ? "put" : "get", op.len, op.peer->name, op.remote_pid, done,
                    op.is_put ? "process_vm_writev" : "process_vm_readv", std::strerror(err),
                    err == EPERM    ? " (the kernel forbids access to the peer's memory: see "
                                      "/proc/sys/kernel/yama/ptrace_scope and CAP_SYS_PTRACE)"
                    : err == EFAULT ? " (the remote region is no longer mapped: was it freed?)"
                                    : "");
        op.completion.size = done;
        return e;
    }
    op.completion.size = op.len;
    return Errc::ok;
}

// --- cancel --------------------------------------------------------------------------------------

Result<void> SmTransport::cancel(OpId id) {
    std::lock_guard g(mu_);
    SmOp* op = pool_.lookup(id);
    if (!op)
        return Error(Errc::not_found, "sm cancel: the operation has already completed (stale id)");
    if (op->list) {
        OpType t = op->completion.type;
        if (t == OpType::send_unexpected || t == OpType::send_expected) --pending_sends_;
        op->list->erase(*op);
        op->list = nullptr;
        complete_op(op, Errc::canceled);
    }
    return ok();  // otherwise it is being carried out and completes with its own status
}

}  // namespace talaria::na::sm
