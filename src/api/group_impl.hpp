// The state a Group handle shares (include/talaria/api/group.hpp), for group.cpp and the
// launcher bootstraps (group_pmix.cpp).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <typeindex>
#include <vector>

#include "talaria/api/endpoint.hpp"
#include "talaria/api/engine.hpp"
#include "talaria/api/group.hpp"
#include "talaria/util/result.hpp"

namespace talaria {

/// Where a group's addresses come from when they are not all known at its making: a launcher
/// (PMIx) resolves a rank's address on first use, so a job of many ranks asks only for those
/// it calls. Called without the group's lock, from any thread.
struct GroupSource {
    virtual ~GroupSource() = default;
    /// The address rank `rank` published.
    virtual Result<std::string> address(uint32_t rank) = 0;
    /// Wait for every process of the launcher's job (Group::fence).
    virtual Result<void> fence() = 0;
};

class Swim;

/// Barriers of one group (Group::barrier): the arrivals heard from other ranks, by barrier
/// number and round, and how many barriers this rank has entered.
struct GroupBarriers {
    std::string name;
    const detail::ProcInfo* info = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t entered = 0;  // under mu
    /// (barrier number, round, from rank), under mu; numbers far from `entered` are refused.
    std::set<std::tuple<uint64_t, uint32_t, uint32_t>> arrived;
};

/// The name a group's procedures are defined under (barrier, failure detection, joins): what is
/// wrong with it, for `where`.
Result<void> check_group_name(std::string_view where, std::string_view name);

struct Group::Impl {
    Impl() = default;
    ~Impl();  // stops failure detection
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;

    detail::EngineState* engine = nullptr;
    std::string self_address;
    std::optional<uint32_t> self;         ///< given to make(); else found by self_address
    std::shared_ptr<GroupSource> source;  ///< null: every address was given

    struct Rank {
        std::string address;  ///< empty until the source resolved it
        bool member = true;
        uint64_t removed_in = 0;  ///< the version its removal made
        Endpoint ep;              ///< looked up on first use
    };
    mutable std::mutex mu;
    std::vector<Rank> ranks;                  // under mu
    uint64_t version = 1;                     // under mu
    std::shared_ptr<Swim> swim;               ///< under mu: failure detection, once started
    std::shared_ptr<GroupBarriers> barriers;  ///< under mu: once a barrier was entered
    std::string joins;  ///< under mu: the name joins are served under (accept_joins); "" none
    /// Collectives defined on this rank, by name: their signature and their local starter
    /// (Group::keep_local), under mu.
    struct LocalCollective {
        uint64_t signature = 0;
        std::type_index type = typeid(void);
        std::shared_ptr<void> start;
    };
    std::map<std::string, LocalCollective, std::less<>> collectives;
    std::vector<std::function<void(uint32_t, RankState)>> listeners;  // under mu

    /// Joins through a member (group_join.cpp: Group::join, Group::accept_joins).
    struct Joins;
    /// Group::view(), with mu held.
    [[nodiscard]] Group::View view_locked() const;
    /// The member at address `a`, if one is.
    [[nodiscard]] std::optional<uint32_t> member_rank_locked(std::string_view a) const {
        auto it = std::find_if(ranks.begin(), ranks.end(),
                               [&](const Rank& r) { return r.member && r.address == a; });
        if (it == ranks.end()) return std::nullopt;
        return uint32_t(it - ranks.begin());
    }
    [[nodiscard]] bool member_address_locked(std::string_view a) const {
        return member_rank_locked(a).has_value();
    }
    /// Number the next rank, at `address`: a member, or one already removed in version
    /// `removed_in` (a membership told by the coordinator). The caller bumps the version.
    uint32_t push_rank_locked(std::string address, uint64_t removed_in = 0);
    /// Take member `rank` out, as of version `removed_in`.
    void drop_rank_locked(uint32_t rank, uint64_t removed_in);
};

}  // namespace talaria
