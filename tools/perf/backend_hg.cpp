// talaria-perf: the hg back end, measured through Mercury's C API on Talaria as a Mercury
// program calls it (HG_Forward with callbacks, HG_Bulk_transfer, HG_Progress + HG_Trigger on the
// program's thread), against the C++ API (the api back end) in the same run:
//   pingpong : one HG_Forward of "perf.echo" (hg_proc_uint64_t both ways) at a time; its
//              callback reads the output and forwards again: the round trip in us
//   rate     : --rate-inflight handles, each forwarded again by its own callback: calls/s
//   pull/push: HG_Bulk_transfer of --size bytes between a handle over this process's memory and
//              the buffer the server's core engine exposes (perf.ctl bulk_setup, as the bulk
//              and api layers), --rma-inflight in flight, each callback starting the next: GB/s
// The calls reach the server's api engine (a talaria::Engine that defined perf.echo): a
// procedure HG_Register_name registers reaches a talaria::Engine's of the same name. Modes:
// busy opens the class with NA_NO_BLOCK (HG_Progress polls); block lets HG_Progress sleep in
// the transport, as hg_rate and hg_bw_read do.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "mercury.h"
#include "mercury_bulk.h"
#include "mercury_proc.h"
#include "region.hpp"
#include "rpc_session.hpp"

namespace talaria::perf {

namespace {

hg_return_t proc_u64(hg_proc_t proc, void* data) {
    return hg_proc_hg_uint64_t(proc, static_cast<hg_uint64_t*>(data));
}

class HgClient;

/// One handle kept in flight: its callback forwards it again until the run has issued all.
struct Slot {
    HgClient* c = nullptr;
    hg_handle_t h = HG_HANDLE_NULL;
    hg_uint64_t in = 0;
};

class HgClient final : public Runner {
  public:
    static Result<std::unique_ptr<Runner>> create(std::string_view transport,
                                                  std::string_view server_address, int ctl_fd,
                                                  const LayerOptions& opt) {
        auto c = std::unique_ptr<HgClient>(new HgClient());
        TALARIA_TRY(s, RpcSession::create("hg", transport, server_address, ctl_fd, opt));
        c->s_ = std::move(s);
        c->transport_ = transport;
        return std::unique_ptr<Runner>(std::move(c));
    }

    ~HgClient() override { close_class(); }

    [[nodiscard]] std::string describe(const Spec&) const override { return "hg"; }

    Result<void> prepare(const Spec& s) override {
        prepared_ = true;
        auto r = is_bulk(s) ? prepare_bulk(s) : prepare_calls(s);
        if (!r) (void)finish(s);
        return r;
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        return is_bulk(s) ? run_bulk(s, iters) : run_calls(s, iters);
    }

    Result<void> finish(const Spec&) override {
        if (!prepared_) return ok();
        prepared_ = false;
        const bool exposed = remote_ != HG_BULK_NULL;
        drop_bulk();
        return s_->end_measurement(exposed);
    }

    Result<void> suspend(const Spec&) override { return s_->leave_phase(); }
    Result<void> resume(const Spec& s) override {
        if (is_bulk(s)) return s_->enter_phase();  // its mode kept; start() drops the buffer
        TALARIA_CHECK(s_->start_api(s.mode, 1, s_->options().api_stats));
        return ok();
    }

    /// A forward completed (in HG_Trigger): check the echo, forward again while calls remain.
    void forwarded(Slot& sl, const hg_cb_info* info) {
        ++done_;
        hg_uint64_t out = ~sl.in;
        if (info->ret != HG_SUCCESS) {
            note_error(fmt::format("HG_Forward: {}", HG_Error_to_string(info->ret)));
            return;
        }
        if (HG_Get_output(sl.h, &out) != HG_SUCCESS) {
            note_error("HG_Get_output failed");
            return;
        }
        HG_Free_output(sl.h, &out);
        if (out != sl.in) note_error(fmt::format("echo of {} came back as {}", sl.in, out));
        if (issued_ < target_) forward(sl);
    }

    /// A transfer completed (in HG_Trigger): start the next while transfers remain.
    void transferred(const hg_cb_info* info) {
        ++done_;
        if (info->ret != HG_SUCCESS) {
            note_error(fmt::format("HG_Bulk_transfer: {}", HG_Error_to_string(info->ret)));
            return;
        }
        if (issued_ < target_) transfer();
    }

  private:
    HgClient() = default;

    static bool is_bulk(const Spec& s) noexcept {
        return s.pattern == Pattern::pull || s.pattern == Pattern::push;
    }

    void note_error(std::string why) {
        if (error_.empty()) error_ = std::move(why);
    }

    /// An HG class and context for `mode` (busy: NA_NO_BLOCK), kept while the mode stays.
    Result<void> open_class(Mode mode) {
        if (cls_ && mode_ == mode) return ok();
        close_class();
        const std::string info =
            s_->options().url.empty() ? default_engine_url(transport_) : s_->options().url;
        if (s_->options().auth.enabled())
            return Error(Errc::not_supported,
                         "the hg layer opens Mercury's C API, which takes no Talaria secret: run "
                         "it without --auth-secret-file");
        hg_init_info init{};
        init.na_init_info.progress_mode = mode == Mode::busy ? NA_NO_BLOCK : 0;
        cls_ = HG_Init_opt2(info.c_str(), HG_FALSE, HG_VERSION(2, 4), &init);
        if (!cls_)
            return Error(Errc::io_error,
                         fmt::format("HG_Init_opt2(\"{}\") failed (see the log line above)", info));
        ctx_ = HG_Context_create(cls_);
        if (!ctx_) return Error(Errc::io_error, "HG_Context_create failed");
        echo_ = HG_Register_name(cls_, std::string(kRpcEcho).c_str(), proc_u64, proc_u64, nullptr);
        if (echo_ == 0) return Error(Errc::io_error, "HG_Register_name(perf.echo) failed");
        mode_ = mode;
        return ok();
    }

    void close_class() noexcept {
        drop_calls();
        drop_bulk();
        if (ctx_) (void)HG_Context_destroy(ctx_);
        ctx_ = nullptr;
        if (cls_) (void)HG_Finalize(cls_);
        cls_ = nullptr;
    }

    void drop_calls() noexcept {
        for (auto& sl : slots_)
            if (sl.h) HG_Destroy(sl.h);
        slots_.clear();
        if (api_addr_ != HG_ADDR_NULL) HG_Addr_free(cls_, api_addr_);
        api_addr_ = HG_ADDR_NULL;
        api_address_.clear();
    }

    void drop_bulk() noexcept {
        if (local_ != HG_BULK_NULL) HG_Bulk_free(local_);
        if (remote_ != HG_BULK_NULL) HG_Bulk_free(remote_);
        local_ = remote_ = HG_BULK_NULL;
        if (core_addr_ != HG_ADDR_NULL) HG_Addr_free(cls_, core_addr_);
        core_addr_ = HG_ADDR_NULL;
        region_.reset();
    }

    Result<hg_addr_t> lookup(const std::string& address) {
        hg_addr_t a = HG_ADDR_NULL;
        if (hg_return_t r = HG_Addr_lookup2(cls_, address.c_str(), &a); r != HG_SUCCESS)
            return Error(Errc::unreachable, fmt::format("HG_Addr_lookup2(\"{}\"): {}", address,
                                                        HG_Error_to_string(r)));
        return a;
    }

    /// Progress and trigger until `done_` reaches `want`, or after an error (which stops the
    /// issuing) until what was issued has completed: busy polls, block sleeps in HG_Progress
    /// (100 ms at a time, as Mercury's perf tools).
    Result<void> drive(uint64_t want, std::string_view what) {
        const TimePoint give_up = Clock::now() + std::chrono::seconds(60);
        auto finished = [&] { return done_ >= want || (!error_.empty() && done_ >= issued_); };
        while (!finished()) {
            unsigned n = 0;
            (void)HG_Trigger(ctx_, 0, UINT32_MAX, &n);
            if (finished()) break;
            hg_return_t r = HG_Progress(ctx_, mode_ == Mode::busy ? 0 : 100);
            if (r != HG_SUCCESS && r != HG_TIMEOUT)
                return Error(Errc::io_error, fmt::format("HG_Progress: {}", HG_Error_to_string(r)));
            if (Clock::now() > give_up)
                return Error(Errc::timeout, fmt::format("hg: {} did not complete in 60 s", what));
        }
        return ok();
    }

    // --- calls ------------------------------------------------------------------------------

    Result<void> prepare_calls(const Spec& s) {
        TALARIA_TRY(addr, s_->start_api(s.mode, 1, s_->options().api_stats));
        TALARIA_CHECK(open_class(s.mode));
        if (api_address_ != addr) {
            drop_calls();
            TALARIA_TRY(a, lookup(addr));
            api_addr_ = a;
            api_address_ = addr;
        }
        const unsigned inflight = s.pattern == Pattern::pingpong ? 1 : std::max(1u, s.inflight);
        if (slots_.size() != inflight) {
            for (auto& sl : slots_)
                HG_Destroy(sl.h);
            slots_.assign(inflight, Slot{});
            for (auto& sl : slots_) {
                sl.c = this;
                if (HG_Create(ctx_, api_addr_, echo_, &sl.h) != HG_SUCCESS)
                    return Error(Errc::io_error, "HG_Create failed");
            }
        }
        return ok();
    }

    void forward(Slot& sl) {
        sl.in = issued_++;
        hg_return_t r = HG_Forward(
            sl.h,
            [](const hg_cb_info* info) {
                auto* slot = static_cast<Slot*>(info->arg);
                slot->c->forwarded(*slot, info);
                return HG_SUCCESS;
            },
            &sl, &sl.in);
        if (r != HG_SUCCESS) {
            ++done_;  // counted, so that the drain below ends
            note_error(fmt::format("HG_Forward: {}", HG_Error_to_string(r)));
        }
    }

    Result<Duration> run_calls(const Spec&, uint64_t iters) {
        error_.clear();
        issued_ = done_ = 0;
        target_ = iters;
        const TimePoint t0 = Clock::now();
        for (std::size_t i = 0; i < slots_.size() && issued_ < target_; ++i)
            forward(slots_[i]);
        TALARIA_CHECK(drive(iters, "the calls"));
        const Duration d = Clock::now() - t0;
        if (!error_.empty()) return Error(Errc::protocol_error, "hg: " + error_);
        return d;
    }

    // --- transfers ----------------------------------------------------------------------------

    Result<void> prepare_bulk(const Spec& s) {
        TALARIA_CHECK(s_->start(s.mode));
        TALARIA_CHECK(open_class(s.mode));
        drop_bulk();
        TALARIA_CHECK(region_.allocate(s.size, 0x3c));
        void* buf = region_.data();
        hg_size_t len = s.size;
        if (HG_Bulk_create(cls_, 1, &buf, &len, HG_BULK_READWRITE, &local_) != HG_SUCCESS)
            return Error(Errc::io_error, "HG_Bulk_create failed");
        TALARIA_TRY(a, lookup(s_->server_address()));
        core_addr_ = a;
        const uint64_t size = s.size;
        TALARIA_TRY(enc, s_->bulk_setup(size));
        // As HG_Bulk_serialize frames a handle (docs/architecture.md, "The Mercury C API"): the
        // flags, the total size, the segment count, then Talaria's handle encoding.
        std::vector<std::byte> framed(13 + enc.size());
        framed[0] = std::byte{HG_BULK_READWRITE};
        std::memcpy(framed.data() + 1, &size, 8);
        const uint32_t one = 1;
        std::memcpy(framed.data() + 9, &one, 4);
        std::memcpy(framed.data() + 13, enc.data(), enc.size());
        if (hg_return_t r = HG_Bulk_deserialize(cls_, &remote_, framed.data(), framed.size());
            r != HG_SUCCESS)
            return Error(Errc::protocol_error,
                         fmt::format("HG_Bulk_deserialize: {}", HG_Error_to_string(r)));
        op_ = s.pattern == Pattern::pull ? HG_BULK_PULL : HG_BULK_PUSH;
        size_ = s.size;
        return ok();
    }

    void transfer() {
        ++issued_;
        hg_return_t r = HG_Bulk_transfer(
            ctx_,
            [](const hg_cb_info* info) {
                static_cast<HgClient*>(info->arg)->transferred(info);
                return HG_SUCCESS;
            },
            this, op_, core_addr_, remote_, 0, local_, 0, size_, HG_OP_ID_IGNORE);
        if (r != HG_SUCCESS) {
            ++done_;
            note_error(fmt::format("HG_Bulk_transfer: {}", HG_Error_to_string(r)));
        }
    }

    Result<Duration> run_bulk(const Spec& s, uint64_t iters) {
        error_.clear();
        issued_ = done_ = 0;
        target_ = iters;
        const unsigned inflight = std::max(1u, s.inflight);
        const TimePoint t0 = Clock::now();
        for (unsigned i = 0; i < inflight && issued_ < target_; ++i)
            transfer();
        TALARIA_CHECK(drive(iters, "the transfers"));
        const Duration d = Clock::now() - t0;
        if (!error_.empty()) return Error(Errc::io_error, "hg: " + error_);
        return d;
    }

    std::unique_ptr<RpcSession> s_;  ///< control and the server's addresses
    std::string transport_;
    hg_class_t* cls_ = nullptr;
    hg_context_t* ctx_ = nullptr;
    Mode mode_ = Mode::busy;
    hg_id_t echo_ = 0;
    bool prepared_ = false;
    std::string error_;  ///< the first failure of this run
    uint64_t issued_ = 0, done_ = 0, target_ = 0;
    // calls
    hg_addr_t api_addr_ = HG_ADDR_NULL;  ///< the server's api engine
    std::string api_address_;
    std::vector<Slot> slots_;
    // transfers
    Region region_;
    hg_bulk_t local_ = HG_BULK_NULL;
    hg_bulk_t remote_ = HG_BULK_NULL;
    hg_addr_t core_addr_ = HG_ADDR_NULL;  ///< the server's core engine, the buffer's owner
    hg_bulk_op_t op_ = HG_BULK_PULL;
    std::size_t size_ = 0;
};

}  // namespace

Result<std::unique_ptr<Runner>> make_hg_client(std::string_view transport,
                                               std::string_view server_address, int ctl_fd,
                                               const LayerOptions& opt) {
    return HgClient::create(transport, server_address, ctl_fd, opt);
}

}  // namespace talaria::perf
