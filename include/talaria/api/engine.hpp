// Engine: what users create. It owns a core::Engine (transport, contexts, procedures), the
// threads that drive it (background progress) or nothing (manual progress), and the extra na
// context that bulk transfers of this layer run on.
//
// Threads: in background mode every core context has one engine-owned thread running
// progress + trigger, and the bulk context has one more; handlers, response callbacks,
// then() continuations and resumed coroutines run on them. Because transfers complete on their
// own thread, a handler may block on a transfer (`req.pull(...).get()`) without stalling the
// context it runs on. In manual mode no thread is created: the caller drives progress(ctx) and
// trigger(ctx) (Future::get() and sync_wait() drive them while they wait).
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "talaria/api/endpoint.hpp"
#include "talaria/api/error.hpp"
#include "talaria/api/executor.hpp"
#include "talaria/api/future.hpp"
#include "talaria/api/signature.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/core/core.hpp"
#include "talaria/proc/proc.hpp"
#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria {

/// A bulk handle: memory exposed for one-sided transfers, serializable inside RPC arguments.
using Bulk = bulk::Handle;
/// One local memory region.
using Segment = bulk::Segment;
using Access = na::Access;
/// Peers may read (pull from) it.
inline constexpr Access read_only = Access::read_only;
/// Peers may write (push into) it.
inline constexpr Access write_only = Access::write_only;
inline constexpr Access read_write = Access::read_write;

/// Tag: the engine accepts connections (a server). `Engine e{"tcp://127.0.0.1:0", listen};`
struct Listen {
    explicit Listen() = default;
};
inline constexpr Listen listen{};

/// Tag for Engine::expose: the handle carries this engine's address, so that a process it is
/// forwarded to (not only the one it was sent to) transfers from this engine without naming
/// an endpoint. `client.expose(seg, talaria::read_only, talaria::bind_owner)`.
struct BindOwner {
    explicit BindOwner() = default;
};
inline constexpr BindOwner bind_owner{};

/// Who drives progress.
enum class ProgressMode : uint8_t {
    background,  ///< one engine-owned thread per context (and one for bulk transfers)
    manual,      ///< the caller: Engine::progress() / trigger(), or waiting in get()/sync_wait()
};
/// How a background thread waits for work.
enum class WaitMode : uint8_t {
    block,  ///< spin ~50 us polling, then sleep in the transport until woken
    busy,   ///< poll while there is work (lowest latency, one core per busy thread); a thread
            ///< whose context had nothing to do for kBusyIdle (see engine.cpp: 2 ms) sleeps in
            ///< the transport until woken, so idle contexts never take cycles from busy ones
};

struct EngineOptions {
    ProgressMode progress = ProgressMode::background;
    WaitMode wait = WaitMode::block;
    uint8_t contexts = 1;          ///< RPC contexts 0..contexts-1 (overrides core.contexts)
    bool checksum = false;         ///< crc32c on every message (overrides core.checksum)
    Duration default_timeout{0};   ///< for calls that set none (0: no deadline)
    unsigned handler_threads = 4;  ///< threads of Engine::handler_pool(), made on first use
    core::Options core{};          ///< advanced knobs of the RPC core (recv depth, eager limit...)
    /// Manual progress only: how a thread waiting for a result (Future::get(), sync_wait) makes
    /// progress on RPC context `ctx`, for up to `timeout`, instead of progressing and
    /// triggering that context itself. For an engine whose contexts a loop of the program's
    /// also drives (the Mercury C API's HG_Progress and HG_Trigger): the function must be safe
    /// to call from any thread beside that loop. Empty: the waiting thread drives the context.
    /// Not part of EngineConfig (a function is not configuration).
    std::function<void(uint8_t ctx, Duration timeout)> drive;
};

class Engine;
struct EngineConfig;
class Request;
template <class Sig>
class Procedure;

/// The trace id of the call whose handler runs on this thread (0: none); calls made here
/// carry it (Procedure::trace).
using core::current_trace_id;

namespace detail {

class EngineState;

/// A procedure's name and id. Interned by the engine (proc_info): one record per name, alive as
/// long as the engine, so that Procedures and calls in flight point at it without a reference
/// count (a count shared by the threads calling one procedure would be a cache line they all
/// write on every call).
struct ProcInfo {
    std::string name;
    core::RpcId id;
};
/// The record of `name` (created on first use). Lock-free once it exists.
const ProcInfo* proc_info(EngineState& e, std::string_view name);

/// Non-template services of the engine used by the templates of this layer (src/api).
/// What a call from context `from` needs of the engine, in one call per call: the context
/// (null when `from` is out of range: `count` says how many there are), the default timeout,
/// and who completes `st` recorded in it: a manual engine's driver (get() drives the context),
/// or the seat of the context of a background engine (get() takes it over from its progress
/// thread while it waits).
struct CallSite {
    core::Context* ctx = nullptr;
    uint8_t count = 0;
    Duration default_timeout{0};
};
CallSite call_site(EngineState& e, uint8_t from, StateBase& st) noexcept;
/// Start a transfer on the engine's bulk context; the Future completes from its trigger().
/// `from`: the request of the handler that starts it, whose cancel or deadline stops it.
Future<void> start_transfer(EngineState& e, bulk::Direction dir, const na::Addr& peer,
                            const Bulk& remote, std::size_t remote_off, const Bulk& local,
                            std::size_t local_off, std::size_t len,
                            const core::Request* from = nullptr);
/// The error a caller sees for a failed call of `name` to `peer`: not_found names the RPC; a
/// signature the target refused is set beside the caller's (`signature`, when the call was
/// checked).
Error call_error(std::string_view name, core::RpcId id, const na::Addr& peer, Error e,
                 std::string (*signature)() = nullptr);
/// A per-thread buffer for arguments and results that outgrow the send buffer (they then
/// travel as large data, copied by the core).
std::vector<std::byte>& scratch_buffer() noexcept;
/// The thread's scratch buffer, taken for one encoding and given back after: an encoding
/// nested in another on the same thread (a serialize function that calls or responds) gets a
/// vector of its own instead of clearing the outer one's bytes.
class ScratchLease {
  public:
    ScratchLease() noexcept : buf_(std::move(scratch_buffer())) {}
    ~ScratchLease() {
        auto& home = scratch_buffer();
        if (home.capacity() < buf_.capacity()) home = std::move(buf_);
    }
    ScratchLease(const ScratchLease&) = delete;
    ScratchLease& operator=(const ScratchLease&) = delete;
    std::vector<std::byte>& get() noexcept { return buf_; }

  private:
    std::vector<std::byte> buf_;
};
/// A core::PayloadWriter that encodes `v...` into the send buffer's room (proc::encode_into),
/// spilling into the thread's scratch buffer, and remembers whether the encoding failed (so
/// the caller can say "arguments" or "the result" instead of a transport error).
template <class... T>
struct EncodeInPlace {
    std::tuple<const T&...> v;
    std::optional<ScratchLease> lease;  ///< taken only where the values may spill
    bool failed = false;
    explicit EncodeInPlace(const T&... values) noexcept : v(values...) {}
    Result<std::span<const std::byte>> operator()(std::span<std::byte> room) {
        if constexpr (proc::detail::kAllFixed<T...>) {
            // Fixed-size values that fit the room never spill: no lease of the scratch buffer.
            if (room.size() >= proc::detail::kSumFixedSize<T...>) {
                std::vector<std::byte> unused;
                return std::apply(
                    [&](const T&... a) { return proc::encode_into(room, unused, a...); }, v);
            }
        }
        std::vector<std::byte>& spill = lease.emplace().get();
        auto r = std::apply([&](const T&... a) { return proc::encode_into(room, spill, a...); }, v);
        failed = !r;
        return r;
    }
};

template <class... T>
std::string signature_string() {
    std::string s = "(";
    bool first = true;
    ((s += (first ? "" : ", "), s += type_name<T>(), first = false), ...);
    return s + ")";
}

template <class T>
inline constexpr bool serializable_v = proc::Serializable<T>;
/// A result type is void or serializable.
template <class R>
constexpr bool result_serializable() {
    if constexpr (std::is_void_v<R>)
        return true;
    else
        return proc::Serializable<R>;
}

}  // namespace detail

/// A received call, as handlers see it. Move-only. Responding is once, from any thread; a
/// Request destroyed unanswered answers Errc::internal so no caller hangs.
class Request {
  public:
    Request() noexcept = default;
    Request(detail::EngineState* e, core::Request&& r) noexcept : engine_(e), req_(std::move(r)) {}
    Request(Request&&) noexcept = default;
    Request& operator=(Request&&) noexcept = default;

    [[nodiscard]] bool valid() const noexcept { return req_.valid(); }
    /// The caller.
    [[nodiscard]] Endpoint source() const { return Endpoint(engine_, req_.source()); }
    /// What the caller proved about itself (na::PeerIdentity): the key id of the shared secret
    /// on tcp, ofi and ucx+tcp with EngineOptions::core.na.auth, its uid and pid on sm, nothing
    /// otherwise. A handler can refuse a call with it (respond_error(Errc::access_denied, ...)).
    [[nodiscard]] na::PeerIdentity peer_identity() const { return req_.peer_identity(); }
    /// The context that received the call (the handler runs on its thread).
    [[nodiscard]] uint8_t context_id() const noexcept { return req_.context().id(); }
    [[nodiscard]] bool one_way() const noexcept { return req_.one_way(); }
    [[nodiscard]] bool responded() const noexcept { return req_.responded(); }
    /// The provider the caller named (Procedure::provider); the procedure's own when it was
    /// defined for one.
    [[nodiscard]] uint16_t provider() const noexcept { return req_.provider(); }
    /// The caller's trace id (Procedure::trace; 0: none). Calls this handler makes carry it.
    [[nodiscard]] uint64_t trace_id() const noexcept { return req_.trace_id(); }
    /// When the caller stops waiting (its timeout, counted from this call's arrival);
    /// TimePoint::max() when it set none.
    [[nodiscard]] TimePoint deadline() const noexcept { return req_.deadline(); }
    /// True once the caller canceled the call (Future::cancel) or its deadline passed: a long
    /// handler checks it and stops; what it answers then is dropped by the caller.
    [[nodiscard]] bool cancelled() const noexcept { return req_.cancelled(); }
    /// Run `fn` once when the caller cancels the call (Future::cancel), on the thread that
    /// hears of it (at once if it has), for as long as the returned watch lives: a handler that
    /// answers later stops what it started for the call, such as the calls it made on (cancel
    /// their futures). Not run for the deadline (deadline()). `fn` must not block; it holds
    /// what it touches weakly or by shared ownership (a notice that claimed it just before the
    /// watch is reset on another thread still runs it). The notice is read by the context's
    /// thread: a handler that keeps that thread busy hears of it once it returns. Destroy the
    /// watch before the engine (a closing engine drops every watch).
    [[nodiscard]] core::CancelWatch on_cancel(std::function<void()> fn) const {
        return req_.on_cancel(std::move(fn));
    }

    /// Respond with `v` (encoded with proc). Throws on failure; try_respond returns it.
    template <class T>
    void respond(const T& v) {
        detail::value_or_throw(try_respond(v));
    }
    /// Respond with nothing (a void procedure).
    void respond() { detail::value_or_throw(try_respond()); }
    template <class T>
    Result<void> try_respond(const T& v) {
        static_assert(detail::serializable_v<T>,
                      "talaria: a response type must be serializable with proc (see "
                      "docs/architecture.md, Making a type serializable)");
        // Encoded once, straight into the send buffer (see Procedure::operator()).
        detail::EncodeInPlace<T> write(v);
        auto r = req_.respond_in_place(write);
        if (!r && write.failed)
            return Error(r.code(), "encoding the result: " + r.error().message());
        return r;
    }
    Result<void> try_respond() { return req_.respond({}); }
    /// Fail the call with `code`; the caller gets an Exception with it and `message`.
    void respond_error(Errc code, std::string_view message) {
        detail::value_or_throw(try_respond_error(code, message));
    }
    Result<void> try_respond_error(Errc code, std::string_view message) {
        return req_.respond_error(code, message);
    }

    /// Pull `len` bytes from the caller's `remote`[remote_off..] into `local`[local_off..].
    /// The transfer belongs to this call: once the caller cancels it or its deadline passes, it
    /// fails with canceled or timeout instead of running on (checked when it starts and about
    /// every 10 ms while it runs).
    [[nodiscard]] Future<void> pull(const Bulk& remote, std::size_t remote_off, const Bulk& local,
                                    std::size_t local_off, std::size_t len) const {
        return detail::start_transfer(*engine_, bulk::Direction::pull, peer_of(remote), remote,
                                      remote_off, local, local_off, len, &req_);
    }
    /// Push `len` bytes from `local`[local_off..] into the caller's `remote`[remote_off..]; it
    /// belongs to this call, as pull's does.
    [[nodiscard]] Future<void> push(const Bulk& remote, std::size_t remote_off, const Bulk& local,
                                    std::size_t local_off, std::size_t len) const {
        return detail::start_transfer(*engine_, bulk::Direction::push, peer_of(remote), remote,
                                      remote_off, local, local_off, len, &req_);
    }

    /// The core request (advanced use).
    [[nodiscard]] core::Request& core() noexcept { return req_; }
    [[nodiscard]] const core::Request& core() const noexcept { return req_; }

  private:
    // The handle's embedded owner wins (a third party's memory); else the caller.
    [[nodiscard]] na::Addr peer_of(const Bulk& remote) const {
        return remote.owner().valid() ? remote.owner() : req_.source();
    }
    detail::EngineState* engine_ = nullptr;
    core::Request req_;
};

/// An RPC engine: one endpoint, its procedures, its progress. Movable (the state lives behind a
/// pointer, so Endpoints, Procedures and Requests stay valid across a move); destroying it stops
/// its threads and fails calls still pending with Errc::shutdown.
///
/// fork(): an engine belongs to the process that opened it. In a child, every use of an
/// inherited engine fails at once with Errc::invalid_state ("engine inherited across fork"),
/// also get() on a future of a call the parent started, and destroying it frees nothing and
/// touches none of the parent's threads, connections, rings or registrations (what it holds
/// stays with the child until it exits or execs). The child opens an engine of its own; the
/// parent's engine carries on unaffected.
class Engine {
  public:
    /// A client: `address` names the transport ("tcp://", "tcp://127.0.0.1:0", "sm://",
    /// "inproc://name"); it does not accept connections. Throws talaria::Exception.
    explicit Engine(std::string_view address, EngineOptions opts = {});
    /// A server: accepts connections at `address`.
    Engine(std::string_view address, Listen, EngineOptions opts = {});
    /// Non-throwing twin of the constructors (`accept`: listen for connections).
    static Result<Engine> open(std::string_view address, bool accept, EngineOptions opts = {});
    /// An engine over a transport the caller opened and keeps (it must outlive the engine):
    /// its RPC contexts 0..opts.contexts-1 are created on it (those ids must be free there), and
    /// the transfer context of pull and push on id opts.contexts where the transport has that
    /// id free (else pull and push answer not_supported, naming it). It accepts connections if
    /// the transport listens; opts.core.na is not used. The Mercury C API's HG_Init_opt2 over
    /// an NA class of the program's is this.
    static Result<Engine> open(na::Transport& transport, EngineOptions opts = {});
    /// An engine as a configuration says (talaria/api/config.hpp: EngineConfig::from_json
    /// reads one from JSON): its address, whether it listens, its options.
    explicit Engine(const EngineConfig& config);
    /// This engine's configuration, as JSON that EngineConfig::from_json reads back: its own
    /// address (the port it was given, if it asked for port 0), whether it listens, and every
    /// option it was opened with, defaults included (as given: not the values the engine
    /// derives from them, such as na.max_contexts raised to fit its contexts), with the wait
    /// mode it has now (set_wait_mode). The secret
    /// of na auth is never shown: "secret" says "set" or "none", and "secret_file" names its
    /// file when the engine was made from an EngineConfig that read it.
    [[nodiscard]] std::string config_json(int indent = 2) const;

    Engine(Engine&&) noexcept;
    Engine& operator=(Engine&&) noexcept;
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;
    ~Engine();

    // --- addresses ---------------------------------------------------------------------------
    /// This engine's address string: what peers pass to lookup().
    [[nodiscard]] std::string self_address() const;
    [[nodiscard]] Endpoint self() const;
    Endpoint lookup(std::string_view address);
    Result<Endpoint> try_lookup(std::string_view address);

    // --- procedures --------------------------------------------------------------------------
    /// Define procedure `name` served by `f`. f's parameters are the arguments (decoded with
    /// proc), optionally preceded by `const Request&` (the return value is the response) or by
    /// `Request` / `Request&&` (then f returns void and answers later with req.respond(v), from
    /// any thread). Throws already_exists if the name (or its id) is taken.
    template <class F>
    void define(std::string_view name, F&& f) {
        detail::value_or_throw(try_define(name, std::forward<F>(f)));
    }
    template <class F>
    Result<void> try_define(std::string_view name, F&& f);
    /// Define `name` for provider `provider`: one of several instances of a service on this
    /// engine, which callers pick with Procedure::provider(id) (see talaria::Provider).
    template <class F>
    void define(std::string_view name, uint16_t provider, F&& f) {
        detail::value_or_throw(try_define(name, provider, std::forward<F>(f)));
    }
    template <class F>
    Result<void> try_define(std::string_view name, uint16_t provider, F&& f);
    /// Define `name` (for `provider`) with `f` running on `executor` instead of the progress
    /// thread that received the call (talaria/api/executor.hpp): for handlers that compute,
    /// block or sleep. The executor must outlive the procedure (undefine it first, or destroy
    /// the engine first).
    template <class F>
    void define(std::string_view name, F&& f, Executor& executor) {
        detail::value_or_throw(try_define(name, std::forward<F>(f), executor));
    }
    template <class F>
    void define(std::string_view name, uint16_t provider, F&& f, Executor& executor) {
        detail::value_or_throw(try_define(name, provider, std::forward<F>(f), executor));
    }
    template <class F>
    Result<void> try_define(std::string_view name, F&& f, Executor& executor);
    template <class F>
    Result<void> try_define(std::string_view name, uint16_t provider, F&& f, Executor& executor);
    /// The engine's own pool for handlers (EngineOptions::handler_threads threads, started on
    /// the first call): `server.define("slow", f, server.handler_pool())`. It stops, running
    /// what is queued, before the engine does.
    [[nodiscard]] Executor& handler_pool();
    /// Remove a procedure; later calls of it fail with not_found.
    Result<void> try_undefine(std::string_view name, uint16_t provider = 0);

    /// A handle for calling procedure `name` with signature Sig (e.g. int(int, int)).
    template <class Sig>
    [[nodiscard]] Procedure<Sig> remote(std::string_view name);

    // --- lifecycle ---------------------------------------------------------------------------
    /// The procedure enable_remote_shutdown() defines and shutdown_remote() calls (one-way).
    static constexpr std::string_view kShutdownProcedure = "talaria.shutdown";
    /// Ask this engine's owner to stop: releases every wait_for_shutdown(). Any thread, a
    /// handler included; idempotent. The engine keeps working until it is destroyed.
    void shutdown() noexcept;
    [[nodiscard]] bool shutdown_requested() const noexcept;
    /// Block until shutdown() is called here, or a peer's shutdown_remote() arrives (after
    /// enable_remote_shutdown()); then run the shutdown callbacks (on this thread) and return.
    /// A server's main thread: `server.enable_remote_shutdown(); server.wait_for_shutdown();`.
    void wait_for_shutdown();
    /// The same, waiting at most `d`: false if it passed first (no callback ran then).
    bool wait_for_shutdown(Duration d);
    /// Run `fn` once when the engine shuts down: on the thread that returns from
    /// wait_for_shutdown(), else in the destructor, before the engine stops; the last added
    /// runs first (a service added after the one it uses stops before it). The engine still
    /// works while they run. One that throws is logged, and the others run.
    void on_shutdown(std::function<void()> fn);
    /// Let peers shut this engine down (defines kShutdownProcedure: anyone who can call this
    /// engine can then stop it; with na::Options::auth, anyone holding the secret).
    void enable_remote_shutdown();
    /// Ask the engine at `ep` to shut down (it must have enabled it). One-way: the Future
    /// completes once the request is sent.
    Future<void> shutdown_remote(const Endpoint& ep);

    // --- asking a running engine (talaria-info --attach) ---------------------------------------
    /// The procedures enable_introspection() defines; each takes no argument and answers a
    /// string: stats_json(), stats_prometheus(), config_json(), a health object
    /// ({"status": "serving" or "shutting_down", "address", "version", "uptime_ms",
    /// "contexts"}), and the calls in flight ({"contexts": [{"id", "requests_held"}], "peers":
    /// [{"peer", "context", "in_flight", "queued"}]}).
    static constexpr std::string_view kStatsProcedure = "talaria.stats";
    static constexpr std::string_view kPrometheusProcedure = "talaria.prometheus";
    static constexpr std::string_view kConfigProcedure = "talaria.config";
    static constexpr std::string_view kHealthProcedure = "talaria.health";
    static constexpr std::string_view kInFlightProcedure = "talaria.calls_in_flight";
    /// Let peers read this engine's statistics, configuration, health and calls in flight
    /// (the procedures above; `talaria-info --attach ADDRESS` prints them). Opt-in: anyone who
    /// can call the engine can read them (with na::Options::auth, anyone holding the secret).
    /// They run on the progress thread and take microseconds (stats_json: tens with many
    /// procedures).
    void enable_introspection();
    /// Write stats_json(2) to `path` now (an error if it cannot be written), then every
    /// `period`, and a last time when the engine closes: for batch jobs, as Margo writes its
    /// JSON at finalize, and while they run. Each write replaces the file at once (a temporary
    /// file renamed over it). A second call replaces the first's period and path. One thread of
    /// the engine's.
    Result<void> try_write_stats_every(Duration period, std::string path);
    void write_stats_every(Duration period, std::string path);
    /// Serve stats_prometheus() over HTTP at `address` ("127.0.0.1:9464", "[::]:9464"; port 0
    /// picks a free one), on GET /metrics, for a standard Prometheus scrape; returns the
    /// address bound. Opt-in (nothing listens otherwise); no authentication: bind it where only
    /// your scraper reaches. One thread of the engine's, stopped when it closes.
    Result<std::string> try_serve_prometheus(std::string_view address);
    std::string serve_prometheus(std::string_view address);
    /// The health object of kHealthProcedure, and the calls-in-flight object of
    /// kInFlightProcedure, as JSON text (one line).
    [[nodiscard]] std::string health_json() const;
    [[nodiscard]] std::string calls_in_flight_json() const;

    // --- bulk --------------------------------------------------------------------------------
    /// Expose memory for one-sided transfers by peers with `access`. The memory must stay
    /// valid while the handle (or a copy, or a transfer using it) exists.
    ///
    /// Who enforces `access`, the bounds and the handle's lifetime depends on the transport
    /// (docs/architecture.md, "Trust model"): on tcp, ofi+tcp and ucx+tcp the target checks
    /// each transfer; on sm, ofi+shm and ucx+sm a peer of the same user copies from this
    /// process itself (on sm after checking this process's registration table, which refuses
    /// edited and stale handles; a peer running its own code could skip that), so a peer can
    /// reach memory outside what was exposed. Expose memory to such peers only if you trust
    /// them as you trust the processes of your own user.
    Bulk expose(Segment segment, Access access);
    Bulk expose(const std::vector<Segment>& segments, Access access);
    template <class T>
    Bulk expose(std::span<T> s, Access access) {
        return expose(Segment{const_cast<std::remove_const_t<T>*>(s.data()), s.size_bytes()},
                      access);
    }
    Result<Bulk> try_expose(Segment segment, Access access);
    Result<Bulk> try_expose(const std::vector<Segment>& segments, Access access);
    /// The same, the handle bound to this engine (BindOwner): its encoding carries this
    /// engine's address (a few dozen bytes more), and whoever decodes it, wherever it was
    /// forwarded, takes this engine as its owner (Bulk::owner(), the default peer of pull and
    /// push). Only for an engine that listens (others are reachable only by the engines they
    /// call): invalid_argument otherwise, on every transport.
    Bulk expose(Segment segment, Access access, BindOwner);
    Bulk expose(const std::vector<Segment>& segments, Access access, BindOwner);
    Result<Bulk> try_expose(Segment segment, Access access, BindOwner);
    Result<Bulk> try_expose(const std::vector<Segment>& segments, Access access, BindOwner);

    /// Pull `len` bytes from `remote`[remote_off..] (owned by `peer`, by default the handle's
    /// owner) into `local`[local_off..].
    [[nodiscard]] Future<void> pull(const Bulk& remote, std::size_t remote_off, const Bulk& local,
                                    std::size_t local_off, std::size_t len,
                                    const Endpoint& peer = {});
    /// Push `len` bytes from `local`[local_off..] into `remote`[remote_off..].
    [[nodiscard]] Future<void> push(const Bulk& remote, std::size_t remote_off, const Bulk& local,
                                    std::size_t local_off, std::size_t len,
                                    const Endpoint& peer = {});

    // --- progress (manual mode) --------------------------------------------------------------
    /// Make progress on context `ctx` for up to `timeout`; true if something became ready.
    bool progress(Duration timeout, uint8_t ctx = 0);
    /// Run the ready callbacks of context `ctx`; returns how many ran.
    unsigned trigger(uint8_t ctx = 0);
    /// progress(0) + trigger() on every context, the bulk one included; returns callbacks run.
    unsigned poll();

    /// Change how the background threads wait (busy-poll during a burst, block otherwise).
    /// Any thread; takes effect at each thread's next idle check. No effect in manual mode.
    void set_wait_mode(WaitMode w) noexcept;
    [[nodiscard]] WaitMode wait_mode() const noexcept;

    // --- introspection -----------------------------------------------------------------------
    [[nodiscard]] core::Counters counters() const;
    [[nodiscard]] std::string counters_json() const;
    /// Per-procedure statistics (EngineOptions::core.stats, on by default): for every
    /// procedure this engine called or served, calls, outcomes by error code, bytes, and
    /// latency histograms (client round trip, server handler time, queueing delay before an
    /// executor ran the handler), summed over the contexts. Any thread, any time.
    [[nodiscard]] std::vector<core::ProcStats> stats() const;
    /// The counters and stats() as one JSON object (docs/architecture.md, "Statistics"):
    /// latencies in nanoseconds as count, mean, p50, p90, p99, p999 and max. `indent` as
    /// nlohmann::json's dump (-1: one line).
    [[nodiscard]] std::string stats_json(int indent = -1) const;
    /// The same in Prometheus' text exposition format (0.0.4): counters, gauges, and a summary
    /// (quantiles, _sum, _count, in seconds) per latency, labeled by engine, procedure and
    /// provider. Serve it on an HTTP endpoint, or write it to a node exporter's textfile.
    [[nodiscard]] std::string stats_prometheus() const;
    [[nodiscard]] uint8_t context_count() const noexcept;
    [[nodiscard]] const EngineOptions& options() const noexcept;
    /// The RPC core (advanced use).
    [[nodiscard]] core::Engine& core() const noexcept;
    [[nodiscard]] detail::EngineState* state() const noexcept { return state_.get(); }

  private:
    explicit Engine(std::unique_ptr<detail::EngineState> s) noexcept;
    /// Start a new engine's progress (threads or the manual driver).
    static Result<Engine> finish_open(std::unique_ptr<detail::EngineState> st);
    std::unique_ptr<detail::EngineState> state_;
};

}  // namespace talaria

#include "talaria/api/define.hpp"
#include "talaria/api/procedure.hpp"

#pragma GCC visibility pop
