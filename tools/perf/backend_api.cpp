// talaria-perf: the api back end, measured through the public API a user calls:
// talaria::Engine (background progress), Engine::define on the server (perf.echo,
// uint64_t(uint64_t)) and Engine::remote<uint64_t(uint64_t)> on the client.
//
//   K = --contexts: the server's api engine has (at least) K contexts; the client engine has K
//   contexts and K threads, thread i calling from its context i to the server's context i.
//   P = --procs: P client processes of K threads each (this one and P-1 workers, hidden
//   subcommand `api-worker`, taking commands on stdin); the server has K*P contexts and
//   process p's thread i calls server context p*K + i. Rates are for all processes together,
//   over the slowest process's time.
//   pingpong : each thread keeps one call in flight and makes `iters` calls: the round trip in us
//   rate     : each thread keeps --rate-inflight calls in flight; `iters` calls in all, split
//              over the threads: calls per second for the whole client
//   --consume: how a thread takes its results
//     get     : a ring of `inflight` Futures; Future::get() the oldest, then issue the next
//     then    : `inflight` chains; each result's then() issues the chain's next call (on the
//               client's progress thread); the thread waits for the chains to end
//     coawait : `inflight` coroutines, each a loop of co_await calls; the thread waits for them
//
//   pull / push: Engine::pull / Engine::push of `--size` bytes between memory this engine
//              exposes and the buffer the server's core engine exposes (perf.ctl bulk_setup, as
//              the bulk layer), `--rma-inflight` futures in flight, taken with get(); one
//              context, one process.
//
// The same process also runs the core layer as this layer's baseline, interleaved repetition
// by repetition (client.cpp): the rpc back end (one context) for pingpong and rate, the bulk
// back end for pull and push, so the ratio is api / core.
#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <coroutine>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "app.hpp"
#include "region.hpp"
#include "rpc_session.hpp"
#include "talaria/proc/archive.hpp"
#include "talaria/talaria.hpp"
#include "talaria/util/log.hpp"

namespace talaria::perf {

namespace {

using Echo = uint64_t(uint64_t);

/// A thread's chains or coroutines (then, coawait): how many are still going, and when the
/// last one ended. The end is read from the completions, not from the waiting thread's clock:
/// where busy progress threads hold every core, the waiting thread may run only milliseconds
/// after its wake-up (up to the threads' busy window), and a run timed by it measured that
/// delay (it made calibrated counts tiny and whole rows ~20x slow). Outlives the run: the last
/// one notifies it from the progress thread, possibly after the waiter saw it reach 0.
struct Track {
    std::atomic<unsigned> running{0};
    std::atomic<int64_t> ended_ns{0};  ///< Clock ticks of the latest end so far

    void start(unsigned n) noexcept {
        ended_ns.store(0, std::memory_order_relaxed);
        running.store(n, std::memory_order_release);
    }
    /// One chain or coroutine is done (its time counts before the count drops).
    void end_one() noexcept {
        const int64_t now = Clock::now().time_since_epoch().count();
        int64_t seen = ended_ns.load(std::memory_order_relaxed);
        while (seen < now &&
               !ended_ns.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
        }
        if (running.fetch_sub(1, std::memory_order_acq_rel) == 1) running.notify_all();
    }
    /// Wait for the last one; when it ended.
    TimePoint wait() noexcept {
        for (unsigned r = running.load(); r != 0; r = running.load())
            running.wait(r);
        return TimePoint(Clock::duration(ended_ns.load(std::memory_order_relaxed)));
    }
};

/// A coroutine that starts at once and frees itself at its end (what a user writes to keep
/// calls in flight from coroutines on a background engine).
struct Detached {
    struct promise_type {
        Detached get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
};

/// Makes `n` calls one after another with co_await, then counts itself out of `track`.
Detached call_loop(Procedure<Echo> p, uint64_t n, std::atomic<uint64_t>& errors, Track& track) {
    for (uint64_t i = 0; i < n; ++i) {
        auto r = co_await p(i).as_result();
        if (!r || *r != i) errors.fetch_add(1, std::memory_order_relaxed);
    }
    track.end_one();
}

/// One `then` chain: each completion issues the next call until `left` reaches 0.
struct Chain {
    Procedure<Echo> p;
    uint64_t left = 0;
    std::atomic<uint64_t>* errors = nullptr;
    Track* track = nullptr;

    void issue() {
        uint64_t v = left;
        p(v).then([this, v](Result<uint64_t>&& r) {
            if (!r || *r != v) errors->fetch_add(1, std::memory_order_relaxed);
            if (--left > 0) {
                issue();
                return;
            }
            // Once the count reaches 0 the waiting thread may free this Chain: keep the
            // tracker's address, not `this`.
            Track* t = track;
            t->end_one();
        });
    }
};

/// `n` calls consumed `how`; when the last completed (get: when this thread had its result;
/// then, coawait: when the last chain or coroutine ended, see Track).
TimePoint work(Consume how, const Procedure<Echo>& p, uint64_t n, unsigned inflight,
               std::atomic<uint64_t>& errors, Track& track) {
    if (n == 0) return Clock::now();
    inflight = static_cast<unsigned>(std::min<uint64_t>(inflight, n));
    switch (how) {
        case Consume::none:
        case Consume::get: {
            std::vector<Future<uint64_t>> ring(inflight);
            std::vector<uint64_t> want(inflight);
            uint64_t issued = 0;
            for (; issued < inflight; ++issued) {
                want[issued] = issued;
                ring[issued] = p(issued);
            }
            for (uint64_t done = 0; done < n; ++done) {
                std::size_t slot = done % inflight;
                auto r = ring[slot].try_get();
                if (!r || *r != want[slot]) errors.fetch_add(1, std::memory_order_relaxed);
                if (issued < n) {
                    want[slot] = issued;
                    ring[slot] = p(issued);
                    ++issued;
                }
            }
            return Clock::now();
        }
        case Consume::then: {
            track.start(inflight);
            std::vector<Chain> chains(inflight);
            for (unsigned c = 0; c < inflight; ++c)
                chains[c] = Chain{p, n / inflight + (c < n % inflight ? 1 : 0), &errors, &track};
            for (auto& c : chains)
                c.issue();
            return track.wait();
        }
        case Consume::coawait: {
            // `inflight` coroutines, each a loop of co_await calls, resumed on the client's
            // progress thread; this thread waits for the last to end.
            track.start(inflight);
            for (unsigned c = 0; c < inflight; ++c)
                call_loop(p, n / inflight + (c < n % inflight ? 1 : 0), errors, track);
            return track.wait();
        }
    }
    return Clock::now();
}

/// Calls per thread: pingpong, `iters` each (the unit is one thread's round trip); rate,
/// `iters` in all.
std::vector<uint64_t> split_calls(Pattern pattern, uint64_t iters, unsigned k) {
    std::vector<uint64_t> per(k, pattern == Pattern::pingpong ? iters : iters / k);
    if (pattern != Pattern::pingpong) per[0] += iters % k;
    return per;
}

/// One process's share: `per[i]` calls on thread i from client context i to server context
/// first + i. The elapsed time; errors counts calls that failed or returned a wrong value.
Duration run_threads(const Procedure<Echo>& proc, unsigned first, Consume consume,
                     unsigned inflight, const std::vector<uint64_t>& per,
                     std::array<Track, 64>& track, std::atomic<uint64_t>& errors) {
    const auto k = static_cast<unsigned>(per.size());
    std::barrier sync(static_cast<std::ptrdiff_t>(k));
    // Each thread reads the clock itself right after the start barrier, and work() says when
    // its last call completed: a thread that only watched the barriers could be scheduled out
    // meanwhile (on a machine with fewer cores than busy threads) and time a run shorter than
    // it was.
    std::vector<TimePoint> start(k), end(k);
    std::vector<std::thread> threads;
    threads.reserve(k);
    for (unsigned i = 0; i < k; ++i) {
        Procedure<Echo> p =
            proc.from(static_cast<uint8_t>(i)).context(static_cast<uint8_t>(first + i));
        threads.emplace_back([&, p, i] {
            sync.arrive_and_wait();
            start[i] = Clock::now();
            end[i] = work(consume, p, per[i], inflight, errors, track[i]);
        });
    }
    for (auto& t : threads)
        t.join();
    return *std::max_element(end.begin(), end.end()) -
           *std::min_element(start.begin(), start.end());
}

/// A worker's next line; its "error ..." line becomes the error it names.
Result<std::string> read_worker(ServerProcess& w, Duration timeout) {
    auto line = w.read_line(timeout);
    if (!line)
        return Error(line.error().code(), fmt::format("api worker (pid {}): {}", w.pid(),
                                                      line.error().code() == Errc::disconnected
                                                          ? "exited (see its messages above)"
                                                          : line.error().message()));
    if (line->starts_with("error "))
        return Error(Errc::io_error, fmt::format("api worker (pid {}): {}", w.pid(),
                                                 std::string_view(*line).substr(6)));
    return line;
}

class ApiClient final : public Runner {
  public:
    static Result<std::unique_ptr<Runner>> create(std::string_view transport,
                                                  std::string_view server_address, int ctl_fd,
                                                  const LayerOptions& opt) {
        auto c = std::unique_ptr<ApiClient>(new ApiClient());
        TALARIA_TRY(s, RpcSession::create("api", transport, server_address, ctl_fd, opt));
        c->s_ = std::move(s);
        c->transport_ = transport;
        return std::unique_ptr<Runner>(std::move(c));
    }

    ~ApiClient() override {
        // Addresses and handles before the engine whose transport they belong to.
        drop_bulk();
        proc_ = {};
        server_ = {};
        engine_.reset();
    }

    [[nodiscard]] std::string describe(const Spec&) const override { return "api"; }

    Result<void> prepare(const Spec& s) override {
        if (is_bulk(s)) {
            prepared_ = true;
            auto r = prepare_bulk(s);
            if (!r) (void)finish(s);
            return r;
        }
        if (s.pattern != Pattern::pingpong && s.pattern != Pattern::rate)
            return Error(Errc::invalid_argument,
                         fmt::format("the api layer measures pingpong, rate, pull and push, not {}",
                                     pattern_name(s.pattern)));
        if (s.contexts == 0 || s.procs == 0 || s.contexts * s.procs > 64)
            return Error(Errc::invalid_argument,
                         fmt::format("--contexts {} x --procs {}: the server would need {} "
                                     "contexts, at most 64",
                                     s.contexts, s.procs, s.contexts * s.procs));
        prepared_ = true;
        auto addr = s_->start_api(s.mode, s.contexts * s.procs, s_->options().api_stats);
        if (!addr) {
            (void)finish(s);
            return std::move(addr).error();
        }
        // A client engine shaped for this spec: K contexts, background threads in its mode.
        if (!engine_ || engine_->context_count() != s.contexts || server_address_ != *addr) {
            drop_bulk();
            proc_ = {};
            server_ = {};
            engine_.reset();
            EngineOptions eo;
            eo.contexts = static_cast<uint8_t>(s.contexts);
            eo.core.na.auth = s_->options().auth;
            eo.core.stats = s_->options().api_stats;
            auto url =
                s_->options().url.empty() ? default_engine_url(transport_) : s_->options().url;
            auto e = Engine::open(url, false, eo);
            if (!e) {
                (void)finish(s);
                return Error(e.error().code(),
                             fmt::format("api client engine: {}", e.error().describe()));
            }
            engine_ = std::make_unique<Engine>(std::move(*e));
            auto ep = engine_->try_lookup(*addr);
            if (!ep) {
                (void)finish(s);
                return std::move(ep).error();
            }
            server_ = *ep;
            server_address_ = *addr;
            proc_ = engine_->remote<Echo>(kRpcEcho).on(server_);
            workers_.clear();
        }
        if (auto r = start_workers(s, *addr); !r) {
            (void)finish(s);
            return r;
        }
        return set_mode(s.mode);
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        if (is_bulk(s)) return run_bulk(s, iters);
        const unsigned k = s.contexts;
        const unsigned inflight = s.pattern == Pattern::pingpong ? 1 : std::max(1u, s.inflight);
        // rate: `iters` calls over all processes (this one takes the remainder).
        const unsigned procs = s.procs;
        const uint64_t share = s.pattern == Pattern::pingpong ? iters : iters / procs;
        for (auto& w : workers_)
            TALARIA_CHECK(
                w->write_line(fmt::format("run {} {} {} {}", share, consume_name(s.consume),
                                          pattern_name(s.pattern), inflight)));
        const uint64_t mine = s.pattern == Pattern::pingpong ? iters : share + iters % procs;
        std::atomic<uint64_t> errors{0};
        Duration elapsed = run_threads(proc_, 0, s.consume, inflight,
                                       split_calls(s.pattern, mine, k), track_, errors);
        for (auto& w : workers_) {
            TALARIA_TRY(line, read_worker(*w, std::chrono::seconds(120)));
            unsigned long long ns = 0, errs = 0;
            if (std::sscanf(line.c_str(), "done %llu %llu", &ns, &errs) != 2)
                return Error(Errc::protocol_error,
                             fmt::format("api worker: unexpected answer '{}'", line));
            elapsed = std::max(elapsed, Duration(std::chrono::nanoseconds(ns)));
            errors += errs;
        }
        if (uint64_t e = errors.load(); e != 0)
            return Error(Errc::protocol_error,
                         fmt::format("api: {} calls failed or returned a wrong value", e));
        return elapsed;
    }

    Result<void> finish(const Spec&) override {
        if (!prepared_) return ok();
        prepared_ = false;
        const bool exposed = remote_.valid();  // pull / push: the server's buffer goes too
        drop_bulk();
        return s_->end_measurement(exposed);
    }

    Result<void> suspend(const Spec&) override {
        if (engine_) TALARIA_CHECK(set_mode(Mode::block));  // idle between repetitions
        return s_->leave_phase();
    }
    Result<void> resume(const Spec& s) override {
        if (is_bulk(s))
            TALARIA_CHECK(s_->enter_phase());  // its mode kept; start() would drop the buffer
        else
            TALARIA_CHECK(s_->start_api(s.mode, s.contexts * s.procs, s_->options().api_stats));
        return set_mode(s.mode);
    }

  private:
    ApiClient() = default;

    static bool is_bulk(const Spec& s) noexcept {
        return s.pattern == Pattern::pull || s.pattern == Pattern::push;
    }

    /// A client engine of `contexts` contexts (kept while the shape stays).
    Result<void> ensure_engine(unsigned contexts) {
        if (engine_ && engine_->context_count() == contexts) return ok();
        drop_bulk();
        proc_ = {};
        server_ = {};
        server_address_.clear();
        engine_.reset();
        workers_.clear();
        EngineOptions eo;
        eo.contexts = static_cast<uint8_t>(contexts);
        eo.core.na.auth = s_->options().auth;
        eo.core.stats = s_->options().api_stats;
        auto url = s_->options().url.empty() ? default_engine_url(transport_) : s_->options().url;
        auto e = Engine::open(url, false, eo);
        if (!e)
            return Error(e.error().code(),
                         fmt::format("api client engine: {}", e.error().describe()));
        engine_ = std::make_unique<Engine>(std::move(*e));
        return ok();
    }

    void drop_bulk() noexcept {
        remote_ = {};
        local_ = {};
        bulk_peer_ = {};
        region_.reset();
    }

    /// pull / push: this engine's buffer, and the server core engine's (bulk_setup), decoded
    /// here with the server as its owner.
    Result<void> prepare_bulk(const Spec& s) {
        if (s.contexts != 1 || s.procs != 1)
            return Error(Errc::invalid_argument,
                         "the api layer's pull and push run on one context in one process");
        TALARIA_CHECK(s_->start(s.mode));
        TALARIA_CHECK(ensure_engine(1));
        drop_bulk();
        TALARIA_CHECK(region_.allocate(s.size, 0x3c));
        TALARIA_TRY(local, engine_->try_expose(Segment{region_.data(), s.size}, read_write));
        local_ = std::move(local);
        TALARIA_TRY(peer, engine_->try_lookup(s_->server_address()));
        bulk_peer_ = peer;
        TALARIA_TRY(enc, s_->bulk_setup(s.size));
        TALARIA_TRY(rh, RpcSession::decode_exposed(enc, engine_->core().transport(),
                                                   bulk_peer_.addr(), s.size));
        remote_ = std::move(rh);
        return set_mode(s.mode);
    }

    /// `iters` transfers, `--rma-inflight` futures in flight, each taken with get().
    Result<Duration> run_bulk(const Spec& s, uint64_t iters) {
        const bool pull = s.pattern == Pattern::pull;
        const auto inflight =
            static_cast<unsigned>(std::min<uint64_t>(std::max(1u, s.inflight), iters));
        auto start = [&] {
            return pull ? engine_->pull(remote_, 0, local_, 0, s.size, bulk_peer_)
                        : engine_->push(remote_, 0, local_, 0, s.size, bulk_peer_);
        };
        std::vector<Future<void>> ring(inflight);
        const TimePoint t0 = Clock::now();
        uint64_t issued = 0;
        for (; issued < inflight; ++issued)
            ring[issued] = start();
        for (uint64_t done = 0; done < iters; ++done) {
            std::size_t slot = done % inflight;
            if (auto r = ring[slot].try_get(); !r) {
                for (auto& f : ring)  // the others complete before their memory goes
                    (void)f.try_get();
                return Error(r.code(), fmt::format("api {}: {}", pattern_name(s.pattern),
                                                   r.error().describe()));
            }
            if (issued < iters) {
                ring[slot] = start();
                ++issued;
            }
        }
        return Clock::now() - t0;
    }

    /// This engine's threads and every worker's: busy, or blocking (also while idle).
    Result<void> set_mode(Mode m) {
        engine_->set_wait_mode(m == Mode::busy ? WaitMode::busy : WaitMode::block);
        for (auto& w : workers_) {
            TALARIA_CHECK(w->write_line(mode_name(m)));
            TALARIA_TRY(line, read_worker(*w, std::chrono::seconds(30)));
            if (line != "ok")
                return Error(Errc::protocol_error,
                             fmt::format("api worker: unexpected answer '{}'", line));
        }
        return ok();
    }

    /// The P-1 other client processes, started once per shape (kept across repetitions and
    /// modes): process p has K contexts calling server contexts p*K .. p*K+K-1.
    Result<void> start_workers(const Spec& s, const std::string& server) {
        if (workers_.size() == s.procs - 1 && worker_k_ == s.contexts) return ok();
        workers_.clear();
        worker_k_ = s.contexts;
        auto url = s_->options().url.empty() ? default_engine_url(transport_) : s_->options().url;
        for (unsigned p = 1; p < s.procs; ++p) {
            auto w = std::make_unique<ServerProcess>();
            std::vector<std::string> args{"api-worker",
                                          "--url",
                                          url,
                                          "--server",
                                          server,
                                          "--contexts",
                                          std::to_string(s.contexts),
                                          "--first",
                                          std::to_string(p * s.contexts)};
            push_auth_args(args, s_->options().auth_file, s_->options().protect);
            if (!s_->options().api_stats) args.push_back("--no-stats");
            TALARIA_CHECK(w->start(args, -1, true));
            TALARIA_TRY(line, read_worker(*w, std::chrono::seconds(30)));
            if (line != "ready")
                return Error(Errc::protocol_error,
                             fmt::format("api worker {} did not start: {}", p, line));
            workers_.push_back(std::move(w));
        }
        return ok();
    }

    std::unique_ptr<RpcSession> s_;
    std::string transport_;
    std::array<Track, 64> track_{};  ///< per thread; outlives engine_
    std::unique_ptr<Engine> engine_;
    Endpoint server_;
    std::string server_address_;
    Procedure<Echo> proc_;
    std::vector<std::unique_ptr<ServerProcess>> workers_;  ///< --procs: the other processes
    unsigned worker_k_ = 0;                                ///< their contexts each
    bool prepared_ = false;
    // pull / push
    Region region_;
    Bulk local_;
    Bulk remote_;
    Endpoint bulk_peer_;  ///< the server's core engine
};

}  // namespace

int run_api_worker(const ApiWorkerOptions& o) {
    auto fail = [](const std::string& why) {
        fmt::print("error {}\n", why);
        std::fflush(stdout);
        return 1;
    };
    std::array<Track, 64> track{};  // outlives the engine's last callback
    EngineOptions eo;
    eo.contexts = static_cast<uint8_t>(o.contexts);
    eo.core.stats = o.stats;
    auto auth = perf_auth(o.auth_file, o.protect);
    if (!auth) return fail(auth.error().describe());
    eo.core.na.auth = std::move(*auth);
    auto e = Engine::open(o.url, false, eo);
    if (!e) return fail(fmt::format("engine: {}", e.error().describe()));
    auto engine = std::make_unique<Engine>(std::move(*e));
    auto ep = engine->try_lookup(o.server);
    if (!ep) return fail(fmt::format("lookup {}: {}", o.server, ep.error().describe()));
    Procedure<Echo> proc = engine->remote<Echo>(kRpcEcho).on(*ep);
    fmt::print("ready\n");
    std::fflush(stdout);
    // Commands, one a line: "busy" / "block" (answer "ok"); "run CALLS CONSUME PATTERN
    // INFLIGHT" (answer "done NANOSECONDS ERRORS"). End of input: exit.
    char line[256];
    while (std::fgets(line, sizeof line, stdin)) {
        std::string_view cmd(line);
        while (!cmd.empty() && (cmd.back() == '\n' || cmd.back() == '\r'))
            cmd.remove_suffix(1);
        if (auto m = parse_mode(cmd)) {
            engine->set_wait_mode(*m == Mode::busy ? WaitMode::busy : WaitMode::block);
            fmt::print("ok\n");
        } else if (cmd.starts_with("run ")) {
            unsigned long long calls = 0;
            unsigned inflight = 0;
            char consume[16] = {}, pattern[16] = {};
            if (std::sscanf(line, "run %llu %15s %15s %u", &calls, consume, pattern, &inflight) !=
                4)
                return fail(fmt::format("bad command '{}'", cmd));
            auto c = parse_consume(consume);
            auto p = parse_pattern(pattern);
            if (!c || !p) return fail(fmt::format("bad command '{}'", cmd));
            std::atomic<uint64_t> errors{0};
            Duration d = run_threads(proc, o.first, *c, inflight,
                                     split_calls(*p, calls, o.contexts), track, errors);
            fmt::print("done {} {}\n",
                       std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(),
                       errors.load());
        } else {
            return fail(fmt::format("unknown command '{}'", cmd));
        }
        std::fflush(stdout);
    }
    engine->set_wait_mode(WaitMode::block);
    proc = {};
    return 0;
}

Result<std::unique_ptr<Runner>> make_api_client(std::string_view transport,
                                                std::string_view server_address, int ctl_fd,
                                                const LayerOptions& opt) {
    return ApiClient::create(transport, server_address, ctl_fd, opt);
}

}  // namespace talaria::perf
