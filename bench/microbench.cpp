// talaria-microbench: micro-benchmarks of the util pieces on the fast path, each next to the
// baseline it replaces or is bounded by, measured in the same run:
//   crc32c     hardware (SSE4.2) vs portable table, 64 B .. 1 MiB; baseline: a plain read of
//              the same bytes (memory bandwidth bound)
//   ObjectPool acquire/release vs new/delete of an op-sized object, single and in bursts
//   InplaceFunction vs std::function, construct+call and call only; baseline: a direct call
//   seal       one full record of a protected tcp stream (na::Auth::protect, AES-256-GCM
//              through libcrypto) sealed, and sealed then opened, with encryption and with
//              integrity only; baseline: a memcpy of the same bytes
//
// Unless told otherwise (--benchmark_repetitions=N), every benchmark runs 5 times and reports
// mean, median and standard deviation, never a single run.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include <benchmark/benchmark.h>

#include "na/base/seal.hpp"
#include "talaria/util/crc32c.hpp"
#include "talaria/util/inplace_function.hpp"
#include "talaria/util/pool.hpp"

namespace {

using talaria::InplaceFunction;
using talaria::ObjectPool;

// --- crc32c ----------------------------------------------------------------------------------

std::vector<unsigned char> random_bytes(std::size_t n) {
    std::vector<unsigned char> v(n);
    std::mt19937_64 rng(42);
    for (auto& b : v)
        b = static_cast<unsigned char>(rng());
    return v;
}

void crc_args(benchmark::internal::Benchmark* b) {
    b->RangeMultiplier(4)->Range(64, 1 << 20);
}

void BM_Crc32c_Hardware(benchmark::State& state) {
    if (!talaria::crc32c_hardware()) {
        state.SkipWithError("CPU lacks SSE4.2: crc32c() is the portable table");
        return;
    }
    auto buf = random_bytes(std::size_t(state.range(0)));
    uint32_t crc = 0;
    for (auto _ : state) {
        crc = talaria::crc32c(crc, buf.data(), buf.size());
        benchmark::DoNotOptimize(crc);
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Crc32c_Hardware)->Apply(crc_args);

void BM_Crc32c_Portable(benchmark::State& state) {
    auto buf = random_bytes(std::size_t(state.range(0)));
    uint32_t crc = 0;
    for (auto _ : state) {
        crc = talaria::crc32c_portable(crc, buf.data(), buf.size());
        benchmark::DoNotOptimize(crc);
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Crc32c_Portable)->Apply(crc_args);

// Baseline: read every byte (xor of 8-byte words); a checksum cannot beat this.
void BM_Crc32c_BaselineRead(benchmark::State& state) {
    auto buf = random_bytes(std::size_t(state.range(0)));
    for (auto _ : state) {
        uint64_t acc = 0;
        const unsigned char* p = buf.data();
        std::size_t n = buf.size();
        for (; n >= 8; n -= 8, p += 8) {
            uint64_t w;
            std::memcpy(&w, p, 8);
            acc ^= w;
        }
        for (; n; --n)
            acc ^= *p++;
        benchmark::DoNotOptimize(acc);
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Crc32c_BaselineRead)->Apply(crc_args);

// --- ObjectPool vs new/delete ------------------------------------------------------------------

// About the size of a transport's operation record (callback + completion + links).
struct OpLike {
    std::array<uint64_t, 16> words{};
    explicit OpLike(uint64_t v) { words[0] = v; }
};

void BM_Pool_AcquireRelease(benchmark::State& state) {
    ObjectPool<OpLike> pool(4096);
    uint64_t i = 0;
    for (auto _ : state) {
        OpLike* p = pool.acquire(i++);
        benchmark::DoNotOptimize(p);
        pool.release(p);
    }
    state.SetItemsProcessed(int64_t(state.iterations()));
}
BENCHMARK(BM_Pool_AcquireRelease);

void BM_NewDelete(benchmark::State& state) {
    uint64_t i = 0;
    for (auto _ : state) {
        auto* p = new OpLike(i++);
        benchmark::DoNotOptimize(p);
        benchmark::ClobberMemory();  // keep the compiler from eliding the new/delete pair
        delete p;
    }
    state.SetItemsProcessed(int64_t(state.iterations()));
}
BENCHMARK(BM_NewDelete);

// Bursts: `n` operations in flight, released in an order different from acquisition, as
// completions arrive out of order.
void BM_Pool_Burst(benchmark::State& state) {
    const auto n = std::size_t(state.range(0));
    ObjectPool<OpLike> pool(n);
    std::vector<OpLike*> held(n);
    for (auto _ : state) {
        for (std::size_t k = 0; k < n; ++k)
            held[k] = pool.acquire(k);
        benchmark::DoNotOptimize(held.data());
        for (std::size_t k = 0; k < n; k += 2)
            pool.release(held[k]);
        for (std::size_t k = 1; k < n; k += 2)
            pool.release(held[k]);
    }
    state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(n));
}
BENCHMARK(BM_Pool_Burst)->Arg(16)->Arg(256)->Arg(4096);

void BM_NewDelete_Burst(benchmark::State& state) {
    const auto n = std::size_t(state.range(0));
    std::vector<OpLike*> held(n);
    for (auto _ : state) {
        for (std::size_t k = 0; k < n; ++k)
            held[k] = new OpLike(k);
        benchmark::DoNotOptimize(held.data());
        benchmark::ClobberMemory();
        for (std::size_t k = 0; k < n; k += 2)
            delete held[k];
        for (std::size_t k = 1; k < n; k += 2)
            delete held[k];
    }
    state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(n));
}
BENCHMARK(BM_NewDelete_Burst)->Arg(16)->Arg(256)->Arg(4096);

// --- InplaceFunction vs std::function ----------------------------------------------------------

// A callback capturing one pointer fits std::function's small buffer (16 bytes in libstdc++);
// one capturing four words (like a completion callback with its request, context and cookies)
// does not, so std::function allocates.
struct Small {
    uint64_t* sink;
    void operator()(int x) const { *sink += uint64_t(x); }
};
struct Large {
    uint64_t* sink;
    uint64_t a, b, c;
    void operator()(int x) const { *sink += uint64_t(x) + a + b + c; }
};

template <class Fn, class Callable>
void construct_call(benchmark::State& state) {
    uint64_t sink = 0;
    int x = 0;
    for (auto _ : state) {
        Callable c{&sink};
        Fn f(c);
        benchmark::DoNotOptimize(f);
        f(x++);
        benchmark::ClobberMemory();
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(int64_t(state.iterations()));
}

void BM_Function_Construct_Baseline(benchmark::State& state) {
    uint64_t sink = 0;
    int x = 0;
    for (auto _ : state) {
        Large c{&sink, 1, 2, 3};
        benchmark::DoNotOptimize(c);
        c(x++);
        benchmark::ClobberMemory();
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(int64_t(state.iterations()));
}
BENCHMARK(BM_Function_Construct_Baseline);

void BM_InplaceFunction_ConstructCall_Small(benchmark::State& state) {
    construct_call<InplaceFunction<void(int), 48>, Small>(state);
}
BENCHMARK(BM_InplaceFunction_ConstructCall_Small);
void BM_StdFunction_ConstructCall_Small(benchmark::State& state) {
    construct_call<std::function<void(int)>, Small>(state);
}
BENCHMARK(BM_StdFunction_ConstructCall_Small);
void BM_InplaceFunction_ConstructCall_Large(benchmark::State& state) {
    construct_call<InplaceFunction<void(int), 48>, Large>(state);
}
BENCHMARK(BM_InplaceFunction_ConstructCall_Large);
void BM_StdFunction_ConstructCall_Large(benchmark::State& state) {
    construct_call<std::function<void(int)>, Large>(state);
}
BENCHMARK(BM_StdFunction_ConstructCall_Large);

// Construct once, move it along (as a callback moves from the post call into the op and out
// again at trigger time), then call.
template <class Fn>
void construct_move_call(benchmark::State& state) {
    uint64_t sink = 0;
    int x = 0;
    for (auto _ : state) {
        Fn f(Large{&sink, 1, 2, 3});
        Fn g(std::move(f));
        Fn h(std::move(g));
        benchmark::DoNotOptimize(h);
        h(x++);
        benchmark::ClobberMemory();
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(int64_t(state.iterations()));
}
void BM_InplaceFunction_ConstructMoveCall(benchmark::State& state) {
    construct_move_call<InplaceFunction<void(int), 48>>(state);
}
BENCHMARK(BM_InplaceFunction_ConstructMoveCall);
void BM_StdFunction_ConstructMoveCall(benchmark::State& state) {
    construct_move_call<std::function<void(int)>>(state);
}
BENCHMARK(BM_StdFunction_ConstructMoveCall);

template <class Fn>
void call_only(benchmark::State& state) {
    uint64_t sink = 0;
    Fn f(Large{&sink, 1, 2, 3});
    int x = 0;
    for (auto _ : state) {
        benchmark::DoNotOptimize(f);
        f(x++);
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(int64_t(state.iterations()));
}
void BM_Call_Baseline(benchmark::State& state) {
    uint64_t sink = 0;
    Large f{&sink, 1, 2, 3};
    int x = 0;
    for (auto _ : state) {
        benchmark::DoNotOptimize(f);
        f(x++);
    }
    benchmark::DoNotOptimize(sink);
    state.SetItemsProcessed(int64_t(state.iterations()));
}
BENCHMARK(BM_Call_Baseline);
void BM_InplaceFunction_Call(benchmark::State& state) {
    call_only<InplaceFunction<void(int), 48>>(state);
}
BENCHMARK(BM_InplaceFunction_Call);
void BM_StdFunction_Call(benchmark::State& state) {
    call_only<std::function<void(int)>>(state);
}
BENCHMARK(BM_StdFunction_Call);

// --- seal: a protected stream's records ----------------------------------------------------

namespace seal = talaria::na::seal;
using talaria::na::Protect;

constexpr std::size_t kRecordBody = seal::kMaxRecordBody;

Protect protect_of(const benchmark::State& st) {
    return st.range(0) ? Protect::encryption : Protect::integrity;
}

void BM_Seal(benchmark::State& st) {
    std::array<std::byte, seal::kKeySize> key{};
    key.fill(std::byte{7});
    seal::Direction tx;
    if (!tx.init(key, 0, protect_of(st))) {
        st.SkipWithError("seal::Direction::init failed");
        return;
    }
    std::vector<std::byte> rec(kRecordBody + seal::kRecordOverhead, std::byte{1});
    for (auto _ : st)
        benchmark::DoNotOptimize(tx.seal(rec.data(), kRecordBody));
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(kRecordBody));
    st.SetLabel(st.range(0) ? "encryption" : "integrity");
}
BENCHMARK(BM_Seal)->Arg(1)->Arg(0);

void BM_SealOpen(benchmark::State& st) {
    std::array<std::byte, seal::kKeySize> key{};
    key.fill(std::byte{7});
    seal::Direction tx, rx;
    if (!tx.init(key, 0, protect_of(st)) || !rx.init(key, 0, protect_of(st))) {
        st.SkipWithError("seal::Direction::init failed");
        return;
    }
    std::vector<std::byte> rec(kRecordBody + seal::kRecordOverhead, std::byte{1});
    std::vector<std::byte> out(kRecordBody);
    for (auto _ : st) {
        tx.seal(rec.data(), kRecordBody);
        if (!rx.open(rec.data(), kRecordBody, out.data())) {
            st.SkipWithError("a record failed its tag");
            return;
        }
        benchmark::DoNotOptimize(out.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(kRecordBody));
    st.SetLabel(st.range(0) ? "encryption" : "integrity");
}
BENCHMARK(BM_SealOpen)->Arg(1)->Arg(0);

void BM_Seal_BaselineMemcpy(benchmark::State& st) {
    std::vector<std::byte> a(kRecordBody, std::byte{1}), b(kRecordBody);
    for (auto _ : st) {
        std::memcpy(b.data(), a.data(), kRecordBody);
        benchmark::DoNotOptimize(b.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(kRecordBody));
}
BENCHMARK(BM_Seal_BaselineMemcpy);

}  // namespace

int main(int argc, char** argv) {
    // Default to repeated runs reported as mean/median/stddev; an explicit
    // --benchmark_repetitions on the command line wins.
    std::vector<char*> args(argv, argv + argc);
    bool has_reps = std::any_of(args.begin(), args.end(), [](const char* a) {
        return std::string_view(a).rfind("--benchmark_repetitions", 0) == 0;
    });
    static char reps[] = "--benchmark_repetitions=5";
    static char aggregates[] = "--benchmark_report_aggregates_only=true";
    if (!has_reps) {
        args.push_back(reps);
        args.push_back(aggregates);
    }
    int n = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&n, args.data());
    if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
