// Procedure<R(Args...)>: a typed handle for calling a remote procedure by name.
//
// Cheap to create and copy: the name and its id (core::rpc_id, computed once) live in one
// immutable record the engine interns (detail::ProcInfo). Calling it encodes the arguments, sends
// at once and returns a Future<R>; the result is decoded on the progress thread when the response
// arrives.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <memory>
#include <string>
#include <utility>

#include "talaria/api/engine.hpp"
#include "talaria/util/thread_cache.hpp"

namespace talaria {

namespace detail {

/// The state of one call: the Future's state, plus what decoding the response needs.
template <class R>
class CallState final : public State<R> {
  public:
    explicit CallState(const ProcInfo* i) noexcept : info(i) {}

    /// The core's response (on the progress thread): decode the result, or name the error.
    /// The peer is the core's for the length of the callback (core::Context::response_peer()):
    /// no copy of it, and no reference count, per call.
    void complete(Result<std::span<const std::byte>>&& r) {
        this->set(decode(std::move(r), core::Context::response_peer()));
    }

    const ProcInfo* info;  ///< interned by the engine, which outlives the call
    /// Spells the caller's R(Args...) for an error that compares it with the target's (a
    /// checked call; null otherwise). Called only when the call failed.
    std::string (*signature)() = nullptr;

  private:
    Result<R> decode(Result<std::span<const std::byte>>&& r, const na::Addr* peer) {
        if (!r)
            return call_error(info->name, info->id, peer ? *peer : na::Addr(), std::move(r).error(),
                              signature);
        proc::DecodeContext ctx{peer ? peer->impl()->transport() : nullptr, peer};
        if constexpr (std::is_void_v<R>) {
            if (auto d = proc::decode(*r, ctx); !d)
                return Error(Errc::protocol_error,
                             "rpc '" + info->name +
                                 "': a void result carried bytes: " + d.error().describe());
            return Result<void>();
        } else {
            auto d = proc::decode_as<R>(*r, ctx);
            if (!d)
                return Error(Errc::protocol_error,
                             "rpc '" + info->name + "': the result does not decode as " +
                                 std::string(type_name<R>()) + ": " + d.error().describe());
            return d;
        }
    }
};

}  // namespace detail

template <class Sig>
class Procedure;

/// Calls of one remote procedure. The setters return a modified copy, so one Procedure can be
/// the template for many call sites: `auto p = engine.remote<int(int)>("f").on(ep);`
template <class R, class... Args>
class Procedure<R(Args...)> {
    static_assert((detail::serializable_v<std::decay_t<Args>> && ...),
                  "talaria: every argument type of a remote procedure must be serializable with "
                  "proc (give the type a serialize(Archive&) member or ADL function)");
    static_assert(detail::result_serializable<R>(),
                  "talaria: the result type of a remote procedure must be serializable with proc");

  public:
    Procedure() = default;
    Procedure(detail::EngineState* e, const detail::ProcInfo* info) noexcept
        : engine_(e), info_(info) {}

    /// The peer to call.
    [[nodiscard]] Procedure on(const Endpoint& ep) const {
        Procedure p = *this;
        p.peer_ = ep;
        return p;
    }
    /// A deadline for each call (0: none; default: EngineOptions::default_timeout).
    [[nodiscard]] Procedure timeout(Duration d) const {
        Procedure p = *this;
        p.timeout_ = d;
        p.timeout_set_ = true;
        return p;
    }
    /// When the server answers Errc::busy (over its admission limits), send the call again
    /// up to `attempts` times, first after about `first_wait`, doubling each time (up to 1 s),
    /// never past the call's deadline (core::CallOptions::busy_retries). The arguments are
    /// then kept until the call completes.
    [[nodiscard]] Procedure retry_busy(uint8_t attempts,
                                       Duration first_wait = std::chrono::milliseconds(1)) const {
        Procedure p = *this;
        p.busy_retries_ = attempts;
        p.busy_backoff_ = first_wait;
        return p;
    }
    /// Which instance of the procedure to call at the peer: the provider id it was defined
    /// for (Engine::define(name, provider, f), talaria::Provider). Default 0.
    [[nodiscard]] Procedure provider(uint16_t id) const {
        Procedure p = *this;
        p.provider_ = id;
        return p;
    }
    /// Send no signature hash: the peer runs the handler whatever its types, and a mismatch
    /// shows only as arguments or a result that do not decode (or decode as something else).
    /// For peers that spell a type differently with the same bytes (a vector<char> against a
    /// string).
    [[nodiscard]] Procedure unchecked() const {
        Procedure p = *this;
        p.checked_ = false;
        return p;
    }
    /// A trace id for each call (core::CallOptions::trace_id): the handler sees it
    /// (Request::trace_id()), the calls it makes carry it on, and both sides' rpc=trace log
    /// lines name it, so the logs of several processes can be joined. Default 0: the trace of
    /// the handler this call is made from (talaria::current_trace_id()), if any.
    [[nodiscard]] Procedure trace(uint64_t id) const {
        Procedure p = *this;
        p.trace_ = id;
        return p;
    }
    /// The remote context that runs the handler.
    [[nodiscard]] Procedure context(uint8_t target) const {
        Procedure p = *this;
        p.target_ = target;
        return p;
    }
    /// The local context that sends and receives the response (its thread runs continuations).
    [[nodiscard]] Procedure from(uint8_t local) const {
        Procedure p = *this;
        p.from_ = local;
        return p;
    }
    /// Fire and forget: calls return a Future<void> that completes once the call is sent.
    [[nodiscard]] Procedure<void(Args...)> one_way() const {
        Procedure<void(Args...)> p(engine_, info_);
        p.peer_ = peer_;
        p.timeout_ = timeout_;
        p.timeout_set_ = timeout_set_;
        p.target_ = target_;
        p.from_ = from_;
        p.provider_ = provider_;
        p.checked_ = checked_;
        p.one_way_ = true;
        return p;
    }

    [[nodiscard]] const std::string& name() const noexcept { return info_->name; }
    [[nodiscard]] core::RpcId id() const noexcept { return info_->id; }

    /// Send a call now. Errors (no endpoint, encoding, back-pressure) come back in the Future.
    Future<R> operator()(const std::type_identity_t<Args>&... args) const {
        using Ret = std::conditional_t<std::is_void_v<R>, void, R>;
        if (!engine_ || !info_)
            return Future<Ret>::ready_with(
                Error(Errc::invalid_argument, "call of a Procedure not made by Engine::remote"));
        if (!peer_.valid())
            return Future<Ret>::ready_with(Error(
                Errc::invalid_argument, "call of '" + info_->name + "' without .on(endpoint)"));
        // From the calling thread's block cache: no malloc per call once warm.
        auto st = std::allocate_shared<detail::CallState<Ret>>(
            ThreadCacheAllocator<detail::CallState<Ret>>{}, info_);
        const detail::CallSite site = detail::call_site(*engine_, from_, *st);
        if (!site.ctx)
            return Future<Ret>::ready_with(
                Error(Errc::invalid_argument, "call of '" + info_->name + "' from context " +
                                                  std::to_string(from_) + " of " +
                                                  std::to_string(site.count)));
        core::CallOptions opts;
        opts.target_context = target_;
        opts.timeout = timeout_set_ ? timeout_ : site.default_timeout;
        opts.busy_retries = one_way_ ? 0 : busy_retries_;
        opts.busy_backoff = busy_backoff_;
        opts.one_way = one_way_;
        opts.provider = provider_;
        opts.trace_id = trace_;
        // One-way calls are not checked: the target's handler may return a value nobody reads.
        if (checked_ && !one_way_) {
            opts.signature = detail::kSignatureHash<Ret, std::decay_t<Args>...>;
            st->signature = &detail::signature_text<Ret, std::decay_t<Args>...>;
        }
        Future<Ret> fut(st);
        // Encoded once, straight into the send buffer (into the thread's scratch buffer only
        // when they outgrow the eager size: then they travel as large arguments).
        detail::EncodeInPlace<Args...> write(args...);
        auto sent = site.ctx->forward_in_place(
            peer_.addr(), info_->id, write, opts,
            [s = std::move(st)](Result<std::span<const std::byte>>&& r) mutable {
                s->complete(std::move(r));
            });
        if (!sent && write.failed)
            return Future<Ret>::ready_with(Error(
                sent.code(), "rpc '" + info_->name + "': arguments: " + sent.error().message()));
        if (!sent)
            return Future<Ret>::ready_with(
                detail::call_error(info_->name, info_->id, peer_.addr(), std::move(sent).error()));
        fut.state()->set_call(sent->seq);  // before the Future is handed out (Future::cancel)
        return fut;
    }

  private:
    template <class Sig>
    friend class Procedure;

    detail::EngineState* engine_ = nullptr;
    const detail::ProcInfo* info_ = nullptr;  ///< interned by the engine
    Endpoint peer_;
    Duration timeout_{0};
    Duration busy_backoff_ = std::chrono::milliseconds(1);
    uint8_t busy_retries_ = 0;
    bool timeout_set_ = false;
    uint8_t target_ = 0;
    uint8_t from_ = 0;
    uint16_t provider_ = 0;
    uint64_t trace_ = 0;
    bool checked_ = true;
    bool one_way_ = false;
};

template <class Sig>
Procedure<Sig> Engine::remote(std::string_view name) {
    return Procedure<Sig>(state_.get(), detail::proc_info(*state_, name));
}

}  // namespace talaria

#pragma GCC visibility pop
