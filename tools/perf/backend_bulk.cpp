// talaria-perf: the bulk back end. The client obtains the server's bulk handle once per
// measurement (a perf.ctl bulk_setup call: the server registers `size` bytes read-write and
// responds with the handle's encoding), then moves the bytes with bulk::Context::transfer directly:
//   pull : remote -> local (na get underneath), GB/s
//   push : local -> remote (na put), GB/s
// `inflight` transfers (--rma-inflight, default 1) are kept in flight. No RPC per transfer:
// this measures the bulk layer (handles, segment mapping, completion), as the na put/get
// patterns measure the transport.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "region.hpp"
#include "rpc_session.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/proc/archive.hpp"

namespace talaria::perf {

namespace {

// =================================================================================================
// Server half: the exposed buffer

class BulkExposureImpl final : public BulkExposure {
  public:
    ~BulkExposureImpl() override { release(); }

    Result<std::vector<std::byte>> expose(na::Transport& transport, uint64_t size) override {
        release();
        TALARIA_CHECK(region_.allocate(size, 0xa5));
        bulk::Segment seg{region_.data(), size};
        auto h = bulk::Handle::create(transport, std::span(&seg, 1), bulk::Access::read_write);
        if (!h) {
            region_.reset();
            return std::move(h).error();
        }
        handle_ = std::move(*h);
        std::vector<std::byte> out;
        if (auto e = handle_.encode(out); !e) {
            release();
            return std::move(e).error();
        }
        return out;
    }

    void release() noexcept override {
        handle_ = bulk::Handle();  // deregisters (the last copy) before the memory goes
        region_.reset();
    }

  private:
    Region region_;
    bulk::Handle handle_;
};

// =================================================================================================
// Client half

class BulkClient final : public Runner {
  public:
    static Result<std::unique_ptr<Runner>> create(std::string_view transport,
                                                  std::string_view server_address, int ctl_fd,
                                                  const LayerOptions& opt) {
        auto c = std::unique_ptr<BulkClient>(new BulkClient());
        TALARIA_TRY(s, RpcSession::create("bulk", transport, server_address, ctl_fd, opt));
        c->s_ = std::move(s);
        return std::unique_ptr<Runner>(std::move(c));
    }

    ~BulkClient() override {
        // Transfers and handles before the session's engine (and transport) go away.
        bulk_.reset();
        remote_ = bulk::Handle();
        local_ = bulk::Handle();
        region_.reset();
    }

    [[nodiscard]] std::string describe(const Spec&) const override { return "bulk"; }

    Result<void> prepare(const Spec& s) override {
        if (s.pattern != Pattern::pull && s.pattern != Pattern::push)
            return Error(Errc::invalid_argument,
                         fmt::format("the bulk layer measures pull and push, not {}",
                                     pattern_name(s.pattern)));
        prepared_ = true;
        auto r = prepare_impl(s);
        if (!r) (void)finish(s);
        return r;
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        s_->mode = s.mode;
        auto dir = s.pattern == Pattern::pull ? bulk::Direction::pull : bulk::Direction::push;
        unsigned inflight = std::max(1u, s.inflight);
        na::Context& nctx = s_->context().na_context();
        // The transfers of the session's context (a new one if the session changed contexts).
        if (!bulk_ || &bulk_->na_context() != &nctx) bulk_ = std::make_unique<bulk::Context>(nctx);
        uint64_t base = done_;
        uint64_t posted = 0;
        auto t0 = Clock::now();
        while (done_ - base < iters) {
            while (posted < iters && posted - (done_ - base) < inflight) {
                auto id = bulk_->transfer(dir, s_->server(), remote_, 0, local_, 0, s.size,
                                          [this](Result<void>&& r) {
                                              ++done_;
                                              if (!r && !first_error_)
                                                  first_error_ = std::move(r).error();
                                          });
                if (!id) {
                    (void)s_->wait(s_->context(), &done_, base + posted,
                                   "transfers to drain after an error");
                    return Error(id.code(),
                                 fmt::format("bulk transfer: {}", id.error().describe()));
                }
                ++posted;
            }
            TALARIA_CHECK(s_->wait(s_->context(), &done_, done_ + 1, "a transfer"));
            if (first_error_) {
                (void)s_->wait(s_->context(), &done_, base + posted,
                               "transfers to drain after an error");
                Error e = std::move(*first_error_);
                first_error_.reset();
                return Error(e.code(), fmt::format("bulk transfer failed: {}", e.describe()));
            }
        }
        return Clock::now() - t0;
    }

    Result<void> finish(const Spec&) override {
        if (!prepared_) return ok();
        prepared_ = false;
        const bool exposed = remote_.valid();
        remote_ = bulk::Handle();
        local_ = bulk::Handle();
        region_.reset();
        return s_->end_measurement(exposed);
    }

    Result<void> suspend(const Spec&) override { return s_->leave_phase(); }
    Result<void> resume(const Spec&) override { return s_->enter_phase(); }

  private:
    BulkClient() = default;

    Result<void> prepare_impl(const Spec& s) {
        TALARIA_CHECK(s_->start(s.mode));
        TALARIA_CHECK(region_.allocate(s.size, 0x3c));
        bulk::Segment seg{region_.data(), s.size};
        TALARIA_TRY(h, bulk::Handle::create(s_->engine().transport(), std::span(&seg, 1),
                                            bulk::Access::read_write));
        local_ = std::move(h);
        TALARIA_TRY(enc, s_->bulk_setup(s.size));
        TALARIA_TRY(
            rh, RpcSession::decode_exposed(enc, s_->engine().transport(), s_->server(), s.size));
        remote_ = std::move(rh);
        return ok();
    }

    std::unique_ptr<RpcSession> s_;
    Region region_;
    std::unique_ptr<bulk::Context> bulk_;
    bulk::Handle local_;
    bulk::Handle remote_;
    bool prepared_ = false;
    uint64_t done_ = 0;
    std::optional<Error> first_error_;
};

}  // namespace

std::unique_ptr<BulkExposure> make_bulk_exposure() {
    return std::make_unique<BulkExposureImpl>();
}

Result<std::unique_ptr<Runner>> make_bulk_client(std::string_view transport,
                                                 std::string_view server_address, int ctl_fd,
                                                 const LayerOptions& opt) {
    return BulkClient::create(transport, server_address, ctl_fd, opt);
}

}  // namespace talaria::perf
