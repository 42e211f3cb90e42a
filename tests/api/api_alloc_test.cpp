// Heap allocations per call through the public API, counted by replacing the global operator
// new in this test program: after a warm-up, a steady stream of calls on one engine pair (both
// in this process, so the server's side counts too) must allocate nothing per call, or at most
// the budget named below (issue 9, item 4).
#include <gtest/gtest.h>
#include <algorithm>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "api_fixture.hpp"

namespace {
std::atomic<uint64_t> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete[](void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
    std::free(p);
}

namespace talaria::api_test {
namespace {

/// Windows of calls counted after the warm-up; the quietest one is the steady state.
constexpr int kWindows = 3;

/// Allocations per `echo(uint64_t)` call through the public API, over 2000 calls after 2000
/// of warm-up, with the client engine in `client_progress` mode (the server in background
/// mode). Printed, and recorded in the test's XML properties.
class AllocApi : public Api {
  protected:
    double echo_allocs_per_call(ProgressMode client_progress);
    double then_allocs_per_call();
};

double AllocApi::echo_allocs_per_call(ProgressMode client_progress) {
    EngineOptions co;
    co.progress = client_progress;
    open({}, co);
    server->define("echo", [](uint64_t x) { return x; });
    auto echo = client->remote<uint64_t(uint64_t)>("echo").on(ep);
    auto call = [&](int i) { EXPECT_EQ(echo(uint64_t(i)).get(), uint64_t(i)); };
    constexpr int kWarm = 2000, kCount = 2000;
    for (int i = 0; i < kWarm; ++i)
        call(i);
    // The steady state: the quietest of kWindows windows. The counter sees every thread of the
    // process (libfabric's and UCX's own included), and on a loaded machine a window may catch
    // a one-off growth (a deeper backlog than the warm-up met) that is not a cost per call.
    double per = 1e9;
    for (int w = 0; w < kWindows; ++w) {
        uint64_t before = g_allocs.load();
        for (int i = 0; i < kCount; ++i)
            call(i);
        per = std::min(per, double(g_allocs.load() - before) / kCount);
    }
    std::printf("allocations per call (%s, %s client, get): %.2f\n", GetParam().label.c_str(),
                client_progress == ProgressMode::manual ? "manual" : "background", per);
    RecordProperty("allocs_per_call", std::to_string(per));
    return per;
}

/// The same for calls consumed with then() on a background client: each callback issues the
/// next call (so states are made and dropped on the progress thread), counted in windows of
/// 2000 completions after the first 2000 (the quietest window counts).
double AllocApi::then_allocs_per_call() {
    open();
    server->define("echo", [](uint64_t x) { return x; });
    auto echo = client->remote<uint64_t(uint64_t)>("echo").on(ep);
    constexpr uint64_t kWarm = 2000, kCount = 2000;
    struct Chain {
        Procedure<uint64_t(uint64_t)> p;
        uint64_t n = 0;
        uint64_t marks[kWindows + 1]{};
        std::atomic<uint64_t> errors{0};
        std::atomic<bool> done{false};
        void next() {
            if (n >= kWarm && (n - kWarm) % kCount == 0)
                marks[(n - kWarm) / kCount] = g_allocs.load();
            if (n == kWarm + kWindows * kCount) {
                done.store(true);
                done.notify_all();
                return;
            }
            uint64_t v = n++;
            p(v).then([this, v](Result<uint64_t>&& r) {
                if (!r || *r != v) errors.fetch_add(1);
                next();
            });
        }
    } chain{echo};
    chain.next();
    chain.done.wait(false);
    EXPECT_EQ(chain.errors.load(), 0u);
    double per = 1e9;
    for (int w = 0; w < kWindows; ++w)
        per = std::min(per, double(chain.marks[w + 1] - chain.marks[w]) / kCount);
    std::printf("allocations per call (%s, background client, then): %.2f\n",
                GetParam().label.c_str(), per);
    RecordProperty("then_allocs_per_call", std::to_string(per));
    return per;
}

/// Allocations per call the transport itself still makes (issue 9, item 4, not met there):
/// inproc (a test transport) interns a received message's source address by name and drops it
/// with the message, so every message re-creates it (the address object and its table entry).
/// Every other transport: none (ofi's lanes keep the processes they hear from).
double transport_budget(const std::string& label) {
    if (label == "inproc") return 2.0;
    return 0.0;
}

TEST_P(AllocApi, AllocationsPerCallManualClient) {
    // The client drives its own progress from get() (manual mode): each call's state is made
    // and dropped on this thread, so the count is the library's own, not the cache's.
    EXPECT_LE(echo_allocs_per_call(ProgressMode::manual), transport_budget(GetParam().label));
}

TEST_P(AllocApi, AllocationsPerCallBackground) {
    // Background progress: the state is made on this thread and often dropped last on the
    // progress thread, so blocks flow one way between the two threads' caches: at most one
    // per call more (the state itself).
    EXPECT_LE(echo_allocs_per_call(ProgressMode::background),
              1.0 + transport_budget(GetParam().label));
}

TEST_P(AllocApi, AllocationsPerCallThen) {
    // The callback is kept in the call's state (no allocation of its own), and the states are
    // made and dropped on the progress thread, so its block cache serves them all.
    EXPECT_LE(then_allocs_per_call(), transport_budget(GetParam().label));
}

INSTANTIATE_TEST_SUITE_P(api, AllocApi, ::testing::ValuesIn(na::test::transport_kinds()),
                         kind_name);

}  // namespace
}  // namespace talaria::api_test
