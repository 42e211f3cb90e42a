// talaria-perf: raw TCP baselines (ping-pong and stream) over the control connection.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "baseline.hpp"

namespace talaria::perf {

namespace {

/// Spin-loop timeout: starts counting at the first check, true once kPeerTimeout has passed.
bool past(TimePoint& deadline) {
    auto now = Clock::now();
    if (deadline == TimePoint{}) deadline = now + kPeerTimeout;
    return now > deadline;
}

/// Busy mode: MSG_DONTWAIT and spin on EAGAIN (bounded by `deadline`); block mode: blocking
/// calls, bounded by the socket's SO_SNDTIMEO/SO_RCVTIMEO.
Result<void> xfer_send(int fd, const std::byte* p, std::size_t len, Mode m) {
    int flags = MSG_NOSIGNAL | (m == Mode::busy ? MSG_DONTWAIT : 0);
    TimePoint deadline{};
    uint32_t spins = 0;
    while (len > 0) {
        ssize_t n = ::send(fd, p, len, flags);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (m == Mode::block)
                    return Error(Errc::timeout, "raw TCP baseline: send timed out");
                if ((++spins & 0xfff) == 0 && past(deadline))
                    return Error(Errc::timeout, "raw TCP baseline: the peer stopped reading");
                continue;
            }
            return errno_error("raw TCP baseline: send", errno);
        }
        p += n;
        len -= static_cast<std::size_t>(n);
    }
    return ok();
}

/// Receive exactly `len` bytes into `p`.
Result<void> xfer_recv(int fd, std::byte* p, std::size_t len, Mode m) {
    int flags = m == Mode::busy ? MSG_DONTWAIT : 0;
    TimePoint deadline{};
    uint32_t spins = 0;
    while (len > 0) {
        ssize_t n = ::recv(fd, p, len, flags);
        if (n == 0) return Error(Errc::disconnected, "raw TCP baseline: the peer closed");
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (m == Mode::block)
                    return Error(Errc::timeout, "raw TCP baseline: receive timed out");
                if ((++spins & 0xfff) == 0 && past(deadline))
                    return Error(Errc::timeout, "raw TCP baseline: the peer went silent");
                continue;
            }
            return errno_error("raw TCP baseline: recv", errno);
        }
        p += n;
        len -= static_cast<std::size_t>(n);
    }
    return ok();
}

/// Receive `total` bytes through a buffer of `buf.size()` bytes.
Result<void> drain(int fd, std::vector<std::byte>& buf, uint64_t total, Mode m) {
    TimePoint deadline{};
    uint32_t spins = 0;
    while (total > 0) {
        std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(total, buf.size()));
        // Take whatever is there (up to n) rather than insisting on n: like a real receiver.
        int flags = m == Mode::busy ? MSG_DONTWAIT : 0;
        ssize_t got = ::recv(fd, buf.data(), n, flags);
        if (got == 0) return Error(Errc::disconnected, "raw TCP stream: the peer closed");
        if (got < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (m == Mode::block)
                    return Error(Errc::timeout, "raw TCP stream: receive timed out");
                if ((++spins & 0xfff) == 0 && past(deadline))
                    return Error(Errc::timeout, "raw TCP stream: the peer went silent");
                continue;
            }
            return errno_error("raw TCP stream: recv", errno);
        }
        total -= static_cast<uint64_t>(got);
    }
    return ok();
}

std::size_t stream_buffer(std::size_t chunk) {
    return std::clamp<std::size_t>(chunk, 64 * 1024, 4 * 1024 * 1024);
}

Result<Mode> mode_of(uint64_t v) {
    if (v > uint64_t(Mode::block))
        return Error(Errc::protocol_error, fmt::format("bad mode {} in a control request", v));
    return static_cast<Mode>(v);
}

class RawTcp final : public Runner {
  public:
    explicit RawTcp(int ctl_fd) : fd_(ctl_fd) {}

    [[nodiscard]] std::string describe(const Spec& s) const override {
        std::string_view how = s.mode == Mode::busy ? "spin" : "blocking";
        switch (s.pattern) {
            case Pattern::pingpong:
                return fmt::format("raw TCP ping-pong ({})", how);
            case Pattern::blast:
                return fmt::format("raw TCP stream, send per msg ({})", how);
            case Pattern::put:
                return fmt::format("raw TCP stream c->s ({})", how);
            case Pattern::get:
                return fmt::format("raw TCP stream s->c ({})", how);
            default:  // the layers' patterns reach here mapped (baseline.cpp)
                break;
        }
        return "raw TCP";
    }

    Result<void> prepare(const Spec&) override { return ok(); }
    Result<void> finish(const Spec&) override { return ok(); }

    Result<Duration> run(const Spec& s, uint64_t iters) override {
        if (s.size > kMaxBufferBytes || s.size == 0)
            return Error(Errc::invalid_argument,
                         fmt::format("raw TCP baseline: size {} out of range", s.size));
        CtlRequest r;
        r.a = s.size;
        r.b = iters;
        r.c = uint64_t(s.mode);
        if (s.pattern == Pattern::pingpong) {
            r.cmd = uint32_t(Cmd::tcp_pingpong);
            TALARIA_TRY(ready, ctl_call(fd_, r));
            (void)ready;
            std::vector<std::byte> out(s.size, std::byte{1}), in(s.size);
            auto t0 = Clock::now();
            for (uint64_t i = 0; i < iters; ++i) {
                TALARIA_CHECK(xfer_send(fd_, out.data(), s.size, s.mode));
                TALARIA_CHECK(xfer_recv(fd_, in.data(), s.size, s.mode));
            }
            return Clock::now() - t0;
        }
        r.cmd = uint32_t(Cmd::tcp_stream);
        r.d = s.pattern == Pattern::get ? 1 : 0;
        TALARIA_TRY(ready, ctl_call(fd_, r));
        (void)ready;
        std::byte one{1};
        if (r.d == 0) {
            std::vector<std::byte> out(s.size, std::byte{1});
            auto t0 = Clock::now();
            for (uint64_t i = 0; i < iters; ++i)
                TALARIA_CHECK(xfer_send(fd_, out.data(), s.size, s.mode));
            TALARIA_CHECK(xfer_recv(fd_, &one, 1, s.mode));  // all received
            return Clock::now() - t0;
        }
        std::vector<std::byte> in(stream_buffer(s.size));
        auto t0 = Clock::now();
        TALARIA_CHECK(xfer_send(fd_, &one, 1, s.mode));  // go
        TALARIA_CHECK(drain(fd_, in, uint64_t(s.size) * iters, s.mode));
        return Clock::now() - t0;
    }

  private:
    int fd_;
};

}  // namespace

std::unique_ptr<Runner> make_raw_tcp(int ctl_fd) {
    return std::make_unique<RawTcp>(ctl_fd);
}

Result<void> serve_tcp_pingpong(int fd, const CtlRequest& r) {
    if (r.a == 0 || r.a > kMaxBufferBytes || r.b > (uint64_t(1) << 40)) {
        TALARIA_CHECK(ctl_send(
            fd, ctl_error(Error(Errc::protocol_error, "tcp ping-pong request out of range"))));
        return ok();
    }
    auto mode = mode_of(r.c);
    if (!mode) {
        TALARIA_CHECK(ctl_send(fd, ctl_error(mode.error())));
        return ok();
    }
    std::vector<std::byte> buf(r.a);
    TALARIA_CHECK(ctl_send(fd, CtlReply{}));
    for (uint64_t i = 0; i < r.b; ++i) {
        TALARIA_CHECK(xfer_recv(fd, buf.data(), buf.size(), *mode));
        TALARIA_CHECK(xfer_send(fd, buf.data(), buf.size(), *mode));
    }
    return ok();
}

Result<void> serve_tcp_stream(int fd, const CtlRequest& r) {
    if (r.a == 0 || r.a > kMaxBufferBytes || r.b > (uint64_t(1) << 40) || r.d > 1 ||
        r.a * r.b > (uint64_t(1) << 50)) {
        TALARIA_CHECK(ctl_send(
            fd, ctl_error(Error(Errc::protocol_error, "tcp stream request out of range"))));
        return ok();
    }
    auto mode = mode_of(r.c);
    if (!mode) {
        TALARIA_CHECK(ctl_send(fd, ctl_error(mode.error())));
        return ok();
    }
    TALARIA_CHECK(ctl_send(fd, CtlReply{}));
    std::byte one{1};
    if (r.d == 0) {
        std::vector<std::byte> buf(stream_buffer(r.a));
        TALARIA_CHECK(drain(fd, buf, r.a * r.b, *mode));
        return xfer_send(fd, &one, 1, *mode);
    }
    std::vector<std::byte> buf(r.a, std::byte{2});
    TALARIA_CHECK(xfer_recv(fd, &one, 1, *mode));
    for (uint64_t i = 0; i < r.b; ++i)
        TALARIA_CHECK(xfer_send(fd, buf.data(), buf.size(), *mode));
    return ok();
}

}  // namespace talaria::perf
