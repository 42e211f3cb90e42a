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

/// Deliver one message into the endpoint behind `dst`, under its lock. The status is the
/// sender's: disconnected when the endpoint closed since it was resolved.
Errc deliver(Port& dst, const std::string& src_name, bool expected, uint8_t ctx_id, Tag tag,
             std::span<const std::byte> data) {
    std::lock_guard g(dst.mu);
    if (!dst.t) return Errc::disconnected;
    dst.t->deliver_locked(src_name, expected, ctx_id, tag, data);
    return Errc::ok;
}

}  // namespace

// --- checks --------------------------------------------------------------------------------------

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
    return a.as<InprocAddr>();
}

bool InprocTransport::fault_fail_locked(InprocOp* op) noexcept {
    if (faults_.fail_next == 0) return false;
    --faults_.fail_next;
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

// --- delivery ------------------------------------------------------------------------------------

void InprocTransport::fill_recv_locked(InprocOp* op, const Addr& src, Tag tag, uint8_t ctx_id,
                                       std::span<const std::byte> data) noexcept {
    op->completion.source = src;
    op->completion.tag = tag;
    op->completion.context_id = ctx_id;
    op->completion.size = data.size();
    if (data.size() > op->cap) {
        TALARIA_LOG(inproc, debug,
                    "'{}': message of {} bytes from {} (tag {}) does not fit the posted "
                    "{}-byte buffer: message_too_large",
                    name_, data.size(), src.as<InprocAddr>()->name, tag, op->cap);
        complete_op(op, Errc::message_too_large);
        return;
    }
    if (!data.empty()) std::memcpy(op->buf, data.data(), data.size());
    complete_op(op, Errc::ok);
}

void InprocTransport::deliver_locked(const std::string& src_name, bool expected, uint8_t ctx_id,
                                     Tag tag, std::span<const std::byte> data) {
    Addr src = intern_locked(src_name);
    if (!expected) {
        // A context that does not exist: the lowest one that does takes the message
        // (Completion::context_id still names the one asked for), so the layer above can
        // answer the sender instead of leaving it waiting.
        Slot* sp = route_unexpected(slots_, opts_.max_contexts, ctx_id,
                                    [](const Slot& s) { return s.ctx; });
        if (!sp) {
            TALARIA_LOG(inproc, warn,
                        "'{}': dropped an unexpected message from {} (tag {}, {} bytes): no "
                        "context exists",
                        name_, src_name, tag, data.size());
            return;
        }
        Slot& s = *sp;
        if (InprocOp* op = s.recvs.pop_front()) {
            op->where = InprocOp::Where::none;
            fill_recv_locked(op, src, tag, ctx_id, data);
            return;
        }
        s.queued.push_back(Incoming{std::move(src), tag, ctx_id, {data.begin(), data.end()}});
        return;
    }
    for (InprocOp& op : expected_recvs_) {
        if (op.peer == src && op.tag == tag) {
            expected_recvs_.erase(op);
            op.where = InprocOp::Where::none;
            fill_recv_locked(&op, src, tag, ctx_id, data);
            return;
        }
    }
    expected_queued_.push_back(Incoming{std::move(src), tag, ctx_id, {data.begin(), data.end()}});
}

void InprocTransport::peer_lost_locked(const std::string& peer) noexcept {
    // Not interned (or dying): nothing holds it, so nothing can be waiting on it. The reference
    // keeps the pointer compared below from being reused meanwhile.
    Addr held = addrs_.find(peer);
    if (!held) return;
    AddrImpl* a = held.impl();
    unsigned failed = 0;
    auto fail = [&](IntrusiveList<InprocOp>& list) {
        list.for_each_safe([&](InprocOp& op) {
            if (op.peer.impl() != a) return;
            list.erase(op);
            op.where = InprocOp::Where::none;
            complete_op(&op, Errc::disconnected);
            ++failed;
        });
    };
    fail(expected_recvs_);
    fail(delayed_);
    arm_timer_locked();
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
    InprocOp* op = ops_.acquire(ctx, std::move(cb),
                                expected ? OpType::send_expected : OpType::send_unexpected);
    if (!op) return ops_exhausted(what, opts_.max_ops);
    OpId id = op->id();
    std::unique_lock lk(port_->mu);
    if (fault_fail_locked(op)) return id;
    if (faults_.drop_next) {
        --faults_.drop_next;
        TALARIA_LOG(inproc, info, "fault: dropped a message from '{}' to {} (tag {})", name_,
                    da->name, tag);
        complete_op(op, Errc::ok);
        return id;
    }
    auto port = resolve_locked(*da);
    if (!port) {
        TALARIA_LOG(inproc, debug, "{}: {}", what, port.error().describe());
        complete_op(op, port.code());
        return id;
    }
    if (faults_.delay > Duration::zero() || !delayed_.empty() || delivering_) {
        // Queue behind earlier delayed messages so that order is kept.
        TimePoint due = Clock::now() + faults_.delay;
        if (InprocOp* last = delayed_.back()) due = std::max(due, last->due);
        op->expected = expected;
        op->dest_ctx = dest_ctx;
        op->tag = tag;
        op->peer = dest;
        op->due = due;
        op->dest_port = std::move(*port);
        op->payload.assign(buf.data(), buf.data() + len);
        op->where = InprocOp::Where::delay_list;
        delayed_.push_back(*op);
        if (delayed_.front() == op) arm_timer_locked();
        return id;
    }
    lk.unlock();
    Errc st = deliver(**port, name_, expected, dest_ctx, tag, {buf.data(), len});
    lk.lock();
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
    InprocOp* op = ops_.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) return ops_exhausted("inproc post_recv_unexpected", opts_.max_ops);
    OpId id = op->id();
    op->buf = buf.data();
    op->cap = buf.size();
    std::lock_guard g(port_->mu);
    if (fault_fail_locked(op)) return id;
    Slot& s = slots_[ctx.id()];
    if (!s.queued.empty()) {
        Incoming m = std::move(s.queued.front());
        s.queued.pop_front();
        fill_recv_locked(op, m.source, m.tag, m.ctx_id, m.data);
        return id;
    }
    op->where = InprocOp::Where::unexpected_list;
    s.recvs.push_back(*op);
    return id;
}

Result<OpId> InprocTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                                 const Addr& source, Tag tag) {
    TALARIA_CHECK(check_ctx(ctx, "post_recv_expected"));
    TALARIA_TRY(sa, check_addr(source, "post_recv_expected"));
    if (!buf.valid())
        return Error(Errc::invalid_argument, "post_recv_expected: invalid (empty) buffer");
    InprocOp* op = ops_.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) return ops_exhausted("inproc post_recv_expected", opts_.max_ops);
    OpId id = op->id();
    op->buf = buf.data();
    op->cap = buf.size();
    op->tag = tag;
    op->peer = source;
    std::lock_guard g(port_->mu);
    if (fault_fail_locked(op)) return id;
    for (auto it = expected_queued_.begin(); it != expected_queued_.end(); ++it) {
        if (it->source == source && it->tag == tag) {
            Incoming m = std::move(*it);
            expected_queued_.erase(it);
            fill_recv_locked(op, m.source, m.tag, m.ctx_id, m.data);
            return id;
        }
    }
    // Nothing queued: if the source is gone it never will be (checked under our lock, so a
    // close that races with this post is seen either here or by peer_lost_locked).
    if (sa->name != name_) {
        auto port = resolve_locked(*sa);
        if (!port) {
            TALARIA_LOG(inproc, debug, "post_recv_expected: {}", port.error().describe());
            complete_op(op, port.code());
            return id;
        }
    }
    op->where = InprocOp::Where::expected_list;
    expected_recvs_.push_back(*op);
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
    InprocOp* op = ops_.acquire(ctx, std::move(cb), is_put ? OpType::put : OpType::get);
    if (!op) return ops_exhausted(what, opts_.max_ops);
    OpId id = op->id();
    std::unique_lock lk(port_->mu);
    if (fault_fail_locked(op)) return id;
    auto port = resolve_locked(*ra);
    if (!port) {
        TALARIA_LOG(inproc, debug, "{}: {}", what, port.error().describe());
        complete_op(op, port.code());
        return id;
    }
    lk.unlock();

    // The target checks the access against its own registration table, as a NIC would.
    auto* lbase = reinterpret_cast<std::byte*>(local->base()) + local_off;
    Errc st = Errc::ok;
    std::string why;
    {
        Port& p = **port;
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
    lk.lock();
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
    std::lock_guard g(port_->mu);
    InprocOp* op = ops_.lookup(id);
    if (!op)
        return Error(Errc::not_found, "cancel: no such operation (already completed, or not ours)");
    switch (op->where) {
        case InprocOp::Where::unexpected_list:
            slots_[op->ctx->id()].recvs.erase(*op);
            break;
        case InprocOp::Where::expected_list:
            expected_recvs_.erase(*op);
            break;
        case InprocOp::Where::delay_list:
            delayed_.erase(*op);
            arm_timer_locked();
            break;
        case InprocOp::Where::none:
            return ok();  // being completed right now: it finishes with its own status
    }
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
    }
    for (InprocOp& op : batch)
        op.result = deliver(*op.dest_port, name_, op.expected, op.dest_ctx, op.tag, op.payload);
    std::lock_guard g(port_->mu);
    delivering_ = false;
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
    std::lock_guard g(port_->mu);
    InprocOp* first = delayed_.front();
    return !(first && !delivering_ && first->due <= Clock::now());
}

}  // namespace talaria::na::inproc
