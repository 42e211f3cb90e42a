// talaria-perf: the raw libfabric RMA bandwidth baseline (see raw_ofi_rma.hpp). Plain
// libfabric, opened the way the ofi transport opens it (FI_EP_RDM, the same provider string
// and mr_mode bits), so that what it measures is what the provider gives without Talaria.
#include "raw_ofi_rma.hpp"

#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "control.hpp"
#include "ext_parse.hpp"

namespace talaria::perf {

namespace {

/// Keys we ask for where the provider does not choose them (FI_MR_PROV_KEY unset).
constexpr uint64_t kServerKey = 0x7a1a, kClientKey = 0x7a1b;

class Fabric {
  public:
    explicit Fabric(const RawOfiRmaOptions& o) : o_(o) {}
    Fabric(const Fabric&) = delete;
    Fabric& operator=(const Fabric&) = delete;
    ~Fabric() {
        auto close = [&](fid_t f, const char* what) {
            if (!f) return;
            if (int rc = fi_close(f); rc != 0)
                std::fprintf(stderr, "raw-ofi-rma: fi_close(%s) on %s: %s\n", what,
                             o_.provider.c_str(), fi_strerror(-rc));
        };
        close(mr_ ? &mr_->fid : nullptr, "mr");
        close(ep_ ? &ep_->fid : nullptr, "ep");
        close(av_ ? &av_->fid : nullptr, "av");
        close(cq_ ? &cq_->fid : nullptr, "cq");
        close(domain_ ? &domain_->fid : nullptr, "domain");
        close(fabric_ ? &fabric_->fid : nullptr, "fabric");
        if (info_) fi_freeinfo(info_);
        std::free(buf_);
    }

    Result<void> open() {
        fi_info* hints = fi_allocinfo();
        if (!hints) return Error(Errc::no_memory, "fi_allocinfo failed");
        hints->ep_attr->type = FI_EP_RDM;
        // As src/na/ofi/ofi_setup.cpp: the same capabilities, no mode bits, every MR mode
        // bit the transport honours, FI_THREAD_DOMAIN, API 1.17, FI_SOURCE on an IP node.
        hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
                      FI_SEND | FI_RECV;
        hints->mode = 0;
        hints->domain_attr->mr_mode =
            FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
        hints->domain_attr->threading = FI_THREAD_DOMAIN;
        hints->fabric_attr->prov_name = ::strdup(o_.provider.c_str());
        const char* node = o_.node.empty() ? nullptr : o_.node.c_str();
        if (node) hints->addr_format = FI_SOCKADDR_IN;
        int rc = fi_getinfo(FI_VERSION(1, 17), node, node ? "0" : nullptr, node ? FI_SOURCE : 0,
                            hints, &info_);
        fi_freeinfo(hints);
        if (rc != 0) return fail("fi_getinfo", rc);
        if (!info_) return Error(Errc::not_supported, "fi_getinfo returned nothing");
        if ((rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr)) != 0)
            return fail("fi_fabric", rc);
        if ((rc = fi_domain(fabric_, info_, &domain_, nullptr)) != 0) return fail("fi_domain", rc);
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        if ((rc = fi_av_open(domain_, &av_attr, &av_, nullptr)) != 0) return fail("fi_av_open", rc);
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_CONTEXT;
        cq_attr.wait_obj = FI_WAIT_NONE;
        cq_attr.size = 1024;
        if ((rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) != 0) return fail("fi_cq_open", rc);
        if ((rc = fi_endpoint(domain_, info_, &ep_, nullptr)) != 0) return fail("fi_endpoint", rc);
        if ((rc = fi_ep_bind(ep_, &av_->fid, 0)) != 0) return fail("fi_ep_bind(av)", rc);
        if ((rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0)
            return fail("fi_ep_bind(cq)", rc);
        if ((rc = fi_enable(ep_)) != 0) return fail("fi_enable", rc);
        return ok();
    }

    /// Allocate, touch and register the buffer (outside any timed region).
    Result<void> register_buffer(uint64_t requested_key) {
        std::size_t len = (o_.size + 4095) / 4096 * 4096;
        buf_ = std::aligned_alloc(4096, len);
        if (!buf_) return Error(Errc::no_memory, fmt::format("allocating {} bytes", len));
        std::memset(buf_, 0x5a, len);
        uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
        int rc = fi_mr_reg(domain_, buf_, o_.size, access, 0, requested_key, 0, &mr_, nullptr);
        if (rc != 0) return fail("fi_mr_reg", rc);
        if (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) {
            if ((rc = fi_mr_bind(mr_, &ep_->fid, 0)) != 0) return fail("fi_mr_bind", rc);
            if ((rc = fi_mr_enable(mr_)) != 0) return fail("fi_mr_enable", rc);
        }
        return ok();
    }

    Result<RmaHello> hello() {
        RmaHello h;
        std::size_t len = kRmaNameMax;
        if (int rc = fi_getname(&ep_->fid, h.name.data(), &len); rc != 0)
            return fail("fi_getname", rc);
        h.name_len = static_cast<uint32_t>(len);
        h.addr = virt_addr() ? reinterpret_cast<uint64_t>(buf_) : 0;
        h.key = fi_mr_key(mr_);
        h.size = o_.size;
        return h;
    }

    Result<fi_addr_t> insert(const RmaHello& peer) {
        fi_addr_t a = FI_ADDR_UNSPEC;
        int rc = fi_av_insert(av_, peer.name.data(), 1, &a, 0, nullptr);
        if (rc != 1) return fail("fi_av_insert", rc < 0 ? rc : -FI_EINVAL);
        return a;
    }

    /// Read completions; returns how many, or the error of a failed one.
    Result<std::size_t> poll_cq(fi_cq_entry* out, std::size_t max) {
        ssize_t n = fi_cq_read(cq_, out, max);
        if (n > 0) return static_cast<std::size_t>(n);
        if (n == -FI_EAGAIN) return std::size_t(0);
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry e{};
            fi_cq_readerr(cq_, &e, 0);
            return Error(Errc::io_error,
                         fmt::format("a transfer failed on provider {}: {} ({})", o_.provider,
                                     fi_strerror(e.err),
                                     fi_cq_strerror(cq_, e.prov_errno, e.err_data, nullptr, 0)));
        }
        return fail("fi_cq_read", static_cast<int>(n));
    }

    [[nodiscard]] bool virt_addr() const noexcept {
        return (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    }
    [[nodiscard]] std::size_t max_msg() const noexcept {
        std::size_t m = info_->ep_attr->max_msg_size;
        return m == 0 ? o_.size : m;
    }
    [[nodiscard]] fid_ep* ep() const noexcept { return ep_; }
    [[nodiscard]] void* buf() const noexcept { return buf_; }
    [[nodiscard]] void* desc() const noexcept { return fi_mr_desc(mr_); }

  private:
    Error fail(const char* call, int rc) const {
        return Error(Errc::io_error, fmt::format("{} failed on provider {}: {} ({})", call,
                                                 o_.provider, fi_strerror(-rc), rc));
    }
    const RawOfiRmaOptions& o_;
    fi_info* info_ = nullptr;
    fid_fabric* fabric_ = nullptr;
    fid_domain* domain_ = nullptr;
    fid_av* av_ = nullptr;
    fid_cq* cq_ = nullptr;
    fid_ep* ep_ = nullptr;
    fid_mr* mr_ = nullptr;
    void* buf_ = nullptr;
};

Result<void> send_hello(int fd, const RmaHello& h) {
    auto b = encode_rma_hello(h);
    return send_all(fd, b.data(), b.size());
}

Result<RmaHello> recv_hello(int fd) {
    std::array<std::byte, kRmaHelloSize> b{};
    TALARIA_CHECK(recv_all(fd, b.data(), b.size()));
    return decode_rma_hello(b);
}

/// Whether `fd` has something to read (or hung up), without waiting.
bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
}

Result<void> serve(const RawOfiRmaOptions& o) {
    Fabric f(o);
    TALARIA_CHECK(f.open());
    TALARIA_CHECK(f.register_buffer(kServerKey));
    TALARIA_TRY(lfd, tcp_listen(HostPort{"127.0.0.1", o.port}));
    TALARIA_TRY(fd, tcp_accept(lfd.get(), std::chrono::seconds(o.timeout_s)));
    TALARIA_CHECK(tune_socket(fd.get(), std::chrono::seconds(o.timeout_s)));
    TALARIA_TRY(peer, recv_hello(fd.get()));
    TALARIA_TRY(mine, f.hello());
    TALARIA_TRY(pa, f.insert(peer));
    (void)pa;
    TALARIA_CHECK(send_hello(fd.get(), mine));
    // Serve: progress the endpoint (software providers move RMA data from the target's
    // progress) until the client says it is done or hangs up.
    TimePoint deadline = deadline_after(std::chrono::seconds(o.timeout_s));
    fi_cq_entry ent[16];
    for (uint64_t n = 0;; ++n) {
        TALARIA_CHECK(f.poll_cq(ent, 16));
        if ((n & 255) != 0) continue;
        if (readable(fd.get())) {
            char c = 0;
            auto r = recv_all(fd.get(), &c, 1);
            if (!r || c != 'D') return ok();  // hung up: nothing more to serve
            return send_all(fd.get(), "A", 1);
        }
        if (Clock::now() >= deadline)
            return Error(Errc::timeout, "raw-ofi-rma server: the client did not finish in time");
    }
}

Result<void> client(const RawOfiRmaOptions& o) {
    Fabric f(o);
    TALARIA_CHECK(f.open());
    TALARIA_CHECK(f.register_buffer(kClientKey));
    TALARIA_TRY(fd, tcp_connect(HostPort{o.host, o.port}, std::chrono::seconds(10)));
    TALARIA_CHECK(tune_socket(fd.get(), std::chrono::seconds(o.timeout_s)));
    TALARIA_TRY(mine, f.hello());
    TALARIA_CHECK(send_hello(fd.get(), mine));
    TALARIA_TRY(peer, recv_hello(fd.get()));
    if (peer.size < o.size)
        return Error(Errc::protocol_error,
                     fmt::format("the server registered {} bytes, not {}", peer.size, o.size));
    TALARIA_TRY(dest, f.insert(peer));

    // One context per chunk in flight: the completion names it.
    const std::size_t chunk = std::max<std::size_t>(1, std::min(f.max_msg(), o.size));
    const std::size_t chunks = (o.size + chunk - 1) / chunk;
    const unsigned slots = std::max(1u, o.inflight);
    struct ChunkCtx {
        unsigned slot;
    };
    std::vector<ChunkCtx> ctxs(std::size_t(slots) * chunks);
    std::vector<std::size_t> remaining(slots, 0);
    TimePoint deadline = deadline_after(std::chrono::seconds(o.timeout_s));
    fi_cq_entry ent[16];
    uint64_t done = 0;
    auto reap = [&]() -> Result<void> {
        TALARIA_TRY(n, f.poll_cq(ent, 16));
        for (std::size_t i = 0; i < n; ++i) {
            auto* c = static_cast<ChunkCtx*>(ent[i].op_context);
            if (c < ctxs.data() || c >= ctxs.data() + ctxs.size())
                return Error(Errc::internal, "a completion with an unknown context");
            if (--remaining[c->slot] == 0) ++done;
        }
        if (n == 0 && Clock::now() >= deadline)
            return Error(Errc::timeout, "raw-ofi-rma client: transfers did not complete in time");
        return ok();
    };
    auto post = [&](unsigned slot) -> Result<void> {
        remaining[slot] = chunks;
        for (std::size_t k = 0; k < chunks; ++k) {
            std::size_t off = k * chunk, len = std::min(chunk, o.size - off);
            ChunkCtx& c = ctxs[std::size_t(slot) * chunks + k];
            c.slot = slot;
            char* local = static_cast<char*>(f.buf()) + off;
            for (;;) {
                ssize_t rc = o.write ? fi_write(f.ep(), local, len, f.desc(), dest, peer.addr + off,
                                                peer.key, &c)
                                     : fi_read(f.ep(), local, len, f.desc(), dest, peer.addr + off,
                                               peer.key, &c);
                if (rc == 0) break;
                if (rc != -FI_EAGAIN)
                    return Error(Errc::io_error,
                                 fmt::format("{} failed on provider {}: {} ({})",
                                             o.write ? "fi_write" : "fi_read", o.provider,
                                             fi_strerror(static_cast<int>(-rc)), rc));
                TALARIA_CHECK(reap());
            }
        }
        return ok();
    };
    // `n` transfers, `slots` in flight; a slot is reused once all its chunks completed.
    auto run = [&](uint64_t n) -> Result<void> {
        done = 0;
        uint64_t posted = 0;
        std::fill(remaining.begin(), remaining.end(), 0);
        for (unsigned s = 0; s < slots && posted < n; ++s, ++posted)
            TALARIA_CHECK(post(s));
        while (done < n) {
            uint64_t before = done;
            TALARIA_CHECK(reap());
            if (done == before) continue;
            for (unsigned s = 0; s < slots && posted < n; ++s)
                if (remaining[s] == 0) {
                    TALARIA_CHECK(post(s));
                    ++posted;
                }
        }
        return ok();
    };
    if (o.warmup) TALARIA_CHECK(run(o.warmup));
    auto t0 = Clock::now();
    TALARIA_CHECK(run(o.iters));
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    std::printf("talaria-raw-ofi-rma op=%s size=%zu iters=%llu inflight=%u ns=%lld\n",
                o.write ? "write" : "read", o.size, static_cast<unsigned long long>(o.iters), slots,
                static_cast<long long>(ns));
    std::fflush(stdout);
    // Tell the server we are done and wait for its answer, so that it serves until our last
    // transfer completed and neither side tears down under the other.
    TALARIA_CHECK(send_all(fd.get(), "D", 1));
    char a = 0;
    TALARIA_CHECK(recv_all(fd.get(), &a, 1));
    return ok();
}

}  // namespace

int run_raw_ofi_rma(const RawOfiRmaOptions& o) {
    if (o.size == 0 || o.size > (std::size_t(1) << 30) || o.iters == 0 || o.port == 0) {
        std::fprintf(stderr, "raw-ofi-rma: --size (1 B..1 GiB), --iters and --port are needed\n");
        return 2;
    }
    auto r = o.server ? serve(o) : client(o);
    if (!r) {
        std::fprintf(stderr, "raw-ofi-rma %s: %s\n", o.server ? "server" : "client",
                     r.error().describe().c_str());
        return 1;
    }
    return 0;
}

}  // namespace talaria::perf
