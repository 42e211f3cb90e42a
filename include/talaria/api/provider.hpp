// Provider: one instance of a service on an engine (Thallium's and Margo's providers). Its
// procedures are defined under its provider id, so several instances, of one service or of
// several, serve side by side on one engine, and a caller picks one with
// Procedure::provider(id):
//
//   class KvStore : public talaria::Provider {
//     public:
//       KvStore(talaria::Engine& e, uint16_t id) : Provider(e, id) {
//           define("kv.put", &KvStore::put);
//           define("kv.get", &KvStore::get);
//       }
//       ~KvStore() override { undefine_all(); }  // before the members the handlers use go
//     private:
//       void put(std::string k, std::string v);
//       std::string get(std::string k);
//       std::map<std::string, std::string> data_;
//   };
//
//   KvStore a(server, 1), b(server, 2);
//   client.remote<std::string(std::string)>("kv.get").on(ep).provider(2)("key");
//
// Its handlers run on the progress threads, or on an Executor given to the constructor (a pool
// of the service's own, or engine.handler_pool()), as Margo's providers take a handler pool.
//
// Lifetime: undefine_all() (and the destructor) removes the procedures, then waits until no
// handler of this provider is running (a call still queued on an executor answers not_found
// when it starts); later calls are answered not_found. A derived class whose
// handlers use its own members calls undefine_all() first in its destructor, since they are
// destroyed before ~Provider runs. Never destroy a provider from one of its own handlers.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "talaria/api/engine.hpp"

namespace talaria {

class Provider {
  public:
    /// Provider ids are the caller's to choose; 0 is the engine's default (Engine::define
    /// without one), usable by one provider too.
    /// `executor`: where its handlers run (talaria/api/executor.hpp; it must outlive the
    /// provider); null: on the progress thread that received each call.
    Provider(Engine& engine, uint16_t provider_id, Executor* executor = nullptr)
        : engine_(&engine),
          executor_(executor),
          id_(provider_id),
          state_(std::make_shared<State>()) {}
    virtual ~Provider() { undefine_all(); }
    Provider(const Provider&) = delete;
    Provider& operator=(const Provider&) = delete;

    [[nodiscard]] uint16_t provider_id() const noexcept { return id_; }
    [[nodiscard]] Engine& engine() const noexcept { return *engine_; }
    /// The names this provider defined, in order.
    [[nodiscard]] const std::vector<std::string>& procedures() const noexcept { return names_; }

  protected:
    /// Define `name` for this provider, served by `f`: any callable Engine::define takes, or a
    /// member function of the derived class (called on this object). Throws already_exists
    /// when this provider id already has `name` on the engine.
    template <class F>
    void define(std::string_view name, F&& f) {
        using Traits = detail::FnTraits<std::remove_cvref_t<F>>;
        add(name, guarded<typename Traits::Ret>(std::forward<F>(f), typename Traits::Params{}));
    }
    template <class C, class R, class... A>
    void define(std::string_view name, R (C::*m)(A...)) {
        C* self = static_cast<C*>(this);
        add(name, guarded<R>([self, m](A... a) -> R { return (self->*m)(std::forward<A>(a)...); },
                             detail::TypeList<A...>{}));
    }
    template <class C, class R, class... A>
    void define(std::string_view name, R (C::*m)(A...) const) {
        const C* self = static_cast<const C*>(this);
        add(name, guarded<R>([self, m](A... a) -> R { return (self->*m)(std::forward<A>(a)...); },
                             detail::TypeList<A...>{}));
    }

    /// Remove every procedure of this provider from the engine, then wait for the handlers of
    /// it still running to return. Idempotent; any thread but one of its handlers.
    void undefine_all() noexcept;

  private:
    /// Shared with the handlers (which the engine keeps after the provider is gone).
    struct State {
        std::atomic<int> running{0};  ///< handlers of this provider running now
        std::atomic<bool> closed{false};
    };
    /// Counts a handler in while it runs; refuses it once undefine_all() began. Both sides
    /// write then read (seq_cst), so a handler either sees `closed` or is seen running.
    struct Running {
        State& s;
        explicit Running(State& st) noexcept : s(st) { s.running.fetch_add(1); }
        ~Running() { s.running.fetch_sub(1); }
        Running(const Running&) = delete;
        Running& operator=(const Running&) = delete;
    };
    template <class R, class F, class... P>
    auto guarded(F&& f, detail::TypeList<P...>) {
        return [fn = std::forward<F>(f), st = state_, id = id_](P... p) mutable -> R {
            Running r(*st);
            if (st->closed.load()) throw Exception(Errc::not_found, gone_message(id));
            return fn(std::forward<P>(p)...);
        };
    }
    static std::string gone_message(uint16_t id);
    template <class G>
    void add(std::string_view name, G&& g) {
        if (executor_)
            engine_->define(name, id_, std::forward<G>(g), *executor_);
        else
            engine_->define(name, id_, std::forward<G>(g));
        names_.emplace_back(name);
    }

    Engine* engine_;
    Executor* executor_;
    uint16_t id_;
    std::vector<std::string> names_;
    std::shared_ptr<State> state_;
};

}  // namespace talaria

#pragma GCC visibility pop
