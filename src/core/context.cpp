// Core contexts: outgoing calls, their deadlines, cancel, peer watches, progress and trigger.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "core/core_impl.hpp"
#include "talaria/util/log.hpp"

namespace talaria::core {

using namespace std::chrono_literals;

namespace {

/// Why a call with a deadline fails with timeout: the deadline timer's words, and the start of
/// a late response's (complete_call).
constexpr std::string_view kDeadlinePassed = "the call's deadline passed before its response came";
constexpr uint32_t kNoSlot = UINT32_MAX;
constexpr auto kSweepPeriod = 1s;
/// A peer with no call in flight for this many sweeps gives up its watch.
constexpr unsigned kIdleSweeps = 2;

/// What a request's header says of its deadline: the microseconds left at `now` (at least 1
/// once it passed, at most wire::kMaxBudgetUs), 0 for a call without one.
uint32_t budget_of(TimePoint deadline, TimePoint now) noexcept {
    if (deadline == TimePoint{}) return 0;
    const auto left = std::chrono::ceil<std::chrono::microseconds>(deadline - now).count();
    if (left <= 0) return 1;
    return left >= int64_t(wire::kMaxBudgetUs) ? wire::kMaxBudgetUs : uint32_t(left);
}
}  // namespace

Context::Impl::Impl(Engine::Impl* e, std::unique_ptr<na::Context> n)
    : eng(e),
      na(std::move(n)),
      t(&na->transport()),
      id(na->id()),
      thread_safe(e->opts.na.thread_safe),
      checksum(e->opts.checksum),
      mu(e->opts.na.thread_safe),
      pool_mu(e->opts.na.thread_safe),
      client_timer(e->opts.stats_timing_gap),
      server_timer(e->opts.stats_timing_gap),
      quiet(e->opts.stats_timing_gap) {
    if (e->opts.stats) procs = std::make_unique<std::atomic<ProcCounters*>[]>(StatsIndex::kMax);
}

Context::Impl::~Impl() {
    // Whatever the transport still holds refers to our buffers: the engine drained it first.
    peers.clear();
    recvs.clear();
    all_bufs.clear();
    if (procs)
        for (uint32_t i = 0; i < StatsIndex::kMax; ++i)
            delete procs[i].load(std::memory_order_relaxed);
}

Result<void> Context::Impl::start(unsigned recv_depth, uint32_t max_inflight) {
    slots.resize(max_inflight);
    for (uint32_t i = 0; i < max_inflight; ++i)
        slots[i].next_free = i + 1 < max_inflight ? i + 1 : kNoSlot;
    free_head = 0;
    heap.reserve(64);
    for (unsigned i = 0; i < recv_depth; ++i) {
        auto rs = std::make_unique<RecvSlot>();
        TALARIA_TRY(buf, t->msg_buf_alloc(t->max_unexpected_size()));
        rs->buf = std::move(buf);
        rs->impl = this;
        recvs.push_back(std::move(rs));
    }
    for (auto& rs : recvs) {
        post_recv(*rs);
        if (!rs->posted)
            return Error{Errc::no_memory,
                         fmt::format("context {}: could not post its receives (raise "
                                     "na::Options::max_ops above {})",
                                     id, eng->opts.na.max_ops)};
    }
    return ok();
}

// --- send buffers -----------------------------------------------------------------------------

SendBuf* Context::Impl::acquire_buf() {
    {
        std::lock_guard g(pool_mu);
        if (!free_bufs.empty()) {
            SendBuf* sb = free_bufs.back();
            free_bufs.pop_back();
            return sb;
        }
    }
    auto buf = t->msg_buf_alloc(t->max_unexpected_size());
    if (!buf) return nullptr;
    auto sb = std::make_unique<SendBuf>();
    sb->buf = std::move(*buf);
    sb->impl = this;
    SendBuf* raw = sb.get();
    std::lock_guard g(pool_mu);
    all_bufs.push_back(std::move(sb));
    return raw;
}

void Context::Impl::release_buf(SendBuf* sb) noexcept {
    sb->info = {};
    std::lock_guard g(pool_mu);
    free_bufs.push_back(sb);
}

Result<void> Context::Impl::send_message(const na::Addr& dest, wire::Header h,
                                         std::span<const std::byte> payload, SendInfo info,
                                         SendBuf* filled) {
    SendBuf* sb = filled ? filled : acquire_buf();
    if (!sb) return Error{Errc::no_memory, fmt::format("context {}: no message buffer", id)};
    std::byte* p = sb->buf.data();
    if (!filled && !payload.empty())
        std::memcpy(p + wire::kHeaderSize, payload.data(), payload.size());
    h.payload_len = static_cast<uint32_t>(payload.size());
    if (checksum) h.flags |= wire::kChecksum;
    wire::encode_header(h, p, {p + wire::kHeaderSize, payload.size()});
    sb->info = info;
    if (is_self(dest)) [[unlikely]]
        return loop_back(sb, wire::kHeaderSize + payload.size(), h.target_ctx);
    auto r = t->post_send_unexpected(
        *na, [sb](const na::Completion& c) { sb->impl->on_call_sent_buf(sb, c.status); }, sb->buf,
        wire::kHeaderSize + payload.size(), dest, h.target_ctx, wire::kMessageTag);
    if (!r) {
        release_buf(sb);
        return std::move(r).error();
    }
    return ok();
}

Result<void> Context::Impl::loop_back(SendBuf* sb, std::size_t len, uint8_t named_ctx) {
    // Mercury's HG core does the same for a forward to HG_Addr_self: a class that does not
    // listen has no endpoint its transport could send to (sm, tcp), and one that does skips
    // the copy into a ring or socket and back.
    Impl* to = named_ctx < eng->contexts.size() ? eng->contexts[named_ctx]->impl_.get()
                                                : eng->contexts.front()->impl_.get();
    auto r = to->na->post([to, sb, len, named_ctx](const na::Completion&) {
        // As on_recv(): a context shutting down handles nothing more.
        if (!to->closing.load(std::memory_order_relaxed))
            to->handle_message({sb->buf.data(), len}, to->eng->self, named_ctx);
        // Sent once handled, in the sender's own trigger (a one-way call completes there).
        Impl* from = sb->impl;
        if (!from->na->post(
                [sb](const na::Completion&) { sb->impl->on_call_sent_buf(sb, Errc::ok); }))
            from->release_buf(sb);  // its context is going: its shutdown fails the call
    });
    if (!r) {
        release_buf(sb);
        return Error{r.code(), fmt::format("context {}: a message to this engine itself could not "
                                           "be queued on its context {}: {}",
                                           id, to->id, r.error().describe())};
    }
    return ok();
}

Result<Context::Impl::Written> Context::Impl::write_payload(PayloadWriter write) {
    SendBuf* sb = acquire_buf();
    if (!sb) return Error{Errc::no_memory, fmt::format("context {}: no message buffer", id)};
    BufGuard guard{this, sb};
    std::span<std::byte> room{sb->buf.data() + wire::kHeaderSize, eng->eager};
    TALARIA_TRY(bytes, write(room));
    if (bytes.data() == room.data() && bytes.size() <= room.size())
        return Written{guard.take(), bytes};
    if (bytes.empty()) return Written{guard.take(), room.first(0)};
    const std::byte* b = bytes.data();
    if (b >= sb->buf.data() && b < sb->buf.data() + sb->buf.size())
        return Error{Errc::invalid_argument,
                     "PayloadWriter: the bytes returned lie in the send buffer but are not a "
                     "prefix of the room it was given"};
    return Written{nullptr, bytes};  // spilled: the guard gives the buffer back
}

void Context::Impl::on_call_sent_buf(SendBuf* sb, Errc status) {
    SendInfo info = sb->info;
    release_buf(sb);
    if (status == Errc::ok) [[likely]] {
        // A normal call sent fine waits for its response: nothing more (no lock taken).
        if (info.kind == SendInfo::call && info.one_way) on_call_sent(info.seq, true, status);
        return;
    }
    if (info.seq != 0) {
        on_call_sent(info.seq, info.one_way, status);
    } else if (status != Errc::canceled) {
        CtxCounters::add(counters.errors);
        TALARIA_LOG(core, debug, "context {}: a response or ack failed to send: {}", id,
                    errc_name(status));
    }
}

// --- calls ------------------------------------------------------------------------------------

Peer* Context::Impl::peer_for_locked(const na::Addr& dest) {
    Peer* p = last_peer;
    if (!p || !(p->addr == dest)) {
        auto& slot = peers[dest.impl()->canonical()];
        if (!slot) {
            slot = std::make_unique<Peer>();
            slot->addr = t->addr_alias(dest);  // this context's own count (sm: an alias)
        }
        p = slot.get();
        last_peer = p;
    }
    p->retiring = false;
    p->idle_sweeps = 0;
    return p;
}

bool Context::Impl::claim_watch_locked(Peer* p) noexcept {
    // The engine itself is not watched: its calls loop back (loop_back).
    if (p->watch_posted || p->watch_posting || closing.load(std::memory_order_relaxed) ||
        is_self(p->addr))
        return false;
    p->watch_posting = true;
    p->watch_fired = false;
    return true;
}

void Context::Impl::post_watch(Peer* p) {
    // p stays (watch_posting) and its watch fields are ours until we take the lock again.
    auto r = [&]() -> Result<na::OpId> {
        if (!p->watch_buf.valid()) {
            TALARIA_TRY(b, t->msg_buf_alloc(16));
            p->watch_buf = std::move(b);
        }
        return t->post_recv_expected(
            *na, [this, p](const na::Completion& c) { on_watch(p, c); }, p->watch_buf, p->addr,
            wire::kWatchTag);
    }();
    na::OpId cancel_now;
    {
        std::lock_guard g(mu);
        p->watch_posting = false;
        if (r && !p->watch_fired) {
            p->watch = *r;
            p->watch_posted = true;
            // Shut down while we posted: begin_shutdown did not see it; cancel it here.
            if (closing.load(std::memory_order_relaxed)) cancel_now = *r;
        } else if (p->inflight == 0 &&
                   (p->watch_fired || closing.load(std::memory_order_relaxed))) {
            // It fired already (the peer failed, and on_watch left the peer to us) or nothing
            // will watch it: forget an unused peer.
            if (last_peer == p) last_peer = nullptr;
            peers.erase(p->addr.impl()->canonical());  // frees p
        }
    }
    if (!r)  // the call still works; only prompt failure detection is lost
        TALARIA_LOG(core, debug, "context {}: no watch on a peer: {}", id, r.error().describe());
    if (cancel_now.valid()) (void)t->cancel(cancel_now);
}

void Context::Impl::on_watch(Peer* p, const na::Completion& c) {
    std::vector<ResponseFn> failed;
    std::vector<std::unique_ptr<LargeOut>> garbage;
    std::string who;
    na::Addr p_addr;
    bool repost = false;
    const bool failed_peer = c.status != Errc::canceled && c.status != Errc::ok;
    {
        CallsLock g(*this);  // logs the calls ended, after
        // Its poster has not taken the lock again since posting it (post_watch): the peer is
        // the poster's to keep or erase.
        const bool posting = p->watch_posting;
        if (posting) p->watch_fired = true;
        p->watch_posted = false;
        bool is_closing = closing.load(std::memory_order_relaxed);
        if (!failed_peer) {
            // Canceled: we retired it (idle peer) or are closing. Ok: someone sent our watch
            // tag; keep watching.
            if (posting) {
                // Nothing to do: its poster sees watch_fired.
            } else if (!is_closing && (!p->retiring || p->inflight > 0)) {
                repost = claim_watch_locked(p);
            } else if (p->inflight == 0) {
                if (last_peer == p) last_peer = nullptr;
                peers.erase(p->addr.impl()->canonical());  // frees p
            }
        } else {
            // The transport failed the peer: fail every call to it.
            for (uint32_t i = 0; i < slots.size(); ++i) {
                if (slots[i].seq != 0 && slots[i].peer == p) {
                    garbage.emplace_back();
                    failed.push_back(release_slot_locked(
                        i, garbage.back(), nullptr,
                        c.status == Errc::unreachable ? Errc::unreachable : Errc::disconnected));
                }
            }
            p_addr = p->addr;
            // Forget the failed peer (no call to it is left); a new call starts afresh.
            if (p->inflight == 0 && !is_closing && !posting) {
                if (last_peer == p) last_peer = nullptr;
                peers.erase(p->addr.impl()->canonical());  // frees p
            }
        }
    }
    if (!failed_peer) {
        // Reposted without the lock held across the transport call.
        if (repost) post_watch(p);
        return;
    }
    who = t->addr_to_string(p_addr);
    {
        // Nobody will pull the arguments of calls to a dead peer.
        std::lock_guard g(pend_mu);
        std::erase_if(held, [&](const PendingResult& h) { return h.dest == p_addr; });
    }
    if (!failed.empty())
        TALARIA_LOG(core, info, "context {}: peer {} failed ({}): {} calls fail", id, who,
                    errc_name(c.status), failed.size());
    Errc code = c.status == Errc::unreachable || c.status == Errc::access_denied
                    ? c.status
                    : Errc::disconnected;
    std::string why = failed.empty() ? std::string() : t->peer_failure(p_addr);
    for (auto& fn : failed) {
        CtxCounters::add(counters.errors);
        if (fn)
            run_response(fn, p_addr,
                         Error{code, fmt::format("the peer {} {}{}", who,
                                                 code == Errc::unreachable ? "cannot be reached"
                                                 : code == Errc::access_denied
                                                     ? "refused this client"
                                                     : "disconnected (closed or died)",
                                                 why.empty() ? "" : ": " + why)});
    }
}

CallsLock::~CallsLock() {
    if (c_.ended_lines.empty()) [[likely]] {
        c_.mu.unlock();
        return;
    }
    std::vector<std::string> lines;
    lines.swap(c_.ended_lines);
    c_.mu.unlock();
    for (const std::string& line : lines)
        TALARIA_LOG(rpc, trace, "{}", line);
}

ResponseFn Context::Impl::release_slot_locked(uint32_t idx, std::unique_ptr<LargeOut>& garbage,
                                              na::Addr* peer, Errc outcome, std::size_t bytes_in) {
    CallSlot& s = slots[idx];
    if (ProcCounters* pc = std::exchange(s.stats, nullptr)) {
        // Under mu: the client side's only writer (see ProcCounters).
        auto& c = pc->client;
        count_outcome(c, c.bytes_in, outcome, bytes_in, CtxCounters::bump);
        if (s.sent_at != 0) c.latency.record(ticks_since(s.sent_at));  // a timed call
    }
    if (s.logged_ns != 0) [[unlikely]] {
        // rpc=trace: written here, logged by CallsLock once mu is released (a log sink may
        // call into the engine).
        try {
            ended_lines.push_back(fmt::format(
                "call {} seq {:#x} to {}: {} ({} bytes back) after {} us, trace {:016x}",
                eng->name_of(s.rpc_id, s.provider), s.seq,
                s.peer ? t->addr_to_string(s.peer->addr) : std::string("?"), errc_name(outcome),
                bytes_in, (now_ns() - s.logged_ns) / 1000, s.trace));
        } catch (...) {  // out of memory: the line is lost, the call is not
        }
        s.logged_ns = 0;
    }
    ResponseFn fn = std::move(s.done);
    s.done = nullptr;
    if (s.heap >= 0) heap_remove_locked(idx);
    s.retry_at = TimePoint{};
    s.retry.reset();
    if (s.peer) {
        if (peer) *peer = s.peer->addr;
        --s.peer->inflight;
        if (s.queued) {
            s.queued = false;
            --s.peer->queued;
            // Its backlog entry is skipped when reached. Calls that time out or are canceled
            // while a stalled peer holds every credit would pile such entries up without
            // bound: drop them once they outnumber the live ones.
            Peer* p = s.peer;
            if (p->backlog.size() > 2 * std::size_t(p->queued) + 16)
                std::erase_if(p->backlog, [this](const std::pair<uint32_t, uint32_t>& e) {
                    return slots[e.first].seq != e.second || !slots[e.first].queued;
                });
        } else if (s.peer->queued) {
            pass_credit_locked(s.peer);
        }
        s.peer = nullptr;
    }
    garbage = std::move(s.large);
    s.seq = 0;
    s.next_free = free_head;
    free_head = idx;
    inflight.store(inflight.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    return fn;
}

Result<void> Context::Impl::check_forward(const na::Addr& dest) const {
    if (t->inherited()) [[unlikely]]
        return self->engine().inherited_error("forward");
    if (!dest || dest.impl()->transport() != t)
        return Error{Errc::invalid_argument,
                     "forward: the destination address is empty or belongs to another transport"};
    if (closing.load(std::memory_order_relaxed))
        return Error{Errc::shutdown, "forward: the engine is shutting down"};
    return ok();
}

Result<CallId> Context::Impl::forward(const na::Addr& dest, RpcId rpc,
                                      std::span<const std::byte> args, const CallOptions& opts,
                                      ResponseFn done, SendBuf* filled) {
    BufGuard guard{this, filled};
    TALARIA_CHECK(check_forward(dest));
    const bool large = args.size() > eng->eager;
    if (large && args.size() > eng->opts.max_payload)
        return too_large(fmt::format("forward: {} bytes of arguments exceed", args.size()),
                         "pass the data as a talaria::Bulk the handler pulls");

    // Large arguments: register a copy the target pulls, before taking the lock.
    std::unique_ptr<LargeOut> lo;
    std::vector<std::byte> desc;
    if (large) {
        auto r = make_large(args, desc);
        if (!r) return std::move(r).error();
        lo = std::move(*r);
    }

    // Sent again on a busy answer: the payload is kept (copied; only when asked for).
    const std::span<const std::byte> payload = large ? std::span<const std::byte>(desc) : args;
    std::unique_ptr<Retry> retry;
    if (opts.busy_retries > 0 && !opts.one_way) [[unlikely]]
        retry = keep_payload(payload, large, opts);

    uint32_t idx;
    uint32_t seq;
    TimePoint now{};        // read once, for a call with a deadline only
    bool queue_it = false;  // no credit with the peer: kept, sent when one comes back
    uint64_t trace = 0;
    Peer* watch = nullptr;  // a peer to watch, posted once the lock is released
    // A peer whose process is gone for good, and another may hold its name now (sm): the call
    // goes to whoever answers there (asked before the lock: the transport takes its own).
    na::Addr redirected;
    if (dest.impl()->superseded()) [[unlikely]]
        redirected = t->addr_current(dest);
    const na::Addr& to = redirected.valid() ? redirected : dest;
    {
        std::lock_guard g(mu);
        if (free_head == kNoSlot)
            return Error{Errc::again, fmt::format("context {}: {} calls already in flight "
                                                  "(Options::max_inflight); retry after progress",
                                                  id, slots.size())};
        idx = free_head;
        CallSlot& s = slots[idx];
        free_head = s.next_free;
        if (++s.gen == 0) s.gen = 1;
        seq = (uint32_t(s.gen) << 16) | idx;
        s.seq = seq;
        s.rpc_id = rpc;
        s.provider = opts.provider;
        s.trace = opts.trace_id != 0 ? opts.trace_id : tl_trace;
        s.one_way = opts.one_way;
        s.target_ctx = opts.target_context;
        s.done = std::move(done);
        s.large = std::move(lo);
        s.retry = std::move(retry);
        s.peer = peer_for_locked(to);
        ++s.peer->inflight;
        if (procs) {
            ProcCounters* pc = client_counters_locked(rpc, opts.provider);
            s.stats = pc;
            CtxCounters::bump(pc->client.calls);
            CtxCounters::bump(pc->client.bytes_out, args.size());
        }
        const uint32_t window = eng->opts.peer_window;
        if (window && s.peer->inflight - s.peer->queued > window) [[unlikely]] {
            // The payload, kept to be sent later (copied under the lock: rare).
            if (!s.retry) s.retry = keep_payload(payload, large, opts);
            s.queued = true;
            ++s.peer->queued;
            s.peer->backlog.emplace_back(idx, seq);
            queue_it = true;
        }
        if (claim_watch_locked(s.peer)) watch = s.peer;
        if (opts.timeout > Duration::zero()) {
            now = Clock::now();
            s.deadline = now + opts.timeout;
            heap_push_locked(idx);
        } else {
            s.deadline = TimePoint{};
        }
        if (s.stats) s.sent_at = client_timer.start(eng->tick_scale, quiet);
        if (log::enabled(log::Subsys::rpc, log::Level::trace)) [[unlikely]]
            s.logged_ns = now_ns();
        trace = s.trace;
        inflight.store(inflight.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }

    if (watch) post_watch(watch);      // before the call goes out, as a reply may fail it
    if (queue_it) return CallId{seq};  // counted in rpcs_sent when it goes out

    wire::Header h;
    h.flags = (opts.one_way ? wire::kOneWay : 0) | (large ? wire::kMore : 0);
    h.rpc_id = rpc;
    h.seq = seq;
    h.target_ctx = opts.target_context;
    h.reply_ctx = id;
    h.provider = opts.provider;
    h.signature = opts.signature;
    h.trace = trace;
    if (now != TimePoint{}) h.budget_us = budget_of(now + opts.timeout, now);
    TALARIA_LOG(rpc, trace, "call {} seq {:#x} to {} context {}: {} bytes{}, trace {:016x}",
                eng->name_of(rpc, opts.provider), seq, t->addr_to_string(to), opts.target_context,
                args.size(), opts.one_way ? ", one-way" : "", trace);
    auto r =
        send_message(to, h, payload, SendInfo{seq, opts.one_way, SendInfo::call}, guard.take());
    if (!r) {
        // Undo, unless a deadline or cancel on another thread already completed it.
        std::unique_ptr<LargeOut> garbage;
        ResponseFn fn;
        {
            CallsLock g(*this);  // logs the calls ended, after
            if (slots[idx].seq == seq) fn = release_slot_locked(idx, garbage, nullptr, r.code());
        }
        if (fn) return std::move(r).error();  // `done` never runs
        return CallId{seq};                   // it already ran (with timeout or canceled)
    }
    // Counted when posted (a caller may read the counters as soon as the response is in;
    // the send's own completion may still be queued then). A failed send counts in errors.
    CtxCounters::add(counters.rpcs_sent);
    CtxCounters::add(counters.bytes_sent, args.size());
    return CallId{seq};
}

void Context::Impl::on_call_sent(uint32_t seq, bool one_way, Errc status) {
    if (status == Errc::ok && one_way) {
        // A one-way call is done once sent, unless the target must still pull its arguments
        // (then its ack completes it).
        uint32_t idx = seq & 0xFFFF;
        bool done_now = false;
        {
            std::lock_guard g(mu);
            done_now = idx < slots.size() && slots[idx].seq == seq && slots[idx].one_way &&
                       !slots[idx].large;
        }
        if (done_now) complete_call(seq, nullptr, std::span<const std::byte>{}, false);
        return;
    }
    if (status == Errc::ok) return;
    // The transport's words for why its peer cannot be reached, where it keeps them (a refused
    // connection, with the remedy), else the status's name.
    std::string why;
    if (status == Errc::unreachable || status == Errc::disconnected ||
        status == Errc::protocol_error || status == Errc::access_denied) {
        na::Addr dest;
        {
            std::lock_guard g(mu);
            uint32_t idx = seq & 0xFFFF;
            if (idx < slots.size() && slots[idx].seq == seq && slots[idx].peer)
                dest = slots[idx].peer->addr;
        }
        if (dest.valid()) why = t->peer_failure(dest);
    }
    complete_call(
        seq, nullptr,
        Error{status == Errc::canceled ? Errc::canceled : status,
              why.empty() ? fmt::format("the call could not be sent: {}", errc_name(status)) : why},
        false);
}

bool Context::Impl::complete_call(uint32_t seq, const na::Addr* source,
                                  Result<std::span<const std::byte>> r, bool count_response) {
    uint32_t idx = seq & 0xFFFF;
    ResponseFn fn;
    std::unique_ptr<LargeOut> garbage;
    na::Addr kept;         // the peer, where no response names it (a one-way send, a local failure)
    Duration late_by{-1};  // >= 0: the response was read that long after the deadline
    {
        CallsLock g(*this);  // logs the calls ended, after
        if (idx >= slots.size() || slots[idx].seq != seq) return false;
        if (source && !(slots[idx].peer && slots[idx].peer->addr == *source)) return false;
        // A response read after the call's deadline, before the deadline timer ran (a loaded
        // host, a late progress call): the call timed out all the same. So the outcome does
        // not depend on which of the two the context reached first, and a handler that stops
        // at its deadline (Request::cancelled()) never has its partial answer taken for the
        // result: the target's deadline is never earlier than the caller's (budget_of).
        if (count_response && slots[idx].deadline != TimePoint{}) [[unlikely]] {
            const TimePoint now = Clock::now();
            if (now >= slots[idx].deadline) late_by = now - slots[idx].deadline;
        }
        fn = release_slot_locked(idx, garbage, source ? nullptr : &kept,
                                 late_by >= Duration::zero() ? Errc::timeout : r.code(),
                                 r ? r->size() : 0);
    }
    if (count_response) CtxCounters::bump(counters.responses_received);
    if (late_by >= Duration::zero()) [[unlikely]] {
        CtxCounters::bump(counters.timeouts);
        r = Error{
            Errc::timeout,
            fmt::format("{} (the response was read {} us after it)", kDeadlinePassed,
                        std::chrono::duration_cast<std::chrono::microseconds>(late_by).count())};
    } else if (!r) {
        CtxCounters::add(counters.errors);
    }
    if (fn) run_response(fn, source ? *source : kept, std::move(r));
    return true;
}

void Context::Impl::on_response(const wire::Header& h, std::span<const std::byte> payload,
                                const na::Addr& source) {
    if (h.flags & wire::kMore) {
        // Check that the call still waits before pulling anything.
        uint32_t idx = h.seq & 0xFFFF;
        bool live;
        {
            std::lock_guard g(mu);
            live = idx < slots.size() && slots[idx].seq == h.seq && slots[idx].peer &&
                   slots[idx].peer->addr == source;
        }
        if (live) {
            start_pull(h, payload, source);
        } else {
            release_held(h.seq, source);
            send_ack(source, h, false);  // let the target release the result now
        }
        return;
    }
    Duration hint = Duration::zero();
    if (h.flags & wire::kRetryAfter) [[unlikely]] {
        uint32_t ms = 0;
        for (int i = 0; i < 4; ++i)
            ms |= uint32_t(uint8_t(payload[std::size_t(i)])) << (8 * i);
        hint = std::chrono::milliseconds(ms);
        payload = payload.subspan(4);  // the decoder made sure the 4 bytes are there
    }
    if (h.status == uint16_t(Errc::busy) && schedule_retry(h.seq, source, hint)) [[unlikely]]
        return;
    bool matched;
    if (h.status == 0) {
        CtxCounters::bump(counters.bytes_received, payload.size());
        matched = complete_call(h.seq, &source, payload, true);
    } else {
        std::string text(reinterpret_cast<const char*>(payload.data()), payload.size());
        if (h.flags & wire::kRetryAfter)
            text +=
                fmt::format(" (the target asks to retry after {} ms)",
                            std::chrono::duration_cast<std::chrono::milliseconds>(hint).count());
        matched = complete_call(h.seq, &source, Error{static_cast<Errc>(h.status), std::move(text)},
                                true);
    }
    if (!matched) release_held(h.seq, source);
    if (!matched)
        TALARIA_LOG(core, debug,
                    "context {}: dropping a response to call {:#x}, which already completed "
                    "(deadline or cancel)",
                    id, h.seq);
}

Result<void> Context::Impl::cancel(CallId call) {
    uint32_t idx = call.seq & 0xFFFF;
    std::unique_ptr<LargeOut> garbage;
    na::Addr dest;
    wire::Header notice;  // flags stay 0 when the target is not told
    {
        CallsLock g(*this);  // logs the calls ended, after
        if (!call.valid() || idx >= slots.size() || slots[idx].seq != call.seq)
            return Error{Errc::not_found, "cancel: the call already completed"};
        const CallSlot& s = slots[idx];
        // The target hears of it (Request::cancelled()) when the call went out and something
        // waits for its answer there.
        const bool tell = !s.one_way && !s.queued && s.peer;
        const uint8_t target = s.target_ctx;
        const RpcId rpc = s.rpc_id;
        na::Addr peer;
        ResponseFn fn = release_slot_locked(idx, garbage, &peer, Errc::canceled);
        if (garbage || tell) dest = peer;
        if (tell) {
            notice.flags = wire::kCancel;
            notice.rpc_id = rpc;
            notice.seq = call.seq;
            notice.target_ctx = target;
            notice.reply_ctx = id;
            notice.status = static_cast<uint16_t>(Errc::canceled);
        }
        defer_locked(std::move(fn), std::move(peer),
                     Error{Errc::canceled, "the call was canceled"});
    }
    if (notice.flags != 0 && dest.valid()) {
        if (auto r = send_message(dest, notice, {}); !r)
            TALARIA_LOG(core, debug, "context {}: the cancel of call {:#x} was not sent: {}", id,
                        call.seq, r.error().describe());
    }
    if (garbage) hold_args(call.seq, std::move(dest), std::move(garbage));
    CtxCounters::add(counters.canceled);
    // Wake the thread driving this context so the completion runs promptly.
    (void)na->post([this](const na::Completion&) { run_deferred(); });
    return ok();
}

void Context::Impl::defer_locked(ResponseFn fn, na::Addr peer, Error e) {
    deferred.push_back(Deferred{std::move(fn), std::move(peer), std::move(e)});
    has_deferred.store(true, std::memory_order_release);
}

void Context::Impl::pass_credit_locked(Peer* p) {
    while (!p->backlog.empty()) {
        auto [idx, seq] = p->backlog.front();
        p->backlog.pop_front();
        CallSlot& s = slots[idx];
        if (s.seq != seq || !s.queued) continue;  // ended while it waited
        s.queued = false;
        --p->queued;
        credited.emplace_back(idx, seq);
        has_deferred.store(true, std::memory_order_release);
        return;
    }
}

void Context::Impl::send_credited() {
    std::vector<std::pair<uint32_t, uint32_t>> batch;
    {
        std::lock_guard g(mu);
        batch.swap(credited);
    }
    for (auto [idx, seq] : batch) {
        Resend r;
        {
            std::lock_guard g(mu);
            CallSlot& s = slots[idx];
            if (s.seq != seq || s.queued || !s.retry || !s.peer) continue;
            r = resend_of_locked(s);
        }
        if (send_kept(r, "sending a call that waited for a credit with its peer")) {
            CtxCounters::add(counters.rpcs_sent);
            CtxCounters::add(counters.bytes_sent, r.payload.size());
        }
    }
}

std::unique_ptr<Retry> Context::Impl::keep_payload(std::span<const std::byte> payload, bool large,
                                                   const CallOptions& opts) {
    auto r = std::make_unique<Retry>();
    r->payload.assign(payload.begin(), payload.end());
    r->flags = large ? wire::kMore : 0;
    r->target_ctx = opts.target_context;
    r->provider = opts.provider;
    r->signature = opts.signature;
    r->left = opts.one_way ? 0 : opts.busy_retries;
    r->backoff =
        opts.busy_backoff > Duration::zero() ? opts.busy_backoff : std::chrono::milliseconds(1);
    return r;
}

Context::Impl::Resend Context::Impl::resend_of_locked(const CallSlot& s) const {
    Resend r;
    r.dest = s.peer->addr;
    r.h.flags = uint8_t(s.retry->flags | (s.one_way ? wire::kOneWay : 0));
    r.h.rpc_id = s.rpc_id;
    r.h.seq = s.seq;
    r.h.target_ctx = s.retry->target_ctx;
    r.h.reply_ctx = id;
    r.h.provider = s.retry->provider;
    r.h.signature = s.retry->signature;
    r.h.trace = s.trace;
    r.h.budget_us = budget_of(s.deadline, Clock::now());
    r.payload = s.retry->payload;
    r.one_way = s.one_way;
    return r;
}

bool Context::Impl::send_kept(const Resend& r, std::string_view what) {
    auto sent = send_message(r.dest, r.h, r.payload, SendInfo{r.h.seq, r.one_way, SendInfo::call});
    if (sent) return true;
    complete_call(r.h.seq, nullptr,
                  Error{sent.code(), fmt::format("{}: {}", what, sent.error().message())}, false);
    return false;
}

unsigned Context::Impl::run_deferred() {
    if (!has_deferred.load(std::memory_order_acquire)) return 0;
    std::vector<Deferred> batch;
    bool sends;
    {
        std::lock_guard g(mu);
        batch.swap(deferred);
        sends = !credited.empty();
        has_deferred.store(false, std::memory_order_relaxed);
    }
    if (sends) send_credited();
    for (auto& d : batch)
        if (d.fn) run_response(d.fn, d.peer, std::move(d.error));
    return static_cast<unsigned>(batch.size());
}

// --- deadlines --------------------------------------------------------------------------------

void Context::Impl::publish_deadline_locked() {
    next_deadline_ns.store(heap.empty() ? INT64_MAX : to_ns(slots[heap[0]].due()),
                           std::memory_order_release);
}

void Context::Impl::heap_fix_locked(std::size_t i) {
    auto less = [&](std::size_t a, std::size_t b) {
        return slots[heap[a]].due() < slots[heap[b]].due();
    };
    auto swap_at = [&](std::size_t a, std::size_t b) {
        std::swap(heap[a], heap[b]);
        slots[heap[a]].heap = static_cast<int32_t>(a);
        slots[heap[b]].heap = static_cast<int32_t>(b);
    };
    while (i > 0 && less(i, (i - 1) / 2)) {
        swap_at(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        std::size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap.size() && less(l, m)) m = l;
        if (r < heap.size() && less(r, m)) m = r;
        if (m == i) break;
        swap_at(i, m);
        i = m;
    }
}

void Context::Impl::heap_push_locked(uint32_t idx) {
    heap.push_back(idx);
    slots[idx].heap = static_cast<int32_t>(heap.size() - 1);
    heap_fix_locked(heap.size() - 1);
    publish_deadline_locked();
}

void Context::Impl::heap_remove_locked(uint32_t idx) {
    auto i = static_cast<std::size_t>(slots[idx].heap);
    slots[idx].heap = -1;
    uint32_t last = heap.back();
    heap.pop_back();
    if (i < heap.size()) {
        heap[i] = last;
        slots[last].heap = static_cast<int32_t>(i);
        heap_fix_locked(i);
    }
    publish_deadline_locked();
}

unsigned Context::Impl::expire_timers() {
    if (next_deadline_ns.load(std::memory_order_acquire) == INT64_MAX) return 0;
    auto now = Clock::now();
    if (to_ns(now) < next_deadline_ns.load(std::memory_order_acquire)) return 0;
    std::vector<std::pair<ResponseFn, na::Addr>> expired;
    std::vector<std::tuple<uint32_t, na::Addr, std::unique_ptr<LargeOut>>> large;
    std::vector<Resend> resend;
    {
        CallsLock g(*this);  // logs the calls ended, after
        while (!heap.empty() && slots[heap[0]].due() <= now) {
            CallSlot& s = slots[heap[0]];
            if (s.retry_at != TimePoint{}) {
                // A call answered busy: send it again now, under its deadline again.
                uint32_t idx = heap[0];
                s.retry_at = TimePoint{};
                if (s.deadline != TimePoint{})
                    heap_fix_locked(0);
                else
                    heap_remove_locked(idx);
                resend.push_back(resend_of_locked(s));
                continue;
            }
            uint32_t seq = slots[heap[0]].seq;
            na::Addr peer;
            std::unique_ptr<LargeOut> args;
            ResponseFn fn = release_slot_locked(heap[0], args, &peer, Errc::timeout);
            if (args) large.emplace_back(seq, peer, std::move(args));
            expired.emplace_back(std::move(fn), std::move(peer));
        }
        publish_deadline_locked();
    }
    for (auto& r : resend) {
        CtxCounters::add(counters.busy_retries);
        (void)send_kept(r, "sending the call again after a busy answer");
    }
    for (auto& [seq, dest, args] : large)
        hold_args(seq, std::move(dest), std::move(args));
    for (auto& [fn, peer] : expired) {
        CtxCounters::bump(counters.timeouts);
        if (fn) run_response(fn, peer, Error{Errc::timeout, std::string(kDeadlinePassed)});
    }
    return static_cast<unsigned>(expired.size());
}

// --- housekeeping -----------------------------------------------------------------------------

bool Context::Impl::schedule_retry(uint32_t seq, const na::Addr& source, Duration hint) {
    uint32_t idx = seq & 0xFFFF;
    std::lock_guard g(mu);
    if (idx >= slots.size() || slots[idx].seq != seq) return false;
    CallSlot& s = slots[idx];
    if (!s.retry || s.retry->left == 0 || s.retry_at != TimePoint{} || !s.peer ||
        !(s.peer->addr == source))
        return false;
    // +-25% so that callers refused together do not come back together.
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    const auto base = std::chrono::duration_cast<std::chrono::nanoseconds>(s.retry->backoff);
    auto wait = base * 3 / 4 + std::chrono::nanoseconds(rng % uint64_t(base.count() / 2 + 1));
    if (const auto h = std::chrono::duration_cast<std::chrono::nanoseconds>(hint); wait < h)
        wait = h + std::chrono::nanoseconds(rng % uint64_t(h.count() / 4 + 1));  // never sooner
    const TimePoint at = Clock::now() + wait;
    if (s.deadline != TimePoint{} && at >= s.deadline) return false;  // busy it is
    --s.retry->left;
    s.retry->backoff = std::min<Duration>(s.retry->backoff * 2, std::chrono::seconds(1));
    s.retry_at = at;
    if (s.heap >= 0) {
        heap_fix_locked(std::size_t(s.heap));
        publish_deadline_locked();
    } else {
        heap_push_locked(idx);
    }
    return true;
}

void Context::Impl::sweep(TimePoint now) {
    next_sweep = now + kSweepPeriod;
    refusal_logged = false;  // one refusal line per sweep period
    trim_loads();
    clear_cancels_if_idle();
    expire_pending(now);
    expire_pulls(now);
    std::vector<na::OpId> retire;  // canceled once the lock is released (stale ids are safe)
    {
        std::lock_guard g(mu);
        for (auto& [key, p] : peers) {
            if (p->inflight != 0 || !p->watch_posted || p->retiring) continue;
            if (++p->idle_sweeps < kIdleSweeps) continue;
            p->retiring = true;
            retire.push_back(p->watch);  // on_watch erases it
        }
    }
    for (na::OpId w : retire)
        (void)t->cancel(w);
}

// --- shutdown ---------------------------------------------------------------------------------

void Context::Impl::begin_shutdown() {
    closing.store(true, std::memory_order_relaxed);
    close_cancel_watches();
    std::vector<na::OpId> watches;
    std::vector<std::pair<ResponseFn, na::Addr>> failed;
    std::vector<std::unique_ptr<LargeOut>> garbage;
    {
        CallsLock g(*this);  // logs the calls ended, after
        for (uint32_t i = 0; i < slots.size(); ++i) {
            if (slots[i].seq == 0) continue;
            garbage.emplace_back();
            na::Addr peer;
            ResponseFn fn = release_slot_locked(i, garbage.back(), &peer, Errc::shutdown);
            failed.emplace_back(std::move(fn), std::move(peer));
        }
        for (auto& [key, p] : peers)
            if (p->watch_posted) watches.push_back(p->watch);
    }
    for (na::OpId w : watches)  // without the lock (stale ids are refused safely)
        (void)t->cancel(w);
    run_deferred();
    for (auto& [fn, peer] : failed)
        if (fn)
            run_response(fn, peer,
                         Error{Errc::shutdown, "the engine was destroyed with the call in flight"});
    std::vector<na::OpId> pulling;  // canceled where the transport can (a peer may never serve)
    {
        std::lock_guard g(pend_mu);
        pending.clear();
        held.clear();
        for (PullJob* j : pull_jobs)
            if (j->posted) pulling.push_back(j->op);
    }
    for (na::OpId op : pulling)
        (void)t->cancel(op);
    for (auto& rs : recvs)
        if (rs->posted) (void)t->cancel(rs->op);
}

bool Context::Impl::drained() const {
    for (auto& rs : recvs)
        if (rs->posted) return false;
    for (auto& [key, p] : peers)
        if (p->watch_posted || p->watch_posting) return false;
    if (pulls.load() != 0) return false;
    std::lock_guard g(pool_mu);  // a responder on another thread may hold a buffer
    return free_bufs.size() == all_bufs.size();
}

// --- Context ----------------------------------------------------------------------------------

Context::Context(Engine* e, std::unique_ptr<Impl> impl) : engine_(e), impl_(std::move(impl)) {
    impl_->self = this;
}
Context::~Context() = default;

uint8_t Context::id() const noexcept {
    return impl_->id;
}
na::Context& Context::na_context() const noexcept {
    return *impl_->na;
}

Result<CallId> Context::forward(const na::Addr& dest, RpcId id, std::span<const std::byte> args,
                                const CallOptions& opts, ResponseFn done) {
    return impl_->forward(dest, id, args, opts, std::move(done));
}

Result<CallId> Context::forward_in_place(const na::Addr& dest, RpcId id, PayloadWriter write,
                                         const CallOptions& opts, ResponseFn done) {
    TALARIA_CHECK(impl_->check_forward(dest));  // before a buffer is taken and filled
    TALARIA_TRY(w, impl_->write_payload(write));
    return impl_->forward(dest, id, w.bytes, opts, std::move(done), w.buf);
}

Result<void> Context::cancel(CallId call) {
    if (impl_->t->inherited()) [[unlikely]]
        return engine().inherited_error("cancel");
    return impl_->cancel(call);
}

namespace {
/// The peer of the completion running on this thread (Context::response_peer()).
thread_local const na::Addr* t_response_peer = nullptr;
}  // namespace

const na::Addr* Context::response_peer() noexcept {
    return t_response_peer;
}

void Context::Impl::run_response(ResponseFn& fn, const na::Addr& peer,
                                 Result<std::span<const std::byte>> r) {
    // Nested completions (a callback that drives a context) restore the outer peer, also
    // when a callback throws.
    struct Scope {
        const na::Addr* outer;
        explicit Scope(const na::Addr* p) noexcept : outer(std::exchange(t_response_peer, p)) {}
        ~Scope() { t_response_peer = outer; }
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;
    } scope(peer.valid() ? &peer : nullptr);
    fn(std::move(r));
}

Result<void> Context::progress(Duration timeout) {
    Impl& im = *impl_;
    if (im.t->inherited()) [[unlikely]]
        return engine().inherited_error("progress");
    if (im.has_deferred.load(std::memory_order_acquire)) [[unlikely]]
        return ok();
    int64_t dl = im.next_deadline_ns.load(std::memory_order_acquire);
    if (dl == INT64_MAX) [[likely]] {
        // The busy-poll path: straight to the transport (which returns at once when
        // completions are queued), no clock read.
        if (timeout == Duration::zero()) return im.na->progress(timeout);
        const uint64_t before = im.quiet.before_wait();
        auto r = im.na->progress(timeout);
        im.quiet.after_wait(before, im.eng->tick_scale);
        // An idle context (blocking mode) triggers rarely: do the housekeeping here.
        if (!r && r.code() == Errc::timeout && timeout > Duration::zero()) im.maybe_sweep_idle();
        return r;
    }
    int64_t now = to_ns(Clock::now());
    if (now >= dl) return ok();
    Duration until{dl - now};
    bool capped = timeout < Duration::zero() || until < timeout;
    const uint64_t before = timeout != Duration::zero() ? im.quiet.before_wait() : 0;
    auto r = im.na->progress(capped ? until : timeout);
    im.quiet.after_wait(before, im.eng->tick_scale);
    if (!r && r.code() == Errc::timeout && capped) return ok();  // a deadline is due
    return r;
}

void Context::Impl::maybe_sweep_idle() {
    auto now = Clock::now();
    if (now >= next_sweep) sweep(now);
}

unsigned Context::trigger(unsigned max) {
    Impl& im = *impl_;
    if (im.t->inherited()) [[unlikely]]
        return 0;  // a child across fork(): the parent's completions are not its to run
    struct Mark {
        const Impl* prev = tl_triggering;
        explicit Mark(const Impl* i) noexcept { tl_triggering = i; }
        ~Mark() { tl_triggering = prev; }
        Mark(const Mark&) = delete;
        Mark& operator=(const Mark&) = delete;
    } mark(&im);
    unsigned n = im.na->trigger(max);
    im.quiet.triggered(n, im.eng->tick_scale);  // one compare when calls come
    // Each check is one load when nothing is due (the busy-poll loop calls this constantly).
    if (im.next_deadline_ns.load(std::memory_order_relaxed) != INT64_MAX) n += im.expire_timers();
    if (im.has_deferred.load(std::memory_order_relaxed)) [[unlikely]]
        n += im.run_deferred();
    // Housekeeping about once a second, reading the clock once every 1024 calls.
    if ((++im.trigger_calls & 1023) == 0) [[unlikely]] {
        auto now = Clock::now();
        if (now >= im.next_sweep) im.sweep(now);
    }
    return n;
}

int Context::wait_fd() const noexcept {
    return impl_->na->wait_fd();
}

bool Context::try_wait() {
    if (impl_->t->inherited()) [[unlikely]]
        return false;  // progress() answers at once
    if (impl_->has_deferred.load(std::memory_order_acquire)) return false;
    if (next_deadline() <= Clock::now()) return false;
    return impl_->na->try_wait();
}

TimePoint Context::next_deadline() const noexcept {
    int64_t dl = impl_->next_deadline_ns.load(std::memory_order_acquire);
    if (dl == INT64_MAX) return TimePoint::max();
    return TimePoint(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(dl)));
}

std::size_t Context::in_flight() const noexcept {
    return impl_->inflight.load(std::memory_order_relaxed);
}

}  // namespace talaria::core
