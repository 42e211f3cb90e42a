// Address interning is weak on every transport: an address nobody holds is freed (so neither a
// long-running endpoint nor a peer feeding it ever new names or serialized addresses can grow
// the interned table), while an address somebody holds stays the same Addr, and lookups may race
// with the release of the last reference. One suite, instantiated for every transport in the
// build (ctest names: na/AddrLifetime.<Case>/<transport>); what only one transport does (its
// connections, queued messages, memory handles) stays in tests/na/<transport>/.
#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "harness.hpp"
#include "na/inproc/inproc.hpp"
#include "na/sm/sm_transport.hpp"
#include "na/tcp/tcp.hpp"
#include "talaria/config.hpp"
#if TALARIA_HAVE_UCX
#include "na/ucx/ucx_diag.hpp"
#endif
#include "talaria/config.hpp"
#if TALARIA_HAVE_OFI
#include "na/ofi/ofi.hpp"
#endif

namespace talaria::na::test {
namespace {

/// live_addrs() of the private transport class T behind `t`, or nullopt if `t` is not a T.
template <class T>
std::optional<std::size_t> live_of(Transport& t) {
    auto* p = dynamic_cast<T*>(&t);
    if (p == nullptr) return std::nullopt;
    return p->live_addrs();
}

std::string inproc_peer(int i) {
    return fmt::format("inproc://addr-peer-{}", i);
}
std::string sm_peer(int i) {
    return fmt::format("sm://addr-peer-{}", i);
}
std::string tcp_peer(int i) {
    return fmt::format("tcp://127.0.0.{}:{}", 2 + i % 200, 1 + i);
}
#if TALARIA_HAVE_OFI
std::string ofi_tcp_peer(int i) {
    return fmt::format("ofi+tcp://127.0.0.{}:{}", 2 + i % 200, 1 + i);
}
std::string ofi_shm_peer(int i) {
    return fmt::format("ofi+shm://addr-peer-{}", i);
}
#endif

#if TALARIA_HAVE_UCX
std::string ucx_tcp_peer(int i) {
    return fmt::format("ucx+tcp://127.0.0.{}:{}", 2 + i % 200, 1 + i);
}
/// A well-formed (hex) worker address; nothing is connected by a lookup.
std::string ucx_sm_peer(int i) {
    return fmt::format("ucx+sm://{:016x}", 0x1000 + i);
}
#endif

/// What the suite needs to know about one transport.
struct AddrTraits {
    std::string_view label;                          ///< TransportKind::label
    std::optional<std::size_t> (*live)(Transport&);  ///< its live-address count
    /// true: unused addresses are freed at once, so live == in use exactly. false (sm): they are
    /// freed in batches, when the pinned set doubled since the last sweep (floor 64), so
    /// in use <= live <= 2 * in use + 64.
    bool frees_at_once;
    std::string (*peer)(int i);    ///< the canonical name of a (non-existent) peer number i
    std::string_view peer0_alias;  ///< another spelling of peer(0), or empty if none
};

const AddrTraits kTraits[] = {
    {"inproc", &live_of<inproc::InprocTransport>, true, &inproc_peer, ""},
    {"sm", &live_of<sm::SmTransport>, false, &sm_peer, ""},
    {"tcp", &live_of<tcp::TcpTransport>, true, &tcp_peer, "127.0.0.2:1"},
    {"tcp_ipv6", &live_of<tcp::TcpTransport>, true, &tcp_peer, "127.0.0.2:1"},
#if TALARIA_HAVE_UCX
    {"ucx_tcp", &ucx::live_addrs, true, &ucx_tcp_peer, "127.0.0.2:1"},
    {"ucx_sm", &ucx::live_addrs, true, &ucx_sm_peer, "0000000000001000"},
#endif
#if TALARIA_HAVE_OFI
    {"ofi_tcp", &live_of<ofi::OfiTransport>, true, &ofi_tcp_peer, ""},
    {"ofi_shm", &live_of<ofi::OfiTransport>, true, &ofi_shm_peer, ""},
#endif
};

const AddrTraits* traits_for(std::string_view label) {
    for (const auto& k : kTraits)
        if (k.label == label) return &k;
    return nullptr;
}

/// The largest live count allowed while `in_use` addresses are held.
std::size_t max_live(const AddrTraits& k, std::size_t in_use) {
    return k.frees_at_once ? in_use : 2 * in_use + 64;
}

/// Empty if `live` is allowed while `in_use` addresses are held, else what is wrong.
std::string live_problem(const AddrTraits& k, std::optional<std::size_t> live, std::size_t in_use) {
    if (!live) return fmt::format("{}: the transport is not the expected class", k.label);
    if (*live < in_use || *live > max_live(k, in_use))
        return fmt::format("{}: {} live addresses while {} are in use (allowed: {}..{})", k.label,
                           *live, in_use, in_use, max_live(k, in_use));
    return {};
}

std::vector<std::byte> serialized(Transport& t, const Addr& a) {
    std::vector<std::byte> b(t.addr_serialize_size(a));
    auto n = t.addr_serialize(a, b);
    EXPECT_TRUE(n);
    return b;
}

class AddrLifetime : public ::testing::TestWithParam<TransportKind> {
  protected:
    void SetUp() override {
        k_ = traits_for(GetParam().label);
        ASSERT_NE(k_, nullptr) << "transport '" << GetParam().label
                               << "' has no entry in kTraits (addr_lifetime_test.cpp)";
    }

    /// A transport opened like the conformance suite opens it, or a test failure.
    std::unique_ptr<Transport> open_one() {
        auto r = open(GetParam().address);
        EXPECT_TRUE(r) << r.error().describe();
        if (!r) return nullptr;
        EXPECT_TRUE(k_->live(**r)) << "not the expected transport class";
        return std::move(*r);
    }

    const AddrTraits* k_ = nullptr;
};

TEST_P(AddrLifetime, DistinctAddressesDoNotAccumulate) {
    auto a = open_one();
    auto feeder = open_one();
    ASSERT_TRUE(a && feeder);
    const std::size_t base = k_->live(*a).value_or(0);
    const std::size_t feeder_base = k_->live(*feeder).value_or(0);
    for (int i = 0; i < 10000; ++i) {
        const std::string name = k_->peer(i);
        std::vector<std::byte> blob;
        {
            auto f = feeder->addr_lookup(name);
            ASSERT_TRUE(f) << f.error().describe();
            blob = serialized(*feeder, *f);
        }
        auto d = a->addr_deserialize(blob);
        ASSERT_TRUE(d) << d.error().describe();
        auto l = a->addr_lookup(name);
        ASSERT_TRUE(l) << l.error().describe();
        ASSERT_EQ(*d, *l) << name;  // interned while held
        auto p = live_problem(*k_, k_->live(*a), base + 1);
        ASSERT_TRUE(p.empty()) << p << " (after " << i + 1 << " peers)";
        p = live_problem(*k_, k_->live(*feeder), feeder_base);
        ASSERT_TRUE(p.empty()) << "feeder: " << p << " (after " << i + 1 << " peers)";
    }
    auto p = live_problem(*k_, k_->live(*a), base);
    EXPECT_TRUE(p.empty()) << p;
    p = live_problem(*k_, k_->live(*feeder), feeder_base);
    EXPECT_TRUE(p.empty()) << "feeder: " << p;
}

TEST_P(AddrLifetime, SameAddressWhileHeldAndFreedAfter) {
    auto a = open_one();
    ASSERT_TRUE(a);
    const Addr self = a->addr_self();
    const std::string self_name = a->addr_to_string(self);
    const std::size_t base = k_->live(*a).value_or(0);  // counts self, held above
    const std::string name = k_->peer(0);
    {
        auto x = a->addr_lookup(name);
        ASSERT_TRUE(x) << x.error().describe();
        auto p = live_problem(*k_, k_->live(*a), base + 1);
        EXPECT_TRUE(p.empty()) << p;
        auto y = a->addr_lookup(name);
        ASSERT_TRUE(y);
        EXPECT_EQ(*x, *y);
        if (!k_->peer0_alias.empty()) {
            auto alias = a->addr_lookup(k_->peer0_alias);
            ASSERT_TRUE(alias) << alias.error().describe();
            EXPECT_EQ(*x, *alias) << k_->peer0_alias << " is another spelling of " << name;
        }
        auto z = a->addr_deserialize(serialized(*a, *x));
        ASSERT_TRUE(z) << z.error().describe();
        EXPECT_EQ(*x, *z);
        auto self2 = a->addr_lookup(self_name);
        ASSERT_TRUE(self2) << self2.error().describe();
        EXPECT_EQ(self, *self2);
        // Enough other lookups to run several sweeps where sweeps exist: the held one stays.
        for (int i = 1; i <= 1000; ++i) {
            auto o = a->addr_lookup(k_->peer(i));
            ASSERT_TRUE(o) << o.error().describe();
        }
        auto w = a->addr_lookup(name);
        ASSERT_TRUE(w);
        EXPECT_EQ(*x, *w);
        p = live_problem(*k_, k_->live(*a), base + 1);
        EXPECT_TRUE(p.empty()) << p;
    }
    auto p = live_problem(*k_, k_->live(*a), base);
    EXPECT_TRUE(p.empty()) << p;
    // Looked up again after it was (or may have been) freed: a working address.
    auto again = a->addr_lookup(k_->peer0_alias.empty() ? name : std::string(k_->peer0_alias));
    ASSERT_TRUE(again) << again.error().describe();
    EXPECT_EQ(a->addr_to_string(*again), name);
}

TEST_P(AddrLifetime, ThreadsLookUpAndDropConcurrently) {
    auto a = open_one();
    ASSERT_TRUE(a);
    const std::size_t base = k_->live(*a).value_or(0);
    // Few names, many threads: lookups race with the destruction of the last reference, so a
    // lookup often finds a dying address and must replace it.
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 3000; ++i) {
                const std::string name = k_->peer((i + t) % 5);
                auto x = a->addr_lookup(name);
                auto y = a->addr_lookup(name);
                if (!x || !y || *x != *y || a->addr_to_string(*x) != name) ++mismatches;
            }
        });
    for (auto& th : threads)
        th.join();
    EXPECT_EQ(mismatches.load(), 0);
    auto p = live_problem(*k_, k_->live(*a), base);
    EXPECT_TRUE(p.empty()) << p;
}

std::string kind_name(const ::testing::TestParamInfo<TransportKind>& info) {
    return info.param.label;
}

INSTANTIATE_TEST_SUITE_P(na, AddrLifetime, ::testing::ValuesIn(transport_kinds()), kind_name);

}  // namespace
}  // namespace talaria::na::test
