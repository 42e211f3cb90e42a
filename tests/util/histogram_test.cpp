// The log-linear histogram (talaria/util/histogram.hpp): bucket bounds, quantiles against a
// sorted reference, merge, and snapshots read while another thread records.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "talaria/util/histogram.hpp"

namespace talaria {
namespace {

using H = Histogram;

TEST(Histogram, BucketsTileTheRangeAndAreNarrow) {
    EXPECT_EQ(H::kBuckets, 1152u);
    EXPECT_EQ(H::bucket_low(0), 0u);
    for (std::size_t b = 0; b < H::kBuckets; ++b) {
        SCOPED_TRACE(b);
        const uint64_t lo = H::bucket_low(b), hi = H::bucket_high(b);
        ASSERT_LE(lo, hi);
        ASSERT_EQ(H::bucket_of(lo), b);
        if (b + 1 < H::kBuckets) {
            ASSERT_EQ(H::bucket_of(hi), b);
            ASSERT_EQ(H::bucket_low(b + 1), hi + 1) << "a gap or an overlap between buckets";
            // Below 32 each value is its own bucket; above, a bucket is at most 1/32 of its
            // smallest value wide.
            if (b < H::kSub)
                ASSERT_EQ(lo, hi);
            else
                ASSERT_LE((hi - lo + 1) * H::kSub, lo);
        }
    }
    // The range ends at 2^40; larger values share the last bucket.
    EXPECT_EQ(H::bucket_of((uint64_t(1) << 40) - 1), H::kBuckets - 1);
    EXPECT_EQ(H::bucket_of(uint64_t(1) << 40), H::kBuckets - 1);
    EXPECT_EQ(H::bucket_of(UINT64_MAX), H::kBuckets - 1);
    for (uint64_t v = 0; v < 200000; ++v) {
        const std::size_t b = H::bucket_of(v);
        ASSERT_LE(H::bucket_low(b), v);
        ASSERT_GE(H::bucket_high(b), v);
    }
}

TEST(Histogram, EmptyAnswersZero) {
    H h;
    auto s = h.snapshot();
    EXPECT_EQ(s.count(), 0u);
    EXPECT_EQ(s.quantile(0.5), 0u);
    EXPECT_EQ(s.quantile(1.0), 0u);
    EXPECT_EQ(s.mean(), 0.0);
    EXPECT_EQ(s.max, 0u);
}

/// The value of rank ceil(q * n) (at least 1) of `sorted`.
uint64_t reference(const std::vector<uint64_t>& sorted, double q) {
    auto rank = std::max<uint64_t>(1, uint64_t(std::ceil(q * double(sorted.size()))));
    return sorted[rank - 1];
}

// Values spread over 0..2^45 (log-uniform, so every octave has some, and some beyond the range):
// every quantile is at or above the true value of its rank and at most one bucket width (1/32)
// above it; the maximum, count, sum and mean are exact.
TEST(Histogram, QuantilesMatchASortedReference) {
    std::mt19937_64 rng(20261128);
    for (int round = 0; round < 4; ++round) {
        SCOPED_TRACE(round);
        auto h = std::make_unique<H>();
        std::vector<uint64_t> values;
        const int n = round == 0 ? 1 : round == 1 ? 7 : round == 2 ? 1000 : 200000;
        uint64_t sum = 0;
        for (int i = 0; i < n; ++i) {
            const unsigned bits = unsigned(rng() % 46);
            const uint64_t v = bits == 0 ? 0 : rng() >> (64 - bits);
            values.push_back(v);
            sum += v;
            h->record(v);
        }
        std::sort(values.begin(), values.end());
        auto s = h->snapshot();
        EXPECT_EQ(s.count(), uint64_t(n));
        EXPECT_EQ(s.sum, sum);
        EXPECT_EQ(s.max, values.back());
        EXPECT_DOUBLE_EQ(s.mean(), double(sum) / n);
        EXPECT_EQ(s.quantile(1.0), values.back());
        for (double q : {0.0, 0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0}) {
            SCOPED_TRACE(q);
            const uint64_t want = reference(values, q);
            const uint64_t got = s.quantile(q);
            EXPECT_GE(got, want);
            if (want < (uint64_t(1) << 40)) {
                EXPECT_LE(got - want, want / H::kSub) << want;
            }
            EXPECT_LE(got, values.back());
        }
    }
}

// Two contexts' histograms merged read as one that recorded everything.
TEST(Histogram, MergedSnapshotsAreTheWhole) {
    auto a = std::make_unique<H>(), b = std::make_unique<H>(), all = std::make_unique<H>();
    std::mt19937_64 rng(7);
    for (int i = 0; i < 50000; ++i) {
        const uint64_t v = rng() % (i % 2 ? 1000 : 10000000);
        (i % 3 ? a : b)->record(v);
        all->record(v);
    }
    auto m = a->snapshot();
    m.merge(b->snapshot());
    const auto w = all->snapshot();
    EXPECT_EQ(m.counts, w.counts);
    EXPECT_EQ(m.sum, w.sum);
    EXPECT_EQ(m.max, w.max);
    for (double q : {0.5, 0.9, 0.99, 0.999})
        EXPECT_EQ(m.quantile(q), w.quantile(q));
}

// One thread records while another takes snapshots (as a stats reader does with a context's
// histograms): each snapshot counts no more than was recorded and no less than the one before,
// and the last counts everything. Under ThreadSanitizer this is also a data race check.
TEST(Histogram, SnapshotsWhileAnotherThreadRecords) {
    auto h = std::make_unique<H>();
    constexpr uint64_t kValues = 300000;
    std::atomic<uint64_t> recorded{0};
    std::atomic<bool> done{false};
    std::thread writer([&] {
        for (uint64_t i = 0; i < kValues; ++i) {
            h->record(i % 5000);
            recorded.store(i + 1, std::memory_order_release);
        }
        done = true;
    });
    uint64_t last = 0;
    int snapshots = 0;
    do {
        const auto s = h->snapshot();
        const uint64_t after = recorded.load(std::memory_order_acquire);
        const uint64_t n = s.count();
        EXPECT_GE(n, last);
        EXPECT_LE(n, after + 1);
        last = n;
        ++snapshots;
    } while (!done.load());
    writer.join();
    EXPECT_EQ(h->snapshot().count(), kValues);
    EXPECT_EQ(h->snapshot().max, 4999u);
    std::printf("%d snapshots while 300000 values were recorded\n", snapshots);
}

}  // namespace
}  // namespace talaria
