// talaria-perf overload: a server under a flood, measured where its users stand (the public
// API), issue 10 "Overload".
//
//   talaria-perf overload --transport tcp --flooders 64 [--flood-inflight 16] [--hold-us 200]
//
// A server process (forked before any engine or thread exists here) runs a talaria::Engine with
// one procedure, perf.work(uint64_t) -> uint64_t, and the admission limits given
// (--max-requests, --max-per-peer). With --hold-us H > 0 every request is kept H microseconds
// before it is answered (a handler waiting on storage, as an API coroutine would; answered by a
// server thread), so the requests the server holds grow with the load; with 0 it is answered in
// the handler.
//
// This process measures a well-behaved client (its own Engine, one call at a time) for
// --seconds, first alone, then while --flooders threads of a second Engine (one peer of the
// server) each keep --flood-inflight calls in flight as fast as they can, taking every answer,
// busy included, and calling again at once. It prints the good client's median and p99 both
// times and their ratio, the flood's calls, answers, busy refusals and anything else (nothing
// may be lost: every call ends answered or busy), and the server's resident memory before and
// after.
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "app.hpp"
#include "talaria/talaria.hpp"

namespace talaria::perf {

namespace {

using namespace std::chrono_literals;

long rss_kib(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}

/// The server process: serve until `ctl` (a pipe from the parent) closes. Writes its address,
/// then one line of counters at the end, to `out`.
[[noreturn]] void serve(const OverloadOptions& o, int ctl, int out) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int rc = 0;
    try {
        EngineOptions eo;
        eo.core.max_requests = o.max_requests;
        eo.core.max_requests_per_peer = o.max_per_peer;
        Engine server{listen_url(o.transport), listen, eo};
        struct Held {
            Request req;
            uint64_t x;
            TimePoint due;
        };
        std::mutex mu;
        std::deque<Held> held;
        std::atomic<bool> stop{false};
        const auto hold = std::chrono::microseconds(o.hold_us);
        if (o.hold_us == 0) {
            server.define("perf.work", [](uint64_t x) { return x; });
        } else {
            server.define("perf.work", [&](Request req, uint64_t x) {
                std::lock_guard g(mu);
                held.push_back(Held{std::move(req), x, Clock::now() + hold});
            });
        }
        std::thread answerer([&] {
            std::vector<Held> due;
            while (!stop.load()) {
                {
                    std::lock_guard g(mu);
                    auto now = Clock::now();
                    while (!held.empty() && held.front().due <= now) {
                        due.push_back(std::move(held.front()));
                        held.pop_front();
                    }
                }
                for (auto& h : due)
                    (void)h.req.try_respond(h.x);
                if (due.empty()) std::this_thread::sleep_for(20us);
                due.clear();
            }
        });
        std::string line = server.self_address() + "\n";
        (void)!::write(out, line.data(), line.size());
        char c;
        while (::read(ctl, &c, 1) > 0) {
        }
        stop = true;
        answerer.join();
        {
            std::lock_guard g(mu);
            held.clear();
        }
        auto k = server.counters();
        line = fmt::format("{} {} {}\n", k.rpcs_received, k.busy_refused, k.responses_sent);
        (void)!::write(out, line.data(), line.size());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "talaria-perf overload server: %s\n", e.what());
        rc = 1;
    }
    std::fflush(nullptr);
    ::_exit(rc);
}

struct Latency {
    double p50_us = 0, p99_us = 0;
    std::size_t calls = 0, failed = 0;
};

/// One call at a time for `d`.
Latency good_client(Engine& e, const Endpoint& server, Duration d, uint8_t retries) {
    auto work = e.remote<uint64_t(uint64_t)>("perf.work").on(server).timeout(10s);
    if (retries) work = work.retry_busy(retries, 100us);
    std::vector<double> us;
    Latency out;
    for (auto until = Clock::now() + d; Clock::now() < until;) {
        auto t0 = Clock::now();
        auto r = work(out.calls).try_get();
        auto t1 = Clock::now();
        ++out.calls;
        if (!r) {
            ++out.failed;
            continue;
        }
        us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    if (!us.empty()) {
        std::sort(us.begin(), us.end());
        out.p50_us = us[us.size() / 2];
        out.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
    }
    return out;
}

}  // namespace

std::optional<std::string> read_line(int fd, Duration limit) {
    std::string s;
    auto until = Clock::now() + limit;
    char c;
    while (Clock::now() < until) {
        ssize_t n = ::read(fd, &c, 1);
        if (n == 1) {
            if (c == '\n') return s;
            s += c;
        } else if (n == 0 || errno != EINTR) {
            return std::nullopt;
        }
    }
    return std::nullopt;
}

int run_overload(const OverloadOptions& o) {
    int to_server[2], from_server[2];
    if (::pipe2(to_server, O_CLOEXEC) != 0 || ::pipe2(from_server, O_CLOEXEC) != 0) {
        std::perror("talaria-perf overload: pipe");
        return 1;
    }
    std::fflush(nullptr);
    pid_t pid = ::fork();  // before any engine or thread of this process
    if (pid < 0) {
        std::perror("talaria-perf overload: fork");
        return 1;
    }
    if (pid == 0) {
        ::close(to_server[1]);
        ::close(from_server[0]);
        serve(o, to_server[0], from_server[1]);
    }
    ::close(to_server[0]);
    ::close(from_server[1]);
    auto finish = [&](int rc) {
        ::close(to_server[1]);
        int status = 0;
        ::waitpid(pid, &status, 0);
        return rc;
    };
    auto address = read_line(from_server[0], 20s);
    if (!address) {
        std::fprintf(stderr, "talaria-perf overload: the server printed no address\n");
        return finish(1);
    }
    try {
        const std::string url = listen_url(o.transport);
        Engine good{url};
        Endpoint good_ep = good.lookup(*address);
        (void)good_client(good, good_ep, 200ms, o.good_retries);  // warm up
        const long rss0 = rss_kib(pid);
        Latency alone = good_client(good, good_ep, std::chrono::seconds(o.seconds), o.good_retries);

        EngineOptions fo;
        fo.core.peer_window = o.window;
        struct Tally {
            std::atomic<uint64_t> sent{0}, ok{0}, busy{0}, other{0}, again{0};
        } t;
        std::atomic<bool> stop{false};
        std::optional<Engine> flood;
        Endpoint flood_ep;
        std::vector<std::thread> threads;
        auto flooder = [&](unsigned i) {
            auto work = flood->remote<uint64_t(uint64_t)>("perf.work").on(flood_ep).timeout(30s);
            std::deque<Future<uint64_t>> ring;
            uint64_t n = uint64_t(i) << 40;
            auto take = [&] {
                auto r = ring.front().try_get();
                ring.pop_front();
                if (r)
                    ++t.ok;
                else if (r.code() == Errc::busy)
                    ++t.busy;
                else if (r.code() == Errc::again)
                    ++t.again;  // the flood's own engine was full: not sent
                else
                    ++t.other;
            };
            while (!stop.load(std::memory_order_relaxed)) {
                while (ring.size() < o.flood_inflight) {
                    ring.push_back(work(n++));
                    ++t.sent;
                }
                take();
            }
            while (!ring.empty())
                take();
        };
        // The flooding engine and its threads start from a thread of their own niceness (Linux
        // threads inherit it), so that on a machine with few cores they can stand for clients
        // on other hosts; with nice 0 they compete with the server and the good client for the
        // same cores.
        std::thread starter([&] {
            if (o.flood_nice != 0)
                (void)::setpriority(PRIO_PROCESS, id_t(::gettid()), o.flood_nice);
            flood.emplace(url, fo);
            flood_ep = flood->lookup(*address);
            for (unsigned i = 0; i < o.flooders; ++i)
                threads.emplace_back(flooder, i);
        });
        starter.join();
        std::this_thread::sleep_for(300ms);  // the flood is on
        Latency loaded =
            good_client(good, good_ep, std::chrono::seconds(o.seconds), o.good_retries);
        const long rss_flood = rss_kib(pid);
        stop = true;
        for (auto& th : threads)
            th.join();
        const long rss1 = rss_kib(pid);
        flood_ep = {};
        flood.reset();
        const uint64_t ended = t.ok + t.busy + t.other + t.again;

        fmt::print(
            "talaria-perf overload: {} server (max_requests {}, max_requests_per_peer {}, "
            "hold {} us); flood: {} threads x {} in flight on one engine (peer_window "
            "{}, nice {}); good client: one call at a time{}\n",
            o.transport, o.max_requests, o.max_per_peer, o.hold_us, o.flooders, o.flood_inflight,
            o.window, o.flood_nice,
            o.good_retries ? fmt::format(", retry_busy({})", o.good_retries) : "");
        fmt::print(
            "  good client alone:       p50 {:8.1f} us  p99 {:8.1f} us  ({} calls, {} "
            "failed)\n",
            alone.p50_us, alone.p99_us, alone.calls, alone.failed);
        fmt::print(
            "  good client under flood: p50 {:8.1f} us  p99 {:8.1f} us  ({} calls, {} "
            "failed)\n",
            loaded.p50_us, loaded.p99_us, loaded.calls, loaded.failed);
        fmt::print("  p99 ratio (flood / alone): {:.2f}\n",
                   alone.p99_us > 0 ? loaded.p99_us / alone.p99_us : 0.0);
        fmt::print(
            "  flood: {} calls: {} answered, {} busy, {} not sent (own engine full), {} "
            "other; {} lost\n",
            t.sent.load(), t.ok.load(), t.busy.load(), t.again.load(), t.other.load(),
            t.sent.load() - ended);
        fmt::print("  server RSS: {} KiB before the flood, {} KiB during, {} KiB after\n", rss0,
                   rss_flood, rss1);
        ::close(to_server[1]);
        to_server[1] = -1;
        if (auto k = read_line(from_server[0], 20s))
            fmt::print("  server: requests received, refused busy, responses sent: {}\n", *k);
        int status = 0;
        ::waitpid(pid, &status, 0);
        return t.other.load() == 0 && t.sent.load() == ended ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "talaria-perf overload: %s\n", e.what());
        return finish(1);
    }
}

}  // namespace talaria::perf
