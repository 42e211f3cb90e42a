// What a handler's transfer costs through the C++ API, with and without the watch that ties it
// to its call (docs/architecture.md, "Cancellation and deadlines": Request::pull/push arm a
// timer of the bulk context every 10 ms, so a canceled or expired call stops its transfer; the
// watch is one allocation and one timer per transfer). Each iteration is one call whose handler
// pulls the caller's exposed bytes and waits for them:
//   BM_HandlerPull/<transport>/<bytes>/1: Request::pull (watched)
//   BM_HandlerPull/<transport>/<bytes>/0: Engine::pull with the caller named (not watched)
// Run the two interleaved, repeated, and compare medians (docs/benchmarks.md):
//   talaria-apibench --benchmark_repetitions=9 --benchmark_enable_random_interleaving=true
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "talaria/talaria.hpp"

namespace {

using namespace talaria;

const char* const kAddresses[] = {"sm://", "tcp://127.0.0.1:0"};

void BM_HandlerPull(benchmark::State& st) {
    const char* address = kAddresses[st.range(0)];
    const auto size = static_cast<std::size_t>(st.range(1));
    const bool watched = st.range(2) != 0;
    st.SetLabel(std::string(address) +
                (watched ? " Request::pull (watched)" : " Engine::pull (not watched)"));
    auto server_r = Engine::open(address, true);
    auto client_r = Engine::open(address, false);
    if (!server_r || !client_r) {
        st.SkipWithError((server_r ? client_r.error() : server_r.error()).describe().c_str());
        return;
    }
    Engine& server = *server_r;
    Engine& client = *client_r;
    std::vector<std::byte> into(size), data(size, std::byte{7});
    Bulk local = server.expose({into.data(), into.size()}, write_only);
    server.define("save", [&](const Request& req, Bulk b) {
        if (watched)
            req.pull(b, 0, local, 0, b.size()).get();
        else
            server.pull(b, 0, local, 0, b.size(), req.source()).get();
        return uint64_t(b.size());
    });
    auto ep = client.lookup(server.self_address());
    Bulk exposed = client.expose({data.data(), data.size()}, read_only);
    auto save = client.remote<uint64_t(Bulk)>("save").on(ep);
    for (int i = 0; i < 100; ++i)
        (void)save(exposed).get();  // connections, pools, first timers
    for (auto _ : st)
        benchmark::DoNotOptimize(save(exposed).get());
    st.SetItemsProcessed(int64_t(st.iterations()));
    st.SetBytesProcessed(int64_t(st.iterations() * size));
}
// 4 KiB: not inline (a handle carries at most 512 bytes), the per-transfer costs dominate;
// 1 MiB: the bytes dominate.
BENCHMARK(BM_HandlerPull)
    ->ArgsProduct({{0, 1}, {4096, 1 << 20}, {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
