// Groups of ranks (issue 13): processes numbered 0..N-1 by the addresses of their engines, as
// CaRT's groups number the servers of a DAOS system, with a version that every membership
// change bumps; and the k-nomial trees over them that collective calls travel.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "talaria/api/define.hpp"
#include "talaria/api/endpoint.hpp"
#include "talaria/api/engine.hpp"
#include "talaria/api/procedure.hpp"
#include "talaria/api/signature.hpp"
#include "talaria/util/result.hpp"

#pragma GCC visibility push(default)

namespace talaria {

namespace detail {
template <class Sig>
struct CollectiveCall;

/// The timeout of a call a group's handler makes on for its own call, due at `deadline`: seven
/// eighths of what is left, so that the answer (or the timeout) is back before its own is due;
/// none (`otherwise`) when its call has no deadline.
inline Duration time_for_calls_below(TimePoint deadline, Duration otherwise) {
    if (deadline == TimePoint::max()) return otherwise;
    Duration left = deadline - Clock::now();
    left -= left / 8;
    return std::max<Duration>(left, std::chrono::microseconds(1));
}
}  // namespace detail

/// A k-nomial tree over ranks 0..size-1 rooted at `root`. In a rank's relative number
/// v = (rank - root) mod size, written in base k: the parent of v is v with its most
/// significant nonzero digit cleared, and its children are v + c * k^j for every j at or
/// above v's number of digits and every c in 1..k-1, while below size. So the root reaches
/// every rank exactly once, in at most ceil(log_k(size)) hops, and the ranks below a child
/// are those whose relative number ends in the child's digits. k = 2 is the binomial tree.
struct KnomialTree {
    uint32_t size = 1;
    uint32_t root = 0;
    uint32_t k = 2;

    // Every query answers nothing (none, empty, 0) for a tree that fails check().
    /// The rank that sends to `rank` (none for the root).
    [[nodiscard]] std::optional<uint32_t> parent(uint32_t rank) const;
    /// The ranks `rank` sends to, the largest subtree first (the smallest k^j).
    [[nodiscard]] std::vector<uint32_t> children(uint32_t rank) const;
    /// Hops from the root to `rank`: the nonzero base-k digits of its relative number.
    [[nodiscard]] unsigned depth(uint32_t rank) const;
    /// The ranks in the subtree of `rank`, itself first.
    [[nodiscard]] std::vector<uint32_t> subtree(uint32_t rank) const;
    /// size >= 1, root < size, 2 <= k <= 64; what is wrong otherwise, naming the field.
    [[nodiscard]] Result<void> check() const;
    [[nodiscard]] bool valid() const noexcept {
        return size >= 1 && root < size && k >= 2 && k <= 64;
    }
};

/// A rank a collective call got no answer from, and why.
struct RankFailure {
    uint32_t rank = 0;
    Errc code = Errc::ok;
    std::string message;

    template <class Archive>
    void serialize(Archive& ar) {
        auto c = static_cast<uint16_t>(code);
        ar(rank, c, message);
        if constexpr (!Archive::encoding)
            code = c <= uint16_t(kLastErrc) ? static_cast<Errc>(c) : Errc::internal;
    }
    friend bool operator==(const RankFailure&, const RankFailure&) = default;
};

/// What a collective call gathered from the ranks (Group::broadcast).
template <class R>
struct Collective {
    /// Every answer combined with the procedure's reduction (none when no rank answered).
    std::optional<R> value;
    uint32_t answered = 0;            ///< ranks whose handler returned a value
    std::vector<RankFailure> failed;  ///< the others, by rank
    template <class Archive>
    void serialize(Archive& ar) {
        ar(value, answered, failed);
    }
};

/// One rank's value in a gather (Group::gather).
template <class T>
struct Ranked {
    uint32_t rank = 0;
    T value{};
    template <class Archive>
    void serialize(Archive& ar) {
        ar(rank, value);
    }
    friend bool operator==(const Ranked&, const Ranked&) = default;
};

/// A membership as calls between ranks name it: the group's version and a hash of its members,
/// so that two ranks at one version with other removals (each removed a different rank) are
/// told apart.
struct GroupStamp {
    uint64_t version = 0;
    uint64_t members = 0;  ///< Group::View::digest
    template <class Archive>
    void serialize(Archive& ar) {
        ar(version, members);
    }
    friend bool operator==(const GroupStamp&, const GroupStamp&) = default;
};

/// How a collective call travels (Group::broadcast).
struct CollectiveOptions {
    /// A deadline for the whole tree: each rank gives the ranks it sends to seven eighths of
    /// the time it has left, so their answers come back before its own deadline. A dead rank
    /// is noticed at once (its connections fail); a rank that hangs, or is cut off without a
    /// word, holds its part of the tree until then. Zero: the engine's default_timeout (none
    /// unless set: such a rank then holds the call for good).
    Duration timeout = std::chrono::seconds(30);
    uint32_t k = 2;  ///< the tree's radix (KnomialTree): 2 to 64
};

/// A rank's health as the group's failure detector sees it (Group::start_failure_detection).
/// A rank goes alive -> suspect -> dead, or back to alive when it refutes the suspicion;
/// dead is final (a restarted process joins as a new rank, Group::add).
enum class RankState : uint8_t { alive = 0, suspect = 1, dead = 2 };
std::string_view rank_state_name(RankState s) noexcept;

/// SWIM failure detection (Das, Gupta, Motivala 2002), as DAOS's CaRT runs it: every period
/// each rank pings one other, in a shuffled round over the members; a rank that does not answer
/// within ping_timeout is pinged through `indirect` others for the rest of the period; if none
/// of them hears it either, it is suspect, and once `suspicion` has passed without it refuting
/// (a rank told it is suspect answers with a newer incarnation) it is dead. What each rank learns
/// travels piggybacked on these pings and their answers, each piece about 3 log2(N) times.
struct FailureDetection {
    Duration period = std::chrono::milliseconds(200);
    /// How long a direct ping waits (0: half the period; at most the period).
    Duration ping_timeout = Duration::zero();
    uint32_t indirect = 3;  ///< ranks asked to ping a rank that did not answer (0 to 16)
    Duration suspicion = std::chrono::seconds(1);
    /// The procedures are talaria.swim.<name>.ping and .ping_req: one name per group an engine
    /// runs detection for. Every rank of a group uses the same.
    std::string name = "talaria";
};

/// Ranks 0..N-1, each the address of an engine, seen from one engine of this process (which
/// must outlive the group). Ranks are numbered once: a removed rank keeps its number (calls to
/// it fail at once), an added one takes the next. Every change bumps version(). Endpoints are
/// looked up on first use of a rank, so a group of many ranks costs only its address strings
/// until it is used. A Group is a handle: copies share one membership. Thread-safe: any thread
/// may read, call and change it.
class Group {
  public:
    /// Ranks at `addresses`, in order (what Engine::lookup accepts: "tcp://10.0.0.7:7000").
    /// This process's rank is `self` when given (a launcher's rank, or the line of the file
    /// this process was started for); otherwise the rank whose address string is the engine's
    /// own self_address(), if one is (a server listening on 0.0.0.0 or known by a host name
    /// is listed under another string: give `self`). Throws talaria::Exception
    /// (invalid_argument) for an empty list, an empty or a repeated address, or `self` past the
    /// list.
    Group(Engine& engine, std::vector<std::string> addresses,
          std::optional<uint32_t> self = std::nullopt);
    /// Non-throwing twin.
    static Result<Group> make(Engine& engine, std::vector<std::string> addresses,
                              std::optional<uint32_t> self = std::nullopt);
    /// One address per line; blank lines and lines starting with '#' are skipped, as are
    /// blanks around an address. Errors name the file and the line.
    static Result<Group> from_file(Engine& engine, const std::string& path,
                                   std::optional<uint32_t> self = std::nullopt);

    /// The ranks of the job this process was started in by a PMIx launcher (Open MPI's
    /// mpirun, Slurm's srun --mpi=pmix, PRRTE's prterun): its rank and the job's size come from
    /// PMIx, and this engine's self_address() is published under the key "<name>.address"
    /// (PMIx_Put, PMIx_Commit) before a fence of the whole job, so every rank calls from_pmix
    /// (with the same name) before any returns. Another rank's address is fetched from PMIx on
    /// first use of that rank, so a large job costs only what it calls. Several engines of one
    /// process join one job under different names. Errors: not_supported (built without PMIx:
    /// install libpmix-dev and rebuild), unreachable (not started by a PMIx launcher),
    /// address_invalid (an address other nodes cannot reach: a loopback or sm:// one in a job
    /// over several nodes; open the engine on this node's network address), and PMIx's own
    /// errors, by name.
    static Result<Group> from_pmix(Engine& engine, std::string_view name = "talaria");

    /// Join a running group through one of its members: `seed` is the address of any member
    /// that accepts joins (accept_joins(name)). This engine (which must listen: the members
    /// call it) is added as the next rank by the group's coordinator, the lowest-numbered
    /// member not declared dead, which tells every member the new membership before answering;
    /// the group returned has every rank's address, the new version, and this process's rank.
    /// A join through a member that is not the coordinator is passed on to it (one hop). The
    /// new rank accepts joins too. A join of an address that is already a member answers its
    /// rank (a retried join adds no second rank). Errors: invalid_argument for an empty seed, a
    /// bad name, or an engine that does not listen; not_found when the seed does not accept
    /// joins under `name` (every member calls accept_joins); already_exists when this engine
    /// serves joins under `name` for another group; the seed's or the coordinator's call
    /// errors, naming which; and, when a member was not reached or refused the new membership,
    /// that member's error naming it (the address keeps its rank: join again once it is
    /// removed everywhere or reachable).
    static Result<Group> join(Engine& engine, std::string_view seed,
                              std::string_view name = "talaria",
                              Duration timeout = std::chrono::seconds(30));
    /// Serve joins (Group::join) for this group under `name`: the procedures
    /// talaria.group.<name>.join and .update, on this rank's engine, until the group goes.
    /// Every member calls it with the same name. A rank applies a membership it is told of
    /// when its version is newer than its own and it extends its own (ranks are never
    /// renumbered: the same address at every rank it has, no removed rank back, no address
    /// twice, one version per change); it refuses any other, saying why. The coordinator's
    /// membership is the one members converge to, so a membership change made at some ranks only
    /// (remove() at one rank, say) must be made at the coordinator too before a join, or the ranks
    /// ahead of it refuse the join's update (the coordinator logs which). Errors: invalid_state
    /// when this process is not a member or already serves joins, already_exists when the engine
    /// serves another group's joins under `name`.
    Result<void> accept_joins(std::string_view name = "talaria");

    // A handle: copies (moves too: a moved-from Group stays usable) share one membership.
    Group(const Group&) = default;
    Group& operator=(const Group&) = default;
    ~Group() = default;

    /// Ranks ever numbered (removed ones included): the ranks are 0..size()-1.
    [[nodiscard]] uint32_t size() const;
    /// Ranks that are members now.
    [[nodiscard]] std::vector<uint32_t> members() const;
    [[nodiscard]] bool is_member(uint32_t rank) const;
    /// Starts at 1; every remove() and add() adds one.
    [[nodiscard]] uint64_t version() const;
    /// This process's rank, where its engine's address is one of the group's.
    [[nodiscard]] std::optional<uint32_t> self_rank() const;
    /// The address of `rank` ("" past size(), or where a launcher cannot tell it).
    [[nodiscard]] std::string address(uint32_t rank) const;
    /// The same, with why it is unknown: out_of_range, or the launcher's error.
    [[nodiscard]] Result<std::string> try_address(uint32_t rank) const;
    /// Wait until every process of the launcher's job has called fence() (PMIx_Fence): after
    /// each rank defined its collectives, say, and before a rank closes its engine while others
    /// may still call it. Errors: not_supported for a group not made by from_pmix, and the
    /// launcher's (a process of the job that died: PMIx names it).
    Result<void> fence();
    /// The members, the version and this process's rank, read at one time.
    struct View {
        uint64_t version = 0;
        std::vector<uint32_t> members;  ///< increasing
        std::optional<uint32_t> self;
        uint64_t digest = 0;  ///< a hash of `members` (GroupStamp)
        [[nodiscard]] GroupStamp stamp() const { return {version, digest}; }
    };
    [[nodiscard]] View view() const;

    /// The endpoint of `rank`, looked up on first use. Errors: out_of_range past size(),
    /// disconnected for a removed rank (naming it and the version that removed it), and the
    /// lookup's own error (naming the rank and its address).
    Result<Endpoint> try_rank(uint32_t rank);
    /// The same; throws talaria::Exception.
    Endpoint rank(uint32_t rank);

    /// Take `rank` out of the group; returns the new version. Errors: out_of_range,
    /// invalid_argument for a rank already removed.
    Result<uint64_t> remove(uint32_t rank);
    /// A new rank at `address` (the next number); returns it. Errors: invalid_argument for an
    /// empty address or one a member already has.
    Result<uint32_t> add(std::string address);

    // --- failure detection -----------------------------------------------------------------
    /// Run SWIM failure detection (FailureDetection) on this rank until stop_failure_detection()
    /// or the last handle of the group goes; every rank of the group runs it. Its probes run on
    /// a thread of the group; its procedures on the engine's progress threads, like any other.
    /// A rank declared dead fails try_rank() at once with disconnected, and so every call the
    /// group makes to it (a collective names it with its subtree). Errors: invalid_argument for
    /// bad options, invalid_state when this process is not a member or detection already runs,
    /// already_exists when the engine serves another group's detection under the same name.
    Result<void> start_failure_detection(const FailureDetection& options = {});
    /// Stop probing (joins the thread); this rank still answers others' pings while its engine
    /// is open. No-op when not running.
    void stop_failure_detection();
    /// What the detector thinks of `rank` (alive when detection does not run).
    [[nodiscard]] RankState rank_state(uint32_t rank) const;
    /// `fn(rank, state)` whenever a rank's state changes (suspect, dead, or alive again after a
    /// suspicion), on the detector's thread or a progress thread, without any lock of the group
    /// held: it may call the group (remove the rank, say) but must not block for long.
    void on_rank_state(std::function<void(uint32_t rank, RankState state)> fn);

    // --- collective calls ----------------------------------------------------------------
    /// Serve collective `name` on this rank: `handler(args...)` computes this rank's value, and
    /// `reduce(a, b)` combines two values (it must be associative and commutative: answers
    /// are combined in the order they arrive). Every rank of the group defines it, with the
    /// same signature `Sig` = R(Args...), on the engine the group was made with. A call
    /// arrives from the rank above this one in the tree: this rank sends it on to the ranks
    /// below (KnomialTree over the members, in rank order), runs its handler, and answers with
    /// the reduction of its own value and theirs, and the ranks that failed. A rank below that
    /// cannot be reached, fails or runs out of time is named in `failed` with its error, and so
    /// is every rank of its subtree (not reached, or reached with the answer lost). A handler
    /// that throws names only its own rank.
    template <class Sig, class H, class Reduce>
    Result<void> try_define_collective(std::string_view name, H handler, Reduce reduce);
    template <class Sig, class H, class Reduce>
    void define_collective(std::string_view name, H handler, Reduce reduce) {
        detail::value_or_throw(
            try_define_collective<Sig>(name, std::move(handler), std::move(reduce)));
    }
    /// Call collective `name` on every member from the root of the tree: where this process is
    /// a member, its own rank, whose part runs here (the calls to the ranks below go out, then
    /// its handler runs on this thread before broadcast returns: hold no lock the handler
    /// takes; and a cancel completes the future on the canceling thread); otherwise the first
    /// member, called over the transport (so is this process's own rank when `name` was not
    /// defined on this group with these types). The future holds the reduction and the failed
    /// ranks; it fails only when the root cannot be reached or refuses the call (another group
    /// version: every rank must see the same membership).
    /// Canceling the future (Future::cancel) cancels the whole tree: the root cancels its calls
    /// to the ranks below, each of them its own, and so on, so no rank waits on for an answer
    /// nobody wants (a handler already running finishes; its value is dropped).
    template <class Sig, class... A>
    auto broadcast(std::string_view name, const A&... args) {
        return broadcast<Sig>(CollectiveOptions{}, name, args...);
    }
    template <class Sig, class... A>
    auto broadcast(const CollectiveOptions& opts, std::string_view name, const A&... args);

    // --- uses of collectives and of point-to-point calls --------------------------------
    /// Serve gather `name` on this rank: `value()` is what it contributes (every rank defines
    /// it with the same T). A gather is the collective std::vector<Ranked<T>>() whose
    /// reduction merges the ranks' values in rank order.
    template <class T, class F>
    Result<void> try_define_gather(std::string_view name, F value);
    template <class T, class F>
    void define_gather(std::string_view name, F value) {
        detail::value_or_throw(try_define_gather<T>(name, std::move(value)));
    }
    /// Every member's value of gather `name`, in rank order, with the ranks that failed: an
    /// all-gather of small values when every rank calls it.
    template <class T>
    auto gather(std::string_view name, const CollectiveOptions& opts = {}) {
        return broadcast<std::vector<Ranked<T>>()>(opts, name);
    }

    /// Wait until every member has called barrier() as many times as this rank has (a
    /// dissemination barrier: ceil(log2 N) rounds of one call to the rank 2^i ahead in the
    /// member list, and a wait for the one 2^i behind). Every member calls it, with the same
    /// membership; the procedure talaria.barrier.<name> is defined on the engine at the first
    /// call (one name per group an engine holds barriers for). Errors: invalid_state when this
    /// process is not a member; timeout naming the rank not heard from; a rank's call error
    /// (a dead rank, another group version) naming it. A barrier that failed leaves the ranks
    /// disagreeing on how many have passed: make the group again.
    Result<void> barrier(Duration timeout = std::chrono::seconds(30),
                         std::string_view name = "talaria");

    /// The name collective `name` is defined under on the wire.
    [[nodiscard]] static std::string wire_name(std::string_view name) {
        return "talaria.collective." + std::string(name);
    }

  private:
    struct Impl;
    template <class Sig>
    friend struct detail::CollectiveCall;
    explicit Group(std::shared_ptr<Impl> impl) noexcept;
    [[nodiscard]] detail::EngineState* engine_state() const noexcept;
    /// Collective `name`'s starter for this process's own rank (a
    /// CollectiveCall<Sig>::LocalStart, kept by define_collective), when it was defined here
    /// with the signature `signature` and the starter's type `type` (two C++ types may encode
    /// alike: the hash alone does not tell them apart); null otherwise.
    void keep_local(std::string name, uint64_t signature, const std::type_info& type,
                    std::shared_ptr<void> start);
    [[nodiscard]] std::shared_ptr<void> local_collective(std::string_view name, uint64_t signature,
                                                         const std::type_info& type) const;
    std::shared_ptr<Impl> impl_;
};

namespace detail {

/// Group::define_collective and Group::broadcast for one signature.
template <class R, class... Args>
struct CollectiveCall<R(Args...)> {
    static_assert(!std::is_void_v<R>,
                  "talaria: a collective procedure returns a value (its reduction combines them)");
    static_assert(std::is_default_constructible_v<R> &&
                      (std::is_default_constructible_v<std::decay_t<Args>> && ...),
                  "talaria: a collective's result and argument types must be default-"
                  "constructible (they are decoded into)");
    using Tuple = std::tuple<std::decay_t<Args>...>;
    /// On the wire: the group's stamp (version and members), the root rank, the radix, the
    /// signature's hash, the arguments.
    using WireSig = Collective<R>(GroupStamp, uint32_t, uint32_t, uint64_t, Tuple);
    using Reduce = std::function<R(const R&, const R&)>;
    /// Ranks that defined the collective with other types refuse the call.
    static constexpr uint64_t kSignature = kSignatureHash<R, std::decay_t<Args>...>;

    /// One rank's answer in the making: its own value and those of the ranks below it, sent
    /// once every part is in. Parts arrive on the progress threads of the calls below.
    struct Gather final : Canceler {
        std::mutex mu;
        Collective<R> acc;
        unsigned pending = 0;
        Request req;
        std::shared_ptr<const Reduce> reduce;
        std::string what;  ///< "collective 'name'"
        /// The calls to the ranks below, to cancel when this rank's caller cancels (written
        /// before `watch` is set, read by its function after).
        std::vector<std::weak_ptr<State<Collective<R>>>> calls;
        core::CancelWatch watch;  ///< set once the calls are out; ended in done()
        /// When this rank's answer is due: its caller's deadline (TimePoint::max(): none).
        TimePoint deadline = TimePoint::max();
        /// Where the caller is this process's own rank, the root (no Request): its future's
        /// state (whose cancel comes here), and whether it was completed (under mu).
        std::shared_ptr<State<Collective<R>>> local_state;
        bool finished = false;
        Gather(Request r, std::shared_ptr<const Reduce> f, std::string w)
            : req(std::move(r)),
              reduce(std::move(f)),
              what(std::move(w)),
              deadline(req.valid() ? req.deadline() : TimePoint::max()) {}

        /// This rank's caller canceled: so is every call below, and so on down the tree (each
        /// rank below hears of it and cancels its own); their ranks are named with canceled.
        void cancel_below() const {
            for (const auto& c : calls)
                if (auto s = c.lock()) (void)s->cancel();
        }

        /// Combine `v` (the value of `ranks` ranks), under mu; the reduction's error if it
        /// threw.
        std::optional<std::string> add_locked(uint32_t ranks, R&& v) {
            try {
                if (acc.value)
                    acc.value = (*reduce)(*acc.value, v);
                else
                    acc.value = std::move(v);
                acc.answered += ranks;
                return std::nullopt;
            } catch (const std::exception& e) {
                return "the reduction of " + what + " threw: " + e.what();
            } catch (...) {
                return "the reduction of " + what + " threw a non-standard exception";
            }
        }
        void local(uint32_t rank, R&& v) {
            std::lock_guard g(mu);
            if (auto err = add_locked(1, std::move(v)))
                acc.failed.push_back({rank, Errc::internal, std::move(*err)});
        }
        /// The answer of the rank heading `subtree`. What it says is held to that subtree: a
        /// peer cannot name other ranks or claim more answers than it has ranks below.
        void below(const std::vector<uint32_t>& subtree, Collective<R>&& c) {
            std::vector<uint32_t> sorted = subtree;
            std::sort(sorted.begin(), sorted.end());
            auto in_subtree = [&](uint32_t r) {
                return std::binary_search(sorted.begin(), sorted.end(), r);
            };
            std::vector<RankFailure> failed;
            for (auto& f : c.failed)
                if (in_subtree(f.rank)) failed.push_back(std::move(f));
            const auto most = uint32_t(subtree.size() - std::min(subtree.size(), failed.size()));
            std::lock_guard g(mu);
            if (c.value) {
                if (auto err = add_locked(std::min(c.answered, most), std::move(*c.value))) {
                    // Its answers are lost: name every rank of the subtree not failed already.
                    for (uint32_t r : subtree)
                        if (std::none_of(failed.begin(), failed.end(),
                                         [r](const RankFailure& f) { return f.rank == r; }))
                            failed.push_back({r, Errc::internal, *err});
                }
            }
            for (auto& f : failed)
                acc.failed.push_back(std::move(f));
        }
        /// `head` failed with `code`: it and the ranks of its subtree are named.
        void lost(const std::vector<uint32_t>& subtree, uint32_t head, Errc code,
                  const std::string& why) {
            std::lock_guard g(mu);
            for (uint32_t r : subtree)
                acc.failed.push_back(
                    {r, code,
                     r == head ? why
                               : "rank " + std::to_string(head) +
                                     ", which sends the call to this rank, failed: " + why});
        }
        void done() {
            std::unique_lock g(mu);
            if (--pending != 0) return;
            watch.reset();                              // nothing below is outstanding
            if (std::exchange(finished, true)) return;  // canceled by the local caller
            std::sort(acc.failed.begin(), acc.failed.end(),
                      [](const RankFailure& a, const RankFailure& b) { return a.rank < b.rank; });
            Collective<R> out = std::move(acc);
            g.unlock();
            if (local_state) {
                local_state->set(std::move(out));
                return;
            }
            if (auto r = req.try_respond(out); !r)  // too large to send, say: tell the caller
                (void)req.try_respond_error(
                    r.code(), what + ": the answer could not be sent: " + r.error().message());
        }
        /// The local caller canceled its future (Canceler): the calls below are canceled, and
        /// the future completes now, on this thread. False when it had completed.
        bool cancel() override {
            {
                std::lock_guard g(mu);
                if (std::exchange(finished, true)) return false;
            }
            cancel_below();
            local_state->set(Error{Errc::canceled, what + ": canceled"});
            return true;
        }
    };

    /// A member's broadcast, started in its own process (Group::local_collective); none once
    /// the engine dropped the collective's handler (it closed, or it was undefined).
    using LocalStart = std::function<std::optional<Future<Collective<R>>>(
        Group&, const Group::View&, const CollectiveOptions&, Tuple&&)>;

    static std::optional<uint32_t> position(const std::vector<uint32_t>& members, uint32_t r) {
        auto it = std::lower_bound(members.begin(), members.end(), r);
        if (it == members.end() || *it != r) return std::nullopt;
        return uint32_t(it - members.begin());
    }

    /// What a rank answers when it cannot take part (the call fails at its parent).
    static std::optional<std::string> refusal(const Group::View& v, const std::string& what,
                                              const GroupStamp& stamp, uint32_t root, uint32_t k,
                                              uint64_t signature) {
        if (signature != kSignature)
            return what + ": this rank defined it with other argument or result types";
        if (v.stamp() != stamp)
            return what + ": " +
                   (v.self ? "rank " + std::to_string(*v.self) : std::string("this engine")) +
                   " is at group version " + std::to_string(v.version) +
                   (v.version != stamp.version
                        ? ", the caller at " + std::to_string(stamp.version)
                        : std::string(" as the caller is, but with other members (a rank was "
                                      "removed or added on one side only)")) +
                   " (every rank must see the same membership)";
        if (!v.self || !position(v.members, *v.self))
            return what + ": this engine is not a member of its group (give Group its rank)";
        if (!position(v.members, root))
            return what + ": the root rank " + std::to_string(root) + " is not a member";
        if (auto shape = KnomialTree{1, 0, k}.check(); !shape) return shape.error().message();
        return std::nullopt;
    }

    template <class H>
    static void serve(Group group, const std::string& name, const H& handler,
                      const std::shared_ptr<const Reduce>& reduce, Request req,
                      const GroupStamp& version, uint32_t root, uint32_t k, uint64_t signature,
                      const Tuple& args) {
        const Group::View v = group.view();
        std::string what = "collective '" + name + "'";
        if (auto no = refusal(v, what, version, root, k, signature)) {
            (void)req.try_respond_error(
                signature != kSignature ? Errc::invalid_argument : Errc::invalid_state, *no);
            return;
        }
        fan_out(group, v, name, handler,
                std::make_shared<Gather>(std::move(req), reduce, std::move(what)), version, root, k,
                signature, args);
    }

    /// This rank's part: the calls to the ranks below (each with seven eighths of the time
    /// left before `st`'s deadline), its own handler, and the answer once every part is in.
    template <class H>
    static void fan_out(Group& group, const Group::View& v, const std::string& name,
                        const H& handler, const std::shared_ptr<Gather>& st,
                        const GroupStamp& version, uint32_t root, uint32_t k, uint64_t signature,
                        const Tuple& args) {
        const uint32_t self = *v.self;
        const KnomialTree tree{uint32_t(v.members.size()), *position(v.members, root), k};
        const auto below = tree.children(*position(v.members, self));
        st->pending = unsigned(below.size()) + 1;
        st->calls.reserve(below.size());
        const std::string& what = st->what;
        EngineState* engine = group.engine_state();
        const ProcInfo* info = proc_info(*engine, Group::wire_name(name));
        for (uint32_t pos : below) {
            const uint32_t rank = v.members[pos];
            std::vector<uint32_t> subtree;
            for (uint32_t p : tree.subtree(pos))
                subtree.push_back(v.members[p]);
            try {
                auto ep = group.try_rank(rank);
                if (!ep) {
                    st->lost(subtree, rank, ep.code(), ep.error().message());
                    st->done();
                    continue;
                }
                auto call = Procedure<WireSig>(engine, info).on(*ep);
                if (st->deadline != TimePoint::max())
                    call = call.timeout(time_for_calls_below(st->deadline, Duration::zero()));
                auto fut = call(version, root, k, signature, args);
                st->calls.push_back(fut.state());
                std::move(fut).then([st, subtree, rank](Result<Collective<R>>&& r) {
                    if (r)
                        st->below(subtree, std::move(*r));
                    else
                        st->lost(subtree, rank, r.code(),
                                 "rank " + std::to_string(rank) + ": " + r.error().message());
                    st->done();
                });
            } catch (const std::exception& e) {  // an argument's serialize threw, say
                st->lost(
                    subtree, rank, Errc::internal,
                    "rank " + std::to_string(rank) + ": the call could not be sent: " + e.what());
                st->done();
            }
        }
        if (!st->calls.empty() && st->req.valid())
            st->watch = st->req.on_cancel([weak = std::weak_ptr<Gather>(st)] {
                if (auto g = weak.lock()) g->cancel_below();
            });
        try {
            st->local(self, std::apply(handler, args));
        } catch (const std::exception& e) {
            st->lost({self}, self, Errc::internal,
                     "rank " + std::to_string(self) + ": the handler of " + what +
                         " threw: " + e.what());
        } catch (...) {
            st->lost({self}, self, Errc::internal,
                     "rank " + std::to_string(self) + ": the handler of " + what +
                         " threw a non-standard exception");
        }
        st->done();
    }

    template <class H, class F>
    static Result<void> define(Group& group, std::string_view name, H handler, F reduce) {
        static_assert(std::is_invocable_r_v<R, const H&, const std::decay_t<Args>&...>,
                      "talaria: a collective's handler takes the procedure's arguments and "
                      "returns its result type");
        static_assert(std::is_invocable_r_v<R, const F&, const R&, const R&>,
                      "talaria: a collective's reduction combines two results into one: "
                      "R reduce(const R&, const R&)");
        static_assert(std::is_copy_constructible_v<F>,
                      "talaria: a collective's reduction must be copyable");
        auto h = std::make_shared<const H>(std::move(handler));
        auto red = std::make_shared<const Reduce>(std::move(reduce));
        // The engine keeps the handler until it closes: it holds the group weakly, so that the
        // group (and its failure detector's thread) goes with the user's last handle.
        std::weak_ptr<Group::Impl> weak = group.impl_;
        auto fn = [weak, n = std::string(name), h, red](Request req, GroupStamp version,
                                                        uint32_t root, uint32_t k,
                                                        uint64_t signature, Tuple args) {
            auto impl = weak.lock();
            if (!impl) {
                (void)req.try_respond_error(Errc::shutdown,
                                            "collective '" + n + "': this rank's group is gone");
                return;
            }
            serve(Group(std::move(impl)), n, *h, red, std::move(req), version, root, k, signature,
                  args);
        };
        using Fn = decltype(fn);
        if (auto r =
                define_params<Fn, void>(*group.engine_state(), Group::wire_name(name), 0, nullptr,
                                        std::move(fn), typename FnTraits<Fn>::Params{});
            !r)
            return r;
        // A member's own broadcast runs its rank's part here, not through a call to itself. The
        // group keeps this starter, so it holds the handler and the reduction weakly (the engine
        // owns them): a handler that holds a Group makes no cycle.
        auto start = std::make_shared<LocalStart>(
            [n = std::string(name), wh = std::weak_ptr<const H>(h),
             wr = std::weak_ptr<const Reduce>(red)](
                Group& g, const Group::View& v, const CollectiveOptions& opts,
                Tuple&& args) -> std::optional<Future<Collective<R>>> {
                auto hs = wh.lock();
                auto rs = wr.lock();
                if (!hs || !rs) return std::nullopt;
                return start_local(g, v, n, *hs, rs, opts, std::move(args));
            });
        group.keep_local(std::string(name), kSignature, typeid(LocalStart), std::move(start));
        return ok();
    }

    /// The root's part in this process, for a member's broadcast: its future completes from
    /// the calls below (on the engine's threads, or on the thread that waits for it on a
    /// manual engine), and its cancel cancels them.
    template <class H>
    static Future<Collective<R>> start_local(Group& group, const Group::View& v,
                                             const std::string& name, const H& handler,
                                             const std::shared_ptr<const Reduce>& reduce,
                                             const CollectiveOptions& opts, Tuple&& args) {
        EngineState* engine = group.engine_state();
        auto state = std::make_shared<State<Collective<R>>>();
        const CallSite site = call_site(*engine, 0, *state);
        const Duration t = opts.timeout > Duration::zero() ? opts.timeout : site.default_timeout;
        auto st = std::make_shared<Gather>(Request{}, reduce, "collective '" + name + "'");
        if (t > Duration::zero()) st->deadline = Clock::now() + t;
        st->local_state = state;
        state->set_canceler(std::weak_ptr<Canceler>(st));  // Future::cancel cancels the tree
        Future<Collective<R>> fut(state);
        fan_out(group, v, name, handler, st, v.stamp(), *v.self, opts.k, kSignature, args);
        return fut;
    }

    template <class... A>
    static Future<Collective<R>> call(Group& group, const CollectiveOptions& opts,
                                      std::string_view name, const A&... args) {
        const Group::View v = group.view();
        if (auto shape = KnomialTree{1, 0, opts.k}.check(); !shape)
            return Future<Collective<R>>::ready_with(std::move(shape).error());
        if (v.members.empty())
            return Future<Collective<R>>::ready_with(
                Error{Errc::invalid_state,
                      "collective '" + std::string(name) + "': the group has no member left"});
        if (v.self)
            if (auto start = group.local_collective(name, kSignature, typeid(LocalStart)))
                if (auto fut = (*std::static_pointer_cast<LocalStart>(start))(group, v, opts,
                                                                              Tuple(args...)))
                    return std::move(*fut);
        const uint32_t root = v.self ? *v.self : v.members.front();
        auto ep = group.try_rank(root);
        if (!ep)
            return Future<Collective<R>>::ready_with(
                Error{ep.code(),
                      "collective '" + std::string(name) + "': its root, " + ep.error().message()});
        EngineState* engine = group.engine_state();
        auto p = Procedure<WireSig>(engine, proc_info(*engine, Group::wire_name(name))).on(*ep);
        if (opts.timeout > Duration::zero()) p = p.timeout(opts.timeout);
        return p(v.stamp(), root, opts.k, kSignature, Tuple(args...));
    }
};

}  // namespace detail

template <class Sig, class H, class Reduce>
Result<void> Group::try_define_collective(std::string_view name, H handler, Reduce reduce) {
    return detail::CollectiveCall<Sig>::define(*this, name, std::move(handler), std::move(reduce));
}

template <class T, class F>
Result<void> Group::try_define_gather(std::string_view name, F value) {
    static_assert(std::is_invocable_r_v<T, const F&>,
                  "talaria: a gather's value function takes nothing and returns T");
    const auto self = self_rank();
    if (!self)
        return Error{Errc::invalid_state,
                     "Group::define_gather: this engine is not a member of its group (give Group "
                     "its rank)"};
    using V = std::vector<Ranked<T>>;
    return try_define_collective<V()>(
        name,
        [value = std::move(value), r = *self] {
            return V{Ranked<T>{r, value()}};
        },
        [](const V& a, const V& b) {
            V out;
            out.reserve(a.size() + b.size());
            std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out),
                       [](const Ranked<T>& x, const Ranked<T>& y) { return x.rank < y.rank; });
            return out;
        });
}

template <class Sig, class... A>
auto Group::broadcast(const CollectiveOptions& opts, std::string_view name, const A&... args) {
    return detail::CollectiveCall<Sig>::call(*this, opts, name, args...);
}

}  // namespace talaria

#pragma GCC visibility pop
