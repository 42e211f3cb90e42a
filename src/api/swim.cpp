// SWIM failure detection (src/api/swim.hpp).
#include "api/swim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <utility>

#include "api/state_access.hpp"
#include "talaria/api/define.hpp"
#include "talaria/api/procedure.hpp"
#include "talaria/util/log.hpp"

namespace talaria {

std::string_view rank_state_name(RankState s) noexcept {
    switch (s) {
        case RankState::alive:
            return "alive";
        case RankState::suspect:
            return "suspect";
        case RankState::dead:
            return "dead";
    }
    return "unknown";
}

namespace {

using PingSig = SwimMessage(SwimMessage);

/// Times a piece of gossip is sent: 3 ceil(log2(n + 1)), as SWIM's dissemination needs to
/// reach every rank with high probability.
unsigned send_limit(std::size_t ranks) {
    return 3 * unsigned(std::bit_width(ranks + 1));
}

}  // namespace

Swim::Swim(detail::EngineState* engine, std::shared_ptr<GroupSource> source, uint32_t self,
           std::vector<Peer> peers, FailureDetection options)
    : engine_(engine),
      source_(std::move(source)),
      self_(self),
      opt_(std::move(options)),
      peers_(std::move(peers)),
      rng_(std::random_device{}() ^ (uint64_t(self) << 32)) {}

Swim::~Swim() {
    stop();
}

Result<void> Swim::start(const FailureDetection& options, std::vector<Listener> listeners) {
    std::lock_guard control(control_);
    {
        std::lock_guard g(mu_);
        if (thread_.joinable())
            return Error{Errc::invalid_state, "Group: failure detection already runs"};
        if (ping_info_ && options.name != opt_.name)
            return Error{Errc::invalid_argument,
                         fmt::format("Group: failure detection ran as '{}': it cannot start "
                                     "again as '{}'",
                                     opt_.name, options.name)};
        opt_ = options;
        listeners_ = std::move(listeners);
        stop_ = false;
    }
    if (!defined()) {
        const std::string base = "talaria.swim." + opt_.name;
        {
            // Set before the handlers exist: a ping_req may arrive as soon as they do.
            std::lock_guard g(mu_);
            ping_info_ = detail::proc_info(*engine_, base + ".ping");
            ping_req_info_ = detail::proc_info(*engine_, base + ".ping_req");
        }
        auto undefined = [this] {
            std::lock_guard g(mu_);
            ping_info_ = ping_req_info_ = nullptr;
        };
        std::weak_ptr<Swim> weak = weak_from_this();
        // Async handlers (Request by value): they answer with the error a Result carries.
        auto ping_fn = [weak](Request req, SwimMessage m) {
            auto self = weak.lock();
            if (!self) {
                (void)req.try_respond_error(Errc::shutdown, "failure detection has ended");
                return;
            }
            auto r = self->on_ping(m);
            if (r)
                (void)req.try_respond(*r);
            else
                (void)req.try_respond_error(r.code(), r.error().message());
        };
        auto ping_req_fn = [weak](Request req, SwimMessage m) {
            if (auto self = weak.lock())
                self->on_ping_req(std::move(req), std::move(m));
            else
                (void)req.try_respond_error(Errc::shutdown, "failure detection has ended");
        };
        using P = decltype(ping_fn);
        using Q = decltype(ping_req_fn);
        if (auto r = detail::define_params<P, void>(*engine_, base + ".ping", 0, nullptr,
                                                    std::move(ping_fn),
                                                    typename detail::FnTraits<P>::Params{});
            !r) {
            undefined();
            return Error{r.code(), fmt::format("Group: failure detection '{}': {}", opt_.name,
                                               r.error().message())};
        }
        if (auto r = detail::define_params<Q, void>(*engine_, base + ".ping_req", 0, nullptr,
                                                    std::move(ping_req_fn),
                                                    typename detail::FnTraits<Q>::Params{});
            !r) {
            (void)detail::undefine_through(engine_, base + ".ping");  // not half of it
            undefined();
            return Error{r.code(), fmt::format("Group: failure detection '{}': {}", opt_.name,
                                               r.error().message())};
        }
    }
    // The thread holds the detector: a listener may drop the group's last handle.
    thread_ = std::thread([self = shared_from_this()] { self->run(); });
    return ok();
}

void Swim::stop() {
    // Not from the detector's own thread (a listener): it cannot join itself.
    const bool own = thread_.joinable() && thread_.get_id() == std::this_thread::get_id();
    std::unique_lock control(control_, std::defer_lock);
    if (!own) control.lock();
    {
        std::lock_guard g(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (!thread_.joinable()) return;
    if (own) {
        // A listener dropped the group's last handle, or this is the thread's own last
        // reference going: it ends at its next check of stop_, and cannot join itself.
        thread_.detach();
        return;
    }
    thread_.join();
}

std::string Swim::name() const {
    std::lock_guard g(mu_);
    return opt_.name;
}

bool Swim::defined() const {
    std::lock_guard g(mu_);
    return ping_info_ != nullptr;
}

bool Swim::running() const {
    std::lock_guard g(mu_);
    return thread_.joinable() && !stop_;
}

RankState Swim::state(uint32_t rank) const {
    std::lock_guard g(mu_);
    return rank < peers_.size() ? peers_[rank].state : RankState::alive;
}

std::optional<std::string> Swim::dead(uint32_t rank) const {
    std::lock_guard g(mu_);
    if (rank >= peers_.size() || peers_[rank].state != RankState::dead) return std::nullopt;
    return fmt::format(
        "Group: rank {} ({}) was declared dead by failure detection (it answered no ping, "
        "direct or through other ranks, and did not refute the suspicion within {} ms)",
        rank, peers_[rank].address.empty() ? "address not resolved" : peers_[rank].address,
        std::chrono::duration_cast<std::chrono::milliseconds>(opt_.suspicion).count());
}

void Swim::add_listener(Listener fn) {
    std::lock_guard g(mu_);
    listeners_.push_back(std::move(fn));
}

void Swim::member(uint32_t rank, std::string address, bool member) {
    std::lock_guard g(mu_);
    if (rank >= peers_.size()) peers_.resize(rank + 1, Peer{std::string(), Endpoint{}, false});
    Peer& p = peers_[rank];
    if (!address.empty()) p.address = std::move(address);
    p.member = member;
    if (!member) p.ep = Endpoint{};
}

// --- gossip -------------------------------------------------------------------------------

void Swim::gossip_locked(const SwimUpdate& u) {
    for (auto& g : gossip_)
        if (g.update.rank == u.rank) {
            g = Gossip{u, 0};
            return;
        }
    gossip_.push_back(Gossip{u, 0});
}

SwimMessage Swim::message_locked(uint32_t target) {
    SwimMessage m;
    m.from = self_;
    m.target = target;
    // The target first hears what we think of it when it is suspect: it refutes at once.
    if (target < peers_.size() && peers_[target].state == RankState::suspect)
        m.updates.push_back({target, uint8_t(RankState::suspect), peers_[target].incarnation});
    // Then the gossip sent least often.
    std::stable_sort(gossip_.begin(), gossip_.end(),
                     [](const Gossip& a, const Gossip& b) { return a.sent < b.sent; });
    const unsigned limit = send_limit(peers_.size());
    for (auto& g : gossip_) {
        if (m.updates.size() >= kPiggyback) break;
        m.updates.push_back(g.update);
        ++g.sent;
    }
    std::erase_if(gossip_, [limit](const Gossip& g) { return g.sent >= limit; });
    return m;
}

void Swim::apply_locked(const SwimUpdate& u, std::vector<Event>& out) {
    if (u.rank >= peers_.size() || u.state > uint8_t(RankState::dead)) return;  // not ours
    const auto state = RankState(u.state);
    if (u.rank == self_) {
        // Told this rank is suspect (or dead): refute with a newer incarnation, and say so
        // again each time (the last refutation's gossip may have run out before reaching the
        // rank that suspects it now).
        if (state != RankState::alive) {
            if (u.incarnation >= incarnation_) incarnation_ = u.incarnation + 1;
            if (state == RankState::dead)
                TALARIA_LOG(api, warn,
                            "group: rank {} was declared dead by another rank; it answers on, "
                            "but the others no longer call it (it must join again as a new "
                            "rank)",
                            self_);
            gossip_locked({self_, uint8_t(RankState::alive), incarnation_});
        }
        return;
    }
    Peer& p = peers_[u.rank];
    if (!p.member || p.state == RankState::dead) return;  // dead is final
    switch (state) {
        case RankState::alive:
            if (u.incarnation <= p.incarnation) return;
            p.incarnation = u.incarnation;
            if (p.state == RankState::suspect) out.push_back({u.rank, RankState::alive, ++events_});
            p.state = RankState::alive;
            break;
        case RankState::suspect:
            if (p.state == RankState::alive ? u.incarnation < p.incarnation
                                            : u.incarnation <= p.incarnation)
                return;
            p.incarnation = u.incarnation;
            if (p.state != RankState::suspect) {
                p.suspect_since = Clock::now();
                out.push_back({u.rank, RankState::suspect, ++events_});
            }
            p.state = RankState::suspect;
            break;
        case RankState::dead:
            p.state = RankState::dead;
            p.ep = Endpoint{};
            out.push_back({u.rank, RankState::dead, ++events_});
            break;
    }
    gossip_locked(u);
}

void Swim::merge_locked(const std::vector<SwimUpdate>& updates, std::vector<Event>& out) {
    const std::size_t n = std::min(updates.size(), kMaxUpdates);
    for (std::size_t i = 0; i < n; ++i)
        apply_locked(updates[i], out);
}

void Swim::expire_locked(TimePoint now, std::vector<Event>& out) {
    for (uint32_t r = 0; r < peers_.size(); ++r) {
        const Peer& p = peers_[r];
        if (p.member && p.state == RankState::suspect && now - p.suspect_since >= opt_.suspicion)
            apply_locked({r, uint8_t(RankState::dead), p.incarnation}, out);
    }
}

void Swim::announce(const std::vector<Event>& events) {
    if (events.empty()) return;
    std::vector<Listener> ls;
    {
        std::lock_guard g(mu_);
        if (stop_) return;  // stopped: the application may have let its listeners go
        ls = listeners_;
    }
    // Changes are made under mu_ on several threads and told after it is released: a change
    // older than one already told about the same rank is dropped, so a listener never sees a
    // rank go back to a state it has left.
    std::lock_guard a(announce_mu_);
    for (const auto& e : events) {
        if (e.rank >= announced_.size()) announced_.resize(e.rank + 1, 0);
        if (e.seq <= announced_[e.rank]) continue;
        announced_[e.rank] = e.seq;
        if (e.state == RankState::alive)
            TALARIA_LOG(api, info, "group: rank {} is alive again (seen by rank {})", e.rank,
                        self_);
        else
            TALARIA_LOG(api, warn, "group: rank {} is {} (seen by rank {})", e.rank,
                        rank_state_name(e.state), self_);
        for (const auto& fn : ls)
            fn(e.rank, e.state);
    }
}

// --- the wire -------------------------------------------------------------------------------

Future<SwimMessage> Swim::ping(const Endpoint& ep, SwimMessage m, Duration timeout) {
    auto p = Procedure<PingSig>(engine_, ping_info_)
                 .on(ep)
                 .timeout(std::max<Duration>(timeout, std::chrono::microseconds(100)));
    return p(m);
}

Result<SwimMessage> Swim::on_ping(const SwimMessage& m) {
    std::vector<Event> events;
    SwimMessage out;
    {
        std::lock_guard g(mu_);
        if (m.target != self_)
            return Error{Errc::invalid_argument,
                         fmt::format("a ping for rank {} reached rank {} (the group's addresses "
                                     "differ between ranks)",
                                     m.target, self_)};
        merge_locked(m.updates, events);
        out = message_locked(m.from);
    }
    announce(events);
    return out;
}

void Swim::on_ping_req(Request req, SwimMessage m) {
    const uint32_t target = m.target;
    std::vector<Event> events;
    SwimMessage ping_msg;
    {
        std::lock_guard g(mu_);
        if (target >= peers_.size() || target == self_) {
            (void)req.try_respond_error(
                Errc::invalid_argument,
                fmt::format("rank {} cannot ping rank {} for another", self_, target));
            return;
        }
        merge_locked(m.updates, events);
        ping_msg = message_locked(target);
    }
    announce(events);
    auto ep = endpoint(target);
    if (!ep) {
        (void)req.try_respond_error(ep.code(), ep.error().message());
        return;
    }
    Duration left;
    {
        std::lock_guard g(mu_);
        left = opt_.period;
    }
    if (req.deadline() != TimePoint::max()) left = std::min(left, req.deadline() - Clock::now());
    auto held = std::make_shared<Request>(std::move(req));
    std::weak_ptr<Swim> weak = weak_from_this();
    ping(*ep, std::move(ping_msg), left).then([held, weak](Result<SwimMessage>&& r) {
        if (!r) {
            (void)held->try_respond_error(r.code(), r.error().message());
            return;
        }
        if (auto self = weak.lock()) {
            std::vector<Event> ev;
            {
                std::lock_guard g(self->mu_);
                self->merge_locked(r->updates, ev);
            }
            self->announce(ev);
        }
        (void)held->try_respond(*r);
    });
}

Result<Endpoint> Swim::endpoint(uint32_t rank) {
    std::string address;
    {
        std::lock_guard g(mu_);
        if (rank >= peers_.size())
            return Error{Errc::out_of_range, fmt::format("Group: no rank {}", rank)};
        if (peers_[rank].ep.valid()) return peers_[rank].ep;
        address = peers_[rank].address;
    }
    if (address.empty() && source_) {
        auto a = source_->address(rank);
        if (!a) return std::move(a).error();
        address = std::move(*a);
    }
    auto ep = detail::lookup_through(engine_, address);
    if (!ep) return std::move(ep).error();
    std::lock_guard g(mu_);
    Peer& p = peers_[rank];
    if (p.address.empty()) p.address = address;
    if (!p.ep.valid() && p.state != RankState::dead) p.ep = *ep;
    return *ep;
}

// --- the probes -----------------------------------------------------------------------------

std::optional<uint32_t> Swim::next_target_locked() {
    auto live = [this](uint32_t r) {
        return r != self_ && r < peers_.size() && peers_[r].member &&
               peers_[r].state != RankState::dead;
    };
    for (int pass = 0; pass < 2; ++pass) {
        while (!round_.empty()) {
            const uint32_t r = round_.back();
            round_.pop_back();
            if (live(r)) return r;
        }
        // A new round: every live rank once, in a new random order.
        for (uint32_t r = 0; r < peers_.size(); ++r)
            if (live(r)) round_.push_back(r);
        std::shuffle(round_.begin(), round_.end(), rng_);
    }
    return std::nullopt;
}

Result<SwimMessage> Swim::answer_by(Future<SwimMessage>& f, TimePoint until) {
    const Duration left = until - Clock::now();
    if (left <= Duration::zero() || !f.wait_for(left)) {
        (void)f.cancel();
        return Error{Errc::timeout, "no answer in time"};
    }
    return f.try_get();
}

bool Swim::probe(uint32_t target, TimePoint period_end) {
    const Duration direct_wait = opt_.ping_timeout > Duration::zero()
                                     ? std::min(opt_.ping_timeout, opt_.period)
                                     : opt_.period / 2;
    auto answered = [&](Result<SwimMessage>&& r) {
        if (!r || r->from != target) return false;
        std::vector<Event> events;
        {
            std::lock_guard g(mu_);
            merge_locked(r->updates, events);
        }
        announce(events);
        return true;
    };
    if (auto ep = endpoint(target)) {
        SwimMessage m;
        {
            std::lock_guard g(mu_);
            m = message_locked(target);
        }
        auto f = ping(*ep, std::move(m), direct_wait);
        if (answered(answer_by(f, Clock::now() + direct_wait + std::chrono::milliseconds(5))))
            return true;
    }
    // Through others: up to `indirect` live ranks, at random, for the rest of the period.
    std::vector<uint32_t> helpers;
    {
        std::lock_guard g(mu_);
        for (uint32_t r = 0; r < peers_.size(); ++r)
            if (r != self_ && r != target && peers_[r].member &&
                peers_[r].state == RankState::alive)
                helpers.push_back(r);
        std::shuffle(helpers.begin(), helpers.end(), rng_);
    }
    if (helpers.size() > opt_.indirect) helpers.resize(opt_.indirect);
    const Duration left = period_end - Clock::now();
    if (helpers.empty() || left <= Duration::zero()) return false;
    std::vector<Future<SwimMessage>> asks;
    for (uint32_t h : helpers) {
        auto ep = endpoint(h);
        if (!ep) continue;
        SwimMessage m;
        {
            std::lock_guard g(mu_);
            m = message_locked(h);
        }
        m.target = target;
        asks.push_back(Procedure<PingSig>(engine_, ping_req_info_)
                           .on(*ep)
                           .timeout(std::max<Duration>(left, std::chrono::microseconds(100)))(m));
    }
    bool ok = false;
    for (auto& f : asks)  // each ends by the period's end (its timeout)
        if (!ok && answered(answer_by(f, period_end + std::chrono::milliseconds(5)))) ok = true;
    for (auto& f : asks)  // the rest are not waited for
        if (f.valid()) (void)f.cancel();
    return ok;
}

void Swim::run() {
    std::unique_lock lk(mu_);
    while (!stop_) {
        const TimePoint start = Clock::now();
        const TimePoint end = start + opt_.period;
        std::vector<Event> events;
        expire_locked(start, events);
        const auto target = next_target_locked();
        lk.unlock();
        announce(events);
        events.clear();
        {
            std::lock_guard g(mu_);
            if (stop_) break;  // after stop() the engine may close: touch it no more
        }
        if (target && !probe(*target, end)) {
            lk.lock();
            if (*target < peers_.size() && peers_[*target].state == RankState::alive)
                apply_locked({*target, uint8_t(RankState::suspect), peers_[*target].incarnation},
                             events);
            lk.unlock();
            announce(events);
        }
        lk.lock();
        cv_.wait_until(lk, end, [this] { return stop_; });
    }
}

}  // namespace talaria
