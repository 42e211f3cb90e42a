// SWIM failure detection for a Group (include/talaria/api/group.hpp, FailureDetection).
//
// One Swim per group that runs detection. It keeps its own view of the ranks (address,
// endpoint, state, incarnation), so that it never holds the group itself: its thread and the
// procedures it defines on the engine own the Swim, and the group owns them only through it.
// Membership changes reach it from the group (member()).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/group_impl.hpp"
#include "talaria/api/endpoint.hpp"
#include "talaria/api/group.hpp"
#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria {

/// One piece of gossip: `rank` is in `state` at `incarnation`.
struct SwimUpdate {
    uint32_t rank = 0;
    uint8_t state = 0;  ///< RankState
    uint64_t incarnation = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(rank, state, incarnation);
    }
};

/// A ping, a ping request, and the answer to either: who sends it, whom it is for, and the
/// gossip it carries.
struct SwimMessage {
    uint32_t from = 0;
    uint32_t target = 0;
    std::vector<SwimUpdate> updates;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(from, target, updates);
    }
};

class Swim : public std::enable_shared_from_this<Swim> {
  public:
    using Listener = std::function<void(uint32_t, RankState)>;
    /// Gossip carried by one message, at most.
    static constexpr std::size_t kPiggyback = 8;
    /// Updates of one message looked at, at most (a peer may send more).
    static constexpr std::size_t kMaxUpdates = 64;

    struct Peer {
        std::string address;  ///< empty until resolved (a launcher's rank)
        Endpoint ep;
        bool member = true;
        RankState state = RankState::alive;
        uint64_t incarnation = 0;
        TimePoint suspect_since{};
    };

    Swim(detail::EngineState* engine, std::shared_ptr<GroupSource> source, uint32_t self,
         std::vector<Peer> peers, FailureDetection options);
    ~Swim();
    Swim(const Swim&) = delete;
    Swim& operator=(const Swim&) = delete;

    /// Define the procedures (the first time) and start the thread, with `options` (whose name
    /// must be the first start's).
    Result<void> start(const FailureDetection& options, std::vector<Listener> listeners);
    /// Stop the thread (idempotent; not from the thread itself).
    void stop();
    [[nodiscard]] bool running() const;
    /// Whether its procedures are defined on the engine (a first start that succeeded).
    [[nodiscard]] bool defined() const;
    /// The name its procedures are defined under (talaria.swim.<name>.ping).
    [[nodiscard]] std::string name() const;

    [[nodiscard]] RankState state(uint32_t rank) const;
    /// Why calls to `rank` fail, when it is dead.
    [[nodiscard]] std::optional<std::string> dead(uint32_t rank) const;
    void add_listener(Listener fn);
    /// The group added or removed `rank`.
    void member(uint32_t rank, std::string address, bool member);

    /// The ping and ping_req handlers (public for the procedures' lambdas).
    Result<SwimMessage> on_ping(const SwimMessage& m);
    void on_ping_req(Request req, SwimMessage m);

  private:
    struct Event {
        uint32_t rank;
        RankState state;
        uint64_t seq;  ///< the order the changes were made in (events_)
    };
    struct Gossip {
        SwimUpdate update;
        unsigned sent = 0;
    };

    void run();
    /// One probe of `target`: direct, then through others; true if it answered.
    bool probe(uint32_t target, TimePoint period_end);
    [[nodiscard]] std::optional<uint32_t> next_target_locked();
    [[nodiscard]] Result<Endpoint> endpoint(uint32_t rank);
    [[nodiscard]] SwimMessage message_locked(uint32_t target);
    /// Fold a peer's gossip in; events to announce go to `out`.
    void merge_locked(const std::vector<SwimUpdate>& updates, std::vector<Event>& out);
    void apply_locked(const SwimUpdate& u, std::vector<Event>& out);
    void gossip_locked(const SwimUpdate& u);
    void expire_locked(TimePoint now, std::vector<Event>& out);
    void announce(const std::vector<Event>& events);
    Future<SwimMessage> ping(const Endpoint& ep, SwimMessage m, Duration timeout);
    /// The answer of `f` if it comes by `until`; otherwise the call is canceled. The detector
    /// never waits past its period: a progress thread may be joining it (~Impl).
    static Result<SwimMessage> answer_by(Future<SwimMessage>& f, TimePoint until);

    detail::EngineState* const engine_;
    const std::shared_ptr<GroupSource> source_;
    const uint32_t self_;
    FailureDetection opt_;  ///< changed only while the thread does not run
    const detail::ProcInfo* ping_info_ = nullptr;
    const detail::ProcInfo* ping_req_info_ = nullptr;

    std::mutex control_;  ///< held through start() and stop(): one at a time
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    uint64_t events_ = 0;              ///< changes made, under mu_
    std::mutex announce_mu_;           ///< listeners are called under it, one event at a time
    std::vector<uint64_t> announced_;  ///< by rank: the last change told, under announce_mu_
    std::vector<Peer> peers_;          // under mu_
    uint64_t incarnation_ = 0;         // this rank's, under mu_
    std::vector<Gossip> gossip_;       // under mu_
    std::vector<uint32_t> round_;      // the targets left in this round, under mu_
    std::vector<Listener> listeners_;  // under mu_
    std::mt19937_64 rng_;              // under mu_
    std::thread thread_;
};

}  // namespace talaria
