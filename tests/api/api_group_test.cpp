// Issue 13: groups of ranks (talaria::Group) and the k-nomial trees collective calls travel
// (talaria::KnomialTree).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "api_fixture.hpp"

namespace talaria::api_test {
namespace {

/// ceil(log_k(n)) for n >= 1, in integers.
unsigned ceil_log(uint32_t n, uint32_t k) {
    unsigned d = 0;
    for (uint64_t p = 1; p < n; p *= k)
        ++d;
    return d;
}

TEST(KnomialTree, EveryRankIsReachedOnceWithinCeilLogKHops) {
    for (uint32_t k : {2u, 3u, 4u, 8u}) {
        for (uint32_t size = 1; size <= 70; ++size) {
            for (uint32_t root : {0u, size / 2, size - 1}) {
                const KnomialTree t{size, root, k};
                ASSERT_TRUE(t.check());
                SCOPED_TRACE(::testing::Message()
                             << "k " << k << " size " << size << " root " << root);
                std::vector<int> seen(size, 0);
                std::vector<uint32_t> todo{root};
                seen[root] = 1;
                EXPECT_FALSE(t.parent(root).has_value());
                EXPECT_EQ(t.depth(root), 0u);
                unsigned deepest = 0;
                while (!todo.empty()) {
                    const uint32_t r = todo.back();
                    todo.pop_back();
                    const auto kids = t.children(r);
                    EXPECT_LE(kids.size(), std::size_t(k - 1) * (ceil_log(size, k) + 1));
                    for (uint32_t c : kids) {
                        ASSERT_LT(c, size);
                        ASSERT_EQ(seen[c], 0) << "rank " << c << " reached twice";
                        seen[c] = 1;
                        ASSERT_EQ(t.parent(c), std::optional<uint32_t>(r));
                        ASSERT_EQ(t.depth(c), t.depth(r) + 1);
                        deepest = std::max(deepest, t.depth(c));
                        todo.push_back(c);
                    }
                }
                for (uint32_t r = 0; r < size; ++r)
                    EXPECT_EQ(seen[r], 1) << "rank " << r << " never reached";
                EXPECT_LE(deepest, ceil_log(size, k));
            }
        }
    }
}

TEST(KnomialTree, BinomialChildrenAndSubtrees) {
    const KnomialTree t{8, 0, 2};
    // The largest subtree first: 1 heads the odd ranks (4), 2 heads {2, 6}, 4 is a leaf.
    EXPECT_EQ(t.children(0), (std::vector<uint32_t>{1, 2, 4}));
    EXPECT_EQ(t.children(1), (std::vector<uint32_t>{3, 5}));
    EXPECT_EQ(t.children(2), (std::vector<uint32_t>{6}));
    EXPECT_EQ(t.children(7), std::vector<uint32_t>{});
    EXPECT_EQ(t.subtree(1), (std::vector<uint32_t>{1, 3, 5, 7}));
    EXPECT_EQ(t.subtree(4), (std::vector<uint32_t>{4}));
    EXPECT_EQ(t.parent(7), std::optional<uint32_t>(3));
    EXPECT_EQ(t.parent(6), std::optional<uint32_t>(2));
    EXPECT_EQ(t.depth(7), 3u);
    // Rooted elsewhere, the same shape over relative ranks.
    const KnomialTree r{8, 5, 2};
    EXPECT_EQ(r.children(5), (std::vector<uint32_t>{6, 7, 1}));
    EXPECT_EQ(r.parent(4), std::optional<uint32_t>(0));  // relative 7 -> 3
    // Radix 4 over 16 ranks: two hops at most.
    const KnomialTree q{16, 0, 4};
    EXPECT_EQ(q.children(0), (std::vector<uint32_t>{1, 2, 3, 4, 8, 12}));
    EXPECT_EQ(q.children(1), (std::vector<uint32_t>{5, 9, 13}));
    EXPECT_EQ(q.children(5), std::vector<uint32_t>{});
    EXPECT_EQ(q.depth(15), 2u);
}

TEST(KnomialTree, CheckNamesWhatIsWrong) {
    EXPECT_EQ((KnomialTree{0, 0, 2}.check().code()), Errc::invalid_argument);
    auto root = KnomialTree{4, 4, 2}.check();
    ASSERT_FALSE(root);
    EXPECT_NE(root.error().message().find("root 4"), std::string::npos) << root.error().message();
    auto radix = KnomialTree{4, 0, 1}.check();
    ASSERT_FALSE(radix);
    EXPECT_NE(radix.error().message().find("k = 1"), std::string::npos);
    // A bad tree answers nothing (and does not loop or divide by zero).
    EXPECT_TRUE((KnomialTree{4, 0, 1}.children(0).empty()));
    EXPECT_TRUE((KnomialTree{4, 0, 0}.subtree(0).empty()));
    EXPECT_FALSE((KnomialTree{0, 0, 2}.parent(0).has_value()));
    EXPECT_EQ((KnomialTree{0, 0, 2}.depth(3)), 0u);
}

/// Three servers that answer their own index, and a client.
struct Ranks {
    std::vector<std::unique_ptr<Engine>> servers;
    std::vector<std::string> addresses;
    Engine client{"tcp://127.0.0.1:0"};
    explicit Ranks(int n) {
        for (int i = 0; i < n; ++i) {
            servers.push_back(std::make_unique<Engine>("tcp://127.0.0.1:0", listen));
            servers.back()->define("whoami", [i]() { return i; });
            addresses.push_back(servers.back()->self_address());
        }
    }
};

TEST(Group, RanksAreTheAddressesInOrder) {
    Ranks ranks(3);
    Group g(ranks.client, ranks.addresses);
    EXPECT_EQ(g.size(), 3u);
    EXPECT_EQ(g.version(), 1u);
    EXPECT_EQ(g.members(), (std::vector<uint32_t>{0, 1, 2}));
    EXPECT_FALSE(g.self_rank().has_value()) << "the client is not one of the ranks";
    for (uint32_t r = 0; r < 3; ++r) {
        EXPECT_EQ(g.address(r), ranks.addresses[r]);
        auto who = ranks.client.remote<int()>("whoami").on(g.rank(r));
        EXPECT_EQ(value_within(who()), int(r));
    }
    EXPECT_EQ(g.rank(1), g.rank(1)) << "looked up once";
    // A server's own group knows its rank, by its address or as it is told.
    Group seen_by_1(*ranks.servers[1], ranks.addresses);
    EXPECT_EQ(seen_by_1.self_rank(), std::optional<uint32_t>(1));
    Group told(ranks.client, ranks.addresses, 2);
    EXPECT_EQ(told.self_rank(), std::optional<uint32_t>(2));
    auto past = Group::make(ranks.client, ranks.addresses, 3);
    ASSERT_FALSE(past);
    EXPECT_NE(past.error().message().find("rank 3"), std::string::npos) << past.error().message();
}

TEST(Group, RemovedRanksFailAtOnceAndChangesBumpTheVersion) {
    Ranks ranks(3);
    Group g(ranks.client, ranks.addresses);
    auto v = g.remove(1);
    ASSERT_TRUE(v);
    EXPECT_EQ(*v, 2u);
    EXPECT_EQ(g.version(), 2u);
    EXPECT_FALSE(g.is_member(1));
    EXPECT_EQ(g.members(), (std::vector<uint32_t>{0, 2}));
    auto gone = g.try_rank(1);
    ASSERT_FALSE(gone);
    EXPECT_EQ(gone.code(), Errc::disconnected);
    EXPECT_NE(gone.error().message().find("rank 1"), std::string::npos) << gone.error().message();
    EXPECT_THROW(g.rank(1), Exception);
    EXPECT_EQ(g.remove(1).code(), Errc::invalid_argument) << "removed twice";
    EXPECT_EQ(g.remove(9).code(), Errc::out_of_range);
    EXPECT_EQ(g.try_rank(3).code(), Errc::out_of_range);

    // The same engine joins again under a new number.
    auto added = g.add(ranks.addresses[1]);
    ASSERT_TRUE(added);
    EXPECT_EQ(*added, 3u);
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.size(), 4u);
    auto who = ranks.client.remote<int()>("whoami").on(g.rank(3));
    EXPECT_EQ(value_within(who()), 1);
    EXPECT_EQ(g.add(ranks.addresses[0]).code(), Errc::invalid_argument) << "a member's address";
    EXPECT_EQ(g.add("").code(), Errc::invalid_argument);
}

TEST(Group, BadListsAreRefusedWithTheReason) {
    Engine e("tcp://127.0.0.1:0");
    auto none = Group::make(e, {});
    ASSERT_FALSE(none);
    EXPECT_EQ(none.code(), Errc::invalid_argument);
    auto twice =
        Group::make(e, {"tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001", "tcp://127.0.0.1:7000"});
    ASSERT_FALSE(twice);
    EXPECT_NE(twice.error().message().find("ranks 0 and 2"), std::string::npos)
        << twice.error().message();
    EXPECT_THROW((void)Group(e, {""}), Exception);
    // A rank nobody listens at fails when it is used, naming the rank and its address.
    Group g(e, {"tcp://127.0.0.1:1"});
    auto r = g.try_rank(0);
    if (r) {
        auto call = e.remote<int()>("whoami").on(*r);
        EXPECT_FALSE(result_within(call()));
    } else {
        EXPECT_NE(r.error().message().find("rank 0 at tcp://127.0.0.1:1"), std::string::npos)
            << r.error().message();
    }
}

TEST(Group, FromAFileOfAddresses) {
    Ranks ranks(2);
    const std::string path =
        ::testing::TempDir() + "talaria_group_" + std::to_string(::getpid()) + ".txt";
    {
        std::ofstream f(path);
        f << "# the servers of this job\n\n  " << ranks.addresses[0] << "  \r\n"
          << ranks.addresses[1] << "\n";
    }
    auto g = Group::from_file(ranks.client, path);
    ASSERT_TRUE(g) << g.error().message();
    EXPECT_EQ(g->size(), 2u);
    EXPECT_EQ(g->address(0), ranks.addresses[0]);
    auto who = ranks.client.remote<int()>("whoami").on(g->rank(1));
    EXPECT_EQ(value_within(who()), 1);
    std::remove(path.c_str());

    auto missing = Group::from_file(ranks.client, path);
    ASSERT_FALSE(missing);
    EXPECT_NE(missing.error().message().find(path), std::string::npos);
    {
        std::ofstream f(path);
        f << "# nothing\n";
    }
    auto empty = Group::from_file(ranks.client, path);
    ASSERT_FALSE(empty);
    EXPECT_EQ(empty.code(), Errc::invalid_argument);
    {
        std::ofstream f(path);
        f << "# twice\n"
          << ranks.addresses[0] << "\n"
          << ranks.addresses[1] << "\n\n"
          << ranks.addresses[0] << "\n";
    }
    auto twice = Group::from_file(ranks.client, path);
    ASSERT_FALSE(twice);
    EXPECT_NE(twice.error().message().find(path + ":5:"), std::string::npos)
        << twice.error().message();
    EXPECT_NE(twice.error().message().find("line 2"), std::string::npos) << twice.error().message();
    std::remove(path.c_str());
}

/// N ranks, each with its group and collective "sum": rank r answers 10 r + x.
struct Cluster {
    Ranks ranks;
    std::vector<std::optional<Group>> groups;  // each rank's own view
    explicit Cluster(int n, int throws_at = -1) : ranks(n) {
        for (int i = 0; i < n; ++i) {
            // Each rank told its number (as a launcher would), not found by its address.
            groups.emplace_back(std::in_place, *ranks.servers[std::size_t(i)], ranks.addresses,
                                uint32_t(i));
            groups.back()->define_collective<uint64_t(uint32_t)>(
                "sum",
                [i, throws_at](uint32_t x) -> uint64_t {
                    if (i == throws_at) throw std::runtime_error("rank refuses");
                    return uint64_t(10 * i) + x;
                },
                [](const uint64_t& a, const uint64_t& b) { return a + b; });
        }
    }
    /// Rank `i` dies (its group goes first: a group must not outlive its engine).
    void kill(std::size_t i) {
        groups[i].reset();
        ranks.servers[i].reset();
    }
    static uint64_t expected(const std::vector<int>& answering, uint32_t x) {
        uint64_t s = 0;
        for (int r : answering)
            s += uint64_t(10 * r) + x;
        return s;
    }
};

std::vector<uint32_t> ranks_of(const std::vector<RankFailure>& f) {
    std::vector<uint32_t> out;
    for (const auto& x : f)
        out.push_back(x.rank);
    return out;
}

TEST(Collective, BroadcastReducesOverEveryRank) {
    Cluster c(6);
    Group from_client(c.ranks.client, c.ranks.addresses);
    for (uint32_t k : {2u, 3u, 8u}) {
        CollectiveOptions o;
        o.k = k;
        o.timeout = 10s;
        auto r = value_within(from_client.broadcast<uint64_t(uint32_t)>(o, "sum", 7u));
        ASSERT_TRUE(r.value.has_value()) << "k " << k;
        EXPECT_EQ(*r.value, Cluster::expected({0, 1, 2, 3, 4, 5}, 7)) << "k " << k;
        EXPECT_EQ(r.answered, 6u);
        EXPECT_TRUE(r.failed.empty()) << r.failed.front().message;
    }
    // From a member: it is the root.
    auto r = value_within(c.groups[3]->broadcast<uint64_t(uint32_t)>("sum", 1u));
    EXPECT_EQ(r.value, std::optional<uint64_t>(Cluster::expected({0, 1, 2, 3, 4, 5}, 1)));
    EXPECT_EQ(r.answered, 6u);
}

TEST(Collective, ADeadRankIsNamedWithItsSubtreeAndTheOthersAnswer) {
    Cluster c(6);
    Group from_client(c.ranks.client, c.ranks.addresses);
    CollectiveOptions o;
    o.timeout = 3s;  // a dead rank is noticed at once; this only bounds a failure of the test
    // Binomial from rank 0: 0 -> 1, 2, 4 and 1 -> 3, 5: rank 5 is a leaf under 1, and 1 heads
    // {1, 3, 5}.
    ASSERT_EQ((KnomialTree{6, 0, 2}.subtree(1)), (std::vector<uint32_t>{1, 3, 5}));
    c.kill(5);  // a leaf dies
    auto leaf = value_within(from_client.broadcast<uint64_t(uint32_t)>(o, "sum", 2u));
    ASSERT_EQ(ranks_of(leaf.failed), (std::vector<uint32_t>{5}));
    EXPECT_EQ(leaf.answered, 5u);
    EXPECT_EQ(leaf.value, std::optional<uint64_t>(Cluster::expected({0, 1, 2, 3, 4}, 2)));
    EXPECT_NE(leaf.failed[0].message.find("rank 5"), std::string::npos) << leaf.failed[0].message;

    c.kill(1);  // a rank that sends on dies: its subtree is not reached
    auto mid = value_within(from_client.broadcast<uint64_t(uint32_t)>(o, "sum", 2u));
    ASSERT_EQ(ranks_of(mid.failed), (std::vector<uint32_t>{1, 3, 5}));
    EXPECT_EQ(mid.answered, 3u);
    EXPECT_EQ(mid.value, std::optional<uint64_t>(Cluster::expected({0, 2, 4}, 2)));
    for (const auto& f : mid.failed)
        EXPECT_NE(f.message.find("rank 1"), std::string::npos) << f.message;
}

TEST(Collective, AThrowingHandlerNamesOnlyItsRank) {
    Cluster c(5, /*throws_at=*/1);
    Group from_client(c.ranks.client, c.ranks.addresses);
    auto r = value_within(from_client.broadcast<uint64_t(uint32_t)>("sum", 0u));
    ASSERT_EQ(r.failed.size(), 1u);
    EXPECT_EQ(r.failed[0].rank, 1u);
    EXPECT_EQ(r.failed[0].code, Errc::internal);
    EXPECT_NE(r.failed[0].message.find("rank refuses"), std::string::npos) << r.failed[0].message;
    EXPECT_EQ(r.answered, 4u) << "rank 1's subtree still answered";
    EXPECT_EQ(r.value, std::optional<uint64_t>(Cluster::expected({0, 2, 3, 4}, 0)));
}

TEST(Collective, ARankAtAnotherVersionRefusesAndIsNamed) {
    Cluster c(4);
    Group from_client(c.ranks.client, c.ranks.addresses);
    // Rank 2 alone has seen rank 3 leave and come back: version 3, the others 1.
    ASSERT_TRUE(c.groups[2]->remove(3));
    ASSERT_TRUE(c.groups[2]->add(c.ranks.addresses[3]));
    auto r = value_within(from_client.broadcast<uint64_t(uint32_t)>("sum", 0u));
    // Binomial from 0: 0 -> 1, 2; 1 -> 3. Rank 2 refuses; 3 is below 1 and answers.
    ASSERT_EQ(ranks_of(r.failed), (std::vector<uint32_t>{2}));
    EXPECT_EQ(r.failed[0].code, Errc::invalid_state);
    EXPECT_NE(r.failed[0].message.find("version 3"), std::string::npos) << r.failed[0].message;
    EXPECT_EQ(r.answered, 3u);
    // The root refusing fails the whole call.
    Group stale(c.ranks.client, c.ranks.addresses);
    ASSERT_TRUE(stale.remove(3));
    auto refused = result_within(stale.broadcast<uint64_t(uint32_t)>("sum", 0u));
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.code(), Errc::invalid_state);
}

TEST(Collective, ARankAtTheSameVersionWithOtherMembersRefusesAndIsNamed) {
    Cluster c(4);
    // Each side removed a different rank: both at version 2, with other members.
    ASSERT_TRUE(c.groups[0]->remove(3));
    ASSERT_TRUE(c.groups[1]->remove(2));
    ASSERT_EQ(c.groups[0]->version(), c.groups[1]->version());
    auto r = value_within(c.groups[0]->broadcast<uint64_t(uint32_t)>("sum", 0u));
    ASSERT_FALSE(r.failed.empty());
    EXPECT_EQ(r.failed[0].rank, 1u);
    EXPECT_EQ(r.failed[0].code, Errc::invalid_state);
    EXPECT_NE(r.failed[0].message.find("other members"), std::string::npos) << r.failed[0].message;
}

TEST(Collective, ARankWithOtherTypesRefusesAndIsNamed) {
    Ranks ranks(3);
    std::vector<Group> groups;
    for (uint32_t i = 0; i < 3; ++i) {
        groups.emplace_back(*ranks.servers[i], ranks.addresses, i);
        if (i == 2)  // the same name, another result type
            groups.back().define_collective<uint32_t(uint32_t)>(
                "sum", [](uint32_t x) { return x; },
                [](const uint32_t& a, const uint32_t& b) { return a + b; });
        else
            groups.back().define_collective<uint64_t(uint32_t)>(
                "sum", [](uint32_t x) { return uint64_t(x); },
                [](const uint64_t& a, const uint64_t& b) { return a + b; });
    }
    Group from_client(ranks.client, ranks.addresses);
    auto r = value_within(from_client.broadcast<uint64_t(uint32_t)>("sum", 5u));
    ASSERT_EQ(ranks_of(r.failed), (std::vector<uint32_t>{2}));
    EXPECT_EQ(r.failed[0].code, Errc::invalid_argument);
    EXPECT_NE(r.failed[0].message.find("other argument or result types"), std::string::npos)
        << r.failed[0].message;
    EXPECT_EQ(r.value, std::optional<uint64_t>(10));
    groups.clear();
}

TEST(Collective, RemovedRanksAreLeftOutOfTheTree) {
    Cluster c(5);
    for (auto& g : c.groups)
        ASSERT_TRUE(g->remove(2));
    c.kill(2);
    Group from_client(c.ranks.client, c.ranks.addresses);
    ASSERT_TRUE(from_client.remove(2));
    auto r = value_within(from_client.broadcast<uint64_t(uint32_t)>("sum", 0u));
    EXPECT_TRUE(r.failed.empty()) << r.failed.front().message;
    EXPECT_EQ(r.answered, 4u);
    EXPECT_EQ(r.value, std::optional<uint64_t>(Cluster::expected({0, 1, 3, 4}, 0)));
}

TEST(Collective, EveryRankPullsABulkHandleInTheArguments) {
    Cluster c(6);
    // The caller's buffer, bound to its engine: whichever rank decodes the handle, however far
    // down the tree, pulls from the caller, not from the rank that forwarded the call.
    std::vector<uint8_t> data(256 * 1024);
    for (std::size_t i = 0; i < data.size(); ++i)
        data[i] = uint8_t(i * 7 + i / 251);
    uint64_t sum = 0;
    for (uint8_t b : data)
        sum += b;
    for (std::size_t i = 0; i < 6; ++i) {
        Engine* e = c.ranks.servers[i].get();
        c.groups[i]->define_collective<uint32_t(Bulk, uint64_t)>(
            "pull",
            [e](const Bulk& remote, uint64_t want) -> uint32_t {
                std::vector<uint8_t> got(remote.size());
                auto local = e->expose(std::span<uint8_t>(got), write_only);
                // A handler may block on a transfer: transfers complete on their own thread.
                e->pull(remote, 0, local, 0, got.size()).get();
                uint64_t s = 0;
                for (uint8_t b : got)
                    s += b;
                if (s != want) throw std::runtime_error("pulled bytes differ");
                return 1;
            },
            [](const uint32_t& a, const uint32_t& b) { return a + b; });
    }
    Engine owner("tcp://127.0.0.1:0", listen);
    Group from_owner(owner, c.ranks.addresses);
    auto handle = owner.expose(Segment{data.data(), data.size()}, read_only, bind_owner);
    for (uint32_t k : {2u, 3u}) {
        CollectiveOptions o;
        o.k = k;
        o.timeout = 20s;
        auto r =
            value_within(from_owner.broadcast<uint32_t(Bulk, uint64_t)>(o, "pull", handle, sum));
        EXPECT_TRUE(r.failed.empty()) << r.failed.front().message;
        EXPECT_EQ(r.value, std::optional<uint32_t>(6)) << "k " << k;
    }
}

TEST(Collective, AMembersBroadcastRunsItsOwnPartHereAlsoOnAManualEngine) {
    // Rank 0 progresses only while a thread waits on it (manual); the others in the background.
    std::vector<std::unique_ptr<Engine>> engines;
    std::vector<std::string> addresses;
    for (int i = 0; i < 4; ++i) {
        EngineOptions o;
        if (i == 0) o.progress = ProgressMode::manual;
        engines.push_back(std::make_unique<Engine>("tcp://127.0.0.1:0", listen, o));
        addresses.push_back(engines.back()->self_address());
    }
    std::vector<std::optional<Group>> groups;
    for (uint32_t i = 0; i < 4; ++i) {
        groups.emplace_back(std::in_place, *engines[i], addresses, i);
        groups.back()->define_collective<uint64_t(uint32_t)>(
            "sum", [i](uint32_t x) -> uint64_t { return uint64_t(10 * i) + x; },
            [](const uint64_t& a, const uint64_t& b) { return a + b; });
    }
    const uint64_t received = engines[0]->counters().rpcs_received;
    for (uint32_t k : {2u, 3u}) {
        CollectiveOptions o;
        o.k = k;
        o.timeout = 10s;
        auto r = value_within(groups[0]->broadcast<uint64_t(uint32_t)>(o, "sum", 5u));
        EXPECT_TRUE(r.failed.empty()) << r.failed.front().message;
        EXPECT_EQ(r.answered, 4u);
        EXPECT_EQ(r.value, std::optional<uint64_t>(Cluster::expected({0, 1, 2, 3}, 5)));
    }
    // The caller is the root: its part ran in this process, not through a call to itself.
    EXPECT_EQ(engines[0]->counters().rpcs_received, received);
    // With other types than those defined here, the caller calls the root as any caller does,
    // and is refused by it.
    auto refused = result_within(groups[0]->broadcast<uint64_t(uint64_t)>("sum", uint64_t{5}));
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message().find("talaria.collective.sum"), std::string::npos)
        << refused.error().message();
    groups.clear();
}

TEST(Collective, OtherCppTypesThatEncodeAlikeGoThroughTheTransport) {
    // int64_t and long long are both i64 on the wire (one signature hash) but other C++ types:
    // a member's broadcast with the one cannot run the part defined with the other here, and
    // calls its own rank instead, which decodes the arguments as its handler takes them.
    static_assert(!std::is_same_v<int64_t, long long> || !std::is_same_v<int64_t, long>);
    using Other = std::conditional_t<std::is_same_v<int64_t, long long>, long, long long>;
    Ranks ranks(3);
    std::vector<std::optional<Group>> groups;
    for (uint32_t i = 0; i < 3; ++i) {
        groups.emplace_back(std::in_place, *ranks.servers[i], ranks.addresses, i);
        groups.back()->define_collective<int64_t(int64_t)>(
            "neg", [i](int64_t x) -> int64_t { return x - int64_t(i); },
            [](const int64_t& a, const int64_t& b) { return a + b; });
    }
    const uint64_t received = ranks.servers[0]->counters().rpcs_received;
    auto r = value_within(groups[0]->broadcast<Other(Other)>("neg", Other{10}));
    EXPECT_EQ(r.value, std::optional<Other>(30 - 0 - 1 - 2));
    EXPECT_TRUE(r.failed.empty()) << r.failed.front().message;
    EXPECT_GT(ranks.servers[0]->counters().rpcs_received, received) << "it called its own rank";
    groups.clear();
}

/// Whether `pred` turns true within `d` (polled every millisecond).
template <class P>
bool within(Duration d, P pred) {
    const auto until = Clock::now() + d;
    while (!pred()) {
        if (Clock::now() >= until) return false;
        std::this_thread::sleep_for(1ms);
    }
    return true;
}

TEST(Collective, CancelingTheCallCancelsTheWholeTree) {
    // Binomial from rank 0: 0 -> 1, 2 and 1 -> 3. Rank 3's handler hangs (until released), so
    // rank 1 waits on its call to 3, and rank 0 on its call to 1, for most of the 30 s timeout
    // unless the cancel travels down the tree.
    Ranks ranks(4);
    std::atomic<bool> started{false};
    std::atomic<bool> release{false};
    std::atomic<int> returned{0};  // rank 3's handlers that returned
    std::vector<std::optional<Group>> groups;
    for (uint32_t i = 0; i < 4; ++i) {
        groups.emplace_back(std::in_place, *ranks.servers[i], ranks.addresses, i);
        groups.back()->define_collective<uint32_t()>(
            "hang",
            [i, &started, &release, &returned]() -> uint32_t {
                if (i == 3) {
                    started = true;
                    // Bounded, so that a broken test fails instead of hanging.
                    const auto until = Clock::now() + 20s;
                    while (!release && Clock::now() < until)
                        std::this_thread::sleep_for(1ms);
                    ++returned;
                }
                return 1;
            },
            [](const uint32_t& a, const uint32_t& b) { return a + b; });
    }
    auto in_flight = [&](uint32_t r) { return ranks.servers[r]->counters().in_flight; };
    auto canceled = [&](uint32_t r) { return ranks.servers[r]->counters().canceled; };
    // From a caller outside the group (the root is rank 0), then from rank 0 itself (the root's
    // part runs in the caller's process: the cancel reaches it there).
    Group from_client(ranks.client, ranks.addresses);
    for (Group* caller : {&from_client, &*groups[0]}) {
        started = false;
        release = false;
        const uint64_t canceled_0 = canceled(0), canceled_1 = canceled(1);
        CollectiveOptions o;
        o.timeout = 30s;
        auto fut = caller->broadcast<uint32_t()>(o, "hang");
        ASSERT_TRUE(within(10s, [&] { return started.load(); }));
        ASSERT_TRUE(within(10s, [&] { return in_flight(1) == 1; }))
            << "rank 1 waits on its call to rank 3";
        EXPECT_TRUE(fut.cancel());
        auto r = result_within(std::move(fut));
        ASSERT_FALSE(r);
        EXPECT_EQ(r.code(), Errc::canceled);
        // Rank 0 cancels its call to rank 1; rank 1 hears of it and cancels its call to 3. (A
        // cancel counts itself just after it frees the call: both are waited for.)
        EXPECT_TRUE(within(5s,
                           [&] {
                               return in_flight(1) == 0 && in_flight(0) == 0 &&
                                      canceled(0) > canceled_0 && canceled(1) > canceled_1;
                           }))
            << "rank 0 has " << in_flight(0) << " calls in flight, rank 1 " << in_flight(1);
        EXPECT_EQ(canceled(1), canceled_1 + 1) << "rank 1 canceled its call to rank 3";
        const int before = returned;
        release = true;  // rank 3 finishes; its answer is dropped
        ASSERT_TRUE(within(10s, [&] { return returned > before; }));
    }
    // The tree still works after it.
    auto r = value_within(from_client.broadcast<uint32_t()>("hang"));
    EXPECT_EQ(r.value, std::optional<uint32_t>(4));
    EXPECT_TRUE(r.failed.empty()) << r.failed.front().message;
}

// --- joins through a member ----------------------------------------------------------------------

/// A membership as the join protocol's wire has it (src/api/group_join.cpp), for a test client.
struct WireMembership {
    uint64_t version = 0;
    std::vector<std::string> addresses;
    std::vector<uint64_t> removed_in;
    uint32_t rank = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(version, addresses, removed_in, rank);
    }
};

TEST(Join, ARankJoinsThroughAnyMemberAndEveryMemberLearnsIt) {
    Cluster c(3);
    for (auto& g : c.groups)
        ASSERT_TRUE(g->accept_joins());
    auto sum = [](const uint64_t& a, const uint64_t& b) { return a + b; };
    // Through rank 2, which passes it on to the coordinator, rank 0.
    Engine e3("tcp://127.0.0.1:0", listen);
    auto g3 = Group::join(e3, c.ranks.addresses[2]);
    ASSERT_TRUE(g3) << g3.error().message();
    EXPECT_EQ(g3->self_rank(), std::optional<uint32_t>(3));
    EXPECT_EQ(g3->version(), 2u);
    ASSERT_EQ(g3->size(), 4u);
    for (uint32_t r = 0; r < 3; ++r)
        EXPECT_EQ(g3->address(r), c.ranks.addresses[r]);
    for (auto& g : c.groups) {
        EXPECT_EQ(g->version(), 2u) << "every member was told before the join answered";
        ASSERT_EQ(g->size(), 4u);
        EXPECT_EQ(g->address(3), e3.self_address());
    }
    // The new rank takes part in collectives, from any caller.
    g3->define_collective<uint64_t(uint32_t)>(
        "sum", [](uint32_t x) -> uint64_t { return 30 + x; }, sum);
    for (Group* from : {&*c.groups[1], &*g3}) {
        auto r = value_within(from->broadcast<uint64_t(uint32_t)>("sum", 1u));
        EXPECT_TRUE(r.failed.empty()) << r.failed.front().message;
        EXPECT_EQ(r.answered, 4u);
        EXPECT_EQ(r.value, std::optional<uint64_t>(Cluster::expected({0, 1, 2, 3}, 1)));
    }

    // A fifth through the rank that just joined (it accepts joins too).
    Engine e4("tcp://127.0.0.1:0", listen);
    auto g4 = Group::join(e4, e3.self_address());
    ASSERT_TRUE(g4) << g4.error().message();
    EXPECT_EQ(g4->self_rank(), std::optional<uint32_t>(4));
    EXPECT_EQ(g4->version(), 3u);
    EXPECT_EQ(g3->version(), 3u);
    for (auto& g : c.groups)
        EXPECT_EQ(g->version(), 3u);

    // A join of an address that is a member already (a retried join) answers its rank and
    // adds none.
    auto again = result_within(
        c.ranks.client.remote<WireMembership(std::string, uint32_t)>("talaria.group.talaria.join")
            .on(c.ranks.client.lookup(c.ranks.addresses[1]))(e4.self_address(), 0u));
    ASSERT_TRUE(again) << again.error().message();
    EXPECT_EQ(again->rank, 4u);
    EXPECT_EQ(again->version, 3u);
    EXPECT_EQ(again->addresses.size(), 5u);
    EXPECT_EQ(c.groups[0]->size(), 5u);

    // A removed rank stays removed for those who join after.
    for (auto& g : c.groups)
        ASSERT_TRUE(g->remove(2));
    ASSERT_TRUE(g3->remove(2));
    ASSERT_TRUE(g4->remove(2));
    Engine e5("tcp://127.0.0.1:0", listen);
    auto g5 = Group::join(e5, c.ranks.addresses[0]);
    ASSERT_TRUE(g5) << g5.error().message();
    EXPECT_EQ(g5->self_rank(), std::optional<uint32_t>(5));
    EXPECT_EQ(g5->members(), (std::vector<uint32_t>{0, 1, 3, 4, 5}));
    EXPECT_EQ(g5->version(), g4->version());
    EXPECT_EQ(g4->members(), g5->members());
}

TEST(Join, JoinsAtOnceThroughSeveralSeedsGetRanksOfTheirOwn) {
    Cluster c(3);
    for (auto& g : c.groups)
        ASSERT_TRUE(g->accept_joins());
    constexpr int kJoiners = 6;
    std::vector<std::unique_ptr<Engine>> engines;
    for (int i = 0; i < kJoiners; ++i)
        engines.push_back(std::make_unique<Engine>("tcp://127.0.0.1:0", listen));
    std::vector<std::optional<Group>> joined(kJoiners);
    std::vector<std::string> errors(kJoiners);
    {
        std::vector<std::thread> threads;
        for (int i = 0; i < kJoiners; ++i)
            threads.emplace_back([&, i] {
                auto g =
                    Group::join(*engines[std::size_t(i)], c.ranks.addresses[std::size_t(i % 3)]);
                if (g)
                    joined[std::size_t(i)].emplace(std::move(*g));
                else
                    errors[std::size_t(i)] = g.error().message();
            });
        for (auto& t : threads)
            t.join();
    }
    std::set<uint32_t> ranks;
    for (int i = 0; i < kJoiners; ++i) {
        ASSERT_TRUE(joined[std::size_t(i)]) << errors[std::size_t(i)];
        ranks.insert(*joined[std::size_t(i)]->self_rank());
    }
    EXPECT_EQ(ranks, (std::set<uint32_t>{3, 4, 5, 6, 7, 8}));
    // Every rank ends at the last version, with the same members at the same addresses.
    std::vector<Group*> all;
    for (auto& g : c.groups)
        all.push_back(&*g);
    for (auto& g : joined)
        all.push_back(&*g);
    for (Group* g : all) {
        EXPECT_EQ(g->version(), 1u + kJoiners);
        ASSERT_EQ(g->size(), 3u + kJoiners);
        for (int i = 0; i < kJoiners; ++i)
            EXPECT_EQ(g->address(*joined[std::size_t(i)]->self_rank()),
                      engines[std::size_t(i)]->self_address());
    }
    joined.clear();  // the groups go before their engines
}

TEST(Join, BadJoinsAndUpdatesAreRefusedWithTheReason) {
    Cluster c(2);
    Engine joiner("tcp://127.0.0.1:0", listen);
    auto empty = Group::join(joiner, "");
    ASSERT_FALSE(empty);
    EXPECT_EQ(empty.code(), Errc::invalid_argument);
    Engine client_only("tcp://127.0.0.1:0");  // the members could not call it
    auto deaf = Group::join(client_only, c.ranks.addresses[0]);
    ASSERT_FALSE(deaf);
    EXPECT_EQ(deaf.code(), Errc::invalid_argument);
    EXPECT_NE(deaf.error().message().find("listen"), std::string::npos) << deaf.error().message();
    // A seed that does not accept joins: not_found, with the remedy.
    auto closed = Group::join(joiner, c.ranks.addresses[0]);
    ASSERT_FALSE(closed);
    EXPECT_EQ(closed.code(), Errc::not_found);
    EXPECT_NE(closed.error().message().find("accept_joins"), std::string::npos)
        << closed.error().message();
    EXPECT_NE(closed.error().message().find(c.ranks.addresses[0]), std::string::npos)
        << closed.error().message();
    // A seed nobody listens at.
    auto nobody = Group::join(joiner, "tcp://127.0.0.1:1", "talaria", 3s);
    ASSERT_FALSE(nobody);
    EXPECT_NE(nobody.error().message().find("tcp://127.0.0.1:1"), std::string::npos)
        << nobody.error().message();

    ASSERT_TRUE(c.groups[0]->accept_joins());
    ASSERT_TRUE(c.groups[1]->accept_joins());
    EXPECT_EQ(c.groups[0]->accept_joins().code(), Errc::invalid_state) << "twice";
    Group outsider(c.ranks.client, c.ranks.addresses);
    EXPECT_EQ(outsider.accept_joins().code(), Errc::invalid_state) << "not a member";

    // Updates a rank must refuse: each leaves its membership as it was.
    auto update = c.ranks.client.remote<uint64_t(WireMembership)>("talaria.group.talaria.update")
                      .on(c.ranks.client.lookup(c.ranks.addresses[1]));
    const std::vector<std::string> a = c.ranks.addresses;
    const std::vector<std::pair<WireMembership, std::string>> bad = {
        {{5, {a[0]}, {0}, 0}, "never renumbered"},                                   // fewer ranks
        {{5, {a[1], a[0]}, {0, 0}, 0}, "never renumbered"},                          // renumbered
        {{1, {a[0], a[1], "tcp://127.0.0.1:9"}, {0, 0, 0}, 0}, "with other ranks"},  // same version
        {{5, {a[0], a[1], "x"}, {0, 0}, 0}, "removal versions"},                     // sizes differ
        {{5, {a[0], a[1], a[1]}, {0, 0, 0}, 0}, "two members"},  // an address twice
        {{5, {a[0], a[1], ""}, {0, 0, 0}, 0}, "empty"},          // an empty address
        {{5, {a[0], a[1]}, {0, 9}, 0}, "after the membership"},  // removed in the future
        {{1000, {a[0], a[1], "tcp://127.0.0.1:9"}, {0, 0, 0}, 0}, "versions ahead"},  // a jump
    };
    for (const auto& [m, why] : bad) {
        auto r = result_within(update(m));
        ASSERT_FALSE(r) << why;
        EXPECT_NE(r.error().message().find(why), std::string::npos) << r.error().message();
    }
    EXPECT_EQ(c.groups[1]->version(), 1u);
    EXPECT_EQ(c.groups[1]->size(), 2u);
    // Told again, or told late of a membership it has passed: answered, nothing changes.
    auto same = result_within(update(WireMembership{1, {a[0], a[1]}, {0, 0}, 0}));
    ASSERT_TRUE(same) << same.error().message();
    EXPECT_EQ(*same, 1u);
    // A removed rank does not come back.
    ASSERT_TRUE(c.groups[1]->remove(0));
    auto late = result_within(update(WireMembership{1, {a[0], a[1]}, {0, 0}, 0}));
    ASSERT_TRUE(late) << "an older membership this one holds: " << late.error().message();
    EXPECT_EQ(*late, 2u);
    auto back = result_within(update(WireMembership{3, {a[0], a[1]}, {0, 0}, 0}));
    ASSERT_FALSE(back);
    EXPECT_NE(back.error().message().find("does not come back"), std::string::npos)
        << back.error().message();
    EXPECT_EQ(c.groups[1]->members(), (std::vector<uint32_t>{1}));
}

TEST(Join, AJoinThatAMemberRefusesFailsNamingItAndTheRemedy) {
    Cluster c(3);
    for (auto& g : c.groups)
        ASSERT_TRUE(g->accept_joins());
    // Rank 2 removed rank 1 on its own: it is at version 2 with other members than the
    // coordinator's next version.
    ASSERT_TRUE(c.groups[2]->remove(1));
    Engine joiner("tcp://127.0.0.1:0", listen);
    auto g = Group::join(joiner, c.ranks.addresses[0]);
    ASSERT_FALSE(g);
    EXPECT_EQ(g.code(), Errc::invalid_state);
    const std::string& m = g.error().message();
    EXPECT_NE(m.find("rank 2:"), std::string::npos) << m;
    EXPECT_NE(m.find("Join again"), std::string::npos) << m;
    EXPECT_EQ(m.find("rank 1:"), std::string::npos) << "rank 1 took it: " << m;
    EXPECT_EQ(c.groups[1]->version(), 2u);
    EXPECT_EQ(c.groups[1]->size(), 4u);
}

// --- failure detection (SWIM) -------------------------------------------------------------------

/// What ranks saw of each other: (observer, rank, state), in order.
struct Seen {
    std::mutex mu;
    std::vector<std::tuple<uint32_t, uint32_t, RankState>> events;
    Clock::time_point first_dead{};
    void add(uint32_t observer, uint32_t rank, RankState s) {
        std::lock_guard g(mu);
        events.emplace_back(observer, rank, s);
    }
    std::size_t count(uint32_t rank, RankState s) {
        std::lock_guard g(mu);
        std::set<uint32_t> observers;
        for (auto& [o, r, st] : events)
            if (r == rank && st == s) observers.insert(o);
        return observers.size();
    }
    /// Ranks other than `dead` declared dead (false positives). A suspicion of a live rank
    /// on a loaded machine is not one: the rank refutes it, as SWIM means it to.
    std::size_t live_declared_dead(uint32_t dead) {
        std::lock_guard g(mu);
        return std::size_t(std::count_if(events.begin(), events.end(), [dead](const auto& e) {
            return std::get<1>(e) != dead && std::get<2>(e) == RankState::dead;
        }));
    }
};

FailureDetection fast_detection() {
    FailureDetection fd;
    fd.period = 50ms;
    fd.suspicion = 300ms;
    return fd;
}

TEST(FailureDetection, ADeadRankIsDeclaredDeadByEverySurvivorWithinTheBound) {
    Cluster c(5);
    Seen seen;
    for (uint32_t i = 0; i < 5; ++i) {
        c.groups[i]->on_rank_state(
            [&seen, i](uint32_t rank, RankState s) { seen.add(i, rank, s); });
        ASSERT_TRUE(c.groups[i]->start_failure_detection(fast_detection()));
    }
    std::this_thread::sleep_for(600ms);  // every rank probed several times
    EXPECT_EQ(seen.live_declared_dead(99), 0u) << "a live rank was declared dead";

    const auto t0 = Clock::now();
    c.kill(2);
    // Probed within a round (4 periods at most), suspected, declared dead after the suspicion
    // time, and the news spread: well under 2 s with a 50 ms period and 300 ms suspicion.
    while (seen.count(2, RankState::dead) < 4 && Clock::now() - t0 < 5s)
        std::this_thread::sleep_for(10ms);
    const auto took = Clock::now() - t0;
    EXPECT_EQ(seen.count(2, RankState::dead), 4u) << "every survivor learns it";
    EXPECT_LT(took, 2s) << "detection took "
                        << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                        << " ms";
    EXPECT_EQ(seen.live_declared_dead(2), 0u) << "a live rank was declared dead";
    for (uint32_t i : {0u, 1u, 3u, 4u}) {
        EXPECT_EQ(c.groups[i]->rank_state(2), RankState::dead);
        auto ep = c.groups[i]->try_rank(2);
        ASSERT_FALSE(ep);
        EXPECT_EQ(ep.code(), Errc::disconnected);
        EXPECT_NE(ep.error().message().find("declared dead"), std::string::npos)
            << ep.error().message();
    }
    // A collective names it at once, and the others answer.
    auto r = value_within(c.groups[0]->broadcast<uint64_t(uint32_t)>("sum", 0u));
    EXPECT_EQ(r.answered, 4u);
    ASSERT_EQ(ranks_of(r.failed), (std::vector<uint32_t>{2}));
    EXPECT_NE(r.failed[0].message.find("declared dead"), std::string::npos) << r.failed[0].message;
}

/// The detector's messages as the wire has them (src/api/swim.hpp), for a test client.
struct WireUpdate {
    uint32_t rank = 0;
    uint8_t state = 0;
    uint64_t incarnation = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(rank, state, incarnation);
    }
};
struct WireMessage {
    uint32_t from = 0;
    uint32_t target = 0;
    std::vector<WireUpdate> updates;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(from, target, updates);
    }
};

TEST(FailureDetection, ASuspectRankRefutesAndBadGossipIsIgnored) {
    Cluster c(3);
    FailureDetection slow;  // probes rarely: this test speaks for rank 0 itself
    slow.period = 5s;
    slow.suspicion = 10s;
    for (auto& g : c.groups)
        ASSERT_TRUE(g->start_failure_detection(slow));
    auto ping = c.ranks.client.remote<WireMessage(WireMessage)>("talaria.swim.talaria.ping")
                    .on(c.ranks.client.lookup(c.ranks.addresses[1]));
    // Rank 1 hears it is suspect at incarnation 0: it answers alive at incarnation 1.
    auto a = value_within(ping(WireMessage{0, 1, {{1, uint8_t(RankState::suspect), 0}}}));
    EXPECT_EQ(a.from, 1u);
    bool refuted = false;
    for (const auto& u : a.updates)
        refuted |= u.rank == 1 && u.state == uint8_t(RankState::alive) && u.incarnation == 1;
    EXPECT_TRUE(refuted) << "rank 1 refutes with incarnation 1";
    // Gossip about rank 2: suspect at incarnation 5, then alive at 6 clears it.
    (void)value_within(ping(WireMessage{0, 1, {{2, uint8_t(RankState::suspect), 5}}}));
    EXPECT_EQ(c.groups[1]->rank_state(2), RankState::suspect);
    (void)value_within(ping(WireMessage{0, 1, {{2, uint8_t(RankState::alive), 5}}}));
    EXPECT_EQ(c.groups[1]->rank_state(2), RankState::suspect) << "alive needs a newer one";
    (void)value_within(ping(WireMessage{0, 1, {{2, uint8_t(RankState::alive), 6}}}));
    EXPECT_EQ(c.groups[1]->rank_state(2), RankState::alive);
    // Garbage: ranks past the group, states past dead, more updates than are read.
    WireMessage junk{0, 1, {}};
    for (uint32_t i = 0; i < 200; ++i)
        junk.updates.push_back({1000 + i, uint8_t(3 + i % 200), ~uint64_t(0)});
    (void)value_within(ping(junk));
    for (uint32_t r = 0; r < 3; ++r)
        EXPECT_EQ(c.groups[1]->rank_state(r), RankState::alive);
    // A ping meant for another rank is refused, naming both.
    auto wrong = result_within(ping(WireMessage{0, 2, {}}));
    ASSERT_FALSE(wrong);
    EXPECT_EQ(wrong.code(), Errc::invalid_argument);
    EXPECT_NE(wrong.error().message().find("rank 2 reached rank 1"), std::string::npos)
        << wrong.error().message();
}

TEST(FailureDetection, BadOptionsAndSecondStartsAreRefused) {
    Cluster c(2);
    auto bad = [&](auto change) {
        FailureDetection fd;
        change(fd);
        auto r = c.groups[0]->start_failure_detection(fd);
        EXPECT_FALSE(r);
        return r ? Errc::ok : r.code();
    };
    EXPECT_EQ(bad([](FailureDetection& f) { f.period = 0ms; }), Errc::invalid_argument);
    EXPECT_EQ(bad([](FailureDetection& f) { f.ping_timeout = 1s; }), Errc::invalid_argument);
    EXPECT_EQ(bad([](FailureDetection& f) { f.suspicion = 10ms; }), Errc::invalid_argument);
    EXPECT_EQ(bad([](FailureDetection& f) { f.indirect = 17; }), Errc::invalid_argument);
    EXPECT_EQ(bad([](FailureDetection& f) { f.name.clear(); }), Errc::invalid_argument);
    ASSERT_TRUE(c.groups[0]->start_failure_detection());
    EXPECT_EQ(c.groups[0]->start_failure_detection().code(), Errc::invalid_state);
    // Another group of the same engine under the same name.
    Group other(*c.ranks.servers[0], c.ranks.addresses, 0);
    EXPECT_EQ(other.start_failure_detection().code(), Errc::already_exists);
    FailureDetection named;
    named.name = "other";
    EXPECT_TRUE(other.start_failure_detection(named));
    // Not a member: nothing to detect from.
    Group outside(c.ranks.client, c.ranks.addresses);
    EXPECT_EQ(outside.start_failure_detection().code(), Errc::invalid_state);
    // Stopped and started again.
    c.groups[0]->stop_failure_detection();
    EXPECT_TRUE(c.groups[0]->start_failure_detection());
}

// --- gather and barrier ---------------------------------------------------------------------

TEST(Gather, EveryMembersValueInRankOrder) {
    Cluster c(5);
    for (uint32_t i = 0; i < 5; ++i)
        c.groups[i]->define_gather<std::string>("name",
                                                [i] { return "rank-" + std::to_string(i); });
    Group from_client(c.ranks.client, c.ranks.addresses);
    for (uint32_t k : {2u, 4u}) {
        CollectiveOptions o;
        o.k = k;
        auto r = value_within(from_client.gather<std::string>("name", o));
        ASSERT_TRUE(r.value.has_value());
        ASSERT_EQ(r.value->size(), 5u);
        for (uint32_t i = 0; i < 5; ++i)
            EXPECT_EQ((*r.value)[i], (Ranked<std::string>{i, "rank-" + std::to_string(i)}));
    }
    // From a member, with a dead rank: the others' values, and the dead one named.
    c.kill(3);
    auto r = value_within(c.groups[0]->gather<std::string>("name"));
    ASSERT_TRUE(r.value.has_value());
    std::vector<uint32_t> got;
    for (auto& v : *r.value)
        got.push_back(v.rank);
    EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2, 4}));
    EXPECT_EQ(ranks_of(r.failed), (std::vector<uint32_t>{3}));
}

TEST(Barrier, NoRankLeavesBeforeTheLastArrives) {
    for (int n : {1, 2, 5}) {
        Cluster c(n);
        std::vector<Clock::time_point> left(std::size_t(n), Clock::time_point{});
        std::vector<Errc> codes(std::size_t(n), Errc::internal);
        const auto start = Clock::now();
        const auto late = 150ms;
        for (int round = 0; round < 3; ++round) {
            std::vector<std::thread> ts;
            for (int i = 0; i < n; ++i)
                ts.emplace_back([&, i] {
                    if (i == n - 1) std::this_thread::sleep_for(late);  // the last comes late
                    auto r = c.groups[std::size_t(i)]->barrier(5s);
                    codes[std::size_t(i)] = r ? Errc::ok : r.code();
                    if (!r) ADD_FAILURE() << "rank " << i << ": " << r.error().message();
                    left[std::size_t(i)] = Clock::now();
                });
            const auto entered_last = Clock::now() + late;
            for (auto& t : ts)
                t.join();
            for (int i = 0; i < n; ++i) {
                EXPECT_EQ(codes[std::size_t(i)], Errc::ok) << n << " ranks, rank " << i;
                EXPECT_GE(left[std::size_t(i)], entered_last - 20ms)
                    << n << " ranks: rank " << i << " left before the last arrived";
            }
        }
        EXPECT_LT(Clock::now() - start, 5s);
    }
}

TEST(Barrier, ARankThatNeverComesIsNamedAtTheDeadline) {
    Cluster c(3);
    std::vector<Result<void>> results(2, ok());
    std::vector<std::thread> ts;
    for (int i = 0; i < 2; ++i)  // rank 2 never calls barrier()
        ts.emplace_back(
            [&, i] { results[std::size_t(i)] = c.groups[std::size_t(i)]->barrier(300ms); });
    for (auto& t : ts)
        t.join();
    for (auto& r : results) {
        ASSERT_FALSE(r);
        EXPECT_EQ(r.code(), Errc::timeout);
        EXPECT_NE(r.error().message().find("rank 2"), std::string::npos) << r.error().message();
    }
    Group outside(c.ranks.client, c.ranks.addresses);
    EXPECT_EQ(outside.barrier(100ms).code(), Errc::invalid_state);
    // A peer that is not the one rank 0 hears from in round 0 (rank 2) cannot arrive for it.
    auto forged =
        c.ranks.client
            .remote<uint32_t(GroupStamp, uint64_t, uint32_t, uint32_t)>("talaria.barrier.talaria")
            .on(c.ranks.client.lookup(c.ranks.addresses[0]));
    auto r = result_within(forged(c.groups[0]->view().stamp(), uint64_t{2}, 0u, 1u));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), Errc::invalid_argument) << r.error().message();
    EXPECT_NE(r.error().message().find("does not send round 0"), std::string::npos)
        << r.error().message();
}

}  // namespace
}  // namespace talaria::api_test
