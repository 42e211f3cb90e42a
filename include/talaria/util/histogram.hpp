// A log-linear histogram of non-negative integers (latencies in nanoseconds, sizes in bytes),
// HDR-style: cheap to record on a hot path, mergeable across contexts, and read as quantiles.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace talaria {

/// Buckets: each value below 2^kSubBits (32) has a bucket of its own; above, every power of two
/// [2^k, 2^(k+1)) is cut into 2^kSubBits equal buckets, so a bucket is at most 1/32 of the
/// values in it wide (3.1%), over a range of 2^kMaxBits (2^40 ns is 18 minutes). Larger values
/// count in the last bucket (the exact maximum is kept apart). 1152 buckets, 9 KiB.
///
/// record() is for one thread at a time (the context that owns the histogram, or whoever holds
/// its lock): a relaxed load and store per field, no read-modify-write, no lock;
/// record_shared() is for several threads at once (atomic adds). Any thread may take a snapshot()
/// at any time (each field is read atomically; a snapshot taken while a value is being recorded may
/// count it in some fields and not yet in others). Snapshots merge and answer quantiles.
class Histogram {
  public:
    static constexpr unsigned kSubBits = 5;
    static constexpr unsigned kMaxBits = 40;
    static constexpr std::size_t kSub = std::size_t(1) << kSubBits;
    static constexpr std::size_t kBuckets = (kMaxBits - kSubBits + 1) * kSub;

    /// The bucket of `v`.
    static constexpr std::size_t bucket_of(uint64_t v) noexcept {
        if (v < kSub) return std::size_t(v);
        if (v >> kMaxBits) return kBuckets - 1;
        const unsigned k = 63u - unsigned(std::countl_zero(v));  // 2^k <= v < 2^(k+1), k >= 5
        const std::size_t sub = std::size_t(v >> (k - kSubBits)) & (kSub - 1);
        return (k - kSubBits + 1) * kSub + sub;
    }
    /// The smallest value of bucket `b`.
    static constexpr uint64_t bucket_low(std::size_t b) noexcept {
        if (b < kSub) return b;
        const std::size_t octave = b / kSub;  // >= 1
        return uint64_t(kSub + b % kSub) << (octave - 1);
    }
    /// The largest value of bucket `b` (the last bucket's is the largest 64-bit value).
    static constexpr uint64_t bucket_high(std::size_t b) noexcept {
        if (b == kBuckets - 1) return std::numeric_limits<uint64_t>::max();
        if (b < kSub) return b;
        return bucket_low(b) + (uint64_t(1) << (b / kSub - 1)) - 1;
    }

    /// A copy of the counts at one moment: merged across contexts, read as quantiles.
    struct Snapshot {
        std::array<uint64_t, kBuckets> counts{};
        uint64_t sum = 0;  ///< of the values recorded (wraps only past 2^64)
        uint64_t max = 0;  ///< the largest value recorded, exactly (0 when none)

        /// Values recorded.
        [[nodiscard]] uint64_t count() const noexcept {
            uint64_t n = 0;
            for (uint64_t c : counts)
                n += c;
            return n;
        }
        [[nodiscard]] double mean() const noexcept {
            const uint64_t n = count();
            return n == 0 ? 0.0 : double(sum) / double(n);
        }
        /// The value at quantile `q` (0 to 1: 0.5 is the median, 0.999 the 99.9th percentile),
        /// as HdrHistogram reports it: the largest value of the bucket that holds the value of
        /// rank ceil(q * count), but never more than the maximum recorded. So it is never below
        /// the true value of that rank and at most one bucket width (3.1%) above it. 0 when no
        /// value was recorded.
        [[nodiscard]] uint64_t quantile(double q) const noexcept {
            const uint64_t n = count();
            if (n == 0) return 0;
            q = std::clamp(q, 0.0, 1.0);
            const auto rank = std::max<uint64_t>(1, uint64_t(std::ceil(q * double(n))));
            uint64_t seen = 0;
            for (std::size_t b = 0; b < kBuckets; ++b) {
                seen += counts[b];
                if (seen >= rank) return std::min(bucket_high(b), max);
            }
            return max;
        }
        /// Add `o`'s counts to these (another context's, another period's).
        void merge(const Snapshot& o) noexcept {
            for (std::size_t b = 0; b < kBuckets; ++b)
                counts[b] += o.counts[b];
            sum += o.sum;
            max = std::max(max, o.max);
        }
    };

    /// Count `v`. From the owning thread only (see the class comment).
    void record(uint64_t v) noexcept {
        bump(counts_[bucket_of(v)], 1);
        bump(sum_, v);
        if (v > max_.load(std::memory_order_relaxed)) max_.store(v, std::memory_order_relaxed);
    }

    /// Count `v` from any thread (several may record at once): atomic adds, nothing lost.
    void record_shared(uint64_t v) noexcept {
        counts_[bucket_of(v)].fetch_add(1, std::memory_order_relaxed);
        sum_.fetch_add(v, std::memory_order_relaxed);
        uint64_t m = max_.load(std::memory_order_relaxed);
        while (v > m && !max_.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
        }
    }

    /// Take back a value record() counted (an answer that was not sent after all); the maximum
    /// stays. Same writer rule as record().
    void remove(uint64_t v) noexcept {
        bump(counts_[bucket_of(v)], uint64_t(-1));
        bump(sum_, uint64_t(0) - v);
    }
    /// The same for record_shared().
    void remove_shared(uint64_t v) noexcept {
        counts_[bucket_of(v)].fetch_sub(1, std::memory_order_relaxed);
        sum_.fetch_sub(v, std::memory_order_relaxed);
    }

    /// The counts now. Any thread.
    [[nodiscard]] Snapshot snapshot() const noexcept {
        Snapshot s;
        for (std::size_t b = 0; b < kBuckets; ++b)
            s.counts[b] = counts_[b].load(std::memory_order_relaxed);
        s.sum = sum_.load(std::memory_order_relaxed);
        s.max = max_.load(std::memory_order_relaxed);
        return s;
    }

  private:
    static void bump(std::atomic<uint64_t>& c, uint64_t n) noexcept {
        c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
    std::array<std::atomic<uint64_t>, kBuckets> counts_{};
    std::atomic<uint64_t> sum_{0};
    std::atomic<uint64_t> max_{0};
};

}  // namespace talaria
