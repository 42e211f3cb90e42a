// The engine's statistics for the outside world while it runs: a JSON file rewritten every
// period and once more when the engine closes (Engine::write_stats_every), and Prometheus'
// text on a small HTTP endpoint (Engine::serve_prometheus). Each is one thread of the engine,
// stopped and joined when it closes.
#include "api/introspection.hpp"
#include "na/base/url.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "talaria/util/log.hpp"

namespace talaria::detail {

namespace {

Result<void> write_file(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f)
        return Error(Errc::io_error, fmt::format("statistics file {}: cannot create {}: {}", path,
                                                 tmp, std::strerror(errno)));
    const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = std::fclose(f) == 0;
    if (!wrote || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        std::remove(tmp.c_str());
        return Error(Errc::io_error, fmt::format("statistics file {}: cannot write it: {}", path,
                                                 std::strerror(e)));
    }
    return ok();
}

/// "HOST:PORT" or "[V6]:PORT" as a socket address (na::parse_host_port, which resolves names
/// too): the port must be written, 0 for any.
Result<na::SockAddr> listen_address(std::string_view a) {
    const auto colon = a.rfind(':');
    const auto bracket = a.rfind(']');  // "[::1]" has colons but no port
    if (colon == std::string_view::npos || colon + 1 == a.size() ||
        (bracket != std::string_view::npos && bracket > colon))
        return Error(Errc::address_invalid,
                     fmt::format("'{}': expected HOST:PORT (127.0.0.1:9464, [::]:9464)", a));
    return na::parse_host_port(a, false);
}

/// Wait until `fd` is ready for `events`, `wake` fires, or `deadline` passes: true if ready.
bool wait_ready(int fd, short events, int wake, std::chrono::steady_clock::time_point deadline) {
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        pollfd p[2] = {{fd, events, 0}, {wake, POLLIN, 0}};
        const int n = ::poll(p, 2, int(left.count()));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || p[1].revents) return false;
        return true;
    }
}

/// Answer one HTTP request on the non-blocking `fd`, within kConnectionTime altogether (a
/// client that sends slowly or does not read is dropped, and the engine's close never waits
/// on it: `wake` ends the wait).
constexpr auto kConnectionTime = std::chrono::seconds(3);
void answer(int fd, int wake, const core::Engine& core, const na::Context* extra) {
    const auto deadline = std::chrono::steady_clock::now() + kConnectionTime;
    std::string req;
    char buf[2048];
    while (req.size() < 16384 && req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
            req.append(buf, std::size_t(n));
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) break;
        if (!wait_ready(fd, POLLIN, wake, deadline)) return;
    }
    std::string status = "200 OK", body;
    const std::string line = req.substr(0, req.find("\r\n"));
    if (line.rfind("GET ", 0) != 0) {
        status = "405 Method Not Allowed";
        body = "only GET /metrics is served here\n";
    } else {
        const auto sp = line.find(' ', 4);
        const std::string path = line.substr(4, sp == std::string::npos ? sp : sp - 4);
        if (path == "/metrics" || path == "/" || path.rfind("/metrics?", 0) == 0) {
            body = stats_prometheus_of(core, extra);
        } else {
            status = "404 Not Found";
            body = "the statistics are at /metrics\n";
        }
    }
    const std::string out =
        fmt::format(
            "HTTP/1.1 {}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            status, body.size()) +
        body;
    std::size_t sent = 0;
    while (sent < out.size()) {
        const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += std::size_t(n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR) && wait_ready(fd, POLLOUT, wake, deadline))
            continue;
        return;
    }
}

}  // namespace

StatsExporter::StatsExporter(const core::Engine& core, const na::Context* extra)
    : core_(core), extra_(extra) {}

StatsExporter::~StatsExporter() {
    stop();
}

Result<void> StatsExporter::write_every(Duration period, std::string path) {
    if (closed_) return Error(Errc::shutdown, "write_stats_every: the engine is closing");
    if (period <= Duration::zero())
        return Error(Errc::invalid_argument, "write_stats_every: the period must be positive");
    if (path.empty()) return Error(Errc::invalid_argument, "write_stats_every: no file named");
    // Written once now: a path that cannot be written is said here, not in a thread later.
    TALARIA_CHECK(write_file(path, stats_json_of(core_, 2, extra_)));
    stop_writer();
    {
        std::lock_guard g(mu_);
        period_ = period;
        path_ = std::move(path);
        writer_stop_ = false;
    }
    writer_ = std::thread([this] {
        std::unique_lock lk(mu_);
        while (!writer_stop_) {
            if (cv_.wait_for(lk, period_, [this] { return writer_stop_; })) break;
            const std::string to = path_;
            lk.unlock();
            try {
                if (auto r = write_file(to, stats_json_of(core_, 2, extra_)); !r)
                    TALARIA_LOG(api, warn, "{}", r.error().describe());
            } catch (const std::exception& e) {
                TALARIA_LOG(api, warn, "write_stats_every: {}", e.what());
            }
            lk.lock();
        }
    });
    return ok();
}

void StatsExporter::stop_writer() noexcept {
    if (!writer_.joinable()) return;
    {
        std::lock_guard g(mu_);
        writer_stop_ = true;
    }
    cv_.notify_all();
    writer_.join();
}

Result<std::string> StatsExporter::serve_http(std::string_view address) {
    if (closed_) return Error(Errc::shutdown, "serve_prometheus: the engine is closing");
    if (http_.joinable())
        return Error(Errc::already_exists,
                     fmt::format("serve_prometheus: already serving at {}", http_address_));
    TALARIA_TRY(sa, listen_address(address));
    const int fd = ::socket(sa.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return Error(Errc::io_error, fmt::format("socket: {}", std::strerror(errno)));
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, sa.sa(), sa.len) != 0 || ::listen(fd, 16) != 0) {
        const int e = errno;
        ::close(fd);
        return Error(e == EADDRINUSE ? Errc::address_in_use : Errc::io_error,
                     fmt::format("serve_prometheus at {}: {}", address, std::strerror(e)));
    }
    na::SockAddr bound;
    bound.len = sizeof bound.storage;
    ::getsockname(fd, bound.sa(), &bound.len);
    const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake < 0) {
        ::close(fd);
        return Error(Errc::io_error, fmt::format("eventfd: {}", std::strerror(errno)));
    }
    listen_fd_ = fd;
    wake_fd_ = wake;
    http_address_ = bound.to_string();
    http_ = std::thread([this] {
        for (;;) {
            pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
            if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
            if (p[1].revents) break;
            if (!(p[0].revents & POLLIN)) continue;
            const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (c < 0) {
                // Out of descriptors (EMFILE): wait a little instead of spinning on the backlog.
                if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
                    pollfd w{wake_fd_, POLLIN, 0};
                    if (::poll(&w, 1, 100) > 0) break;
                }
                continue;
            }
            try {
                answer(c, wake_fd_, core_, extra_);
            } catch (const std::exception& e) {
                TALARIA_LOG(api, warn, "serve_prometheus: {}", e.what());
            }
            ::close(c);
        }
    });
    TALARIA_LOG(api, info, "serving Prometheus text at http://{}/metrics", http_address_);
    return http_address_;
}

void StatsExporter::stop() noexcept {
    closed_ = true;  // under the engine's life_mu, as write_every and serve_http are
    if (http_.joinable()) {
        const uint64_t one = 1;
        (void)!::write(wake_fd_, &one, sizeof one);
        http_.join();
        ::close(listen_fd_);
        ::close(wake_fd_);
        listen_fd_ = wake_fd_ = -1;
    }
    if (writer_.joinable()) {
        stop_writer();
        // The last word, as Margo writes its JSON at finalize.
        try {
            if (auto r = write_file(path_, stats_json_of(core_, 2, extra_)); !r)
                TALARIA_LOG(api, warn, "{}", r.error().describe());
        } catch (const std::exception& e) {
            TALARIA_LOG(api, warn, "write_stats_every: {}", e.what());
        }
    }
}

}  // namespace talaria::detail
