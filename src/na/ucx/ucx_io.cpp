// ucx transport data path: posting, routes to a peer's contexts, the active-message handler and
// software matching, completions of UCX requests, endpoint failure, cancel and progress. Every
// function named *_locked runs under the lock of the lane (context) it is given.
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "na/ucx/ucx.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ucx {

namespace {

/// How often, at most, a thread blocked in progress() wakes while endpoints exist: UCX's
/// keepalive (which notices a dead shared-memory peer) runs only from ucp_worker_progress.
constexpr int kKeepaliveTickMs = 200;
/// How often a lane checks the processes of its ucx+sm peers (check_pids_locked), and every
/// how many progress passes it reads the clock to know.
constexpr Duration kPidCheckEvery = std::chrono::milliseconds(100);
constexpr uint32_t kPidCheckPasses = 64;
/// While an endpoint is being set up: no sleeping for this long, then naps of this many ms.
constexpr Duration kConnectSpin = std::chrono::milliseconds(200);
constexpr int kConnectNapMs = 5;
/// An endpoint whose peer context has not said hello after this no longer shortens sleeps.
constexpr Duration kConnectGiveUp = std::chrono::seconds(2);

void op_done_cb(void* req, ucs_status_t st, void* user) {
    auto* op = static_cast<UcxOp*>(user);
    if (op->req == req) op->req = nullptr;
    ucp_request_free(req);
    op->lane->t->on_op_done(op, st);
}

/// A control message (locate, located, rma_ack, rma_data): its header and payload, kept until
/// UCX is done; a get answer counts its bytes against its lane's kRmaAnswerBudget until then.
struct ControlMsg {
    alignas(8) std::byte header[kMsgHeaderSize]{};
    std::vector<std::byte> payload;
    Lane* charged_lane = nullptr;
    std::size_t charged = 0;
    void uncharge() noexcept {
        if (charged_lane) charged_lane->rma_answer_bytes -= charged;
        charged_lane = nullptr;
    }
};

void control_sent_cb(void* req, ucs_status_t, void* user) {
    // From ucp_worker_progress or a forced close of its lane: under the lane's lock.
    ucp_request_free(req);
    auto* m = static_cast<ControlMsg*>(user);
    m->uncharge();
    delete m;
}

/// A served put/get request's send completed (under its lane's lock, as control_sent_cb).
void rma_sent_cb(void* req, ucs_status_t st, void* user) {
    ucp_request_free(req);
    auto* slot = static_cast<RmaSlot*>(user);
    RmaXfer& x = *slot->x;
    slot->in_ucx = false;
    --x.in_ucx;
    x.lane->t->on_rma_sent(x, *slot, st);
}

/// The parameters of an eager active-message send whose completion calls `cb(req, st, user)`.
/// Eager only: small messages complete in place (no request), and the receiver gets the whole
/// message in its callback (no rendezvous to drive).
ucp_request_param_t eager_send(ucp_send_nbx_callback_t cb, void* user) noexcept {
    ucp_request_param_t p;
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = cb;
    p.user_data = user;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    return p;
}

/// A 64-bit mixer (splitmix64's finalizer).
uint64_t mix64(uint64_t x) noexcept {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

Lane& lane_of(Context& ctx) noexcept {
    return static_cast<UcxContext&>(ctx).lane();
}

/// Why `pa` was declared dead (its status, and the reason in `why`).
Errc dead_status(UcxAddr* pa, std::string& why) {
    std::lock_guard g(pa->dmu);
    why = pa->dead_why;
    return pa->dead_status;
}

/// Remember that `pa`'s context `ctx` is served, for messages of one kind, by its context
/// `lane`, whose worker is at `worker`. Called under dmu.
void learn_locked(UcxAddr* pa, uint8_t ctx, bool unexpected, uint8_t lane,
                  std::span<const std::byte> worker) {
    for (auto& w : pa->dir) {
        if (w.ctx != ctx || w.unexpected != unexpected) continue;
        w.lane = lane;
        w.worker.assign(worker.begin(), worker.end());
        return;
    }
    pa->dir.push_back(
        {ctx, unexpected, lane, std::vector<std::byte>(worker.begin(), worker.end())});
}

/// Where `pa`'s context `ctx` is served for messages of one kind: (lane, worker); lane -1 when
/// not known.
std::pair<int, std::vector<std::byte>> where(UcxAddr* pa, uint8_t ctx, bool unexpected) {
    std::lock_guard g(pa->dmu);
    for (const auto& w : pa->dir)
        if (w.ctx == ctx && w.unexpected == unexpected) return {w.lane, w.worker};
    return {-1, {}};
}

}  // namespace

// --- posting ------------------------------------------------------------------------------------

Result<OpId> UcxTransport::fail_async(Lane& l, Context& ctx, Callback&& cb, OpType type,
                                      Errc status, const std::string& why) {
    UcxOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->lane = &l;
    if (status != Errc::ok)
        TALARIA_LOG(ucx, debug, "{} fails with {}: {}", op_type_name(type), errc_name(status), why);
    OpId id = op->id();
    complete_op(op, status);
    return id;
}

void UcxTransport::track_locked(Lane& l, UcxOp* op, ucs_status_ptr_t r, const char* call) {
    if (r == nullptr) {  // done in place: no request was allocated
        op->state = OpState::idle;
        complete_op(op, Errc::ok);
        return;
    }
    if (UCS_PTR_IS_ERR(r)) {
        ucs_status_t st = UCS_PTR_STATUS(r);
        TALARIA_LOG(ucx, debug, "{}: {} failed: {}", scheme_, call, ucs_status_string(st));
        if (op->completion.type == OpType::put || op->completion.type == OpType::get)
            op->completion.size = 0;
        op->state = OpState::idle;
        complete_op(op, errc_of(st));
        return;
    }
    op->req = r;
    op->state = OpState::inflight;
    l.inflight.push_back(*op);
}

void UcxTransport::on_op_done(UcxOp* op, ucs_status_t st) {
    // From ucp_worker_progress, ucp_request_cancel or ucp_ep_close_nbx: under its lane's lock.
    Lane& l = *op->lane;
    if (static_cast<ListHook<InflightTag>*>(op)->linked()) l.inflight.erase(*op);
    op->state = OpState::idle;
    if (closing_.load(std::memory_order_relaxed) || op->ctx == nullptr) {
        // Its context (or the transport) is gone.
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

void UcxTransport::send_on_locked(Lane& l, Ep* e, UcxOp* op, const std::byte* data,
                                  std::size_t len) {
    op->hdr.seq = e->tx_seq++;
    op->hdr.stream = e->stream_id();
    encode_msg_header(op->hdr, op->header);
    ucp_request_param_t p = eager_send(&op_done_cb, op);
    ucs_status_ptr_t r = ucp_am_send_nbx(e->h, kAmId, op->header, kMsgHeaderSize, data, len, &p);
    track_locked(l, op, r, "ucp_am_send_nbx");
}

void UcxTransport::send_control_locked(Lane& l, Ep* e, MsgKind kind, uint8_t ctx, uint32_t tag,
                                       std::vector<std::byte> payload, std::size_t charge) {
    auto* m = new ControlMsg;
    m->payload = std::move(payload);
    if (charge) {
        m->charged_lane = &l;
        m->charged = charge;
        l.rma_answer_bytes += charge;
    }
    MsgHeader h;
    h.kind = kind;
    h.context_id = ctx;
    h.source_ctx = l.id;
    h.tag = tag;
    h.instance = instance_;
    h.seq = e->tx_seq++;
    h.stream = e->stream_id();
    encode_msg_header(h, m->header);
    ucp_request_param_t p = eager_send(&control_sent_cb, m);
    ucs_status_ptr_t r = ucp_am_send_nbx(e->h, kAmId, m->header, kMsgHeaderSize, m->payload.data(),
                                         m->payload.size(), &p);
    if (UCS_PTR_IS_PTR(r)) return;  // control_sent_cb frees it
    if (UCS_PTR_IS_ERR(r))
        TALARIA_LOG(ucx, debug, "{}: control message {} to {} failed: {}", scheme_, int(kind),
                    ucx_addr(e->peer)->str, ucs_status_string(UCS_PTR_STATUS(r)));
    m->uncharge();
    delete m;
}

Result<Ep*> UcxTransport::any_ep_locked(Lane& l, UcxAddr* pa) {
    for (Ep& e : l.eps)
        if (!e.failed && !e.closing && ucx_addr(e.peer) == pa) return &e;
    if (pa == self_.as<UcxAddr>()) return ep_to_locked(l, pa, l.id, l.worker_addr);
    int lane = -1;
    std::vector<std::byte> worker;
    {
        std::lock_guard g(pa->dmu);
        // The context it last introduced itself from is one it drives now (put/get emulated
        // by UCX over active messages need the target's worker to progress).
        for (const auto& w : pa->dir) {
            if (lane < 0 || w.ctx == pa->last_heard) {
                lane = w.lane;
                worker = w.worker;
            }
        }
    }
    if (lane >= 0) return ep_to_locked(l, pa, uint8_t(lane), worker);
    return ep_to_locked(l, pa, 0, {});
}

Result<Ep*> UcxTransport::ep_to_context_locked(Lane& l, UcxAddr* pa, uint8_t ctx) {
    if (pa == self_.as<UcxAddr>()) {
        Lane* t = lane_at(ctx);
        return ep_to_locked(l, pa, ctx, t ? t->worker_addr : lane_at(0)->worker_addr);
    }
    auto [lane, worker] = where(pa, ctx, false);
    if (lane >= 0) return ep_to_locked(l, pa, uint8_t(lane), worker);
    return ep_to_locked(l, pa, 0, {});
}

void UcxTransport::send_locate_locked(Lane& l, Ep* e, Route& r) {
    r.since = Clock::now();
    ++r.tries;
    std::vector<std::byte> payload(kLocateSize, std::byte(r.unexpected ? 0 : 1));
    send_control_locked(l, e, MsgKind::locate, r.ctx, r.token, std::move(payload));
}

Result<Route*> UcxTransport::route_locked(Lane& l, UcxAddr* pa, uint8_t ctx, bool unexpected) {
    RouteKey key{pa, ctx, unexpected};
    if (auto it = l.routes.find(key); it != l.routes.end()) return &it->second;
    // Where that context is served: ours (a send to ourselves) we know; a peer's from its
    // hellos and answers; its context 0 is where its address leads.
    int lane = -1;
    std::vector<std::byte> worker;
    if (pa == self_.as<UcxAddr>()) {
        lane = serving_lane(ctx, unexpected);
        worker = lane_at(uint8_t(lane))->worker_addr;
    } else {
        std::tie(lane, worker) = where(pa, ctx, unexpected);
    }
    Ep* ep = nullptr;
    Ep* ask = nullptr;
    if (lane >= 0) {
        TALARIA_TRY(e, ep_to_locked(l, pa, uint8_t(lane), worker));
        ep = e;
    } else if (ctx == 0 && !pa->anonymous && (!unexpected || where(pa, 0, false).first < 0)) {
        // Its context 0 is where its address leads (unless its hello said that context takes
        // no unexpected messages: then ask where they go).
        TALARIA_TRY(e, ep_to_locked(l, pa, 0, {}));
        ep = e;
    } else {
        // Ask it which of its workers serves `ctx` (any context of it answers); the sends
        // wait on the route until the answer comes (on_located_locked).
        TALARIA_TRY(e, any_ep_locked(l, pa));
        ask = e;
    }
    auto [it, inserted] = l.routes.try_emplace(key);
    Route& r = it->second;
    r.peer = Addr(pa);
    r.ctx = ctx;
    r.unexpected = unexpected;
    r.ep = ep;
    if (ask) {
        // Not guessable from outside: a located answer is matched by it, and the salt never
        // goes on the wire (the instance does).
        r.token =
            uint32_t(mix64(token_salt_ ^ instance_ ^ (uint64_t(l.id) << 56) ^ ++l.next_token));
        if (r.token == 0) r.token = 1;
        ++l.locating;
        send_locate_locked(l, ask, r);
        TALARIA_LOG(ucx, debug, "context {}: where do {} messages for context {} of {} go?", l.id,
                    unexpected ? "unexpected" : "expected", ctx, pa->str);
    }
    return &r;
}

void UcxTransport::route_ready_locked(Lane& l, Route& r, Ep* e) {
    if (r.ep == nullptr && l.locating > 0) --l.locating;
    r.ep = e;
    while (UcxOp* op = r.waiting.pop_front()) {
        op->route = nullptr;
        op->state = OpState::idle;
        send_on_locked(l, e, op, op->buf, op->cap);
    }
}

void UcxTransport::route_failed_locked(Lane& l, RouteKey key, Errc st, const std::string& why) {
    auto it = l.routes.find(key);
    if (it == l.routes.end()) return;
    Route& r = it->second;
    TALARIA_LOG(ucx, debug, "context {}: {}", l.id, why);
    if (r.ep == nullptr && l.locating > 0) --l.locating;
    while (UcxOp* op = r.waiting.pop_front()) {
        op->route = nullptr;
        op->state = OpState::idle;
        complete_op(op, st);
    }
    if (l.last_route == &r) l.last_route = nullptr;
    l.routes.erase(it);
}

void UcxTransport::resolve_routes_locked(Lane& l, UcxAddr* pa) {
    if (l.locating == 0) return;
    std::vector<RouteKey> done;
    for (auto& [key, r] : l.routes) {
        if (r.ep || std::get<0>(key) != pa) continue;
        auto [lane, worker] = where(pa, r.ctx, r.unexpected);
        if (lane < 0) continue;
        auto e = ep_to_locked(l, pa, uint8_t(lane), worker);
        if (!e) {
            done.push_back(key);
            continue;
        }
        route_ready_locked(l, r, *e);
    }
    for (const RouteKey& k : done)
        route_failed_locked(l, k, Errc::unreachable,
                            fmt::format("no endpoint to the context of {} that serves context {}",
                                        pa->str, std::get<1>(k)));
}

void UcxTransport::check_locates_locked(Lane& l) {
    auto now = Clock::now();
    std::vector<RouteKey> expired;
    for (auto& [key, r] : l.routes) {
        if (r.ep || now - r.since < kLocateRetry) continue;
        UcxAddr* pa = ucx_addr(r.peer);
        if (r.tries >= kLocateTries) {
            expired.push_back(key);
            continue;
        }
        // Again, to its context 0 this time where its address reaches it (the endpoint asked
        // first may lead to a context nobody progresses).
        auto e = pa->anonymous ? any_ep_locked(l, pa) : ep_to_locked(l, pa, 0, {});
        if (e)
            send_locate_locked(l, *e, r);
        else
            expired.push_back(key);
    }
    for (const RouteKey& k : expired)
        route_failed_locked(
            l, k, Errc::unreachable,
            fmt::format(
                "{} did not say where its context {} is served ({} locates, {} ms apart; its "
                "context 0 "
                "answers them: is it created and progressed?)",
                std::get<0>(k)->str, std::get<1>(k), kLocateTries,
                std::chrono::duration_cast<std::chrono::milliseconds>(kLocateRetry).count()));
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
    Lane& l = lane_of(ctx);
    UcxAddr* pa = ucx_addr(dest);
    std::lock_guard g(l.mu);
    if (pa->dead.load(std::memory_order_acquire)) [[unlikely]] {
        std::string why;
        Errc st = dead_status(pa, why);
        return fail_async(l, ctx, std::move(cb), type, st, why);
    }
    Route* r = l.last_route;
    if (r == nullptr || ucx_addr(r->peer) != pa || r->ctx != dest_ctx || r->unexpected == expected)
        [[unlikely]] {
        auto rr = route_locked(l, pa, dest_ctx, !expected);
        if (!rr) return fail_async(l, ctx, std::move(cb), type, rr.code(), rr.error().message());
        r = *rr;
        l.last_route = r;
    }
    UcxOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->lane = &l;
    op->hdr.kind = expected ? MsgKind::expected : MsgKind::unexpected;
    op->hdr.context_id = dest_ctx;
    op->hdr.source_ctx = l.id;
    op->hdr.tag = tag;
    op->hdr.instance = instance_;
    op->completion.size = len;
    OpId id = op->id();
    if (r->ep) [[likely]] {
        send_on_locked(l, r->ep, op, buf.data(), len);
    } else {
        // Its route waits for the answer to a locate: the buffer is the caller's until the
        // completion, so it waits with the op.
        op->state = OpState::routing;
        op->route = r;
        op->buf = const_cast<std::byte*>(buf.data());
        op->cap = len;
        r->waiting.push_back(*op);
    }
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
    Lane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    UcxOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->lane = &l;
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (UcxMsg* m = l.match.post_unexpected(ctx.id(), op)) {
        l.match.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
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
    Lane& l = lane_of(ctx);
    UcxAddr* pa = ucx_addr(source);
    std::lock_guard g(l.mu);
    UcxOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->lane = &l;
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (UcxMsg* m = l.match.post_expected(op, source, tag)) {
        l.match.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
        return id;
    }
    if (pa->dead.load(std::memory_order_acquire)) {
        l.match.withdraw(op);
        std::string why;
        complete_recv(op, source, 0, tag, 0, dead_status(pa, why));
        return id;
    }
    // An endpoint of this lane to the source watches it: if it dies, UCX tells us and this
    // receive fails with disconnected instead of waiting forever.
    if (pa != self_.as<UcxAddr>()) {
        Route* r = l.last_route;
        if (r == nullptr || ucx_addr(r->peer) != pa || r->ep == nullptr) {
            if (auto e = any_ep_locked(l, pa); !e)
                TALARIA_LOG(ucx, debug, "context {}: cannot watch {}: {}", l.id, pa->str,
                            e.error().describe());
        }
    }
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
    Lane& l = lane_of(ctx);
    UcxAddr* target = ucx_addr(remote_addr);

    std::lock_guard g(l.mu);
    // What the handle says is checked here first. A served region's target checks again
    // (served RMA); elsewhere the NIC checks the remote key (rc, dc), or nobody does (ucx+sm,
    // same user: docs/architecture.md "Trust model").
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
                                      ucx_addr(owner)->str, target->str));
    if (target->dead.load(std::memory_order_acquire)) {
        std::string why;
        Errc st = dead_status(target, why);
        return fail_async(l, ctx, std::move(cb), type, st, why);
    }
    auto e = any_ep_locked(l, target);
    if (!e) return fail_async(l, ctx, std::move(cb), type, e.code(), e.error().message());
    Ep* ep = *e;
    if (len == 0) return fail_async(l, ctx, std::move(cb), type, Errc::ok, {});
    if (rm->key != 0)
        return post_served_locked(l, ctx, std::move(cb), type,
                                  reinterpret_cast<std::byte*>(local->base()) + local_off, *rm,
                                  remote_off, len, target);
    if (served_rma_)
        return fail_async(l, ctx, std::move(cb), type, Errc::not_supported,
                          fmt::format("{} {}: the remote handle carries a UCX remote key, but "
                                      "this transport serves put/get itself and has UCP's RMA "
                                      "off; both sides must use the same ucx+<transports>",
                                      scheme_, what));
    if (uint32_t pid = rm->local() ? pid_ : rm->pid; pid != 0) {
        // ucx+sm, same pid namespace: copy now, as UCX's cma would (see init_direct_rma).
        UcxOp* op = l.ops.acquire(ctx, std::move(cb), type);
        if (!op) return ops_exhausted(fmt::format("{} {}", scheme_, what), opts_.max_ops);
        op->lane = &l;
        OpId id = op->id();
        std::string why;
        Errc st = copy_direct(is_put, pid, reinterpret_cast<std::byte*>(local->base()) + local_off,
                              rm->base() + remote_off, len, why);
        if (st != Errc::ok) {
            TALARIA_LOG(ucx, debug, "{} {} to {} failed: {}", scheme_, what, target->str, why);
            op->completion.size = 0;
        } else {
            op->completion.size = len;
        }
        complete_op(op, st);
        return id;
    }
    // The remote key, unpacked once per endpoint (on this lane's worker).
    ucp_rkey_h rk = nullptr;
    {
        std::lock_guard gk(rm->rk_mu);
        for (const RkeyOnEp& k : rm->rkeys)
            if (k.lane == &l && k.ep_serial == ep->serial) rk = k.h;
    }
    if (!rk) {
        ucs_status_t st = ucp_ep_rkey_unpack(ep->h, rm->rkey.data(), &rk);
        if (st != UCS_OK)
            return fail_async(l, ctx, std::move(cb), type, Errc::invalid_argument,
                              fmt::format("ucp_ep_rkey_unpack of the remote handle's key failed: "
                                          "{}",
                                          ucs_status_string(st)));
        std::lock_guard gk(rm->rk_mu);
        // Keys this lane unpacked for endpoints since closed go now (under this lane's lock).
        std::erase_if(rm->rkeys, [&](const RkeyOnEp& k) {
            if (k.lane != &l) return false;
            ucp_rkey_destroy(k.h);
            return true;
        });
        rm->rkeys.push_back({&l, ep->serial, rk});
    }
    UcxOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(fmt::format("{} {}", scheme_, what), opts_.max_ops);
    op->lane = &l;
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
        ucs_status_ptr_t r = ucp_put_nbx(ep->h, lptr, len, raddr, rk, &p);
        if (UCS_PTR_IS_ERR(r)) {
            track_locked(l, op, r, "ucp_put_nbx");
            return id;
        }
        if (r) ucp_request_free(r);  // released by UCX when it completes
        ucp_request_param_t f;
        f.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        f.cb.send = &op_done_cb;
        f.user_data = op;
        track_locked(l, op, ucp_ep_flush_nbx(ep->h, &f), "ucp_ep_flush_nbx");
    } else {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = &op_done_cb;
        p.user_data = op;
        track_locked(l, op, ucp_get_nbx(ep->h, lptr, len, raddr, rk, &p), "ucp_get_nbx");
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

// --- served put/get -----------------------------------------------------------------------------
//
// The origin cuts a transfer into kRmaChunk requests, kRmaWindow in flight; each names the
// registration's key and the target address, and the target checks both against what it
// registered before it copies a byte (under regions_mu_, so a deregistered region is never
// touched again). Answers carry the request's cookie: (generation << 32) | (index << 4) | slot.

namespace {
uint64_t rma_cookie(const RmaXfer& x, const RmaSlot& s) noexcept {
    return (uint64_t(x.gen) << 32) | (uint64_t(x.index) << 4) | s.index;
}
}  // namespace

Result<OpId> UcxTransport::post_served_locked(Lane& l, Context& ctx, Callback&& cb, OpType type,
                                              std::byte* local, const UcxMem& remote,
                                              std::size_t remote_off, std::size_t len,
                                              UcxAddr* target) {
    static_assert(kRmaWindow <= 16, "the cookie has 4 bits for the slot");
    if (l.free_xfers.empty() && l.xfers.size() >= (std::size_t{1} << 28))
        return fail_async(l, ctx, std::move(cb), type, Errc::again,
                          "too many served put/get in flight on this context");
    UcxOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op)
        return ops_exhausted(
            fmt::format("{} {}", scheme_, type == OpType::put ? "post_put" : "post_get"),
            opts_.max_ops);
    op->lane = &l;
    op->completion.size = len;
    RmaXfer* x;
    if (!l.free_xfers.empty()) {
        x = l.xfers[l.free_xfers.back()].get();
        l.free_xfers.pop_back();
    } else {
        auto fresh = std::make_unique<RmaXfer>();
        fresh->lane = &l;
        fresh->index = uint32_t(l.xfers.size());
        // Unpredictable: an answer must name its request's generation to count.
        uint32_t g = 0;
        if (::getrandom(&g, sizeof g, 0) != ssize_t(sizeof g))
            g = uint32_t(mix64(uint64_t(now_ns()) ^ fresh->index));
        fresh->gen = g;
        for (std::size_t i = 0; i < kRmaWindow; ++i) {
            fresh->slots[i].x = fresh.get();
            fresh->slots[i].index = uint8_t(i);
        }
        x = fresh.get();
        l.xfers.push_back(std::move(fresh));
    }
    x->op = op;
    x->peer = Addr(target);
    x->put = type == OpType::put;
    x->key = remote.key;
    x->address = remote.base() + remote_off;
    x->local = local;
    x->length = len;
    x->next = x->done = 0;
    x->status = Errc::ok;
    x->why.clear();
    op->xfer = x;
    op->state = OpState::served;
    ++l.xfers_active;
    OpId id = op->id();
    rma_pump_locked(l, *x);
    return id;
}

void UcxTransport::rma_pump_locked(Lane& l, RmaXfer& x) {
    if (x.status != Errc::ok || x.next >= x.length) return;
    UcxAddr* pa = ucx_addr(x.peer);
    auto e = any_ep_locked(l, pa);
    if (!e) {
        rma_fail_locked(l, x, e.code(), e.error().describe());
        return;
    }
    // One request until the peer answered one on this endpoint (Ep::rma_answered).
    std::size_t busy = 0;
    for (const RmaSlot& s : x.slots)
        busy += s.used || s.in_ucx;
    const std::size_t window = (*e)->rma_answered ? kRmaWindow : 1;
    for (RmaSlot& s : x.slots) {
        if (x.status != Errc::ok || x.next >= x.length || busy >= window) return;
        if (s.used || s.in_ucx) continue;
        s.offset = x.next;
        s.length = uint32_t(std::min(kRmaChunk, x.length - x.next));
        s.tries = 0;
        x.next += s.length;
        ++busy;
        if (!rma_send_locked(l, x, s, *e)) return;
    }
}

bool UcxTransport::rma_send_locked(Lane& l, RmaXfer& x, RmaSlot& s, Ep* ep) {
    UcxAddr* pa = ucx_addr(x.peer);
    if (pa->dead.load(std::memory_order_acquire)) {
        std::string why;
        Errc st = dead_status(pa, why);
        rma_fail_locked(l, x, st, why);
        return false;
    }
    if (ep == nullptr) {
        auto e = any_ep_locked(l, pa);
        if (!e) {
            rma_fail_locked(l, x, e.code(), e.error().describe());
            return false;
        }
        ep = *e;
    }
    x.ep_serial = ep->serial;
    MsgHeader h;
    h.kind = x.put ? MsgKind::rma_put : MsgKind::rma_get;
    h.context_id = ep->peer_lane;
    h.source_ctx = l.id;
    h.instance = instance_;
    h.seq = ep->tx_seq++;
    h.stream = ep->stream_id();
    encode_msg_header(h, s.header);
    RmaHeader r;
    r.key = x.key;
    r.address = x.address + s.offset;
    r.cookie = rma_cookie(x, s);
    r.length = s.length;
    encode_rma_header(r, s.rma);
    s.iov[0] = {s.rma, kRmaHeaderSize};
    s.iov[1] = {x.local + s.offset, x.put ? s.length : 0};
    ucp_request_param_t p = eager_send(&rma_sent_cb, &s);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    s.used = true;
    ucs_status_ptr_t q =
        ucp_am_send_nbx(ep->h, kAmId, s.header, kMsgHeaderSize, s.iov, x.put ? 2 : 1, &p);
    if (UCS_PTR_IS_PTR(q)) {
        s.in_ucx = true;
        ++x.in_ucx;
    } else if (UCS_PTR_IS_ERR(q)) {
        s.used = false;
        rma_fail_locked(
            l, x, errc_of(UCS_PTR_STATUS(q)),
            fmt::format("ucp_am_send_nbx of a {} request to {} failed: {}", x.put ? "put" : "get",
                        pa->str, ucs_status_string(UCS_PTR_STATUS(q))));
        return false;
    }
    return true;
}

void UcxTransport::on_rma_sent(RmaXfer& x, RmaSlot& s, ucs_status_t st) {
    Lane& l = *x.lane;
    if (x.op == nullptr) return;  // finished already (cannot happen while in_ucx counted it)
    if (st != UCS_OK && s.used) {
        // Not sent (failed, or canceled by a forced close of its endpoint): no answer will
        // come, and its bytes are not moved.
        s.used = false;
        rma_fail_locked(l, x, st == UCS_ERR_CANCELED ? Errc::disconnected : errc_of(st),
                        fmt::format("a {} request to {} failed in UCX: {}", x.put ? "put" : "get",
                                    ucx_addr(x.peer)->str, ucs_status_string(st)));
        return;
    }
    rma_settle_locked(l, x);
}

void UcxTransport::rma_fail_locked(Lane& l, RmaXfer& x, Errc st, std::string why) {
    if (x.status == Errc::ok) {
        x.status = st == Errc::ok ? Errc::internal : st;
        x.why = std::move(why);
    }
    rma_settle_locked(l, x);
}

void UcxTransport::rma_settle_locked(Lane& l, RmaXfer& x) {
    if (x.op == nullptr) return;
    if (x.status != Errc::ok) {
        // Whatever is still answered is dropped (its cookie goes stale); only UCX's hold on
        // the local buffer is waited for.
        if (x.in_ucx == 0) rma_finish_locked(l, x);
        return;
    }
    if (x.done == x.length) {
        if (x.in_ucx == 0) rma_finish_locked(l, x);
        return;
    }
    rma_pump_locked(l, x);
}

void UcxTransport::rma_finish_locked(Lane& l, RmaXfer& x) {
    UcxOp* op = x.op;
    x.op = nullptr;
    ++x.gen;
    for (RmaSlot& s : x.slots) {
        if (s.retry) --l.rma_retrying;
        s.used = s.retry = false;
    }
    x.peer.reset();
    --l.xfers_active;
    l.free_xfers.push_back(x.index);
    op->xfer = nullptr;
    op->state = OpState::idle;
    if (closing_.load(std::memory_order_relaxed) || op->ctx == nullptr) {
        op->releaser->release(op);
        return;
    }
    if (x.status != Errc::ok) {
        op->completion.size = 0;
        if (x.status != Errc::canceled)
            TALARIA_LOG(ucx, debug, "{} {} failed: {}: {}", scheme_,
                        op_type_name(op->completion.type), errc_name(x.status), x.why);
    }
    complete_op(op, x.status);
}

void UcxTransport::rma_retry_locked(Lane& l) {
    const TimePoint now = Clock::now();
    for (auto& xp : l.xfers) {
        RmaXfer& x = *xp;
        if (x.op == nullptr) continue;
        for (RmaSlot& s : x.slots) {
            if (!s.retry || now < s.retry_at) continue;
            if (x.status == Errc::ok && s.in_ucx) {
                // Its first send is still UCX's (the answer overtook its completion): soon.
                s.retry_at = now + std::chrono::milliseconds(1);
                continue;
            }
            s.retry = false;
            s.used = false;
            --l.rma_retrying;
            if (x.status == Errc::ok) rma_send_locked(l, x, s);
        }
        rma_settle_locked(l, x);
        if (l.rma_retrying == 0) return;
    }
}

void UcxTransport::on_rma_request_locked(Lane& l, const MsgHeader& h, Stream& s,
                                         std::span<const std::byte> payload) {
    const bool put = h.kind == MsgKind::rma_put;
    std::optional<RmaHeader> r;
    std::string bad;
    std::span<const std::byte> data;
    if (payload.size() < kRmaHeaderSize) {
        bad = fmt::format("a {}-byte payload", payload.size());
    } else if (auto d = decode_rma_header(payload.first(kRmaHeaderSize), true); !d) {
        bad = d.error().describe();
    } else {
        data = payload.subspan(kRmaHeaderSize);
        if (data.size() != (put ? d->length : 0))
            bad = fmt::format("a {}-byte request carries {} bytes", d->length, data.size());
        else
            r = *d;
    }
    if (!r) {
        // Not from a peer speaking our protocol: nothing to answer (no cookie to trust).
        std::size_t unlogged = 0;
        if (l.match.log_refusal(&unlogged))
            TALARIA_LOG(ucx, warn, "{}: dropping a bad {} request from {}: {}{}", scheme_,
                        put ? "put" : "get", s.peer->str, bad, unlogged_note(unlogged));
        return;
    }
    Errc st = Errc::ok;
    std::vector<std::byte> out(kRmaHeaderSize);
    if (!put && l.rma_answer_bytes + r->length > kRmaAnswerBudget) {
        st = Errc::busy;  // the origin asks again shortly
    } else {
        std::lock_guard g(regions_mu_);
        auto it = regions_.find(r->key);
        if (it == regions_.end()) {
            st = Errc::invalid_argument;  // deregistered, or never ours
        } else {
            const UcxMem& m = *it->second;
            st = na::check_region(m.access(), m.base(), m.length(), put, r->address, r->length);
            if (st == Errc::ok && r->length > 0) {
                auto* at = reinterpret_cast<std::byte*>(uintptr_t(r->address));
                if (put)
                    std::memcpy(at, data.data(), r->length);
                else
                    out.insert(out.end(), at, at + r->length);
            }
        }
    }
    if (st != Errc::ok && st != Errc::busy) {
        std::size_t unlogged = 0;
        if (l.match.log_refusal(&unlogged))
            TALARIA_LOG(ucx, warn, "{}: refusing a {}-byte {} at {:#x} (key {:#x}) from {}: {}{}",
                        scheme_, r->length, put ? "put" : "get", r->address, r->key, s.peer->str,
                        errc_name(st), unlogged_note(unlogged));
    }
    RmaHeader a = *r;
    a.status = uint8_t(st);
    encode_rma_header(a, out.data());
    auto e = ep_to_context_locked(l, s.peer, h.source_ctx);
    if (!e) {
        TALARIA_LOG(ucx, debug, "{}: cannot answer a {} request of {}: {}", scheme_,
                    put ? "put" : "get", s.peer->str, e.error().describe());
        return;
    }
    const std::size_t bytes = out.size() - kRmaHeaderSize;
    send_control_locked(l, *e, put ? MsgKind::rma_ack : MsgKind::rma_data, h.source_ctx, 0,
                        std::move(out), bytes);
}

void UcxTransport::on_rma_answer_locked(Lane& l, const MsgHeader& h, Stream& s,
                                        std::span<const std::byte> payload) {
    const bool ack = h.kind == MsgKind::rma_ack;
    if (payload.size() < kRmaHeaderSize) return;
    auto r = decode_rma_header(payload.first(kRmaHeaderSize), false);
    if (!r) return;
    auto data = payload.subspan(kRmaHeaderSize);
    const uint64_t index = (r->cookie >> 4) & 0x0fffffffu;
    const uint64_t slot = r->cookie & 0xf;
    if (index >= l.xfers.size() || slot >= kRmaWindow) return;
    RmaXfer& x = *l.xfers[index];
    RmaSlot& sl = x.slots[slot];
    // Only the answer its request waits for counts: the cookie names the transfer's current
    // generation (random), and address and length are the request's. (The peer may answer
    // under another name than the one the caller used, e.g. a wildcard listener's.)
    if (!x.op || uint32_t(r->cookie >> 32) != x.gen || !sl.used || sl.retry || x.put != ack ||
        r->address != x.address + sl.offset || r->length != sl.length)
        return;
    for (Ep& e : l.eps)
        if (e.serial == x.ep_serial) e.rma_answered = true;
    const auto st = Errc(r->status);
    if (st == Errc::busy && !x.put && x.status == Errc::ok) {
        note(LinkEvent::backpressure);  // its answers fill the target's queue: asked again
        sl.retry = true;
        sl.retry_at = Clock::now() + std::chrono::milliseconds(1 << std::min<int>(sl.tries, 6));
        if (sl.tries < 255) ++sl.tries;
        ++l.rma_retrying;
        return;
    }
    sl.used = false;
    if (st != Errc::ok) {
        rma_fail_locked(l, x, st,
                        fmt::format("{} refused a {}-byte {} at {:#x}: {}", s.peer->str, r->length,
                                    x.put ? "put" : "get", r->address, errc_name(st)));
        return;
    }
    if (!ack) {
        if (data.size() != sl.length) {
            rma_fail_locked(l, x, Errc::protocol_error,
                            fmt::format("{} answered a {}-byte get with {} bytes", s.peer->str,
                                        sl.length, data.size()));
            return;
        }
        if (x.status == Errc::ok && !data.empty())
            std::memcpy(x.local + sl.offset, data.data(), data.size());
    }
    x.done += sl.length;
    rma_settle_locked(l, x);
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
    Lane* l = nullptr;
    for (std::size_t i = 0; !l && i < opts_.max_contexts; ++i) {
        Lane* c = lane_at(uint8_t(i));
        if (c && c->ops.owns(id.op)) l = c;
    }
    if (!l)
        return Error(Errc::not_found, fmt::format("{} cancel: not an operation of this "
                                                  "transport",
                                                  scheme_));
    std::lock_guard g(l->mu);
    UcxOp* op = l->ops.lookup(id);
    if (!op)
        return Error(
            Errc::not_found,
            fmt::format("{} cancel: the operation already finished (stale OpId)", scheme_));
    switch (op->state) {
        case OpState::recv_posted:
            l->match.withdraw(op);
            op->state = OpState::idle;
            op->match_source.reset();
            complete_op(op, Errc::canceled);
            break;
        case OpState::routing:
            // Not handed to UCX yet: no sequence number is taken, so it can go.
            op->route->waiting.erase(*op);
            op->route = nullptr;
            op->state = OpState::idle;
            complete_op(op, Errc::canceled);
            break;
        case OpState::inflight:
            // A message is never withdrawn once handed to UCX (the receiver counts on every
            // sequence number arriving). put/get: UCX completes the request with
            // UCS_ERR_CANCELED if it can still stop it (the callback may run from inside this
            // call), otherwise normally.
            if (op->req &&
                (op->completion.type == OpType::put || op->completion.type == OpType::get))
                ucp_request_cancel(l->worker, op->req);
            break;
        case OpState::served:
            // Answers still on the way are dropped; it completes once UCX holds none of its
            // sends (they read the caller's buffer).
            rma_fail_locked(*l, *op->xfer, Errc::canceled, "canceled");
            break;
        case OpState::idle:
            break;
    }
    return ok();
}

// --- receiving ----------------------------------------------------------------------------------

void UcxTransport::deliver_locked(Lane& l, const MsgHeader& h, Stream& s, const std::byte* data,
                                  std::size_t len) {
    switch (h.kind) {
        case MsgKind::bye: {
            // The peer closes its transport. It says so on each of its endpoints, after its
            // last message there; messages on its other endpoints may still come, so it is gone
            // when every stream of it here has said bye (handled once progress returns: it
            // closes endpoints).
            s.bye = true;
            for (const auto& [key, o] : l.streams)
                if (o.peer == s.peer && !o.bye) return;
            l.byes.push_back(Addr(s.peer));
            return;
        }
        case MsgKind::locate:
            on_locate_locked(l, h, s, {data, len});
            return;
        case MsgKind::located:
            on_located_locked(l, h, s, {data, len});
            return;
        case MsgKind::rma_put:
        case MsgKind::rma_get:
            on_rma_request_locked(l, h, s, {data, len});
            return;
        case MsgKind::rma_ack:
        case MsgKind::rma_data:
            on_rma_answer_locked(l, h, s, {data, len});
            return;
        default:
            break;
    }
    const bool expected = h.kind == MsgKind::expected;
    bool no_context = false;
    if (UcxOp* op = l.match.match(expected, h.context_id, s.source, h.tag, &no_context)) {
        Errc st = copy_message(data, len, op->buf, op->cap);
        complete_recv(op, s.source, h.context_id, h.tag, len, st);
        return;
    }
    Queued q = l.match.queue_copy(expected, h.context_id, s.source, h.tag, {data, len},
                                  &s.peer->unexpected_bytes);
    std::size_t unlogged = 0;
    if (q != Queued::ok && l.match.log_refusal(&unlogged))
        TALARIA_LOG(ucx, warn,
                    "{}: dropping a {}-byte {} message (tag {}) from {} for context {} (on context "
                    "{}): {}{}",
                    scheme_, len, expected ? "expected" : "unexpected", h.tag, s.peer->str,
                    h.context_id, l.id, l.match.refusal(q), unlogged_note(unlogged));
}

void UcxTransport::on_locate_locked(Lane& l, const MsgHeader& h, Stream& s,
                                    std::span<const std::byte> payload) {
    auto kind = decode_locate(payload);
    if (!kind) {
        TALARIA_LOG(ucx, warn, "{}: dropping a bad locate from {}: {}", scheme_, s.peer->str,
                    kind.error().describe());
        return;
    }
    uint8_t w = serving_lane(h.context_id, *kind);
    Lane* wl = lane_at(w);
    std::vector<std::byte> out(located_size(wl->worker_addr.size()));
    Located loc;
    loc.lane = w;
    loc.unexpected = *kind;
    loc.worker = wl->worker_addr;
    encode_located(loc, out.data());
    // The answer goes to the asking context itself (its hello told us where its worker is),
    // not through a route of ours that may itself wait for a locate.
    auto e = ep_to_context_locked(l, s.peer, h.source_ctx);
    if (!e) {
        TALARIA_LOG(ucx, debug, "{}: cannot answer a locate from context {} of {}: {}", scheme_,
                    h.source_ctx, s.peer->str, e.error().describe());
        return;
    }
    send_control_locked(l, *e, MsgKind::located, h.context_id, h.tag, std::move(out));
}

void UcxTransport::on_located_locked(Lane& l, const MsgHeader& h, Stream& s,
                                     std::span<const std::byte> payload) {
    auto loc = decode_located(payload);
    if (!loc) {
        TALARIA_LOG(ucx, warn, "{}: dropping a bad located answer from {}: {}", scheme_,
                    s.peer->str, loc.error().describe());
        return;
    }
    // The route that asked (by its token: it may name the peer by another address than its
    // hello does, e.g. a wildcard listener looked up by its host's IP).
    Route* r = nullptr;
    for (auto& [key, x] : l.routes)
        if (!x.ep && x.token == h.tag && x.ctx == h.context_id && x.unexpected == loc->unexpected)
            r = &x;
    // An answer nobody asked for teaches nothing (a peer must not fill our directory).
    if (r == nullptr) return;
    for (UcxAddr* pa : {s.peer, ucx_addr(r->peer)}) {
        std::lock_guard g(pa->dmu);
        learn_locked(pa, h.context_id, loc->unexpected, loc->lane, loc->worker);
    }
    UcxAddr* pa = ucx_addr(r->peer);
    auto e = ep_to_locked(l, pa, loc->lane, loc->worker);
    if (!e) {
        route_failed_locked(l, RouteKey{pa, r->ctx, r->unexpected}, e.code(),
                            fmt::format("no endpoint to context {} of {}: {}", loc->lane, pa->str,
                                        e.error().describe()));
        return;
    }
    TALARIA_LOG(ucx, debug, "context {}: {} messages for context {} of {} go to its context {}",
                l.id, loc->unexpected ? "unexpected" : "expected", h.context_id, pa->str,
                loc->lane);
    route_ready_locked(l, *r, *e);
}

void UcxTransport::on_hello_locked(Lane& l, const MsgHeader& h,
                                   std::span<const std::byte> payload) {
    auto hello = decode_hello(payload, h.tag & kHelloSigned, h.tag & kHelloProcess);
    if (!hello) {
        TALARIA_LOG(ucx, warn, "{}: dropping a bad hello: {}", scheme_, hello.error().describe());
        return;
    }
    if (opts_.auth.enabled()) {
        // Only a peer that proved the secret (at our bootstrap port, or at its own) holds a
        // session to sign with: an unsigned or badly signed hello starts no stream, so nothing
        // its sender sends reaches a context.
        if (auto ok = check_hello(h, *hello); !ok) {
            note(LinkEvent::connect_failed);  // a peer's endpoint to us, refused
            std::size_t unlogged = 0;
            if (l.match.log_refusal(&unlogged))
                TALARIA_LOG(ucx, warn, "{}: context {} drops a hello from instance {:016x}: {}{}",
                            scheme_, l.id, h.instance, ok.error().message(),
                            unlogged_note(unlogged));
            return;
        }
    }
    std::string_view str = hello->address;
    Addr peer;
    auto p = str.find("://");
    std::string_view key = p == std::string_view::npos ? str : str.substr(p + 3);
    {
        std::lock_guard gi(intern_mu_);
        if (spec_.mode == Mode::sockaddr && key.starts_with('~')) {
            // A client that does not listen: known by its instance id, reached at the workers
            // its hellos name.
            if (key.size() != 17 || !is_hex(key.substr(1, 16)) ||
                key.substr(1) != fmt::format("{:016x}", h.instance)) {
                TALARIA_LOG(ucx, warn, "{}: dropping a hello with a bad client name", scheme_);
                return;
            }
            peer = intern_locked(std::string(key), true);
        } else {
            auto r = lookup_locked(str, true);
            if (!r) {
                TALARIA_LOG(ucx, warn, "{}: dropping a hello naming an invalid address: {}",
                            scheme_, r.error().describe());
                return;
            }
            peer = *r;
        }
    }
    UcxAddr* pa = ucx_addr(peer);
    uint64_t before = pa->instance.exchange(h.instance, std::memory_order_relaxed);
    if (before != 0 && before != h.instance) {
        // A new process under a known name: what this lane held from the old one goes.
        std::erase_if(l.streams, [&](const auto& kv) { return kv.first.first == before; });
        drop_held_locked(l, before);
    }
    if (l.streams.size() >= kMaxStreams && !l.streams.contains({h.instance, h.stream})) {
        TALARIA_LOG(ucx, warn,
                    "{}: dropping a hello: context {} receives {} streams already, the most kept",
                    scheme_, l.id, l.streams.size());
        return;
    }
    if (hello->pidns != 0 && hello->pidns == hello_pidns_ && pa != self_.as<UcxAddr>() &&
        hello->pid != hello_pid_) {
        pa->pid.store(hello->pid, std::memory_order_relaxed);
        watching_pids_.store(true, std::memory_order_release);
    }
    {
        std::lock_guard g(pa->dmu);
        pa->last_heard = h.source_ctx;
        learn_locked(pa, h.source_ctx, false, h.source_ctx, hello->worker);
        if (h.tag & kHelloTakesUnexpected)
            learn_locked(pa, h.source_ctx, true, h.source_ctx, hello->worker);
    }
    // The stream of the endpoint it came on: its hello starts it.
    Stream& s = l.streams[{h.instance, h.stream}];
    if (s.peer != pa) {
        s.peer = pa;
        s.source = alias_of(this, peer);
    }
    s.source_ctx = h.source_ctx;
    s.rx_next = 0;
    s.bye = false;
    l.last_stream = nullptr;
    // Our endpoint to the context that said hello is up: a link we opened came up (its answer
    // to our hello). Else the hello opens one: that context made an endpoint to us.
    bool ours = false;
    for (Ep& e : l.eps)
        if (!e.closing && !e.failed && ucx_addr(e.peer) == pa && e.peer_lane == h.source_ctx) {
            ours = ours || !e.established;
            e.established = true;
        }
    if (pa != self_.as<UcxAddr>()) note(ours ? LinkEvent::connected : LinkEvent::accepted);
    // Connect back at once (unless we have an endpoint to that context), so that replies need no
    // connection set-up and a dead peer is noticed (by the endpoint's keepalive) while we
    // wait for it.
    if (pa != self_.as<UcxAddr>() && !pa->dead.load(std::memory_order_acquire)) {
        if (auto r = route_locked(l, pa, h.source_ctx, false); !r)
            TALARIA_LOG(ucx, debug, "connecting back to context {} of {} failed: {}", h.source_ctx,
                        pa->str, r.error().describe());
        resolve_routes_locked(l, pa);
    }
    TALARIA_LOG(ucx, debug, "context {}: hello from context {} of {} (instance {:016x})", l.id,
                h.source_ctx, pa->str, h.instance);
    // Messages it sent that overtook the hello.
    if (l.held_count > 0) release_held_locked(l);
}

void UcxTransport::hold_locked(Lane& l, const MsgHeader& h, std::span<const std::byte> data) {
    if (l.held_count >= kMaxHeldMsgs || l.held_bytes + data.size() > kMaxHeldBytes) {
        TALARIA_LOG(ucx, warn,
                    "{}: dropping a message from instance {:016x}: {} undeliverable messages "
                    "({} bytes) held already on context {} (no hello from their senders, or gaps "
                    "in their streams)",
                    scheme_, h.instance, l.held_count, l.held_bytes, l.id);
        return;
    }
    UcxMsg* m = l.match.msg_alloc();
    m->data.assign(data.begin(), data.end());
    m->tag = h.tag;
    m->context_id = h.context_id;
    m->kind = h.kind;
    m->expected = h.kind == MsgKind::expected;
    m->source_ctx = h.source_ctx;
    m->stream = h.stream;
    m->instance = h.instance;
    m->seq = h.seq;
    l.held.push_back(*m);
    ++l.held_count;
    l.held_bytes += m->data.size();
}

void UcxTransport::sequence_locked(Lane& l, const MsgHeader& h, Stream& s,
                                   std::span<const std::byte> data) {
    if (h.seq != s.rx_next) {
        if (int32_t(h.seq - s.rx_next) < 0) {
            TALARIA_LOG(ucx, warn, "{}: dropping a duplicate message #{} from {}", scheme_, h.seq,
                        s.peer->str);
            return;
        }
        hold_locked(l, h, data);
        return;
    }
    ++s.rx_next;
    deliver_locked(l, h, s, data.data(), data.size());
    if (l.held_count > 0) release_held_locked(l);
}

void UcxTransport::unhold_locked(Lane& l, UcxMsg& m) noexcept {
    l.held.erase(m);
    --l.held_count;
    l.held_bytes -= m.data.size();
    l.match.msg_free(&m);
}

void UcxTransport::drop_held_locked(Lane& l, uint64_t instance) noexcept {
    if (l.held_count == 0) return;
    l.held.for_each_safe([&](UcxMsg& m) {
        if (m.instance == instance) unhold_locked(l, m);
    });
}

void UcxTransport::release_held_locked(Lane& l) {
    // Rare (connection set-up, a hello overtaken), and bounded by kMaxHeldMsgs: rescan until
    // nothing more is deliverable.
    for (bool progress = true; progress && l.held_count > 0;) {
        progress = false;
        l.held.for_each_safe([&](UcxMsg& m) {
            auto it = l.streams.find({m.instance, m.stream});
            if (it == l.streams.end()) return;
            Stream& s = it->second;
            if (m.seq != s.rx_next) {
                if (int32_t(m.seq - s.rx_next) < 0) unhold_locked(l, m);  // a duplicate
                return;
            }
            l.held.erase(m);
            --l.held_count;
            l.held_bytes -= m.data.size();
            ++s.rx_next;
            MsgHeader mh;
            mh.kind = m.kind;
            mh.context_id = m.context_id;
            mh.source_ctx = m.source_ctx;
            mh.stream = m.stream;
            mh.tag = m.tag;
            mh.instance = m.instance;
            mh.seq = m.seq;
            deliver_locked(l, mh, s, m.data.data(), m.data.size());
            l.match.msg_free(&m);
            progress = true;
        });
    }
}

ucs_status_t UcxTransport::on_am(Lane& l, const void* header, std::size_t header_len, void* data,
                                 std::size_t len, const ucp_am_recv_param_t* param) {
    // From ucp_worker_progress of lane `l`, under its lock. Every byte here comes from a peer.
    if (closing_.load(std::memory_order_relaxed)) return UCS_OK;
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
        on_hello_locked(l, *h, payload);
        return UCS_OK;
    }
    if (const std::size_t limit =
            is_rma_kind(h->kind) ? kRmaHeaderSize + kRmaChunk : kMaxMessageSize;
        len > limit) {
        TALARIA_LOG(ucx, warn, "{}: dropping a {}-byte message (limit {})", scheme_, len, limit);
        return UCS_OK;
    }
    // The last sender's stream, cached, spares the map lookup on a busy stream.
    Stream* s = l.last_stream;
    if (s == nullptr || l.last_instance != h->instance || l.last_stream_id != h->stream)
        [[unlikely]] {
        auto it = l.streams.find({h->instance, h->stream});
        if (it == l.streams.end()) {
            // Its hello has not come yet. With Options::auth only a peer holding a session with
            // us will ever say one that starts a stream: what others send is dropped at once
            // rather than held, where it would crowd out messages that overtook a good hello.
            if (opts_.auth.enabled() && !find_session(h->instance)) {
                std::size_t unlogged = 0;
                if (l.match.log_refusal(&unlogged))
                    TALARIA_LOG(ucx, warn,
                                "{}: context {} drops a message from instance {:016x}, which "
                                "holds no authenticated session here{}",
                                scheme_, l.id, h->instance, unlogged_note(unlogged));
                return UCS_OK;
            }
            hold_locked(l, *h, payload);
            return UCS_OK;
        }
        s = &it->second;
        l.last_stream = s;
        l.last_instance = h->instance;
        l.last_stream_id = h->stream;
    }
    sequence_locked(l, *h, *s, payload);
    return UCS_OK;
}

// --- endpoint failure ---------------------------------------------------------------------------

void UcxTransport::on_ep_error(Ep* e, ucs_status_t status) {
    // From ucp_worker_progress of its lane, under its lock. UCX forbids closing the endpoint
    // from here; it is closed (forced) once progress returns.
    if (e->failed || e->closing) return;
    e->failed = true;
    e->fail_status = status;
    e->lane->failed.push_back(e);
}

void UcxTransport::peer_gone_locked(Lane& l, UcxAddr* pa, Errc st, const std::string& why,
                                    bool by_bye) {
    Addr keep(pa);  // the routes and streams dropped below may hold the last references
    bool first = false;
    {
        std::lock_guard g(pa->dmu);
        if (!pa->dead.load(std::memory_order_relaxed)) {
            pa->dead_status = st;
            pa->dead_why = why;
            pa->dead_by_bye = by_bye;
            pa->dead.store(true, std::memory_order_release);
            first = true;
        }
    }
    if (first) {
        TALARIA_LOG(ucx, debug, "{}", why);
        // A later lookup makes a fresh address (a new process may come to live there).
        addrs_.unlink(pa->key, pa);
        // The other lanes fail what waits for it there at their next progress (sweep_dead),
        // woken for it.
        deaths_.fetch_add(1, std::memory_order_release);
        for (std::size_t i = 0; i < opts_.max_contexts; ++i)
            if (Lane* o = lane_at(uint8_t(i)); o && o != &l) (void)ucp_worker_signal(o->worker);
    }
    std::string dwhy;
    Errc dst = dead_status(pa, dwhy);
    l.last_route = nullptr;
    l.last_stream = nullptr;
    drop_held_locked(l, pa->instance.load(std::memory_order_relaxed));
    std::erase_if(l.streams, [&](const auto& kv) { return kv.second.peer == pa; });
    l.match.take_expected_from(
        keep, [&](UcxOp* op) { complete_recv(op, keep, 0, op->match_tag, 0, dst); });
    for (auto it = l.routes.begin(); it != l.routes.end();) {
        if (std::get<0>(it->first) != pa) {
            ++it;
            continue;
        }
        if (it->second.ep == nullptr && l.locating > 0) --l.locating;
        while (UcxOp* op = it->second.waiting.pop_front()) {
            op->route = nullptr;
            op->state = OpState::idle;
            complete_op(op, dst);
        }
        it = l.routes.erase(it);
    }
    // Its served put/get: answers will not come.
    if (l.xfers_active > 0)
        for (auto& xp : l.xfers)
            if (xp->op && ucx_addr(xp->peer) == pa) rma_fail_locked(l, *xp, dst, dwhy);
    // Every endpoint of this lane to it: forced closes fail the UCX requests still pending.
    // Each was a link that went down with it, or an attempt it never answered (no hello back).
    l.eps.for_each_safe([&](Ep& o) {
        if (!o.peer || ucx_addr(o.peer) != pa) return;
        if (!o.closing) note(o.established ? LinkEvent::lost : LinkEvent::connect_failed);
        close_ep_locked(l, &o);
    });
}

void UcxTransport::handle_failures_locked(Lane& l) {
    std::vector<Ep*> failed;
    failed.swap(l.failed);
    UcxAddr* self = self_.as<UcxAddr>();
    for (Ep* e : failed) {
        if (e->closing) continue;
        if (e->peer && ucx_addr(e->peer) != self) {
            Errc st = errc_of(e->fail_status);
            if (st == Errc::ok || st == Errc::canceled) st = Errc::disconnected;
            UcxAddr* pa = ucx_addr(e->peer);
            peer_gone_locked(l, pa, st,
                             fmt::format("{}: the endpoint to {} failed: {}", scheme_, pa->str,
                                         ucs_status_string(e->fail_status)));
        }
        close_ep_locked(l, e);
    }
    std::vector<Addr> byes;
    byes.swap(l.byes);
    for (const Addr& peer : byes)
        if (ucx_addr(peer) != self)
            peer_gone_locked(
                l, ucx_addr(peer), Errc::disconnected,
                fmt::format("{}: {} closed its transport", scheme_, ucx_addr(peer)->str), true);
}

void UcxTransport::say_bye_locked(Lane& l) {
    // A peer on the same host cannot see our process die when only the transport goes (ep
    // keepalive checks the process), and a forced close tells it nothing: say so, in every
    // stream of ours (after our last message), and give it a moment to leave.
    // On the heap: a bye UCX still holds after the bounded waits below completes later (from
    // lane_close's progress), and its callback and header must still be there then.
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
    UcxAddr* self = self_.as<UcxAddr>();
    // Every endpoint our hello went on carries a stream of ours: each gets a bye.
    for (Ep& e : l.eps) {
        if (e.failed || e.closing || (e.peer && ucx_addr(e.peer) == self)) continue;
        if (e.peer && ucx_addr(e.peer)->dead.load(std::memory_order_relaxed)) continue;
        MsgHeader h;
        h.kind = MsgKind::bye;
        h.context_id = e.peer_lane;
        h.source_ctx = l.id;
        h.instance = instance_;
        h.seq = e.tx_seq++;
        h.stream = e.stream_id();
        headers.push_back(std::make_unique<std::byte[]>(kMsgHeaderSize));
        encode_msg_header(h, headers.back().get());
        ucp_request_param_t p = eager_send(bye_cb, byes);
        ucs_status_ptr_t r =
            ucp_am_send_nbx(e.h, kAmId, headers.back().get(), kMsgHeaderSize, nullptr, 0, &p);
        if (UCS_PTR_IS_PTR(r)) ++pending;
    }
    auto deadline = deadline_after(std::chrono::milliseconds(500));
    while (pending > 0 && !deadline_passed(deadline))
        ucp_worker_progress(l.worker);
    // A bye still pending is freed by the forced close (its callback runs then, and must not
    // touch `pending` after we return): wait for those too, bounded.
    if (pending > 0) {
        for (Ep& e : l.eps) {
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
            ucp_worker_progress(l.worker);
    }
    if (pending == 0) {
        delete byes;
    } else {
        // Left to UCX (a few header bytes, once per lane): freeing them could let a late
        // callback write into freed memory.
        TALARIA_LOG(ucx, warn,
                    "{}: {} bye messages still pending at close; their {} bytes stay "
                    "allocated",
                    scheme_, pending, pending * kMsgHeaderSize);
    }
}

// --- progress -----------------------------------------------------------------------------------

void UcxTransport::sweep_dead_locked(Lane& l) {
    std::vector<Addr> dead;
    auto add = [&](UcxAddr* pa) {
        if (!pa || !pa->dead.load(std::memory_order_acquire)) return;
        for (const Addr& d : dead)
            if (ucx_addr(d) == pa) return;
        dead.emplace_back(pa);
    };
    for (Ep& e : l.eps)
        if (e.peer) add(ucx_addr(e.peer));
    for (auto& [key, r] : l.routes)
        add(ucx_addr(r.peer));
    for (auto& [key, s] : l.streams)
        add(s.peer);
    UcxAddr* self = self_.as<UcxAddr>();
    for (const Addr& d : dead) {
        UcxAddr* pa = ucx_addr(d);
        if (pa == self) continue;
        std::string why;
        Errc st = dead_status(pa, why);
        bool by_bye;
        {
            std::lock_guard g(pa->dmu);
            by_bye = pa->dead_by_bye;
        }
        // It closed its transport: its messages to this lane come before its byes here, so
        // while a stream of it has not said bye, wait for that (a bye never overtakes a reply).
        if (by_bye) {
            bool pending = false;
            for (const auto& [key, s] : l.streams)
                if (s.peer == pa && !s.bye) pending = true;
            if (pending) continue;
        }
        peer_gone_locked(l, pa, st, why);
    }
}

void UcxTransport::check_pids_locked(Lane& l) {
    const TimePoint now = Clock::now();
    if (now < l.next_pid_check) return;
    l.next_pid_check = now + kPidCheckEvery;
    std::vector<Addr> gone;
    for (Ep& e : l.eps) {
        if (!e.peer) continue;
        UcxAddr* pa = ucx_addr(e.peer);
        const uint32_t pid = pa->pid.load(std::memory_order_relaxed);
        if (pid == 0 || pa->dead.load(std::memory_order_relaxed)) continue;
        if (std::find_if(gone.begin(), gone.end(), [&](const Addr& g) { return g.impl() == pa; }) !=
            gone.end())
            continue;
        if (process_gone(pid_t(pid))) gone.emplace_back(pa);
    }
    for (const Addr& g : gone) {
        UcxAddr* pa = ucx_addr(g);
        peer_gone_locked(l, pa, Errc::disconnected,
                         fmt::format("{}: {} is gone: its process {} has ended", scheme_, pa->str,
                                     pa->pid.load(std::memory_order_relaxed)));
    }
}

void UcxTransport::progress_locked(Lane& l) {
    // Once per poll, as a bare UCP loop does (each call polls every interface); the blocking
    // path calls again until ucp_worker_arm agrees that nothing is left.
    ucp_worker_progress(l.worker);
    if (!l.failed.empty() || !l.byes.empty()) handle_failures_locked(l);
    if (!l.closing_eps.empty()) reap_closed_locked(l);
    if (uint64_t d = deaths_.load(std::memory_order_acquire); d != l.deaths_seen) [[unlikely]] {
        l.deaths_seen = d;
        sweep_dead_locked(l);
    }
    // The clock every kPidCheckPasses passes (busy polling), or on the pass after a sleep.
    if (watching_pids_.load(std::memory_order_relaxed) && ++l.pid_passes >= kPidCheckPasses)
        [[unlikely]] {
        l.pid_passes = 0;
        check_pids_locked(l);
    }
    if (l.locating > 0) [[unlikely]]
        check_locates_locked(l);
    if (l.rma_retrying > 0) [[unlikely]]
        rma_retry_locked(l);
}

Result<void> UcxTransport::progress(Context& ctx, TimePoint deadline) {
    auto& uc = static_cast<UcxContext&>(ctx);
    Lane& l = uc.lane();
    for (;;) {
        {
            std::lock_guard g(l.mu);
            progress_locked(l);
        }
        if (ctx.has_completions()) return ok();
        if (deadline_passed(deadline)) return Errc::timeout;
        if (!ctx.prepare_block()) return ok();
        ucs_status_t st;
        int cap = -1;  // longest wait: none without endpoints
        {
            std::lock_guard g(l.mu);
            st = ucp_worker_arm(l.worker);
            if (!l.eps.empty() || !l.closing_eps.empty()) cap = kKeepaliveTickMs;
            l.pid_passes = kPidCheckPasses;  // the pass after the sleep looks (check_pids)
            // UCX drives connection set-up (wire-up) partly from its async thread
            // without always signalling the worker's fd: while the peer context at the other
            // end of an endpoint has not said hello to this lane yet, do not sleep (for the
            // endpoint's first kConnectSpin; in short naps after that, so that a peer that
            // never answers does not cost a whole core).
            // An endpoint whose peer context already said hello still gets short naps while it
            // is new (its own wire-up may need UCX's async progress), and one that never hears
            // from its peer context stops costing wake-ups after kConnectGiveUp.
            auto now = Clock::now();
            // Something still wiring up: do not sleep (spin), or nap kConnectNapMs at most.
            auto hold = [&cap](bool spin) {
                cap = std::min(cap < 0 ? kKeepaliveTickMs : cap, spin ? 0 : kConnectNapMs);
            };
            for (const Ep& e : l.eps) {
                auto age = now - e.created;
                if (age > kConnectGiveUp || (e.established && age >= kConnectSpin)) continue;
                hold(!e.established && age < kConnectSpin);
                if (cap == 0) break;
            }
            // A peer that just connected to UCX's listeners: its wire-up, in naps only (anyone
            // can connect there, so a connection costs at most a nap every kConnectNapMs for
            // kConnectGiveUp, never a spinning core).
            if (l.connect_seen != TimePoint{} && now - l.connect_seen <= kConnectGiveUp)
                hold(false);
            // A client our bootstrap thread just answered: the same.
            if (l.id == 0)
                if (int64_t at = boot_answered_at_.load(std::memory_order_acquire); at != 0) {
                    auto age = now - TimePoint(Duration(at));
                    if (age <= kConnectGiveUp) hold(age < kConnectSpin);
                }
            // A get answered busy goes again within a few ms.
            if (l.rma_retrying > 0) hold(false);
            // A route waiting for a locate answer: the same, and at least once per retry.
            if (l.locating > 0)
                for (const auto& [key, r] : l.routes) {
                    if (r.ep) continue;
                    hold(now - r.since < kConnectSpin);
                    if (cap == 0) break;
                }
        }
        if (st == UCS_OK) {
            int ms = ms_until(deadline);
            if (cap >= 0 && (ms < 0 || ms > cap)) ms = cap;
            epoll_event evs[4];
            const int n = ::epoll_wait(uc.block_fd(), evs, 4, ms);
            // A wake by UCX's listeners, or by the worker of a lane with no endpoint yet, is
            // a peer connecting: its wire-up follows, partly unsignalled (connect_seen). The
            // wake is the news: UCX's async thread may have accepted the connection already,
            // and then the listener no longer reads as ready.
            bool by_listener = false, by_worker = false;
            for (int i = 0; i < n; ++i) {
                by_listener |= evs[i].data.fd == l.listen_epfd;
                by_worker |= evs[i].data.fd == l.efd;
            }
            if (l.listen_epfd >= 0 && (by_listener || by_worker)) {
                std::lock_guard g(l.mu);
                if (by_listener || l.eps.empty()) {
                    (void)note_connects_locked(l);
                    l.connect_seen = Clock::now();
                }
            }
        }
        ctx.end_block();
        ctx.drain_event_fd();
    }
}

bool UcxTransport::note_connects_locked(Lane& l) {
    if (l.listen_epfd < 0) return false;
    epoll_event evs[8];
    if (::epoll_wait(l.listen_epfd, evs, 8, 0) <= 0) return false;
    l.connect_seen = Clock::now();
    return true;
}

bool UcxTransport::try_wait_for(Context& ctx) {
    Lane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    if (!l.failed.empty() || !l.byes.empty()) return false;
    // A peer connecting to UCX's listeners (its wire-up may come unsignalled: progress()).
    if (note_connects_locked(l)) return false;
    // A locate or a busy get is retried from progress(), on a timer no fd signals.
    if (l.locating > 0 || l.rma_retrying > 0) return false;
    if (l.id == 0)
        if (int64_t at = boot_answered_at_.load(std::memory_order_acquire);
            at != 0 && Clock::now() - TimePoint(Duration(at)) < kConnectSpin)
            return false;  // a client's wire-up may come unsignalled (progress())
    return ucp_worker_arm(l.worker) == UCS_OK;
}

bool UcxTransport::try_wait() {
    // A context's messages arrive on its lane's worker, whose fd progress_fd() does not hold:
    // block on a context's wait_fd() after Context::try_wait().
    return false;
}

}  // namespace talaria::na::ucx
