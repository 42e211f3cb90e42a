// 07: a group of ranks started by a job launcher, and a collective call over them.
//
// Every process of the job opens an engine and joins the job's group with Group::from_pmix:
// PMIx tells it its rank and the job's size, and each rank's address is published through the
// launcher, so no address is written anywhere. Rank 0 then asks every rank for its load with one
// collective call, which travels a tree of the ranks and comes back summed.
//
//   mpirun -np 4 ./07_group                        4 ranks on this host, tcp on 127.0.0.1
//   mpirun -np 4 ./07_group sm://                  the same over shared memory
//   mpirun -np 64 --host a,b,c,d ./07_group 'tcp://$HOST:0'    over nodes: each rank listens on
//                                                  its node's address ($HOST: its host name)
//   srun --mpi=pmix -n 64 ./07_group 'tcp://$HOST:0'           the same under Slurm
//
// (as root, mpirun also needs --allow-run-as-root; more ranks than cores, --oversubscribe.)
#include <talaria/talaria.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace {

/// What each rank reports: its load, here made up from its rank.
struct Load {
    uint64_t ranks = 0;
    uint64_t queued = 0;
    uint64_t busiest = 0;  ///< the rank with the most queued
    uint64_t most = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(ranks, queued, busiest, most);
    }
};

Load combine(const Load& a, const Load& b) {
    Load out{a.ranks + b.ranks, a.queued + b.queued, a.busiest, a.most};
    if (b.most > a.most) {
        out.busiest = b.busiest;
        out.most = b.most;
    }
    return out;
}

/// "tcp://$HOST:0" with $HOST replaced by this node's host name.
std::string this_node(std::string address) {
    if (auto at = address.find("$HOST"); at != std::string::npos) {
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        address.replace(at, 5, host);
    }
    return address;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string address = this_node(argc > 1 ? argv[1] : "tcp://127.0.0.1:0");
    talaria::Engine engine{address, talaria::listen};
    auto made = talaria::Group::from_pmix(engine);
    if (!made) {
        std::fprintf(stderr, "07_group: %s\n", made.error().message().c_str());
        return 1;
    }
    talaria::Group group = *made;
    const uint32_t me = *group.self_rank();

    // Every rank serves "load": its own value, combined with its subtree's on the way up.
    group.define_collective<Load(uint32_t)>(
        "load",
        [me](uint32_t scale) {
            const uint64_t queued = (me * 7 + 3) % 11 * scale;
            return Load{1, queued, me, queued};
        },
        combine);
    // Wait until every rank has defined it: a call must not reach a rank that has not.
    if (auto f = group.fence(); !f) {
        std::fprintf(stderr, "07_group: %s\n", f.error().message().c_str());
        return 1;
    }

    int status = 0;
    if (me == 0) {
        auto r = group.broadcast<Load(uint32_t)>("load", uint32_t{10}).get();
        std::printf("%u of %u ranks answered: %llu queued in all, the most (%llu) at rank %llu\n",
                    r.answered, group.size(), static_cast<unsigned long long>(r.value->queued),
                    static_cast<unsigned long long>(r.value->most),
                    static_cast<unsigned long long>(r.value->busiest));
        for (const auto& f : r.failed)
            std::printf("rank %u failed: %s\n", f.rank, f.message.c_str());
        status = r.failed.empty() && r.answered == group.size() ? 0 : 1;
    }
    // And until rank 0 has its answer: no rank closes its engine while the call may reach it.
    if (auto f = group.fence(); !f) {
        std::fprintf(stderr, "07_group: %s\n", f.error().message().c_str());
        return 1;
    }
    return status;
}
