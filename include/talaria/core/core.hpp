// The RPC core: registration, forward/respond, one-way calls, large arguments and results,
// deadlines, cancel, several contexts, peer failure, counters. Errors are values here; the
// C++ API (talaria/talaria.hpp) builds futures, coroutines and exceptions on top.
//
// Model (Mercury's hg_core, with eRPC's response matching):
//  - An Engine owns one na::Transport and N Contexts (na contexts 0..N-1). Each Context keeps
//    `recv_depth` unexpected receives posted, a table of its outgoing calls, a deadline heap,
//    and is driven by one thread at a time through progress() + trigger().
//  - A call is sent as an na unexpected message to (peer, target context). Its response comes
//    back as an unexpected message to the caller's context, flagged as a response, and is
//    matched by the core against the call table by sequence number (slot + generation). So a
//    response that arrives after its call timed out or was canceled is simply dropped: nothing
//    is left behind in the transport (a posted expected receive would strand it there).
//  - Peer failure: while calls to a peer are in flight the context keeps one na expected
//    receive posted from that peer with a tag nobody sends (its "watch"); the transport fails it
//    with `disconnected` when the peer dies, and the core then fails every call to that peer.
//  - Arguments or results longer than the eager size travel as a descriptor of registered
//    memory: the receiver pulls the bytes with an na get and acknowledges (docs/protocol.md).
//
// Callbacks (ResponseFn, handlers) run from Context::trigger() on the thread that triggers.
// Ownership: forward() copies the argument bytes (into the send buffer, or into a buffer the
// core owns until the peer has pulled them); respond() copies the result bytes the same way.
// forward_in_place() and respond_in_place() let the caller write them into the send buffer.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "talaria/core/stats.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/clock.hpp"
#include "talaria/util/inplace_function.hpp"
#include "talaria/util/result.hpp"

namespace talaria::core {

/// Identifies a procedure on the wire. Derived from its name by rpc_id(), so every process
/// computes the same id without exchanging anything.
using RpcId = uint32_t;

/// 32-bit FNV-1a of the name's bytes (docs/protocol.md). Ids 0 and 0xFFFFFF00 and above are
/// reserved for the core; a name hashing there is moved out by xor with 0x80000001.
constexpr RpcId rpc_id(std::string_view name) noexcept {
    uint32_t h = 2166136261u;
    for (char c : name) {
        h ^= static_cast<uint8_t>(c);
        h *= 16777619u;
    }
    if (h == 0 || h >= 0xFFFFFF00u) h ^= 0x80000001u;  // keep clear of the reserved ids
    return h;
}

/// How the message of a `not_found` answer to an unregistered id begins ("no RPC with id
/// 0x........ is registered at <address>"), so that the API can tell it from a handler's own
/// not_found (docs/protocol.md).
inline constexpr std::string_view kNoRpcMessage = "no RPC with id";
/// How the message of an invalid_argument answer to a call whose signature hash differs from
/// the registered one begins ("signature mismatch: <address> registered '<name>' as <types>:
/// ..."), so that the API can word it from the caller's side.
inline constexpr std::string_view kSignatureMessage = "signature mismatch:";

class Engine;
class Context;
class Request;
struct PeerLoad;

struct Options {
    na::Options na;                ///< listen, thread_safe, max_ops, max_contexts
    uint8_t contexts = 1;          ///< contexts 0 .. contexts-1 (at most na.max_contexts)
    unsigned recv_depth = 16;      ///< unexpected receives kept posted per context
    uint32_t max_inflight = 4096;  ///< outgoing calls in flight per context (<= 32768)
    bool checksum = false;         ///< crc32c over every message sent (received ones are
                                   ///< checked whenever the sender added one)
    Duration ack_linger = std::chrono::seconds(60);  ///< how long a large result waits for
                                                     ///< the caller to pull it
    std::size_t eager_limit = 0;  ///< cap the eager size below the transport's (0: none)
    std::size_t max_payload = std::size_t{1} << 30;  ///< largest argument/result accepted
                                                     ///< from a peer (pulled into memory)
    /// Bytes of large arguments (those past the eager size, pulled from the caller) the
    /// engine holds at once, over all its contexts, while they are pulled and handled. A call
    /// that does not fit is refused at once with Errc::busy (the caller may retry); at least
    /// max_payload.
    std::size_t large_budget = std::size_t{2} << 30;
    /// How long pulling a peer's large payload may take. Past it the pull is canceled where
    /// the transport can withdraw it, and the call fails with Errc::timeout.
    Duration pull_timeout = std::chrono::seconds(60);
    /// Requests one context holds at once: handed to their handler and not answered yet (a
    /// handler that keeps the Request to answer later, an API coroutine that awaits). A request
    /// past it is answered Errc::busy at once and its handler does not run; a one-way request
    /// is dropped (counted in busy_refused). The engine holds at most contexts x this.
    /// 0: no limit.
    uint32_t max_requests = 16384;
    /// The same for the requests of one peer (one calling engine) on one context, so that a
    /// flooding peer cannot take all of max_requests from the others. The default equals the
    /// default max_inflight of a caller's context. 0: no limit.
    uint32_t max_requests_per_peer = 4096;
    /// Calls one context keeps sent to one peer at once: its credits with that peer, as
    /// eRPC's sessions have. A call past them is not refused: the context keeps it (and a copy
    /// of its arguments) and sends it as soon as an earlier call to that peer completes, in
    /// the order of forward(). A caller whose windows toward a server add up to no more than
    /// that server's max_requests_per_peer is never refused by it. 0: no window.
    uint32_t peer_window = 0;
    /// A hint sent with every busy answer (admission limits, large-argument budget): a caller
    /// that retries (CallOptions::busy_retries) waits at least this long before it sends the
    /// call again, and one that does not sees it in the error's message. Whole milliseconds,
    /// at most about 49 days; 0: no hint (callers back off on their own).
    Duration busy_retry_after = Duration::zero();
    /// Per-procedure statistics (Engine::proc_stats): calls, outcomes, bytes and latency
    /// histograms of every procedure called or served, kept per context (no lock or allocation
    /// per call; 37 KiB per procedure and context, on its first call there) and summed when
    /// read. Off: none of it is kept (the engine's Counters still are).
    bool stats = true;
    /// How the statistics time calls for their latency histograms (the counts of calls,
    /// outcomes and bytes are exact either way). A context times every call it makes (and,
    /// apart, every call it serves) while those come at least this far apart; when they come
    /// faster it times a random sample, one call in up to 64, sized to keep the timed ones
    /// about this far apart: a timed call costs two reads of the CPU's counter (~10 ns each)
    /// and a histogram record, under 0.5% of the time between timed calls at the default. A
    /// histogram's count is then the calls timed; its quantiles estimate every call's. Zero:
    /// time every call.
    Duration stats_timing_gap = std::chrono::microseconds(10);
};

/// Per-engine counters (sums over contexts). Bulk counters are fed by the bulk layer through
/// Engine::note_bulk().
struct Counters {
    uint64_t rpcs_sent = 0;      ///< requests forwarded (incl. one-way)
    uint64_t rpcs_received = 0;  ///< requests received and dispatched
    uint64_t responses_sent = 0;
    uint64_t responses_received = 0;
    uint64_t bytes_sent = 0;  ///< argument + result payload bytes sent (eager or pulled)
    uint64_t bytes_received = 0;
    uint64_t bulk_ops = 0;  ///< na put/get issued (by the core for large payloads, and
                            ///< by bulk transfers)
    uint64_t bulk_bytes = 0;
    uint64_t timeouts = 0;
    uint64_t canceled = 0;
    uint64_t errors = 0;        ///< calls failed, bad messages dropped, handler errors
    uint64_t in_flight = 0;     ///< outgoing calls not yet completed (a snapshot)
    uint64_t busy_refused = 0;  ///< requests refused with busy (max_requests[_per_peer])
    uint64_t busy_retries = 0;  ///< calls sent again after a busy answer (CallOptions)
    uint64_t held = 0;          ///< requests handed to handlers and not answered (a snapshot)
};

/// Options of one call.
struct CallOptions {
    uint8_t target_context = 0;  ///< the remote context that runs the handler
    /// 0: no deadline. Otherwise the call completes with Errc::timeout unless its response is
    /// read before now + timeout (a response read later is dropped, even when the deadline
    /// timer has not run yet).
    Duration timeout{0};
    bool one_way = false;  ///< no response: completes once sent (or once pulled, if large)
    /// Times the call is sent again when the target answers Errc::busy (its admission limits
    /// or its large-argument budget), after a wait that starts at busy_backoff and doubles
    /// each time (up to 1 s), each randomized by +-25%; when the answer carries the target's
    /// retry-after hint (Options::busy_retry_after), the wait is at least that (up to +25%). A
    /// retry that would start past the call's deadline is not made: the call then fails with busy.
    /// The arguments are copied and kept for this (only when this is not 0). Not for one-way calls
    /// (nothing answers).
    uint8_t busy_retries = 0;
    Duration busy_backoff = std::chrono::milliseconds(1);
    /// Which instance of the procedure at the target (Engine::register_rpc's provider).
    uint16_t provider = 0;
    /// A hash of the caller's argument and result types; a target that registered the
    /// procedure with a different one answers invalid_argument instead of running it. 0: not
    /// checked.
    uint64_t signature = 0;
    /// The call's trace id, carried to the target (Request::trace_id()) and named in both
    /// sides' rpc=trace log lines. 0: the trace of the handler running on this thread
    /// (current_trace_id()), so that the calls a handler makes carry its caller's; none there.
    uint64_t trace_id = 0;
};

/// The trace id of the request whose handler runs on this thread (0: none): set while a
/// handler runs on a context's thread, and by the API around a handler on an executor.
[[nodiscard]] uint64_t current_trace_id() noexcept;
/// Makes `id` this thread's current trace id until destroyed (then the previous one again).
class TraceScope {
  public:
    explicit TraceScope(uint64_t id) noexcept;
    ~TraceScope();
    TraceScope(const TraceScope&) = delete;
    TraceScope& operator=(const TraceScope&) = delete;

  private:
    uint64_t prev_;
};

/// How a procedure is registered (Engine::register_rpc).
struct Registration {
    /// Several instances of one procedure may serve on one engine, one per provider id (a
    /// service's instances: Thallium's and Margo's providers); a call names one with
    /// CallOptions::provider.
    uint16_t provider = 0;
    /// The hash of the handler's argument and result types (0: calls are not checked), and
    /// their spelling ("int(int, int)"), which a mismatched caller is told.
    uint64_t signature = 0;
    std::string signature_text;
};

/// Completes a call, once: the result bytes (valid during the callback only), or the error:
/// timeout, canceled, disconnected, unreachable, not_found (no such RPC at the target), the
/// handler's error, shutdown, ... Context::response_peer() names the peer meanwhile.
using ResponseFn = InplaceFunction<void(Result<std::span<const std::byte>>&&), 48>;

/// Writes a payload (arguments or a result) straight into the send buffer, so that it is
/// encoded once, in place, instead of into a scratch buffer first and then copied. It is called
/// once, with the room behind the header (the eager size), and returns:
///  - the bytes it wrote: a prefix of `room` (sent from there, no copy);
///  - or, when they did not fit, all of them in a buffer of its own that stays valid until the
///    call that took the writer returns (they then travel as if passed as a span: copied, or as
///    large data the peer pulls);
///  - or an error: nothing is sent, and the call fails with it.
/// A reference to a callable, which must outlive the call that takes it.
class PayloadWriter {
  public:
    using Out = Result<std::span<const std::byte>>;
    template <class F>
    static constexpr bool kWrites = std::is_invocable_r_v<Out, F&, std::span<std::byte>> &&
                                    !std::is_same_v<std::remove_cvref_t<F>, PayloadWriter>;

    /// Implicit, like a span: pass the callable itself.
    template <class F, std::enable_if_t<kWrites<F>, int> = 0>
    PayloadWriter(F& f) noexcept  // NOLINT(google-explicit-constructor)
        : obj_(const_cast<void*>(static_cast<const void*>(&f))),
          fn_([](void* o, std::span<std::byte> room) -> Out {
              return (*static_cast<F*>(o))(room);
          }) {}
    Out operator()(std::span<std::byte> room) const { return fn_(obj_, room); }

  private:
    void* obj_;
    Out (*fn_)(void*, std::span<std::byte>);
};

/// Names an outgoing call, for cancel().
struct CallId {
    uint32_t seq = 0;
    [[nodiscard]] bool valid() const noexcept { return seq != 0; }
};

/// A handler. It runs from trigger() on the context that received the call, with the request;
/// it may respond before returning, or move the Request out and respond later from any thread.
using Handler = std::function<void(Request&)>;

/// What a handler's helpers keep of a received call to ask later, from any thread, whether its
/// caller still waits for it (Request::cancel_ref()). Copyable; valid while the engine lives.
class CancelRef {
  public:
    CancelRef() noexcept = default;
    [[nodiscard]] bool valid() const noexcept { return ctx_ != nullptr; }
    /// Request::deadline() of the call.
    [[nodiscard]] TimePoint deadline() const noexcept { return deadline_; }
    /// Request::cancelled() of the call.
    [[nodiscard]] bool cancelled() const noexcept;
    /// Whether the deadline (not a cancel message) is what ended it.
    [[nodiscard]] bool expired() const noexcept {
        return deadline_ != TimePoint::max() && Clock::now() >= deadline_;
    }

  private:
    friend class Request;
    Context* ctx_ = nullptr;
    na::Addr source_;
    uint32_t seq_ = 0;
    uint8_t reply_ctx_ = 0;
    TimePoint deadline_ = TimePoint::max();
};

/// A function run when the caller of a received call cancels it (Request::on_cancel). Move-only;
/// the watch ends when it is destroyed or reset(), or once its function ran. Destroy it before
/// the engine.
class CancelWatch {
  public:
    CancelWatch() noexcept = default;
    CancelWatch(CancelWatch&& o) noexcept
        : ctx_(std::exchange(o.ctx_, nullptr)), id_(std::exchange(o.id_, 0)) {}
    CancelWatch& operator=(CancelWatch&& o) noexcept {
        if (this != &o) {
            reset();
            ctx_ = std::exchange(o.ctx_, nullptr);
            id_ = std::exchange(o.id_, 0);
        }
        return *this;
    }
    CancelWatch(const CancelWatch&) = delete;
    CancelWatch& operator=(const CancelWatch&) = delete;
    ~CancelWatch() { reset(); }
    /// Stop watching: the function is not started after this returns, unless a cancel notice
    /// already claimed it on another thread (it may then start or be running still: what it
    /// touches is held weakly or by shared ownership).
    void reset() noexcept;

  private:
    friend class Request;
    Context* ctx_ = nullptr;
    uint64_t id_ = 0;
};

struct ProcCounters;

/// One received call. Move-only. If destroyed without a response (and not one-way), it responds
/// with Errc::internal ("the handler dropped the request") so no caller ever hangs.
class Request {
  public:
    Request() noexcept = default;
    Request(Request&& o) noexcept;
    Request& operator=(Request&& o) noexcept;
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    ~Request();

    [[nodiscard]] bool valid() const noexcept { return ctx_ != nullptr; }
    [[nodiscard]] RpcId rpc_id() const noexcept { return rpc_id_; }
    [[nodiscard]] const na::Addr& source() const noexcept {
        return lent_source_ ? *lent_source_ : source_;
    }
    /// What the caller proved about itself: the key id of the shared secret on tcp, ofi and
    /// ucx+tcp with na::Options::auth, its uid and pid on sm, nothing otherwise
    /// (na::PeerIdentity).
    [[nodiscard]] na::PeerIdentity peer_identity() const {
        const na::Addr& s = source();
        return s ? s.impl()->transport()->peer_identity(s) : na::PeerIdentity{};
    }
    /// The context that received it (the handler runs there).
    [[nodiscard]] Context& context() const noexcept { return *ctx_; }
    [[nodiscard]] bool one_way() const noexcept { return one_way_; }
    /// The provider the caller named (CallOptions::provider).
    [[nodiscard]] uint16_t provider() const noexcept { return provider_; }
    /// The caller's trace id (CallOptions::trace_id; 0: none).
    [[nodiscard]] uint64_t trace_id() const noexcept { return trace_; }
    /// When the caller stops waiting: its deadline, carried as the time it had left when it
    /// sent the call and counted from the arrival here (so it errs late by the one-way
    /// latency, never early). TimePoint::max() when the call has none.
    [[nodiscard]] TimePoint deadline() const noexcept { return deadline_; }
    /// Whether the caller no longer wants the answer: it canceled the call (its cancel message
    /// has arrived), or the call's deadline passed. A long handler checks it and stops early;
    /// its answer, if it still sends one, is dropped by the caller. Any thread.
    [[nodiscard]] bool cancelled() const noexcept;
    /// The same question, kept apart from the Request (e.g. by a transfer it started).
    [[nodiscard]] CancelRef cancel_ref() const;
    /// Run `fn` once when the caller's cancel message for this call arrives (at once, on this
    /// thread, if it already has), on the thread that receives it: a handler that answers later
    /// stops the work it started for the call (the calls it made on, say). Only a cancel runs
    /// it, not the deadline (deadline() says when that is). `fn` must not block; it runs
    /// without any lock of the context held, and may call, cancel and respond. The watch lasts
    /// as long as the returned CancelWatch.
    [[nodiscard]] CancelWatch on_cancel(std::function<void()> fn) const;
    /// The argument bytes: valid during the handler call only (not after a move of the Request
    /// out of the handler; decode them first).
    [[nodiscard]] std::span<const std::byte> input() const noexcept { return input_; }
    /// The handler starts now, later than its arrival (it waited in an executor's queue): the
    /// wait counts in the procedure's queueing delay, and its handler time starts here. Once,
    /// from the thread about to run it.
    void note_started() noexcept;

    /// Send the result (copied). Once; from any thread. One-way requests: not_supported.
    Result<void> respond(std::span<const std::byte> output);
    /// The same, the result written by `write` straight into the send buffer. If `write` fails,
    /// its error is returned and the request is not answered yet.
    Result<void> respond_in_place(PayloadWriter write);
    /// Send an error with a message for the caller.
    Result<void> respond_error(Errc code, std::string_view message);
    [[nodiscard]] bool responded() const noexcept { return responded_; }

  private:
    friend class Context;
    Result<void> send_response(Errc status, std::span<const std::byte> output);
    Result<void> check_respond() const;
    Result<void> answered(Result<void> r);
    /// Give back this request's place in its context's admission counts (once answered).
    void uncount() noexcept;

    Context* ctx_ = nullptr;
    // While the handler runs, the source is lent by the receive (no reference count taken);
    // moving the request out of the handler takes a reference.
    const na::Addr* lent_source_ = nullptr;
    na::Addr source_;
    std::span<const std::byte> input_;
    RpcId rpc_id_ = 0;
    uint32_t seq_ = 0;
    uint8_t reply_ctx_ = 0;
    bool one_way_ = false;
    bool responded_ = false;
    uint16_t provider_ = 0;
    PeerLoad* load_ = nullptr;  ///< counted in this peer's and the context's held requests
    TimePoint deadline_ = TimePoint::max();
    ProcCounters* stats_ = nullptr;  ///< its procedure's on this context (Options::stats)
    uint64_t started_ = 0;  ///< ticks(): its arrival, then its handler's start; 0: not timed
    uint64_t trace_ = 0;
    uint64_t logged_ns_ = 0;  ///< now_ns() at its arrival, with rpc=trace logging
    /// What note_answered counted, to settle it once the answer's send returned.
    struct Counted {
        ProcCounters* pc = nullptr;
        uint64_t took = 0;
        bool shared = false;  ///< in server_shared (not answered on the trigger thread)
        bool timed = false;   ///< `took` is in the latency histogram
        /// What it was counted as: the answer's status, or timeout / canceled for an ok its
        /// caller no longer waited for.
        Errc as = Errc::ok;
    };
    /// Count the answer (or the end of a one-way handler) in stats_, once.
    Counted note_answered(Errc status, std::size_t bytes) noexcept;
    /// The send of an answer counted as `c` returned `sent`: a refusal with again takes the
    /// count back (the next respond counts), another failure counts its code instead.
    void settle_answer(const Counted& c, std::size_t bytes, const Result<void>& sent) noexcept;
    /// The rpc=trace line of the answer (when its arrival was logged).
    void log_answer(Errc status, std::size_t bytes) const;
};

/// One context of an Engine: posted receives, outgoing calls and their deadlines.
class Context {
  public:
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    [[nodiscard]] uint8_t id() const noexcept;
    [[nodiscard]] Engine& engine() const noexcept { return *engine_; }
    [[nodiscard]] na::Context& na_context() const noexcept;

    /// Send a call of `id` with argument bytes `args` to `dest`. `done` runs exactly once, from
    /// this context's trigger(), unless forward() itself fails (then it never runs).
    /// Any thread may call it.
    Result<CallId> forward(const na::Addr& dest, RpcId id, std::span<const std::byte> args,
                           const CallOptions& opts, ResponseFn done);
    /// The same, the arguments written by `write` straight into the send buffer (no copy when
    /// they fit the eager size). An error from `write` is returned; `done` never runs then.
    Result<CallId> forward_in_place(const na::Addr& dest, RpcId id, PayloadWriter write,
                                    const CallOptions& opts, ResponseFn done);
    /// Cancel a call: `done` then runs with canceled (from trigger()), unless it already
    /// completed (not_found). Any thread.
    Result<void> cancel(CallId call);
    /// Inside a call's `done` (on the thread running it): the peer the call went to (the
    /// response's source, with no reference count taken); null anywhere else. A caller that
    /// needs the peer when its call completes (to decode handles, to name it in an error)
    /// reads it here instead of keeping a copy per call.
    [[nodiscard]] static const na::Addr* response_peer() noexcept;

    /// Make progress until something is ready for trigger() or `timeout` passes (timeout).
    /// 0 polls once; negative waits forever. Wakes early for deadlines of calls.
    Result<void> progress(Duration timeout);
    /// Run ready callbacks (responses, handlers, expired deadlines); returns how many ran.
    unsigned trigger(unsigned max = UINT_MAX);
    /// Blocking in your own loop: wait_fd() readable means progress() has work; call
    /// try_wait() first, and block only when it returns true.
    [[nodiscard]] int wait_fd() const noexcept;
    bool try_wait();
    /// The nearest call deadline of this context (TimePoint::max() if none): cap any external
    /// wait on wait_fd() by it.
    [[nodiscard]] TimePoint next_deadline() const noexcept;

    /// Outgoing calls of this context not yet completed.
    [[nodiscard]] std::size_t in_flight() const noexcept;

    struct Impl;

  private:
    friend class Engine;
    friend class Request;
    friend class CancelRef;
    friend class CancelWatch;
    Context(Engine* e, std::unique_ptr<Impl> impl);
    Engine* engine_;
    std::unique_ptr<Impl> impl_;
};

/// An RPC endpoint: one transport, its contexts, the registered procedures and the counters.
class Engine {
  public:
    /// Open the transport named by `address` ("tcp://127.0.0.1:0", "sm://", "inproc://x", ...)
    /// and create its contexts with their receives posted.
    static Result<std::unique_ptr<Engine>> open(std::string_view address, const Options& opts = {});
    /// The same over a transport the caller opened and keeps: the engine borrows it (it must
    /// outlive the engine, and closes after it), creates its contexts 0..opts.contexts-1 on it
    /// (those ids must be free there) and ignores `opts.na`. Mercury's HG_Init_opt2 with an NA
    /// class of the program's is this.
    static Result<std::unique_ptr<Engine>> open(na::Transport& transport, const Options& opts = {});
    /// Completes every outgoing call still in flight with Errc::shutdown (callbacks run here,
    /// on the destroying thread), cancels and drains the transport's operations, then closes.
    /// No other thread may use the engine meanwhile.
    ~Engine();
    Engine(const Engine&) = delete;
    /// Begin closing: complete every outgoing call still in flight with Errc::shutdown (their
    /// callbacks run here) and refuse new calls (forward() returns shutdown), while the engine
    /// is still whole, so callbacks that call it again find it working. No thread may progress
    /// or trigger the engine meanwhile. The destructor does this too; calling it first is safe.
    void shutdown();
    Engine& operator=(const Engine&) = delete;

    [[nodiscard]] na::Transport& transport() const noexcept;
    [[nodiscard]] uint8_t context_count() const noexcept;
    [[nodiscard]] Context& context(uint8_t i) const noexcept;

    /// Register `handler` for `id` (normally rpc_id(name)) and `reg.provider`; the name is
    /// kept for messages. already_exists if the id is taken for that provider (by this name or
    /// another that hashes the same). Any thread, any time: calls arriving for an id and
    /// provider not (yet) registered are answered with not_found.
    Result<void> register_rpc(RpcId id, std::string_view name, Handler handler,
                              const Registration& reg = {});
    Result<void> deregister_rpc(RpcId id, uint16_t provider = 0);
    /// The name registered for `id` (empty if none).
    [[nodiscard]] std::string rpc_name(RpcId id, uint16_t provider = 0) const;

    /// This engine was opened by another process and the caller is a child that inherited it
    /// across fork(). Every call then fails at once with Errc::invalid_state (forward,
    /// progress, respond, lookup, ...; trigger() runs nothing), and the destructor leaves the
    /// parent's threads, descriptors, peers and registrations as they are: it frees nothing,
    /// so what the engine holds stays with the child until it exits or execs (the engine's
    /// descriptors are close-on-exec). A child opens its own engine.
    [[nodiscard]] bool inherited() const noexcept;
    /// The invalid_state error of an inherited engine, naming `what` the caller tried.
    [[nodiscard]] Error inherited_error(std::string_view what) const;

    Result<na::Addr> lookup(std::string_view address);
    [[nodiscard]] na::Addr self() const;
    [[nodiscard]] std::string self_string() const;

    /// Largest argument/result payload sent inline; larger ones go by a pull.
    [[nodiscard]] std::size_t eager_size() const noexcept;
    [[nodiscard]] const Options& options() const noexcept;

    [[nodiscard]] Counters counters() const;
    /// The counters as a JSON object (one line).
    [[nodiscard]] std::string counters_json() const;
    /// Per-procedure statistics, summed over the contexts, in the order procedures were
    /// first seen (empty with Options::stats off). Any thread, any time: counts of calls in
    /// progress meanwhile may show in some fields and not yet in others.
    [[nodiscard]] std::vector<ProcStats> proc_stats() const;
    /// Name the procedure `id` in proc_stats() where this engine calls it without serving it
    /// (the API does, once per name). Any thread.
    void name_rpc(RpcId id, std::string_view name);
    /// The calls each context has in flight, per peer (a snapshot; takes each context's lock
    /// briefly). Any thread.
    [[nodiscard]] std::vector<PeerCalls> calls_in_flight() const;
    /// Requests each context holds (handed to handlers, not answered), index = context id.
    [[nodiscard]] std::vector<uint32_t> requests_held() const;
    /// Account a bulk transfer (called by the bulk layer): `ops` na put/get moving `bytes`.
    void note_bulk(uint64_t ops, uint64_t bytes, bool ok) noexcept;
    /// Account a whole transfer by direction (the API, with Options::stats): its bytes,
    /// outcome and the ticks() it took. Any thread.
    void note_transfer(bool pull, uint64_t bytes, bool ok, uint64_t ticks_taken) noexcept;
    /// The na layer's completions of every context, by operation type and outcome.
    [[nodiscard]] na::OpCounts na_counts() const noexcept;
    /// Transfers by direction: [0] pull, [1] push (zeros with Options::stats off).
    [[nodiscard]] std::array<TransferStats, 2> transfer_stats() const;

    struct Impl;

  private:
    Engine() = default;
    static Result<std::unique_ptr<Engine>> open_on(std::unique_ptr<na::Transport> owned,
                                                   na::Transport& transport, const Options& opts);
    friend class Context;
    friend class Request;
    std::unique_ptr<Impl> impl_;
};

}  // namespace talaria::core

#pragma GCC visibility pop
