// Groups of ranks and k-nomial trees (include/talaria/api/group.hpp).
#include "talaria/api/group.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <thread>
#include <utility>

#include "api/group_impl.hpp"
#include "api/state_access.hpp"
#include "api/swim.hpp"
#include "talaria/api/engine.hpp"
#include "talaria/api/error.hpp"
#include "talaria/api/procedure.hpp"

namespace talaria {

// --- KnomialTree ------------------------------------------------------------------------------

namespace {

/// k^n for the first n with k^n > v: the place of v's next digit (1 for v = 0).
uint64_t next_place(uint64_t v, uint64_t k) noexcept {
    uint64_t p = 1;
    while (p <= v)
        p *= k;
    return p;
}

}  // namespace

Result<void> KnomialTree::check() const {
    if (size == 0) return Error{Errc::invalid_argument, "KnomialTree: size is 0 (at least 1 rank)"};
    if (root >= size)
        return Error{
            Errc::invalid_argument,
            fmt::format("KnomialTree: root {} is not a rank of {} (0..{})", root, size, size - 1)};
    if (k < 2 || k > 64)
        return Error{Errc::invalid_argument,
                     fmt::format("KnomialTree: k = {} (the radix is 2 to 64; 2 is binomial)", k)};
    return ok();
}

std::optional<uint32_t> KnomialTree::parent(uint32_t rank) const {
    if (!valid()) return std::nullopt;
    const uint64_t v = (uint64_t(rank) + size - root) % size;
    if (v == 0) return std::nullopt;
    const uint64_t place = next_place(v, k) / k;  // of v's most significant digit
    const uint64_t up = v - (v / place) * place;  // that digit cleared
    return uint32_t((up + root) % size);
}

std::vector<uint32_t> KnomialTree::children(uint32_t rank) const {
    if (!valid()) return {};
    const uint64_t v = (uint64_t(rank) + size - root) % size;
    std::vector<uint32_t> out;
    // v + c k^j for k^j at or above v's digits, in increasing order: the child at the smallest
    // place heads the largest subtree (every rank ending in its digits), so its sends, which
    // take the most hops, start first.
    for (uint64_t p = next_place(v, k); v + p < size; p *= k)
        for (uint64_t c = 1; c < k && v + c * p < size; ++c)
            out.push_back(uint32_t((v + c * p + root) % size));
    return out;
}

unsigned KnomialTree::depth(uint32_t rank) const {
    if (!valid()) return 0;
    uint64_t v = (uint64_t(rank) + size - root) % size;
    unsigned d = 0;
    for (; v != 0; v /= k)
        d += (v % k) != 0;
    return d;
}

std::vector<uint32_t> KnomialTree::subtree(uint32_t rank) const {
    if (!valid() || rank >= size) return {};
    std::vector<uint32_t> out{rank};
    for (std::size_t i = 0; i < out.size(); ++i)
        for (uint32_t c : children(out[i]))
            out.push_back(c);
    return out;
}

// --- Group ------------------------------------------------------------------------------------

Group::Impl::~Impl() {
    // The engine outlives the group: its procedures for this group go with it, so that a new
    // group of the engine can take the names.
    if (swim) {
        swim->stop();
        if (swim->defined())
            for (const char* p : {".ping", ".ping_req"})
                (void)detail::undefine_through(engine, "talaria.swim." + swim->name() + p);
    }
    if (barriers) (void)detail::undefine_through(engine, "talaria.barrier." + barriers->name);
    if (!joins.empty())
        for (const char* p : {".join", ".update"})
            (void)detail::undefine_through(engine, "talaria.group." + joins + p);
}

Group::Group(std::shared_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

detail::EngineState* Group::engine_state() const noexcept {
    return impl_->engine;
}

void Group::keep_local(std::string name, uint64_t signature, const std::type_info& type,
                       std::shared_ptr<void> start) {
    std::lock_guard g(impl_->mu);
    impl_->collectives[std::move(name)] = {signature, std::type_index(type), std::move(start)};
}

std::shared_ptr<void> Group::local_collective(std::string_view name, uint64_t signature,
                                              const std::type_info& type) const {
    std::lock_guard g(impl_->mu);
    auto it = impl_->collectives.find(name);
    if (it == impl_->collectives.end() || it->second.signature != signature ||
        it->second.type != std::type_index(type))
        return nullptr;
    return it->second.start;
}

Result<Group> Group::make(Engine& engine, std::vector<std::string> addresses,
                          std::optional<uint32_t> self) {
    if (addresses.empty())
        return Error{Errc::invalid_argument, "Group: no addresses (a group has at least 1 rank)"};
    if (self && *self >= addresses.size())
        return Error{Errc::invalid_argument,
                     fmt::format("Group: this process's rank {} is not one of the {} listed", *self,
                                 addresses.size())};
    auto impl = std::make_shared<Impl>();
    impl->self = self;
    impl->engine = engine.self().engine();
    impl->self_address = engine.self_address();
    impl->ranks.reserve(addresses.size());
    for (std::size_t i = 0; i < addresses.size(); ++i) {
        if (addresses[i].empty())
            return Error{Errc::invalid_argument,
                         fmt::format("Group: the address of rank {} is empty", i)};
        if (auto first = impl->member_rank_locked(addresses[i]))
            return Error{Errc::invalid_argument,
                         fmt::format("Group: ranks {} and {} have the same address {} (one "
                                     "engine is one rank)",
                                     *first, i, addresses[i])};
        impl->ranks.push_back(Impl::Rank{std::move(addresses[i]), true, 0, Endpoint{}});
    }
    return Group(std::move(impl));
}

Group::Group(Engine& engine, std::vector<std::string> addresses, std::optional<uint32_t> self)
    : Group(detail::value_or_throw(make(engine, std::move(addresses), self))) {}

Result<Group> Group::from_file(Engine& engine, const std::string& path,
                               std::optional<uint32_t> self) {
    std::ifstream in(path);
    if (!in)
        return Error{Errc::not_found,
                     fmt::format("Group::from_file: cannot read {} (does it exist, and may this "
                                 "process read it?)",
                                 path)};
    std::vector<std::string> addresses;
    std::vector<unsigned> lines;  // of each address, for errors
    std::string line;
    for (unsigned n = 1; std::getline(in, line); ++n) {
        const auto b = line.find_first_not_of(" \t\r");
        if (b == std::string::npos || line[b] == '#') continue;
        const auto e = line.find_last_not_of(" \t\r");
        std::string a = line.substr(b, e - b + 1);
        for (std::size_t i = 0; i < addresses.size(); ++i)
            if (addresses[i] == a)
                return Error{Errc::invalid_argument,
                             fmt::format("Group::from_file: {}:{}: {} is already rank {} (line "
                                         "{}): one engine is one rank",
                                         path, n, a, i, lines[i])};
        addresses.push_back(std::move(a));
        lines.push_back(n);
    }
    if (addresses.empty())
        return Error{Errc::invalid_argument,
                     fmt::format("Group::from_file: {} names no address (one per line; '#' "
                                 "starts a comment)",
                                 path)};
    auto g = make(engine, std::move(addresses), self);
    if (!g)
        return Error{g.code(), fmt::format("Group::from_file: {}: {}", path, g.error().message())};
    return g;
}

uint32_t Group::size() const {
    std::lock_guard g(impl_->mu);
    return uint32_t(impl_->ranks.size());
}

std::vector<uint32_t> Group::members() const {
    return view().members;
}

bool Group::is_member(uint32_t rank) const {
    std::lock_guard g(impl_->mu);
    return rank < impl_->ranks.size() && impl_->ranks[rank].member;
}

uint64_t Group::version() const {
    std::lock_guard g(impl_->mu);
    return impl_->version;
}

std::optional<uint32_t> Group::self_rank() const {
    return view().self;
}

std::string Group::address(uint32_t rank) const {
    auto a = try_address(rank);
    return a ? std::move(*a) : std::string();
}

Result<std::string> Group::try_address(uint32_t rank) const {
    {
        std::lock_guard g(impl_->mu);
        if (rank >= impl_->ranks.size())
            return Error{Errc::out_of_range,
                         fmt::format("Group: no rank {} (the group has ranks 0..{})", rank,
                                     impl_->ranks.size() - 1)};
        if (!impl_->ranks[rank].address.empty() || !impl_->source)
            return impl_->ranks[rank].address;
    }
    // Without the lock: the launcher may ask its server, or the node of that rank.
    auto a = impl_->source->address(rank);
    if (!a) return Error{a.code(), fmt::format("Group: rank {}: {}", rank, a.error().message())};
    std::lock_guard g(impl_->mu);
    std::string& known = impl_->ranks[rank].address;
    if (known.empty()) known = std::move(*a);
    return known;
}

Result<void> Group::fence() {
    if (!impl_->source)
        return Error{Errc::not_supported,
                     "Group::fence: this group was not made by a launcher (Group::from_pmix); "
                     "its processes have no job to wait for"};
    return impl_->source->fence();
}

namespace {

/// FNV-1a over the member ranks (GroupStamp::members).
uint64_t members_digest(const std::vector<uint32_t>& members) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t r : members)
        for (int i = 0; i < 4; ++i) {
            h ^= (r >> (8 * i)) & 0xff;
            h *= 0x100000001b3ull;
        }
    return h;
}

}  // namespace

Group::View Group::Impl::view_locked() const {
    View v;
    v.version = version;
    for (uint32_t r = 0; r < ranks.size(); ++r) {
        if (!ranks[r].member) continue;
        v.members.push_back(r);
        if (self ? r == *self : ranks[r].address == self_address) v.self = r;
    }
    v.digest = members_digest(v.members);
    return v;
}

Group::View Group::view() const {
    std::lock_guard g(impl_->mu);
    return impl_->view_locked();
}

Result<Endpoint> Group::try_rank(uint32_t rank) {
    std::string address;
    {
        std::lock_guard g(impl_->mu);
        if (rank >= impl_->ranks.size())
            return Error{Errc::out_of_range,
                         fmt::format("Group: no rank {} (the group has ranks 0..{})", rank,
                                     impl_->ranks.size() - 1)};
        const Impl::Rank& r = impl_->ranks[rank];
        if (!r.member)
            return Error{Errc::disconnected,
                         fmt::format("Group: rank {} ({}) was removed from the group (version "
                                     "{}; the group is at version {})",
                                     rank, r.address, r.removed_in, impl_->version)};
        if (impl_->swim)
            if (auto why = impl_->swim->dead(rank)) return Error{Errc::disconnected, *why};
        if (r.ep.valid()) return r.ep;
        address = r.address;
    }
    if (address.empty()) {  // a launcher's rank, not resolved yet
        auto a = try_address(rank);
        if (!a) return std::move(a).error();
        address = std::move(*a);
    }
    // Without the lock: a lookup may resolve a name or open a connection.
    auto ep = detail::lookup_through(impl_->engine, address);
    if (!ep)
        return Error{ep.code(),
                     fmt::format("Group: rank {} at {}: {}", rank, address, ep.error().message())};
    std::lock_guard g(impl_->mu);
    Impl::Rank& r = impl_->ranks[rank];
    if (!r.member)
        return Error{Errc::disconnected,
                     fmt::format("Group: rank {} ({}) was removed from the group (version {})",
                                 rank, r.address, r.removed_in)};
    if (!r.ep.valid()) r.ep = *ep;
    return r.ep;
}

Endpoint Group::rank(uint32_t rank) {
    return detail::value_or_throw(try_rank(rank));
}

Result<uint64_t> Group::remove(uint32_t rank) {
    std::lock_guard g(impl_->mu);
    if (rank >= impl_->ranks.size())
        return Error{Errc::out_of_range,
                     fmt::format("Group::remove: no rank {} (the group has ranks 0..{})", rank,
                                 impl_->ranks.size() - 1)};
    Impl::Rank& r = impl_->ranks[rank];
    if (!r.member)
        return Error{Errc::invalid_argument,
                     fmt::format("Group::remove: rank {} was already removed (version {})", rank,
                                 r.removed_in)};
    impl_->drop_rank_locked(rank, ++impl_->version);
    return impl_->version;
}

Result<uint32_t> Group::add(std::string address) {
    if (address.empty()) return Error{Errc::invalid_argument, "Group::add: an empty address"};
    std::lock_guard g(impl_->mu);
    if (impl_->member_address_locked(address))
        return Error{Errc::invalid_argument,
                     fmt::format("Group::add: {} is already a member's address", address)};
    const uint32_t rank = impl_->push_rank_locked(std::move(address));
    ++impl_->version;
    return rank;
}

uint32_t Group::Impl::push_rank_locked(std::string address, uint64_t removed_in) {
    const auto rank = uint32_t(ranks.size());
    const bool member = removed_in == 0;
    ranks.push_back(Rank{address, member, removed_in, Endpoint{}});
    if (member && swim) swim->member(rank, std::move(address), true);
    return rank;
}

void Group::Impl::drop_rank_locked(uint32_t rank, uint64_t removed_in) {
    Rank& r = ranks[rank];
    r.member = false;
    r.removed_in = removed_in;
    r.ep = Endpoint{};
    if (swim) swim->member(rank, std::string(), false);
}

Result<void> check_group_name(std::string_view where, std::string_view name) {
    if (name.empty() || name.size() > 200)
        return Error{Errc::invalid_argument,
                     fmt::format("{}: the name is empty or longer than 200 characters", where)};
    return ok();
}

// --- barrier ----------------------------------------------------------------------------------

namespace {

/// On the wire: the group's stamp, the barrier number, the round, the sender's rank.
using BarrierSig = uint32_t(GroupStamp, uint64_t, uint32_t, uint32_t);
/// Barrier numbers this far ahead of the rank's own are refused (a confused or hostile peer
/// cannot fill the arrival set).
constexpr uint64_t kBarrierWindow = 64;

/// The member 2^round places ahead of this rank (whom it calls in that round), or behind (whom
/// it hears from), in rank order, wrapping around. `v.self` is a member; 2^round < members.
uint32_t barrier_peer(const Group::View& v, uint32_t round, bool ahead) {
    const auto n = uint64_t(v.members.size());
    const auto me =
        uint64_t(std::lower_bound(v.members.begin(), v.members.end(), *v.self) - v.members.begin());
    const uint64_t d = uint64_t(1) << round;
    return v.members[ahead ? (me + d) % n : (me + n - d) % n];
}

}  // namespace

Result<void> Group::barrier(Duration timeout, std::string_view name) {
    const TimePoint deadline = Clock::now() + timeout;
    const View v = view();
    if (!v.self)
        return Error{Errc::invalid_state,
                     "Group::barrier: this engine is not a member of its group (give Group its "
                     "rank)"};
    if (auto c = check_group_name("Group::barrier", name); !c) return c;
    const std::string proc = "talaria.barrier." + std::string(name);
    std::shared_ptr<GroupBarriers> b;
    bool define = false;
    {
        std::lock_guard g(impl_->mu);
        if (!impl_->barriers) {
            impl_->barriers = std::make_shared<GroupBarriers>();
            impl_->barriers->name = std::string(name);
            impl_->barriers->info = detail::proc_info(*impl_->engine, proc);
            define = true;
        } else if (impl_->barriers->name != name) {
            return Error{Errc::invalid_argument,
                         fmt::format("Group::barrier: this group's barriers are '{}', not '{}'",
                                     impl_->barriers->name, name)};
        }
        b = impl_->barriers;
    }
    if (define) {
        // Held weakly, as a collective's handler holds its group; the version is read at each
        // arrival, so that it is the group's at the time.
        std::weak_ptr<Impl> weak = impl_;
        auto fn = [weak](Request req, GroupStamp theirs, uint64_t number, uint32_t round,
                         uint32_t from) {
            auto impl = weak.lock();
            std::shared_ptr<GroupBarriers> bs;
            GroupStamp ours;
            // Only the rank this one hears from in that round may send it (the member 2^round
            // places behind in rank order): no other peer can release it or fill the set.
            bool expected = false;
            if (impl) {
                View here;
                {
                    std::lock_guard g(impl->mu);
                    bs = impl->barriers;
                    here = impl->view_locked();
                }
                ours = here.stamp();
                if (here.self && round < 32 && (1u << round) < here.members.size())
                    expected = barrier_peer(here, round, /*ahead=*/false) == from;
            }
            if (!bs) {
                (void)req.try_respond_error(Errc::shutdown, "this rank's group is gone");
                return;
            }
            if (theirs != ours) {
                (void)req.try_respond_error(
                    Errc::invalid_state,
                    theirs.version != ours.version
                        ? fmt::format("barrier: this rank is at group version {}, the caller at "
                                      "{} (every rank must see the same membership)",
                                      ours.version, theirs.version)
                        : fmt::format("barrier: this rank is at group version {} as the caller "
                                      "is, but with other members (a rank was removed or added "
                                      "on one side only)",
                                      ours.version));
                return;
            }
            if (!expected) {
                (void)req.try_respond_error(
                    Errc::invalid_argument,
                    fmt::format("barrier: rank {} does not send round {} to this rank", from,
                                round));
                return;
            }
            {
                std::lock_guard g(bs->mu);
                if (number == 0 || number > bs->entered + kBarrierWindow) {
                    (void)req.try_respond_error(
                        Errc::invalid_argument,
                        fmt::format("barrier: number {} round {} is outside this rank's window "
                                    "(it entered {})",
                                    number, round, bs->entered));
                    return;
                }
                bs->arrived.emplace(number, round, from);
            }
            bs->cv.notify_all();
            (void)req.try_respond(uint32_t{0});
        };
        using Fn = decltype(fn);
        if (auto r =
                detail::define_params<Fn, void>(*impl_->engine, proc, 0, nullptr, std::move(fn),
                                                typename detail::FnTraits<Fn>::Params{});
            !r) {
            std::lock_guard g(impl_->mu);
            impl_->barriers.reset();
            return Error{r.code(), "Group::barrier: " + r.error().message()};
        }
    }
    uint64_t number = 0;
    {
        std::lock_guard g(b->mu);
        number = ++b->entered;
        // Arrivals of barriers before the last are done with.
        std::erase_if(b->arrived, [number](const auto& a) { return std::get<0>(a) + 1 < number; });
    }
    for (uint32_t round = 0; (1u << round) < v.members.size(); ++round) {
        const uint32_t to = barrier_peer(v, round, /*ahead=*/true);
        const uint32_t from = barrier_peer(v, round, /*ahead=*/false);
        auto ep = try_rank(to);
        if (!ep)
            return Error{ep.code(),
                         fmt::format("Group::barrier #{}: {}", number, ep.error().message())};
        for (;;) {
            const Duration left = deadline - Clock::now();
            if (left <= Duration::zero())
                return Error{Errc::timeout,
                             fmt::format("Group::barrier #{}: rank {} did not take round {} in "
                                         "time (has it called barrier('{}')?)",
                                         number, to, round, name)};
            auto r = Procedure<BarrierSig>(impl_->engine, b->info)
                         .on(*ep)
                         .timeout(left)(v.stamp(), number, round, *v.self)
                         .try_get();
            if (r) break;
            if (r.code() != Errc::not_found)  // not_found: it has not defined it yet
                return Error{r.code(), fmt::format("Group::barrier #{}: rank {}: {}", number, to,
                                                   r.error().message())};
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::unique_lock g(b->mu);
        const auto key = std::make_tuple(number, round, from);
        if (!b->cv.wait_until(g, deadline, [&] { return b->arrived.count(key) != 0; }))
            return Error{Errc::timeout,
                         fmt::format("Group::barrier #{}: round {} heard nothing from rank {} (it, "
                                     "or a rank it waits for, has not called barrier('{}'))",
                                     number, round, from, name)};
    }
    return ok();
}

// --- failure detection ------------------------------------------------------------------------

Result<void> Group::start_failure_detection(const FailureDetection& options) {
    using std::chrono::milliseconds;
    if (options.period < milliseconds(1))
        return Error{Errc::invalid_argument,
                     "Group::start_failure_detection: the period is under 1 ms"};
    if (options.ping_timeout < Duration::zero() || options.ping_timeout > options.period)
        return Error{Errc::invalid_argument,
                     "Group::start_failure_detection: ping_timeout is negative or longer than "
                     "the period (a ping and the indirect pings share one period)"};
    if (options.indirect > 16)
        return Error{Errc::invalid_argument,
                     fmt::format("Group::start_failure_detection: indirect = {} (0 to 16)",
                                 options.indirect)};
    if (options.suspicion < options.period)
        return Error{Errc::invalid_argument,
                     "Group::start_failure_detection: the suspicion time is shorter than the "
                     "period (a suspect rank needs a period at least to hear of it and refute)"};
    if (auto c = check_group_name("Group::start_failure_detection", options.name); !c) return c;
    const View v = view();
    if (!v.self)
        return Error{Errc::invalid_state,
                     "Group::start_failure_detection: this engine is not a member of its group "
                     "(give Group its rank)"};
    // Under the group's mutex throughout, so that a listener added meanwhile is not lost.
    std::lock_guard g(impl_->mu);
    {
        if (!impl_->swim) {
            std::vector<Swim::Peer> peers;
            for (const auto& r : impl_->ranks)
                peers.push_back(Swim::Peer{r.address, Endpoint{}, r.member});
            impl_->swim = std::make_shared<Swim>(impl_->engine, impl_->source, *v.self,
                                                 std::move(peers), options);
        }
    }
    auto started = impl_->swim->start(options, impl_->listeners);
    // Its procedures could not be defined (another group's detection under this name): a later
    // start may name another.
    if (!started && !impl_->swim->defined()) impl_->swim.reset();
    return started;
}

void Group::stop_failure_detection() {
    std::shared_ptr<Swim> swim;
    {
        std::lock_guard g(impl_->mu);
        swim = impl_->swim;
    }
    if (swim) swim->stop();
}

RankState Group::rank_state(uint32_t rank) const {
    std::shared_ptr<Swim> swim;
    {
        std::lock_guard g(impl_->mu);
        swim = impl_->swim;
    }
    return swim ? swim->state(rank) : RankState::alive;
}

void Group::on_rank_state(std::function<void(uint32_t rank, RankState state)> fn) {
    std::lock_guard g(impl_->mu);  // as start_failure_detection, which copies the listeners
    impl_->listeners.push_back(fn);
    if (impl_->swim) impl_->swim->add_listener(std::move(fn));
}

}  // namespace talaria
