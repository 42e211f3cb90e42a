// Per-procedure statistics: the index of (procedure, provider) pairs, each context's counters,
// what a Request counts, and their sum over the contexts (Engine::proc_stats).
#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "core/core_impl.hpp"

namespace talaria::core {

namespace {

uint64_t pack(RpcId id, uint16_t provider, uint32_t index) noexcept {
    return (uint64_t(id) << 32) | (uint64_t(provider) << 16) | uint64_t(index + 1);
}
bool same_key(uint64_t e, RpcId id, uint16_t provider) noexcept {
    return uint32_t(e >> 32) == id && uint16_t(e >> 16) == provider;
}
std::size_t slot_of(RpcId id, uint16_t provider, std::size_t mask) noexcept {
    uint64_t h = (uint64_t(id) << 16 | provider) * 0x9e3779b97f4a7c15ull;
    return std::size_t(h >> 32) & mask;
}
void add_side(ProcSideStats& to, const ProcCounters::Side& from) {
    to.calls += from.calls.load(std::memory_order_relaxed);
    to.ok += from.ok.load(std::memory_order_relaxed);
    to.bytes_out += from.bytes_out.load(std::memory_order_relaxed);
    to.bytes_in += from.bytes_in.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < kErrcCount; ++i)
        to.errors[i] += from.errors[i].load(std::memory_order_relaxed);
    to.latency.hist.merge(from.latency.snapshot());
}

}  // namespace

StatsIndex::StatsIndex() : table_(std::make_unique<std::atomic<uint64_t>[]>(kCapacity)) {}

uint32_t StatsIndex::index(RpcId id, uint16_t provider) noexcept {
    const std::size_t mask = kCapacity - 1;
    std::size_t i = slot_of(id, provider, mask);
    for (std::size_t n = 0; n < kCapacity; ++n, i = (i + 1) & mask) {
        uint64_t e = table_[i].load(std::memory_order_acquire);
        if (e == 0) break;
        if (same_key(e, id, provider)) return uint32_t(e & 0xFFFF) - 1;
    }
    // First use of this pair: number it under the lock (another thread may have meanwhile).
    std::lock_guard g(mu_);
    i = slot_of(id, provider, mask);
    for (std::size_t n = 0; n < kCapacity; ++n, i = (i + 1) & mask) {
        uint64_t e = table_[i].load(std::memory_order_relaxed);
        if (e != 0) {
            if (same_key(e, id, provider)) return uint32_t(e & 0xFFFF) - 1;
            continue;
        }
        if (keys_.size() >= kMax) return kMax - 1;  // the last index stands for the rest
        const auto index = uint32_t(keys_.size());
        try {
            keys_.push_back(Key{id, provider});
        } catch (...) {
            return kMax - 1;
        }
        table_[i].store(pack(id, provider, index), std::memory_order_release);
        return index;
    }
    return kMax - 1;
}

std::vector<StatsIndex::Key> StatsIndex::keys() const {
    std::lock_guard g(mu_);
    return keys_;
}

void StatsIndex::name(RpcId id, std::string_view name) {
    std::lock_guard g(mu_);
    names_.try_emplace(id, name);
}

std::string StatsIndex::name_of(RpcId id) const {
    std::lock_guard g(mu_);
    auto it = names_.find(id);
    return it == names_.end() ? std::string() : it->second;
}

thread_local const Context::Impl* tl_triggering [[gnu::tls_model("initial-exec")]] = nullptr;
thread_local uint64_t tl_trace [[gnu::tls_model("initial-exec")]] = 0;

uint64_t current_trace_id() noexcept {
    return tl_trace;
}

TraceScope::TraceScope(uint64_t id) noexcept : prev_(tl_trace) {
    tl_trace = id;
}

TraceScope::~TraceScope() {
    tl_trace = prev_;
}

std::string Engine::Impl::name_of(RpcId id, uint16_t provider) const {
    if (const RpcEntry* e = registry.find(id, provider)) return e->name;
    std::string n = stats_index.name_of(id);
    return n.empty() ? fmt::format("{:#010x}", id) : n;
}

ProcCounters* Context::Impl::proc_counters(RpcId rpc, uint16_t provider) {
    return counters_at(eng->stats_index.index(rpc, provider));
}

ProcCounters* Context::Impl::make_counters(uint32_t i) {
    // The procedure's first call on this context (client and server sides may race to it).
    ProcCounters* p = nullptr;
    auto fresh = std::make_unique<ProcCounters>();
    if (procs[i].compare_exchange_strong(p, fresh.get(), std::memory_order_acq_rel))
        return fresh.release();
    return p;
}

void Request::note_started() noexcept {
    if (!stats_ || started_ == 0) return;  // not timed (Options::stats_timing_gap)
    const uint64_t now = ticks();
    stats_->queue.record_shared(now > started_ ? now - started_ : 0);
    started_ = now;
}

Request::Counted Request::note_answered(Errc status, std::size_t bytes) noexcept {
    ProcCounters* pc = std::exchange(stats_, nullptr);
    if (!pc) return {};
    if (status == Errc::ok && ctx_ && !one_way_) {
        // An answer its caller no longer waits for (its deadline passed, or it canceled) is
        // counted as what the caller saw, not as ok.
        if (deadline_ != TimePoint::max() && Clock::now() >= deadline_) [[unlikely]]
            status = Errc::timeout;
        else if (ctx_->impl_->cancel_noticed(source(), seq_, reply_ctx_)) [[unlikely]]
            status = Errc::canceled;
    }
    const bool timed = started_ != 0;  // Options::stats_timing_gap
    const uint64_t took = timed ? ticks_since(started_) : 0;
    if (ctx_ && tl_triggering == ctx_->impl_.get()) {
        // The context's trigger thread: the only writer of `server`.
        count_outcome(pc->server, pc->server.bytes_out, status, bytes, CtxCounters::bump);
        if (timed) pc->server.latency.record(took);
        return {pc, took, false, timed, status};
    }
    count_outcome(pc->server_shared, pc->server_shared.bytes_out, status, bytes, CtxCounters::add);
    if (timed) pc->server_shared.latency.record_shared(took);
    return {pc, took, true, timed, status};
}

void Request::settle_answer(const Counted& c, std::size_t bytes,
                            const Result<void>& sent) noexcept {
    if (!c.pc || sent) return;
    // Same side, same writer rule as note_answered (this runs right after it, on its thread).
    auto& side = c.shared ? c.pc->server_shared : c.pc->server;
    auto add = c.shared ? CtxCounters::add : CtxCounters::bump;
    count_outcome(side, side.bytes_out, c.as, bytes, add, uint64_t(-1));
    if (sent.code() == Errc::again) {
        // Not answered yet: the caller may respond again, and that one counts.
        if (c.timed && c.shared) side.latency.remove_shared(c.took);
        if (c.timed && !c.shared) side.latency.remove(c.took);
        stats_ = c.pc;
        return;
    }
    count_outcome(side, side.bytes_out, sent.code(), 0, add);  // the answer did not go
}

std::vector<ProcStats> Engine::proc_stats() const {
    std::vector<ProcStats> out;
    if (!impl_->opts.stats) return out;
    const auto keys = impl_->stats_index.keys();
    out.resize(keys.size());
    const double scale = keys.empty() ? 1.0 : impl_->tick_scale.ns_per_tick();
    for (std::size_t i = 0; i < keys.size(); ++i) {
        ProcStats& p = out[i];
        p.id = keys[i].id;
        p.provider = keys[i].provider;
        p.name = rpc_name(p.id, p.provider);
        if (p.name.empty()) p.name = impl_->stats_index.name_of(p.id);
        if (i == StatsIndex::kMax - 1 && keys.size() == StatsIndex::kMax) p.name = "(others)";
        for (const auto& c : impl_->contexts) {
            const ProcCounters* pc = c->impl_->procs[i].load(std::memory_order_acquire);
            if (!pc) continue;
            add_side(p.client, pc->client);
            add_side(p.server, pc->server);
            add_side(p.server, pc->server_shared);
            p.queue.hist.merge(pc->queue.snapshot());
        }
        p.client.latency.ns_per_tick = scale;
        p.server.latency.ns_per_tick = scale;
        p.queue.ns_per_tick = scale;
    }
    return out;
}

std::vector<PeerCalls> Engine::calls_in_flight() const {
    std::vector<PeerCalls> out;
    std::vector<na::Addr> addrs;  // named outside the locks
    for (const auto& c : impl_->contexts) {
        Context::Impl& im = *c->impl_;
        std::lock_guard g(im.mu);
        for (const auto& [key, p] : im.peers) {
            if (p->inflight == 0) continue;
            out.push_back(PeerCalls{{}, im.id, p->inflight, p->queued});
            addrs.push_back(p->addr);
        }
    }
    for (std::size_t i = 0; i < out.size(); ++i)
        out[i].peer = impl_->transport->addr_to_string(addrs[i]);
    return out;
}

std::vector<uint32_t> Engine::requests_held() const {
    std::vector<uint32_t> out;
    for (const auto& c : impl_->contexts)
        out.push_back(c->impl_->held_requests.load(std::memory_order_relaxed));
    return out;
}

void Engine::note_transfer(bool pull, uint64_t bytes, bool ok, uint64_t ticks_taken) noexcept {
    if (!impl_->opts.stats) return;
    auto& t = impl_->transfers[pull ? 0 : 1];
    if (ok) {
        CtxCounters::add(t.ok);
        CtxCounters::add(t.bytes, bytes);
    } else {
        CtxCounters::add(t.failed);
    }
    t.latency.record_shared(ticks_taken);
}

na::OpCounts Engine::na_counts() const noexcept {
    na::OpCounts o;
    for (const auto& c : impl_->contexts)
        o.merge(c->impl_->na->op_counts());
    return o;
}

std::array<TransferStats, 2> Engine::transfer_stats() const {
    std::array<TransferStats, 2> out{};
    if (!impl_->opts.stats) return out;
    const double scale = impl_->tick_scale.ns_per_tick();
    for (std::size_t i = 0; i < 2; ++i) {
        const auto& t = impl_->transfers[i];
        out[i].ok = t.ok.load(std::memory_order_relaxed);
        out[i].failed = t.failed.load(std::memory_order_relaxed);
        out[i].transfers = out[i].ok + out[i].failed;
        out[i].bytes = t.bytes.load(std::memory_order_relaxed);
        out[i].latency.hist = t.latency.snapshot();
        out[i].latency.ns_per_tick = scale;
    }
    return out;
}

void Engine::name_rpc(RpcId id, std::string_view name) {
    impl_->stats_index.name(id, name);
}

}  // namespace talaria::core
