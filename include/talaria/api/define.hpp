// Engine::define: binding a C++ callable to a procedure name.
//
// The callable's parameter list decides how it is called (see Engine::define). The arguments
// are decoded with proc into decay_t of each parameter, with the request's transport and
// source as DecodeContext (so bulk handles in arguments know their owner). A decode failure is
// answered with protocol_error naming the procedure and its expected signature; exceptions
// escaping the callable become error responses (talaria::Exception keeps its code, any other
// std::exception becomes Errc::internal).
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "talaria/api/engine.hpp"

namespace talaria {
namespace detail {

template <class... T>
struct TypeList {};

/// The return type and parameter list of a callable with one (non-template) call operator.
template <class F>
struct FnTraits : FnTraits<decltype(&std::remove_cvref_t<F>::operator())> {};
template <class R, class... A>
struct FnTraits<R(A...)> {
    using Ret = R;
    using Params = TypeList<A...>;
};
template <class R, class... A>
struct FnTraits<R (*)(A...)> : FnTraits<R(A...)> {};
template <class R, class... A>
struct FnTraits<R (*)(A...) noexcept> : FnTraits<R(A...)> {};
template <class R, class... A>
struct FnTraits<R(A...) noexcept> : FnTraits<R(A...)> {};
template <class C, class R, class... A>
struct FnTraits<R (C::*)(A...)> : FnTraits<R(A...)> {};
template <class C, class R, class... A>
struct FnTraits<R (C::*)(A...) const> : FnTraits<R(A...)> {};
template <class C, class R, class... A>
struct FnTraits<R (C::*)(A...) noexcept> : FnTraits<R(A...)> {};
template <class C, class R, class... A>
struct FnTraits<R (C::*)(A...) const noexcept> : FnTraits<R(A...)> {};

enum class HandlerKind { plain, with_request, async };

template <class P>
constexpr HandlerKind kind_of_first() {
    if constexpr (std::is_same_v<P, const Request&>)
        return HandlerKind::with_request;
    else if constexpr (std::is_same_v<P, Request> || std::is_same_v<P, Request&&>)
        return HandlerKind::async;
    else
        return HandlerKind::plain;
}

/// Shared by every invocation of one handler.
struct HandlerInfo {
    EngineState* engine;
    std::string name;
    std::string signature;  ///< "(int, std::string)": for decode errors
};

Result<void> register_handler(EngineState& e, std::string_view name, core::Handler h,
                              core::Registration reg);
/// Counts a call queued on or running on an executor (Engine::define with one): the engine's
/// destructor waits until none is left.
class QueuedCount {
  public:
    explicit QueuedCount(EngineState& e) noexcept;
    ~QueuedCount();
    QueuedCount(const QueuedCount&) = delete;
    QueuedCount& operator=(const QueuedCount&) = delete;

  private:
    EngineState* e_;
};
/// Answer an exception escaping a handler (call from inside a catch block).
void respond_current_exception(Request& req, const HandlerInfo& info) noexcept;
/// Answer a decode failure of the arguments.
void respond_decode_error(core::Request& req, const HandlerInfo& info, const Error& e) noexcept;

template <HandlerKind Kind, class Fn, class R, class... Args>
struct Binder {
    using ArgTuple = std::tuple<std::decay_t<Args>...>;
    std::shared_ptr<Fn> fn;
    std::shared_ptr<const HandlerInfo> info;
    Executor* ex = nullptr;  ///< where the callable runs (null: here, on the progress thread)

    void operator()(core::Request& creq) const {
        ArgTuple args;
        {
            const na::Addr& src = creq.source();
            proc::DecodeContext ctx{&creq.context().engine().transport(), &src};
            auto r =
                std::apply([&](auto&... a) { return proc::decode(creq.input(), ctx, a...); }, args);
            if (!r) {
                respond_decode_error(creq, *info, r.error());
                return;
            }
        }
        if (ex) {
            // Decoded here (the input is the receive buffer's); run there. The engine counts
            // the call until the job is gone (run or dropped), and waits for it before it
            // closes: the Request inside needs the engine.
            auto call = std::make_unique<Queued>(*info->engine, std::move(creq), std::move(args));
            ex->post([f = fn, i = info, c = std::move(call)]() mutable {
                c->req.core().note_started();  // the wait in the queue, in the statistics
                core::TraceScope trace(c->req.trace_id());  // nested calls carry it
                run(*f, *i, c->req, c->args);
            });
            return;
        }
        Request req(info->engine, std::move(creq));
        run(*fn, *info, req, args);
    }

    /// A call queued on an executor. Members go in reverse order: the arguments, the Request
    /// (answering `internal` if nothing did), then the engine's count.
    struct Queued {
        QueuedCount count;
        Request req;
        ArgTuple args;
        Queued(EngineState& e, core::Request&& r, ArgTuple&& a)
            : count(e), req(&e, std::move(r)), args(std::move(a)) {}
    };

    static void run(Fn& f, const HandlerInfo& info, Request& req, ArgTuple& args) {
        try {
            if constexpr (Kind == HandlerKind::async) {
                std::apply([&](auto&... a) { f(std::move(req), std::move(a)...); }, args);
            } else if constexpr (std::is_void_v<R>) {
                if constexpr (Kind == HandlerKind::with_request)
                    std::apply([&](auto&... a) { f(std::as_const(req), std::move(a)...); }, args);
                else
                    std::apply([&](auto&... a) { f(std::move(a)...); }, args);
                if (!req.one_way() && !req.responded()) (void)req.try_respond();
            } else {
                auto out = [&]() -> R {
                    if constexpr (Kind == HandlerKind::with_request)
                        return std::apply(
                            [&](auto&... a) -> R { return f(std::as_const(req), std::move(a)...); },
                            args);
                    else
                        return std::apply([&](auto&... a) -> R { return f(std::move(a)...); },
                                          args);
                }();
                if (!req.one_way() && !req.responded()) {
                    if (auto r = req.try_respond(out); !r && !req.responded())
                        (void)req.try_respond_error(
                            r.error().code(), "rpc '" + info.name + "': " + r.error().message());
                }
            }
        } catch (...) {
            respond_current_exception(req, info);
        }
    }
};

template <class Fn, class R, HandlerKind Kind, class... Args>
Result<void> define_bound(EngineState& e, std::string_view name, uint16_t provider, Executor* ex,
                          Fn&& f) {
    static_assert((serializable_v<std::decay_t<Args>> && ...),
                  "talaria::Engine::define: every argument type must be serializable with proc "
                  "(give the type a serialize(Archive&) member or ADL function)");
    static_assert(result_serializable<std::decay_t<R>>(),
                  "talaria::Engine::define: the return type must be void or serializable with "
                  "proc");
    static_assert(Kind != HandlerKind::async || std::is_void_v<R>,
                  "talaria::Engine::define: a handler taking Request by value (or &&) responds "
                  "with req.respond(v) and must return void");
    using D = std::decay_t<Fn>;
    auto info = std::make_shared<const HandlerInfo>(
        HandlerInfo{&e, std::string(name), signature_string<std::decay_t<Args>...>()});
    Binder<Kind, D, R, Args...> b{std::make_shared<D>(std::forward<Fn>(f)), std::move(info), ex};
    core::Registration reg;
    reg.provider = provider;
    // Calls are checked against the handler's types, except where the result type is not
    // known here (a handler that answers later through its Request).
    if constexpr (Kind != HandlerKind::async) {
        reg.signature = kSignatureHash<std::decay_t<R>, std::decay_t<Args>...>;
        reg.signature_text = signature_text<std::decay_t<R>, std::decay_t<Args>...>();
    }
    return register_handler(e, name, core::Handler(std::move(b)), std::move(reg));
}

template <class Fn, class R, class... P>
Result<void> define_params(EngineState& e, std::string_view name, uint16_t provider, Executor* ex,
                           Fn&& f, TypeList<P...>) {
    return define_bound<Fn, R, HandlerKind::plain, P...>(e, name, provider, ex,
                                                         std::forward<Fn>(f));
}
template <class Fn, class R, class First, class... Rest>
Result<void> define_params(EngineState& e, std::string_view name, uint16_t provider, Executor* ex,
                           Fn&& f, TypeList<First, Rest...>) {
    constexpr HandlerKind k = kind_of_first<First>();
    static_assert(!std::is_same_v<std::remove_cvref_t<First>, Request> || k != HandlerKind::plain,
                  "talaria::Engine::define: take the Request as `const Request&` (respond by "
                  "returning) or by value / `Request&&` (respond later with req.respond)");
    if constexpr (k == HandlerKind::plain)
        return define_bound<Fn, R, k, First, Rest...>(e, name, provider, ex, std::forward<Fn>(f));
    else
        return define_bound<Fn, R, k, Rest...>(e, name, provider, ex, std::forward<Fn>(f));
}

}  // namespace detail

template <class F>
Result<void> Engine::try_define(std::string_view name, F&& f) {
    return try_define(name, uint16_t{0}, std::forward<F>(f));
}

template <class F>
Result<void> Engine::try_define(std::string_view name, uint16_t provider, F&& f) {
    using Traits = detail::FnTraits<std::remove_cvref_t<F>>;
    return detail::define_params<F, typename Traits::Ret>(
        *state_, name, provider, nullptr, std::forward<F>(f), typename Traits::Params{});
}

template <class F>
Result<void> Engine::try_define(std::string_view name, F&& f, Executor& executor) {
    return try_define(name, uint16_t{0}, std::forward<F>(f), executor);
}

template <class F>
Result<void> Engine::try_define(std::string_view name, uint16_t provider, F&& f,
                                Executor& executor) {
    using Traits = detail::FnTraits<std::remove_cvref_t<F>>;
    return detail::define_params<F, typename Traits::Ret>(
        *state_, name, provider, &executor, std::forward<F>(f), typename Traits::Params{});
}

}  // namespace talaria

#pragma GCC visibility pop
