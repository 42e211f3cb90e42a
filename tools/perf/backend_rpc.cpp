// talaria-perf: the rpc back end, measured through the core layer (core::Engine) directly, so
// that the numbers show what the RPC layer adds over the raw transport.
//   pingpong : one call of "perf.empty" at a time (arguments of --size bytes, default empty;
//              empty result): the round trip in us. Above Engine::eager_size() the arguments
//              go by the core's large path (the server pulls them, then acknowledges).
//   rate     : `inflight` calls kept in flight, calls per second
//   first    : a fresh client engine per call: lookup + connection set-up + the first round trip
// The server (also the bulk back end's server) is one core::Engine with "perf.empty" and
// "perf.ctl" registered; see rpc_session.hpp for the control calls.
#include <poll.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "rpc_session.hpp"
#include "talaria/proc/archive.hpp"
#include "talaria/talaria.hpp"
#include "talaria/util/log.hpp"
#include "transports.hpp"

namespace talaria::perf {

std::string default_engine_url(std::string_view transport) {
    return default_url(transport);
}

Result<std::unique_ptr<core::Engine>> open_perf_engine(std::string_view transport,
                                                       std::string_view url, bool listen,
                                                       const LayerOptions& opt) {
    core::Options o;
    o.na.listen = listen;
    o.na.thread_safe = opt.thread_safe;
    o.na.auth = opt.auth;
    std::string addr = url.empty() ? default_engine_url(transport) : std::string(url);
    auto e = core::Engine::open(addr, o);
    if (!e)
        return Error(e.error().code(),
                     fmt::format("opening a core engine on '{}': {}", addr, e.error().describe()));
    return std::move(*e);
}

namespace {

constexpr core::RpcId kEmptyId = core::rpc_id(kRpcEmpty);
constexpr core::RpcId kCtlId = core::rpc_id(kRpcCtl);
/// Block mode: the server polls this long after its last work before it sleeps in progress().
constexpr Duration kBlockSpin = std::chrono::microseconds(20);
constexpr Duration kServerBlockWait = std::chrono::milliseconds(100);
constexpr Duration kClientBlockWait = std::chrono::seconds(1);

uint64_t get_u64(const std::byte* p) noexcept {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// =================================================================================================
// Server (rpc and bulk layers)

class RpcServer final : public LayerServer {
  public:
    static Result<std::unique_ptr<LayerServer>> create(std::string_view transport,
                                                       const LayerOptions& opt) {
        auto s = std::unique_ptr<RpcServer>(new RpcServer());
        TALARIA_TRY(e, open_perf_engine(transport, opt.url, true, opt));
        s->engine_ = std::move(e);
        s->transport_ = transport;
        s->auth_ = opt.auth;
        RpcServer* self = s.get();
        // The measured handler: respond with an empty result, nothing else.
        TALARIA_CHECK(s->engine_->register_rpc(kEmptyId, kRpcEmpty, [self](core::Request& r) {
            ++self->activity_;
            if (auto x = r.respond({}); !x) self->note_error(x.error());
        }));
        TALARIA_CHECK(s->engine_->register_rpc(kCtlId, kRpcCtl,
                                               [self](core::Request& r) { self->on_ctl(r); }));
        return std::unique_ptr<LayerServer>(std::move(s));
    }

    ~RpcServer() override {
        // Registered memory first: the engine (and its transport) outlive the handle.
        bulks_.clear();
        api_.reset();
        engine_.reset();
    }

    [[nodiscard]] std::string address() const override { return engine_->self_string(); }

    Result<void> run_phase(int ctl_fd) override {
        end_ = false;
        core::Context& ctx = engine_->context(0);
        uint64_t seen_activity = activity_ + api_activity_.load(std::memory_order_relaxed);
        TimePoint idle_since = Clock::now();
        TimePoint last_work = idle_since;
        for (unsigned n = 1;; ++n) {
            unsigned ran = ctx.trigger();
            if (!error_.empty()) {
                auto e = Error(Errc::protocol_error, error_);
                error_.clear();
                return e;
            }
            // After `end` keep polling (our response may still be leaving) until the client
            // comes back on the control connection.
            bool spin = mode_ == Mode::busy || end_;
            if (!spin) {
                if (ran) last_work = Clock::now();
                spin = ran || Clock::now() - last_work < kBlockSpin;
            }
            auto r = ctx.progress(spin ? Duration::zero() : kServerBlockWait);
            bool slept = false;
            if (!r) {
                if (r.code() != Errc::timeout) {
                    TALARIA_LOG(perf, error, "rpc server: progress failed: {}",
                                r.error().describe());
                    return std::move(r).error();
                }
                slept = !spin;
            }
            // Between requests: notice a client that moved on (control request or EOF) or went
            // silent. Cheap enough every few thousand busy polls, or after a sleep.
            if (end_ || slept || (n & 4095) == 0) {
                pollfd p{ctl_fd, POLLIN, 0};
                if (::poll(&p, 1, 0) > 0) return ok();
                uint64_t act = activity_ + api_activity_.load(std::memory_order_relaxed);
                if (act != seen_activity) {
                    seen_activity = act;
                    idle_since = Clock::now();
                } else if (Clock::now() - idle_since > kPeerTimeout) {
                    return Error(Errc::timeout,
                                 "rpc server: the client sent nothing for too long; leaving the "
                                 "phase");
                }
            }
        }
    }

  private:
    RpcServer() = default;

    void note_error(const Error& e) {
        TALARIA_LOG(perf, warn, "rpc server: respond failed: {}", e.describe());
        if (error_.empty()) error_ = fmt::format("respond failed: {}", e.describe());
    }

    void on_ctl(core::Request& r) {
        ++activity_;
        auto in = r.input();
        if (in.empty()) {
            (void)r.respond_error(Errc::protocol_error, "perf.ctl: empty request");
            return;
        }
        auto op = static_cast<RpcCtlOp>(in[0]);
        auto body = in.subspan(1);
        Result<void> sent;
        switch (op) {
            case RpcCtlOp::set_mode:
                if (body.size() != 1 || uint8_t(body[0]) > uint8_t(Mode::block)) break;
                mode_ = static_cast<Mode>(body[0]);
                end_ = false;
                // The api engine (if any) sleeps while the core layer is measured.
                if (api_) api_->set_wait_mode(talaria::WaitMode::block);
                // A new measurement: forget what this client exposed before.
                release_bulk(r.source());
                sent = r.respond({});
                break;
            case RpcCtlOp::end:
                end_ = true;
                sent = r.respond({});
                break;
            case RpcCtlOp::bulk_setup: {
                if (body.size() != 8) break;
                uint64_t size = get_u64(body.data());
                if (size == 0 || size > kMaxBufferBytes) {
                    sent = r.respond_error(Errc::out_of_range,
                                           fmt::format("bulk_setup: {} bytes is out of range "
                                                       "(1 .. {})",
                                                       size, kMaxBufferBytes));
                    break;
                }
                auto enc = bulk_of(r.source()).expose(engine_->transport(), size);
                sent = enc ? r.respond(*enc) : r.respond_error(enc.code(), enc.error().describe());
                break;
            }
            case RpcCtlOp::api_start: {
                if (body.size() != 3 || uint8_t(body[0]) > uint8_t(Mode::block) ||
                    uint8_t(body[1]) == 0 || uint8_t(body[2]) > 1)
                    break;
                auto addr = start_api(static_cast<Mode>(body[0]), uint8_t(body[1]),
                                      body[2] != std::byte{0});
                sent = addr ? r.respond(std::as_bytes(std::span(*addr)))
                            : r.respond_error(addr.code(), addr.error().describe());
                break;
            }
            case RpcCtlOp::bulk_release:
                if (!body.empty()) break;
                release_bulk(r.source());
                sent = r.respond({});
                break;
        }
        if (!r.responded()) {
            TALARIA_LOG(perf, warn, "rpc server: dropping a malformed perf.ctl request ({} bytes)",
                        in.size());
            sent = r.respond_error(Errc::protocol_error, "perf.ctl: malformed request");
        }
        if (!sent) note_error(sent.error());
    }

    /// The api layer's server: a talaria::Engine with background progress (the threads a user
    /// gets), opened on first use with the contexts asked for (reopened for more), serving
    /// perf.echo. While it is measured this process's core loop blocks (mode_ = block).
    Result<std::string> start_api(Mode m, unsigned contexts, bool stats) {
        if (!api_ || api_->context_count() < contexts || api_->options().core.stats != stats) {
            api_.reset();
            talaria::EngineOptions eo;
            eo.contexts = static_cast<uint8_t>(contexts);
            eo.wait = talaria::WaitMode::block;
            eo.core.na.thread_safe = true;  // background threads need it whatever --single-thread
            eo.core.na.auth = auth_;
            eo.core.stats = stats;
            auto e = talaria::Engine::open(default_engine_url(transport_), true, eo);
            if (!e)
                return Error(e.error().code(),
                             fmt::format("opening the api engine: {}", e.error().describe()));
            api_ = std::make_unique<talaria::Engine>(std::move(*e));
            auto* act = &api_activity_;
            TALARIA_CHECK(api_->try_define(kRpcEcho, [act](uint64_t x) {
                act->fetch_add(1, std::memory_order_relaxed);
                return x;
            }));
        }
        api_->set_wait_mode(m == Mode::busy ? talaria::WaitMode::busy : talaria::WaitMode::block);
        mode_ = Mode::block;
        end_ = false;
        return api_->self_address();
    }

    std::unique_ptr<core::Engine> engine_;
    std::unique_ptr<talaria::Engine> api_;
    std::atomic<uint64_t> api_activity_{0};
    std::string transport_;
    na::Auth auth_;  ///< also for the api engine it opens
    /// The buffer each client engine exposed (bulk_setup), by its address: the layers whose
    /// repetitions interleave (api with bulk, hg with api) each keep their own. At most
    /// kMaxBulkClients, the oldest forgotten first (a client that went away). Declared after
    /// engine_: released first.
    static constexpr std::size_t kMaxBulkClients = 8;
    std::vector<std::pair<na::Addr, std::unique_ptr<BulkExposure>>> bulks_;

    BulkExposure& bulk_of(const na::Addr& who) {
        for (auto& [a, b] : bulks_)
            if (a == who) return *b;
        if (bulks_.size() >= kMaxBulkClients) bulks_.erase(bulks_.begin());
        bulks_.emplace_back(who, make_bulk_exposure());
        return *bulks_.back().second;
    }
    void release_bulk(const na::Addr& who) noexcept {
        for (auto& [a, b] : bulks_)
            if (a == who) b->release();
    }
    Mode mode_ = Mode::block;
    bool end_ = false;
    uint64_t activity_ = 0;
    std::string error_;
};

// =================================================================================================
// Client

class RpcClient final : public Runner {
  public:
    static Result<std::unique_ptr<Runner>> create(std::string_view transport,
                                                  std::string_view server_address, int ctl_fd,
                                                  const LayerOptions& opt) {
        auto c = std::unique_ptr<RpcClient>(new RpcClient());
        TALARIA_TRY(s, RpcSession::create("rpc", transport, server_address, ctl_fd, opt));
        c->s_ = std::move(s);
        return std::unique_ptr<Runner>(std::move(c));
    }

    ~RpcClient() override = default;

    [[nodiscard]] std::string describe(const Spec&) const override { return "rpc"; }

    Result<void> prepare(const Spec& s) override {
        if (s.pattern != Pattern::pingpong && s.pattern != Pattern::rate &&
            s.pattern != Pattern::first)
            return Error(Errc::invalid_argument,
                         fmt::format("the rpc layer measures pingpong, rate and first, not {}",
                                     pattern_name(s.pattern)));
        // Arguments above the eager size travel by a pull from the server (the core's large
        // path); the raw baseline still moves them inline.
        args_.assign(s.size, std::byte{0x11});
        prepared_ = true;
        auto r = s_->start(s.mode);
        if (!r) (void)finish(s);
        return r;
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        s_->mode = s.mode;
        switch (s.pattern) {
            case Pattern::pingpong:
                return rate(s_->context(), iters, 1);
            case Pattern::rate:
                return rate(s_->context(), iters, std::max(1u, s.inflight));
            case Pattern::first:
                return first_calls(iters);
            default:
                break;
        }
        return Error(Errc::internal, "rpc: unexpected pattern");
    }

    Result<void> finish(const Spec&) override {
        if (!prepared_) return ok();
        prepared_ = false;
        return s_->leave_phase();
    }

    Result<void> suspend(const Spec&) override { return s_->leave_phase(); }
    // Re-sends the mode: another layer (api) may have changed the server's in between.
    Result<void> resume(const Spec& s) override { return s_->start(s.mode); }

  private:
    RpcClient() = default;

    /// The completion of every measured call: one pointer captured, no allocation.
    core::ResponseFn on_response() {
        return [this](Result<std::span<const std::byte>>&& r) {
            ++done_;
            if (!r && !first_error_) first_error_ = std::move(r).error();
        };
    }

    Result<void> check_errors() {
        if (!first_error_) return ok();
        Error e = std::move(*first_error_);
        first_error_.reset();
        return Error(e.code(), fmt::format("rpc call failed: {}", e.describe()));
    }

    /// Keep `inflight` calls in flight on `ctx` until `iters` have completed (1: ping-pong).
    Result<Duration> rate(core::Context& ctx, uint64_t iters, unsigned inflight) {
        const core::CallOptions copts;
        uint64_t base = done_;
        uint64_t posted = 0;
        auto t0 = Clock::now();
        while (done_ - base < iters) {
            while (posted < iters && posted - (done_ - base) < inflight) {
                auto id = ctx.forward(s_->server(), kEmptyId, args_, copts, on_response());
                if (!id) {
                    if (id.code() == Errc::again && posted > done_ - base) break;
                    (void)s_->wait(ctx, &done_, base + posted, "calls to drain after an error");
                    return Error(id.code(), fmt::format("rpc forward: {}", id.error().describe()));
                }
                ++posted;
            }
            TALARIA_CHECK(s_->wait(ctx, &done_, done_ + 1, "a response"));
            if (first_error_) {
                (void)s_->wait(ctx, &done_, base + posted, "calls to drain after an error");
                TALARIA_CHECK(check_errors());
            }
        }
        return Clock::now() - t0;
    }

    /// A fresh engine per call; only lookup + first call + response are timed.
    Result<Duration> first_calls(uint64_t iters) {
        Duration total{0};
        const core::CallOptions copts;
        for (uint64_t i = 0; i < iters; ++i) {
            TALARIA_TRY(e,
                        open_perf_engine(s_->transport(), s_->options().url, false, s_->options()));
            core::Context& ctx = e->context(0);
            uint64_t target = done_ + 1;
            auto t0 = Clock::now();
            TALARIA_TRY(addr, e->lookup(s_->server_address()));
            auto id = ctx.forward(addr, kEmptyId, args_, copts, on_response());
            if (!id) return Error(id.code(), fmt::format("rpc forward: {}", id.error().describe()));
            TALARIA_CHECK(s_->wait(ctx, &done_, target, "the first response"));
            total += Clock::now() - t0;
            TALARIA_CHECK(check_errors());
            // `addr` and the engine go here, outside the timed region.
        }
        return total;
    }

    std::unique_ptr<RpcSession> s_;
    std::vector<std::byte> args_;
    bool prepared_ = false;
    uint64_t done_ = 0;
    std::optional<Error> first_error_;
};

}  // namespace

// =================================================================================================
// RpcSession

Result<std::unique_ptr<RpcSession>> RpcSession::create(std::string_view layer,
                                                       std::string_view transport,
                                                       std::string_view server_address, int ctl_fd,
                                                       const LayerOptions& opt) {
    auto s = std::unique_ptr<RpcSession>(new RpcSession());
    s->layer_ = layer;
    s->transport_ = transport;
    s->opt_ = opt;
    s->ctl_fd_ = ctl_fd;
    s->address_ = server_address;
    TALARIA_TRY(e, open_perf_engine(transport, opt.url, false, opt));
    s->engine_ = std::move(e);
    TALARIA_TRY(a, s->engine_->lookup(server_address));
    s->server_ = std::move(a);
    return s;
}

RpcSession::~RpcSession() {
    server_.reset();
    engine_.reset();  // completes anything still in flight with `shutdown`
}

Result<void> RpcSession::enter_phase() {
    if (in_phase_) return ok();
    CtlRequest r;
    r.cmd = uint32_t(Cmd::layer_enter);
    set_text(r.name, sizeof r.name, layer_);
    TALARIA_TRY(entered, ctl_call(ctl_fd_, r));
    (void)entered;
    in_phase_ = true;
    return ok();
}

Result<void> RpcSession::start(Mode m) {
    mode = m;
    TALARIA_CHECK(enter_phase());
    std::byte b{uint8_t(m)};
    TALARIA_TRY(ack, control(RpcCtlOp::set_mode, std::span(&b, 1)));
    (void)ack;
    return ok();
}

Result<std::string> RpcSession::start_api(Mode m, unsigned contexts, bool stats) {
    mode = m;
    TALARIA_CHECK(enter_phase());
    std::byte b[3]{std::byte{uint8_t(m)}, std::byte{uint8_t(contexts)}, std::byte{uint8_t(stats)}};
    TALARIA_TRY(addr, control(RpcCtlOp::api_start, b));
    return std::string(reinterpret_cast<const char*>(addr.data()), addr.size());
}

Result<void> RpcSession::leave_phase() {
    if (!in_phase_) return ok();
    in_phase_ = false;
    TALARIA_TRY(ack, control(RpcCtlOp::end, {}));
    (void)ack;
    return ok();
}

Result<std::span<const std::byte>> RpcSession::bulk_setup(uint64_t size) {
    std::byte req[8];
    std::memcpy(req, &size, sizeof size);
    return control(RpcCtlOp::bulk_setup, req);
}

Result<bulk::Handle> RpcSession::decode_exposed(std::span<const std::byte> enc,
                                                na::Transport& transport, const na::Addr& owner,
                                                uint64_t size) {
    proc::Decoder d(enc, proc::DecodeContext{&transport, &owner});
    TALARIA_TRY(h, bulk::Handle::decode(d));
    if (h.size() < size)
        return Error(Errc::protocol_error,
                     fmt::format("the server exposed {} bytes, asked for {}", h.size(), size));
    return h;
}

Result<void> RpcSession::end_measurement(bool exposed) {
    Result<void> result;
    if (exposed) {
        if (!in_phase_) result = enter_phase();
        if (result) {
            auto r = control(RpcCtlOp::bulk_release, {});
            if (!r) result = std::move(r).error();
        }
    }
    auto l = leave_phase();
    if (!l && result) result = std::move(l).error();
    return result;
}

Result<std::span<const std::byte>> RpcSession::control(RpcCtlOp op,
                                                       std::span<const std::byte> body) {
    ctl_args_.assign(1, std::byte{uint8_t(op)});
    ctl_args_.insert(ctl_args_.end(), body.begin(), body.end());
    ctl_error_.reset();
    uint64_t target = ctl_done_ + 1;
    core::CallOptions copts;
    copts.timeout = kPeerTimeout;
    auto id = context().forward(server_, kCtlId, ctl_args_, copts,
                                [this](Result<std::span<const std::byte>>&& r) {
                                    ++ctl_done_;
                                    if (r)
                                        ctl_reply_.assign(r->begin(), r->end());
                                    else
                                        ctl_error_ = std::move(r).error();
                                });
    if (!id) return std::move(id).error();
    TALARIA_CHECK(wait(context(), &ctl_done_, target, "a perf.ctl response"));
    if (ctl_error_)
        return Error(ctl_error_->code(),
                     fmt::format("perf.ctl call failed: {}", ctl_error_->describe()));
    return std::span<const std::byte>(ctl_reply_);
}

Result<void> RpcSession::wait(core::Context& ctx, const uint64_t* counter, uint64_t target,
                              std::string_view what) {
    TimePoint deadline{};
    for (unsigned n = 1;; ++n) {
        if (*counter < target) ctx.trigger();
        if (*counter >= target) return ok();
        auto r = ctx.progress(mode == Mode::busy ? Duration::zero() : kClientBlockWait);
        if (!r && r.code() != Errc::timeout)
            return Error(r.code(), fmt::format("core progress while waiting for {}: {}", what,
                                               r.error().describe()));
        if (mode == Mode::block || (n & 1023) == 0) {
            auto now = Clock::now();
            if (deadline == TimePoint{}) deadline = now + kPeerTimeout;
            if (now > deadline)
                return Error(Errc::timeout,
                             fmt::format("rpc: no completion for {} within {} s (server stuck or "
                                         "messages lost)",
                                         what, kPeerTimeout.count() / 1000000000));
        }
    }
}

// =================================================================================================

Result<std::unique_ptr<LayerServer>> make_rpc_server(std::string_view transport,
                                                     const LayerOptions& opt) {
    return RpcServer::create(transport, opt);
}

Result<std::unique_ptr<Runner>> make_rpc_client(std::string_view transport,
                                                std::string_view server_address, int ctl_fd,
                                                const LayerOptions& opt) {
    return RpcClient::create(transport, server_address, ctl_fd, opt);
}

}  // namespace talaria::perf
