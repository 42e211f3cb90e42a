// Core contexts, receiving side: posted receives, dispatch to handlers, responses, large
// payloads (pull + ack), and core::Request.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "core/core_impl.hpp"
#include "talaria/util/crc32c.hpp"
#include "talaria/util/log.hpp"

namespace talaria::core {
namespace {
std::span<const std::byte> as_bytes(const std::string& s) noexcept {
    return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
/// The not_found answer to an id (and provider) nothing is registered for; it starts with
/// kNoRpcMessage, by which the API tells it from a handler's own not_found.
std::string no_rpc_message(const wire::Header& h, const std::string& where) {
    if (h.provider == 0)
        return fmt::format("{} {:#010x} is registered at {}", kNoRpcMessage, h.rpc_id, where);
    return fmt::format("{} {:#010x} is registered at {} for provider {}", kNoRpcMessage, h.rpc_id,
                       where, h.provider);
}
/// A Request::on_cancel function: what it throws is logged, never let out into the receive
/// path.
void run_cancel_watch(std::function<void()>& fn, uint8_t ctx) noexcept {
    try {
        fn();
    } catch (const std::exception& e) {
        TALARIA_LOG(core, warn, "context {}: a cancel watch threw: {}", ctx, e.what());
    } catch (...) {
        TALARIA_LOG(core, warn, "context {}: a cancel watch threw a non-standard exception", ctx);
    }
}
}  // namespace

Error Context::Impl::too_large(std::string what, std::string_view instead) const {
    return Error{Errc::message_too_large,
                 fmt::format("{} the {} bytes that {} sends or accepts (core.max_payload in its "
                             "config, EngineOptions::core.max_payload in code): raise it on both "
                             "sides, or {}",
                             what, eng->opts.max_payload, eng->self_string, instead)};
}

// --- receives ---------------------------------------------------------------------------------

void Context::Impl::post_recv(RecvSlot& rs) {
    if (closing.load(std::memory_order_relaxed)) return;
    RecvSlot* p = &rs;
    auto r = t->post_recv_unexpected(
        *na, [p](const na::Completion& c) { p->impl->on_recv(*p, c); }, rs.buf);
    if (r) {
        rs.op = *r;
        rs.posted = true;
    } else {
        // The transport queues what arrives meanwhile; the next completion reposts.
        ++recvs_down;
        CtxCounters::add(counters.errors);
        TALARIA_LOG(core, warn, "context {}: could not post a receive: {}", id,
                    r.error().describe());
    }
}

void Context::Impl::on_recv(RecvSlot& rs, const na::Completion& c) {
    rs.posted = false;
    if (closing.load(std::memory_order_relaxed)) return;
    if (c.status == Errc::ok) [[likely]] {
        rs.busy = true;
        handle_message({rs.buf.data(), c.size}, c.source, c.context_id);
        rs.busy = false;
    } else if (c.status != Errc::canceled) {
        CtxCounters::add(counters.errors);
        TALARIA_LOG(core, warn, "context {}: a receive failed: {}", id, errc_name(c.status));
    }
    post_recv(rs);
    if (recvs_down != 0) [[unlikely]] {
        // Some receive failed to post earlier: retry them all now.
        recvs_down = 0;
        for (auto& r : recvs)
            if (!r->posted && !r->busy) post_recv(*r);
    }
}

void Context::Impl::handle_message(std::span<const std::byte> msg, const na::Addr& source,
                                   uint8_t named_ctx) {
    auto h = wire::decode_header(msg);
    if (!h) [[unlikely]] {
        CtxCounters::add(counters.errors);
        if (auto unlogged = malformed_log.admit())
            TALARIA_LOG(core, warn, "context {}: dropping a message from {}: {}{}", id,
                        t->addr_describe(source), h.error().describe(), log::held_back(*unlogged));
        if (source && source.impl()->note_malformed() >= kMalformedInARow) [[unlikely]] {
            // Not a Talaria peer of this version, or a hostile one: no more of it.
            source.impl()->clear_malformed();
            (void)t->addr_disconnect(
                source, fmt::format("{} messages in a row that are not RPC messages of this "
                                    "version (the last: {})",
                                    kMalformedInARow, h.error().message()));
        }
        return;
    }
    if (source) [[likely]]
        source.impl()->clear_malformed();  // "in a row": one load when there were none
    auto payload = msg.subspan(wire::kHeaderSize);
    if (named_ctx != id) [[unlikely]] {
        // The sender named a context this engine does not have; the transport handed the
        // message to us (the lowest context) so the caller hears of it instead of waiting.
        CtxCounters::add(counters.errors);
        if ((h->flags & (wire::kResponse | wire::kAck | wire::kOneWay)) == 0)
            (void)send_reply(
                source, h->seq, h->rpc_id, h->reply_ctx, Errc::not_found,
                as_bytes(fmt::format("context {} does not exist at {} (it has {})", named_ctx,
                                     eng->self_string, eng->contexts.size())),
                nullptr, h->trace);
        else if (auto unlogged = missing_context_log.admit())
            TALARIA_LOG(core, warn,
                        "context {}: dropping a message from {} for context {}, "
                        "which does not exist{}",
                        id, t->addr_describe(source), named_ctx, log::held_back(*unlogged));
        // A large one-way call waits for an ack: fail it rather than leave it waiting.
        if ((h->flags & (wire::kOneWay | wire::kMore)) == (wire::kOneWay | wire::kMore) &&
            !(h->flags & (wire::kResponse | wire::kAck)))
            send_ack(source, *h, true, Errc::not_found);
        return;
    }
    if (h->flags & wire::kResponse) return on_response(*h, payload, source);
    if (h->flags & wire::kAck) return on_ack(*h, source);
    if (h->flags & wire::kCancel) [[unlikely]]
        return on_cancel(*h, source);
    CtxCounters::bump(counters.rpcs_received);
    if (h->flags & wire::kMore) return start_pull(*h, payload, source);
    CtxCounters::bump(counters.bytes_received, payload.size());
    dispatch(*h, payload, source);
}

void Context::Impl::dispatch(const wire::Header& h, std::span<const std::byte> input,
                             const na::Addr& source) {
    Request req;
    req.ctx_ = self;
    req.lent_source_ = &source;
    req.input_ = input;
    req.rpc_id_ = h.rpc_id;
    req.seq_ = h.seq;
    req.reply_ctx_ = h.reply_ctx;
    req.one_way_ = (h.flags & wire::kOneWay) != 0;
    req.provider_ = h.provider;
    req.trace_ = h.trace;
    if (h.budget_us != 0) req.deadline_ = Clock::now() + std::chrono::microseconds(h.budget_us);
    RpcEntry* e = eng->registry.find(h.rpc_id, h.provider);
    if (!e) [[unlikely]] {
        CtxCounters::add(counters.errors);
        if (req.one_way_) {
            // Nothing answers it, so the log is all a caller gets: at most a line a second,
            // as for calls (a peer must not turn header-sized messages into log lines).
            if (auto unlogged = unknown_rpc_log.admit())
                TALARIA_LOG(core, warn,
                            "context {}: one-way call of unregistered RPC {:#010x} (provider {}) "
                            "from {} dropped{}",
                            id, h.rpc_id, h.provider, t->addr_describe(source),
                            log::held_back(*unlogged));
            req.ctx_ = nullptr;
            return;
        }
        if (auto unlogged = unknown_rpc_log.admit())
            TALARIA_LOG(core, warn,
                        "context {}: {} called RPC {:#010x}{}, which is not registered here: "
                        "answered not_found{}",
                        id, t->addr_describe(source), h.rpc_id,
                        h.provider ? fmt::format(" for provider {}", h.provider) : std::string(),
                        log::held_back(*unlogged));
        (void)req.respond_error(Errc::not_found, no_rpc_message(h, eng->self_string));
        return;
    }
    if (procs) {
        uint32_t index = e->stats_index.load(std::memory_order_relaxed);
        if (index == RpcEntry::kNoStatsIndex) [[unlikely]] {
            index = eng->stats_index.index(h.rpc_id, h.provider);
            e->stats_index.store(index, std::memory_order_relaxed);
        }
        ProcCounters* pc = counters_at(index);
        CtxCounters::bump(pc->server.calls);
        CtxCounters::bump(pc->server.bytes_in, input.size());
        req.stats_ = pc;
        req.started_ = server_timer.start(eng->tick_scale, quiet);  // 0: not timed
    }
    if (h.signature != 0 && e->signature != 0 && h.signature != e->signature) [[unlikely]] {
        CtxCounters::add(counters.errors);
        std::string why =
            fmt::format("{} {} registered '{}' as {}: the caller's argument or result types differ",
                        kSignatureMessage, eng->self_string, e->name, e->signature_text);
        if (req.one_way_) {
            if (auto unlogged = signature_log.admit())
                TALARIA_LOG(core, warn, "context {}: one-way call from {} dropped: {}{}", id,
                            t->addr_describe(source), why, log::held_back(*unlogged));
            req.note_answered(Errc::invalid_argument, 0);
            req.ctx_ = nullptr;
            return;
        }
        if (auto unlogged = signature_log.admit())
            TALARIA_LOG(core, warn, "context {}: a call from {} refused: {}{}", id,
                        t->addr_describe(source), why, log::held_back(*unlogged));
        (void)req.respond_error(Errc::invalid_argument, why);
        return;
    }
    auto load = admit(source);
    if (!load) [[unlikely]] {
        if (req.one_way_) {
            req.note_answered(Errc::busy, 0);
            req.ctx_ = nullptr;  // nobody to tell: dropped, counted in busy_refused
            return;
        }
        (void)req.respond_error(Errc::busy, load.error().message());
        return;
    }
    if (PeerLoad* l = *load) {
        l->held.fetch_add(1, std::memory_order_relaxed);
        held_requests.fetch_add(1, std::memory_order_relaxed);
        req.load_ = l;
    }
    if (log::enabled(log::Subsys::rpc, log::Level::trace)) [[unlikely]] {
        req.logged_ns_ = now_ns();
        TALARIA_LOG(rpc, trace,
                    "serve {} seq {:#x} from {} on context {}: {} bytes{}, trace {:016x}", e->name,
                    h.seq, t->addr_to_string(source), id, input.size(),
                    req.one_way_ ? ", one-way" : "", h.trace);
    }
    TraceScope trace(h.trace);  // the calls the handler makes carry its caller's trace id
    // A handler that throws: counted, and its caller told (a one-way one counts internal).
    auto threw = [&](const char* what) {
        CtxCounters::add(counters.errors);
        if (!req.valid()) return;
        if (req.one_way()) {
            (void)req.note_answered(Errc::internal, 0);
        } else if (!req.responded()) {
            (void)req.respond_error(
                Errc::internal,
                what ? fmt::format("handler '{}' threw: {}", e->name, what)
                     : fmt::format("handler '{}' threw a non-standard exception", e->name));
        }
    };
    try {
        e->handler(req);
    } catch (const std::exception& ex) {
        threw(ex.what());
    } catch (...) {
        threw(nullptr);
    }
    // A request the handler neither answered nor kept is answered by its destructor.
}

// --- cancel notices ---------------------------------------------------------------------------

void Context::Impl::on_cancel(const wire::Header& h, const na::Addr& source) {
    const CancelNotice n = CancelNotice::of(source, h.seq, h.reply_ctx);
    std::vector<std::function<void()>> run;
    {
        std::lock_guard g(cancel_mu);
        // Bounded: a notice for a request that already finished (the cancel crossed the
        // answer) is never looked up; the oldest goes first, and sweep() clears them all once
        // nothing is held.
        if (cancels.size() >= kMaxCancelNotices) cancels.pop_front();
        cancels.push_back(n);
        n_cancels.store(cancels.size(), std::memory_order_release);
        for (auto it = cancel_watchers.begin(); it != cancel_watchers.end();) {
            if (it->call == n) {
                run.push_back(std::move(it->fn));
                it = cancel_watchers.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto& fn : run)
        run_cancel_watch(fn, id);
}

uint64_t Context::Impl::watch_cancel(const na::Addr& source, uint32_t seq, uint8_t reply_ctx,
                                     std::function<void()>& fn) {
    const CancelNotice call = CancelNotice::of(source, seq, reply_ctx);
    std::lock_guard g(cancel_mu);
    if (watches_closed) return 0;  // shutting down: every call is ending
    if (std::find(cancels.begin(), cancels.end(), call) != cancels.end()) return 0;
    const uint64_t watch = ++next_watch;
    cancel_watchers.push_back(CancelWatcher{call, watch, std::move(fn)});
    return watch;
}

void Context::Impl::unwatch_cancel(uint64_t watch) noexcept {
    std::function<void()> gone;  // destroyed after the lock (it may hold what takes locks)
    std::lock_guard g(cancel_mu);
    for (auto it = cancel_watchers.begin(); it != cancel_watchers.end(); ++it)
        if (it->id == watch) {
            gone = std::move(it->fn);
            cancel_watchers.erase(it);
            break;
        }
}

void Context::Impl::forget_cancel(const na::Addr& source, uint32_t seq,
                                  uint8_t reply_ctx) noexcept {
    const CancelNotice call = CancelNotice::of(source, seq, reply_ctx);
    std::lock_guard g(cancel_mu);
    if (auto it = std::find(cancels.begin(), cancels.end(), call); it != cancels.end()) {
        cancels.erase(it);
        n_cancels.store(cancels.size(), std::memory_order_release);
    }
}

void Context::Impl::close_cancel_watches() noexcept {
    std::vector<CancelWatcher> gone;  // destroyed after the lock: a function may own a watch
    std::lock_guard g(cancel_mu);
    watches_closed = true;
    gone.swap(cancel_watchers);
}

CancelWatch Request::on_cancel(std::function<void()> fn) const {
    CancelWatch w;
    if (!ctx_ || !fn) return w;
    const uint64_t watch = ctx_->impl_->watch_cancel(source(), seq_, reply_ctx_, fn);
    if (watch == 0) {  // the notice came already
        run_cancel_watch(fn, ctx_->id());
        return w;
    }
    w.ctx_ = ctx_;
    w.id_ = watch;
    return w;
}

void CancelWatch::reset() noexcept {
    if (ctx_) ctx_->impl_->unwatch_cancel(id_);
    ctx_ = nullptr;
    id_ = 0;
}

bool Context::Impl::cancel_noticed(const na::Addr& source, uint32_t seq,
                                   uint8_t reply_ctx) const noexcept {
    if (n_cancels.load(std::memory_order_acquire) == 0) return false;
    const CancelNotice call = CancelNotice::of(source, seq, reply_ctx);
    std::lock_guard g(cancel_mu);
    return std::find(cancels.begin(), cancels.end(), call) != cancels.end();
}

void Context::Impl::clear_cancels_if_idle() noexcept {
    if (n_cancels.load(std::memory_order_relaxed) == 0) return;
    if (eng->opts.max_requests == 0 && eng->opts.max_requests_per_peer == 0) return;
    if (held_requests.load(std::memory_order_acquire) != 0) return;
    std::lock_guard g(cancel_mu);
    cancels.clear();
    n_cancels.store(0, std::memory_order_release);
}

bool Context::Impl::call_ended(TimePoint deadline, const na::Addr& source, uint32_t seq,
                               uint8_t reply_ctx) const noexcept {
    if (deadline != TimePoint::max() && Clock::now() >= deadline) return true;
    return cancel_noticed(source, seq, reply_ctx);
}

bool Request::cancelled() const noexcept {
    return ctx_ && ctx_->impl_->call_ended(deadline_, source(), seq_, reply_ctx_);
}

CancelRef Request::cancel_ref() const {
    CancelRef r;
    if (!ctx_) return r;
    r.ctx_ = ctx_;
    r.source_ = source();
    r.seq_ = seq_;
    r.reply_ctx_ = reply_ctx_;
    r.deadline_ = deadline_;
    return r;
}

bool CancelRef::cancelled() const noexcept {
    return ctx_ && ctx_->impl_->call_ended(deadline_, source_, seq_, reply_ctx_);
}

// --- responses and acks -----------------------------------------------------------------------

Result<void> Context::Impl::send_reply(const na::Addr& dest, uint32_t seq, RpcId rpc,
                                       uint8_t dest_ctx, Errc status,
                                       std::span<const std::byte> out, SendBuf* filled,
                                       uint64_t trace) {
    BufGuard guard{this, filled};
    wire::Header h;
    h.flags = wire::kResponse;
    h.trace = trace;
    h.rpc_id = rpc;
    h.seq = seq;
    h.target_ctx = dest_ctx;
    h.reply_ctx = id;
    h.status = static_cast<uint16_t>(status);
    if (status != Errc::ok && out.size() > eng->eager) out = out.first(eng->eager);
    // A busy answer carries the retry-after hint first (the error path: a copy is fine).
    std::vector<std::byte> hinted;
    if (status == Errc::busy && eng->opts.busy_retry_after > Duration::zero()) [[unlikely]] {
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(eng->opts.busy_retry_after);
        const auto hint = uint32_t(std::min<int64_t>(ms.count(), UINT32_MAX));
        hinted.resize(4 + std::min(out.size(), eng->eager - 4));
        for (int i = 0; i < 4; ++i)
            hinted[std::size_t(i)] = std::byte(uint8_t(hint >> (8 * i)));
        std::copy_n(out.begin(), hinted.size() - 4, hinted.begin() + 4);
        out = hinted;
        h.flags |= wire::kRetryAfter;
    }
    const uint64_t counted = status == Errc::ok ? out.size() : 0;
    if (out.size() <= eng->eager) {
        auto r = send_message(dest, h, out, SendInfo{0, false, SendInfo::response}, guard.take());
        if (!r) return r;
    } else {
        if (out.size() > eng->opts.max_payload)
            return too_large(fmt::format("respond: {} bytes of result exceed", out.size()),
                             "answer with a talaria::Bulk the caller pulls");
        std::vector<std::byte> desc;
        TALARIA_TRY(lo, make_large(out, desc));
        h.flags |= wire::kMore;
        {
            std::lock_guard g(pend_mu);
            pending.push_back(
                PendingResult{dest, seq, Clock::now() + eng->opts.ack_linger, std::move(lo)});
        }
        auto r = send_message(dest, h, desc, SendInfo{0, false, SendInfo::response});
        if (!r) {
            std::lock_guard g(pend_mu);
            for (auto it = pending.begin(); it != pending.end(); ++it)
                if (it->seq == seq && it->dest == dest) {
                    pending.erase(it);
                    break;
                }
            return r;
        }
    }
    CtxCounters::add(counters.responses_sent);  // when posted (any thread may respond)
    CtxCounters::add(counters.bytes_sent, counted);
    return ok();
}

void Context::Impl::send_ack(const na::Addr& dest, const wire::Header& of, bool one_way_ack,
                             Errc status) {
    wire::Header h;
    h.flags = wire::kAck | (one_way_ack ? wire::kOneWay : 0);
    h.status = static_cast<uint16_t>(status);
    h.rpc_id = of.rpc_id;
    h.seq = of.seq;
    h.target_ctx = of.reply_ctx;
    h.reply_ctx = id;
    if (auto r = send_message(dest, h, {}); !r)
        TALARIA_LOG(core, debug, "context {}: ack not sent: {}", id, r.error().describe());
}

void Context::Impl::on_ack(const wire::Header& h, const na::Addr& source) {
    if (h.flags & wire::kOneWay) {
        // The target pulled the large arguments of our one-way call (or could not: status):
        // it is complete.
        Result<std::span<const std::byte>> r = std::span<const std::byte>{};
        if (h.status != 0)
            r = Error{static_cast<Errc>(h.status),
                      "the target could not pull the arguments of the one-way call"};
        if (!complete_call(h.seq, &source, std::move(r), false)) release_held(h.seq, source);
        return;
    }
    // The caller pulled a large result: release it.
    std::unique_ptr<LargeOut> garbage;
    {
        std::lock_guard g(pend_mu);
        for (auto it = pending.begin(); it != pending.end(); ++it) {
            if (it->seq == h.seq && it->dest == source) {
                garbage = std::move(it->out);
                pending.erase(it);
                break;
            }
        }
    }
}

void Context::Impl::hold_args(uint32_t seq, na::Addr dest, std::unique_ptr<LargeOut> args) {
    std::lock_guard g(pend_mu);
    held.push_back(
        PendingResult{std::move(dest), seq, Clock::now() + eng->opts.ack_linger, std::move(args)});
}

void Context::Impl::release_held(uint32_t seq, const na::Addr& dest) {
    std::unique_ptr<LargeOut> garbage;  // deregistered outside the lock
    std::lock_guard g(pend_mu);
    for (auto it = held.begin(); it != held.end(); ++it) {
        if (it->seq == seq && it->dest == dest) {
            garbage = std::move(it->out);
            held.erase(it);
            return;
        }
    }
}

void Context::Impl::expire_pending(TimePoint now) {
    std::vector<PendingResult> expired;
    {
        std::lock_guard g(pend_mu);
        std::erase_if(held, [&](PendingResult& h) {
            if (h.expires > now) return false;
            expired.push_back(std::move(h));
            return true;
        });
        for (auto it = pending.begin(); it != pending.end();) {
            if (it->expires <= now) {
                expired.push_back(std::move(*it));
                it = pending.erase(it);
            } else {
                ++it;
            }
        }
    }
    if (!expired.empty())
        TALARIA_LOG(core, info,
                    "context {}: {} large results were never pulled by their callers; released", id,
                    expired.size());
}

// --- large payloads ---------------------------------------------------------------------------

Result<std::unique_ptr<LargeOut>> Context::Impl::make_large(std::span<const std::byte> data,
                                                            std::vector<std::byte>& descriptor) {
    auto lo = std::make_unique<LargeOut>();
    lo->data.assign(data.begin(), data.end());
    TALARIA_TRY(mem, t->mem_register(lo->data.data(), lo->data.size(), na::Access::read_only));
    lo->mem = std::move(mem);
    std::vector<std::byte> ser(t->mem_serialize_size(lo->mem));
    TALARIA_TRY(n, t->mem_serialize(lo->mem, ser));
    wire::MoreDescriptor d;
    d.total = data.size();
    d.data_crc = checksum ? crc32c(0, data.data(), data.size()) : 0;
    d.mem = std::span<const std::byte>(ser.data(), n);
    descriptor.resize(wire::kMoreFixedSize + n);
    TALARIA_TRY(w, wire::encode_more(d, descriptor));
    if (wire::kHeaderSize + w > t->max_unexpected_size())
        return Error{
            Errc::not_supported,
            fmt::format("{}: a memory handle of {} bytes does not fit one message", t->name(), n)};
    return lo;
}

void Context::Impl::pull_failed(const wire::Header& h, const na::Addr& source, Error e) {
    CtxCounters::add(counters.errors);
    if (h.flags & wire::kResponse) {
        complete_call(h.seq, &source, std::move(e), true);
        send_ack(source, h, false);  // the target may release the result either way
    } else if (!(h.flags & wire::kOneWay)) {
        (void)send_reply(
            source, h.seq, h.rpc_id, h.reply_ctx, e.code(),
            std::span(reinterpret_cast<const std::byte*>(e.message().data()), e.message().size()),
            nullptr, h.trace);
    } else {
        if (auto unlogged = one_way_lost_log.admit())
            TALARIA_LOG(core, warn,
                        "context {}: the arguments of a one-way call from {} were "
                        "lost: {}{}",
                        id, t->addr_describe(source), e.describe(), log::held_back(*unlogged));
        // The caller waits for our ack to complete the call: send it, with the failure.
        send_ack(source, h, true, e.code() == Errc::ok ? Errc::internal : e.code());
    }
}

bool Engine::Impl::reserve_large(std::size_t n) noexcept {
    uint64_t cur = large_held.load(std::memory_order_relaxed);
    do {
        if (n > opts.large_budget || cur > opts.large_budget - n) return false;
    } while (!large_held.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
    return true;
}

PullJob::~PullJob() {
    if (budgeted != 0) impl->eng->large_held.fetch_sub(budgeted, std::memory_order_relaxed);
}

Result<void> Context::Impl::admit_large(const wire::Header& h, uint64_t total) {
    if (total > eng->opts.max_payload)
        return too_large(fmt::format("a payload of {} bytes exceeds", total),
                         "pass the data as a talaria::Bulk");
    if (h.flags & wire::kResponse) return ok();  // a result of our own call (checked live)
    // Arguments: nothing is allocated for a procedure this engine does not have...
    RpcEntry* e = eng->registry.find(h.rpc_id, h.provider);
    if (!e || !e->live.load(std::memory_order_relaxed))
        return Error{Errc::not_found, no_rpc_message(h, eng->self_string)};
    // ...nor past the budget of large arguments held at once.
    if (!eng->reserve_large(total))
        return Error{Errc::busy,
                     fmt::format("{} holds {} bytes of large arguments; {} more would exceed "
                                 "Options::large_budget ({}): retry later",
                                 eng->self_string, eng->large_held.load(std::memory_order_relaxed),
                                 total, eng->opts.large_budget)};
    return ok();
}

void Context::Impl::start_pull(const wire::Header& h, std::span<const std::byte> payload,
                               const na::Addr& source) {
    auto d = wire::decode_more(payload);
    if (!d) return pull_failed(h, source, std::move(d).error());
    if (auto a = admit_large(h, d->total); !a) return pull_failed(h, source, std::move(a).error());
    const bool request = !(h.flags & wire::kResponse);
    auto job = std::make_unique<PullJob>();
    job->impl = this;
    job->budgeted = request ? d->total : 0;  // released by ~PullJob, on every path
    auto remote = t->mem_deserialize(d->mem);
    if (!remote) return pull_failed(h, source, std::move(remote).error());
    if ((*remote)->length() < d->total)
        return pull_failed(h, source,
                           Error{Errc::protocol_error,
                                 "a large-payload descriptor names more bytes than its region"});
    job->header = h;
    job->source = source;
    job->data_crc = d->data_crc;
    job->size = d->total;
    job->data.reset(new (std::nothrow) std::byte[job->size]);  // default-initialized: no fill
    if (!job->data)
        return pull_failed(
            h, source,
            Error{Errc::no_memory, fmt::format("no memory for a {}-byte payload", job->size)});
    auto local = t->mem_register(job->data.get(), job->size, na::Access::write_only);
    if (!local) return pull_failed(h, source, std::move(local).error());
    job->local = std::move(*local);
    job->remote = std::move(*remote);
    job->deadline = Clock::now() + eng->opts.pull_timeout;
    PullJob* raw = job.get();
    {
        // Listed before the get is posted: its completion may run on another thread at once.
        std::lock_guard g(pend_mu);
        pull_jobs.push_back(raw);
    }
    pulls.fetch_add(1);
    job.release();  // on_pulled owns it from here
    auto r = t->post_get(
        *na, [raw](const na::Completion& c) { raw->impl->on_pulled(raw, c); }, raw->local, 0,
        raw->remote, 0, raw->size, source);
    if (!r) {
        std::unique_ptr<PullJob> own(raw);
        {
            std::lock_guard g(pend_mu);
            std::erase(pull_jobs, raw);
        }
        pulls.fetch_sub(1);
        return pull_failed(h, source, std::move(r).error());
    }
    {
        std::lock_guard g(pend_mu);
        // Still listed unless it already completed (then on_pulled erased it, and raw is gone).
        if (std::find(pull_jobs.begin(), pull_jobs.end(), raw) != pull_jobs.end()) {
            raw->op = *r;
            raw->posted = true;
        }
    }
    CtxCounters::bump(counters.bulk_ops);
    CtxCounters::bump(counters.bulk_bytes, d->total);
}

void Context::Impl::expire_pulls(TimePoint now) {
    std::vector<na::OpId> cancel;  // canceled once the lock is released (stale ids are safe)
    std::vector<std::string> why;  // the log lines, built under the lock (the jobs may go after)
    {
        std::lock_guard g(pend_mu);
        for (PullJob* j : pull_jobs) {
            if (j->expired || !j->posted || j->deadline > now) continue;
            j->expired = true;
            cancel.push_back(j->op);
            why.push_back(fmt::format("{} bytes from {}", j->size, t->addr_to_string(j->source)));
        }
    }
    for (std::size_t i = 0; i < cancel.size(); ++i) {
        if (auto unlogged = pull_timeout_log.admit())
            TALARIA_LOG(core, warn,
                        "context {}: the peer did not serve a pull of {} within "
                        "Options::pull_timeout; canceling it (the call fails with timeout){}",
                        id, why[i], log::held_back(*unlogged));
        (void)t->cancel(cancel[i]);
    }
}

void Context::Impl::on_pulled(PullJob* raw, const na::Completion& c) {
    std::unique_ptr<PullJob> job(raw);
    bool expired;
    {
        std::lock_guard g(pend_mu);
        std::erase(pull_jobs, raw);
        expired = raw->expired;
    }
    pulls.fetch_sub(1);
    if (closing.load(std::memory_order_relaxed)) return;
    const wire::Header& h = job->header;
    if (c.status != Errc::ok) {
        if (expired && c.status == Errc::canceled)
            return pull_failed(
                h, job->source,
                Error{Errc::timeout,
                      fmt::format("the peer did not serve a {}-byte payload within "
                                  "Options::pull_timeout ({} ms)",
                                  job->size,
                                  std::chrono::duration_cast<std::chrono::milliseconds>(
                                      eng->opts.pull_timeout)
                                      .count())});
        return pull_failed(h, job->source,
                           Error{c.status, fmt::format("pulling a {}-byte payload failed: {}",
                                                       job->size, errc_name(c.status))});
    }
    if ((h.flags & wire::kChecksum) && crc32c(0, job->data.get(), job->size) != job->data_crc)
        return pull_failed(
            h, job->source,
            Error{Errc::protocol_error, "a large payload's checksum does not match: corrupted"});
    job->local.reset();
    job->remote.reset();
    CtxCounters::bump(counters.bytes_received, job->size);
    if (h.flags & wire::kResponse) {
        send_ack(job->source, h, false);
        complete_call(h.seq, &job->source, job->bytes(), true);
        return;
    }
    if (h.flags & wire::kOneWay) send_ack(job->source, h, true);
    dispatch(h, job->bytes(), job->source);
}

// --- Request ----------------------------------------------------------------------------------

Result<PeerLoad*> Context::Impl::admit(const na::Addr& source) {
    const Options& o = eng->opts;
    if (o.max_requests == 0 && o.max_requests_per_peer == 0) return nullptr;  // not counted
    PeerLoad* load = o.max_requests_per_peer ? load_for(source) : &any_peer;
    const uint32_t all = held_requests.load(std::memory_order_relaxed);
    const bool over_all = o.max_requests && all >= o.max_requests;
    const bool over_peer = o.max_requests_per_peer &&
                           load->held.load(std::memory_order_relaxed) >= o.max_requests_per_peer;
    if (!over_all && !over_peer) [[likely]]
        return load;
    CtxCounters::bump(counters.busy_refused);
    std::string why = over_peer
                          ? fmt::format(
                                "context {} of {} holds {} requests of this caller "
                                "(Options::max_requests_per_peer); retry later",
                                id, eng->self_string, load->held.load(std::memory_order_relaxed))
                          : fmt::format(
                                "context {} of {} holds {} requests (Options::max_requests); retry "
                                "later",
                                id, eng->self_string, all);
    if (!refusal_logged) {  // once per sweep period: a flood must not flood the log
        refusal_logged = true;
        TALARIA_LOG(core, warn, "refusing requests from {} with busy: {}", t->addr_describe(source),
                    why);
    }
    return Error{Errc::busy, std::move(why)};
}

PeerLoad* Context::Impl::load_for(const na::Addr& source) {
    na::AddrImpl* key = source.impl()->canonical();
    if (last_load && last_load->key == key) [[likely]]
        return last_load;
    auto& slot = loads[key];
    if (!slot) {
        slot = std::make_unique<PeerLoad>();
        slot->key = key;
        slot->addr = source;
    }
    last_load = slot.get();
    return last_load;
}

void Context::Impl::trim_loads() {
    for (auto it = loads.begin(); it != loads.end();) {
        if (it->second->held.load(std::memory_order_acquire) == 0) {
            if (last_load == it->second.get()) last_load = nullptr;
            it = loads.erase(it);
        } else {
            ++it;
        }
    }
}

Request::Request(Request&& o) noexcept
    : ctx_(o.ctx_),
      source_(o.lent_source_ ? *o.lent_source_ : std::move(o.source_)),
      input_(o.input_),
      rpc_id_(o.rpc_id_),
      seq_(o.seq_),
      reply_ctx_(o.reply_ctx_),
      one_way_(o.one_way_),
      responded_(o.responded_),
      provider_(o.provider_),
      load_(o.load_),
      deadline_(o.deadline_),
      stats_(o.stats_),
      started_(o.started_),
      trace_(o.trace_),
      logged_ns_(o.logged_ns_) {
    o.ctx_ = nullptr;
    o.load_ = nullptr;
    o.stats_ = nullptr;
    o.input_ = {};
    o.lent_source_ = nullptr;
    // The handler's input buffer is reposted once it returns: a moved request keeps no view.
    input_ = {};
}

Request& Request::operator=(Request&& o) noexcept {
    if (this != &o) {
        this->~Request();
        new (this) Request(std::move(o));
    }
    return *this;
}

Request::~Request() {
    // In a child across fork() the request is the parent's to answer: the child sends nothing.
    if (ctx_ && !responded_ && !one_way_ && !ctx_->impl_->t->inherited()) {
        std::string name = ctx_->engine().rpc_name(rpc_id_, provider_);
        if (name.empty()) name = fmt::format("{:#010x}", rpc_id_);
        std::string msg =
            fmt::format("the handler of '{}' dropped the request without responding", name);
        TALARIA_LOG(core, warn, "{}", msg);
        (void)send_response(Errc::internal,
                            {reinterpret_cast<const std::byte*>(msg.data()), msg.size()});
    }
    if (one_way_) note_answered(Errc::ok, 0);  // its handler is done
    uncount();  // one-way, or answered above (or by nobody: the parent's, across fork)
}

void Request::uncount() noexcept {
    if (!load_) return;
    load_->held.fetch_sub(1, std::memory_order_release);
    ctx_->impl_->held_requests.fetch_sub(1, std::memory_order_release);
    load_ = nullptr;
}

Result<void> Request::respond(std::span<const std::byte> output) {
    return send_response(Errc::ok, output);
}

Result<void> Request::respond_error(Errc code, std::string_view message) {
    if (code == Errc::ok) return Error{Errc::invalid_argument, "respond_error with Errc::ok"};
    return send_response(code,
                         {reinterpret_cast<const std::byte*>(message.data()), message.size()});
}

Result<void> Request::check_respond() const {
    if (!ctx_) return Error{Errc::invalid_argument, "respond: this request is empty (moved from)"};
    if (ctx_->impl_->t->inherited()) [[unlikely]]
        return ctx_->engine().inherited_error("respond");
    if (one_way_) return Error{Errc::not_supported, "respond: a one-way call takes no response"};
    if (responded_) return Error{Errc::invalid_argument, "respond: already responded"};
    return ok();
}

Result<void> Request::send_response(Errc status, std::span<const std::byte> output) {
    TALARIA_CHECK(check_respond());
    // Counted before it goes: a caller that has the answer finds it in these statistics.
    const Counted counted = note_answered(status, output.size());
    auto r = ctx_->impl_->send_reply(source(), seq_, rpc_id_, reply_ctx_, status, output, nullptr,
                                     trace_);
    if (!r) [[unlikely]]
        settle_answer(counted, output.size(), r);
    if (logged_ns_ != 0 && (r || r.code() != Errc::again)) [[unlikely]]
        log_answer(r ? status : r.code(), output.size());
    return answered(std::move(r));
}

Result<void> Request::respond_in_place(PayloadWriter write) {
    TALARIA_CHECK(check_respond());  // before the writer runs
    TALARIA_TRY(w, ctx_->impl_->write_payload(write));
    const std::size_t n = w.bytes.size();
    const Counted counted = note_answered(Errc::ok, n);  // before it goes, as send_response
    auto r = ctx_->impl_->send_reply(source(), seq_, rpc_id_, reply_ctx_, Errc::ok, w.bytes, w.buf,
                                     trace_);
    if (!r) [[unlikely]]
        settle_answer(counted, n, r);
    if (logged_ns_ != 0 && (r || r.code() != Errc::again)) [[unlikely]]
        log_answer(r ? Errc::ok : r.code(), n);
    return answered(std::move(r));
}

void Request::log_answer(Errc status, std::size_t bytes) const {
    if (logged_ns_ == 0) return;
    TALARIA_LOG(rpc, trace, "answer {} seq {:#x} to {}: {} ({} bytes) after {} us, trace {:016x}",
                ctx_->impl_->eng->name_of(rpc_id_, provider_), seq_,
                ctx_->impl_->t->addr_to_string(source()), errc_name(status), bytes,
                (now_ns() - logged_ns_) / 1000, trace_);
}

Result<void> Request::answered(Result<void> r) {
    // Answered unless the transport said "again" (the caller may retry).
    if (r || r.code() != Errc::again) {
        responded_ = true;
        // A cancel that crossed the answer is done with: forgotten, so that a later call that
        // reuses the seq is not taken for canceled (one atomic load when there is none).
        if (ctx_->impl_->n_cancels.load(std::memory_order_acquire) != 0) [[unlikely]]
            ctx_->impl_->forget_cancel(source(), seq_, reply_ctx_);
        uncount();
    }
    return r;
}

}  // namespace talaria::core
