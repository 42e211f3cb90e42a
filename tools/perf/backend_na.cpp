// talaria-perf: the na back end. Client and server talk through the na interface only:
//   tag = kind << 24 | sequence (24 bits); requests are unexpected messages to context 0,
//   replies are expected messages with the request's tag: [u32 Errc][u32 length][payload].
//   ping      : the server echoes the message (same length) as the expected reply
//   blast     : counted, no reply
//   blast_fin : payload u64 n; the reply is sent once n blast messages have arrived
//   set_mode  : payload u8 Mode: the server's progress loop polls (busy) or blocks; starts a
//               measurement (resets the blast count, releases memory)
//   mem_setup : payload u64 size; the server registers a buffer and replies with its handle
//   mem_release, end (leave the phase)
#include <poll.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "backend.hpp"
#include "control.hpp"
#include "region.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/log.hpp"
#include "transports.hpp"

namespace talaria::perf {

namespace {

enum Kind : uint32_t {
    kPing = 1,
    kBlast,
    kBlastFin,
    kSetMode,
    kMemSetup,
    kMemRelease,
    kEnd,
};

constexpr std::size_t kReplyHeader = 8;
/// Cap on the server's receive buffers: larger messages are not benchmarked.
constexpr std::size_t kMaxMsg = 1 << 20;
constexpr std::size_t kCtlBuf = 4096;

std::string_view kind_name(uint32_t kind) noexcept {
    switch (kind) {
        case kPing:
            return "ping";
        case kBlast:
            return "blast";
        case kBlastFin:
            return "blast_fin";
        case kSetMode:
            return "set_mode";
        case kMemSetup:
            return "mem_setup";
        case kMemRelease:
            return "mem_release";
        case kEnd:
            return "end";
        default:
            return "unknown";
    }
}

na::Tag make_tag(uint32_t kind, uint32_t seq) noexcept {
    return (kind << 24) | (seq & 0xffffff);
}

void put_u64(std::byte* p, uint64_t v) noexcept {
    std::memcpy(p, &v, sizeof v);
}
uint64_t get_u64(const std::byte* p) noexcept {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

Result<std::unique_ptr<na::Transport>> open_transport(std::string_view transport,
                                                      std::string_view url, bool listen,
                                                      const LayerOptions& opt) {
    na::Options o;
    o.listen = listen;
    o.thread_safe = opt.thread_safe;
    o.auth = opt.auth;
    std::string addr(url);
    if (addr.empty()) addr = default_url(transport);
    auto t = na::open(addr, o);
    if (!t)
        return Error(t.error().code(),
                     fmt::format("opening na transport '{}': {}", addr, t.error().describe()));
    return std::move(*t);
}

// =================================================================================================
// Server

class NaServer final : public LayerServer {
  public:
    static Result<std::unique_ptr<LayerServer>> create(std::string_view transport,
                                                       const LayerOptions& opt) {
        auto s = std::unique_ptr<NaServer>(new NaServer());
        TALARIA_TRY(t, open_transport(transport, opt.url, true, opt));
        s->tr_ = std::move(t);
        TALARIA_TRY(ctx, s->tr_->context_create(0));
        s->ctx_ = std::move(ctx);
        TALARIA_CHECK(s->post_all());
        return std::unique_ptr<LayerServer>(std::move(s));
    }

    ~NaServer() override { shutdown(); }

    [[nodiscard]] std::string address() const override {
        return tr_->addr_to_string(tr_->addr_self());
    }

    Result<void> run_phase(int ctl_fd) override {
        end_ = false;
        uint64_t seen_activity = activity_;
        TimePoint idle_since = Clock::now();
        for (unsigned n = 1;; ++n) {
            ctx_->trigger();
            if (end_ && replies_in_flight_ == 0) return ok();
            if (!error_.empty()) {
                auto e = Error(Errc::protocol_error, error_);
                error_.clear();
                return e;
            }
            auto r = ctx_->progress(mode_ == Mode::busy ? Duration::zero()
                                                        : Duration(std::chrono::milliseconds(100)));
            if (!r && r.code() != Errc::timeout) {
                TALARIA_LOG(perf, error, "na server: progress failed: {}", r.error().describe());
                return std::move(r).error();
            }
            // Between requests: notice a client that gave up (control request or EOF) or
            // went silent. Cheap enough to check every few thousand busy polls.
            if (mode_ == Mode::block || (n & 4095) == 0) {
                pollfd p{ctl_fd, POLLIN, 0};
                if (::poll(&p, 1, 0) > 0) {
                    TALARIA_LOG(perf, info,
                                "na server: control request or hang-up during the na phase: "
                                "leaving the phase");
                    return ok();
                }
                if (activity_ != seen_activity) {
                    seen_activity = activity_;
                    idle_since = Clock::now();
                } else if (Clock::now() - idle_since > kPeerTimeout) {
                    return Error(Errc::timeout,
                                 "na server: the client sent nothing for too long; leaving the "
                                 "phase");
                }
            }
        }
    }

  private:
    struct Slot {
        na::MsgBuffer buf;
        na::OpId id;
        bool posted = false;
        bool sending = false;
        bool cancel_requested = false;
    };
    struct ReplySlot {
        na::MsgBuffer buf;
        bool busy = false;
    };

    NaServer() = default;

    Result<void> post_all() {
        std::size_t cap = std::min(tr_->max_unexpected_size(), kMaxMsg);
        std::size_t n =
            std::clamp<std::size_t>((64u << 20) / std::max<std::size_t>(cap, 1), 8, 128);
        slots_.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            TALARIA_TRY(b, tr_->msg_buf_alloc(cap));
            slots_[i].buf = std::move(b);
            TALARIA_CHECK(post_recv(i));
        }
        std::size_t rcap = std::min(tr_->max_expected_size(), kCtlBuf);
        for (auto& r : replies_) {
            TALARIA_TRY(b, tr_->msg_buf_alloc(rcap));
            r.buf = std::move(b);
        }
        return ok();
    }

    Result<void> post_recv(std::size_t i) {
        auto id = tr_->post_recv_unexpected(
            *ctx_, [this, i](const na::Completion& c) { on_recv(i, c); }, slots_[i].buf);
        if (!id) return std::move(id).error();
        slots_[i].id = *id;
        slots_[i].posted = true;
        return ok();
    }

    void repost(std::size_t i) {
        if (shutting_down_) return;
        if (auto r = post_recv(i); !r) {
            TALARIA_LOG(perf, error, "na server: re-posting a receive failed: {}",
                        r.error().describe());
            error_ = fmt::format("re-posting a receive failed: {}", r.error().describe());
        }
    }

    void on_recv(std::size_t i, const na::Completion& c) {
        Slot& s = slots_[i];
        s.posted = false;
        if (c.status == Errc::canceled) return;
        ++activity_;
        if (c.status != Errc::ok) {
            TALARIA_LOG(perf, warn, "na server: receive completed with {}", errc_name(c.status));
            repost(i);
            return;
        }
        const std::byte* p = s.buf.data();
        switch (c.tag >> 24) {
            case kPing: {
                s.sending = true;
                auto id = tr_->post_send_expected(
                    *ctx_,
                    [this, i](const na::Completion& sc) {
                        slots_[i].sending = false;
                        if (sc.status != Errc::ok && sc.status != Errc::canceled)
                            TALARIA_LOG(perf, warn, "na server: echo send completed with {}",
                                        errc_name(sc.status));
                        repost(i);
                    },
                    s.buf, c.size, c.source, 0, c.tag);
                if (!id) {
                    s.sending = false;
                    TALARIA_LOG(perf, warn, "na server: echo send failed: {}",
                                id.error().describe());
                    repost(i);
                }
                return;
            }
            case kBlast:
                ++blast_count_;
                repost(i);
                finish_blast();
                return;
            case kBlastFin:
                if (c.size < 8) break;
                fin_target_ = get_u64(p);
                fin_source_ = c.source;
                fin_tag_ = c.tag;
                fin_pending_ = true;
                repost(i);
                finish_blast();
                return;
            case kSetMode:
                if (c.size < 1 || uint8_t(p[0]) > uint8_t(Mode::block)) break;
                mode_ = static_cast<Mode>(p[0]);
                // A new measurement starts: forget what an earlier (perhaps dead) client left.
                blast_count_ = 0;
                fin_pending_ = false;
                fin_source_.reset();
                mem_.reset();
                region_.reset();
                repost(i);
                reply(c.source, c.tag, Errc::ok, {});
                return;
            case kMemSetup: {
                if (c.size < 8) break;
                uint64_t size = get_u64(p);
                repost(i);
                mem_setup(c.source, c.tag, size);
                return;
            }
            case kMemRelease:
                repost(i);
                mem_.reset();
                region_.reset();
                reply(c.source, c.tag, Errc::ok, {});
                return;
            case kEnd:
                repost(i);
                end_ = true;
                reply(c.source, c.tag, Errc::ok, {});
                return;
            default:
                break;
        }
        TALARIA_LOG(perf, warn, "na server: dropping a malformed request (tag {:#x}, {} bytes)",
                    c.tag, c.size);
        repost(i);
    }

    void finish_blast() {
        if (!fin_pending_ || blast_count_ < fin_target_) return;
        blast_count_ -= fin_target_;
        fin_pending_ = false;
        reply(fin_source_, fin_tag_, Errc::ok, {});
        fin_source_.reset();
    }

    void mem_setup(const na::Addr& src, na::Tag tag, uint64_t size) {
        mem_.reset();
        if (size == 0 || size > kMaxBufferBytes) {
            reply(src, tag, Errc::out_of_range, {});
            return;
        }
        if (auto r = region_.allocate(size, 0xa5); !r) {
            reply(src, tag, r.error().code(), {});
            return;
        }
        auto h = tr_->mem_register(region_.data(), size, na::Access::read_write);
        if (!h) {
            TALARIA_LOG(perf, warn, "na server: mem_register of {} bytes failed: {}", size,
                        h.error().describe());
            reply(src, tag, h.error().code(), {});
            return;
        }
        mem_ = std::move(*h);
        std::array<std::byte, kCtlBuf> tmp{};
        std::size_t need = tr_->mem_serialize_size(mem_);
        if (need > tmp.size() - kReplyHeader) {
            reply(src, tag, Errc::message_too_large, {});
            return;
        }
        auto n = tr_->mem_serialize(mem_, std::span(tmp.data(), need));
        if (!n) {
            reply(src, tag, n.error().code(), {});
            return;
        }
        reply(src, tag, Errc::ok, std::span<const std::byte>(tmp.data(), *n));
    }

    void reply(const na::Addr& dest, na::Tag tag, Errc status, std::span<const std::byte> body) {
        for (std::size_t k = 0; k < replies_.size(); ++k) {
            ReplySlot& r = replies_[k];
            if (r.busy) continue;
            if (body.size() + kReplyHeader > r.buf.size()) {
                status = Errc::message_too_large;
                body = {};
            }
            uint32_t hdr[2] = {uint32_t(status), uint32_t(body.size())};
            std::memcpy(r.buf.data(), hdr, sizeof hdr);
            if (!body.empty()) std::memcpy(r.buf.data() + kReplyHeader, body.data(), body.size());
            auto id = tr_->post_send_expected(
                *ctx_,
                [this, k](const na::Completion& c) {
                    replies_[k].busy = false;
                    --replies_in_flight_;
                    if (c.status != Errc::ok)
                        TALARIA_LOG(perf, warn, "na server: reply completed with {}",
                                    errc_name(c.status));
                },
                r.buf, kReplyHeader + body.size(), dest, 0, tag);
            if (!id) {
                TALARIA_LOG(perf, error, "na server: posting a reply failed: {}",
                            id.error().describe());
                return;
            }
            r.busy = true;
            ++replies_in_flight_;
            return;
        }
        TALARIA_LOG(perf, error, "na server: all reply buffers busy; dropping a reply");
    }

    void shutdown() noexcept {
        if (!ctx_) return;
        shutting_down_ = true;
        // Everything we posted completes exactly once: cancel the pending receives, then
        // drain (bounded) before the context and transport go away.
        TimePoint deadline = Clock::now() + std::chrono::seconds(2);
        while (Clock::now() < deadline) {
            bool busy = replies_in_flight_ > 0;
            for (auto& s : slots_) {
                if (s.posted && !s.cancel_requested) {
                    if (auto r = tr_->cancel(s.id); !r && r.code() == Errc::not_found)
                        s.posted = false;
                    s.cancel_requested = true;
                }
                busy = busy || s.sending || s.posted;
            }
            if (!busy) break;
            (void)ctx_->progress(std::chrono::milliseconds(10));
            ctx_->trigger();
        }
        mem_.reset();
        fin_source_.reset();
        ctx_.reset();
    }

    std::unique_ptr<na::Transport> tr_;
    std::unique_ptr<na::Context> ctx_;
    std::vector<Slot> slots_;
    std::array<ReplySlot, 4> replies_;
    unsigned replies_in_flight_ = 0;
    Mode mode_ = Mode::block;
    bool end_ = false;
    bool shutting_down_ = false;
    uint64_t activity_ = 0;
    std::string error_;
    uint64_t blast_count_ = 0;
    uint64_t fin_target_ = 0;
    bool fin_pending_ = false;
    na::Addr fin_source_;
    na::Tag fin_tag_ = 0;
    Region region_;
    na::MemHandle mem_;
};

// =================================================================================================
// Client

class NaClient final : public Runner {
  public:
    static Result<std::unique_ptr<Runner>> create(std::string_view transport,
                                                  std::string_view server_address, int ctl_fd,
                                                  const LayerOptions& opt) {
        auto c = std::unique_ptr<NaClient>(new NaClient(ctl_fd));
        TALARIA_TRY(t, open_transport(transport, opt.url, false, opt));
        c->tr_ = std::move(t);
        TALARIA_TRY(ctx, c->tr_->context_create(0));
        c->ctx_ = std::move(ctx);
        TALARIA_TRY(a, c->tr_->addr_lookup(server_address));
        c->server_ = std::move(a);
        std::size_t cap = std::min(c->tr_->max_expected_size(), kCtlBuf);
        if (cap < kReplyHeader + 16)
            return Error(Errc::not_supported,
                         fmt::format("na transport '{}' allows expected messages of only {} "
                                     "bytes; talaria-perf needs {}",
                                     transport, cap, kReplyHeader + 16));
        TALARIA_TRY(sb, c->tr_->msg_buf_alloc(64));
        c->ctl_send_ = std::move(sb);
        TALARIA_TRY(rb, c->tr_->msg_buf_alloc(cap));
        c->ctl_recv_ = std::move(rb);
        return std::unique_ptr<Runner>(std::move(c));
    }

    ~NaClient() override {
        // Everything posted has completed by the time run()/control() return (or failed
        // before posting), except after a timeout: drain briefly so nothing completes late.
        drain_outstanding();
        local_mem_.reset();
        remote_mem_.reset();
        bufs_.clear();
        server_.reset();
        ctx_.reset();
    }

    [[nodiscard]] std::string describe(const Spec&) const override { return "na"; }

    Result<void> prepare(const Spec& s) override {
        auto r = prepare_impl(s);
        if (!r && prepared_) (void)finish(s);  // leave the phase, release what was set up
        return r;
    }

    Result<void> prepare_impl(const Spec& s) {
        if (s.pattern != Pattern::pingpong && s.pattern != Pattern::blast &&
            s.pattern != Pattern::put && s.pattern != Pattern::get)
            return Error(Errc::invalid_argument,
                         fmt::format("the na layer measures pingpong, blast, put and get, not {}",
                                     pattern_name(s.pattern)));
        // Size limits first: nothing to undo when the spec cannot run.
        if (s.pattern == Pattern::pingpong || s.pattern == Pattern::blast) {
            std::size_t limit = std::min(tr_->max_unexpected_size(), kMaxMsg);
            if (s.pattern == Pattern::pingpong) limit = std::min(limit, tr_->max_expected_size());
            if (s.size > limit)
                return Error(Errc::message_too_large,
                             fmt::format("{} B messages exceed what the {} transport sends "
                                         "({} B)",
                                         s.size, tr_->name(), limit));
        }
        TALARIA_CHECK(enter_phase());
        prepared_ = true;
        mode_ = s.mode;
        std::byte m{uint8_t(s.mode)};
        TALARIA_TRY(ack, control(kSetMode, std::span(&m, 1)));
        (void)ack;
        unsigned nbufs = s.pattern == Pattern::pingpong ? 2 : std::max(1u, s.inflight);
        if (s.pattern == Pattern::pingpong || s.pattern == Pattern::blast) {
            bufs_.clear();
            free_.clear();
            for (unsigned i = 0; i < nbufs; ++i) {
                TALARIA_TRY(b, tr_->msg_buf_alloc(std::max<std::size_t>(s.size, 1)));
                std::memset(b.data(), 0x11, b.size());
                bufs_.push_back(std::move(b));
                free_.push_back(i);
            }
            return ok();
        }
        // put/get: both sides register `size` bytes; the server sends its handle.
        TALARIA_CHECK(region_.allocate(s.size, 0x3c));
        TALARIA_TRY(h, tr_->mem_register(region_.data(), s.size, na::Access::read_write));
        local_mem_ = std::move(h);
        std::byte req[8];
        put_u64(req, s.size);
        TALARIA_TRY(body, control(kMemSetup, req));
        TALARIA_TRY(rh, tr_->mem_deserialize(body));
        remote_mem_ = std::move(rh);
        return ok();
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        mode_ = s.mode;
        switch (s.pattern) {
            case Pattern::pingpong:
                return pingpong(s, iters);
            case Pattern::blast:
                return stream(s, iters);
            case Pattern::put:
            case Pattern::get:
                return stream(s, iters);
            default:  // the rpc and bulk layers' patterns (refused by prepare())
                break;
        }
        return Error(Errc::internal, "unknown pattern");
    }

    Result<void> finish(const Spec&) override {
        if (!prepared_) return ok();
        prepared_ = false;
        Result<void> result;
        if (!in_phase_) result = enter_phase();
        if (result && remote_mem_) {
            remote_mem_.reset();
            auto r = control(kMemRelease, {});
            if (!r) result = std::move(r).error();
        }
        remote_mem_.reset();
        local_mem_.reset();
        region_.reset();
        if (in_phase_) {
            in_phase_ = false;
            auto e = control(kEnd, {});
            if (!e && result) result = std::move(e).error();
        }
        return result;
    }

    Result<void> suspend(const Spec&) override {
        if (!in_phase_) return ok();
        in_phase_ = false;
        TALARIA_TRY(ack, control(kEnd, {}));
        (void)ack;
        return ok();
    }

    Result<void> resume(const Spec&) override {
        if (in_phase_) return ok();
        return enter_phase();
    }

  private:
    explicit NaClient(int ctl_fd) : ctl_fd_(ctl_fd) {}

    /// Ask the server (over the control connection) to serve na requests until kEnd.
    Result<void> enter_phase() {
        CtlRequest r;
        r.cmd = uint32_t(Cmd::layer_enter);
        set_text(r.name, sizeof r.name, "na");
        TALARIA_TRY(entered, ctl_call(ctl_fd_, r));
        (void)entered;
        in_phase_ = true;
        return ok();
    }

    /// Completion bookkeeping shared by every loop: count, and the first failure.
    void on_done(const na::Completion& c) noexcept {
        ++done_;
        if (c.status != Errc::ok && first_error_ == Errc::ok) {
            first_error_ = c.status;
            first_error_op_ = c.type;
        }
    }

    Result<void> check_errors() {
        if (first_error_ == Errc::ok) return ok();
        Errc e = first_error_;
        first_error_ = Errc::ok;
        return Error(e, fmt::format("na {} completed with {}", na::op_type_name(first_error_op_),
                                    errc_name(e)));
    }

    /// Progress until done_ >= target. Busy: progress(0); block: progress(long timeout).
    Result<void> wait_done(uint64_t target, std::string_view what) {
        TimePoint deadline{};
        for (unsigned n = 1;; ++n) {
            if (done_ < target) ctx_->trigger();
            if (done_ >= target) return ok();
            auto r = ctx_->progress(mode_ == Mode::busy ? Duration::zero()
                                                        : Duration(std::chrono::seconds(1)));
            if (!r && r.code() != Errc::timeout)
                return Error(r.code(), fmt::format("na progress while waiting for {}: {}", what,
                                                   r.error().describe()));
            if (mode_ == Mode::block || (n & 1023) == 0) {
                auto now = Clock::now();
                if (deadline == TimePoint{}) deadline = now + kPeerTimeout;
                if (now > deadline)
                    return Error(Errc::timeout,
                                 fmt::format("na: no completion for {} within {} s (server "
                                             "stuck or messages lost)",
                                             what, kPeerTimeout.count() / 1000000000));
            }
        }
    }

    /// One request/reply exchange with the server; returns the reply body.
    Result<std::span<const std::byte>> control(uint32_t kind, std::span<const std::byte> body) {
        if (body.size() > ctl_send_.size())
            return Error(Errc::internal, "control request larger than its buffer");
        na::Tag tag = make_tag(kind, ++seq_);
        ctl_got_ = 0;
        uint64_t target = done_ + 2;
        auto rid = tr_->post_recv_expected(
            *ctx_,
            [this](const na::Completion& c) {
                ctl_got_ = c.size;
                on_done(c);
            },
            ctl_recv_, server_, tag);
        if (!rid) return std::move(rid).error();
        if (!body.empty()) std::memcpy(ctl_send_.data(), body.data(), body.size());
        auto sid = tr_->post_send_unexpected(
            *ctx_, [this](const na::Completion& c) { on_done(c); }, ctl_send_, body.size(), server_,
            0, tag);
        if (!sid) {
            (void)tr_->cancel(*rid);
            (void)wait_done(target - 1, "a canceled receive");
            return std::move(sid).error();
        }
        TALARIA_CHECK(wait_done(target, "a reply from the server"));
        TALARIA_CHECK(check_errors());
        std::size_t got = ctl_got_;
        if (got < kReplyHeader || got > ctl_recv_.size())
            return Error(Errc::protocol_error,
                         fmt::format("malformed reply from the na server ({} bytes)", got));
        uint32_t hdr[2];
        std::memcpy(hdr, ctl_recv_.data(), sizeof hdr);
        if (hdr[0] > uint32_t(Errc::internal) || hdr[1] > got - kReplyHeader)
            return Error(Errc::protocol_error, "malformed reply header from the na server");
        if (hdr[0] != 0)
            return Error(static_cast<Errc>(hdr[0]),
                         fmt::format("the na server refused its {} request", kind_name(kind)));
        return std::span<const std::byte>(ctl_recv_.data() + kReplyHeader, hdr[1]);
    }

    Result<Duration> pingpong(const Spec& s, uint64_t iters) {
        auto t0 = Clock::now();
        for (uint64_t i = 0; i < iters; ++i) {
            na::Tag tag = make_tag(kPing, ++seq_);
            uint64_t target = done_ + 2;
            // Pre-post the reply's receive, then send: the RPC pattern.
            auto rid = tr_->post_recv_expected(
                *ctx_, [this](const na::Completion& c) { on_done(c); }, bufs_[1], server_, tag);
            if (!rid) return std::move(rid).error();
            auto sid = tr_->post_send_unexpected(
                *ctx_, [this](const na::Completion& c) { on_done(c); }, bufs_[0], s.size, server_,
                0, tag);
            if (!sid) {
                (void)tr_->cancel(*rid);
                (void)wait_done(target - 1, "a canceled receive");
                return std::move(sid).error();
            }
            TALARIA_CHECK(wait_done(target, "a ping-pong reply"));
        }
        auto t = Clock::now() - t0;
        TALARIA_CHECK(check_errors());
        return t;
    }

    /// blast, put and get: keep `inflight` operations posted until `iters` have completed.
    Result<Duration> stream(const Spec& s, uint64_t iters) {
        unsigned inflight = std::max(1u, s.inflight);
        if (s.pattern == Pattern::blast) inflight = std::min<unsigned>(inflight, bufs_.size());
        uint64_t base = done_;
        uint64_t posted = 0;
        TimePoint stalled{};
        auto t0 = Clock::now();
        while (done_ - base < iters) {
            while (posted < iters && posted - (done_ - base) < inflight) {
                auto id = post_one(s);
                if (!id) {
                    if (id.code() == Errc::again) break;  // back-pressure: progress first
                    (void)wait_done(base + posted, "operations to drain after an error");
                    return std::move(id).error();
                }
                ++posted;
            }
            if (base + posted == done_) {
                // Refused with `again` while none of ours is in flight: the transport needs
                // progress to free resources. Poll, bounded.
                (void)ctx_->progress(Duration::zero());
                ctx_->trigger();
                auto now = Clock::now();
                if (stalled == TimePoint{}) stalled = now + kPeerTimeout;
                if (now > stalled)
                    return Error(Errc::timeout,
                                 "na: posting kept failing with `again` while "
                                 "nothing was in flight");
                continue;
            }
            stalled = TimePoint{};
            TALARIA_CHECK(wait_done(std::min(base + posted, done_ + 1), "operations in flight"));
            if (first_error_ != Errc::ok) {
                (void)wait_done(base + posted, "operations to drain after an error");
                TALARIA_CHECK(check_errors());
            }
        }
        if (s.pattern == Pattern::blast) {
            std::byte req[8];
            put_u64(req, iters);
            TALARIA_TRY(ack, control(kBlastFin, req));  // all messages arrived
            (void)ack;
        }
        return Clock::now() - t0;
    }

    Result<na::OpId> post_one(const Spec& s) {
        switch (s.pattern) {
            case Pattern::blast: {
                if (free_.empty()) return Errc::again;
                unsigned b = free_.back();
                auto id = tr_->post_send_unexpected(
                    *ctx_,
                    [this, b](const na::Completion& c) {
                        free_.push_back(b);
                        on_done(c);
                    },
                    bufs_[b], s.size, server_, 0, make_tag(kBlast, ++seq_));
                if (id) free_.pop_back();
                return id;
            }
            case Pattern::put:
                return tr_->post_put(
                    *ctx_, [this](const na::Completion& c) { on_done(c); }, local_mem_, 0,
                    remote_mem_, 0, s.size, server_);
            case Pattern::get:
                return tr_->post_get(
                    *ctx_, [this](const na::Completion& c) { on_done(c); }, local_mem_, 0,
                    remote_mem_, 0, s.size, server_);
            default:
                break;
        }
        return Error(Errc::internal, "post_one: bad pattern");
    }

    void drain_outstanding() noexcept {
        // Bounded: give late completions a moment to arrive, then let the context go.
        if (!ctx_) return;
        TimePoint deadline = Clock::now() + std::chrono::milliseconds(200);
        while (Clock::now() < deadline && ctx_->has_completions())
            ctx_->trigger();
    }

    int ctl_fd_;
    std::unique_ptr<na::Transport> tr_;
    std::unique_ptr<na::Context> ctx_;
    na::Addr server_;
    na::MsgBuffer ctl_send_;
    na::MsgBuffer ctl_recv_;
    std::vector<na::MsgBuffer> bufs_;
    std::vector<unsigned> free_;
    Region region_;
    na::MemHandle local_mem_;
    na::MemHandle remote_mem_;
    Mode mode_ = Mode::busy;
    bool prepared_ = false;  ///< prepare() entered the phase; finish() has not run
    bool in_phase_ = false;
    uint32_t seq_ = 0;
    uint64_t done_ = 0;
    std::size_t ctl_got_ = 0;
    Errc first_error_ = Errc::ok;
    na::OpType first_error_op_ = na::OpType::send_unexpected;
};

}  // namespace

Result<std::unique_ptr<LayerServer>> make_na_server(std::string_view transport,
                                                    const LayerOptions& opt) {
    return NaServer::create(transport, opt);
}

Result<std::unique_ptr<Runner>> make_na_client(std::string_view transport,
                                               std::string_view server_address, int ctl_fd,
                                               const LayerOptions& opt) {
    return NaClient::create(transport, server_address, ctl_fd, opt);
}

}  // namespace talaria::perf
