// One rank of a job a PMIx launcher starts (tests/group/CMakeLists.txt runs it under mpirun):
// Group::from_pmix, point-to-point calls to the next rank, and collective calls over the tree
// with every radix the test names. Exits 0 when everything it checks holds; prints what did not.
//
//   group_pmix_peer ADDRESS sum     under mpirun -np N: every check below
//   group_pmix_peer ADDRESS alone   without a launcher: from_pmix says it needs one
// ADDRESS may hold $TALARIA_TEST_HOST, replaced by that variable (the rank's emulated host).
#include <talaria/talaria.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
    if (ok) return;
    ++failures;
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
}

int alone(talaria::Engine& engine) {
    auto g = talaria::Group::from_pmix(engine);
    check(!g, "from_pmix without a launcher fails");
    if (!g) {
        const std::string m = g.error().message();
        check(g.code() == talaria::Errc::unreachable,
              "its code is unreachable, not " + std::string(talaria::errc_name(g.code())));
        check(m.find("not started by a PMIx launcher") != std::string::npos &&
                  m.find("mpirun") != std::string::npos,
              "the message names the cause and the launchers: " + m);
    }
    return failures == 0 ? 0 : 1;
}

int sum(talaria::Engine& engine) {
    auto made = talaria::Group::from_pmix(engine, "test");
    if (!made) {
        std::fprintf(stderr, "from_pmix: %s\n", made.error().message().c_str());
        return 2;
    }
    talaria::Group group = *made;
    const uint32_t n = group.size();
    const uint32_t me = *group.self_rank();
    check(group.address(me) == engine.self_address(), "this rank's address is its engine's");

    // Defined on every rank before the fence, so no call finds a rank without them.
    engine.define("whoami", [me] { return me; });
    group.define_collective<uint64_t(uint64_t)>(
        "sum", [me](uint64_t base) { return base + me; },
        [](const uint64_t& a, const uint64_t& b) { return a + b; });
    check(bool(group.fence()), "the first fence");

    // Point to point: the next rank, its address fetched from PMIx on first use.
    const uint32_t next = (me + 1) % n;
    auto who = engine.remote<uint32_t()>("whoami");
    auto ep = group.try_rank(next);
    check(bool(ep), "rank " + std::to_string(next) +
                        " is reachable: " + (ep ? std::string() : ep.error().message()));
    if (ep) {
        auto r = who.on(*ep)().try_get();
        check(r && *r == next, "rank " + std::to_string(next) + " says who it is");
    }

    // Collectives: rank 0 and the last rank are roots, for k = 2, 3 and n.
    if (me == 0 || me == n - 1) {
        for (uint32_t k : {2u, 3u, std::max(2u, n)}) {
            talaria::CollectiveOptions opts;
            opts.k = k;
            auto r = group.broadcast<uint64_t(uint64_t)>(opts, "sum", uint64_t{1000}).try_get();
            const std::string at = "rank " + std::to_string(me) + ", k " + std::to_string(k);
            check(bool(r), at + ": the broadcast answers: " + (r ? "" : r.error().message()));
            if (!r) continue;
            const uint64_t want = uint64_t(n) * 1000 + uint64_t(n) * (n - 1) / 2;
            check(r->value && *r->value == want,
                  at + ": the sum is " + std::to_string(want) + ", got " +
                      (r->value ? std::to_string(*r->value) : std::string("none")));
            check(r->answered == n && r->failed.empty(),
                  at + ": every rank answered (" + std::to_string(r->answered) + ", " +
                      std::to_string(r->failed.size()) + " failed)");
        }
    }
    check(bool(group.fence()), "the last fence");  // nobody closes while others may call it
    if (failures == 0 && me == 0) std::printf("%u ranks: every check held\n", n);
    return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s ADDRESS sum|alone\n", argv[0]);
        return 2;
    }
    try {
        // "$TALARIA_TEST_HOST" is this host's address where a test emulates several
        // (mpirun_hosts.sh sets it for each).
        std::string address = argv[1];
        if (auto at = address.find("$TALARIA_TEST_HOST"); at != std::string::npos) {
            const char* host = std::getenv("TALARIA_TEST_HOST");
            address.replace(at, std::strlen("$TALARIA_TEST_HOST"), host ? host : "127.0.0.1");
        }
        talaria::Engine engine(address, talaria::listen);
        const std::string_view mode = argv[2];
        if (mode == "alone") return alone(engine);
        if (mode == "sum") return sum(engine);
        std::fprintf(stderr, "unknown mode %s\n", argv[2]);
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "FAILED: %s\n", e.what());
        return 1;
    }
}
