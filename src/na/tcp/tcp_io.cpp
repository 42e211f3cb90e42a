// tcp transport data path: posting, the per-connection send queue, the receive state machine,
// the target side of put/get, and progress.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "na/tcp/tcp.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::tcp {

namespace {
constexpr int kMaxIov = 64;

void drain_bell(int fd) noexcept {
    uint64_t v;
    while (::read(fd, &v, sizeof v) > 0) {
    }
}
constexpr std::size_t kMaxReadChunk = std::size_t(1) << 30;
constexpr int kMaxEvents = 64;
}  // namespace

// --- posting ------------------------------------------------------------------------------------

Result<OpId> TcpTransport::fail_async(Lane& l, Context& ctx, Callback&& cb, OpType type,
                                      Errc status, const std::string& why) {
    TALARIA_LOG(tcp, debug, "{} fails with {}: {}", op_type_name(type), errc_name(status), why);
    return complete_now(l, ctx, std::move(cb), type, status, 0);
}

Result<OpId> TcpTransport::complete_now(Lane& l, Context& ctx, Callback&& cb, OpType type,
                                        Errc status, std::size_t size) {
    TcpOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted("tcp", opts_.max_ops);
    op->completion.size = size;
    OpId id = op->id();
    complete_op(op, status);
    return id;
}

Result<Conn*> TcpTransport::conn_for_locked(Lane& l, TcpAddr* peer, uint8_t remote_ctx,
                                            bool any_ctx) {
    // A peer that does not listen cannot be connected to: a connection of ours to another of
    // its contexts carries the message too, else borrow().
    if (Conn* c = any_ctx || peer->anonymous ? l.route_or_any(peer, remote_ctx)
                                             : l.route(peer, remote_ctx))
        return c;
    if (peer->anonymous) return nullptr;
    return connect(l, peer, remote_ctx);
}

namespace {
/// An op from lane `own`'s pool, filled by `fill(op, conn)`, to queue on `conn`. However much
/// is unsent on the connection, the op joins its send queue, which progress drains as the
/// socket takes bytes (back-pressure stays below the caller); only the op pool
/// (Options::max_ops) bounds what may wait, and its exhaustion is the one `again`.
template <class Fill>
Result<TcpOp*> take_op(Lane& own, std::size_t max_ops, Context& ctx, Callback&& cb, OpType type,
                       Conn* conn, Fill&& fill) {
    TcpOp* op = own.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(fmt::format("tcp {}", op_type_name(type)), max_ops);
    fill(op, conn);
    op->conn = conn;
    op->state = OpState::send_queued;
    op->borrowed = conn->lane != &own;
    if (op->borrowed) {
        op->lender = conn->lane;
        own.borrowed.fetch_add(1, std::memory_order_relaxed);
    }
    return op;
}
}  // namespace

template <class Fill>
Result<OpId> TcpTransport::borrow(Lane& own, Context& ctx, Callback&& cb, OpType type,
                                  TcpAddr* peer, uint8_t remote_ctx, Fill&& fill) {
    {
        std::lock_guard sg(setup_mu_);
        for (auto& lp : lanes_) {
            Lane* o = lp.get();
            if (o == nullptr || o == &own) continue;
            std::lock_guard g(o->mu);
            Conn* conn = o->route_or_any(peer, remote_ctx);
            if (!conn) continue;
            TALARIA_TRY(op, take_op(own, opts_.max_ops, ctx, std::move(cb), type, conn, fill));
            OpId id = op->id();
            enqueue_send(conn, op, true);
            return id;
        }
    }
    std::lock_guard g(own.mu);
    return fail_async(own, ctx, std::move(cb), type, Errc::disconnected,
                      fmt::format("{} is a client that does not listen: it can be reached only "
                                  "over a connection it opened, and none is open (it closed); "
                                  "the client must call again first",
                                  peer->str));
}

Result<OpId> TcpTransport::post_send(Context& ctx, Callback cb, const MsgBuffer& buf,
                                     std::size_t len, const Addr& dest, uint8_t dest_ctx, Tag tag,
                                     bool expected) {
    OpType type = expected ? OpType::send_expected : OpType::send_unexpected;
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument, "tcp: the context belongs to another transport");
    if (len > kMaxMessageSize)
        return Error(Errc::message_too_large,
                     fmt::format("tcp: a {}-byte message exceeds max_{}_size() = {}", len,
                                 expected ? "expected" : "unexpected", kMaxMessageSize));
    if (len > buf.size())
        return Error(Errc::invalid_argument,
                     fmt::format("tcp: send of {} bytes from a {}-byte buffer", len, buf.size()));
    if (!dest || dest.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     "tcp: destination is not an address of this transport");

    auto fill = [&](TcpOp* op, Conn*) {
        FrameHeader h;
        h.type = expected ? FrameType::msg_expected : FrameType::msg_unexpected;
        h.context_id = dest_ctx;
        h.tag = tag;
        h.length = len;
        encode_frame_header(h, op->header);
        op->kind = SendItem::Kind::op;
        op->iov[0] = {op->header, kFrameHeaderSize};
        op->iov[1] = {buf.data(), len};
        op->iovcnt = len ? 2 : 1;
        op->total = kFrameHeaderSize + len;
        op->sent = 0;
        op->completion.size = len;
    };
    Lane& l = lane_of(ctx);
    TcpAddr* peer = peer_of(dest);
    std::unique_lock g(l.mu);
    auto c = conn_for_locked(l, peer, dest_ctx, false);
    if (!c) return fail_async(l, ctx, std::move(cb), type, c.code(), c.error().message());
    if (*c == nullptr) {
        g.unlock();
        return borrow(l, ctx, std::move(cb), type, peer, dest_ctx, fill);
    }
    TALARIA_TRY(op, take_op(l, opts_.max_ops, ctx, std::move(cb), type, *c, fill));
    OpId id = op->id();
    enqueue_send(*c, op, true);
    return id;
}

Result<OpId> TcpTransport::post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                                std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                                Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, false);
}

Result<OpId> TcpTransport::post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                              std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                              Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, true);
}

void TcpTransport::complete_recv(TcpOp* op, const Addr& source, uint8_t ctx_id, Tag tag,
                                 std::size_t size, Errc status) {
    op->completion.source = source;
    op->completion.context_id = ctx_id;
    op->completion.tag = tag;
    op->completion.size = size;
    op->state = OpState::idle;
    op->match_source.reset();
    complete_op(op, status);
}

Result<OpId> TcpTransport::post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument, "tcp: the context belongs to another transport");
    Lane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    TcpOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) return ops_exhausted("tcp", opts_.max_ops);
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (QueuedMsg* m = l.match.post_unexpected(ctx.id(), op)) {
        l.match.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
        // A connection paused for back-pressure may be read again: wake the lane's progress
        // (it may sleep in another thread) to look.
        if (l.paused != 0) {
            uint64_t one = 1;
            [[maybe_unused]] ssize_t r = ::write(l.bell_fd, &one, sizeof one);
        }
    }
    return id;
}

Result<OpId> TcpTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                              const Addr& source, Tag tag) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument, "tcp: the context belongs to another transport");
    if (!source || source.impl()->transport() != this)
        return Error(Errc::invalid_argument, "tcp: source is not an address of this transport");
    Lane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    TcpOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) return ops_exhausted("tcp", opts_.max_ops);
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (QueuedMsg* m = l.match.post_expected(op, source, tag)) {
        l.match.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
    }
    return id;
}

Result<OpId> TcpTransport::post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    const bool is_put = type == OpType::put;
    const char* what = is_put ? "post_put" : "post_get";
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("tcp {}: the context belongs to another transport", what));
    if (!remote_addr || remote_addr.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("tcp {}: remote_addr is not an address of this transport", what));
    if (!local || local->transport() != this || !local->local())
        return Error(
            Errc::invalid_argument,
            fmt::format("tcp {}: the local handle is not a registration of this endpoint", what));
    if (!remote || remote->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("tcp {}: the remote handle is not a tcp handle of this endpoint "
                                 "(deserialize it here)",
                                 what));
    if (local_off > local->length() || len > local->length() - local_off)
        return Error(
            Errc::out_of_range,
            fmt::format("tcp {}: local range [{}, +{}) is outside the {}-byte registration", what,
                        local_off, len, local->length()));
    auto* rm = remote.as<TcpMem>();

    Lane& l = lane_of(ctx);
    std::unique_lock g(l.mu);
    // What the handle tells us is checked here first; the target checks again (it cannot trust
    // us), against its own registration table.
    bool allowed = is_put ? (uint8_t(rm->access()) & uint8_t(Access::write_only))
                          : (uint8_t(rm->access()) & uint8_t(Access::read_only));
    if (!allowed)
        return fail_async(l, ctx, std::move(cb), type, Errc::access_denied,
                          fmt::format("the remote region does not allow {}",
                                      is_put ? "writes (put)" : "reads (get)"));
    if (remote_off > rm->length() || len > rm->length() - remote_off)
        return fail_async(l, ctx, std::move(cb), type, Errc::out_of_range,
                          fmt::format("remote range [{}, +{}) is outside the {}-byte region",
                                      remote_off, len, rm->length()));
    Addr owner = rm->local() ? self_ : rm->owner_addr;
    if (owner && owner != remote_addr)
        return fail_async(l, ctx, std::move(cb), type, Errc::invalid_argument,
                          fmt::format("the remote handle was registered by {}, not by {}",
                                      peer_of(owner)->str, peer_of(remote_addr)->str));
    if (remote_addr == self_) [[unlikely]] {
        // This endpoint's own memory (a handle the program sent to itself: Mercury's forward
        // to HG_Addr_self): copied here, listening or not (one that does not listen has no
        // connection to itself), after the checks a peer's request gets.
        FrameHeader h;
        h.key = rm->key;
        h.address = rm->base() + remote_off;
        h.rma_length = len;
        std::byte* where = nullptr;
        const Errc st = validate_target(h, is_put, &where);
        if (st == Errc::ok && len != 0) {
            std::byte* mine = reinterpret_cast<std::byte*>(local->base()) + local_off;
            std::memmove(is_put ? where : mine, is_put ? mine : where, len);
        }
        return complete_now(l, ctx, std::move(cb), type, st, st == Errc::ok ? len : 0);
    }
    auto fill = [&](TcpOp* op, Conn* conn) {
        FrameHeader h;
        h.type = is_put ? FrameType::put_req : FrameType::get_req;
        h.cookie = op->gen;
        h.key = rm->key;
        h.address = rm->base() + remote_off;
        h.rma_length = len;
        h.length = is_put ? len : 0;
        encode_frame_header(h, op->header);
        op->buf = reinterpret_cast<std::byte*>(local->base()) + local_off;
        op->cap = len;
        op->kind = SendItem::Kind::op;
        op->iov[0] = {op->header, kFrameHeaderSize};
        op->iov[1] = {op->buf, is_put ? len : 0};
        op->iovcnt = (is_put && len) ? 2 : 1;
        op->total = kFrameHeaderSize + (is_put ? len : 0);
        op->sent = 0;
        op->completion.size = len;
        op->skip_after = 0;
        conn->rma_wait.push_back(*op);
    };
    // Any connection of this lane to the target serves (put/get name no context).
    TcpAddr* peer = peer_of(remote_addr);
    auto c = conn_for_locked(l, peer, l.id, true);
    if (!c) return fail_async(l, ctx, std::move(cb), type, c.code(), c.error().message());
    if (*c == nullptr) {
        g.unlock();
        return borrow(l, ctx, std::move(cb), type, peer, l.id, fill);
    }
    TALARIA_TRY(op, take_op(l, opts_.max_ops, ctx, std::move(cb), type, *c, fill));
    OpId id = op->id();
    enqueue_send(*c, op, true);
    return id;
}

Result<OpId> TcpTransport::post_put(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::put, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<OpId> TcpTransport::post_get(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::get, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<void> TcpTransport::cancel(OpId id) {
    Lane* l = nullptr;
    for (std::size_t i = 0; !l && i < opts_.max_contexts; ++i) {
        Lane* c = lane_ptr_[i].load(std::memory_order_acquire);
        if (c && c->ops.owns(id.op)) l = c;
    }
    if (!l) return Error(Errc::not_found, "tcp cancel: not an operation of this transport");
    std::unique_lock g(l->mu);
    TcpOp* op = l->ops.lookup(id);
    if (!op)
        return Error(Errc::not_found, "tcp cancel: the operation already finished (stale OpId)");
    if (op->borrowed) {
        // On another context's connection: under that lane's lock (lanes never go away; the
        // op may have finished meanwhile, so look it up again there).
        Lane* lender = op->lender;
        g.unlock();
        g = std::unique_lock(lender->mu);
        op = l->ops.lookup(id);
        if (!op) return ok();
    }
    switch (op->state) {
        case OpState::recv_posted:
            l->match.withdraw(op);
            op->state = OpState::idle;
            op->match_source.reset();
            complete_op(op, Errc::canceled);
            break;
        case OpState::send_queued:
            // Only an operation none of whose bytes went out can be withdrawn from the stream.
            if (op->sent == 0) withdraw_unsent(op);
            break;
        case OpState::await_reply:
            // Sent, its response not come (a peer that never answers would hold it forever).
            abandon_reply(op);
            break;
        default:
            break;  // partly sent or being received: completes normally
    }
    return ok();
}

// --- sending ------------------------------------------------------------------------------------

void TcpTransport::enqueue_send(Conn* c, SendItem* item, bool flush_now) {
    c->sendq.push_back(*item);
    c->queued_bytes += item->total;
    // Write at once unless the socket is known to be full (EPOLLOUT armed) or not connected.
    if (flush_now && c->state == Conn::State::open && !(c->events & EPOLLOUT)) flush(c);
}

void TcpTransport::item_done(Conn* c, SendItem* item) {
    if (item->kind == SendItem::Kind::control) {
        auto* ctl = static_cast<Control*>(item);
        if (ctl->reply) --c->replies;
        control_free(*c->lane, ctl);
        return;
    }
    auto* op = static_cast<TcpOp*>(item);
    if (op->completion.type == OpType::put || op->completion.type == OpType::get) {
        op->state = OpState::await_reply;  // stays on rma_wait until the response
        return;
    }
    op->state = OpState::idle;
    complete_op(op, Errc::ok);
}

bool TcpTransport::sendable(Conn* c) noexcept {
    if (c->sendq.empty()) return false;
    if (!c->auth_wait) return true;
    const SendItem* front = c->sendq.front();
    return front->kind == SendItem::Kind::control && static_cast<const Control*>(front)->setup;
}

void TcpTransport::flush(Conn* c) {
    if (c->seal_tx) {
        flush_sealed(c);
        return;
    }
    while (c->state == Conn::State::open && sendable(c)) {
        iovec iov[kMaxIov];
        int n = 0;
        std::size_t want = 0;
        for (SendItem& it : c->sendq) {
            if (n + it.iovcnt > kMaxIov) break;
            if (c->auth_wait && n > 0) break;  // the hello alone while authenticating
            std::size_t skip = it.sent;
            for (int i = 0; i < it.iovcnt; ++i) {
                if (skip >= it.iov[i].iov_len) {
                    skip -= it.iov[i].iov_len;
                    continue;
                }
                iov[n].iov_base = static_cast<std::byte*>(it.iov[i].iov_base) + skip;
                iov[n].iov_len = it.iov[i].iov_len - skip;
                want += iov[n].iov_len;
                ++n;
                skip = 0;
            }
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = std::size_t(n);
        ssize_t w = ::sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                note(LinkEvent::backpressure);  // the socket's buffer is full: EPOLLOUT resumes
                break;
            }
            int e = errno;
            // A server that refused us (no secret, another key) wrote why, then closed, and
            // our write met its reset. What it wrote is still ours to read, and the refusal
            // it holds is the cause the caller must see (access_denied), not the reset.
            if (c->outgoing && !c->last_read && !c->reading) {
                c->last_read = true;
                read_ready(c);
                if (c->state == Conn::State::closed) return;
            }
            close_conn(c, Errc::disconnected,
                       fmt::format("send to {} failed: {}",
                                   c->peer ? peer_of(c->peer)->str : "peer", std::strerror(e)));
            return;
        }
        std::size_t left = std::size_t(w);
        c->queued_bytes -= left;
        while (left > 0) {
            SendItem* it = c->sendq.front();
            std::size_t rest = it->total - it->sent;
            if (left < rest) {
                it->sent += left;
                break;
            }
            left -= rest;
            it->sent = it->total;
            c->sendq.pop_front();
            item_done(c, it);
        }
        if (std::size_t(w) < want) {  // socket buffer full
            note(LinkEvent::backpressure);
            break;
        }
    }
    update_events(c);
}

void TcpTransport::update_events(Conn* c) {
    if (c->state == Conn::State::closed) return;
    uint32_t want = c->paused ? 0u : uint32_t(EPOLLIN);
    if (c->state == Conn::State::connecting || sendable(c) || c->tx_sealed_pos < c->tx_sealed_len)
        want |= EPOLLOUT;
    if (want != c->events) {
        if (auto w = watch(c, want); !w) close_conn(c, Errc::io_error, w.error().describe());
    }
}

bool TcpTransport::queue_reply(Conn* c, FrameType type, uint64_t cookie, Errc status,
                               std::byte* data, std::size_t len) {
    if (c->replies >= kMaxRepliesPerConn) {
        close_conn(c, Errc::protocol_error,
                   fmt::format("peer has {} put/get responses unread: it floods requests without "
                               "reading",
                               c->replies));
        return false;
    }
    Control* ctl = control_alloc(*c->lane);
    ctl->reply = true;
    FrameHeader h;
    h.type = type;
    h.cookie = cookie;
    h.status = status;
    h.length = len;
    encode_frame_header(h, ctl->header);
    ctl->iov[0] = {ctl->header, kFrameHeaderSize};
    ctl->iov[1] = {data, len};
    ctl->iovcnt = len ? 2 : 1;
    ctl->total = kFrameHeaderSize + len;
    ++c->replies;
    enqueue_send(c, ctl, false);
    return true;
}

// --- receiving ----------------------------------------------------------------------------------

Errc TcpTransport::validate_target(const FrameHeader& h, bool write, std::byte** where) {
    // The lane's lock stays held while the region is used: mem_unregister() erases it first,
    // then takes each lane's lock to stop what was checked before (see there).
    std::lock_guard rg(regions_mu_);
    auto it = regions_.find(h.key);
    if (it == regions_.end()) return Errc::invalid_argument;  // deregistered or forged
    const TcpMem* m = it->second;
    if (Errc st = check_region(m->access(), m->base(), m->length(), write, h.address, h.rma_length);
        st != Errc::ok)
        return st;
    *where = reinterpret_cast<std::byte*>(uintptr_t(h.address));
    return Errc::ok;
}

bool TcpTransport::start_frame(Conn* c) {
    const FrameHeader& h = c->hdr;
    auto proto = [&](std::string why) {
        close_conn(c, Errc::protocol_error, std::move(why));
        return false;
    };
    if (h.type == FrameType::hello) {
        if (c->outgoing || c->state != Conn::State::await_hello || c->auth_wait)
            return proto("unexpected hello frame");
        c->sink = Conn::Sink::hello;
        c->dest = c->hello_buf;
    } else if (h.type == FrameType::auth) {
        // Accepted: only the response, after our challenge. Outgoing: the challenge while we
        // wait for it, and a refusal at any time before our first message was taken.
        const auto step = AuthStep(h.context_id);
        const bool fits =
            c->outgoing ? (c->auth_wait && step == AuthStep::challenge) || step == AuthStep::refused
                        : c->auth_wait && step == AuthStep::response;
        if (!fits) return proto(fmt::format("unexpected auth frame (step {})", h.context_id));
        c->sink = Conn::Sink::auth;
        c->dest = c->hello_buf;
    } else if (c->state != Conn::State::open) {
        return proto(fmt::format("frame type {} before the hello", int(h.type)));
    } else if (c->auth_wait) {
        return proto(fmt::format("frame type {} before the peer authenticated", int(h.type)));
    } else {
        switch (h.type) {
            case FrameType::msg_unexpected:
            case FrameType::msg_expected: {
                bool expected = h.type == FrameType::msg_expected;
                bool no_context = false;
                Lane& l = *c->lane;
                if (!is_local_locked(l, h.context_id, expected)) {
                    // Another context's (or nobody's): read it whole, then hand it over.
                    c->rx_foreign = true;
                    c->sink = Conn::Sink::queued;
                } else if (TcpOp* op = l.match.match(expected, h.context_id, c->source, h.tag,
                                                     &no_context)) {
                    // Read straight into the receive's buffer.
                    op->state = OpState::receiving;
                    c->rx_op = op;
                    c->sink = Conn::Sink::op;
                    c->rx_status = h.length > op->cap ? Errc::message_too_large : Errc::ok;
                    c->dest = c->rx_status == Errc::ok ? op->buf : nullptr;
                } else if (no_context) {
                    std::size_t unlogged = 0;
                    if (l.match.log_refusal(&unlogged))
                        TALARIA_LOG(tcp, warn,
                                    "dropping a {}-byte unexpected message (tag {}) from {} for "
                                    "context {}: {}{}",
                                    h.length, h.tag, addr_describe(c->peer), h.context_id,
                                    l.match.refusal(Queued::no_context), unlogged_note(unlogged));
                    c->sink = Conn::Sink::discard;
                    c->dest = nullptr;
                } else {
                    c->sink = Conn::Sink::queued;
                }
                break;
            }
            case FrameType::put_req: {
                std::byte* where = nullptr;
                c->rx_status = validate_target(h, true, &where);
                c->sink = Conn::Sink::put;
                c->dest = c->rx_status == Errc::ok ? where : nullptr;  // rejected: discard
                if (c->rx_status != Errc::ok)
                    TALARIA_LOG(tcp, debug, "rejecting a put of {} bytes at {:#x} from {}: {}",
                                h.rma_length, h.address, addr_describe(c->peer),
                                errc_name(c->rx_status));
                break;
            }
            case FrameType::get_req: {
                std::byte* where = nullptr;
                Errc st = validate_target(h, false, &where);
                if (st != Errc::ok)
                    TALARIA_LOG(tcp, debug, "rejecting a get of {} bytes at {:#x} from {}: {}",
                                h.rma_length, h.address, addr_describe(c->peer), errc_name(st));
                // The data goes out straight from the registered region.
                return queue_reply(c, FrameType::get_resp, h.cookie, st, where,
                                   st == Errc::ok ? h.rma_length : 0);
            }
            case FrameType::put_resp:
            case FrameType::get_resp: {
                bool put = h.type == FrameType::put_resp;
                if (c->skip_front > 0) {
                    // The response of a put/get canceled while it waited: read and dropped.
                    --c->skip_front;
                    break;  // sink: discard
                }
                TcpOp* op = c->rma_wait.front();
                if (!op || op->state != OpState::await_reply || op->gen != h.cookie ||
                    op->completion.type != (put ? OpType::put : OpType::get))
                    return proto(fmt::format("{} response with cookie {} matches no request",
                                             put ? "put" : "get", h.cookie));
                if (!put && h.status == Errc::ok && h.length != op->cap)
                    return proto(
                        fmt::format("get response of {} bytes for a get of {}", h.length, op->cap));
                c->rma_wait.pop_front();
                c->skip_front = op->skip_after;
                if (put || h.status != Errc::ok) {
                    op->state = OpState::idle;
                    if (h.status != Errc::ok) {
                        op->completion.size = 0;
                        TALARIA_LOG(tcp, debug, "{} to {} failed at the target: {}",
                                    put ? "put" : "get", addr_describe(c->peer),
                                    errc_name(h.status));
                    }
                    complete_op(op, h.status);
                    return true;
                }
                op->state = OpState::receiving;
                c->rx_op = op;
                c->sink = Conn::Sink::get;
                c->dest = op->buf;
                break;
            }
            case FrameType::hello:
            case FrameType::auth:
                break;  // handled above
        }
    }
    if (c->sink == Conn::Sink::queued) {
        QueuedMsg* m = c->lane->match.msg_alloc();
        m->data.resize(h.length);
        m->source = c->source;
        m->tag = h.tag;
        m->context_id = h.context_id;
        m->expected = h.type == FrameType::msg_expected;
        c->rx_msg = m;
        c->dest = m->data.data();
    }
    c->in_payload = true;
    c->remaining = h.length;
    return true;
}

bool TcpTransport::is_local_locked(Lane& l, uint8_t ctx_id, bool expected) {
    if (ctx_id == l.id && l.ctx && (expected || l.ctx->takes_unexpected())) [[likely]]
        return true;
    std::lock_guard rg(route_mu_);
    return route_target_locked(ctx_id, expected) == &l;
}

Lane* TcpTransport::route_target_locked(uint8_t ctx_id, bool expected) noexcept {
    if (ctx_id < opts_.max_contexts) {
        Lane* l = lane_ptr_[ctx_id].load(std::memory_order_acquire);
        if (l && l->ctx && (expected || l->ctx->takes_unexpected())) return l;
    }
    // An expected message answers a receive its context posted: with that context gone,
    // nobody waits for it.
    if (expected) return nullptr;
    for (std::size_t i = 0; i < opts_.max_contexts; ++i) {
        Lane* l = lane_ptr_[i].load(std::memory_order_acquire);
        if (l && l->ctx && l->ctx->takes_unexpected()) return l;
    }
    return nullptr;
}

void TcpTransport::deliver_queued(Conn* c, QueuedMsg* m) {
    Lane& l = *c->lane;
    const bool foreign = c->rx_foreign;
    c->rx_foreign = false;
    if (foreign && !is_local_locked(l, m->context_id, m->expected))
        return hand_over_locked(l, m, c->peer);
    if (deliver_local_locked(l, m, c->peer)) pause(c);
}

bool TcpTransport::deliver_local_locked(Lane& l, QueuedMsg* m, const Addr& who) {
    // A receive may have been posted while the message was being read.
    const std::size_t size = m->data.size();
    const Tag tag = m->tag;
    const uint8_t ctx_id = m->context_id;
    const bool expected = m->expected;
    // m is freed when refused
    Queued q = Queued::ok;
    TcpOp* op = l.match.match_or_queue(m, &q);
    std::size_t unlogged = 0;
    if (q != Queued::ok && l.match.log_refusal(&unlogged))
        TALARIA_LOG(tcp, warn,
                    "dropping a {}-byte {} message (tag {}) from {} for context {}: {}{}", size,
                    expected ? "expected" : "unexpected", tag, peer_of(who)->str, ctx_id,
                    l.match.refusal(q), unlogged_note(unlogged));
    if (op) {
        l.match.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
        return false;
    }
    if (q != Queued::ok || expected) return false;
    // Queued for a receive not yet posted: charged to its sender until taken.
    TcpAddr* from = peer_of(who);
    m->charge = &from->unexpected_bytes;
    const std::size_t mine =
        from->unexpected_bytes.fetch_add(size, std::memory_order_relaxed) + size;
    return mine > kMaxUnexpectedPerPeer || l.match.unexpected_count() >= kMaxUnexpectedCount ||
           l.match.unexpected_bytes() > kMaxUnexpectedBytes;
}

void TcpTransport::pause(Conn* c) {
    if (c->paused || c->state == Conn::State::closed) return;
    Lane& l = *c->lane;
    TALARIA_LOG(tcp, debug,
                "not reading {} (fd {}) for now: {} unexpected messages ({} bytes; {} from it) "
                "wait for receives on context {}",
                addr_describe(c->peer), c->fd, l.match.unexpected_count(),
                l.match.unexpected_bytes(),
                peer_of(c->peer)->unexpected_bytes.load(std::memory_order_relaxed), l.id);
    c->paused = true;
    ++l.paused;
    update_events(c);
}

void TcpTransport::resume(Conn* c) {
    if (!c->paused) return;
    c->paused = false;
    --c->lane->paused;
    update_events(c);
}

void TcpTransport::resume_paused_locked(Lane& l) {
    if (l.match.unexpected_count() > kMaxUnexpectedCount / 2 ||
        l.match.unexpected_bytes() > kMaxUnexpectedBytes / 2)
        return;
    l.conns.for_each_safe([this](Conn& c) {
        if (!c.paused || c.state != Conn::State::open ||
            peer_of(c.peer)->unexpected_bytes.load(std::memory_order_relaxed) >
                kMaxUnexpectedPerPeer / 2)
            return;
        resume(&c);
        // What was read before the pause waits in the receive buffer; the socket may have
        // nothing new to announce it.
        if (process_rx(&c)) read_ready(&c);
    });
}

void TcpTransport::hand_over_locked(Lane& from, QueuedMsg* m, const Addr& who) {
    std::unique_lock rg(route_mu_);
    Lane* to = route_target_locked(m->context_id, m->expected);
    if (to == &from) {  // its context appeared meanwhile
        rg.unlock();
        (void)deliver_local_locked(from, m, who);  // no connection of its own to pause
        return;
    }
    // The inbox is bounded like early expected messages: a peer must not make us hold memory
    // without bound by naming a context whose thread is busy.
    const bool full = to && early_expected_full(to->inbox.size(), to->inbox_bytes, m->data.size());
    auto loose = std::unique_ptr<QueuedMsg>(to && !full ? new (std::nothrow) QueuedMsg : nullptr);
    if (!loose) {
        rg.unlock();
        std::size_t unlogged = 0;
        if (from.match.log_refusal(&unlogged))
            TALARIA_LOG(tcp, warn,
                        "dropping a {}-byte {} message (tag {}) from {} for context {}: {}{}",
                        m->data.size(), m->expected ? "expected" : "unexpected", m->tag,
                        peer_of(who)->str, m->context_id,
                        full ? "that context's inbox is full (its thread is busy; the peer sends "
                               "more than it asked for)"
                        : to ? "out of memory"
                        : m->expected ? "that context does not exist (any more)"
                                      : "no context here takes unexpected messages",
                        unlogged_note(unlogged));
        from.match.msg_free(m);
        return;
    }
    loose->source = std::move(m->source);
    loose->tag = m->tag;
    loose->context_id = m->context_id;
    loose->expected = m->expected;
    loose->data.swap(m->data);
    to->inbox_bytes += loose->data.size();
    to->inbox.push_back(std::move(loose));
    to->has_inbox.store(true, std::memory_order_release);
    rg.unlock();
    from.match.msg_free(m);
    // Wake a thread of that context sleeping in progress() or on its wait_fd(): the bell is in
    // the lane's set (lanes, and so their bells, live as long as the transport).
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(to->bell_fd, &one, sizeof one);
}

void TcpTransport::drain_inbox_locked(Lane& l) {
    std::vector<std::unique_ptr<QueuedMsg>> in;
    {
        std::lock_guard rg(route_mu_);
        in.swap(l.inbox);
        l.inbox_bytes = 0;
        l.has_inbox.store(false, std::memory_order_relaxed);
    }
    // The bell that announced them has done its job (left readable, it would wake a sleeper
    // for nothing).
    drain_bell(l.bell_fd);
    for (auto& loose : in) {
        // Expected, from a peer that has closed since: freed, as the early ones it left here
        // are (drop_early_of_closed_locked).
        if (loose->expected &&
            peer_of(loose->source)->open_conns.load(std::memory_order_acquire) == 0)
            continue;
        QueuedMsg* m = l.match.msg_alloc();
        Addr who = loose->source;
        m->source = std::move(loose->source);
        m->tag = loose->tag;
        m->context_id = loose->context_id;
        m->expected = loose->expected;
        m->data.swap(loose->data);
        (void)deliver_local_locked(l, m, who);  // handed over: no connection of ours to pause
    }
}

bool TcpTransport::finish_frame(Conn* c) {
    const FrameHeader& h = c->hdr;
    Conn::Sink sink = c->sink;
    c->sink = Conn::Sink::discard;
    c->dest = nullptr;
    switch (sink) {
        case Conn::Sink::discard:
            break;
        case Conn::Sink::hello: {
            auto hello = decode_hello(std::span<const std::byte>(c->hello_buf, h.length));
            if (!hello) {
                close_conn(c, Errc::protocol_error, hello.error().message());
                return false;
            }
            if (h.tag > 0xff) {
                close_conn(
                    c, Errc::protocol_error,
                    fmt::format("hello names context {} as its sender's (at most 255)", h.tag));
                return false;
            }
            Addr peer;
            if (hello->address.empty()) {
                SockAddr from;
                from.len = sizeof from.storage;
                if (::getpeername(c->fd, from.sa(), &from.len) != 0) from.len = 0;
                peer = intern_locked(fmt::format("tcp://~{:016x}", hello->instance), true,
                                     from.len ? &from : nullptr);
            } else {
                auto r = lookup_locked(hello->address, true);
                if (!r || r->as<TcpAddr>()->anonymous) {
                    close_conn(c, Errc::protocol_error,
                               fmt::format("hello names an invalid address: {}",
                                           r ? "anonymous" : r.error().describe()));
                    return false;
                }
                peer = *r;
            }
            set_peer(c, std::move(peer));
            c->remote_ctx = uint8_t(h.tag);
            c->asked_ctx = h.context_id;
            if (!auth_hello(c, *hello)) return false;
            // Open (once authenticated, where that is asked for), and still without a lane:
            // poll_setup() hands it to its lane (adopt_locked), which parses what follows.
            if (!c->auth_wait) {
                c->state = Conn::State::open;
                note(LinkEvent::accepted);
            }
            break;
        }
        case Conn::Sink::auth:
            return auth_frame(c);
        case Conn::Sink::op: {
            TcpOp* op = c->rx_op;
            c->rx_op = nullptr;
            complete_recv(op, c->source, h.context_id, h.tag, h.length, c->rx_status);
            break;
        }
        case Conn::Sink::queued: {
            QueuedMsg* m = c->rx_msg;
            c->rx_msg = nullptr;
            deliver_queued(c, m);
            break;
        }
        case Conn::Sink::put:
            return queue_reply(c, FrameType::put_resp, h.cookie, c->rx_status, nullptr, 0);
        case Conn::Sink::get: {
            TcpOp* op = c->rx_op;
            c->rx_op = nullptr;
            op->state = OpState::idle;
            complete_op(op, Errc::ok);
            break;
        }
    }
    return true;
}

bool TcpTransport::process_rx(Conn* c) {
    for (;;) {
        // After its hello, an accepted connection waits for its lane (adopt_locked).
        if (c->lane == nullptr && c->state == Conn::State::open) return true;
        if (c->in_payload) {
            if (c->remaining > 0) {
                std::size_t avail = c->rx_len - c->rx_pos;
                if (avail == 0) return true;
                std::size_t take = std::size_t(std::min<uint64_t>(avail, c->remaining));
                if (c->dest) {
                    std::memcpy(c->dest, c->rx.get() + c->rx_pos, take);
                    c->dest += take;
                }
                c->rx_pos += take;
                c->remaining -= take;
                if (c->remaining > 0) return true;
            }
            c->in_payload = false;
            if (!finish_frame(c)) return false;
            continue;
        }
        if (c->paused) return true;  // back-pressure: the next frame waits for resume()
        std::size_t avail = c->rx_len - c->rx_pos;
        if (avail < kFrameHeaderSize) return true;
        auto h = decode_frame_header(std::span<const std::byte>(c->rx.get() + c->rx_pos, avail));
        if (!h) {
            uint32_t magic = 0;
            std::memcpy(&magic, c->rx.get() + c->rx_pos, 4);
            if (!c->outgoing && opts_.auth.enabled() && magic == seal::kRecordMagic &&
                c->state == Conn::State::open) {
                refuse_protect_mismatch(c);  // the client protects, we do not: tell it
                return false;
            }
            close_conn(c, Errc::protocol_error, h.error().message());
            return false;
        }
        c->rx_pos += kFrameHeaderSize;
        c->hdr = *h;
        if (!start_frame(c)) return false;
    }
}

TcpTransport::ReadResult TcpTransport::read_result(Conn* c, ssize_t n, bool mid_frame) {
    if (n > 0) return ReadResult::data;
    if (n == 0) {
        close_conn(c, Errc::disconnected,
                   mid_frame ? std::string("peer closed the connection in the middle of a frame")
                             : std::string("peer closed the connection"));
        return ReadResult::closed;
    }
    if (errno == EINTR) return ReadResult::retry;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ReadResult::drained;
    close_conn(c, Errc::disconnected, fmt::format("receive failed: {}", std::strerror(errno)));
    return ReadResult::closed;
}

void TcpTransport::read_ready(Conn* c) {
    const bool outer = !c->reading;
    c->reading = true;
    read_available(c);
    if (outer) c->reading = false;  // closed or not, `c` lives until the lane reaps it
}

void TcpTransport::read_available(Conn* c) {
    if (c->seal_rx) {
        read_sealed(c);
        return;
    }
    // Bounded so that one busy peer cannot starve the others.
    for (int round = 0; round < 16 && c->state != Conn::State::closed; ++round) {
        // An accepted connection reads nothing past its hello before it has a lane.
        if (c->lane == nullptr && c->state == Conn::State::open) return;
        if (c->paused) break;  // back-pressure (resume_paused_locked reads it again)
        ssize_t n;
        std::size_t asked;
        if (c->in_payload && c->dest && c->remaining > 0 && c->rx_pos == c->rx_len) {
            // Straight into the destination (user buffer or registered region); whatever
            // follows the payload lands in the receive buffer.
            c->rx_pos = c->rx_len = 0;
            iovec v[2];
            v[0].iov_base = c->dest;
            v[0].iov_len = std::size_t(std::min<uint64_t>(c->remaining, kMaxReadChunk));
            v[1].iov_base = c->rx.get();
            v[1].iov_len = c->rx_cap;
            asked = v[0].iov_len + v[1].iov_len;
            n = ::readv(c->fd, v, 2);
            if (n > 0) {
                std::size_t d = std::min<std::size_t>(std::size_t(n), v[0].iov_len);
                c->dest += d;
                c->remaining -= d;
                c->rx_len = std::size_t(n) - d;
            }
        } else {
            if (c->rx_pos > 0) {
                std::memmove(c->rx.get(), c->rx.get() + c->rx_pos, c->rx_len - c->rx_pos);
                c->rx_len -= c->rx_pos;
                c->rx_pos = 0;
            }
            asked = c->rx_cap - c->rx_len;
            n = ::recv(c->fd, c->rx.get() + c->rx_len, asked, MSG_DONTWAIT);
            if (n > 0) c->rx_len += std::size_t(n);
        }
        const ReadResult r = read_result(c, n, c->in_payload || c->rx_len != c->rx_pos);
        if (r == ReadResult::retry) continue;
        if (r == ReadResult::drained) break;
        if (r == ReadResult::closed) return;
        if (!process_rx(c)) return;
        if (c->seal_rx) {  // the handshake ended in what was read: records from here
            read_sealed(c);
            return;
        }
        if (std::size_t(n) < asked) break;  // drained (level-triggered epoll tells us if not)
    }
    // Responses queued while parsing go out now.
    if (c->state == Conn::State::open && !c->sendq.empty()) flush(c);
}

// --- connection state ---------------------------------------------------------------------------

void TcpTransport::close_conn(Conn* c, Errc status, const std::string& why) {
    if (c->state == Conn::State::closed) return;
    const bool was_connecting = c->state == Conn::State::connecting;
    // canceled: this side closed it (its context is destroyed). Not up yet: not connected,
    // still proving itself to its peer, or refused by either side's check.
    const bool handshaking = c->outgoing && c->auth_wait;
    if (status != Errc::canceled &&
        (was_connecting || handshaking || status == Errc::access_denied))
        note(LinkEvent::connect_failed);
    else if (status != Errc::canceled && c->state == Conn::State::open)
        note(LinkEvent::lost);
    std::string who = c->peer ? addr_describe(c->peer) : std::string("an unidentified peer");
    if (status == Errc::protocol_error) {
        if (auto unlogged = protocol_error_log_.admit())
            TALARIA_LOG(tcp, warn, "disconnecting {} (fd {}): protocol error: {}{}", who, c->fd,
                        why, log::held_back(*unlogged));
    } else
        TALARIA_LOG(tcp, debug, "connection to {} (fd {}) closed ({}): {}", who, c->fd,
                    errc_name(status), why);
    if (c->outgoing && c->peer && status == Errc::access_denied) {
        // Refused at set-up, by the server's check or ours: why (with what to change on this
        // side) is the error of the calls it fails (peer_failure).
        TcpAddr* p = peer_of(c->peer);
        std::lock_guard g(p->failure_mu);
        p->failure = why;
    }
    if (status == Errc::protocol_error && c->outgoing && c->peer) {
        // What the peer sent is not ours to read (not Talaria, another version, a protected
        // stream met unprotected): the error of the calls it fails says so (peer_failure).
        TcpAddr* p = peer_of(c->peer);
        std::lock_guard g(p->failure_mu);
        p->failure = fmt::format("protocol error from {}: {}", p->str, why);
    }
    if (was_connecting) status = Errc::unreachable;
    if (status == Errc::protocol_error || status == Errc::io_error) status = Errc::disconnected;
    ::epoll_ctl(c->lane ? c->lane->epfd : setup_epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    c->fd = -1;
    c->state = Conn::State::closed;
    if (c->peer) conn_unpeered(c);
    Lane* l = c->lane;
    if (c->paused) {
        c->paused = false;
        --l->paused;
    }
    if (l == nullptr) {  // accepted, before its hello (or between hello and lane): no ops
        pending_.erase(*c);
        pending_dead_.push_back(c);
        return;
    }

    // The frame being received.
    if (c->rx_op) {
        TcpOp* op = c->rx_op;
        c->rx_op = nullptr;
        if (c->sink == Conn::Sink::op && op->completion.type == OpType::recv_unexpected &&
            l->match.repost_front(op)) {
            // A receive from anyone: the message died with its sender, the receive did not.
            op->state = OpState::recv_posted;
        } else if (c->sink == Conn::Sink::op) {
            complete_recv(op, c->source, c->hdr.context_id, c->hdr.tag, 0, status);
        } else {
            op->state = OpState::idle;
            complete_op(op, status);
        }
    }
    if (c->rx_msg) {
        l->match.msg_free(c->rx_msg);
        c->rx_msg = nullptr;
    }
    c->in_payload = false;
    c->rx_foreign = false;
    // Everything queued to send, then put/get waiting for a response.
    while (SendItem* it = c->sendq.pop_front()) {
        if (it->kind == SendItem::Kind::control) {
            control_free(*l, static_cast<Control*>(it));
            continue;
        }
        auto* op = static_cast<TcpOp*>(it);
        if (static_cast<ListHook<RmaTag>*>(op)->linked()) c->rma_wait.erase(*op);
        op->state = OpState::idle;
        complete_op(op, status);
    }
    c->queued_bytes = 0;
    c->replies = 0;
    c->skip_front = 0;
    while (TcpOp* op = c->rma_wait.pop_front()) {
        op->state = OpState::idle;
        complete_op(op, status);
    }
    if (c->peer) {
        drop_route(*l, c);
        // Expected receives of this context from that peer would wait forever: fail them,
        // unless another connection of the lane to the peer is still up.
        bool other = false;
        for (Conn& o : l->conns)
            if (&o != c && o.peer == c->peer && o.state != Conn::State::closed) other = true;
        if (!other) {
            l->match.take_expected_from(c->peer, [&](TcpOp* op) {
                complete_recv(op, c->source, 0, op->match_tag, 0, status);
            });
        }
    }
    l->conns.erase(*c);
    l->dead.push_back(c);
}

void TcpTransport::set_peer(Conn* c, Addr peer) {
    c->source = alias_of(this, peer);
    c->peer = std::move(peer);
    peer_of(c->peer)->open_conns.fetch_add(1, std::memory_order_relaxed);
}

void TcpTransport::conn_unpeered(Conn* c) noexcept {
    if (peer_of(c->peer)->open_conns.fetch_sub(1, std::memory_order_acq_rel) == 1)
        peers_closed_.fetch_add(1, std::memory_order_release);
}

void TcpTransport::drop_early_of_closed_locked(Lane& l) noexcept {
    l.peers_closed_seen = peers_closed_.load(std::memory_order_acquire);
    if (l.match.early_count() == 0) return;
    const std::size_t n = l.match.drop_early_if(
        [](const Addr& a) { return peer_of(a)->open_conns.load(std::memory_order_acquire) == 0; });
    if (n != 0)
        TALARIA_LOG(tcp, debug,
                    "context {}: freed {} early expected message(s) of peers that have closed",
                    l.id, n);
}

void TcpTransport::abandon_reply(TcpOp* op) noexcept {
    Conn* c = op->conn;
    const uint32_t skip = 1 + op->skip_after;
    if (TcpOp* before = c->rma_wait.prev_of(*op))
        before->skip_after += skip;
    else
        c->skip_front += skip;
    c->rma_wait.erase(*op);
    op->state = OpState::idle;
    op->completion.size = 0;
    complete_op(op, Errc::canceled);
}

void TcpTransport::withdraw_unsent(TcpOp* op) noexcept {
    Conn* c = op->conn;
    c->sendq.erase(*op);
    c->queued_bytes -= op->total;
    if (static_cast<ListHook<RmaTag>*>(op)->linked()) c->rma_wait.erase(*op);
    op->state = OpState::idle;
    complete_op(op, Errc::canceled);
}

bool TcpTransport::addr_disconnect(const Addr& a, std::string_view why) {
    if (!a || a.impl()->transport() != this) return false;
    TcpAddr* target = peer_of(a);
    const std::string reason(why);
    bool closed = false;
    std::lock_guard s(setup_mu_);  // lanes_; then each lane's lock, as withdraw_borrowed_locked
    for (auto& lp : lanes_) {
        Lane* l = lp.get();
        if (l == nullptr) continue;
        std::lock_guard g(l->mu);
        l->conns.for_each_safe([&](Conn& c) {
            if (!c.peer || peer_of(c.peer) != target) return;
            close_conn(&c, Errc::protocol_error, reason);
            closed = true;
        });
    }
    return closed;
}

void TcpTransport::close_lane_locked(Lane& l, Errc status, const std::string& why) {
    l.conns.for_each_safe([&](Conn& c) { close_conn(&c, status, why); });
}

void TcpTransport::withdraw_borrowed_locked(Lane& own, const Context* ctx) {
    for (auto& lp : lanes_) {
        Lane* o = lp.get();
        if (o == nullptr || o == &own) continue;
        std::lock_guard g(o->mu);
        o->conns.for_each_safe([&](Conn& c) {
            // On the wire (part sent, awaiting its response, or being received into): the
            // stream cannot drop it, so the connection goes (its peer reconnects).
            bool on_wire = c.rx_op && c.rx_op->ctx == ctx;
            for (TcpOp& op : c.rma_wait)
                if (op.ctx == ctx && (op.state != OpState::send_queued || op.sent != 0))
                    on_wire = true;
            for (SendItem& it : c.sendq)
                if (it.kind == SendItem::Kind::op && static_cast<TcpOp&>(it).ctx == ctx &&
                    it.sent != 0)
                    on_wire = true;
            if (on_wire) {
                close_conn(&c, Errc::canceled,
                           fmt::format("context {} is destroyed with a transfer in flight on a "
                                       "connection of context {}",
                                       ctx->id(), o->id));
                return;
            }
            c.sendq.for_each_safe([&](SendItem& it) {
                if (it.kind != SendItem::Kind::op) return;
                auto& op = static_cast<TcpOp&>(it);
                if (op.ctx == ctx) withdraw_unsent(&op);
            });
        });
        reap_dead(*o);
    }
}

void TcpTransport::reap_dead(Lane& l) {
    for (Conn* c : l.dead)
        delete c;
    l.dead.clear();
}

void TcpTransport::on_connected(Conn* c) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err != 0) {
        close_conn(c, Errc::unreachable, connect_failure(peer_of(c->peer), err));
        return;
    }
    {
        std::lock_guard g(peer_of(c->peer)->failure_mu);
        peer_of(c->peer)->failure.clear();  // reached now: an older failure no longer explains
    }
    c->state = Conn::State::open;
    if (!c->auth_wait) note(LinkEvent::connected);  // else once authenticated
    TALARIA_LOG(tcp, debug, "connected to {} fd={}", peer_of(c->peer)->str, c->fd);
    flush(c);
}

void TcpTransport::on_event(Conn* c, uint32_t events) {
    if (c->state == Conn::State::closed) return;
    if (c->state == Conn::State::connecting) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
        on_connected(c);
        if (c->state == Conn::State::closed) return;
    }
    // A hang-up or error is reported even while the connection is paused: read what is left
    // (each round takes at least a frame), or epoll would report it again and again.
    if (c->paused && (events & (EPOLLHUP | EPOLLERR))) resume(c);
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_ready(c);
    if (c->state == Conn::State::closed) return;
    if (events & EPOLLOUT) flush(c);  // also disarms EPOLLOUT once the queue is empty
}

// --- progress -----------------------------------------------------------------------------------

namespace {
// Busy polling with this few connections reads them directly (one recv each, as a bare socket
// loop would) instead of an epoll_wait per poll: that saves a system call per message. Epoll
// still runs every kEpollEvery polls, for accepts, connects, EPOLLOUT and errors.
constexpr std::size_t kDirectPollConns = 2;
constexpr unsigned kEpollEvery = 16;
/// How often a busy context looks at the setup set (accepts, hellos).
constexpr uint64_t kSetupPollNs = 100'000;
}  // namespace

void TcpTransport::poll_once(Lane& l, bool use_epoll) {
    if (!use_epoll && l.conns.size() <= kDirectPollConns && ++l.polls % kEpollEvery != 0) {
        l.conns.for_each_safe([this](Conn& c) {
            if (c.state == Conn::State::open) read_ready(&c);
        });
        reap_dead(l);
        return;
    }
    epoll_event evs[kMaxEvents];
    int n = ::epoll_wait(l.epfd, evs, kMaxEvents, 0);
    for (int i = 0; i < n; ++i) {
        if (evs[i].data.ptr == &l.bell_fd)
            drain_bell(l.bell_fd);  // stale: the inbox is looked at on every progress
        else
            on_event(static_cast<Conn*>(evs[i].data.ptr), evs[i].events);
    }
    reap_dead(l);
}

Result<void> TcpTransport::progress(Context& ctx, TimePoint deadline) {
    auto& tc = static_cast<TcpContext&>(ctx);
    Lane& l = tc.lane();
    bool woke = false;        // after blocking, ask epoll what woke us
    bool setup_woke = false;  // ... and the setup set was among it
    for (;;) {
        bool look_at_setup = setup_woke;
        {
            std::lock_guard g(l.mu);
            if (l.has_inbox.load(std::memory_order_acquire)) drain_inbox_locked(l);
            if (l.paused != 0) resume_paused_locked(l);
            poll_once(l, woke);
            if (l.peers_closed_seen != peers_closed_.load(std::memory_order_relaxed))
                drop_early_of_closed_locked(l);
            // New connections and hellos: every 100 µs while busy (try_lock), at once when
            // they woke us.
            if (listen_fd_ >= 0 && !look_at_setup) {
                uint64_t now = now_ns();
                if (now - l.last_setup_poll_ns >= kSetupPollNs) {
                    l.last_setup_poll_ns = now;
                    look_at_setup = true;
                }
            }
        }
        if (look_at_setup) poll_setup(setup_woke);
        if (l.borrowed.load(std::memory_order_relaxed) != 0) poll_lenders(l);
        if (ctx.has_completions()) return ok();
        if (deadline_passed(deadline)) return Errc::timeout;
        if (!ctx.prepare_block()) return ok();
        if (l.has_inbox.load(std::memory_order_acquire)) {
            ctx.end_block();
            woke = setup_woke = false;
            continue;
        }
        epoll_event evs[3];
        int ms = ms_until(deadline);
        // Our ops on another context's connections: that context's thread may be busy (in a
        // handler waiting for them), so look again soon rather than sleep on our set alone.
        if (l.borrowed.load(std::memory_order_relaxed) != 0 && (ms < 0 || ms > 1)) ms = 1;
        int n = ::epoll_wait(tc.block_fd(), evs, 3, ms);
        ctx.end_block();
        ctx.drain_event_fd();
        woke = true;
        setup_woke = false;
        for (int i = 0; i < n; ++i)
            if (evs[i].data.fd == setup_epfd_) setup_woke = true;
    }
}

void TcpTransport::poll_lenders(Lane& own) {
    for (std::size_t i = 0; i < opts_.max_contexts; ++i) {
        Lane* o = lane_ptr_[i].load(std::memory_order_acquire);
        if (o == nullptr || o == &own || !o->mu.try_lock()) continue;
        poll_once(*o, false);
        o->mu.unlock();
    }
}

bool TcpTransport::try_wait_for(Context& ctx) {
    Lane& l = lane_of(ctx);
    if (l.has_inbox.load(std::memory_order_acquire)) return false;
    if (l.borrowed.load(std::memory_order_relaxed) != 0) return false;  // see progress()
    epoll_event ev;
    if (::epoll_wait(l.epfd, &ev, 1, 0) != 0) return false;
    return ::epoll_wait(setup_epfd_, &ev, 1, 0) == 0;
}

bool TcpTransport::try_wait() {
    // A context's messages arrive on its lane's set, which is not in progress_fd(): blocking
    // there would not hear them. Block on a context's wait_fd() after Context::try_wait().
    return false;
}

}  // namespace talaria::na::tcp
