// when_all / when_any: one Future over several.
//
//   auto all = talaria::when_all(std::move(calls));        // Future<std::vector<Result<T>>>
//   auto any = talaria::when_any(std::move(calls));        // Future<std::pair<size_t, Result<T>>>
//   auto [a, b] = talaria::when_all(f(1), g("x")).get();   // Future<std::tuple<Result<A>, ...>>
//
// The inputs are consumed. Each input's own Result is kept (one failure hides no other result);
// the combined Future itself fails only when it cannot be formed (when_any of nothing). When_any
// leaves the other inputs running: their results are dropped when they arrive. Waiting on the
// combined Future (get, wait_for, co_await in a Task run by sync_wait) drives every manual
// engine an input belongs to, each of its contexts in turn; background engines complete theirs.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "talaria/api/future.hpp"

namespace talaria {
namespace detail {

/// The driver of a combined Future: drives, in turn, each manual engine context an input needs
/// (found when the inputs are linked; background inputs need no driving).
class MultiDriver final : public Driver {
  public:
    /// Note the driver of one input state (nothing for a background or complete one).
    void add(const StateBase* s) {
        if (!s || s->ready() || !s->manual() || s->driver().expired()) return;
        for (auto& [d, ctx] : inputs_)
            if (!d.owner_before(s->driver()) && !s->driver().owner_before(d) &&
                ctx == s->driver_context())
                return;
        inputs_.emplace_back(s->driver(), s->driver_context());
    }
    [[nodiscard]] bool empty() const noexcept { return inputs_.empty(); }

    void drive(uint8_t, Duration d) override {
        const Duration share = d / Duration::rep(inputs_.size());
        for (auto& [w, ctx] : inputs_)
            if (auto p = w.lock()) p->drive(ctx, share);
    }
    bool wait_ready(StateBase& s, TimePoint deadline) override { return s.wait_until(deadline); }
    bool cancel_call(uint8_t, uint32_t) override { return false; }  // a combined state is no call
    [[nodiscard]] Result<void> usable() const override {
        for (auto& [w, ctx] : inputs_)
            if (auto p = w.lock())
                if (auto u = p->usable(); !u) return u;
        return ok();
    }

  private:
    std::vector<std::pair<std::weak_ptr<Driver>, uint8_t>> inputs_;
};

/// What the inputs' continuations share: the combined state and the driver that waiting on it
/// uses (owned here, so it lives while an input is outstanding).
template <class Out>
struct Gather {
    std::shared_ptr<State<Out>> out = std::make_shared<State<Out>>();
    std::shared_ptr<MultiDriver> driver = std::make_shared<MultiDriver>();
    /// Record the driver in the combined state once every input was noted.
    void arm() {
        if (!driver->empty()) out->set_driver(std::weak_ptr<Driver>(driver), 0);
    }
};

/// when_all over futures of different types: their results, each in its place.
template <class... Ts>
struct AllOf : Gather<std::tuple<Result<Ts>...>> {
    std::tuple<std::optional<Result<Ts>>...> results;
    std::atomic<std::size_t> left{sizeof...(Ts)};
    template <std::size_t I, class R>
    void done(R&& r) {
        std::get<I>(results).emplace(std::forward<R>(r));
        if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        this->out->set(std::apply(
            [](auto&... x) { return std::tuple<Result<Ts>...>{std::move(*x)...}; }, results));
    }
};

template <class T>
Error empty_input(const char* what, std::size_t i) {
    return Error(Errc::invalid_argument,
                 std::string(what) + ": input " + std::to_string(i) + " is an empty future");
}

/// Note every input's driver, arm the combined state, then link each input to `g->done(i, r)`
/// (an empty input fails in its own place).
template <class T, class G>
void link_inputs(std::vector<Future<T>>& fs, const std::shared_ptr<G>& g, const char* what) {
    for (auto& f : fs)
        g->driver->add(f.state().get());
    g->arm();
    for (std::size_t i = 0; i < fs.size(); ++i) {
        if (!fs[i].valid()) {
            g->done(i, empty_input<T>(what, i));
            continue;
        }
        std::move(fs[i]).then([g, i](Result<T>&& r) { g->done(i, std::move(r)); });
    }
}

}  // namespace detail

/// A Future ready once every one of `fs` is, with their results in the same order. Consumes
/// them; an empty vector gives an empty vector at once.
template <class T>
Future<std::vector<Result<T>>> when_all(std::vector<Future<T>> fs) {
    using Out = std::vector<Result<T>>;
    struct All : detail::Gather<Out> {
        std::vector<std::optional<Result<T>>> results;
        std::atomic<std::size_t> left{0};
        void done(std::size_t i, Result<T>&& r) {
            results[i].emplace(std::move(r));
            if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
            Out v;
            v.reserve(results.size());
            for (auto& x : results)
                v.push_back(std::move(*x));
            this->out->set(std::move(v));
        }
    };
    auto all = std::make_shared<All>();
    Future<Out> combined(all->out);
    if (fs.empty()) {
        all->out->set(Out{});
        return combined;
    }
    all->results.resize(fs.size());
    all->left.store(fs.size(), std::memory_order_relaxed);
    detail::link_inputs(fs, all, "when_all");
    return combined;
}

/// A Future ready once the first of `fs` is: its index and its result. The others run on and
/// their results are dropped. Consumes them; an empty vector fails with invalid_argument.
template <class T>
Future<std::pair<std::size_t, Result<T>>> when_any(std::vector<Future<T>> fs) {
    using Out = std::pair<std::size_t, Result<T>>;
    struct Any : detail::Gather<Out> {
        std::atomic<bool> won{false};
        void done(std::size_t i, Result<T>&& r) {
            if (won.exchange(true, std::memory_order_acq_rel)) return;
            this->out->set(Out{i, std::move(r)});
        }
    };
    if (fs.empty())
        return Future<Out>::ready_with(
            Error(Errc::invalid_argument, "when_any of no futures: nothing can complete it"));
    auto any = std::make_shared<Any>();
    Future<Out> combined(any->out);
    detail::link_inputs(fs, any, "when_any");
    return combined;
}

/// A Future ready once every one of `fs` is (of any types), with their results as a tuple.
template <class... Ts>
requires(sizeof...(Ts) > 0) Future<std::tuple<Result<Ts>...>> when_all(Future<Ts>... fs) {
    using Out = std::tuple<Result<Ts>...>;
    using All = detail::AllOf<Ts...>;
    auto all = std::make_shared<All>();
    Future<Out> combined(all->out);
    (all->driver->add(fs.state().get()), ...);
    all->arm();
    auto link = [&]<std::size_t I, class T>(Future<T>& f) {
        if (!f.valid()) {
            all->template done<I>(Result<T>(detail::empty_input<T>("when_all", I)));
            return;
        }
        std::move(f).then([all](Result<T>&& r) { all->template done<I>(std::move(r)); });
    };
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (link.template operator()<I>(fs), ...);
    }
    (std::index_sequence_for<Ts...>{});
    return combined;
}

}  // namespace talaria

#pragma GCC visibility pop
