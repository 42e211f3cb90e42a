// talaria-perf group: collective calls and failure detection over N ranks of this machine
// (issue 13), measured through the public API (talaria::Group).
//
//   talaria-perf group -t tcp --ranks 2,4,8,16 -k 2,4 --calls 2000
//   talaria-perf group -t tcp --ranks 8 --detect --period-ms 200 --suspicion-ms 1000
//                      --load-inflight 64 --load-seconds 60       (one command line)
//
// Ranks 1..N-1 are child processes (forked before any engine or thread exists here), each
// with one Engine; this process is rank 0. Children take commands on a pipe, one per line.
//
// Latency: for each N, every rank makes a Group of the first N ranks and defines collective
// "perf.bcast.N", uint32_t(), answering 1 and summing. Rank 0 times --calls broadcasts of it
// one at a time for each radix k (the sum is checked to be N), and, in the same run, --calls
// point-to-point calls of an empty procedure to rank 1: the tree's latency is set against
// ceil(log_k N) x that round trip.
//
// Detection (--detect): the largest N's ranks run SWIM (Group::start_failure_detection) while
// each keeps --load-inflight calls to random ranks in flight for --load-seconds; every state
// change any rank sees is a false positive then. Then the last rank is killed with SIGKILL and
// each survivor's time to declare it dead is reported (steady clock, one for the machine).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "app.hpp"
#include "talaria/talaria.hpp"

namespace talaria::perf {

namespace {

using namespace std::chrono_literals;

/// Nanoseconds on the machine's steady clock (CLOCK_MONOTONIC: the same in every process).
int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
}

/// A line from a pipe of the other processes (read_line, app.hpp): they answer at once.
std::optional<std::string> line_from(int fd) {
    return read_line(fd, std::chrono::minutes(10));
}

void say(int fd, const std::string& line) {
    std::string l = line + "\n";
    (void)!::write(fd, l.data(), l.size());
}

/// With --hosts H: move this thread (and the engine's threads, made after) into emulated host
/// rank % H (network namespace talaria-h<i> of scripts/hosts, address 10.200.0.<i+1>), and
/// listen on that host's address. Otherwise this host's loopback (or shared memory).
std::string enter_host(const GroupBenchOptions& o, uint32_t rank) {
    if (o.hosts == 0) return listen_url(o.transport);
    const uint32_t h = rank % o.hosts;
    const std::string ns = fmt::format("/var/run/netns/talaria-h{}", h);
    int fd = ::open(ns.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
        const int err = errno;
        if (fd >= 0) ::close(fd);
        throw std::runtime_error(
            fmt::format("cannot enter {}: {} (scripts/hosts up {} first, as "
                        "root)",
                        ns, std::strerror(err), o.hosts));
    }
    ::close(fd);
    return fmt::format("{}://10.200.0.{}:0", o.transport, h + 1);
}

/// What one rank runs besides its groups: SWIM's events and a load of calls.
struct RankSide {
    Engine& engine;
    uint32_t rank;
    std::map<uint32_t, Group> groups;  // by N
    std::mutex mu;
    std::vector<std::string> events;  // "rank:state:ns"
    std::atomic<bool> stop_load{false};
    std::vector<std::thread> load;
    std::atomic<uint64_t> load_calls{0}, load_errors{0};

    RankSide(Engine& e, uint32_t r) : engine(e), rank(r) {
        engine.define("perf.noop", [] { return uint32_t{1}; });
    }
    ~RankSide() { end_load(); }

    void make_group(uint32_t n, const std::vector<std::string>& addresses) {
        std::vector<std::string> first(addresses.begin(), addresses.begin() + n);
        Group g(engine, first, rank);
        g.define_collective<uint32_t()>(
            fmt::format("perf.bcast.{}", n), [] { return uint32_t{1}; },
            [](const uint32_t& a, const uint32_t& b) { return a + b; });
        groups.emplace(n, std::move(g));
    }

    void detect(uint32_t n, Duration period, Duration suspicion) {
        Group& g = groups.at(n);
        g.on_rank_state([this](uint32_t r, RankState s) {
            std::lock_guard l(mu);
            events.push_back(fmt::format("{}:{}:{}", r, rank_state_name(s), now_ns()));
        });
        FailureDetection fd;
        fd.period = period;
        fd.suspicion = suspicion;
        g.start_failure_detection(fd).value();
    }

    /// `inflight` calls to random other ranks of group `n`, kept going.
    void start_load(uint32_t n, unsigned inflight) {
        load.emplace_back([this, n, inflight] {
            Group& g = groups.at(n);
            std::vector<Endpoint> eps;
            for (uint32_t r = 0; r < n; ++r)
                if (r != rank) eps.push_back(g.rank(r));
            auto noop = engine.remote<uint32_t()>("perf.noop").timeout(5s);
            std::mt19937 rng(rank * 7919u + 1);
            std::deque<Future<uint32_t>> q;
            while (!stop_load.load(std::memory_order_relaxed)) {
                while (q.size() < inflight)
                    q.push_back(noop.on(eps[rng() % eps.size()])());
                auto r = q.front().try_get();
                q.pop_front();
                ++load_calls;
                if (!r) ++load_errors;
            }
            for (auto& f : q)
                (void)f.try_get();
        });
    }
    void end_load() {
        stop_load = true;
        for (auto& t : load)
            t.join();
        load.clear();
        stop_load = false;
    }
    std::string report() {
        std::lock_guard l(mu);
        std::string out = fmt::format("{} {}", load_calls.load(), load_errors.load());
        for (auto& e : events)
            out += " " + e;
        return out;
    }
};

std::vector<std::string> words(const std::string& line) {
    std::istringstream in(line);
    std::vector<std::string> out;
    for (std::string w; in >> w;)
        out.push_back(w);
    return out;
}

/// A child rank: obey `ctl` until it closes; answer on `out`.
[[noreturn]] void child(const GroupBenchOptions& o, uint32_t rank, int ctl, int out) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int rc = 0;
    try {
        Engine engine{enter_host(o, rank), listen};
        say(out, engine.self_address());
        RankSide side(engine, rank);
        std::vector<std::string> addresses;
        while (auto line = line_from(ctl)) {
            auto w = words(*line);
            if (w.empty()) continue;
            if (w[0] == "addresses") {
                addresses.assign(w.begin() + 1, w.end());
                say(out, "ok");
            } else if (w[0] == "group") {
                side.make_group(uint32_t(std::stoul(w[1])), addresses);
                say(out, "ok");
            } else if (w[0] == "detect") {
                side.detect(uint32_t(std::stoul(w[1])), std::chrono::milliseconds(std::stol(w[2])),
                            std::chrono::milliseconds(std::stol(w[3])));
                say(out, "ok");
            } else if (w[0] == "load") {
                side.start_load(uint32_t(std::stoul(w[1])), unsigned(std::stoul(w[2])));
                say(out, "ok");
            } else if (w[0] == "unload") {
                side.end_load();
                say(out, "ok");
            } else if (w[0] == "report") {
                say(out, side.report());
            }
        }
        side.end_load();
        side.groups.clear();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "talaria-perf group: rank %u: %s\n", rank, e.what());
        rc = 1;
    }
    std::fflush(nullptr);
    ::_exit(rc);
}

struct Child {
    pid_t pid = -1;
    int ctl = -1, out = -1;
    std::string address;
    bool alive = true;
};

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, std::size_t(double(v.size()) * p))];
}
unsigned ceil_log(uint32_t n, uint32_t k) {
    unsigned d = 0;
    for (uint64_t p = 1; p < n; p *= k)
        ++d;
    return d;
}

}  // namespace

int run_group_bench(const GroupBenchOptions& o) {
    const uint32_t most = *std::max_element(o.ranks.begin(), o.ranks.end());
    std::vector<Child> kids(most);  // kids[0] unused: rank 0 is this process
    std::fflush(nullptr);
    for (uint32_t r = 1; r < most; ++r) {
        int a[2], b[2];
        if (::pipe2(a, O_CLOEXEC) != 0 || ::pipe2(b, O_CLOEXEC) != 0) {
            std::perror("talaria-perf group: pipe");
            return 1;
        }
        pid_t pid = ::fork();  // before any engine or thread of this process
        if (pid < 0) {
            std::perror("talaria-perf group: fork");
            return 1;
        }
        if (pid == 0) {
            for (uint32_t q = 1; q < r; ++q) {  // the others' pipes are not ours
                ::close(kids[q].ctl);
                ::close(kids[q].out);
            }
            ::close(a[1]);
            ::close(b[0]);
            child(o, r, a[0], b[1]);
        }
        ::close(a[0]);
        ::close(b[1]);
        kids[r] = Child{pid, a[1], b[0], {}, true};
    }
    auto finish = [&](int rc) {
        for (uint32_t r = 1; r < most; ++r) {
            if (kids[r].ctl >= 0) ::close(kids[r].ctl);
            kids[r].ctl = -1;
        }
        for (uint32_t r = 1; r < most; ++r) {
            int st = 0;
            ::waitpid(kids[r].pid, &st, 0);
        }
        return rc;
    };
    auto ask = [&](uint32_t r, const std::string& cmd) -> std::string {
        say(kids[r].ctl, cmd);
        auto l = line_from(kids[r].out);
        if (!l) throw std::runtime_error(fmt::format("rank {} did not answer '{}'", r, cmd));
        return *l;
    };
    try {
        std::vector<std::string> addresses(most);
        for (uint32_t r = 1; r < most; ++r) {
            auto l = line_from(kids[r].out);
            if (!l) throw std::runtime_error(fmt::format("rank {} did not start", r));
            addresses[r] = *l;
        }
        Engine engine{enter_host(o, 0), listen};
        addresses[0] = engine.self_address();
        std::string all = "addresses";
        for (auto& a : addresses)
            all += " " + a;
        for (uint32_t r = 1; r < most; ++r)
            ask(r, all);
        RankSide side(engine, 0);
        // A caller that is not a member (the same process, another engine): it reaches the
        // root, rank 0, over the transport, one hop more than the tree's depth. A member's own
        // broadcast runs the root's part in its process.
        Engine outside{enter_host(o, 0)};

        fmt::print(
            "talaria-perf group: {} ranks at most over {} ({} hardware threads), {} "
            "calls per point\n",
            most, o.transport, std::thread::hardware_concurrency(), o.calls);
        if (o.hosts)
            fmt::print("ranks on {} emulated hosts (rank r on talaria-h<r % {}>)\n", o.hosts,
                       o.hosts);
        fmt::print("{:>5} {:>3} {:>5} {:>12} {:>12} {:>12} {:>12} {:>8} {:>14} {:>8}\n", "ranks",
                   "k", "depth", "bcast p50 us", "bcast p99 us", "rtt p50 us", "depth x rtt",
                   "ratio", "client p50 us", "c ratio");
        for (uint32_t n : o.ranks) {
            for (uint32_t r = 1; r < n; ++r)
                ask(r, fmt::format("group {}", n));
            side.make_group(n, addresses);
            Group& g = side.groups.at(n);
            Group from_outside(outside,
                               std::vector<std::string>(addresses.begin(), addresses.begin() + n));
            // The point-to-point round trip of the same run: rank 0 to rank 1 (to itself at 1).
            auto noop = engine.remote<uint32_t()>("perf.noop").on(g.rank(n > 1 ? 1 : 0));
            std::vector<double> rtt;
            for (unsigned i = 0; i < o.calls + o.calls / 10; ++i) {
                auto t0 = Clock::now();
                noop().get();
                if (i >= o.calls / 10)
                    rtt.push_back(
                        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
            }
            for (uint32_t k : o.k) {
                CollectiveOptions co;
                co.k = k;
                co.timeout = 10s;
                std::vector<double> us, client_us;
                const std::string name = fmt::format("perf.bcast.{}", n);
                // Member and outside caller alternate, so that both meet the same noise.
                for (unsigned i = 0; i < o.calls + o.calls / 10; ++i) {
                    for (Group* from : {&g, &from_outside}) {
                        auto t0 = Clock::now();
                        auto r = from->broadcast<uint32_t()>(co, name).get();
                        auto t1 = Clock::now();
                        if (!r.value || *r.value != n || !r.failed.empty())
                            throw std::runtime_error(fmt::format(
                                "a broadcast over {} ranks summed {} with {} failed{}", n,
                                r.value ? *r.value : 0, r.failed.size(),
                                r.failed.empty() ? "" : ": " + r.failed.front().message));
                        if (i >= o.calls / 10)
                            (from == &g ? us : client_us)
                                .push_back(
                                    std::chrono::duration<double, std::micro>(t1 - t0).count());
                    }
                }
                const unsigned depth = ceil_log(n, k);
                const double bound = depth * median(rtt);
                auto ratio = [&](double v, double b) {
                    return b > 0 ? fmt::format("{:.2f}", v / b) : std::string("-");
                };
                // The outside caller's bound is one hop more: (depth + 1) x rtt.
                fmt::print(
                    "{:>5} {:>3} {:>5} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>8} {:>14.1f} "
                    "{:>8}\n",
                    n, k, depth, median(us), pct(us, 0.99), median(rtt), bound,
                    ratio(median(us), bound), median(client_us),
                    ratio(median(client_us), (depth + 1) * median(rtt)));
            }
        }

        if (o.detect) {
            const uint32_t n = most;
            if (n < 3) throw std::runtime_error("--detect needs 3 ranks at least");
            for (uint32_t r = 1; r < n; ++r)
                ask(r, fmt::format("detect {} {} {}", n, o.period_ms, o.suspicion_ms));
            side.detect(n, std::chrono::milliseconds(o.period_ms),
                        std::chrono::milliseconds(o.suspicion_ms));
            if (o.load_inflight > 0) {
                for (uint32_t r = 1; r < n; ++r)
                    ask(r, fmt::format("load {} {}", n, o.load_inflight));
                side.start_load(n, o.load_inflight);
            }
            fmt::print(
                "\nfailure detection: {} ranks, period {} ms, suspicion {} ms, {} calls "
                "in flight per rank for {} s\n",
                n, o.period_ms, o.suspicion_ms, o.load_inflight, o.load_seconds);
            std::this_thread::sleep_for(std::chrono::seconds(o.load_seconds));
            for (uint32_t r = 1; r < n; ++r)
                if (o.load_inflight > 0) ask(r, "unload");
            side.end_load();
            // Every event so far is about a live rank: a false positive (suspect or dead).
            uint64_t calls = 0, errors = 0, suspects = 0, deads = 0;
            auto tally = [&](const std::string& rep) {
                auto w = words(rep);
                std::vector<std::string> evs(w.begin() + 2, w.end());
                calls += std::stoull(w[0]);
                errors += std::stoull(w[1]);
                return evs;
            };
            std::vector<std::vector<std::string>> before(n);
            for (uint32_t r = 1; r < n; ++r)
                before[r] = tally(ask(r, "report"));
            before[0] = tally(side.report());
            for (auto& evs : before)
                for (auto& e : evs) {
                    suspects += e.find(":suspect:") != std::string::npos;
                    deads += e.find(":dead:") != std::string::npos;
                }
            fmt::print(
                "  under load: {} calls ({} failed); live ranks suspected {} times, "
                "declared dead {} times\n",
                calls, errors, suspects, deads);

            const uint32_t victim = n - 1;
            const int64_t t_kill = now_ns();
            ::kill(kids[victim].pid, SIGKILL);
            int st = 0;
            ::waitpid(kids[victim].pid, &st, 0);
            ::close(kids[victim].ctl);
            kids[victim].ctl = -1;
            kids[victim].pid = -1;
            // Each survivor's first "victim:dead" after the kill.
            std::vector<double> ms(n, -1);
            const std::string dead_tag = fmt::format("{}:dead:", victim);
            for (auto until = Clock::now() + 30s; Clock::now() < until;) {
                bool everyone = true;
                for (uint32_t r = 0; r < n; ++r) {
                    if (r == victim || ms[r] >= 0) continue;
                    auto rep = r == 0 ? side.report() : ask(r, "report");
                    for (auto& e : words(rep))
                        if (e.rfind(dead_tag, 0) == 0)
                            ms[r] = double(std::stoll(e.substr(dead_tag.size())) - t_kill) / 1e6;
                    everyone &= ms[r] >= 0;
                }
                if (everyone) break;
                std::this_thread::sleep_for(50ms);
            }
            std::vector<double> seen;
            for (uint32_t r = 0; r < n; ++r)
                if (r != victim) {
                    if (ms[r] < 0)
                        fmt::print("  rank {} never declared rank {} dead within 30 s\n", r,
                                   victim);
                    else
                        seen.push_back(ms[r]);
                }
            fmt::print(
                "  rank {} killed (SIGKILL): {} of {} survivors declared it dead; "
                "median {:.0f} ms, last {:.0f} ms after the kill\n",
                victim, seen.size(), n - 1, median(seen),
                seen.empty() ? 0.0 : *std::max_element(seen.begin(), seen.end()));
            if (seen.size() != n - 1) return finish(1);
        }
        side.groups.clear();
        return finish(0);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "talaria-perf group: %s\n", e.what());
        return finish(1);
    }
}

}  // namespace talaria::perf
