// sm transport hot path: posting sends and receives, the rings, progress, put/get and cancel.
// A busy-polling pair makes no system call per message: a send is a copy into a ring slot and
// a release store; the receiver finds it by polling the ring. Eventfds are rung only when the
// receiver announced it is about to sleep (RingCtl::waiting).
//
// Everything here runs in one lane (the context's progress domain, see Lane) under that lane's
// lock alone: two contexts driven by two threads share no lock and no written cache line on
// this path. The transport's setup lock is taken only to connect, on socket events and on
// failures (sm_setup.cpp).
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "na/base/matcher.hpp"
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

Lane::Lane(uint8_t lane_id, const Options& o)
    : mu(o.thread_safe), id(lane_id), pool(o.max_ops, false, &releaser) {
    bell_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Lane::~Lane() {
    if (bell_fd >= 0) ::close(bell_fd);
}

void Lane::ring_own_bell() const noexcept {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(bell_fd, &one, sizeof one);
}

namespace {
void drain_bell(int fd) noexcept {
    uint64_t v;
    while (::read(fd, &v, sizeof v) > 0) {
    }
}

/// Copy a message of connection `c` out of its ring slot into `s`.
void fill_stash(Stashed& s, const Conn& c, const SlotHeader& h, const std::byte* payload) noexcept {
    s.source = c.source;
    s.tag = h.tag;
    s.ctx = h.ctx;
    s.kind = h.kind;
    s.len = h.len;
    std::memcpy(s.data, payload, h.len);
}
}  // namespace

void Lane::Releaser::release(Op* op) noexcept {
    std::lock_guard g(lane->mu);
    lane->pool.release(op);
}

Lane& SmTransport::lane_of(Context& ctx) noexcept {
    return static_cast<SmContext&>(ctx).lane();
}

Conn* SmTransport::route_locked(Lane& l, const Peer* peer, uint8_t remote_ctx) noexcept {
    if (l.last_route < l.routes.size()) [[likely]] {
        const Lane::Route& r = l.routes[l.last_route];
        if (r.peer == peer && r.remote_ctx == remote_ctx) [[likely]]
            return r.conn;
    }
    for (std::size_t i = 0; i < l.routes.size(); ++i) {
        if (l.routes[i].peer == peer && l.routes[i].remote_ctx == remote_ctx) {
            l.last_route = i;
            return l.routes[i].conn;
        }
    }
    return nullptr;
}

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
    Peer* peer = peer_of(dest);
    Lane& l = lane_of(ctx);
    std::unique_lock g(l.mu);
    Conn* c = route_locked(l, peer, dest_ctx);
    if (!c) [[unlikely]] {
        // First message from this context to that one: connect (setup lock, not ours).
        g.unlock();
        TALARIA_CHECK(ensure_route(l, peer, dest_ctx));
        g.lock();
        c = route_locked(l, peer, dest_ctx);  // nullptr: the peer is dead (or died meanwhile)
    }
    SmOp* op = l.pool.acquire(
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
    if (!c || peer->dead.load(std::memory_order_relaxed)) [[unlikely]] {
        complete_op(op, Errc::disconnected);
        return id;
    }
    if (c->pending_sends.empty() && ring_push(c, *op)) [[likely]] {
        complete_op(op, Errc::ok);  // copied into the ring: the buffer is free again
    } else {  // the ring is full (or others wait before it): in order, once there is room
        // Counted once per stall, as the first send queues: not a shared atomic per send.
        if (c->pending_sends.empty()) note(LinkEvent::backpressure);
        c->pending_sends.push_back(*op);
        op->list = &c->pending_sends;
        ++l.pending_sends;
    }
    return id;
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
    Lane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    SmOp* op = l.pool.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) [[unlikely]]
        return ops_exhausted("sm", opts_.max_ops);
    op->data = buf.data();
    op->len = buf.size();
    OpId id = op->id();
    if (Stashed* s = l.msgs.pop_front()) {
        Peer* from = s->charged;  // the completion's source keeps it alive
        s->charged = nullptr;
        Errc st = fill_recv(op, std::move(s->source), s->tag, s->ctx, s->data, s->len);
        stash_free(l, s);
        if (from) from->stashed.fetch_sub(1, std::memory_order_relaxed);
        complete_op(op, st);
        if (l.paused != 0) [[unlikely]]
            resume_paused_locked(l);
    } else {
        l.recvs.push_back(*op);
        op->list = &l.recvs;
    }
    return id;
}

Result<OpId> SmTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                             const Addr& source, Tag tag) {
    if (!source || source.impl()->transport() != this || &ctx.transport() != this) [[unlikely]]
        return Error(Errc::invalid_argument,
                     "sm recv_expected: the source address or the context is not of this "
                     "transport");
    Peer* peer = peer_of(source);
    Lane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    SmOp* op = l.pool.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) [[unlikely]]
        return ops_exhausted("sm", opts_.max_ops);
    op->data = buf.data();
    op->len = buf.size();
    op->peer = peer;
    op->tag = tag;
    OpId id = op->id();
    for (Stashed& s : l.expected_msgs) {
        if (peer_of(s.source) != peer || s.tag != tag) continue;
        l.expected_msgs.erase(s);
        l.expected_bytes -= s.len;
        Errc st = fill_recv(op, std::move(s.source), s.tag, s.ctx, s.data, s.len);
        stash_free(l, &s);
        complete_op(op, st);
        return id;
    }
    // fail_peer_locked() marks the peer dead before it looks at the lanes' receives (under
    // their locks): either we see `dead` here or it finds this receive.
    if (peer->dead.load(std::memory_order_acquire)) {
        complete_op(op, Errc::disconnected);
        return id;
    }
    l.expected_recvs.push_back(*op);
    op->list = &l.expected_recvs;
    return id;
}

Stashed* SmTransport::stash_alloc(Lane& l) noexcept {
    if (!l.stash_free.empty()) {
        Stashed* s = l.stash_free.back();
        l.stash_free.pop_back();
        return s;
    }
    try {
        l.stash_all.push_back(std::make_unique<Stashed>());
        l.stash_free.reserve(l.stash_all.size());
        return l.stash_all.back().get();
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}

void SmTransport::stash_free(Lane& l, Stashed* s) noexcept {
    if (s->charged) {
        s->charged->stashed.fetch_sub(1, std::memory_order_relaxed);
        s->charged = nullptr;
    }
    if (s->loose) {
        delete s;
        return;
    }
    s->source.reset();
    l.stash_free.push_back(s);  // cannot throw: reserved in stash_alloc
}

// --- rings ---------------------------------------------------------------------------------------

void SmTransport::ring_bell(Conn* c) noexcept {
    if (c->peer_evfd >= 0) {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t r = ::write(c->peer_evfd, &one, sizeof one);
    } else {
        send_wake(c);  // handshake not finished: its socket is the only way to wake it
    }
}

bool SmTransport::ring_push(Conn* c, const SmOp& op) noexcept {
    if (c->broken.load(std::memory_order_relaxed)) [[unlikely]]
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
    if (c->tx->waiting.load(std::memory_order_seq_cst) != 0) [[unlikely]] {
        if (c->tx->waiting.exchange(0, std::memory_order_acq_rel) != 0) ring_bell(c);
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
        if (c->paused) [[unlikely]]
            break;  // back-pressure: the rest waits in the ring (resume_paused_locked)
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

void SmTransport::check_space_wanted_locked(Lane& l) noexcept {
    // Pairs with the producer's seq_cst space_wanted store and head re-load: after this fence,
    // either we see its flag or it sees every head we published before it.
#if defined(__SANITIZE_THREAD__)
    // GCC's TSan does not support fences (-Wtsan): a seq_cst read-modify-write is the same full
    // barrier on the hardware, and TSan checks data races, not this ordering.
    l.fence_word.fetch_add(1, std::memory_order_seq_cst);
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
    for (Conn* c : l.active) {
        if (c->broken.load(std::memory_order_relaxed)) continue;
        if (c->rx->space_wanted.load(std::memory_order_relaxed) != 0) [[unlikely]] {
            if (c->rx->space_wanted.exchange(0, std::memory_order_acq_rel) != 0) ring_bell(c);
        }
    }
}

void SmTransport::deliver_locked(Conn* c, const SlotHeader& h, const std::byte* payload) noexcept {
    Lane& l = *c->lane;
    Peer* p = c->peer;
    // A connection joins the context the peer asked for, so its messages name this lane. They
    // do not when that context did not exist at the handshake (the connection joined the one
    // its messages are routed to), takes no unexpected messages, or was destroyed since: then
    // the lane they belong to takes them through its inbox (rare path).
    if (h.ctx != l.id || !l.ctx || (h.kind == MsgKind::unexpected && !l.ctx->takes_unexpected()))
        [[unlikely]] {
        hand_over_locked(l, c, h, payload);
        return;
    }
    if (h.kind == MsgKind::unexpected) {
        if (SmOp* op = l.recvs.pop_front()) [[likely]] {
            op->list = nullptr;
            complete_op(op, fill_recv(op, Addr(c->source), h.tag, h.ctx, payload, h.len));
            return;
        }
        if (Stashed* s = stash_copy_locked(l, c, h, payload)) [[unlikely]] {
            l.msgs.push_back(*s);
            s->charged = p;
            const uint32_t mine = p->stashed.fetch_add(1, std::memory_order_relaxed) + 1;
            if (mine >= kMaxStashedPerPeer || l.msgs.size() >= kMaxStashedUnexpected)
                pause_locked(l, c);
        }
        return;
    }
    for (SmOp& op : l.expected_recvs) {
        if (op.peer != p || op.tag != h.tag) continue;
        l.expected_recvs.erase(op);
        op.list = nullptr;
        complete_op(&op, fill_recv(&op, Addr(c->source), h.tag, h.ctx, payload, h.len));
        return;
    }
    if (Stashed* s = stash_copy_locked(l, c, h, payload)) queue_expected_locked(l, s);
}

void SmTransport::hand_over_locked(Lane& from, const Conn* c, const SlotHeader& h,
                                   const std::byte* payload) noexcept {
    const Peer* p = c->peer;
    auto* s = new (std::nothrow) Stashed;
    if (!s) [[unlikely]] {
        TALARIA_LOG(sm, error, "sm://{}: out of memory: dropped a message from sm://{}", name_,
                    p->name);
        return;
    }
    s->loose = true;
    fill_stash(*s, *c, h, payload);
    Lane* to = nullptr;
    {
        std::lock_guard g(route_mu_);
        auto ctx_of = [](const std::unique_ptr<Lane>& x) -> const Context* {
            return x ? x->ctx : nullptr;
        };
        if (h.kind == MsgKind::unexpected) {
            // A context that does not exist (or takes no unexpected messages): the lowest one
            // that takes them gets the message (Completion::context_id still names the one asked
            // for), so the layer above can answer the sender instead of leaving it waiting.
            if (auto* x = route_unexpected(lanes_, lanes_.size(), h.ctx, ctx_of)) to = x->get();
        } else if (h.ctx < lanes_.size() && ctx_of(lanes_[h.ctx])) {
            to = lanes_[h.ctx].get();
        } else {
            for (auto& x : lanes_)
                if (ctx_of(x)) {
                    to = x.get();
                    break;
                }
        }
        if (to && to != &from) {
            to->inbox.push_back(*s);
            to->has_inbox.store(true, std::memory_order_seq_cst);
        }
    }
    if (to && to != &from) {
        to->ring_own_bell();  // its thread may sleep (lanes and their bells outlive contexts)
        return;
    }
    if (!to) {
        TALARIA_LOG(sm, warn,
                    "sm://{}: dropped a message (tag {}, {} bytes) from sm://{} for context {}: "
                    "no context exists here that takes it",
                    name_, h.tag, h.len, p->name, h.ctx);
        delete s;
        return;
    }
    accept_stashed_locked(from, s);  // it belongs here after all
}

void SmTransport::drain_inbox_locked(Lane& l) noexcept {
    IntrusiveList<Stashed> got;
    {
        std::lock_guard g(route_mu_);
        got.splice_back(l.inbox);
        l.has_inbox.store(false, std::memory_order_relaxed);
    }
    while (Stashed* s = got.pop_front())
        accept_stashed_locked(l, s);
}

void SmTransport::accept_stashed_locked(Lane& l, Stashed* s) noexcept {
    if (s->kind == MsgKind::unexpected) {
        if (SmOp* op = l.recvs.pop_front()) {
            op->list = nullptr;
            Errc st = fill_recv(op, std::move(s->source), s->tag, s->ctx, s->data, s->len);
            stash_free(l, s);
            complete_op(op, st);
        } else {
            l.msgs.push_back(*s);
        }
        return;
    }
    for (SmOp& op : l.expected_recvs) {
        if (op.peer != peer_of(s->source) || op.tag != s->tag) continue;
        l.expected_recvs.erase(op);
        op.list = nullptr;
        Errc st = fill_recv(&op, std::move(s->source), s->tag, s->ctx, s->data, s->len);
        stash_free(l, s);
        complete_op(&op, st);
        return;
    }
    queue_expected_locked(l, s);
}

void SmTransport::queue_expected_locked(Lane& l, Stashed* s) noexcept {
    if (early_expected_full(l.expected_msgs.size(), l.expected_bytes, s->len)) [[unlikely]] {
        TALARIA_LOG(sm, warn,
                    "sm://{}: context {} dropped an expected message (tag {}, {} bytes) "
                    "from {}: {}",
                    name_, l.id, s->tag, s->len, addr_to_string(s->source),
                    early_expected_refusal(l.expected_msgs.size(), l.expected_bytes));
        stash_free(l, s);
        return;
    }
    l.expected_bytes += s->len;
    l.expected_msgs.push_back(*s);
}

Stashed* SmTransport::stash_copy_locked(Lane& l, const Conn* c, const SlotHeader& h,
                                        const std::byte* payload) noexcept {
    // A message nobody has posted a receive for yet: copy it out so the ring slot is freed.
    Stashed* s = stash_alloc(l);
    if (!s) [[unlikely]] {
        TALARIA_LOG(sm, error, "sm://{}: out of memory: dropped a message from sm://{}", name_,
                    c->peer->name);
        return nullptr;
    }
    fill_stash(*s, *c, h, payload);
    return s;
}

void SmTransport::retry_sends_locked(Lane& l) noexcept {
    for (std::size_t i = 0; i < l.active.size() && l.pending_sends != 0; ++i) {
        Conn* c = l.active[i];
        while (SmOp* op = c->pending_sends.front()) {
            if (!ring_push(c, *op)) break;
            c->pending_sends.pop_front();
            op->list = nullptr;
            --l.pending_sends;
            complete_op(op, Errc::ok);
        }
    }
}

void SmTransport::pause_locked(Lane& l, Conn* c) noexcept {
    if (c->paused) return;
    TALARIA_LOG(sm, debug,
                "sm://{}: not draining the ring of sm://{} for now: {} unexpected messages ({} "
                "from it) wait for receives on context {}",
                name_, c->peer->name, l.msgs.size(),
                c->peer->stashed.load(std::memory_order_relaxed), l.id);
    c->paused = true;
    ++l.paused;
}

void SmTransport::resume_paused_locked(Lane& l) noexcept {
    if (l.msgs.size() > kMaxStashedUnexpected / 2) return;
    bool any = false;
    for (Conn* c : l.active) {
        if (!c->paused || c->peer->stashed.load(std::memory_order_relaxed) > kMaxStashedPerPeer / 2)
            continue;
        c->paused = false;
        --l.paused;
        any = true;
    }
    // A thread of the context may sleep with those rings full (arm_locked skips paused rings).
    if (any) l.ring_own_bell();
}

void SmTransport::drain_if_ready(Conn* c) noexcept {
    // An empty ring costs one load of its next slot's sequence word (no call).
    if (ring_ready(c) && !c->broken.load(std::memory_order_relaxed)) ring_drain(c);
}

void SmTransport::poll_rings_locked(Lane& l) noexcept {
    for (std::size_t i = 0; i < l.active.size(); ++i)
        drain_if_ready(l.active[i]);
    if (l.pending_sends != 0) [[unlikely]]
        retry_sends_locked(l);
    if (l.has_inbox.load(std::memory_order_relaxed)) [[unlikely]]
        drain_inbox_locked(l);
}

void SmTransport::poll_orphan_locked(Lane& l) noexcept {
    for (std::size_t i = 0; i < l.active.size(); ++i) {
        Conn* c = l.active[i];
        // Re-arm before looking (a producer that rang cleared it): Dekker with ring_push().
        c->rx->waiting.store(1, std::memory_order_seq_cst);
        drain_if_ready(c);
    }
}

bool SmTransport::arm_locked(Lane& l) noexcept {
    // Dekker with ring_push()/ring_drain() on the other side, all seq_cst: flags before the
    // re-check.
    for (Conn* c : l.active) {
        c->rx->waiting.store(1, std::memory_order_seq_cst);
        if (!c->pending_sends.empty()) c->tx->space_wanted.store(1, std::memory_order_seq_cst);
    }
    // A producer waiting for space we freed with a release store must hear of it before we
    // sleep (the waiting stores above are seq_cst; the fence makes the pairing explicit).
    check_space_wanted_locked(l);
    if (any_broken_.load(std::memory_order_seq_cst)) return false;
    if (l.has_inbox.load(std::memory_order_seq_cst)) return false;
    for (Conn* c : l.active) {
        if (!c->paused && ring_ready(c)) return false;
        if (!c->pending_sends.empty() &&
            c->tx_tail - c->tx->head.load(std::memory_order_seq_cst) < kRingSlots)
            return false;
    }
    return true;
}

void SmTransport::disarm_locked(Lane& l) noexcept {
    // Another thread of this context still sleeping, or try_wait()'s request, keeps the flags.
    // space_wanted stays set: the peer clears it when it rings (one spurious bell at most).
    if (l.armed != 0 || l.try_armed) return;
    for (Conn* c : l.active)
        c->rx->waiting.store(0, std::memory_order_relaxed);
}

// --- progress ------------------------------------------------------------------------------------

Result<void> SmTransport::progress(Context& ctx, TimePoint deadline) {
    Lane& l = lane_of(ctx);
    TimePoint spin_end{};
    for (;;) {
        bool periodic;
        bool fds_now = false;
        {
            std::lock_guard g(l.mu);
            periodic = (++l.busy_polls & 63) == 0;
            if (l.try_armed) [[unlikely]] {
                // try_wait() armed us, so someone may have slept on wait_fd(): the bells rang
                // our context's eventfd, and the sockets may want attention.
                l.try_armed = false;
                disarm_locked(l);
                drain_bell(l.bell_fd);
                fds_now = true;
            }
            if (l.paused != 0) [[unlikely]]
                resume_paused_locked(l);  // also for stashes other lanes took from
            poll_rings_locked(l);
        }
        if (fds_now || any_broken_.load(std::memory_order_relaxed)) [[unlikely]] {
            poll_fds(true);
            std::lock_guard g(l.mu);
            l.last_fd_poll_ns = now_ns();
        }
        if (ctx.has_completions() || deadline == TimePoint::min()) {
            // Busy: no clock read here, but look at the sockets every so often all the same.
            if (periodic) [[unlikely]] {
                bool fds;
                {
                    std::lock_guard g(l.mu);
                    check_space_wanted_locked(l);
                    uint64_t t = now_ns();
                    fds = t - l.last_fd_poll_ns >= kFdPollIntervalNs;
                    if (fds) l.last_fd_poll_ns = t;
                }
                if (fds) poll_fds(false);
            }
            // "Poll once" (a deadline in the past) is said without a clock read: reading it
            // costs as much as a poll.
            return ctx.has_completions() ? ok() : Result<void>(Errc::timeout);
        }
        TimePoint now = Clock::now();
        bool fds;
        {
            auto t = uint64_t(
                std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch())
                    .count());
            std::lock_guard g(l.mu);
            if (periodic) [[unlikely]]
                check_space_wanted_locked(l);
            fds = t - l.last_fd_poll_ns >= kFdPollIntervalNs;
            if (fds) l.last_fd_poll_ns = t;
        }
        if (fds) poll_fds(false);
        if (ctx.has_completions()) return ok();
        if (now >= deadline) return Errc::timeout;
        if (spin_end == TimePoint{}) spin_end = now + kSpin;
        if (now < spin_end) {
            cpu_relax();
            continue;
        }
        // Sleep until a doorbell of this lane (peers ring it), a completion queued by another
        // thread (the context's eventfd), a socket event (the transport's epoll fd, level: every
        // sleeper sees it readable), or the deadline.
        if (!ctx.prepare_block()) return ok();
        bool idle;
        drain_bell(l.bell_fd);  // stale (see try_wait_for); arm_locked() re-checks
        {
            std::lock_guard g(l.mu);
            ++l.armed;
            idle = arm_locked(l);
        }
        pollfd fds2[3] = {{ctx.event_fd(), POLLIN, 0}, {epfd_, POLLIN, 0}, {l.bell_fd, POLLIN, 0}};
        int n = idle ? ::poll(fds2, 3, ms_until(deadline)) : 0;
        ctx.end_block();
        ctx.drain_event_fd();
        if (n > 0 && (fds2[2].revents & POLLIN)) drain_bell(l.bell_fd);
        {
            std::lock_guard g(l.mu);
            --l.armed;
            disarm_locked(l);
        }
        if ((n > 0 && (fds2[1].revents & POLLIN)) || any_broken_.load(std::memory_order_relaxed))
            poll_fds(true);
        std::lock_guard g(l.mu);
        l.last_fd_poll_ns = now_ns();
    }
}

bool SmTransport::try_wait_for(Context& ctx) {
    Lane& l = lane_of(ctx);
    // A bell rung before now (a wake packet, a connection joining) is stale: the re-check in
    // arm_locked() covers what it was for, and left readable it would wake the caller at once.
    // Drained before the lock (a system call must not hold up the context's posters).
    drain_bell(l.bell_fd);
    std::lock_guard g(l.mu);
    l.try_armed = true;
    if (arm_locked(l)) return true;
    l.try_armed = false;
    disarm_locked(l);
    return false;
}

bool SmTransport::try_wait() {
    // Messages ring the doorbell of their context, which is not in progress_fd(): blocking
    // there would not hear them. Block on a context's wait_fd() after Context::try_wait().
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
    Peer* peer = peer_of(remote_addr);
    const auto* rm = remote.as<SmMem>();
    // Bounds and access are checked here against the handle, and again against the owner's
    // registration table before the copy (exec_rma): the target is never touched when either
    // fails. The status is the completion's, like a target-side check would give.
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
    Lane& l = lane_of(ctx);
    SmOp* op;
    {
        std::lock_guard g(l.mu);
        op = l.pool.acquire(ctx, std::move(cb), is_put ? OpType::put : OpType::get);
    }
    if (!op) return ops_exhausted("sm", opts_.max_ops);
    op->peer = peer;
    op->is_put = is_put;
    op->local = reinterpret_cast<std::byte*>(local->base()) + (st == Errc::ok ? local_off : 0);
    op->remote = rm->base() + (st == Errc::ok ? remote_off : 0);
    op->len = len;
    op->remote_pid = rm->pid;
    op->remote_instance = rm->instance;
    op->remote_slot = rm->slot;
    op->remote_key = rm->key;
    OpId id = op->id();
    if (st == Errc::ok && peer->dead.load(std::memory_order_acquire)) st = Errc::disconnected;
    if (st != Errc::ok || len == 0) {
        if (st == Errc::ok) op->completion.size = 0;
        complete_op(op, st);
        return id;
    }
    auto release = [&] { l.releaser.release(op); };
    if (!peer->rma_ready.load(std::memory_order_acquire)) {
        // Handshake not done yet: the peer's pid is not verified. Connect, run it on the ack
        // (the setup lock serializes this with the handshake that sets rma_ready).
        std::lock_guard g(setup_mu_);
        if (!peer->rma_ready.load(std::memory_order_acquire)) {
            if (peer->dead.load(std::memory_order_relaxed)) {
                complete_op(op, Errc::disconnected);
                return id;
            }
            if (peer->conns.empty()) {
                auto r = connect_locked(l, peer, 0);
                if (!r) {
                    release();
                    return std::move(r).error();
                }
            }
            peer->pending_rma.push_back(*op);
            op->list = &peer->pending_rma;
            return id;
        }
    }
    // The peer's identity and verdict are final: the copy runs here, with no lock held.
    if (peer->rma_errc != Errc::ok) {
        release();
        return Error(peer->rma_errc, peer->rma_error);
    }
    if (rm->pid != peer->pid || rm->instance != peer->instance) {
        release();
        return Error(
            Errc::invalid_argument,
            fmt::format("sm {}: the remote handle belongs to pid {} (instance "
                        "{:#x}), not to sm://{} (pid {}, instance {:#x}): pass the "
                        "address of the process that registered it",
                        what, rm->pid, rm->instance, peer->name, peer->pid, peer->instance));
    }
    complete_op(op, exec_rma(*op));
    return id;
}

Errc SmTransport::check_region(const SmOp& op, std::string& why) noexcept {
    // The owner's entry (its table is mapped here: ours, or the one its handshake gave),
    // read as the owner writes it: the key, the region, the key again (a slot deregistered
    // and reused meanwhile shows another key).
    const RegEntry* table = op.peer->regs;
    if (table == nullptr || op.remote_slot >= kMaxRegistrations) {
        why = "no registration table of that peer";
        return Errc::protocol_error;
    }
    const RegEntry& src = table[op.remote_slot];
    RegEntry e{};
    e.key = __atomic_load_n(&src.key, __ATOMIC_ACQUIRE);
    // Acquire loads (no fences: ThreadSanitizer does not model them): the second key load
    // cannot move before the field loads.
    e.base = __atomic_load_n(&src.base, __ATOMIC_ACQUIRE);
    e.length = __atomic_load_n(&src.length, __ATOMIC_ACQUIRE);
    e.access = __atomic_load_n(&src.access, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&src.key, __ATOMIC_ACQUIRE) != e.key) e.key = 0;
    if (e.key != op.remote_key) {
        why = "the handle names no live registration there (deregistered, or never made)";
        return Errc::invalid_argument;
    }
    const Errc st =
        na::check_region(Access(uint8_t(e.access)), e.base, e.length, op.is_put, op.remote, op.len);
    if (st == Errc::access_denied)
        why = fmt::format("the registration does not allow {}", op.is_put ? "writes" : "reads");
    else if (st == Errc::out_of_range)
        why = fmt::format("[{:#x}, +{}) is outside the registered [{:#x}, +{})", op.remote, op.len,
                          e.base, e.length);
    return st;
}

Errc SmTransport::exec_rma(SmOp& op) noexcept {
    std::string why;
    if (Errc st = check_region(op, why); st != Errc::ok) {
        TALARIA_LOG(sm, debug, "sm {} of {} bytes with sm://{} refused: {}",
                    op.is_put ? "put" : "get", op.len, op.peer->name, why);
        op.completion.size = 0;
        return st;
    }
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
        // Again before each batch (a memory read): a long copy stops at a deregistration.
        if (done > 0) {
            if (Errc st = check_region(op, why); st != Errc::ok) {
                TALARIA_LOG(sm, debug, "sm {} with sm://{} stopped after {} bytes: {}",
                            op.is_put ? "put" : "get", op.peer->name, done, why);
                op.completion.size = done;
                return st;
            }
        }
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
    // The lane whose pool holds the op (slots never move, lanes are never freed before us).
    Lane* l = nullptr;
    {
        std::lock_guard g(route_mu_);
        for (auto& x : lanes_)
            if (x && x->pool.owns(id.op)) {
                l = x.get();
                break;
            }
    }
    auto stale = [] {
        return Error(Errc::not_found, "sm cancel: the operation has already completed (stale id)");
    };
    if (!l) return stale();
    std::unique_lock g(l->mu);
    SmOp* op = l->pool.lookup(id);
    if (!op) return stale();
    // A put/get may wait for the handshake on a list of the setup lock's: take that lock first
    // (the order is setup, then lane) and look again. Sends and receives are the lane's alone.
    OpType type = op->completion.type;
    std::unique_lock<MaybeMutex> s(setup_mu_, std::defer_lock);
    if (type == OpType::put || type == OpType::get) {
        g.unlock();
        s.lock();
        g.lock();
        op = l->pool.lookup(id);
        if (!op) return stale();
    }
    if (op->list) {
        OpType t = op->completion.type;
        if (t == OpType::send_unexpected || t == OpType::send_expected) --l->pending_sends;
        op->list->erase(*op);
        op->list = nullptr;
        complete_op(op, Errc::canceled);
    }
    return ok();  // otherwise it is being carried out and completes with its own status
}

}  // namespace talaria::na::sm
