// The ofi transport's shared-secret authentication (na::Options::auth; docs/protocol.md, ofi
// "auth"). Endpoints are connectionless and every message names its sender in its header, so
// two processes prove the secret to each other once, by messages of kind `auth` between the
// connector's lane and the acceptor's context 0: request (key id, nonce), challenge (nonce,
// proof), response (proof), ok. The proofs are tcp's (na/base/auth.hpp). Until the acceptor has
// checked the response, nothing the connector sends is delivered there (source_locked refuses
// senders that have not proved the secret); until the connector has the ok, its sends wait on
// their routes (Route::authing). A refusal says why, to both sides' logs and to the sends it
// fails with access_denied.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "na/base/auth.hpp"
#include "na/ofi/ofi.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ofi {

Addr OfiTransport::auth_peer_locked(std::span<const std::byte> raw) {
    std::string_view r(reinterpret_cast<const char*>(raw.data()), raw.size());
    if (Addr a = find_raw(r, 0)) return a;
    std::string canonical = canonical_of(raw);
    if (canonical.empty()) return {};
    std::lock_guard g(intern_mu_);
    return intern_locked(canonical, std::string(r));
}

void OfiTransport::send_auth_locked(OfiLane& l, Remote* to, AuthStep step,
                                    std::span<const std::byte> body) {
    if (auto ins = av_insert_locked(l, to); !ins) {
        TALARIA_LOG(ofi, debug, "{}: cannot send an auth message to {}: {}", scheme_,
                    ofi_addr(to->peer)->str, ins.error().message());
        return;
    }
    Ctl* c = ctl_alloc_locked(l);
    if (!c) return;
    std::byte* start = c->buf.data() - l.header_size;
    std::memcpy(start, l.header, l.header_size);
    start[1] = std::byte(uint8_t(MsgKind::auth));
    start[2] = std::byte(0);
    detail::store_le(start + 4, uint32_t(step), 4);
    if (!body.empty()) std::memcpy(c->buf.data(), body.data(), body.size());
    send_ctl_or_retry_locked(l, c, l.header_size + body.size(), to,
                             fmt::format("an auth message (step {})", uint32_t(step)));
}

bool OfiTransport::stranger_log_due(std::size_t* unlogged) {
    auto held = strangers_log_.admit();
    if (!held) return false;
    *unlogged = std::size_t(*held);
    return true;
}

Remote* OfiTransport::stranger_remote_locked(OfiLane& l, std::string_view lraw, const Addr& who) {
    if (l.remotes.size() < kMaxStrangerRemotes || l.remotes.find(lraw) != l.remotes.end())
        return remote_locked(l, lraw, who);
    std::size_t unlogged = 0;
    if (!stranger_log_due(&unlogged)) return nullptr;
    TALARIA_LOG(ofi, warn,
                "{}: context {} knows {} endpoints already: {} goes unanswered until it proves "
                "the shared secret from an endpoint we know{}",
                scheme_, l.id, l.remotes.size(), ofi_addr(who)->str, unlogged_note(unlogged));
    return nullptr;
}

void OfiTransport::send_refusal_locked(OfiLane& l, Remote* to, std::string_view why) {
    if (to == nullptr) return;  // a stranger past kMaxStrangerRemotes: no answer
    TALARIA_LOG(ofi, warn, "{}: refusing {}: {}", scheme_, ofi_addr(to->peer)->str, why);
    if (why.size() > kAuthMaxReason) why = why.substr(0, kAuthMaxReason);
    send_auth_locked(l, to, AuthStep::refused, std::as_bytes(std::span(why)));
}

bool OfiTransport::auth_hold_locked(OfiLane& l, OfiAddr* a, Route& route, OfiOp* op) {
    const auto now = Clock::now();
    if (a->auth.load(std::memory_order_acquire) == AuthState::refused) {
        std::string why;
        {
            std::lock_guard g(auth_mu_);
            if (now - a->auth_since < kAuthRefusedFor) why = a->auth_refusal;
        }
        if (!why.empty()) {
            TALARIA_LOG(ofi, debug, "{}: a send to {} fails: {}", scheme_, a->str, why);
            op_finished(l, op, Errc::access_denied);
            return true;
        }
        if (!opts_.auth.enabled()) {
            // Without a secret of ours, a refusal only says why sends failed a while.
            AuthState st = AuthState::refused;
            a->auth.compare_exchange_strong(st, AuthState::none, std::memory_order_acq_rel);
            return false;
        }
    }
    if (!opts_.auth.enabled() && !route.authing) return false;
    op->state = OpState::routing;
    op->route = &route;
    route.waiting.push_back(*op);
    if (!route.authing) {
        route.authing = true;
        ++l.locating;  // progress does not sleep long while it waits
    }
    // (Admitted already, its route not yet released: behind the sends that wait, in order.)
    if (a->auth.load(std::memory_order_acquire) != AuthState::admitted) dial_locked(l, a, now);
    return true;
}

auth::Proof OfiTransport::bind(std::span<const std::byte> nonce, std::span<const std::byte> raw_c,
                               uint64_t inst_c, std::span<const std::byte> raw_a,
                               uint64_t inst_a) const {
    std::byte ic[8], ia[8];
    detail::store_le(ic, inst_c, 8);
    detail::store_le(ia, inst_a, 8);
    std::byte lc = std::byte(uint8_t(raw_c.size())), la = std::byte(uint8_t(raw_a.size()));
    return auth::mac(nonce, {std::span(&lc, 1), raw_c, ic, std::span(&la, 1), raw_a, ia});
}

std::pair<uint64_t, uint64_t> OfiTransport::tokens(const auth::Proof& bound_c,
                                                   const auth::Proof& bound_a) const {
    const Auth& a = opts_.auth;
    auto first8 = [](const auth::Proof& p) {
        uint64_t t = detail::load_le(p.data(), 8);
        return t == 0 ? uint64_t{1} : t;
    };
    return {first8(auth::derive(a.secret, "talaria ofi v1 token to acceptor", bound_c, bound_a,
                                a.key_id)),
            first8(auth::derive(a.secret, "talaria ofi v1 token to connector", bound_c, bound_a,
                                a.key_id))};
}

void OfiTransport::dial_locked(OfiLane& l, OfiAddr* a, TimePoint now) {
    const Auth& au = opts_.auth;
    std::byte body[kAuthMaxPayload];
    std::size_t n = 0;
    {
        std::lock_guard g(auth_mu_);
        const AuthState st = a->auth.load(std::memory_order_acquire);
        if (st == AuthState::admitted) return;
        if (st == AuthState::dialing && now - a->auth_since < kAuthTimeout) return;
        if (st == AuthState::refused && now - a->auth_since < kAuthRefusedFor) return;
        auto nonce = auth::random_nonce();
        if (!nonce) {
            a->auth_refusal = nonce.error().describe();
            a->auth_since = now;
            a->auth.store(AuthState::refused, std::memory_order_release);
            return;
        }
        a->auth_nonce = *nonce;
        a->auth_since = now;
        a->auth.store(AuthState::dialing, std::memory_order_release);
        n = encode_auth_request(au.key_id, *nonce, body);
    }
    TALARIA_LOG(ofi, debug, "{}: context {} authenticates to {}", scheme_, l.id, a->str);
    // To its context 0 (its transport address); the answers come back to this lane.
    send_auth_locked(l, remote_locked(l, a->raw, Addr(a)), AuthStep::request,
                     std::span<const std::byte>(body, n));
}

void OfiTransport::check_auth_locked(OfiLane& l, TimePoint now) {
    // What is due first: acting on a route may declare its peer dead, which erases routes.
    // Also routes locating at a peer that refused us (we hold no secret, it wants one): its
    // refusal fails them now rather than their locates' timeout.
    auto due_now = [](const Route& r) {
        return r.authing || (r.locating && ofi_addr(r.peer)->auth.load(std::memory_order_acquire) ==
                                               AuthState::refused);
    };
    std::vector<RouteKey> due;
    for (auto& [key, r] : l.routes)
        if (due_now(r)) due.push_back(key);
    for (const RouteKey& key : due) {
        auto it = l.routes.find(key);
        if (it == l.routes.end() || !due_now(it->second)) continue;
        Route& r = it->second;
        OfiAddr* a = ofi_addr(r.peer);
        if (a->dead.load(std::memory_order_relaxed)) {
            route_failed_locked(l, r, Errc::disconnected, "the peer was declared dead");
            continue;
        }
        switch (a->auth.load(std::memory_order_acquire)) {
            case AuthState::admitted:
                if (!r.authing) break;
                r.authing = false;
                --l.locating;
                if (r.rem)
                    route_found_locked(l, r, r.rem);
                else
                    send_locate_locked(l, r, now);
                break;
            case AuthState::refused: {
                std::string why;
                {
                    std::lock_guard g(auth_mu_);
                    why = a->auth_refusal;
                }
                route_failed_locked(l, r, Errc::access_denied, why);
                break;
            }
            case AuthState::dialing: {
                bool late = false;
                {
                    std::lock_guard g(auth_mu_);
                    if (now - a->auth_since >= kAuthTimeout) {
                        late = true;
                        a->auth.store(AuthState::none, std::memory_order_release);
                    }
                }
                if (late) {
                    note(LinkEvent::connect_failed);
                    route_failed_locked(
                        l, r, Errc::unreachable,
                        fmt::format("{} did not finish authenticating within {} s: its context 0 "
                                    "answers, so it must exist and be progressed (and hold "
                                    "na::Options::auth)",
                                    a->str,
                                    std::chrono::duration_cast<std::chrono::seconds>(kAuthTimeout)
                                        .count()));
                }
                break;
            }
            case AuthState::none:
                if (r.authing) dial_locked(l, a, now);  // another lane's timed out: ours now
                break;
        }
    }
}

void OfiTransport::refuse_stranger_locked(OfiLane& l, const MsgHeader& h) {
    std::size_t unlogged = 0;
    if (!stranger_log_due(&unlogged)) return;
    Addr who = auth_peer_locked(h.raw_addr);
    if (!who) return;
    auto lane_raw = h.lane_addr.empty() ? h.raw_addr : h.lane_addr;
    if (!h.lane_addr.empty() && canonical_of(h.lane_addr).empty()) return;
    std::string_view lraw(reinterpret_cast<const char*>(lane_raw.data()), lane_raw.size());
    TALARIA_LOG(ofi, warn,
                "{}: context {} drops a message from {} (instance {:016x}), which has not proved "
                "the shared secret{}",
                scheme_, l.id, ofi_addr(who)->str, h.instance, unlogged_note(unlogged));
    send_refusal_locked(l, stranger_remote_locked(l, lraw, who),
                        fmt::format("this server admits only peers that authenticate with the "
                                    "secret of key '{}': set na::Options::auth on the client",
                                    opts_.auth.key_id));
}

void OfiTransport::on_auth_locked(OfiLane& l, const MsgHeader& h,
                                  std::span<const std::byte> payload) {
    auto m = decode_auth(h.tag, payload);
    if (!m) {
        TALARIA_LOG(ofi, warn, "{}: dropping an auth message: {}", scheme_, m.error().message());
        return;
    }
    // Answers go to the lane the sender names (one of its endpoints: checked).
    if (!h.lane_addr.empty() && canonical_of(h.lane_addr).empty()) {
        TALARIA_LOG(ofi, warn,
                    "{}: dropping an auth message: its lane address is not an {} "
                    "endpoint",
                    scheme_, scheme_);
        return;
    }
    Addr who = auth_peer_locked(h.raw_addr);
    if (!who) {
        TALARIA_LOG(ofi, warn,
                    "{}: dropping an auth message from an address that is not an {} "
                    "endpoint",
                    scheme_, scheme_);
        return;
    }
    OfiAddr* pa = ofi_addr(who);
    auto lane_raw = h.lane_addr.empty() ? h.raw_addr : h.lane_addr;
    std::string_view lraw(reinterpret_cast<const char*>(lane_raw.data()), lane_raw.size());
    std::string_view raw(reinterpret_cast<const char*>(h.raw_addr.data()), h.raw_addr.size());
    const Auth& a = opts_.auth;
    const auto now = Clock::now();
    switch (m->step) {
        case AuthStep::request: {
            Remote* to = stranger_remote_locked(l, lraw, who);
            if (to == nullptr) return;
            if (!a.enabled()) {
                note(LinkEvent::connect_failed);  // its attempt, refused here
                send_refusal_locked(l, to,
                                    "the client asked to authenticate, but this server has no "
                                    "shared secret (na::Options::auth): configure the same key id "
                                    "and secret on both sides");
                return;
            }
            if (m->key_id != a.key_id) {
                note(LinkEvent::connect_failed);
                // Escaped ({:?}): the peer's bytes go to our log and back to it.
                send_refusal_locked(l, to,
                                    fmt::format("the client names key {:?}, this server holds key "
                                                "'{}'",
                                                m->key_id, a.key_id));
                return;
            }
            auto nonce = auth::random_nonce();
            if (!nonce) return;
            // Both nonces bound to the two ends: the connector as its header names it, and us
            // as our headers name us.
            const auto own_raw = std::as_bytes(std::span(lane_at(0)->raw));
            AuthPending p;
            p.raw.assign(raw);
            p.instance = h.instance;
            p.own = bind(*nonce, h.raw_addr, h.instance, own_raw, instance_);
            p.peer = bind(m->nonce, h.raw_addr, h.instance, own_raw, instance_);
            p.since = now;
            {
                std::lock_guard g(auth_mu_);
                std::erase_if(auth_pending_, [&](const AuthPending& o) {
                    return now - o.since >= kAuthTimeout ||
                           (o.raw == p.raw && o.instance == p.instance);
                });
                if (auth_pending_.size() >= kMaxAuthPending)
                    auth_pending_.erase(auth_pending_.begin());
                auth_pending_.push_back(p);
            }
            const auth::Proof proof =
                auth::prove(a.secret, auth::Role::acceptor, p.own, p.peer, a.key_id);
            std::byte body[kAuthNonceSize + kAuthProofSize];
            std::memcpy(body, nonce->data(), kAuthNonceSize);
            std::memcpy(body + kAuthNonceSize, proof.data(), kAuthProofSize);
            send_auth_locked(l, to, AuthStep::challenge, body);
            return;
        }
        case AuthStep::challenge: {
            if (!a.enabled()) return;  // we never asked
            auth::Proof reply{};
            bool replaced = false;
            {
                std::lock_guard g(auth_mu_);
                if (pa->auth.load(std::memory_order_acquire) != AuthState::dialing) return;
                // Both nonces bound to the two ends: us as our headers name us, the acceptor as
                // its header names it (a relay between two other processes proves nothing).
                const auto own_raw = std::as_bytes(std::span(lane_at(0)->raw));
                const auth::Proof bc =
                    bind(pa->auth_nonce, own_raw, instance_, h.raw_addr, h.instance);
                const auth::Proof ba = bind(m->nonce, own_raw, instance_, h.raw_addr, h.instance);
                if (!auth::matches(auth::prove(a.secret, auth::Role::acceptor, ba, bc, a.key_id),
                                   m->proof)) {
                    pa->auth_refusal = fmt::format(
                        "{} could not prove that it holds the secret of key '{}' (a different "
                        "secret, or not the server meant)",
                        pa->str, a.key_id);  // route_failed_locked adds what we hold
                    pa->auth_since = now;
                    pa->auth.store(AuthState::refused, std::memory_order_release);
                    TALARIA_LOG(ofi, warn, "{}: {}", scheme_, pa->auth_refusal);
                    note(LinkEvent::connect_failed);
                    return;
                }
                uint64_t known = 0;
                if (!pa->instance.compare_exchange_strong(known, h.instance,
                                                          std::memory_order_relaxed) &&
                    known != h.instance) {
                    // Another process answers at that address now: the one we knew is gone.
                    pa->auth.store(AuthState::none, std::memory_order_release);
                    replaced = true;
                } else {
                    const auto [to_acceptor, to_connector] = tokens(bc, ba);
                    pa->send_token.store(to_acceptor, std::memory_order_release);
                    pa->recv_token_prev.store(pa->recv_token.load(std::memory_order_acquire),
                                              std::memory_order_release);
                    pa->recv_token.store(to_connector, std::memory_order_release);
                    pa->proved.store(true, std::memory_order_release);
                    reply = auth::prove(a.secret, auth::Role::connector, bc, ba, a.key_id);
                }
            }
            if (replaced) {
                peer_failed_locked(l, pa, Errc::disconnected,
                                   "a new endpoint now uses its address");
                return;
            }
            send_auth_locked(l, remote_locked(l, lraw, who), AuthStep::response, reply);
            return;
        }
        case AuthStep::response: {
            if (!a.enabled()) return;
            std::optional<AuthPending> p;
            {
                std::lock_guard g(auth_mu_);
                auto it = std::find_if(
                    auth_pending_.begin(), auth_pending_.end(),
                    [&](const AuthPending& o) { return o.raw == raw && o.instance == h.instance; });
                if (it != auth_pending_.end() && now - it->since < kAuthTimeout) p = *it;
                if (it != auth_pending_.end()) auth_pending_.erase(it);
            }
            if (!p) {
                TALARIA_LOG(ofi, debug, "{}: an auth response from {} answers no challenge of ours",
                            scheme_, pa->str);
                return;
            }
            if (!auth::matches(
                    auth::prove(a.secret, auth::Role::connector, p->peer, p->own, a.key_id),
                    m->proof)) {
                note(LinkEvent::connect_failed);
                send_refusal_locked(l, stranger_remote_locked(l, lraw, who),
                                    fmt::format("the client's proof does not match the secret of "
                                                "key '{}' (a different secret)",
                                                a.key_id));
                return;
            }
            // It proved the secret: from here its messages are delivered (a new process at the
            // address of an old one replaces it now, not before).
            Source* s = source_locked(l, h, true);
            if (!s) return;
            OfiAddr* np = ofi_addr(s->addr);
            const auto [to_acceptor, to_connector] = tokens(p->peer, p->own);
            np->send_token.store(to_connector, std::memory_order_release);
            np->recv_token_prev.store(np->recv_token.load(std::memory_order_acquire),
                                      std::memory_order_release);
            np->recv_token.store(to_acceptor, std::memory_order_release);
            np->proved.store(true, std::memory_order_release);
            np->auth.store(AuthState::admitted, std::memory_order_release);
            link_up(np, LinkEvent::accepted);
            TALARIA_LOG(ofi, debug, "{}: {} authenticated (key '{}')", scheme_, np->str, a.key_id);
            send_auth_locked(l, remote_locked(l, lraw, s->addr), AuthStep::ok, {});
            return;
        }
        case AuthStep::ok: {
            std::lock_guard g(auth_mu_);
            if (pa->auth.load(std::memory_order_acquire) == AuthState::dialing &&
                pa->proved.load(std::memory_order_acquire) &&
                pa->instance.load(std::memory_order_relaxed) == h.instance) {
                pa->auth.store(AuthState::admitted, std::memory_order_release);
                TALARIA_LOG(ofi, debug, "{}: {} admits us (key '{}')", scheme_, pa->str, a.key_id);
                link_up(pa, LinkEvent::connected);
            }
            return;
        }
        case AuthStep::refused: {
            std::lock_guard g(auth_mu_);
            // Only an answer to our request (or, without a secret of ours, a server's word that
            // it wants one): a refusal is not authenticated, so it never stops sends to a peer
            // both sides admitted, and one naming another instance than the one we know is not
            // that peer's.
            const AuthState st = pa->auth.load(std::memory_order_acquire);
            if (!(st == AuthState::dialing || (st == AuthState::none && !a.enabled()))) return;
            uint64_t known = pa->instance.load(std::memory_order_relaxed);
            if (known != 0 && known != h.instance) return;
            pa->auth_refusal = fmt::format("{} refused us: {}", pa->str, m->reason);
            pa->auth_since = now;
            pa->auth.store(AuthState::refused, std::memory_order_release);
            TALARIA_LOG(ofi, warn, "{}: {}", scheme_, pa->auth_refusal);
            note(LinkEvent::connect_failed);
            return;
        }
    }
}

PeerIdentity OfiTransport::peer_identity(const Addr& a) {
    PeerIdentity id;
    if (!a || a.impl()->transport() != this || !opts_.auth.enabled()) return id;
    // With a secret, only the messages of peers that proved it are delivered; one secret per
    // transport.
    if (ofi_addr(a)->proved.load(std::memory_order_acquire)) id.key_id = opts_.auth.key_id;
    return id;
}

}  // namespace talaria::na::ofi
