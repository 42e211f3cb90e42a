// ucx transport data path: posting, the active-message handler and software matching,
// completions of UCX requests, endpoint failure, cancel and progress.
#include <sys/epoll.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "na/ucx/ucx.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ucx {

namespace {

/// How often, at most, a thread blocked in progress() wakes while endpoints exist: UCX's
/// keepalive (which notices a dead shared-memory peer) runs only from ucp_worker_progress.
constexpr int kKeepaliveTickMs = 200;
/// While an endpoint is being set up: no sleeping for this long, then naps of this many ms.
constexpr Duration kConnectSpin = std::chrono::milliseconds(200);
constexpr int kConnectNapMs = 5;

void op_done_cb(void* req, ucs_status_t st, void* user) {
    auto* op = static_cast<UcxOp*>(user);
    if (op->req == req) op->req = nullptr;
    ucp_request_free(req);
    op->owner->on_op_done(op, st);
}

}  // namespace

// --- posting ------------------------------------------------------------------------------------

Result<OpId> UcxTransport::fail_async(Context& ctx, Callback&& cb, OpType type, Errc status,
                                      const std::string& why) {
    UcxOp* op = ops_.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    if (status != Errc::ok)
        TALARIA_LOG(ucx, debug, "{} fails with {}: {}", op_type_name(type), errc_name(status), why);
    OpId id = op->id();
    complete_op(op, status);
    return id;
}

void UcxTransport::track_locked(UcxOp* op, ucs_status_ptr_t r, const char* call) {
    if (r == nullptr) {  // done in place: no request was allocated
        complete_op(op, Errc::ok);
        return;
    }
    if (UCS_PTR_IS_ERR(r)) {
        ucs_status_t st = UCS_PTR_STATUS(r);
        TALARIA_LOG(ucx, debug, "{}: {} failed: {}", scheme_, call, ucs_status_string(st));
        if (op->completion.type == OpType::put || op->completion.type == OpType::get)
            op->completion.size = 0;
        complete_op(op, errc_of(st));
        return;
    }
    op->req = r;
    op->state = OpState::inflight;
    inflight_.push_back(*op);
}

void UcxTransport::on_op_done(UcxOp* op, ucs_status_t st) {
    // From ucp_worker_progress, ucp_request_cancel or ucp_ep_close_nbx: under mu_.
    if (static_cast<ListHook<InflightTag>*>(op)->linked()) inflight_.erase(*op);
    op->state = OpState::idle;
    if (closing_ || op->ctx == nullptr) {  // its context (or the transport) is gone
        op->releaser->release(op);
        return;
    }
    Errc s = errc_of(st);
    if (s != Errc::ok && (op->completion.type == OpType::put || op->completion.type == OpType::get))
        op->completion.size = 0;
    if (s != Errc::ok && s != Errc::canceled)
        TALARIA_LOG(ucx, debug, "{} failed: {}", op_type_name(op->completion.type),
                    ucs_status_string(st));
    complete_op(op, s);
}

Result<OpId> UcxTransport::post_send(Context& ctx, Callback cb, const MsgBuffer& buf,
                                     std::size_t len, const Addr& dest, uint8_t dest_ctx, Tag tag,
                                     bool expected) {
    OpType type = expected ? OpType::send_expected : OpType::send_unexpected;
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    if (len > kMaxMessageSize)
        return Error(Errc::message_too_large,
                     fmt::format("{}: a {}-byte message exceeds max_{}_size() = {}", scheme_, len,
                                 expected ? "expected" : "unexpected", kMaxMessageSize));
    if (len > buf.size())
        return Error(Errc::invalid_argument, fmt::format("{}: send of {} bytes from a {}-byte "
                                                         "buffer",
                                                         scheme_, len, buf.size()));
    if (!dest || dest.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: destination is not an address of this transport", scheme_));

    std::lock_guard g(mu_);
    auto e = ep_for_locked(dest.as<UcxAddr>());
    if (!e) return fail_async(ctx, std::move(cb), type, e.code(), e.error().message());
    UcxOp* op = ops_.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->owner = this;
    MsgHeader h;
    h.kind = expected ? MsgKind::expected : MsgKind::unexpected;
    h.context_id = dest_ctx;
    h.tag = tag;
    h.instance = instance_;
    h.seq = dest.as<UcxAddr>()->tx_seq++;
    encode_msg_header(h, op->header);
    op->completion.size = len;
    ucp_request_param_t p;
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = &op_done_cb;
    p.user_data = op;
    // Eager only: small messages complete in place (no request), and the receiver gets the
    // whole message in its callback (no rendezvous to drive).
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    OpId id = op->id();
    ucs_status_ptr_t r =
        ucp_am_send_nbx((*e)->h, kAmId, op->header, kMsgHeaderSize, buf.data(), len, &p);
    track_locked(op, r, "ucp_am_send_nbx");
    return id;
}

Result<OpId> UcxTransport::post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                                std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                                Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, false);
}

Result<OpId> UcxTransport::post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                              std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                              Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, true);
}

void UcxTransport::complete_recv(UcxOp* op, const Addr& source, uint8_t ctx_id, Tag tag,
                                 std::size_t size, Errc status) {
    op->completion.source = source;
    op->completion.context_id = ctx_id;
    op->completion.tag = tag;
    op->completion.size = size;
    op->state = OpState::idle;
    op->match_source.reset();
    complete_op(op, status);
}

Result<OpId> UcxTransport::post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    std::lock_guard g(mu_);
    UcxOp* op = ops_.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->owner = this;
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (UcxMsg* m = match_.post_unexpected(ctx.id(), op)) {
        match_.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
    }
    return id;
}

Result<OpId> UcxTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                              const Addr& source, Tag tag) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    if (!source || source.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: source is not an address of this transport", scheme_));
    std::lock_guard g(mu_);
    UcxOp* op = ops_.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->owner = this;
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (UcxMsg* m = match_.post_expected(op, source, tag)) {
        match_.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
        return id;
    }
    auto* pa = source.as<UcxAddr>();
    if (pa->dead) {
        match_.withdraw(op);
        complete_recv(op, source, 0, tag, 0, pa->dead_status);
        return id;
    }
    // An endpoint to the source watches it: if it dies, UCX tells us and this receive fails
    // with disconnected instead of waiting forever.
    if (!pa->ep && !pa->anonymous && source != self_) (void)ep_for_locked(pa);
    return id;
}

Result<OpId> UcxTransport::post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    const bool is_put = type == OpType::put;
    const char* what = is_put ? "post_put" : "post_get";
    TALARIA_CHECK(
        check_rma_args(this, scheme_, what, ctx, local, local_off, remote, len, remote_addr));
    auto* rm = remote.as<UcxMem>();
    auto* lm = local.as<UcxMem>();

    std::lock_guard g(mu_);
    // One-sided: the target never sees the request, so the handle's access mode and bounds are
    // all there is to check, here (see docs/architecture.md (ucx)).
    bool allowed = is_put ? (uint8_t(rm->access()) & uint8_t(Access::write_only))
                          : (uint8_t(rm->access()) & uint8_t(Access::read_only));
    if (!allowed)
        return fail_async(ctx, std::move(cb), type, Errc::access_denied,
                          fmt::format("the remote region does not allow {}",
                                      is_put ? "writes (put)" : "reads (get)"));
    if (remote_off > rm->length() || len > rm->length() - remote_off)
        return fail_async(ctx, std::move(cb), type, Errc::out_of_range,
                          fmt::format("remote range [{}, +{}) is outside the {}-byte region",
                                      remote_off, len, rm->length()));
    Addr owner = rm->local() ? self_ : rm->owner_addr;
    if (owner && owner != remote_addr)
        return fail_async(ctx, std::move(cb), type, Errc::invalid_argument,
                          fmt::format("the remote handle was registered by {}, not by {}",
                                      owner.as<UcxAddr>()->str, remote_addr.as<UcxAddr>()->str));
    auto e = ep_for_locked(remote_addr.as<UcxAddr>());
    if (!e) return fail_async(ctx, std::move(cb), type, e.code(), e.error().message());
    Ep* ep = *e;
    if (len == 0) return fail_async(ctx, std::move(cb), type, Errc::ok, {});
    if (uint32_t pid = rm->local() ? pid_ : rm->pid; pid != 0) {
        // ucx+sm, same pid namespace: copy now, as UCX's cma would (see init_direct_rma).
        UcxOp* op = ops_.acquire(ctx, std::move(cb), type);
        if (!op) return ops_exhausted(fmt::format("{} {}", scheme_, what), opts_.max_ops);
        op->owner = this;
        OpId id = op->id();
        std::string why;
        Errc st = copy_direct(is_put, pid, reinterpret_cast<std::byte*>(local->base()) + local_off,
                              rm->base() + remote_off, len, why);
        if (st != Errc::ok) {
            TALARIA_LOG(ucx, debug, "{} {} to {} failed: {}", scheme_, what,
                        remote_addr.as<UcxAddr>()->str, why);
            op->completion.size = 0;
        } else {
            op->completion.size = len;
        }
        complete_op(op, st);
        return id;
    }
    if (rm->rkey_ep != ep->serial || !rm->rkey_h) {
        if (rm->rkey_h) ucp_rkey_destroy(rm->rkey_h);
        rm->rkey_h = nullptr;
        ucs_status_t st = ucp_ep_rkey_unpack(ep->h, rm->rkey.data(), &rm->rkey_h);
        if (st != UCS_OK) {
            rm->rkey_h = nullptr;
            return fail_async(ctx, std::move(cb), type, Errc::invalid_argument,
                              fmt::format("ucp_ep_rkey_unpack of the remote handle's key failed: "
                                          "{}",
                                          ucs_status_string(st)));
        }
        rm->rkey_ep = ep->serial;
    }
    UcxOp* op = ops_.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(fmt::format("{} {}", scheme_, what), opts_.max_ops);
    op->owner = this;
    op->completion.size = len;
    OpId id = op->id();
    void* lptr = reinterpret_cast<std::byte*>(local->base()) + local_off;
    uint64_t raddr = rm->base() + remote_off;
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    p.memh = lm->memh;
    if (is_put) {
        // Local completion of a put only means the buffer is free again; the flush after it
        // completes when the data is at the target, which is what the callback promises.
        ucs_status_ptr_t r = ucp_put_nbx(ep->h, lptr, len, raddr, rm->rkey_h, &p);
        if (UCS_PTR_IS_ERR(r)) {
            track_locked(op, r, "ucp_put_nbx");
            return id;
        }
        if (r) ucp_request_free(r);  // released by UCX when it completes
        ucp_request_param_t f;
        f.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        f.cb.send = &op_done_cb;
        f.user_data = op;
        track_locked(op, ucp_ep_flush_nbx(ep->h, &f), "ucp_ep_flush_nbx");
    } else {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = &op_done_cb;
        p.user_data = op;
        track_locked(op, ucp_get_nbx(ep->h, lptr, len, raddr, rm->rkey_h, &p), "ucp_get_nbx");
    }
    return id;
}

Errc UcxTransport::copy_direct(bool is_put, uint32_t pid, void* local, uint64_t remote,
                               std::size_t len, std::string& why) noexcept {
    std::size_t done = 0;
    while (done < len) {
        iovec l{static_cast<std::byte*>(local) + done, len - done};
        iovec r{reinterpret_cast<void*>(uintptr_t(remote + done)), len - done};
        ssize_t n = is_put ? ::process_vm_writev(pid_t(pid), &l, 1, &r, 1, 0)
                           : ::process_vm_readv(pid_t(pid), &l, 1, &r, 1, 0);
        if (n > 0) {
            done += std::size_t(n);
            continue;
        }
        int err = n == 0 ? EFAULT : errno;
        if (err == EINTR) continue;
        try {
            why = fmt::format("{}(pid {}, {} bytes at {:#x}) after {} bytes: {}",
                              is_put ? "process_vm_writev" : "process_vm_readv", pid, len, remote,
                              done, std::strerror(err));
        } catch (...) {
        }
        switch (err) {
            case ESRCH:
                return Errc::disconnected;  // the owner process is gone
            case EPERM:
                return Errc::permission_denied;
            case ENOMEM:
                return Errc::no_memory;
            default:
                return Errc::io_error;  // EFAULT: not mapped (here or in the owner)
        }
    }
    return Errc::ok;
}

Result<OpId> UcxTransport::post_put(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::put, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<OpId> UcxTransport::post_get(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::get, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<void> UcxTransport::cancel(OpId id) {
    std::lock_guard g(mu_);
    UcxOp* op = ops_.lookup(id);
    if (!op)
        return Error(
            Errc::not_found,
            fmt::format("{} cancel: the operation already finished (stale OpId)", scheme_));
    switch (op->state) {
        case OpState::recv_posted:
            match_.withdraw(op);
            op->state = OpState::idle;
            op->match_source.reset();
            complete_op(op, Errc::canceled);
            break;
        case OpState::inflight:
            // A message is never withdrawn once handed to UCX (the receiver counts on every
            // sequence number arriving). put/get: UCX completes the request with
            // UCS_ERR_CANCELED if it can still stop it (the callback may run from inside this
            // call), otherwise normally.
            if (op->req &&
                (op->completion.type == OpType::put || op->completion.type == OpType::get))
                ucp_request_cancel(worker_, op->req);
            break;
        case OpState::idle:
            break;
    }
    return ok();
}

// --- receiving ----------------------------------------------------------------------------------

void UcxTransport::deliver_locked(const MsgHeader& h, const Addr& source, const std::byte* data,
                                  std::size_t len) {
    if (h.kind == MsgKind::bye) {  // handled once progress returns (it closes endpoints)
        byes_.push_back(source);
        return;
    }
    const bool expected = h.kind == MsgKind::expected;
    bool no_context = false;
    if (UcxOp* op = match_.match(expected, h.context_id, source, h.tag, &no_context)) {
        Errc st = copy_message(data, len, op->buf, op->cap);
        complete_recv(op, source, h.context_id, h.tag, len, st);
        return;
    }
    Queued q = match_.queue_copy(expected, h.context_id, source, h.tag, {data, len});
    if (q != Queued::ok)
        TALARIA_LOG(ucx, warn,
                    "{}: dropping a {}-byte {} message (tag {}) from {} for context {}: {}",
                    scheme_, len, expected ? "expected" : "unexpected", h.tag,
                    source.as<UcxAddr>()->str, h.context_id, match_.refusal(q));
}

void UcxTransport::on_hello_locked(const MsgHeader& h, std::span<const std::byte> payload) {
    auto s = decode_hello(payload);
    if (!s) {
        TALARIA_LOG(ucx, warn, "{}: dropping a bad hello: {}", scheme_, s.error().describe());
        return;
    }
    std::string_view str = *s;
    Addr peer;
    auto p = str.find("://");
    std::string_view key = p == std::string_view::npos ? str : str.substr(p + 3);
    if (spec_.mode == Mode::sockaddr && key.starts_with('~')) {
        // A client that does not listen: known by its instance id, reachable only over the
        // endpoint it opened.
        if (key.size() != 17 || !is_hex(key.substr(1, 16)) ||
            key.substr(1) != fmt::format("{:016x}", h.instance)) {
            TALARIA_LOG(ucx, warn, "{}: dropping a hello with a bad client name", scheme_);
            return;
        }
        peer = intern_locked(std::string(key));
        peer.as<UcxAddr>()->anonymous = true;
    } else {
        auto r = lookup_locked(str, true);
        if (!r) {
            TALARIA_LOG(ucx, warn, "{}: dropping a hello naming an invalid address: {}", scheme_,
                        r.error().describe());
            return;
        }
        peer = *r;
    }
    auto* pa = peer.as<UcxAddr>();
    if (pa->instance != h.instance || last_instance_ == h.instance) {
        last_source_.reset();
        last_instance_ = 0;
    }
    if (pa->instance != h.instance) {
        std::lock_guard gi(inst_mu_);
        if (pa->instance != 0) {
            auto it = instances_.find(pa->instance);
            if (it != instances_.end() && it->second == pa) instances_.erase(it);
        }
        pa->instance = h.instance;
        instances_[h.instance] = pa;
    }
    // Endpoints we accepted from its connection requests (they carry its instance as client
    // id): bind them to the peer, and answer on one unless we already have an endpoint.
    if (spec_.mode == Mode::sockaddr) {
        for (Ep& e : eps_) {
            if (e.outgoing || e.peer || e.client_id != h.instance || e.closing || e.failed)
                continue;
            e.peer = peer;
            if (!pa->ep) pa->ep = &e;
        }
    }
    // Worker mode: connect back at once, so that replies need no connection set-up and a dead
    // peer is noticed (by the endpoint's keepalive) while we wait for it.
    if (!pa->ep && !pa->dead && !pa->anonymous && pa != self_.as<UcxAddr>()) {
        if (auto e = ep_for_locked(pa); !e)
            TALARIA_LOG(ucx, debug, "connecting back to {} failed: {}", pa->str,
                        e.error().describe());
    }
    TALARIA_LOG(ucx, debug, "hello from {} (instance {:016x})", pa->str, h.instance);
    // Messages it sent that overtook the hello.
    if (held_count_ > 0) release_held_locked();
}

void UcxTransport::hold_locked(const MsgHeader& h, std::span<const std::byte> data) {
    if (held_count_ >= kMaxHeldMsgs) {
        TALARIA_LOG(ucx, warn,
                    "{}: dropping a message from instance {:016x}: {} undeliverable messages "
                    "held already (no hello from their senders, or gaps in their streams)",
                    scheme_, h.instance, held_count_);
        return;
    }
    UcxMsg* m = match_.msg_alloc();
    m->data.assign(data.begin(), data.end());
    m->tag = h.tag;
    m->context_id = h.context_id;
    m->expected = h.kind == MsgKind::expected;
    m->bye = h.kind == MsgKind::bye;
    m->instance = h.instance;
    m->seq = h.seq;
    held_.push_back(*m);
    ++held_count_;
}

void UcxTransport::sequence_locked(const MsgHeader& h, UcxAddr* source,
                                   std::span<const std::byte> data) {
    if (h.seq != source->rx_next) {
        if (int32_t(h.seq - source->rx_next) < 0) {
            TALARIA_LOG(ucx, warn, "{}: dropping a duplicate message #{} from {}", scheme_, h.seq,
                        source->str);
            return;
        }
        hold_locked(h, data);
        return;
    }
    ++source->rx_next;
    deliver_locked(h, Addr(source), data.data(), data.size());
    if (held_count_ > 0) release_held_locked();
}

void UcxTransport::release_held_locked() {
    // Rare (connection set-up, a hello overtaken), and bounded by kMaxHeldMsgs: rescan until
    // nothing more is deliverable.
    for (bool progress = true; progress && held_count_ > 0;) {
        progress = false;
        held_.for_each_safe([&](UcxMsg& m) {
            Addr source;
            {
                std::lock_guard gi(inst_mu_);
                auto it = instances_.find(m.instance);
                if (it != instances_.end() && it->second->try_ref())
                    source = Addr::adopt(it->second);
            }
            if (!source) return;
            auto* pa = source.as<UcxAddr>();
            if (m.seq != pa->rx_next) {
                if (int32_t(m.seq - pa->rx_next) < 0) {  // a duplicate
                    held_.erase(m);
                    --held_count_;
                    match_.msg_free(&m);
                }
                return;
            }
            held_.erase(m);
            --held_count_;
            ++pa->rx_next;
            MsgHeader mh;
            mh.kind = m.bye ? MsgKind::bye : m.expected ? MsgKind::expected : MsgKind::unexpected;
            mh.context_id = m.context_id;
            mh.tag = m.tag;
            mh.instance = m.instance;
            mh.seq = m.seq;
            deliver_locked(mh, source, m.data.data(), m.data.size());
            match_.msg_free(&m);
            progress = true;
        });
    }
}

ucs_status_t UcxTransport::on_am(const void* header, std::size_t header_len, void* data,
                                 std::size_t len, const ucp_am_recv_param_t* param) {
    // From ucp_worker_progress, under mu_. Every byte here comes from a peer.
    if (closing_) return UCS_OK;
    auto h = decode_msg_header(
        std::span<const std::byte>(static_cast<const std::byte*>(header), header_len));
    if (!h) {
        TALARIA_LOG(ucx, warn, "{}: dropping a message: {}", scheme_, h.error().describe());
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        // We send eager only: a rendezvous message is not from a peer speaking our protocol.
        // Returning UCS_OK without receiving it lets UCX release it.
        TALARIA_LOG(ucx, warn, "{}: dropping a {}-byte rendezvous message (peers send eager)",
                    scheme_, len);
        return UCS_OK;
    }
    auto payload = std::span<const std::byte>(static_cast<const std::byte*>(data), len);
    if (h->kind == MsgKind::hello) {
        on_hello_locked(*h, payload);
        return UCS_OK;
    }
    if (len > kMaxMessageSize) {
        TALARIA_LOG(ucx, warn, "{}: dropping a {}-byte message (limit {})", scheme_, len,
                    kMaxMessageSize);
        return UCS_OK;
    }
    // The last sender, cached (a strong reference, dropped when it is gone or re-introduced),
    // spares the instance map's lock on a busy stream.
    if (h->instance == last_instance_ && last_source_) [[likely]] {
        sequence_locked(*h, last_source_.as<UcxAddr>(), payload);
        return UCS_OK;
    }
    Addr source;
    {
        std::lock_guard gi(inst_mu_);
        auto it = instances_.find(h->instance);
        if (it != instances_.end() && it->second->try_ref()) source = Addr::adopt(it->second);
    }
    if (!source) {
        hold_locked(*h, payload);  // its hello has not come yet
        return UCS_OK;
    }
    last_instance_ = h->instance;
    last_source_ = source;
    sequence_locked(*h, source.as<UcxAddr>(), payload);
    return UCS_OK;
}

// --- endpoint failure ---------------------------------------------------------------------------

void UcxTransport::on_ep_error(Ep* e, ucs_status_t status) {
    // From ucp_worker_progress, under mu_. UCX forbids closing the endpoint from here; it is
    // closed (forced) once progress returns.
    if (e->failed || e->closing) return;
    e->failed = true;
    e->fail_status = status;
    failed_.push_back(e);
}

void UcxTransport::peer_gone_locked(const Addr& peer, Errc st, const std::string& why) {
    auto* pa = peer.as<UcxAddr>();
    if (last_source_ == peer) {
        last_source_.reset();
        last_instance_ = 0;
    }
    if (!pa->dead) {
        TALARIA_LOG(ucx, debug, "{}", why);
        pa->dead = true;
        pa->dead_status = st;
        pa->dead_why = why;
        // A later lookup makes a fresh address (a new process may come to live there).
        addrs_.unlink(pa->key, pa);
    }
    if (held_count_ > 0 && pa->instance != 0) {
        held_.for_each_safe([&](UcxMsg& m) {
            if (m.instance != pa->instance) return;
            held_.erase(m);
            --held_count_;
            match_.msg_free(&m);
        });
    }
    match_.take_expected_from(peer,
                              [&](UcxOp* op) { complete_recv(op, peer, 0, op->match_tag, 0, st); });
    // Every endpoint to it: forced closes fail the UCX requests still pending on them.
    eps_.for_each_safe([&](Ep& o) {
        if (o.peer == peer) close_ep_locked(&o);
    });
    pa->ep = nullptr;
}

void UcxTransport::handle_failures_locked() {
    std::vector<Ep*> failed;
    failed.swap(failed_);
    for (Ep* e : failed) {
        if (e->closing) continue;
        if (e->peer && e->peer != self_) {
            Errc st = errc_of(e->fail_status);
            if (st == Errc::ok || st == Errc::canceled) st = Errc::disconnected;
            Addr peer = e->peer;
            peer_gone_locked(
                peer, st,
                fmt::format("{}: the endpoint to {} failed: {}", scheme_, peer.as<UcxAddr>()->str,
                            ucs_status_string(e->fail_status)));
        }
        close_ep_locked(e);
    }
    std::vector<Addr> byes;
    byes.swap(byes_);
    for (const Addr& peer : byes)
        if (peer != self_)
            peer_gone_locked(
                peer, Errc::disconnected,
                fmt::format("{}: {} closed its transport", scheme_, peer.as<UcxAddr>()->str));
}

void UcxTransport::say_bye_locked() {
    // A peer on the same host cannot see our process die when only the transport goes (ep
    // keepalive checks the process), and a forced close tells it nothing: say so, in the
    // stream (after our last message), and give it a moment to leave.
    // On the heap: a bye UCX still holds after the bounded waits below completes later (from
    // the destructor's progress), and its callback and header must still be there then.
    struct Byes {
        int pending = 0;
        std::vector<std::unique_ptr<std::byte[]>> headers;
    };
    auto* byes = new Byes;
    int& pending = byes->pending;
    auto& headers = byes->headers;
    auto bye_cb = [](void* req, ucs_status_t, void* user) {
        ucp_request_free(req);
        --static_cast<Byes*>(user)->pending;
    };
    for (Ep& e : eps_) {
        if (e.failed || e.closing || !e.peer || e.peer == self_) continue;
        auto* pa = e.peer.as<UcxAddr>();
        if (pa->ep != &e || pa->dead) continue;  // one bye per peer, on the stream's endpoint
        MsgHeader h;
        h.kind = MsgKind::bye;
        h.instance = instance_;
        h.seq = pa->tx_seq++;
        headers.push_back(std::make_unique<std::byte[]>(kMsgHeaderSize));
        encode_msg_header(h, headers.back().get());
        ucp_request_param_t p;
        p.op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
        p.cb.send = bye_cb;
        p.user_data = byes;
        p.flags = UCP_AM_SEND_FLAG_EAGER;
        ucs_status_ptr_t r =
            ucp_am_send_nbx(e.h, kAmId, headers.back().get(), kMsgHeaderSize, nullptr, 0, &p);
        if (UCS_PTR_IS_PTR(r)) ++pending;
    }
    auto deadline = deadline_after(std::chrono::milliseconds(500));
    while (pending > 0 && !deadline_passed(deadline))
        ucp_worker_progress(worker_);
    // A bye still pending is freed by the forced close (its callback runs then, and must not
    // touch `pending` after we return): wait for those too, bounded.
    if (pending > 0) {
        for (Ep& e : eps_) {
            if (e.closing) continue;
            ucp_request_param_t p;
            p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = UCP_EP_CLOSE_FLAG_FORCE;
            ucs_status_ptr_t r = ucp_ep_close_nbx(e.h, &p);
            e.closing = true;
            e.close_req = UCS_PTR_IS_PTR(r) ? r : nullptr;
        }
        deadline = deadline_after(std::chrono::seconds(2));
        while (pending > 0 && !deadline_passed(deadline))
            ucp_worker_progress(worker_);
    }
    if (pending == 0) {
        delete byes;
    } else {
        // Left to UCX (a few header bytes, once per transport): freeing them could let a late
        // callback write into freed memory.
        TALARIA_LOG(ucx, warn,
                    "{}: {} bye messages still pending at close; their {} bytes stay "
                    "allocated",
                    scheme_, pending, pending * kMsgHeaderSize);
    }
}

// --- progress -----------------------------------------------------------------------------------

void UcxTransport::progress_locked() {
    // Once per poll, as a bare UCP loop does (each call polls every interface); the blocking
    // path calls again until ucp_worker_arm agrees that nothing is left.
    ucp_worker_progress(worker_);
    if (!failed_.empty() || !byes_.empty()) handle_failures_locked();
    if (!closing_eps_.empty()) reap_closed_locked();
}

Result<void> UcxTransport::progress(Context& ctx, TimePoint deadline) {
    auto& uc = static_cast<UcxContext&>(ctx);
    for (;;) {
        {
            std::lock_guard g(mu_);
            progress_locked();
        }
        if (ctx.has_completions()) return ok();
        if (deadline_passed(deadline)) return Errc::timeout;
        if (!ctx.prepare_block()) return ok();
        ucs_status_t st;
        int cap = -1;  // longest wait: none without endpoints
        {
            std::lock_guard g(mu_);
            st = ucp_worker_arm(worker_);
            if (!eps_.empty() || !closing_eps_.empty()) cap = kKeepaliveTickMs;
            // UCX drives connection set-up (sockaddr CM, wire-up) partly from its async thread
            // without always signalling the worker's fd: while an endpoint's peer has not
            // introduced itself yet, do not sleep (for its first kConnectSpin; in short naps
            // after that, so that a peer that never answers does not cost a whole core).
            auto now = Clock::now();
            for (const Ep& e : eps_) {
                if (e.peer && e.peer.as<UcxAddr>()->instance != 0) continue;
                cap = std::min(cap < 0 ? kKeepaliveTickMs : cap,
                               now - e.created < kConnectSpin ? 0 : kConnectNapMs);
                if (cap == 0) break;
            }
        }
        if (st == UCS_OK) {
            int ms = ms_until(deadline);
            if (cap >= 0 && (ms < 0 || ms > cap)) ms = cap;
            epoll_event ev;
            ::epoll_wait(uc.block_fd(), &ev, 1, ms);
        }
        ctx.end_block();
        ctx.drain_event_fd();
    }
}

bool UcxTransport::try_wait() {
    std::lock_guard g(mu_);
    if (!failed_.empty() || !byes_.empty()) return false;
    return ucp_worker_arm(worker_) == UCS_OK;
}

}  // namespace talaria::na::ucx
