// Joining a running group through one of its members (Group::join, Group::accept_joins).
//
// The protocol, in two procedures per group name:
// - talaria.group.<name>.join(address, forwarded) -> Membership: a member that is not the
//   coordinator (the lowest-numbered member not declared dead) passes the call on to it, once;
//   the coordinator adds the address as the next rank (or finds it a member already), tells
//   every other member the new membership, and answers it with the joiner's rank.
// - talaria.group.<name>.update(Membership) -> version: a rank applies a membership newer than
//   its own that extends it, and refuses any other, saying why.
// A membership travels whole (every rank's address and the version that removed it, if any),
// so updates that cross or arrive late are harmless: each rank keeps the newest, and every
// newer one contains the older ones' ranks.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/group_impl.hpp"
#include "api/state_access.hpp"
#include "api/swim.hpp"
#include "talaria/api/group.hpp"
#include "talaria/api/procedure.hpp"
#include "talaria/util/log.hpp"

namespace talaria {
namespace {

/// A group's membership on the wire.
struct Membership {
    uint64_t version = 0;
    std::vector<std::string> addresses;  ///< every rank's, 0..N-1
    std::vector<uint64_t> removed_in;    ///< per rank: 0 for a member, else its removal's version
    uint32_t rank = 0;                   ///< in a join's answer: the joiner's rank
    template <class Archive>
    void serialize(Archive& ar) {
        ar(version, addresses, removed_in, rank);
    }
};

using JoinSig = Membership(std::string, uint32_t);
using UpdateSig = uint64_t(Membership);

constexpr std::size_t kMaxAddress = 1024;
constexpr std::size_t kMaxRanks = std::size_t(1) << 20;
/// How long the coordinator's updates may take when the join has no deadline.
constexpr Duration kUpdateTimeout = std::chrono::seconds(10);

std::string proc_name(std::string_view name, const char* what) {
    return "talaria.group." + std::string(name) + what;
}

/// Why `m` is not a membership at all (sizes, empty or long addresses, an address twice).
std::optional<std::string> malformed(const Membership& m) {
    if (m.addresses.size() != m.removed_in.size())
        return fmt::format("{} addresses but {} removal versions", m.addresses.size(),
                           m.removed_in.size());
    if (m.addresses.empty() || m.addresses.size() > kMaxRanks)
        return fmt::format("{} ranks (1 to {})", m.addresses.size(), kMaxRanks);
    std::set<std::string_view> seen;
    for (std::size_t i = 0; i < m.addresses.size(); ++i) {
        const std::string& a = m.addresses[i];
        if (a.empty() || a.size() > kMaxAddress)
            return fmt::format("rank {}'s address is empty or longer than {} bytes", i,
                               kMaxAddress);
        if (m.removed_in[i] > m.version)
            return fmt::format("rank {} removed in version {}, after the membership's {}", i,
                               m.removed_in[i], m.version);
        if (m.removed_in[i] == 0 && !seen.insert(a).second)
            return fmt::format("{} is the address of two members", a);
    }
    return std::nullopt;
}

/// What the caller of a join is told of the call's error: the remedy where it has one.
Error join_error(std::string_view who, std::string_view name, const Error& e) {
    std::string text = fmt::format("{}: {}", who, e.message());
    if (e.code() == Errc::not_found)
        text += fmt::format(" (does every member call Group::accept_joins(\"{}\")?)", name);
    return Error{e.code(), std::move(text)};
}

/// The coordinator's answer to a join, sent once every other member answered its update: the
/// membership, or, where a member was not told, an error naming it.
struct Push {
    std::mutex mu;
    unsigned pending = 0;
    Request req;
    Membership told;
    Errc code = Errc::ok;               ///< the first failure's
    std::vector<std::string> problems;  ///< "rank R: why"
    void done(Errc failed, std::string problem) {
        std::unique_lock g(mu);
        if (failed != Errc::ok) {
            if (code == Errc::ok) code = failed;
            problems.push_back(std::move(problem));
        }
        if (--pending != 0) return;
        g.unlock();
        if (problems.empty()) {
            (void)req.try_respond(told);
            return;
        }
        std::string text = fmt::format(
            "join: the address is rank {} of group version {}, but not every member was told: ",
            told.rank, told.version);
        for (std::size_t i = 0; i < problems.size(); ++i)
            text += (i ? "; " : "") + problems[i];
        text +=
            ". Join again (the same address keeps its rank and the members are told again), or "
            "remove the ranks that are gone at every member first";
        TALARIA_LOG(api, warn, "group: {}", text);
        (void)req.try_respond_error(code, text);
    }
};

}  // namespace

struct Group::Impl::Joins {
    static Membership snapshot_locked(const Impl& impl) {
        Membership m;
        m.version = impl.version;
        m.addresses.reserve(impl.ranks.size());
        m.removed_in.reserve(impl.ranks.size());
        for (const auto& r : impl.ranks) {
            m.addresses.push_back(r.address);
            m.removed_in.push_back(r.member ? 0 : r.removed_in);
        }
        return m;
    }

    /// Apply `m` where it is newer than `impl`'s membership and extends it; the version the rank
    /// is at after, or why it refused.
    static Result<uint64_t> apply(Impl& impl, const Membership& m) {
        if (auto bad = malformed(m))
            return Error{Errc::invalid_argument, "the membership is malformed: " + *bad};
        std::lock_guard g(impl.mu);
        if (m.version <= impl.version) {
            // One this rank has passed already (told twice, or an update that crossed a newer
            // one on the way): nothing to do when its membership holds it.
            bool held = m.addresses.size() <= impl.ranks.size() &&
                        (m.version < impl.version || m.addresses.size() == impl.ranks.size());
            for (std::size_t i = 0; held && i < m.addresses.size(); ++i) {
                const auto& r = impl.ranks[i];
                const bool removed = m.removed_in[i] != 0;
                if ((!r.address.empty() && r.address != m.addresses[i]) ||
                    (removed && (r.member || r.removed_in != m.removed_in[i])) ||
                    (m.version == impl.version && r.member == removed))
                    held = false;
            }
            if (held) return impl.version;
            return Error{Errc::invalid_state,
                         fmt::format("this rank is at group version {}; the membership told is "
                                     "version {}, {} (the ranks disagree: a change made at some "
                                     "ranks only)",
                                     impl.version, m.version,
                                     m.version == impl.version ? "with other ranks"
                                                               : "older and not part of this one")};
        }
        if (m.addresses.size() < impl.ranks.size())
            return Error{Errc::invalid_state,
                         fmt::format("the membership told (version {}) has {} ranks, this rank's "
                                     "{} (ranks are never renumbered)",
                                     m.version, m.addresses.size(), impl.ranks.size())};
        for (std::size_t i = 0; i < impl.ranks.size(); ++i) {
            const auto& r = impl.ranks[i];
            if (!r.address.empty() && r.address != m.addresses[i])
                return Error{
                    Errc::invalid_state,
                    fmt::format("rank {} is {} here and {} in the membership told (version "
                                "{}; ranks are never renumbered)",
                                i, r.address, m.addresses[i], m.version)};
            if (!r.member && m.removed_in[i] == 0)
                return Error{Errc::invalid_state,
                             fmt::format("rank {} was removed here (version {}) and is a member in "
                                         "the membership told (version {}): a removed rank does "
                                         "not come back (it joins as a new one)",
                                         i, r.removed_in, m.version)};
        }
        if (impl.version != 0) {
            // Each version is one change (a rank added or removed): a membership further ahead
            // than its changes is not one this group made.
            uint64_t changes = 0;
            for (std::size_t i = 0; i < m.addresses.size(); ++i) {
                const bool removed = m.removed_in[i] != 0;
                if (i >= impl.ranks.size())
                    changes += removed ? 2 : 1;
                else if (impl.ranks[i].member && removed)
                    ++changes;
            }
            if (m.version - impl.version > changes)
                return Error{
                    Errc::invalid_state,
                    fmt::format("the membership told is version {}, {} versions ahead of "
                                "this rank's {} with {} changes (a version is one "
                                "change)",
                                m.version, m.version - impl.version, impl.version, changes)};
        }
        for (std::size_t i = 0; i < m.addresses.size(); ++i) {
            if (i >= impl.ranks.size()) {
                impl.push_rank_locked(m.addresses[i], m.removed_in[i]);
                continue;
            }
            auto& r = impl.ranks[i];
            if (r.address.empty()) r.address = m.addresses[i];
            if (r.member && m.removed_in[i] != 0)
                impl.drop_rank_locked(uint32_t(i), m.removed_in[i]);
        }
        impl.version = m.version;
        return impl.version;
    }

    static void serve_join(const std::shared_ptr<Impl>& impl, const std::string& name,
                           const detail::ProcInfo* join_info, const detail::ProcInfo* update_info,
                           Request req, std::string address, uint32_t forwarded) {
        if (address.empty() || address.size() > kMaxAddress) {
            (void)req.try_respond_error(
                Errc::invalid_argument,
                fmt::format("join: the address is empty or longer than {} bytes", kMaxAddress));
            return;
        }
        Group group(impl);
        const Group::View v = group.view();
        if (!v.self) {
            (void)req.try_respond_error(
                Errc::invalid_state,
                "join: the seed is not a member of its own group (it was made "
                "without its rank: give Group its rank there), so it "
                "cannot take joins; join through a member");
            return;
        }
        std::optional<uint32_t> coordinator;
        for (uint32_t r : v.members)
            if (group.rank_state(r) != RankState::dead) {
                coordinator = r;
                break;
            }
        if (coordinator != v.self) {
            if (forwarded != 0 || !coordinator) {
                (void)req.try_respond_error(
                    Errc::invalid_state,
                    fmt::format(
                        "join: rank {} was passed a join but is not its group's coordinator "
                        "(rank {} is, as it sees the group: the ranks disagree on the "
                        "membership). Make the same changes at every member (remove the ranks "
                        "that are gone), then join again",
                        *v.self, coordinator ? std::to_string(*coordinator) : "none"));
                return;
            }
            auto ep = group.try_rank(*coordinator);
            if (!ep) {
                (void)req.try_respond_error(
                    ep.code(), fmt::format("join: the coordinator, {}", ep.error().message()));
                return;
            }
            const Duration t =
                detail::time_for_calls_below(req.deadline(), std::chrono::seconds(30));
            auto fut = Procedure<JoinSig>(impl->engine, join_info).on(*ep).timeout(t)(address, 1u);
            std::move(fut).then(
                [r = std::move(req), c = *coordinator, name](Result<Membership>&& m) mutable {
                    if (m)
                        (void)r.try_respond(*m);
                    else
                        (void)r.try_respond_error(
                            m.code(), join_error(fmt::format("join: the coordinator, rank {}", c),
                                                 name, m.error())
                                          .message());
                });
            return;
        }
        // The coordinator. Addresses a launcher has not told yet are fetched first: the joiner
        // needs every rank's.
        for (uint32_t r : v.members)
            if (auto a = group.try_address(r); !a) {
                (void)req.try_respond_error(a.code(), "join: " + a.error().message());
                return;
            }
        auto push = std::make_shared<Push>();
        {
            std::lock_guard g(impl->mu);
            auto rank = impl->member_rank_locked(address);
            if (!rank) {
                if (impl->ranks.size() >= kMaxRanks) {
                    (void)req.try_respond_error(
                        Errc::no_memory,
                        fmt::format("join: the group has {} ranks, the most a group numbers "
                                    "(removed ranks keep their numbers: make a new group)",
                                    impl->ranks.size()));
                    return;
                }
                rank = impl->push_rank_locked(address);
                ++impl->version;
            }
            push->told = snapshot_locked(*impl);
            push->told.rank = *rank;
        }
        const Duration t = detail::time_for_calls_below(req.deadline(), kUpdateTimeout);
        push->req = std::move(req);
        std::vector<uint32_t> others;
        for (uint32_t r = 0; r < push->told.addresses.size(); ++r)
            if (push->told.removed_in[r] == 0 && r != *v.self && r != push->told.rank)
                others.push_back(r);
        push->pending = unsigned(others.size()) + 1;
        for (uint32_t r : others) {
            auto ep = group.try_rank(r);
            if (!ep) {
                push->done(ep.code(), fmt::format("rank {}: {}", r, ep.error().message()));
                continue;
            }
            Procedure<UpdateSig>(impl->engine, update_info)
                .on(*ep)
                .timeout(t)(push->told)
                .then([push, r](Result<uint64_t>&& at) {
                    if (at)
                        push->done(Errc::ok, {});
                    else
                        push->done(at.code(), fmt::format("rank {}: {}", r, at.error().message()));
                });
        }
        push->done(Errc::ok, {});
    }

    /// Define the join and update procedures of `impl` under `name`.
    static Result<void> define_joins(const std::shared_ptr<Impl>& impl, const std::string& name) {
        detail::EngineState* engine = impl->engine;
        const std::string join = proc_name(name, ".join");
        const std::string update = proc_name(name, ".update");
        const detail::ProcInfo* join_info = detail::proc_info(*engine, join);
        const detail::ProcInfo* update_info = detail::proc_info(*engine, update);
        // Held weakly, as every procedure of a group holds it: the group goes with its last handle.
        std::weak_ptr<Impl> weak = impl;
        auto on_join = [weak, name, join_info, update_info](Request req, std::string address,
                                                            uint32_t forwarded) {
            auto i = weak.lock();
            if (!i) {
                (void)req.try_respond_error(Errc::shutdown, "join: this rank's group is gone");
                return;
            }
            serve_join(i, name, join_info, update_info, std::move(req), std::move(address),
                       forwarded);
        };
        auto on_update = [weak](Request req, Membership m) {
            auto i = weak.lock();
            if (!i) {
                (void)req.try_respond_error(Errc::shutdown,
                                            "group update: this rank's group is gone");
                return;
            }
            auto at = apply(*i, m);
            if (at)
                (void)req.try_respond(*at);
            else
                (void)req.try_respond_error(at.code(), "group update: " + at.error().message());
        };
        using J = decltype(on_join);
        using U = decltype(on_update);
        if (auto r = detail::define_params<J, void>(*engine, join, 0, nullptr, std::move(on_join),
                                                    typename detail::FnTraits<J>::Params{});
            !r)
            return r;
        if (auto r =
                detail::define_params<U, void>(*engine, update, 0, nullptr, std::move(on_update),
                                               typename detail::FnTraits<U>::Params{});
            !r) {
            (void)detail::undefine_through(engine, join);
            return r;
        }
        return ok();
    }
};

Result<void> Group::accept_joins(std::string_view name) {
    if (auto c = check_group_name("Group::accept_joins", name); !c) return c;
    {
        std::lock_guard g(impl_->mu);
        if (!impl_->view_locked().self)
            return Error{Errc::invalid_state,
                         "Group::accept_joins: this engine is not a member of its group (give "
                         "Group its rank)"};
        if (!impl_->joins.empty())
            return Error{Errc::invalid_state,
                         fmt::format("Group::accept_joins: this group serves joins already, "
                                     "under '{}'",
                                     impl_->joins)};
        impl_->joins = std::string(name);
    }
    if (auto r = Impl::Joins::define_joins(impl_, std::string(name)); !r) {
        std::lock_guard g(impl_->mu);
        impl_->joins.clear();
        return Error{r.code(), "Group::accept_joins: " + r.error().message()};
    }
    return ok();
}

Result<Group> Group::join(Engine& engine, std::string_view seed, std::string_view name,
                          Duration timeout) {
    if (auto c = check_group_name("Group::join", name); !c) return std::move(c).error();
    if (seed.empty()) return Error{Errc::invalid_argument, "Group::join: an empty seed address"};
    if (!detail::listens(*engine.self().engine()))
        return Error{Errc::invalid_argument,
                     "Group::join: this engine does not listen, so the members cannot call it "
                     "(open it with talaria::listen)"};
    auto impl = std::make_shared<Impl>();
    impl->engine = engine.self().engine();
    impl->self_address = engine.self_address();
    impl->version = 0;  // until the answer (or an update that comes first)
    // Served before the call: the coordinator may tell this rank of a later join before this
    // one's answer is back.
    impl->joins = std::string(name);
    if (auto r = Impl::Joins::define_joins(impl, impl->joins); !r) {
        impl->joins.clear();
        return Error{r.code(), "Group::join: " + r.error().message()};
    }
    auto fail = [&](Error e) -> Result<Group> {
        return Error{e.code(), "Group::join through " + std::string(seed) + ": " + e.message()};
    };
    auto ep = engine.try_lookup(seed);
    if (!ep) return fail(std::move(ep).error());
    auto answer =
        Procedure<JoinSig>(impl->engine, detail::proc_info(*impl->engine, proc_name(name, ".join")))
            .on(*ep)
            .timeout(timeout)(impl->self_address, 0u)
            .try_get();
    if (!answer) return fail(join_error("the seed", name, answer.error()));
    // An update of a later join may have come first: it holds this rank too.
    if (auto at = Impl::Joins::apply(*impl, *answer); !at && impl->version < answer->version)
        return fail(Error{at.code(), "its answer: " + at.error().message()});
    {
        std::lock_guard g(impl->mu);
        const uint32_t rank = answer->rank;
        if (rank >= impl->ranks.size() || impl->ranks[rank].address != impl->self_address)
            return fail(Error{Errc::internal,
                              fmt::format("the answer names rank {}, which is not this engine "
                                          "({})",
                                          rank, impl->self_address)});
        impl->self = rank;
    }
    return Group(std::move(impl));
}

}  // namespace talaria
