// inproc data path: posting, delivery and matching, put/get, cancel and progress.
#include <poll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "na/inproc/inproc.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::inproc {

namespace {

/// Deliver one message into the endpoint behind `dst`, under the receiving lane's lock only.
/// The status is the sender's: disconnected when the endpoint closed since it was resolved.
/// A message for a context that does not exist (or takes no unexpected messages) goes to the
/// lowest context that takes unexpected messages (Completion::context_id still names the one
/// asked for), so the layer above can answer the sender instead of leaving it waiting; an
/// expected one for a missing context is dropped (nobody posted its receive).
Errc deliver(Port& dst, const std::string& src_name, bool expected, uint8_t ctx_id, Tag tag,
             std::span<const std::byte> data) {
    if (Lane* l = dst.lane(ctx_id)) {
        std::lock_guard g(l->mu);
        if (!l->t) return Errc::disconnected;
        if (l->ctx && (expected || l->takes_unexpected)) {
            l->t->deliver_lane_locked(*l, src_name, expected, ctx_id, tag, data);
            return Errc::ok;
        }
    }
    if (!dst.open.load(std::memory_order_acquire)) return Errc::disconnected;
    if (!expected) {
        for (std::size_t i = 0; i < dst.max_contexts; ++i) {
            Lane* l = dst.lane(uint8_t(i));
            if (!l) continue;
            std::lock_guard g(l->mu);
            if (!l->t) return Errc::disconnected;
            if (l->ctx && l->takes_unexpected) {
                l->t->deliver_lane_locked(*l, src_name, expected, ctx_id, tag, data);
                return Errc::ok;
            }
        }
    }
    TALARIA_LOG(inproc, warn,
                "'{}': dropped an {} message from {} (tag {}, {} bytes) for context {}: {}",
                dst.name, expected ? "expected" : "unexpected", src_name, tag, data.size(), ctx_id,
                expected ? "that context does not exist" : "no context takes unexpected messages");
    return Errc::ok;
}

}  // namespace

// --- checks --------------------------------------------------------------------------------------

Lane& InprocTransport::lane_of(Context& ctx) noexcept {
    return static_cast<InprocContext&>(ctx).lane();
}

Result<void> InprocTransport::check_ctx(const Context& ctx, std::string_view what) const {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", what));
    return ok();
}

Result<InprocAddr*> InprocTransport::check_addr(const Addr& a, std::string_view what) const {
    if (!a) return Error(Errc::invalid_argument, fmt::format("{}: null address", what));
    if (a.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the address belongs to another transport (look it up on "
                                 "this one)",
                                 what));
    return peer_of(a);
}

void InprocTransport::refresh_faulty_locked() noexcept {
    bool any = faults_.drop_next != 0 || faults_.fail_next != 0 ||
               faults_.delay > Duration::zero() || !delayed_.empty() || delivering_;
    faulty_.store(any, std::memory_order_release);
}

bool InprocTransport::fault_fail_locked(InprocOp* op) noexcept {
    if (faults_.fail_next == 0) return false;
    --faults_.fail_next;
    refresh_faulty_locked();
    TALARIA_LOG(inproc, info, "fault: {} on '{}' fails with {}", op_type_name(op->completion.type),
                name_, errc_name(faults_.fail_code));
    complete_op(op, faults_.fail_code);
    return true;
}

Result<std::shared_ptr<Port>> InprocTransport::resolve_locked(InprocAddr& a) {
    if (auto p = a.port.lock(); p && p->open.load(std::memory_order_acquire)) return p;
    if (auto p = registry_find(a.name)) {
        a.port = p;
        a.resolved_once = true;
        return p;
    }
    if (a.resolved_once)
        return Error(Errc::disconnected, fmt::format("inproc://{} has closed", a.name));
    return Error(Errc::unreachable, fmt::format("no endpoint inproc://{} in this process", a.name));
}

Result<InprocTransport::Route> InprocTransport::route(Lane& l, InprocAddr& a) {
    {
        std::lock_guard g(l.mu);
        auto it = l.routes.find(a.name);
        if (it != l.routes.end() && it->second->open.load(std::memory_order_acquire))
            return Route{it->second.get(), nullptr};
    }
    // First use, or the endpoint closed (and maybe opened again): resolve. A cached port is
    // never replaced (another thread posting on this context may be using it), so a reopened
    // endpoint is resolved again on every post: a rare case.
    std::shared_ptr<Port> p;
    {
        std::lock_guard g(port_->mu);
        TALARIA_TRY(r, resolve_locked(a));
        p = std::move(r);
    }
    std::lock_guard g(l.mu);
    auto [it, added] = l.routes.try_emplace(a.name, p);
    if (added) return Route{p.get(), nullptr};
    return Route{p.get(), std::move(p)};
}

// --- delivery ------------------------------------------------------------------------------------

const Addr& InprocTransport::source_locked(Lane& l, const std::string& name) {
    auto it = l.sources.find(name);
    if (it != l.sources.end()) return it->second;
    return l.sources.emplace(name, alias_of(this, intern(name))).first->second;
}

void InprocTransport::fill_recv(InprocOp* op, const Addr& src, Tag tag, uint8_t ctx_id,
                                std::span<const std::byte> data) noexcept {
    op->completion.source = src;
    op->completion.tag = tag;
    op->completion.context_id = ctx_id;
    op->completion.size = data.size();
    if (data.size() > op->cap) {
        TALARIA_LOG(inproc, debug,
                    "'{}': message of {} bytes from {} (tag {}) does not fit the posted "
                    "{}-byte buffer: message_too_large",
                    name_, data.size(), peer_of(src)->name, tag, op->cap);
        complete_op(op, Errc::message_too_large);
        return;
    }
    if (!data.empty()) std::memcpy(op->buf, data.data(), data.size());
    complete_op(op, Errc::ok);
}

void InprocTransport::deliver_lane_locked(Lane& l, const std::string& src_name, bool expected,
                                          uint8_t ctx_id, Tag tag,
                                          std::span<const std::byte> data) {
    const Addr& src = source_locked(l, src_name);
    if (!expected) {
        if (InprocOp* op = l.recvs.pop_front()) {
            op->where = InprocOp::Where::none;
            fill_recv(op, src, tag, ctx_id, data);
            return;
        }
        l.queued.push_back(Incoming{src, tag, ctx_id, {data.begin(), data.end()}});
        return;
    }
    for (InprocOp& op : l.expected_recvs) {
        if (op.peer == src && op.tag == tag) {
            l.expected_recvs.erase(op);
            op.where = InprocOp::Where::none;
            fill_recv(&op, src, tag, ctx_id, data);
            return;
        }
    }
    l.expected_queued.push_back(Incoming{src, tag, ctx_id, {data.begin(), data.end()}});
}

void InprocTransport::peer_lost_locked(const std::string& peer) noexcept {
    unsigned failed = 0;
    auto fail = [&](IntrusiveList<InprocOp>& list) {
        list.for_each_safe([&](InprocOp& op) {
            if (!op.peer || peer_of(op.peer)->name != peer) return;
            list.erase(op);
            op.where = InprocOp::Where::none;
            complete_op(&op, Errc::disconnected);
            ++failed;
        });
    };
    for (std::size_t i = 0; i < opts_.max_contexts; ++i) {
        Lane* l = port_->lane(uint8_t(i));
        if (!l) continue;
        std::lock_guard g(l->mu);
        fail(l->expected_recvs);
        l->sources.erase(peer);
    }
    fail(delayed_);
    arm_timer_locked();
    refresh_faulty_locked();
    if (failed)
        TALARIA_LOG(inproc, info, "'{}': lost peer {}: {} pending operation(s) disconnected", name_,
                    peer, failed);
}

// --- messages ------------------------------------------------------------------------------------

Result<OpId> InprocTransport::post_send(Context& ctx, Callback cb, const MsgBuffer& buf,
                                        std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                        Tag tag, bool expected) {
    const char* what = expected ? "post_send_expected" : "post_send_unexpected";
    TALARIA_CHECK(check_ctx(ctx, what));
    TALARIA_TRY(da, check_addr(dest, what));
    if (len > kMaxMsgSize)
        return Error(
            Errc::message_too_large,
            fmt::format("{}: {} bytes exceed the inproc maximum of {}", what, len, kMaxMsgSize));
    if (!buf.valid() || len > buf.size())
        return Error(Errc::invalid_argument, fmt::format("{}: length {} exceeds the {}-byte buffer",
                                                         what, len, buf.valid() ? buf.size() : 0));
    Lane& own = lane_of(ctx);
    InprocOp* op = own.ops.acquire(ctx, std::move(cb),
                                   expected ? OpType::send_expected : OpType::send_unexpected);
    if (!op) return ops_exhausted(what, opts_.max_ops);
    OpId id = op->id();
    if (faulty_.load(std::memory_order_acquire)) [[unlikely]] {
        std::lock_guard g(port_->mu);
        if (fault_fail_locked(op)) return id;
        if (faults_.drop_next) {
            --faults_.drop_next;
            refresh_faulty_locked();
            TALARIA_LOG(inproc, info, "fault: dropped a message from '{}' to {} (tag {})", name_,
                        da->name, tag);
            complete_op(op, Errc::ok);
            return id;
        }
    }
    auto port = route(own, *da);
    if (!port) {
        TALARIA_LOG(inproc, debug, "{}: {}", what, port.error().describe());
        complete_op(op, port.code());
        return id;
    }
    if (faulty_.load(std::memory_order_acquire)) [[unlikely]] {
        std::lock_guard g(port_->mu);
        if (faults_.delay > Duration::zero() || !delayed_.empty() || delivering_) {
            // Queue behind earlier delayed messages so that order is kept.
            TimePoint due = Clock::now() + faults_.delay;
            if (InprocOp* last = delayed_.back()) due = std::max(due, last->due);
            op->expected = expected;
            op->dest_ctx = dest_ctx;
            op->tag = tag;
            op->peer = dest;
            op->due = due;
            if (port->hold) {
                op->dest_port = std::move(port->hold);
            } else {
                std::lock_guard lg(own.mu);  // endpoint lock, then a lane's
                op->dest_port = own.routes.at(da->name);
            }
            op->payload.assign(buf.data(), buf.data() + len);
            op->where = InprocOp::Where::delay_list;
            delayed_.push_back(*op);
            refresh_faulty_locked();
            if (delayed_.front() == op) arm_timer_locked();
            return id;
        }
    }
    Errc st = deliver(*port->port, name_, expected, dest_ctx, tag, {buf.data(), len});
    if (st != Errc::ok)
        TALARIA_LOG(inproc, debug, "{}: inproc://{} closed during delivery", what, da->name);
    complete_op(op, st);
    return id;
}

Result<OpId> InprocTransport::post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                                   std::size_t len, const Addr& dest,
                                                   uint8_t dest_ctx, Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, false);
}

Result<OpId> InprocTransport::post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                                 std::size_t len, const Addr& dest,
                                                 uint8_t dest_ctx, Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, true);
}

Result<OpId> InprocTransport::post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) {
    TALARIA_CHECK(check_ctx(ctx, "post_recv_unexpected"));
    if (!buf.valid())
        return Error(Errc::invalid_argument, "post_recv_unexpected: invalid (empty) buffer");
    Lane& l = lane_of(ctx);
    InprocOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) return ops_exhausted("inproc post_recv_unexpected", opts_.max_ops);
    OpId id = op->id();
    op->buf = buf.data();
    op->cap = buf.size();
    if (faulty_.load(std::memory_order_acquire)) [[unlikely]] {
        std::lock_guard g(port_->mu);
        if (fault_fail_locked(op)) return id;
    }
    std::lock_guard g(l.mu);
    if (!l.queued.empty()) {
        Incoming m = std::move(l.queued.front());
        l.queued.pop_front();
        fill_recv(op, m.source, m.tag, m.ctx_id, m.data);
        return id;
    }
    op->where = InprocOp::Where::unexpected_list;
    l.recvs.push_back(*op);
    return id;
}

Result<OpId> InprocTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                                 const Addr& source, Tag tag) {
    TALARIA_CHECK(check_ctx(ctx, "post_recv_expected"));
    TALARIA_TRY(sa, check_addr(source, "post_recv_expected"));
    if (!buf.valid())
        return Error(Errc::invalid_argument, "post_recv_expected: invalid (empty) buffer");
    Lane& l = lane_of(ctx);
    InprocOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) return ops_exhausted("inproc post_recv_expected", opts_.max_ops);
    OpId id = op->id();
    op->buf = buf.data();
    op->cap = buf.size();
    op->tag = tag;
    op->peer = source;
    if (faulty_.load(std::memory_order_acquire)) [[unlikely]] {
        std::lock_guard g(port_->mu);
        if (fault_fail_locked(op)) return id;
    }
    // Under l.mu: give the receive a message that came first, if one did.
    auto take_queued = [&] {
        for (auto it = l.expected_queued.begin(); it != l.expected_queued.end(); ++it) {
            if (it->source == source && it->tag == tag) {
                Incoming m = std::move(*it);
                l.expected_queued.erase(it);
                fill_recv(op, m.source, m.tag, m.ctx_id, m.data);
                return true;
            }
        }
        return false;
    };
    {
        std::lock_guard g(l.mu);
        if (take_queued()) return id;
    }
    // Nothing queued: if the source is gone it never will be.
    Port* src_port = nullptr;
    std::shared_ptr<Port> hold;
    if (sa->name != name_) {
        auto port = route(l, *sa);
        if (!port) {
            TALARIA_LOG(inproc, debug, "post_recv_expected: {}", port.error().describe());
            complete_op(op, port.code());
            return id;
        }
        src_port = port->port;
        hold = std::move(port->hold);
    }
    std::lock_guard g(l.mu);
    if (take_queued()) return id;  // it came meanwhile (unlocked above)
    // A close that races with this post: the closing endpoint marks itself closed before it
    // fails what waits for it, lane by lane under each lane's lock. Seen closed here, it may
    // already have passed this lane: fail the receive here instead.
    if (src_port && !src_port->open.load(std::memory_order_acquire)) {
        TALARIA_LOG(inproc, debug, "post_recv_expected: inproc://{} has closed", sa->name);
        complete_op(op, Errc::disconnected);
        return id;
    }
    op->where = InprocOp::Where::expected_list;
    l.expected_recvs.push_back(*op);
    return id;
}

// --- put / get -----------------------------------------------------------------------------------

Result<OpId> InprocTransport::post_rma(Context& ctx, Callback cb, const MemHandle& local,
                                       std::size_t local_off, const MemHandle& remote,
                                       std::size_t remote_off, std::size_t len,
                                       const Addr& remote_addr, bool is_put) {
    const char* what = is_put ? "post_put" : "post_get";
    TALARIA_CHECK(check_ctx(ctx, what));
    TALARIA_TRY(ra, check_addr(remote_addr, what));
    if (!local || local->transport() != this || !local->local())
        return Error(
            Errc::invalid_argument,
            fmt::format("{}: the local handle is not a registration of this endpoint", what));
    if (!remote || remote->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the remote handle is not an inproc handle of this endpoint "
                                 "(deserialize it here)",
                                 what));
    if (local_off > local->length() || len > local->length() - local_off)
        return Error(Errc::out_of_range,
                     fmt::format("{}: local range [{}, +{}) is outside the {}-byte registration",
                                 what, local_off, len, local->length()));
    auto* rm = remote.as<InprocMem>();
    Lane& own = lane_of(ctx);
    InprocOp* op = own.ops.acquire(ctx, std::move(cb), is_put ? OpType::put : OpType::get);
    if (!op) return ops_exhausted(what, opts_.max_ops);
    OpId id = op->id();
    if (faulty_.load(std::memory_order_acquire)) [[unlikely]] {
        std::lock_guard g(port_->mu);
        if (fault_fail_locked(op)) return id;
    }
    auto port = route(own, *ra);
    if (!port) {
        TALARIA_LOG(inproc, debug, "{}: {}", what, port.error().describe());
        complete_op(op, port.code());
        return id;
    }

    // The target checks the access against its own registration table, as a NIC would (under
    // the target's endpoint lock: put/get, not the message path).
    auto* lbase = reinterpret_cast<std::byte*>(local->base()) + local_off;
    Errc st = Errc::ok;
    std::string why;
    {
        Port& p = *port->port;
        std::lock_guard g(p.mu);
        if (!p.t) {
            st = Errc::disconnected;
            why = "the target endpoint closed";
        } else if (p.uid != rm->owner_uid) {
            st = Errc::invalid_argument;
            why = fmt::format("the remote handle was not registered by {}", p.name);
        } else {
            auto& regs = p.t->regs_;
            auto it = regs.find(rm->reg_id);
            if (it == regs.end() || it->second.base != rm->base() ||
                it->second.length != rm->length()) {
                st = Errc::invalid_argument;
                why = "the remote region is not registered (deregistered, or a forged handle)";
            } else {
                const Reg& r = it->second;
                bool allowed = is_put ? (uint8_t(r.access) & uint8_t(Access::write_only))
                                      : (uint8_t(r.access) & uint8_t(Access::read_only));
                if (!allowed) {
                    st = Errc::access_denied;
                    why = fmt::format("the remote region does not allow {}",
                                      is_put ? "writes (put)" : "reads (get)");
                } else if (remote_off > r.length || len > r.length - remote_off) {
                    st = Errc::out_of_range;
                    why = fmt::format("remote range [{}, +{}) is outside the {}-byte region",
                                      remote_off, len, r.length);
                } else if (len) {
                    auto* rbase = reinterpret_cast<std::byte*>(r.base) + remote_off;
                    // memmove: a put/get to self may overlap.
                    if (is_put)
                        std::memmove(rbase, lbase, len);
                    else
                        std::memmove(lbase, rbase, len);
                }
            }
        }
    }
    if (st != Errc::ok)
        TALARIA_LOG(inproc, debug, "{} to {}: {}: {}", what, ra->name, errc_name(st), why);
    if (st == Errc::ok) op->completion.size = len;
    complete_op(op, st);
    return id;
}

Result<OpId> InprocTransport::post_put(Context& ctx, Callback cb, const MemHandle& local,
                                       std::size_t local_off, const MemHandle& remote,
                                       std::size_t remote_off, std::size_t len,
                                       const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), local, local_off, remote, remote_off, len, remote_addr,
                    true);
}

Result<OpId> InprocTransport::post_get(Context& ctx, Callback cb, const MemHandle& local,
                                       std::size_t local_off, const MemHandle& remote,
                                       std::size_t remote_off, std::size_t len,
                                       const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), local, local_off, remote, remote_off, len, remote_addr,
                    false);
}

// --- cancel --------------------------------------------------------------------------------------

Result<void> InprocTransport::cancel(OpId id) {
    Lane* l = nullptr;
    for (std::size_t i = 0; !l && i < opts_.max_contexts; ++i) {
        Lane* c = port_->lane(uint8_t(i));
        if (c && c->ops.owns(id.op)) l = c;
    }
    if (!l) return Error(Errc::not_found, "cancel: not an operation of this endpoint");
    {
        std::lock_guard g(l->mu);
        InprocOp* op = l->ops.lookup(id);
        if (!op)
            return Error(Errc::not_found,
                         "cancel: no such operation (already completed, or not ours)");
        switch (op->where) {
            case InprocOp::Where::unexpected_list:
                l->recvs.erase(*op);
                break;
            case InprocOp::Where::expected_list:
                l->expected_recvs.erase(*op);
                break;
            case InprocOp::Where::delay_list:
                goto delayed;  // under the endpoint lock, below
            case InprocOp::Where::none:
                return ok();  // being completed right now: it finishes with its own status
        }
        op->where = InprocOp::Where::none;
        complete_op(op, Errc::canceled);
        return ok();
    }
delayed:
    std::lock_guard g(port_->mu);
    InprocOp* op = l->ops.lookup(id);
    if (!op || op->where != InprocOp::Where::delay_list) return ok();  // delivered meanwhile
    delayed_.erase(*op);
    arm_timer_locked();
    refresh_faulty_locked();
    op->where = InprocOp::Where::none;
    complete_op(op, Errc::canceled);
    return ok();
}

// --- progress ------------------------------------------------------------------------------------

void InprocTransport::arm_timer_locked() noexcept {
    itimerspec its{};
    if (InprocOp* first = delayed_.front()) {
        auto ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(first->due.time_since_epoch())
                .count();
        if (ns <= 0) ns = 1;  // 0 would disarm
        its.it_value.tv_sec = ns / 1000000000;
        its.it_value.tv_nsec = ns % 1000000000;
    }
    // steady_clock is CLOCK_MONOTONIC on Linux, so its time points are absolute timer values.
    if (::timerfd_settime(timerfd_, TFD_TIMER_ABSTIME, &its, nullptr) < 0)
        TALARIA_LOG(inproc, error, "'{}': timerfd_settime failed: errno {}", name_, errno);
}

void InprocTransport::run_due_deliveries() {
    if (!faulty_.load(std::memory_order_acquire)) return;  // nothing delayed
    IntrusiveList<InprocOp> batch;
    {
        std::lock_guard g(port_->mu);
        if (delivering_ || delayed_.empty()) return;  // another thread is delivering in order
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(timerfd_, &v, sizeof v);
        auto now = Clock::now();
        while (InprocOp* op = delayed_.front()) {
            if (op->due > now) break;
            delayed_.erase(*op);
            op->where = InprocOp::Where::none;
            batch.push_back(*op);
        }
        arm_timer_locked();
        if (batch.empty()) return;
        delivering_ = true;
        refresh_faulty_locked();
    }
    for (InprocOp& op : batch)
        op.result = deliver(*op.dest_port, name_, op.expected, op.dest_ctx, op.tag, op.payload);
    std::lock_guard g(port_->mu);
    delivering_ = false;
    refresh_faulty_locked();
    while (InprocOp* op = batch.pop_front()) {
        op->dest_port.reset();
        complete_op(op, op->result);
    }
}

Result<void> InprocTransport::progress(Context& ctx, TimePoint deadline) {
    for (;;) {
        run_due_deliveries();
        if (ctx.has_completions()) return ok();
        if (deadline_passed(deadline)) return Error(Errc::timeout);
        if (!ctx.prepare_block()) return ok();
        pollfd fds[2] = {{ctx.event_fd(), POLLIN, 0}, {timerfd_, POLLIN, 0}};
        int rc = ::poll(fds, 2, ms_until(deadline));
        int err = errno;
        ctx.end_block();
        ctx.drain_event_fd();
        if (rc < 0 && err != EINTR) return errno_error("inproc progress: poll", err);
    }
}

bool InprocTransport::try_wait() {
    if (!faulty_.load(std::memory_order_acquire)) return true;  // nothing delayed
    std::lock_guard g(port_->mu);
    InprocOp* first = delayed_.front();
    return !(first && !delivering_ && first->due <= Clock::now());
}

}  // namespace talaria::na::inproc
