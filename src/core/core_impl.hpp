// The RPC core's private state: Engine::Impl, Context::Impl and what they own.
//
// Locking (all per context; nothing is shared between contexts on a message path):
//  - `mu` (a spin lock, absent in single-threaded mode) guards the call table, the deadline
//    heap, the peer map and the deferred completions. Never held while a user callback runs.
//  - `pool_mu` guards the free list of send buffers (responses may be sent from any thread).
//  - `pend_mu` guards large results waiting for their caller to pull them (slow path).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/wire.hpp"
#include "talaria/core/core.hpp"
#include "talaria/util/histogram.hpp"
#include "talaria/util/log.hpp"
#include "talaria/util/spin_lock.hpp"

namespace talaria::core {

/// A registered procedure. Entries are never freed while the engine lives (a handler may be
/// running on another context when it is deregistered); re-registering installs a new entry.
struct RpcEntry {
    RpcId id = 0;
    uint16_t provider = 0;
    std::string name;
    Handler handler;
    uint64_t signature = 0;      ///< 0: calls are not checked
    std::string signature_text;  ///< "int(int, int)", told to a caller whose signature differs
    std::atomic<bool> live{true};
    /// Its StatsIndex index, found on its first call served (kNoStatsIndex until then).
    static constexpr uint32_t kNoStatsIndex = UINT32_MAX;
    std::atomic<uint32_t> stats_index{kNoStatsIndex};
};

/// (id, provider) -> entry: lock-free lookups (one probe in practice), inserts under a mutex.
class Registry {
  public:
    Registry();
    [[nodiscard]] RpcEntry* find(RpcId id, uint16_t provider) const noexcept;
    Result<void> add(RpcId id, std::string_view name, Handler h, const Registration& reg);
    Result<void> remove(RpcId id, uint16_t provider);

  private:
    static constexpr std::size_t kCapacity = 4096;  // power of two
    std::unique_ptr<std::atomic<RpcEntry*>[]> table_;
    std::mutex mu_;
    std::vector<std::unique_ptr<RpcEntry>> all_;
};

/// Counters of one context. Relaxed atomics: each context's are written mostly by its own
/// thread, so they cost no cache-line traffic between contexts.
struct CtxCounters {
    std::atomic<uint64_t> rpcs_sent{0}, rpcs_received{0}, responses_sent{0}, responses_received{0},
        bytes_sent{0}, bytes_received{0}, bulk_ops{0}, bulk_bytes{0}, timeouts{0}, canceled{0},
        errors{0}, busy_refused{0}, busy_retries{0};
    /// From any thread.
    static void add(std::atomic<uint64_t>& c, uint64_t n = 1) noexcept {
        c.fetch_add(n, std::memory_order_relaxed);
    }
    /// From the thread that triggers the context only (one writer): a plain add, no locked
    /// instruction. The receive-side counters of the message path are counted here; sends are
    /// counted with add() when posted, since any thread may post.
    static void bump(std::atomic<uint64_t>& c, uint64_t n = 1) noexcept {
        c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
};

/// One procedure's statistics on one context (Options::stats), summed over the contexts when
/// read (Engine::proc_stats). Allocated by the context on the procedure's first call there.
struct ProcCounters {
    struct Side {
        std::atomic<uint64_t> calls{0}, ok{0}, bytes_out{0}, bytes_in{0};
        std::array<std::atomic<uint64_t>, kErrcCount> errors{};
        Histogram latency;
    };
    /// Written under the context's `mu` only (the call table's lock): one writer at a time,
    /// so plain relaxed stores (CtxCounters::bump, Histogram::record).
    Side client;
    /// Written by the context's trigger thread only (bump, record): the requests handed to
    /// handlers, and the answers sent from that thread (handlers on the progress thread).
    Side server;
    /// Answers sent from any other thread (executors, a kept Request): atomic adds
    /// (CtxCounters::add, Histogram::record_shared). Summed with `server` when read.
    Side server_shared;
    Histogram queue;  ///< record_shared (executor threads)
};

/// Count one ended call in side `s`: ok and its result's bytes in `bytes_field`, else the
/// error's code; `add` is CtxCounters::bump for a side's one writer, CtxCounters::add otherwise.
/// `one` = uint64_t(-1) takes a count back (unsigned arithmetic wraps it right).
template <class Add>
void count_outcome(ProcCounters::Side& s, std::atomic<uint64_t>& bytes_field, Errc status,
                   std::size_t bytes, Add add, uint64_t one = 1) noexcept {
    if (status == Errc::ok) {
        add(s.ok, one);
        add(bytes_field, uint64_t(bytes) * one);
    } else {
        // A handler may answer any number; one past the codes counts as internal.
        add(s.errors[std::size_t(status) < kErrcCount ? std::size_t(status)
                                                      : std::size_t(Errc::internal)],
            one);
    }
}

/// Options::stats_timing_gap in nanoseconds (a negative gap as 0: every call timed).
inline uint64_t timing_gap_ns(Duration gap) noexcept {
    return uint64_t(
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(gap).count()));
}

/// Tells a context's CallTimers that the context has been idle for at least
/// Options::stats_timing_gap, so that the next call is timed even when the period drawn during
/// a busy spell had calls left to skip (calls further apart than the gap are all timed). Idle
/// is seen where the context waits: a progress call sleeping in the transport (two readings of
/// the counter around the wait, only when progress may block, where the wait itself costs a
/// system call; a call made while it sleeps reads the counter once to see how long), or a run
/// of empty trigger passes (busy polling) lasting the gap, which reads the counter once every
/// kPasses empty passes and never while calls come. An idle spell bumps the epoch once; the
/// timers look at it only on calls they would skip. Written by the progress and trigger
/// threads of the context, read by every thread that calls.
class QuietWatch {
  public:
    static constexpr uint32_t kPasses = 256;  ///< empty trigger passes between readings
    explicit QuietWatch(Duration gap) noexcept : gap_ns_(timing_gap_ns(gap)) {}
    [[nodiscard]] uint32_t epoch() const noexcept { return epoch_.load(std::memory_order_relaxed); }
    /// True if the context was idle for the gap since a call saw `epoch() == seen`, or sleeps
    /// in the transport now and has for the gap (a call that will wake it).
    [[nodiscard]] bool ended(uint32_t seen, const TickScale& scale) const noexcept {
        if (epoch() != seen) return true;
        const uint64_t asleep = asleep_since_.load(std::memory_order_relaxed);
        if (asleep == 0) [[likely]]
            return false;
        const uint64_t gap = gap_ticks(scale);
        return gap != 0 && ticks_since(asleep) >= gap;
    }
    /// Around a progress call that may block: ticks() before it (0 when no call is sampled).
    [[nodiscard]] uint64_t before_wait() noexcept {
        if (gap_ns_ == 0) return 0;
        const uint64_t now = ticks();
        asleep_since_.store(now, std::memory_order_relaxed);
        return now;
    }
    void after_wait(uint64_t before, const TickScale& scale) noexcept {
        if (before == 0) return;
        asleep_since_.store(0, std::memory_order_relaxed);
        const uint64_t gap = gap_ticks(scale);
        if (gap != 0 && ticks_since(before) >= gap) bump();
    }
    /// After a trigger pass that ran `n` completions.
    void triggered(unsigned n, const TickScale& scale) noexcept {
        if (n != 0) [[likely]] {
            empty_ = 0;
            return;
        }
        if (gap_ns_ == 0 || (++empty_ & (kPasses - 1)) != 0) [[likely]]
            return;
        const uint64_t now = ticks();
        if (empty_ == kPasses) {
            since_ = now;  // quiet from about here
            return;
        }
        const uint64_t gap = gap_ticks(scale);
        if (since_ != 0 && gap != 0 && now - since_ >= gap) {
            bump();
            since_ = 0;  // once per idle spell: until a pass runs something again
        }
    }

  private:
    /// The gap in ticks; 0 until the counter's rate is known (every call is timed until then).
    uint64_t gap_ticks(const TickScale& scale) const noexcept {
        uint64_t g = gap_ticks_.load(std::memory_order_relaxed);
        if (g == 0) [[unlikely]] {
            const double ns_per_tick = scale.ns_per_tick_if_ready();
            if (ns_per_tick <= 0) return 0;
            g = std::max<uint64_t>(1, uint64_t(double(gap_ns_) / ns_per_tick));
            gap_ticks_.store(g, std::memory_order_relaxed);
        }
        return g;
    }
    void bump() noexcept { epoch_.fetch_add(1, std::memory_order_relaxed); }

    std::atomic<uint32_t> epoch_{0};
    std::atomic<uint64_t> asleep_since_{0};  ///< ticks() when a progress call began to wait
    uint32_t empty_ = 0;  ///< trigger passes in a row that ran nothing (trigger thread)
    uint64_t since_ = 0;  ///< ticks() at the kPasses-th of them (0: not watching)
    uint64_t gap_ns_;     ///< Options::stats_timing_gap; 0: every call is timed anyway
    mutable std::atomic<uint64_t> gap_ticks_{0};  ///< the same in ticks, once known
};

/// Which calls one side of a context times for the latency histograms (Options::
/// stats_timing_gap). Every call, while timed calls come at least `gap` apart; a busier side
/// times one call in `period` (a power of two, up to kMaxPeriod), the others skipped at random
/// (no period for a pipeline of calls to alias with), the period chosen at each timed call so
/// that timed calls stay about `gap` apart: the clock's two readings and the histogram record
/// per timed call then cost a small, bounded share of the time the calls take. One writer: the
/// client side's under the context's `mu`, the server side's on its trigger thread.
class CallTimer {
  public:
    static constexpr uint32_t kMaxPeriod = 64;
    explicit CallTimer(Duration gap) noexcept : gap_ns_(timing_gap_ns(gap)) {}
    /// ticks() if this call is to be timed, else 0 (the call is counted, not timed). A call
    /// that `quiet` says comes after the context was idle for the gap is timed whatever was
    /// left to skip.
    uint64_t start(const TickScale& scale, const QuietWatch& quiet) noexcept {
        if (skip_ != 0) [[likely]] {
            if (!quiet.ended(quiet_, scale)) [[likely]] {
                --skip_;
                return 0;
            }
            skip_ = 0;  // the busy spell the skip was drawn for has ended
            last_calls_ = 1;
        }
        quiet_ = quiet.epoch();
        const uint64_t now = ticks();
        if (gap_ns_ != 0) adapt(now, scale);
        return now;
    }

  private:
    void adapt(uint64_t now, const TickScale& scale) noexcept {
        const uint64_t since = now > last_ ? now - last_ : 0;
        const uint32_t calls = last_calls_;  // since the last timed call, this one included
        last_ = now;
        if (gap_ticks_ == 0) {
            // The counter's rate is known 2 ms after the engine's open: until then, time all.
            const double ns_per_tick = scale.ns_per_tick_if_ready();
            if (ns_per_tick <= 0) return;
            gap_ticks_ = std::max<uint64_t>(1, uint64_t(double(gap_ns_) / ns_per_tick));
            return;
        }
        // The period that puts `gap` between timed calls at the rate just seen.
        uint32_t period = 1;
        while (period < kMaxPeriod && since * period < gap_ticks_ * calls)
            period *= 2;
        if (period == 1) {
            last_calls_ = 1;
            return;
        }
        rng_ ^= rng_ << 13;  // xorshift32
        rng_ ^= rng_ >> 17;
        rng_ ^= rng_ << 5;
        skip_ = rng_ & (2 * period - 1);  // 0 .. 2 period - 1: one call in about `period`
        last_calls_ = skip_ + 1;
    }

    uint32_t skip_ = 0;        ///< calls to count untimed before the next timed one
    uint32_t quiet_ = 0;       ///< QuietWatch::epoch() at the last call
    uint32_t last_calls_ = 1;  ///< calls from the last timed one to the next (skip_ + 1)
    uint32_t rng_ = 0x9e3779b9u;
    uint64_t last_ = 0;       ///< ticks() of the last timed call
    uint64_t gap_ns_;         ///< Options::stats_timing_gap; 0: time every call
    uint64_t gap_ticks_ = 0;  ///< the same in ticks, once the counter's rate is known
};

/// (procedure id, provider) -> a dense index into each context's ProcCounters table, numbered
/// in order of first use. Lookups are lock-free (one probe in practice); a new key is added
/// under a mutex. Names are kept apart, by id: the registry's for served procedures, those
/// given to Engine::name_rpc for the others.
class StatsIndex {
  public:
    /// Distinct (id, provider) pairs counted apart; later ones share the last index.
    static constexpr uint32_t kMax = 1024;
    StatsIndex();
    uint32_t index(RpcId id, uint16_t provider) noexcept;
    struct Key {
        RpcId id;
        uint16_t provider;
    };
    /// The keys in index order (the last may stand for every later one).
    [[nodiscard]] std::vector<Key> keys() const;
    void name(RpcId id, std::string_view name);
    [[nodiscard]] std::string name_of(RpcId id) const;

  private:
    static constexpr std::size_t kCapacity = 4096;  // power of two, > kMax
    // (id << 32 | provider << 16 | index + 1); 0 when free.
    std::unique_ptr<std::atomic<uint64_t>[]> table_;
    mutable std::mutex mu_;
    std::vector<Key> keys_;
    std::unordered_map<RpcId, std::string> names_;
};

/// Registered memory holding a payload a peer pulls (large arguments or results).
struct LargeOut {
    std::vector<std::byte> data;
    na::MemHandle mem;
};

/// A peer this context has calls in flight to, with its watch: an expected receive that only
/// ever completes when the transport fails the peer.
struct Peer {
    na::Addr addr;
    uint32_t inflight = 0;
    bool watch_posted = false;
    /// A thread claimed the watch and posts it without the lock (post_watch): until it is
    /// done, the peer is not erased and nobody else touches watch / watch_buf.
    bool watch_posting = false;
    /// The watch being posted completed before its poster took the lock again (on_watch ran
    /// first): the poster does not mark it posted.
    bool watch_fired = false;
    bool retiring = false;  ///< the watch is being canceled because the peer went idle
    /// Calls counted in `inflight` that wait for a credit (Options::peer_window), oldest first:
    /// (slot, seq) pairs; an entry whose slot no longer holds that call is skipped.
    uint32_t queued = 0;
    /// At most 2 x queued + 16 entries: stale ones are dropped as calls leave it
    /// (release_slot_locked).
    std::deque<std::pair<uint32_t, uint32_t>> backlog;
    unsigned idle_sweeps = 0;
    na::OpId watch;
    na::MsgBuffer watch_buf;
};

/// The requests of one peer a context holds (Options::max_requests_per_peer): looked up and
/// created by the context's trigger thread, released by whoever answers (atomic). Erased by the
/// sweep once none is held (a Request points at its load only while counted in it).
struct PeerLoad {
    na::AddrImpl* key = nullptr;  ///< the peer's canonical address object
    na::Addr addr;                ///< keeps `key` alive
    std::atomic<uint32_t> held{0};
};

/// What a call that may be sent again after a busy answer keeps (CallOptions::busy_retries).
struct Retry {
    std::vector<std::byte> payload;  ///< the message's payload: the arguments, or the descriptor
    uint8_t flags = 0;               ///< the header's flags (kMore)
    uint8_t target_ctx = 0;
    uint16_t provider = 0;
    uint64_t signature = 0;
    uint8_t left = 0;    ///< retries still allowed
    Duration backoff{};  ///< the next wait (before jitter)
};

/// One outgoing call.
struct CallSlot {
    uint32_t seq = 0;  ///< 0 while free
    uint16_t gen = 0;
    bool one_way = false;
    uint8_t target_ctx = 0;  ///< where the call went (a cancel is sent there)
    int32_t heap = -1;       ///< index in the deadline heap, -1 if no deadline
    uint32_t next_free = 0;
    RpcId rpc_id = 0;
    Peer* peer = nullptr;
    TimePoint deadline{};  ///< TimePoint{} when the call has none
    /// When set, the call waits to be sent again (busy answer): its place in the deadline heap
    /// is ordered by this instead of the deadline until then.
    TimePoint retry_at{};
    bool queued = false;            ///< waits in its peer's backlog for a credit (not sent yet)
    ProcCounters* stats = nullptr;  ///< its procedure's (Options::stats)
    uint64_t sent_at = 0;           ///< forward()'s ticks(), with stats
    uint16_t provider = 0;
    uint64_t trace = 0;      ///< its trace id (CallOptions::trace_id, or the handler's)
    uint64_t logged_ns = 0;  ///< now_ns() when sent, with rpc=trace logging
    ResponseFn done;
    std::unique_ptr<LargeOut> large;  ///< arguments the target pulls
    std::unique_ptr<Retry> retry;     ///< CallOptions::busy_retries
    /// The heap's order: the retry time while one is set, else the deadline.
    [[nodiscard]] TimePoint due() const noexcept {
        return retry_at != TimePoint{} ? retry_at : deadline;
    }
};

/// What a send's completion must do and count.
struct SendInfo {
    enum Kind : uint8_t { other, call, response };
    uint32_t seq = 0;      ///< the call this message belongs to (0: not a call)
    bool one_way = false;  ///< a one-way call: sending it completes it
    Kind kind = other;
};

/// A send buffer and what its completion must do.
struct SendBuf {
    na::MsgBuffer buf;
    Context::Impl* impl = nullptr;
    SendInfo info;
};

/// A posted unexpected receive.
struct RecvSlot {
    na::MsgBuffer buf;
    Context::Impl* impl = nullptr;
    na::OpId op;
    bool posted = false;
    bool busy = false;  ///< its message is being handled (a handler may drive progress)
};

/// A large result waiting for the caller to pull it and acknowledge.
struct PendingResult {
    na::Addr dest;
    uint32_t seq = 0;
    TimePoint expires{};
    std::unique_ptr<LargeOut> out;
};

/// Pulling a kMore payload: request arguments (at the target) or a result (at the caller).
/// Listed on its context's `pull_jobs` (under pend_mu) from before its get is posted until it
/// completes, so the sweep can enforce Options::pull_timeout.
struct PullJob {
    ~PullJob();
    Context::Impl* impl = nullptr;
    wire::Header header;
    na::Addr source;
    uint32_t data_crc = 0;
    /// The payload's bytes: not zero-filled, so the pages are committed only as the peer's
    /// bytes land in them.
    std::unique_ptr<std::byte[]> data;
    std::size_t size = 0;
    na::MemHandle local;
    na::MemHandle remote;
    /// Bytes of Engine::Impl::large_held this job reserved (request arguments; 0 for results).
    std::size_t budgeted = 0;
    TimePoint deadline{};
    na::OpId op;           ///< the get, once posted (under pend_mu)
    bool posted = false;   ///< `op` is set (under pend_mu)
    bool expired = false;  ///< pull_timeout passed; the sweep asked to cancel (under pend_mu)
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data.get(), size}; }
};

struct Engine::Impl {
    // Declared first, destroyed last: everything below refers to it. `transport` is `owned`,
    // or one the caller of Engine::open(na::Transport&) keeps (and closes after the engine).
    std::unique_ptr<na::Transport> owned;
    na::Transport* transport = nullptr;
    Options opts;
    std::size_t eager = 0;
    na::Addr self;
    std::string self_string;
    Registry registry;
    StatsIndex stats_index;  ///< with opts.stats
    /// Bulk transfers by direction ([0] pull, [1] push), any thread (atomic adds).
    struct Transfers {
        std::atomic<uint64_t> ok{0}, failed{0}, bytes{0};  // transfers: ok + failed
        Histogram latency;
    };
    std::array<Transfers, 2> transfers;
    TickScale tick_scale;  ///< converts the statistics' ticks (from the engine's open)
    std::vector<std::unique_ptr<Context>> contexts;
    std::atomic<uint64_t> bulk_ops{0}, bulk_bytes{0}, bulk_errors{0};
    /// Bytes of large request arguments being pulled or handled, over all contexts: at most
    /// opts.large_budget (reserve_large / PullJob's destructor).
    std::atomic<uint64_t> large_held{0};
    bool shut = false;  ///< Engine::shutdown() ran
    /// Reserve `n` bytes of the large-argument budget; false when they do not fit.
    bool reserve_large(std::size_t n) noexcept;
    /// A procedure's name for messages: the registry's, else the one Engine::name_rpc was
    /// given, else its id in hex.
    [[nodiscard]] std::string name_of(RpcId id, uint16_t provider) const;
};

struct Context::Impl {
    Impl(Engine::Impl* e, std::unique_ptr<na::Context> n);
    ~Impl();

    Engine::Impl* eng;
    Context* self = nullptr;
    std::unique_ptr<na::Context> na;
    na::Transport* t;
    uint8_t id;
    bool thread_safe;
    bool checksum;
    std::atomic<bool> closing{false};

    // --- calls (under mu) -----------------------------------------------------------------
    MaybeSpinLock mu;
    std::vector<CallSlot> slots;
    uint32_t free_head = 0;
    std::atomic<std::size_t> inflight{0};
    std::vector<uint32_t> heap;                        ///< slot indices, min-heap by deadline
    std::atomic<int64_t> next_deadline_ns{INT64_MAX};  ///< deadline of heap[0], ns since epoch
    std::unordered_map<na::AddrImpl*, std::unique_ptr<Peer>> peers;
    Peer* last_peer = nullptr;
    /// A completion to run from progress (cancel), with the peer its call went to.
    struct Deferred {
        ResponseFn fn;
        na::Addr peer;
        Error error;
    };
    std::vector<Deferred> deferred;
    std::atomic<bool> has_deferred{false};
    /// Calls that got a credit and are to be sent by the trigger thread (run_deferred): (slot,
    /// seq) pairs, under mu; has_deferred is set with them.
    std::vector<std::pair<uint32_t, uint32_t>> credited;

    // --- buffers ----------------------------------------------------------------------------
    mutable MaybeSpinLock pool_mu;
    std::vector<SendBuf*> free_bufs;
    std::vector<std::unique_ptr<SendBuf>> all_bufs;
    std::vector<std::unique_ptr<RecvSlot>> recvs;
    unsigned recvs_down = 0;    ///< receives that failed to post (trigger thread only)
    std::atomic<int> pulls{0};  ///< PullJobs in flight

    std::mutex pend_mu;
    std::vector<PullJob*> pull_jobs;  ///< pulls in flight, for pull_timeout (under pend_mu)
    std::vector<PendingResult> pending;
    /// Large arguments of calls that timed out or were canceled: the target may still be
    /// pulling them (over sm it reads this memory directly and cannot be refused), so they are
    /// kept until its response (or ack) arrives, the peer fails, or ack_linger passes.
    std::vector<PendingResult> held;

    CtxCounters counters;
    /// Rate limits of the warnings a peer's messages write here, one line a second each, with
    /// how many were held back.
    log::Limiter unknown_rpc_log;      ///< calls to a procedure this engine lacks
    log::Limiter signature_log;        ///< calls whose signature differs
    log::Limiter malformed_log;        ///< messages whose header does not decode
    log::Limiter missing_context_log;  ///< messages for a context this engine lacks
    log::Limiter one_way_lost_log;     ///< one-way calls whose large arguments were lost
    log::Limiter pull_timeout_log;     ///< pulls the peer did not serve in time
    /// A peer that sends this many messages in a row whose header does not decode is
    /// disconnected (na::Transport::addr_disconnect, where the transport has connections).
    static constexpr uint32_t kMalformedInARow = 16;
    /// Per-procedure statistics, by StatsIndex index (null without Options::stats; an entry
    /// is null until its procedure's first call here).
    std::unique_ptr<std::atomic<ProcCounters*>[]> procs;
    /// The statistics of (id, provider) on this context, made on first use. Any thread.
    ProcCounters* proc_counters(RpcId id, uint16_t provider);
    /// The same by StatsIndex index.
    ProcCounters* counters_at(uint32_t index) {
        ProcCounters* p = procs[index].load(std::memory_order_acquire);
        return p ? p : make_counters(index);
    }
    ProcCounters* make_counters(uint32_t index);
    /// The same for the calls this context makes (under mu): the last procedure called is
    /// kept, so a run of calls to one procedure looks nothing up.
    ProcCounters* client_counters_locked(RpcId rpc, uint16_t provider) {
        const uint64_t key = uint64_t(rpc) << 16 | provider | uint64_t(1) << 48;
        if (key != last_called) [[unlikely]] {
            last_called_pc = proc_counters(rpc, provider);
            last_called = key;
        }
        return last_called_pc;
    }
    uint64_t last_called = 0;  ///< (1 << 48 | id << 16 | provider) of last_called_pc
    ProcCounters* last_called_pc = nullptr;
    CallTimer client_timer;  ///< under mu
    CallTimer server_timer;  ///< trigger thread
    QuietWatch quiet;        ///< progress and trigger threads
    unsigned trigger_calls = 0;
    TimePoint next_sweep{};

    // --- admission (request.cpp; trigger thread, except the atomic counts) -------------------
    std::atomic<uint32_t> held_requests{0};  ///< requests handed to handlers, not answered
    std::unordered_map<na::AddrImpl*, std::unique_ptr<PeerLoad>> loads;
    PeerLoad* last_load = nullptr;
    PeerLoad any_peer;            ///< the load of every peer when max_requests_per_peer is 0
    bool refusal_logged = false;  ///< a refusal was logged since the last sweep

    // --- cancel notices (request.cpp): calls their callers canceled (wire::kCancel) ----------
    /// Names one received call: its caller, its seq and the caller's context.
    struct CancelNotice {
        na::AddrImpl* peer = nullptr;  ///< the caller's canonical address (compared, never used)
        uint32_t seq = 0;
        uint8_t reply_ctx = 0;
        static CancelNotice of(const na::Addr& source, uint32_t seq, uint8_t reply_ctx) {
            return {source.impl()->canonical(), seq, reply_ctx};
        }
        friend bool operator==(const CancelNotice&, const CancelNotice&) = default;
    };
    static constexpr std::size_t kMaxCancelNotices = 1024;
    mutable std::mutex cancel_mu;
    std::deque<CancelNotice> cancels;       ///< under cancel_mu, oldest first
    std::atomic<std::size_t> n_cancels{0};  ///< cancels.size(): read without the lock
    /// Functions to run when a notice for their call arrives (Request::on_cancel), under
    /// cancel_mu. Few: only handlers that answer later register one.
    struct CancelWatcher {
        CancelNotice call;
        uint64_t id = 0;
        std::function<void()> fn;
    };
    std::vector<CancelWatcher> cancel_watchers;
    uint64_t next_watch = 0;
    bool watches_closed = false;  ///< begin_shutdown() dropped them; none registers after
    /// Register `fn` for the call; 0 when a notice for it came already (then the caller runs
    /// fn itself).
    uint64_t watch_cancel(const na::Addr& source, uint32_t seq, uint8_t reply_ctx,
                          std::function<void()>& fn);
    void unwatch_cancel(uint64_t id) noexcept;
    /// A request was answered: its notice, if any, goes (its seq may name a new call later).
    void forget_cancel(const na::Addr& source, uint32_t seq, uint8_t reply_ctx) noexcept;
    /// begin_shutdown(): drop every watch (their functions are destroyed without the lock).
    void close_cancel_watches() noexcept;
    void on_cancel(const wire::Header& h, const na::Addr& source);
    [[nodiscard]] bool cancel_noticed(const na::Addr& source, uint32_t seq,
                                      uint8_t reply_ctx) const noexcept;
    /// Request::cancelled() and CancelRef::cancelled(): the deadline passed, or a notice came.
    [[nodiscard]] bool call_ended(TimePoint deadline, const na::Addr& source, uint32_t seq,
                                  uint8_t reply_ctx) const noexcept;
    /// sweep(): forget every notice once the context holds no request (counted only when
    /// admission limits are on; otherwise the oldest notices make room for new ones).
    void clear_cancels_if_idle() noexcept;
    uint64_t rng = 0x9e3779b97f4a7c15ull;  ///< jitter of busy retries (under mu)

    // --- setup / teardown (context.cpp) -----------------------------------------------------
    Result<void> start(unsigned recv_depth, uint32_t max_inflight);
    /// Fail every call with shutdown, cancel receives and watches (engine destruction).
    void begin_shutdown();
    [[nodiscard]] bool drained() const;

    // --- calls (context.cpp) -----------------------------------------------------------------
    /// The destination is of this transport and the engine is not shutting down.
    Result<void> check_forward(const na::Addr& dest) const;
    /// `filled`: a send buffer `args` was written into, in place (it then fits the eager
    /// size); forward() owns it (sends it or gives it back).
    Result<CallId> forward(const na::Addr& dest, RpcId id, std::span<const std::byte> args,
                           const CallOptions& opts, ResponseFn done, SendBuf* filled = nullptr);
    Result<void> cancel(CallId call);
    void on_call_sent(uint32_t seq, bool one_way, Errc status);
    void on_response(const wire::Header& h, std::span<const std::byte> payload,
                     const na::Addr& source);
    /// Complete the call `seq` from `source` with `r` if it is still pending.
    bool complete_call(uint32_t seq, const na::Addr* source, Result<std::span<const std::byte>> r,
                       bool count_response);
    Peer* peer_for_locked(const na::Addr& dest);
    /// message_too_large for `what` ("forward: N bytes of arguments exceed"), naming
    /// Options::max_payload as the user sets it and what to do `instead`.
    [[nodiscard]] Error too_large(std::string what, std::string_view instead) const;
    /// Under mu: should this peer get a watch now? Claims the posting (watch_posting) when so.
    bool claim_watch_locked(Peer* p) noexcept;
    /// Post a claimed watch, without mu held across the transport call (takes it after).
    void post_watch(Peer* p);
    void on_watch(Peer* p, const na::Completion& c);
    /// Take the completion out of a slot and free it (under mu). Large args are moved to
    /// `garbage` so they are deregistered outside the lock; `peer`, if given, gets the address
    /// the call went to.
    /// `outcome` and `bytes_in` (the result's size) count in the call's procedure statistics.
    ResponseFn release_slot_locked(uint32_t idx, std::unique_ptr<LargeOut>& garbage, na::Addr* peer,
                                   Errc outcome, std::size_t bytes_in = 0);
    /// rpc=trace lines of the calls release_slot_locked ended (under mu), logged by CallsLock
    /// once mu is released.
    std::vector<std::string> ended_lines;
    /// Run a call's completion, `peer` being Context::response_peer() meanwhile.
    static void run_response(ResponseFn& fn, const na::Addr& peer,
                             Result<std::span<const std::byte>> r);
    void heap_push_locked(uint32_t idx);
    void heap_remove_locked(uint32_t idx);
    void heap_fix_locked(std::size_t i);
    void publish_deadline_locked();
    unsigned expire_timers();
    unsigned run_deferred();
    void defer_locked(ResponseFn fn, na::Addr peer, Error e);
    void sweep(TimePoint now);
    void maybe_sweep_idle();

    // --- messages (request.cpp) ----------------------------------------------------------------
    void post_recv(RecvSlot& rs);
    void on_recv(RecvSlot& rs, const na::Completion& c);
    void handle_message(std::span<const std::byte> msg, const na::Addr& source, uint8_t named_ctx);
    void dispatch(const wire::Header& h, std::span<const std::byte> input, const na::Addr& source);
    Result<void> send_reply(const na::Addr& dest, uint32_t seq, RpcId rpc_id, uint8_t dest_ctx,
                            Errc status, std::span<const std::byte> out, SendBuf* filled = nullptr,
                            uint64_t trace = 0);
    /// Send header + payload from a pooled buffer (payload fits the eager size). `filled`: the
    /// payload was written in place into that buffer (behind the header room); it is taken.
    Result<void> send_message(const na::Addr& dest, wire::Header h,
                              std::span<const std::byte> payload, SendInfo info = {},
                              SendBuf* filled = nullptr);
    /// Call `write` on a pooled send buffer's payload room. In place: the buffer (to pass as
    /// `filled`) and the bytes. Spilled: no buffer, and the writer's own bytes.
    struct Written {
        SendBuf* buf = nullptr;
        std::span<const std::byte> bytes;
    };
    Result<Written> write_payload(PayloadWriter write);
    /// Gives a `filled` buffer back if nobody took it.
    struct BufGuard {
        Impl* im;
        SendBuf* sb;
        ~BufGuard() {
            if (sb) im->release_buf(sb);
        }
        SendBuf* take() noexcept { return std::exchange(sb, nullptr); }
    };
    void send_ack(const na::Addr& dest, const wire::Header& of, bool one_way_ack,
                  Errc status = Errc::ok);
    void on_ack(const wire::Header& h, const na::Addr& source);
    /// Register `data` (copied) for peers to pull and write its descriptor.
    Result<std::unique_ptr<LargeOut>> make_large(std::span<const std::byte> data,
                                                 std::vector<std::byte>& descriptor);
    void start_pull(const wire::Header& h, std::span<const std::byte> payload,
                    const na::Addr& source);
    void on_pulled(PullJob* job, const na::Completion& c);
    /// The pulled payload of a request or a response failed: tell whoever waits.
    void pull_failed(const wire::Header& h, const na::Addr& source, Error e);
    void on_call_sent_buf(SendBuf* sb, Errc status);
    /// A message of `len` bytes in `sb` to this engine itself: handed to context `named_ctx`'s
    /// trigger (the lowest context where there is none), as if received from `eng->self`, and
    /// its send completed in this context's trigger after that. No transport is involved.
    Result<void> loop_back(SendBuf* sb, std::size_t len, uint8_t named_ctx);
    [[nodiscard]] bool is_self(const na::Addr& a) const noexcept {
        return eng->self && a.impl()->canonical() == eng->self.impl()->canonical();
    }
    SendBuf* acquire_buf();
    void release_buf(SendBuf* sb) noexcept;
    void expire_pending(TimePoint now);
    /// Ask the transport to cancel the pulls whose pull_timeout passed.
    void expire_pulls(TimePoint now);
    /// Admission of a large request before anything is allocated for it: the procedure is
    /// registered, the size within max_payload, and the budget has room (reserved on success).
    Result<void> admit_large(const wire::Header& h, uint64_t total);
    /// Admission of a request to its handler (Options::max_requests[_per_peer]): its peer's
    /// load to count it in, or busy.
    Result<PeerLoad*> admit(const na::Addr& source);
    PeerLoad* load_for(const na::Addr& source);
    /// Drop the loads of peers with nothing held (sweep).
    void trim_loads();
    /// A busy answer to call `seq` from `source`: if the call may be sent again, schedule it
    /// and return true (the call stays in flight).
    /// Send call `seq` again after a busy answer from `source`, not before `hint` (the target's
    /// retry-after, 0: none): false if it is not to be retried (then it fails with busy).
    bool schedule_retry(uint32_t seq, const na::Addr& source, Duration hint);
    /// Under mu: a call to `p` ended; hand its credit to the oldest call waiting for one.
    void pass_credit_locked(Peer* p);
    /// Send the calls that got a credit (trigger thread).
    void send_credited();
    /// A call sent later than forward() (after a busy answer, or once a credit came back):
    /// its message, copied out of its slot under the lock and sent after it.
    struct Resend {
        na::Addr dest;
        wire::Header h;
        std::vector<std::byte> payload;
        bool one_way = false;
    };
    /// The payload (arguments, or the descriptor of large ones) a call keeps to be sent later.
    static std::unique_ptr<Retry> keep_payload(std::span<const std::byte> payload, bool large,
                                               const CallOptions& opts);
    Resend resend_of_locked(const CallSlot& s) const;
    /// Send it; if that fails, the call completes with the error, prefixed by `what`.
    bool send_kept(const Resend& r, std::string_view what);
    void hold_args(uint32_t seq, na::Addr dest, std::unique_ptr<LargeOut> args);
    /// The target answered (or acked) call `seq`: arguments held for it can go.
    void release_held(uint32_t seq, const na::Addr& dest);
};

/// The call table's lock (Context::Impl::mu) where calls may end (release_slot_locked): on
/// release, the rpc=trace lines of those calls are logged, without the lock.
class CallsLock {
  public:
    explicit CallsLock(Context::Impl& c) noexcept : c_(c) { c_.mu.lock(); }
    ~CallsLock();
    CallsLock(const CallsLock&) = delete;
    CallsLock& operator=(const CallsLock&) = delete;

  private:
    Context::Impl& c_;
};

/// The context whose trigger() runs on this thread now (Context::trigger), if any: an answer
/// sent from it counts in ProcCounters::server without atomics. Initial-exec: read and written
/// on every call, it costs a load from the thread pointer instead of a __tls_get_addr call
/// (the library is linked, not dlopen'ed; a few bytes of the static TLS block).
extern thread_local const Context::Impl* tl_triggering [[gnu::tls_model("initial-exec")]];
/// The trace id of the handler running on this thread (current_trace_id()); initial-exec too.
extern thread_local uint64_t tl_trace [[gnu::tls_model("initial-exec")]];

inline int64_t to_ns(TimePoint t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace talaria::core
