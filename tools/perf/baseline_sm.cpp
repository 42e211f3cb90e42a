// talaria-perf: raw shared-memory baselines (spin/futex ping-pong, SPSC ring, process_vm_*).
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "baseline.hpp"
#include "talaria/util/cpu.hpp"
#include "talaria/util/log.hpp"

namespace talaria::perf {

namespace {

constexpr std::size_t kLine = 128;  // two cache lines: keeps the adjacent-line prefetcher out

constexpr std::size_t round_up(std::size_t v, std::size_t a) noexcept {
    return (v + a - 1) / a * a;
}

/// A counter one side publishes and the other waits on, with a "someone sleeps" flag so that
/// the publisher only pays for FUTEX_WAKE when the waiter is actually blocked.
struct Flag {
    std::atomic<uint32_t> value;
    std::atomic<uint32_t> waiting;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) noexcept {
    // Shared mappings: no FUTEX_PRIVATE_FLAG.
    return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

void publish(Flag& f, uint32_t v, Mode m) noexcept {
    if (m == Mode::busy) {
        f.value.store(v, std::memory_order_release);
        return;
    }
    f.value.store(v, std::memory_order_seq_cst);
    if (f.waiting.load(std::memory_order_seq_cst)) futex(&f.value, FUTEX_WAKE, INT_MAX, nullptr);
}

/// Wait until f.value != old; returns the new value. Busy: spin. Block: spin for `spin`, then
/// FUTEX_WAIT. Bounded by kPeerTimeout.
Result<uint32_t> wait_change(Flag& f, uint32_t old, Mode m, Duration spin) {
    uint32_t v;
    TimePoint deadline{};  // set at the first check: no clock read on the fast path
    auto past = [&] {
        auto now = Clock::now();
        if (deadline == TimePoint{}) deadline = now + kPeerTimeout;
        return now > deadline;
    };
    if (m == Mode::busy) {
        for (uint32_t spins = 0;; ++spins) {
            v = f.value.load(std::memory_order_acquire);
            if (v != old) return v;
            cpu_relax();
            if ((spins & 0xffff) == 0xffff && past()) break;
        }
    } else {
        if (spin > Duration::zero()) {
            TimePoint spin_end{};
            for (uint32_t spins = 0;; ++spins) {
                v = f.value.load(std::memory_order_acquire);
                if (v != old) return v;
                cpu_relax();
                if ((spins & 63) == 63) {
                    auto now = Clock::now();
                    if (spin_end == TimePoint{}) spin_end = now + spin;
                    if (now > spin_end) break;
                }
            }
        }
        for (;;) {
            f.waiting.store(1, std::memory_order_seq_cst);
            v = f.value.load(std::memory_order_seq_cst);
            if (v != old) {
                f.waiting.store(0, std::memory_order_relaxed);
                return v;
            }
            timespec ts{1, 0};
            futex(&f.value, FUTEX_WAIT, old, &ts);
            if (past()) break;
        }
        f.waiting.store(0, std::memory_order_relaxed);
    }
    return Error(Errc::timeout, "raw shared-memory baseline: the peer process stopped responding");
}

/// A POSIX shared-memory object mapped in this process.
class ShmMap {
  public:
    ShmMap() = default;
    ShmMap(const ShmMap&) = delete;
    ShmMap& operator=(const ShmMap&) = delete;
    ~ShmMap() {
        if (base_) ::munmap(base_, len_);
        if (!unlink_name_.empty()) ::shm_unlink(unlink_name_.c_str());
    }

    /// Create a fresh object of `len` bytes (zeroed), named uniquely for this process.
    Result<void> create(std::size_t len) {
        static unsigned counter = 0;
        name_ = fmt::format("/talaria-perf-{}-{}", ::getpid(), ++counter);
        int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) return errno_error(fmt::format("shm_open({})", name_), errno);
        unlink_name_ = name_;
        return map(fd, len, true);
    }
    /// Map an object the peer created; its size must be exactly `len`.
    Result<void> open(const std::string& name, std::size_t len) {
        name_ = name;
        int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
        if (fd < 0) return errno_error(fmt::format("shm_open({})", name), errno);
        return map(fd, len, false);
    }
    /// The peer has it mapped: remove the name so nothing leaks if a process dies.
    void unlink() {
        if (!unlink_name_.empty()) ::shm_unlink(unlink_name_.c_str());
        unlink_name_.clear();
    }
    [[nodiscard]] std::byte* base() const noexcept { return static_cast<std::byte*>(base_); }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

  private:
    Result<void> map(int fd, std::size_t len, bool created) {
        if (created && ::ftruncate(fd, static_cast<off_t>(len)) != 0) {
            int e = errno;
            ::close(fd);
            return errno_error("ftruncate of the shared-memory object", e);
        }
        struct stat st {};
        if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != len) {
            ::close(fd);
            return Error(Errc::protocol_error,
                         fmt::format("shared-memory object {} has {} bytes, expected {}", name_,
                                     st.st_size, len));
        }
        void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        int e = errno;
        ::close(fd);
        if (p == MAP_FAILED) return errno_error("mmap of the shared-memory object", e);
        base_ = p;
        len_ = len;
        return ok();
    }

    void* base_ = nullptr;
    std::size_t len_ = 0;
    std::string name_;
    std::string unlink_name_;
};

// --- ping-pong layout: [Flag c2s | data][Flag s2c | data], each region kLine-aligned -------

struct PingLayout {
    std::size_t region;  // bytes per direction
    explicit PingLayout(std::size_t size) : region(round_up(sizeof(Flag) + size, kLine)) {}
    [[nodiscard]] std::size_t total() const noexcept { return 2 * region; }
    [[nodiscard]] Flag& flag(std::byte* base, int dir) const noexcept {
        return *reinterpret_cast<Flag*>(base + std::size_t(dir) * region);
    }
    [[nodiscard]] std::byte* data(std::byte* base, int dir) const noexcept {
        return base + std::size_t(dir) * region + sizeof(Flag);
    }
};

// --- ring layout: [Flag head][Flag tail][slot 0]...[slot n-1] --------------------------------

struct RingLayout {
    std::size_t stride;
    std::size_t slots;
    RingLayout(std::size_t size, std::size_t n)
        : stride(round_up(std::max<std::size_t>(size, 1), 64)), slots(n) {}
    [[nodiscard]] std::size_t total() const noexcept { return 2 * kLine + stride * slots; }
    [[nodiscard]] Flag& head(std::byte* base) const noexcept {
        return *reinterpret_cast<Flag*>(base);
    }
    [[nodiscard]] Flag& tail(std::byte* base) const noexcept {
        return *reinterpret_cast<Flag*>(base + kLine);
    }
    [[nodiscard]] std::byte* slot(std::byte* base, uint64_t i) const noexcept {
        return base + 2 * kLine + (i % slots) * stride;
    }
};

Result<Mode> mode_of(uint64_t v) {
    if (v > uint64_t(Mode::block))
        return Error(Errc::protocol_error, fmt::format("bad mode {} in a control request", v));
    return static_cast<Mode>(v);
}

Result<void> check_sizes(uint64_t size, uint64_t iters, uint64_t spin_ns) {
    if (size > kMaxBufferBytes || iters > UINT32_MAX / 2 || spin_ns > 1'000'000'000)
        return Error(
            Errc::protocol_error,
            fmt::format("control request out of range (size {}, iterations {})", size, iters));
    return ok();
}

// --- the client half ---------------------------------------------------------------------------

class RawSm final : public Runner {
  public:
    RawSm(int ctl_fd, const BaselineOptions& opt) : fd_(ctl_fd), opt_(opt) {}
    ~RawSm() override { release_local(); }

    [[nodiscard]] std::string describe(const Spec& s) const override {
        switch (s.pattern) {
            case Pattern::pingpong:
                return s.mode == Mode::busy
                           ? "raw shm spin ping-pong"
                           : fmt::format("raw shm ping-pong, spin {} us + futex", block_spin_us());
            case Pattern::blast:
                return s.mode == Mode::busy
                           ? "raw shm spsc ring (spin)"
                           : fmt::format("raw shm spsc ring, spin {} us + futex", block_spin_us());
            case Pattern::put:
                return "raw process_vm_writev";
            case Pattern::get:
                return "raw process_vm_readv";
            default:  // the layers' patterns reach here mapped (baseline.cpp)
                break;
        }
        return "raw sm";
    }

    Result<void> prepare(const Spec& s) override {
        if (s.pattern != Pattern::put && s.pattern != Pattern::get) return ok();
        CtlRequest r;
        r.cmd = uint32_t(Cmd::pvm_setup);
        r.a = s.size;
        TALARIA_TRY(reply, ctl_call(fd_, r));
        remote_pid_ = static_cast<pid_t>(reply.a);
        remote_addr_ = reply.b;
        release_local();
        local_len_ = s.size;
        local_ = ::mmap(nullptr, std::max<std::size_t>(s.size, 1), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (local_ == MAP_FAILED) {
            local_ = nullptr;
            return errno_error("mmap of the local process_vm buffer", errno);
        }
        std::memset(local_, 0x5a, s.size);
        return ok();
    }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        switch (s.pattern) {
            case Pattern::pingpong:
                return pingpong(s, iters);
            case Pattern::blast:
                return ring(s, iters);
            case Pattern::put:
            case Pattern::get:
                return pvm(s, iters);
            default:  // the layers' patterns reach here mapped (baseline.cpp)
                break;
        }
        return Error(Errc::internal, "unknown pattern");
    }

    Result<void> finish(const Spec& s) override {
        if (s.pattern != Pattern::put && s.pattern != Pattern::get) return ok();
        release_local();
        CtlRequest r;
        r.cmd = uint32_t(Cmd::pvm_release);
        TALARIA_TRY(reply, ctl_call(fd_, r));
        (void)reply;
        return ok();
    }

  private:
    [[nodiscard]] long block_spin_us() const noexcept {
        return static_cast<long>(
            std::chrono::duration_cast<std::chrono::microseconds>(opt_.block_spin).count());
    }

    void release_local() noexcept {
        if (local_) ::munmap(local_, std::max<std::size_t>(local_len_, 1));
        local_ = nullptr;
    }

    Result<Duration> pingpong(const Spec& s, uint64_t iters) {
        TALARIA_CHECK(check_sizes(s.size, iters, 0));
        PingLayout L(s.size);
        ShmMap shm;
        TALARIA_CHECK(shm.create(L.total()));
        CtlRequest r;
        r.cmd = uint32_t(Cmd::shm_pingpong);
        r.a = s.size;
        r.b = iters;
        r.c = uint64_t(s.mode);
        r.e = static_cast<uint64_t>(opt_.block_spin.count());
        set_text(r.name, sizeof r.name, shm.name());
        TALARIA_TRY(ready, ctl_call(fd_, r));
        (void)ready;
        shm.unlink();
        std::vector<std::byte> src(std::max<std::size_t>(s.size, 1), std::byte{1});
        std::vector<std::byte> dst(src.size());
        std::byte* b = shm.base();
        Flag& out = L.flag(b, 0);
        Flag& in = L.flag(b, 1);
        auto t0 = Clock::now();
        for (uint32_t i = 1; i <= iters; ++i) {
            std::memcpy(L.data(b, 0), src.data(), s.size);
            publish(out, i, s.mode);
            TALARIA_TRY(v, wait_change(in, i - 1, s.mode, opt_.block_spin));
            (void)v;
            std::memcpy(dst.data(), L.data(b, 1), s.size);
        }
        return Clock::now() - t0;
    }

    Result<Duration> ring(const Spec& s, uint64_t iters) {
        TALARIA_CHECK(check_sizes(s.size, iters, 0));
        RingLayout L(s.size, std::max(1u, s.inflight));
        ShmMap shm;
        TALARIA_CHECK(shm.create(L.total()));
        CtlRequest r;
        r.cmd = uint32_t(Cmd::shm_ring);
        r.a = s.size;
        r.b = iters;
        r.c = uint64_t(s.mode);
        r.d = L.slots;
        r.e = static_cast<uint64_t>(opt_.block_spin.count());
        set_text(r.name, sizeof r.name, shm.name());
        TALARIA_TRY(ready, ctl_call(fd_, r));
        (void)ready;
        shm.unlink();
        std::vector<std::byte> src(std::max<std::size_t>(s.size, 1), std::byte{1});
        std::byte* b = shm.base();
        Flag& head = L.head(b);
        Flag& tail = L.tail(b);
        uint32_t seen_tail = 0;
        auto t0 = Clock::now();
        for (uint32_t i = 0; i < iters; ++i) {
            while (i - seen_tail >= L.slots) {
                TALARIA_TRY(v, wait_change(tail, seen_tail, s.mode, opt_.block_spin));
                seen_tail = v;
            }
            std::memcpy(L.slot(b, i), src.data(), s.size);
            publish(head, i + 1, s.mode);
        }
        while (seen_tail != iters) {
            TALARIA_TRY(v, wait_change(tail, seen_tail, s.mode, opt_.block_spin));
            seen_tail = v;
        }
        return Clock::now() - t0;
    }

    Result<Duration> pvm(const Spec& s, uint64_t iters) {
        if (!local_ || local_len_ != s.size)
            return Error(Errc::internal, "process_vm baseline run without prepare()");
        std::size_t chunk =
            opt_.pvm_iov_bytes ? opt_.pvm_iov_bytes : std::max<std::size_t>(s.size, 1);
        std::vector<iovec> liov, riov;
        auto t0 = Clock::now();
        for (uint64_t it = 0; it < iters; ++it) {
            std::size_t done = 0;
            while (done < s.size) {
                // Up to IOV_MAX chunks per call, same chunks on both sides.
                liov.clear();
                riov.clear();
                std::size_t off = done;
                while (off < s.size && liov.size() < IOV_MAX) {
                    std::size_t n = std::min(chunk, s.size - off);
                    liov.push_back({static_cast<char*>(local_) + off, n});
                    riov.push_back({reinterpret_cast<void*>(remote_addr_ + off), n});
                    off += n;
                }
                ssize_t n = s.pattern == Pattern::get
                                ? ::process_vm_readv(remote_pid_, liov.data(), liov.size(),
                                                     riov.data(), riov.size(), 0)
                                : ::process_vm_writev(remote_pid_, liov.data(), liov.size(),
                                                      riov.data(), riov.size(), 0);
                if (n <= 0) {
                    int e = errno;
                    if (e == EPERM)
                        return Error(Errc::permission_denied,
                                     "process_vm_readv/writev: not permitted (check "
                                     "/proc/sys/kernel/yama/ptrace_scope, or run both processes "
                                     "as the same user)");
                    return errno_error("process_vm_readv/writev", n == 0 ? EIO : e);
                }
                done += static_cast<std::size_t>(n);
            }
        }
        return Clock::now() - t0;
    }

    int fd_;
    BaselineOptions opt_;
    pid_t remote_pid_ = -1;
    uint64_t remote_addr_ = 0;
    void* local_ = nullptr;
    std::size_t local_len_ = 0;
};

}  // namespace

std::unique_ptr<Runner> make_raw_sm(int ctl_fd, const BaselineOptions& opt) {
    return std::make_unique<RawSm>(ctl_fd, opt);
}

// --- the server halves ---------------------------------------------------------------------------

Result<void> serve_shm_pingpong(int fd, const CtlRequest& r) {
    auto body = [&](ShmMap& shm, PingLayout& L, Mode& mode) -> Result<void> {
        TALARIA_CHECK(check_sizes(r.a, r.b, r.e));
        TALARIA_TRY(m, mode_of(r.c));
        mode = m;
        L = PingLayout(r.a);
        return shm.open(fixed_text(r.name, sizeof r.name), L.total());
    };
    ShmMap shm;
    PingLayout L(0);
    Mode mode = Mode::busy;
    if (auto s = body(shm, L, mode); !s) {
        TALARIA_CHECK(ctl_send(fd, ctl_error(s.error())));
        return ok();
    }
    TALARIA_CHECK(ctl_send(fd, CtlReply{}));
    std::size_t size = r.a;
    std::vector<std::byte> buf(std::max<std::size_t>(size, 1));
    std::byte* b = shm.base();
    Flag& in = L.flag(b, 0);
    Flag& out = L.flag(b, 1);
    for (uint32_t i = 1; i <= r.b; ++i) {
        TALARIA_TRY(v, wait_change(in, i - 1, mode, Duration(r.e)));
        if (v != i)
            return Error(Errc::protocol_error,
                         fmt::format("shm ping-pong: sequence {} where {} was expected", v, i));
        std::memcpy(buf.data(), L.data(b, 0), size);
        std::memcpy(L.data(b, 1), buf.data(), size);
        publish(out, i, mode);
    }
    return ok();
}

Result<void> serve_shm_ring(int fd, const CtlRequest& r) {
    ShmMap shm;
    RingLayout L(1, 1);
    Mode mode = Mode::busy;
    auto body = [&]() -> Result<void> {
        TALARIA_CHECK(check_sizes(r.a, r.b, r.e));
        if (r.d == 0 || r.d > 65536)
            return Error(Errc::protocol_error, fmt::format("ring of {} slots requested", r.d));
        TALARIA_TRY(m, mode_of(r.c));
        mode = m;
        L = RingLayout(r.a, r.d);
        if (L.total() > kMaxBufferBytes)
            return Error(Errc::protocol_error, "ring larger than the allowed buffer size");
        return shm.open(fixed_text(r.name, sizeof r.name), L.total());
    };
    if (auto s = body(); !s) {
        TALARIA_CHECK(ctl_send(fd, ctl_error(s.error())));
        return ok();
    }
    TALARIA_CHECK(ctl_send(fd, CtlReply{}));
    std::size_t size = r.a;
    std::vector<std::byte> buf(std::max<std::size_t>(size, 1));
    std::byte* b = shm.base();
    Flag& head = L.head(b);
    Flag& tail = L.tail(b);
    uint32_t seen_head = 0;
    for (uint32_t i = 0; i < r.b; ++i) {
        while (seen_head == i) {
            TALARIA_TRY(v, wait_change(head, seen_head, mode, Duration(r.e)));
            if (v - i > L.slots || v > r.b)
                return Error(Errc::protocol_error, "shm ring: producer index out of range");
            seen_head = v;
        }
        std::memcpy(buf.data(), L.slot(b, i), size);
        publish(tail, i + 1, mode);
    }
    return ok();
}

Result<CtlReply> PvmTarget::setup(const CtlRequest& r) {
    release();
    if (r.a > kMaxBufferBytes)
        return Error(Errc::protocol_error,
                     fmt::format("process_vm target of {} bytes requested (limit {})", r.a,
                                 kMaxBufferBytes));
    std::size_t len = std::max<std::size_t>(r.a, 1);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return errno_error("mmap of the process_vm target buffer", errno);
    std::memset(p, 0xa5, len);
    buf_ = p;
    len_ = len;
    CtlReply reply;
    reply.a = static_cast<uint64_t>(::getpid());
    reply.b = reinterpret_cast<uint64_t>(p);
    return reply;
}

void PvmTarget::release() noexcept {
    if (buf_) ::munmap(buf_, len_);
    buf_ = nullptr;
    len_ = 0;
}

}  // namespace talaria::perf
