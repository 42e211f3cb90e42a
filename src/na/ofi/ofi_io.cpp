// ofi transport data path: posting, completion processing, software matching of messages from
// the receive buffers, put/get, peer-death probing, cancel, progress.
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "na/base/auth.hpp"
#include "na/ofi/ofi.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ofi {

namespace {

/// Completions read per fi_cq_read.
constexpr int kCqBatch = 16;
/// Times a post retries -FI_EAGAIN (progressing in between) before returning Errc::again.
constexpr int kPostRetries = 64;

/// The status of a failed libfabric operation (the positive FI_E* code of a CQ error entry).
Errc errc_of(int err) {
    switch (err) {
        case FI_ECANCELED:
            return Errc::canceled;
        case FI_EACCES:
        case FI_EKEYREJECTED:
        case FI_EPERM:
            return Errc::access_denied;
        case FI_ETRUNC:
        case FI_EMSGSIZE:
            return Errc::message_too_large;
        case FI_ECONNREFUSED:
        case FI_ECONNRESET:
        case FI_ECONNABORTED:
        case FI_ENOTCONN:
        case FI_EHOSTUNREACH:
        case FI_ENETUNREACH:
        case FI_ENETDOWN:
        case FI_ESHUTDOWN:
        case FI_ETIMEDOUT:
        case FI_EADDRNOTAVAIL:
        case FI_EIO:
            return Errc::disconnected;
        case FI_ENOMEM:
            return Errc::no_memory;
        default:
            return Errc::io_error;
    }
}

/// The tcp provider (through rxm) fails a put/get the target refused (an unknown or dropped
/// memory key, a range outside the region, the wrong access) with FI_ECANCELED and the
/// target's reason as a positive errno in prov_errno; a connection that broke carries none of
/// these. Such a refusal fails that operation only.
bool refused_by_target(int prov_errno) {
    const int pe = prov_errno < 0 ? -prov_errno : prov_errno;
    return pe == ENOENT || pe == EACCES || pe == EPERM || pe == EINVAL || pe == ERANGE ||
           pe == EFAULT || pe == FI_EKEYREJECTED;
}

/// The connection under an operation broke (rxm flushes what it held with FI_ECANCELED; a
/// write into a socket the peer closed fails with FI_ENOTCONN, FI_EPIPE or FI_ECONNRESET):
/// the peer may be fine, and rxm connects again on the next post. Not a refusal to connect.
bool connection_broke(int err) {
    return err == FI_ECANCELED || err == FI_ENOTCONN || err == EPIPE || err == FI_ECONNRESET ||
           err == FI_ECONNABORTED;
}

bool peer_lost(Errc e) {
    return e == Errc::disconnected || e == Errc::unreachable;
}

}  // namespace

template <class F>
ssize_t OfiTransport::post_retry_locked(OfiLane& l, F&& f) {
    ssize_t rc = f();
    // Never from inside a completion pass: completions would be handled out of order, and a
    // multi-recv buffer that entries of the outer pass still point into could be reposted.
    for (int i = 0; rc == -FI_EAGAIN && !l.polling && i < kPostRetries; ++i) {
        poll_cq_locked(l);
        rc = f();
    }
    return rc;
}

// --- ops and remote endpoints --------------------------------------------------------------------

Result<OpId> OfiTransport::fail_async(OfiLane& l, Context& ctx, Callback&& cb, OpType type,
                                      Errc status, const std::string& why) {
    TALARIA_LOG(ofi, debug, "{} fails with {}: {}", op_type_name(type), errc_name(status), why);
    return complete_now(l, ctx, std::move(cb), type, status, 0);
}

Result<OpId> OfiTransport::complete_now(OfiLane& l, Context& ctx, Callback&& cb, OpType type,
                                        Errc status, std::size_t size) {
    OfiOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->completion.size = size;
    OpId id = op->id();
    complete_op(op, status);
    return id;
}

void OfiTransport::watch_inc(OfiLane& l, Remote* r) {
    if (r->pending++ == 0) {
        r->heard = Clock::now();
        l.watched.push_back(*r);
    }
}

void OfiTransport::watch_dec(OfiLane& l, Remote* r) {
    if (--r->pending == 0) l.watched.erase(*r);
}

void OfiTransport::to_provider_locked(OfiLane& l, OfiOp* op) {
    op->state = OpState::in_provider;
    op->pressed = false;  // a later wait (a resend) counts again
    l.inflight.push_back(*op);
    if (op->rem) {
        op->solo_post = op->rem->solo;
        ++op->rem->in_provider;
    }
    if (op->completion.type == OpType::put || op->completion.type == OpType::get) {
        ++l.rma_inflight;
        if (prov_.shm) op->rma_posted = Clock::now();  // check_stuck_rma_locked
    }
}

void OfiTransport::from_provider_locked(OfiLane& l, OfiOp* op) {
    l.inflight.erase(*op);
    if (op->rem) --op->rem->in_provider;
    if (op->completion.type == OpType::put || op->completion.type == OpType::get) --l.rma_inflight;
}

void OfiTransport::op_finished(OfiLane& l, OfiOp* op, Errc status) {
    op_finished_quietly_locked(l, op);
    if (!op->ctx) {
        // Its context was destroyed while the provider held it: nobody to tell.
        op->releaser->release(op);
        return;
    }
    complete_op(op, status);
}

void OfiTransport::op_finished_quietly_locked(OfiLane& l, OfiOp* op) {
    if (op->state == OpState::in_provider) from_provider_locked(l, op);
    if (Remote* rem = op->rem; rem && rem->solo && rem->deferred == 0 && rem->in_provider == 0)
        rem->solo = false;  // everything went again: back to posting freely
    if (op->bounce) {
        bounce_free(op->bounce);
        op->bounce = nullptr;
    }
    if (op->counted) watch_dec(l, op->rem);
    op->counted = false;
    op->rem = nullptr;
    op->route = nullptr;
    op->peer.reset();
    op->state = OpState::idle;
}

Remote* OfiTransport::remote_locked(OfiLane& l, std::string_view raw, const Addr& peer) {
    auto it = l.remotes.find(raw);
    if (it != l.remotes.end()) {
        Remote* r = it->second.get();
        OfiAddr* had = ofi_addr(r->peer);
        if (had != ofi_addr(peer) &&
            ((r->pending == 0 && r->deferred == 0) || had->dead.load(std::memory_order_relaxed))) {
            // A new process at an endpoint address we knew (a restarted peer): its own now.
            r->peer = Addr(ofi_addr(peer));
            r->connected = false;
            r->probing = false;
            r->refused_since = TimePoint{};
            r->connect_probed = false;
            r->close_connect_probe();
        }
        return r;
    }
    auto r = std::make_unique<Remote>();
    r->raw = std::string(raw);
    r->peer = Addr(ofi_addr(peer));
    if (prov_.prov_name == "shm") r->pid = shm_pid_of(raw);
    Remote* p = r.get();
    l.remotes.emplace(p->raw, std::move(r));
    return p;
}

/// "host:port" of a tcp peer's address (its text without the scheme), for refusal messages.
static std::string_view host_port_of(const OfiAddr* a) {
    auto u = parse_url(a->str);
    return u ? u->rest : std::string_view(a->str);
}

static void note_failure(OfiAddr* a, const std::string& why) {
    std::lock_guard g(a->failure_mu);
    a->failure = why;
}

Result<void> OfiTransport::av_insert_locked(OfiLane& l, Remote* r) {
    if (r->fi != FI_ADDR_NOTAVAIL) return ok();
    auto failed = [&](Error e) {  // the peer cannot be reached: an attempt that failed
        note(LinkEvent::connect_failed);
        note_failure(ofi_addr(r->peer), e.message());
        return e;
    };
    const std::string& who = ofi_addr(r->peer)->str;
    // A peer on this host whose port nobody listens on: refused now, not after the provider's
    // connection attempts (rxm retries a refused connect for about a second, then the peer is
    // declared dead as "disconnected").
    if (listener_gone_locked(r, Clock::now()))
        return failed(Error(Errc::unreachable,
                            connect_failure_text(host_port_of(ofi_addr(r->peer)), ECONNREFUSED)));
    // shm 1.17 crashes (SIGSEGV in fi_av_insert) when the named region does not exist: it
    // maps the entry into our endpoint without the peer's region. So never insert a peer that
    // is gone (a small window remains if it closes between this check and the insertion).
    if (prov_.prov_name == "shm" && shm_peer_gone(r->raw))
        return failed(Error(Errc::unreachable,
                            fmt::format("ofi: no shm endpoint {} (its region /dev/shm/{} does "
                                        "not exist: closed, killed or never opened)",
                                        who, r->raw.substr(r->raw.find("://") + 3))));
    std::string raw = r->raw;
    if (prov_.addr_format == FI_ADDR_STR) raw.push_back('\0');
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    int rc = fi_av_insert(l.av, raw.data(), 1, &fa, 0, nullptr);
    if (rc != 1 || fa == FI_ADDR_NOTAVAIL) {
        std::size_t in_av = 0;
        for (const auto& [k, v] : l.remotes)
            in_av += v->fi != FI_ADDR_NOTAVAIL;
        if (prov_.prov_name == "shm" && in_av + 1 >= kShmMaxPeers)
            return Error(
                Errc::no_memory,
                fmt::format("ofi: cannot add {} to the address vector of context {} on shm: it "
                            "is full ({} peer endpoints in use; libfabric 1.17's shm AV holds at "
                            "most {} (SMR_MAX_PEERS)) and entries are never removed (fi_av_remove "
                            "of a peer in another process crashes shm 1.17); fi_av_insert "
                            "returned {}",
                            who, l.id, in_av, kShmMaxPeers,
                            rc < 0 ? fi_strerror(-rc) : "0 inserted"));
        return failed(Error(
            Errc::unreachable,
            fmt::format("ofi: fi_av_insert of {} on {} failed: {} ({} entries in the AV)", who,
                        prov_.prov_name, rc < 0 ? fi_strerror(-rc) : "not inserted", in_av)));
    }
    r->fi = fa;
    note_failure(ofi_addr(r->peer), {});  // an older failure no longer explains
    return ok();
}

// --- routes --------------------------------------------------------------------------------------

Route* OfiTransport::route_locked(OfiLane& l, const Addr& peer, uint8_t ctx, bool unexpected) {
    OfiAddr* a = ofi_addr(peer);
    if (Route* r = l.last_route;
        r && r->ctx == ctx && r->unexpected == unexpected && ofi_addr(r->peer) == a)
        return r;
    auto [it, made] = l.routes.try_emplace(RouteKey{a, ctx, unexpected});
    Route& r = it->second;
    if (made) {
        r.peer = Addr(a);
        r.ctx = ctx;
        r.unexpected = unexpected;
    }
    l.last_route = &r;
    return &r;
}

Ctl* OfiTransport::ctl_alloc_locked(OfiLane& l) {
    // Reserved from here until its send fails or completes.
    for (auto& c : l.ctls)
        if (!c->in_use) {
            c->in_use = true;
            return c.get();
        }
    auto c = std::make_unique<Ctl>();
    c->fi_kind = FiCtx::Kind::ctl;
    auto b = msg_buf_alloc(std::max(kLocatedFixedSize + kMaxRawAddr, kAuthMaxPayload));
    if (!b) {
        TALARIA_LOG(ofi, warn, "{}: no buffer for an internal message: {}", scheme_,
                    b.error().describe());
        return nullptr;
    }
    c->buf = std::move(*b);
    c->in_use = true;
    l.ctls.push_back(std::move(c));
    return l.ctls.back().get();
}

ssize_t OfiTransport::ctl_send_locked(OfiLane& l, Ctl* c, std::size_t total, Remote* to) {
    if (!shm_local_peer_ok_locked(l, to)) return -FI_ENOTCONN;
    std::byte* start = c->buf.data() - l.header_size;
    void* desc = static_cast<Slab*>(c->buf.priv())->desc;
    return fi_send(l.ep, start, total, desc, to->fi, static_cast<FiCtx*>(c));
}

void OfiTransport::send_ctl_or_retry_locked(OfiLane& l, Ctl* c, std::size_t total, Remote* to,
                                            std::string_view what) {
    ssize_t rc = ctl_send_locked(l, c, total, to);
    if (rc == -FI_EAGAIN && l.ctl_retry.size() < kMaxCtlRetry) {
        // rxm still connecting to it: sent again from progress.
        l.ctl_retry.push_back(CtlRetry{c, to, total});
        note(LinkEvent::backpressure);
        return;
    }
    if (rc != 0) {
        c->in_use = false;
        TALARIA_LOG(ofi, debug, "{}: {} to {} failed to post: {}", scheme_, what,
                    ofi_addr(to->peer)->str, fi_strerror(int(-rc)));
    }
}

void OfiTransport::send_locate_locked(OfiLane& l, Route& r, TimePoint now) {
    OfiAddr* a = ofi_addr(r.peer);
    if (!r.locating) {
        r.locating = true;
        ++l.locating;
    }
    ++r.tries;
    r.since = now;
    // Tokens are not guessable from outside (a forged answer could redirect a route).
    do
        r.token = uint32_t((++l.next_token ^ l.token_salt) * 0x9e3779b97f4a7c15ull >> 32);
    while (r.token == 0);
    // To the peer's context 0 (its transport address): it knows where its contexts live.
    Remote* r0 = remote_locked(l, a->raw, r.peer);
    if (auto ins = av_insert_locked(l, r0); !ins) {
        route_failed_locked(
            l, r, ins.error().code() == Errc::no_memory ? Errc::no_memory : Errc::unreachable,
            ins.error().message());
        return;
    }
    Ctl* c = ctl_alloc_locked(l);
    if (!c) return;  // retried after kLocateRetry
    std::byte* start = c->buf.data() - l.header_size;
    std::memcpy(start, l.header, l.header_size);
    start[1] = std::byte(uint8_t(MsgKind::locate));
    start[2] = std::byte(0);
    detail::store_le(start + 4, r.token, 4);
    stamp_token(start, a);
    encode_locate(Locate{r.ctx, r.unexpected}, c->buf.data());
    // One attempt: polling the CQ here could fail the peer and erase this route under us.
    ssize_t rc = ctl_send_locked(l, c, l.header_size + kLocateSize, r0);
    if (rc != 0) c->in_use = false;
    if (rc == -FI_EAGAIN) {
        // rxm still connecting: try again at the next pass (not counted as a try), unless the
        // peer is gone: nothing listens on its port, or the provider has refused for as long
        // as a probe may take.
        r.since = now - kLocateRetry;
        --r.tries;
        if (listener_gone_locked(r0, now)) {
            defer_death_locked(l, a, Errc::disconnected,
                               "nothing listens on its port any more (and the provider cannot "
                               "reach it): its process is gone");
        } else if (r0->refused_since == TimePoint{}) {
            r0->refused_since = now;  // a spell of refusals begins
            note(LinkEvent::backpressure);
        } else if (auto refused = connect_refused_locked(r0, now)) {
            defer_death_locked(l, a, Errc::unreachable, std::move(*refused));
        } else if (now - r0->refused_since > kProbeTimeout) {
            defer_death_locked(l, a, Errc::disconnected,
                               "the provider refused to send a locate to it (-FI_EAGAIN, "
                               "connecting) for longer than a probe may take");
        }
        return;
    }
    r0->refused_since = TimePoint{};
    r0->connect_probed = false;
    r0->close_connect_probe();
    if (rc != 0)
        TALARIA_LOG(ofi, debug, "{}: locate of context {} at {} failed to post: {}", scheme_, r.ctx,
                    a->str, fi_strerror(int(-rc)));
}

void OfiTransport::route_found_locked(OfiLane& l, Route& r, Remote* rem) {
    r.rem = rem;
    if (r.locating) --l.locating;
    r.locating = false;
    r.tries = 0;
    r.token = 0;
    IntrusiveList<OfiOp> go;
    while (OfiOp* op = r.waiting.pop_front())
        go.push_back(*op);
    while (OfiOp* op = go.pop_front()) {
        op->route = nullptr;
        op->state = OpState::idle;
        op->rem = rem;
        start_send_locked(l, op);
    }
}

void OfiTransport::route_failed_locked(OfiLane& l, Route& r, Errc status, const std::string& why) {
    if (r.locating) --l.locating;
    if (r.authing) --l.locating;
    r.locating = false;
    r.authing = false;
    r.tries = 0;
    r.token = 0;
    // Warn: the failed operations carry only the code; this says why and what to do (and, for a
    // refusal, the layer above reads it for their error: peer_failure).
    if (!r.waiting.empty()) {
        TALARIA_LOG(ofi, warn, "{}: {} sends to context {} of {} fail with {}: {}", scheme_,
                    r.waiting.size(), r.ctx, ofi_addr(r.peer)->str, errc_name(status), why);
        if (status == Errc::access_denied) {  // a refusal: the other causes are kept where
                                              // they are found (peer_failed_locked)
            OfiAddr* a = ofi_addr(r.peer);
            std::lock_guard g(a->failure_mu);
            a->failure = fmt::format("{}; {}", why, auth::client_side(opts_.auth));
        }
    }
    while (OfiOp* op = r.waiting.pop_front()) {
        op->route = nullptr;
        op->state = OpState::idle;
        op_finished(l, op, status);
    }
}

void OfiTransport::check_locates_locked(OfiLane& l, TimePoint now) {
    check_auth_locked(l, now);
    // What is due first: acting on a route may declare its peer dead, which erases routes.
    std::vector<RouteKey> due;
    for (auto& [key, r] : l.routes)
        if (!r.rem && r.locating && now - r.since >= kLocateRetry) due.push_back(key);
    for (const RouteKey& key : due) {
        auto it = l.routes.find(key);
        if (it == l.routes.end() || it->second.rem || !it->second.locating) continue;
        Route& r = it->second;
        OfiAddr* a = ofi_addr(r.peer);
        if (a->dead.load(std::memory_order_relaxed)) {
            route_failed_locked(l, r, Errc::disconnected, "the peer was declared dead");
        } else if (r.tries >= kLocateTries) {
            note(LinkEvent::connect_failed);
            route_failed_locked(
                l, r, Errc::unreachable,
                fmt::format(
                    "{} did not say where its context {} is ({} locates, {} s apart, "
                    "unanswered): its context 0 answers them, so it must exist and "
                    "be progressed",
                    a->str, r.ctx, r.tries,
                    std::chrono::duration_cast<std::chrono::seconds>(kLocateRetry).count()));
        } else {
            send_locate_locked(l, r, now);
        }
    }
}

void OfiTransport::answer_locate_locked(OfiLane& l, Remote* to, uint32_t token,
                                        std::span<const std::byte> payload) {
    auto q = decode_locate(payload);
    if (!q) {
        TALARIA_LOG(ofi, warn, "{}: dropping a locate from {}: {}", scheme_,
                    ofi_addr(to->peer)->str, q.error().message());
        return;
    }
    // Expected messages go to the context's own lane while it exists; unexpected ones to it
    // if it takes them, else to the lowest context that does (docs/architecture.md, Messages).
    OfiLane* serving = nullptr;
    OfiLane* k = q->ctx < opts_.max_contexts ? lane_at(q->ctx) : nullptr;
    if (!q->unexpected) {
        if (k && k->attached.load(std::memory_order_acquire)) serving = k;
    } else if (k && k->serves.load(std::memory_order_acquire)) {
        serving = k;
    } else {
        for (std::size_t i = 0; !serving && i < opts_.max_contexts; ++i)
            if (OfiLane* o = lane_at(uint8_t(i)); o && o->serves.load(std::memory_order_acquire))
                serving = o;
    }
    Located ans;
    ans.ctx = q->ctx;
    ans.unexpected = q->unexpected;
    ans.found = serving != nullptr;
    if (serving) {
        ans.lane = serving->id;
        ans.raw = std::as_bytes(std::span(serving->raw));
    }
    TALARIA_LOG(ofi, debug, "{}: context {} of {} asks where our context {} takes {} messages: {}",
                scheme_, l.id, ofi_addr(to->peer)->str, q->ctx,
                q->unexpected ? "unexpected" : "expected",
                serving ? fmt::format("context {}", serving->id) : std::string("nowhere"));
    if (auto ins = av_insert_locked(l, to); !ins) {
        TALARIA_LOG(ofi, warn, "{}: cannot answer {}, which asks where our context {} is: {}",
                    scheme_, ofi_addr(to->peer)->str, q->ctx, ins.error().message());
        return;
    }
    Ctl* c = ctl_alloc_locked(l);
    if (!c) return;
    std::byte* start = c->buf.data() - l.header_size;
    std::memcpy(start, l.header, l.header_size);
    start[1] = std::byte(uint8_t(MsgKind::located));
    detail::store_le(start + 4, token, 4);
    stamp_token(start, ofi_addr(to->peer));
    std::size_t n = encode_located(ans, c->buf.data());
    if (serving) link_up(ofi_addr(to->peer), LinkEvent::accepted);
    send_ctl_or_retry_locked(l, c, l.header_size + n, to, "a located answer (it asks again)");
}

void OfiTransport::on_located_locked(OfiLane& l, const Addr& peer, uint32_t token,
                                     std::span<const std::byte> payload) {
    auto ans = decode_located(payload);
    if (!ans) {
        TALARIA_LOG(ofi, warn, "{}: dropping a located answer from {}: {}", scheme_,
                    ofi_addr(peer)->str, ans.error().message());
        return;
    }
    OfiAddr* a = ofi_addr(peer);
    TALARIA_LOG(ofi, debug, "{}: {} takes {} messages for its context {} {}{}", scheme_, a->str,
                ans->unexpected ? "unexpected" : "expected", ans->ctx,
                ans->found ? "on context " : "nowhere",
                ans->found ? std::to_string(ans->lane) : "");
    auto it = l.routes.find(RouteKey{a, ans->ctx, ans->unexpected});
    if (it == l.routes.end() || it->second.rem || it->second.token != token) return;  // stale
    Route& r = it->second;
    if (!ans->found) {
        note(LinkEvent::connect_failed);
        route_failed_locked(
            l, r, Errc::not_found,
            fmt::format("{} has no context {}{}", a->str, r.ctx,
                        r.unexpected ? " and none of its contexts takes unexpected messages" : ""));
        return;
    }
    std::string_view raw(reinterpret_cast<const char*>(ans->raw.data()), ans->raw.size());
    if (canonical_of(ans->raw).empty()) {
        TALARIA_LOG(ofi, warn, "{}: dropping a located answer from {}: not an {} endpoint", scheme_,
                    a->str, scheme_);
        return;
    }
    link_up(a, LinkEvent::connected);
    route_found_locked(l, r, remote_locked(l, raw, peer));
}

// --- posting -------------------------------------------------------------------------------------

Result<OpId> OfiTransport::post_send(Context& ctx, Callback cb, const MsgBuffer& buf,
                                     std::size_t len, const Addr& dest, uint8_t dest_ctx, Tag tag,
                                     bool expected) {
    OpType type = expected ? OpType::send_expected : OpType::send_unexpected;
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    if (len > kMaxMessageSize)
        return Error(Errc::message_too_large,
                     fmt::format("{}: a {}-byte message exceeds max_{}_size() = {}", scheme_, len,
                                 expected ? "expected" : "unexpected", kMaxMessageSize));
    if (len > buf.size())
        return Error(Errc::invalid_argument, fmt::format("{}: send of {} bytes from a {}-byte "
                                                         "buffer",
                                                         scheme_, len, buf.size()));
    if (!dest || dest.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: destination is not an address of this transport", scheme_));
    auto* slab = static_cast<Slab*>(buf.priv());
    const bool ours = slab && slab->magic == Slab::kMagic && slab->owner == this;
    OfiAddr* peer = ofi_addr(dest);
    OfiLane& l = lane_of(ctx);

    std::lock_guard g(l.mu);
    if (peer->dead.load(std::memory_order_relaxed))
        return fail_async(l, ctx, std::move(cb), type, Errc::disconnected,
                          fmt::format("{} was declared dead", peer->str));
    Route* route = route_locked(l, dest, dest_ctx, !expected);
    // The endpoint it goes to (or, while that is not known, the peer's context 0, which the
    // locate goes to) into the address vector now: a full one is a local limit, reported here
    // with its message.
    Remote* to = route->rem ? route->rem : remote_locked(l, peer->raw, dest);
    if (auto r = av_insert_locked(l, to); !r) {
        if (r.error().code() == Errc::no_memory) return r.error();
        return fail_async(l, ctx, std::move(cb), type, Errc::unreachable, r.error().message());
    }
    OfiOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->completion.size = len;
    // The header goes in the room in front of the payload (ours), or both into a bounce slot
    // (a buffer we did not allocate): one registered send either way.
    const std::size_t hdr = l.header_size;
    std::byte* start;
    void* desc;
    if (ours) {
        start = buf.data() - hdr;
        desc = slab->desc;
    } else {
        op->bounce = bounce_alloc(&desc);
        if (!op->bounce) {
            op->releaser->release(op);
            return Error(Errc::no_memory, fmt::format("{}: no bounce buffer for a send from a "
                                                      "buffer not from msg_buf_alloc",
                                                      scheme_));
        }
        start = op->bounce;
        if (len) std::memcpy(start + hdr, buf.data(), len);
    }
    std::memcpy(start, l.header, hdr);
    start[1] = std::byte(uint8_t(expected ? MsgKind::expected : MsgKind::unexpected));
    start[2] = std::byte(dest_ctx);
    detail::store_le(start + 4, tag, 4);
    start[18] = std::byte(uint8_t(l.header[18]) |
                          (l.serves.load(std::memory_order_relaxed) ? kFlagServes : 0));
    op->buf = start;
    op->cap = hdr + len;
    op->desc = desc;
    op->peer = dest;
    OpId id = op->id();
    if (const AuthState st = peer->auth.load(std::memory_order_acquire);
        (st != AuthState::admitted && (st == AuthState::refused || opts_.auth.enabled())) ||
        route->authing) [[unlikely]] {
        // Options::auth: not before both proved the secret (or fail at once: it refused us).
        if (auth_hold_locked(l, peer, *route, op)) return id;
    }
    if (!route->rem) {
        // Where that context lives is not known yet: wait for the locate, in order.
        op->state = OpState::routing;
        op->route = route;
        route->waiting.push_back(*op);
        if (!route->locating) send_locate_locked(l, *route, Clock::now());
        return id;
    }
    op->rem = route->rem;
    start_send_locked(l, op);
    return id;
}

void OfiTransport::start_send_locked(OfiLane& l, OfiOp* op) {
    Remote* rem = op->rem;
    OfiAddr* peer = ofi_addr(op->peer);
    if (peer->dead.load(std::memory_order_relaxed)) {
        op_finished(l, op, Errc::disconnected);
        return;
    }
    // The session's token as it is now (a send held for the handshake was posted before).
    stamp_token(op->buf, peer);
    if (auto r = av_insert_locked(l, rem); !r) {
        TALARIA_LOG(ofi, debug, "{}: a send fails: {}", scheme_, r.error().message());
        op_finished(l, op,
                    r.error().code() == Errc::no_memory ? Errc::no_memory : Errc::unreachable);
        return;
    }
    if (op->cap <= prov_.inject_size && !op->bounce && rem->connected && rem->deferred == 0 &&
        !rem->solo && shm_local_peer_ok_locked(l, rem)) {
        // Small: the provider copies it at once and reports no completion. (Not before the
        // first send to the endpoint completed: rxm refuses injects while it connects.)
        ssize_t rc = fi_inject(l.ep, op->buf, op->cap, rem->fi);
        if (rc == 0) {
            op_finished(l, op, Errc::ok);
            return;
        }
        if (rc != -FI_EAGAIN) {
            TALARIA_LOG(ofi, debug, "fi_inject to {} on {} failed: {}", peer->str, prov_.prov_name,
                        fi_strerror(int(-rc)));
            op_finished(l, op, Errc::disconnected);
            return;
        }
        // Provider queue full: a send with a completion waits in the provider instead.
        count_pressure(op);
    }
    op->counted = true;
    watch_inc(l, rem);
    if (rem->deferred > 0 || (rem->solo && rem->in_provider > 0)) {
        defer_locked(l, op);  // behind the sends already waiting: messages stay in order
        return;
    }
    ssize_t rc = try_post_locked(l, op);
    if (rc == 0) {
        to_provider_locked(l, op);
    } else if (rc == -FI_EAGAIN) {
        count_pressure(op);
        defer_locked(l, op);  // e.g. rxm connecting: the peer must progress too
    } else {
        if (!peer->dead.load(std::memory_order_relaxed))
            TALARIA_LOG(ofi, debug, "{}: fi_send of {} bytes to {} on {} failed: {}", scheme_,
                        op->cap, peer->str, prov_.prov_name, fi_strerror(int(-rc)));
        op_finished(l, op, Errc::disconnected);
    }
}

ssize_t OfiTransport::try_post_locked(OfiLane& l, OfiOp* op) {
    Remote* rem = op->rem;
    if (!shm_local_peer_ok_locked(l, rem)) return -FI_ENOTCONN;
    if (!prov_.wait_fd) {
        // Without a wait fd: an answer to what we post is usually microseconds away, so the
        // next blocked progress polls first instead of sleeping a slice grown while idle.
        l.last_completion = Clock::now();
        l.poll_slice = kPollSliceMin;
    }
    const OpType t = op->completion.type;
    if (t == OpType::send_unexpected || t == OpType::send_expected)
        return fi_send(l.ep, op->buf, op->cap, op->desc, rem->fi, static_cast<FiCtx*>(op));
    // put/get: split at the provider's largest message; each fragment completes on its own.
    const bool is_put = t == OpType::put;
    const std::size_t chunk = std::max<std::size_t>(
        4096, std::min<std::size_t>(prov_.max_msg_size, std::size_t(1) << 30));
    while (op->posted_bytes < op->cap) {
        std::size_t off = op->posted_bytes;
        std::size_t n = std::min(chunk, op->cap - off);
        ssize_t rc;
        if (is_put) {
            // Delivery complete: a put completes once the data is in the target's memory (a
            // plain completion of tcp;ofi_rxm only says it left this process).
            iovec iov{op->buf + off, n};
            fi_rma_iov riov{op->raddr + off, n, op->rkey};
            fi_msg_rma msg{};
            msg.msg_iov = &iov;
            msg.desc = &op->desc;
            msg.iov_count = 1;
            msg.addr = rem->fi;
            msg.rma_iov = &riov;
            msg.rma_iov_count = 1;
            msg.context = static_cast<FiCtx*>(op);
            rc =
                fi_writemsg(l.rma_ep ? l.rma_ep : l.ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
        } else {
            rc = fi_read(l.rma_ep ? l.rma_ep : l.ep, op->buf + off, n, op->desc, rem->fi,
                         op->raddr + off, op->rkey, static_cast<FiCtx*>(op));
        }
        if (rc != 0) return rc;
        op->posted_bytes += n;
        ++op->fragments;
    }
    return 0;
}

void OfiTransport::defer_locked(OfiLane& l, OfiOp* op) {
    op->state = OpState::deferred;
    l.deferred.push_back(*op);
    ++op->rem->deferred;
}

bool OfiTransport::resend_locked(OfiLane& l, OfiOp* op) {
    const bool rma = op->completion.type == OpType::put || op->completion.type == OpType::get;
    if (op->resends >= kResends || (!rma && op->cap > kResendMax) || !op->ctx) return false;
    Duration delay = kResendDelay;
    for (uint8_t i = 0; i < op->resends; ++i)
        delay *= 10;
    ++op->resends;
    TALARIA_LOG(ofi, debug, "{}: the connection to {} broke under a {}: posting it again in {} ms",
                scheme_, ofi_addr(op->peer)->str, op_type_name(op->completion.type),
                std::chrono::duration_cast<std::chrono::milliseconds>(delay).count());
    if (op->state == OpState::in_provider) from_provider_locked(l, op);
    op->rem->connected = false;  // no inject until a send on the new connection completes
    op->rem->solo = true;
    op->posted_bytes = 0;
    op->resend = false;
    op->retry_at = Clock::now() + delay;
    l.resend_due = std::min(l.resend_due, op->retry_at);
    defer_locked(l, op);
    return true;
}

void OfiTransport::rma_fragment_done_locked(OfiLane& l, OfiOp* op) {
    if (op->fragments > 0 || op->state == OpState::deferred) return;
    if (op->resend && op->first_error == Errc::ok && !op->cancel_asked && resend_locked(l, op))
        return;
    if (op->resend && op->first_error == Errc::ok)
        op->first_error = op->cancel_asked ? Errc::canceled : Errc::disconnected;
    const Errc st = op->first_error;
    const OpType op_type = op->completion.type;
    Addr peer = op->resend && st == Errc::disconnected ? op->peer : Addr{};
    op_finished(l, op, st);
    if (peer)
        peer_failed_locked(l, ofi_addr(peer), st,
                           fmt::format("its connection broke under the same {} {} times in a row",
                                       op_type_name(op_type), kResends + 1));
}

void OfiTransport::retry_deferred_locked(OfiLane& l) {
    ++l.pass;
    TimePoint now{};  // read once, on the first op waiting to be posted again
    l.resend_due = TimePoint::max();
    l.deferred.for_each_safe([&](OfiOp& op) {
        Remote* rem = op.rem;
        if (rem->stalled_pass == l.pass) return;  // keep its order: try again next pass
        if (rem->solo && rem->in_provider > 0) {
            rem->stalled_pass = l.pass;  // one at a time after its connection broke
            return;
        }
        if (op.retry_at != TimePoint{}) {
            if (now == TimePoint{}) now = Clock::now();
            if (now < op.retry_at) {
                rem->stalled_pass = l.pass;
                l.resend_due = std::min(l.resend_due, op.retry_at);
                return;
            }
            op.retry_at = TimePoint{};
        }
        ssize_t rc = try_post_locked(l, &op);
        if (rc == -FI_EAGAIN) {
            count_pressure(&op);  // once per wait, not per pass
            rem->stalled_pass = l.pass;
            return;
        }
        l.deferred.erase(op);
        --rem->deferred;
        if (rc == 0) {
            to_provider_locked(l, &op);
            return;
        }
        TALARIA_LOG(ofi, debug, "{}: posting {} to {} failed: {}", scheme_,
                    op_type_name(op.completion.type), ofi_addr(op.peer)->str,
                    fi_strerror(int(-rc)));
        op.first_error = Errc::disconnected;
        if (op.fragments == 0)
            op_finished(l, &op, Errc::disconnected);
        else
            to_provider_locked(l, &op);  // the fragments in flight finish it
    });
}

Result<OpId> OfiTransport::post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                                std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                                Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, false);
}

Result<OpId> OfiTransport::post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                              std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                              Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, true);
}

void OfiTransport::complete_recv(OfiLane& l, OfiOp* op, const Addr& source, uint8_t ctx_id, Tag tag,
                                 std::size_t size, Errc status) {
    op->completion.source = source;
    op->completion.context_id = ctx_id;
    op->completion.tag = tag;
    op->completion.size = size;
    op_finished(l, op, status);
}

Result<OpId> OfiTransport::post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    OfiLane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    OfiOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (QueuedMsg* m = l.match.post_unexpected(ctx.id(), op))
        l.match.deliver(m, op, [&](auto&&... a) { complete_recv(l, a...); });
    return id;
}

Result<OpId> OfiTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                              const Addr& source, Tag tag) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    if (!source || source.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: source is not an address of this transport", scheme_));
    OfiLane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    OfiOp* op = l.ops.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (QueuedMsg* m = l.match.post_expected(op, source, tag)) {
        // It arrived before its receive (also from a peer that died since).
        l.match.deliver(m, op, [&](auto&&... a) { complete_recv(l, a...); });
        return id;
    }
    OfiAddr* peer = ofi_addr(source);
    if (peer->dead.load(std::memory_order_relaxed)) {
        l.match.withdraw(op);
        complete_recv(l, op, source, ctx.id(), tag, 0, Errc::disconnected);
        return id;
    }
    // A receive from a peer that dies must fail: watch the peer (its context 0's endpoint).
    op->rem = remote_locked(l, peer->raw, source);
    op->counted = true;  // op->peer is the source (set by the matcher)
    watch_inc(l, op->rem);
    return id;
}

Result<OpId> OfiTransport::post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    const bool is_put = type == OpType::put;
    const char* what = is_put ? "post_put" : "post_get";
    TALARIA_CHECK(
        check_rma_args(this, scheme_, what, ctx, local, local_off, remote, len, remote_addr));
    auto* lm = local.as<OfiMem>();
    auto* rm = remote.as<OfiMem>();
    OfiAddr* peer = ofi_addr(remote_addr);
    OfiLane& l = lane_of(ctx);

    std::lock_guard g(l.mu);
    // The provider checks keys, ranges and access at the target too; checking what the handle
    // says here first gives the exact status and leaves the target untouched.
    bool allowed = is_put ? (uint8_t(rm->access()) & uint8_t(Access::write_only))
                          : (uint8_t(rm->access()) & uint8_t(Access::read_only));
    if (!allowed)
        return fail_async(l, ctx, std::move(cb), type, Errc::access_denied,
                          fmt::format("the remote region does not allow {}",
                                      is_put ? "writes (put)" : "reads (get)"));
    if (remote_off > rm->length() || len > rm->length() - remote_off)
        return fail_async(l, ctx, std::move(cb), type, Errc::out_of_range,
                          fmt::format("remote range [{}, +{}) is outside the {}-byte region",
                                      remote_off, len, rm->length()));
    Addr owner = rm->local() ? self_ : rm->owner_addr;
    if (peer->dead.load(std::memory_order_relaxed) ||
        (owner && ofi_addr(owner)->dead.load(std::memory_order_relaxed)))
        return fail_async(l, ctx, std::move(cb), type, Errc::disconnected,
                          fmt::format("{} was declared dead (a handle or address of that process "
                                      "stays dead; look the peer up again for a new process)",
                                      owner ? ofi_addr(owner)->str : peer->str));
    if (owner && owner != remote_addr)
        return fail_async(
            l, ctx, std::move(cb), type, Errc::invalid_argument,
            ofi_addr(owner)->str == peer->str
                ? fmt::format("the remote handle belongs to an earlier process at {} than the "
                              "address passed (the peer was looked up again after it was "
                              "declared dead)",
                              peer->str)
                : fmt::format("the remote handle was registered by {}, not by {}",
                              ofi_addr(owner)->str, peer->str));
    if (len == 0) return fail_async(l, ctx, std::move(cb), type, Errc::ok, "empty transfer");
    if (remote_addr == self_) [[unlikely]] {
        // This transport's own memory (a handle the program sent to itself): copied here,
        // listening or not.
        std::string why;
        const Errc st = serve_self_rma(is_put, reinterpret_cast<std::byte*>(lm->base()) + local_off,
                                       *rm, remote_off, len, why);
        if (st != Errc::ok) return fail_async(l, ctx, std::move(cb), type, st, why);
        return complete_now(l, ctx, std::move(cb), type, Errc::ok, len);
    }
    // Registrations are the domain's: any endpoint of the owner serves them; its context 0's
    // is the one every peer knows.
    Remote* rem = remote_locked(l, peer->raw, remote_addr);
    if (auto r = av_insert_locked(l, rem); !r) {
        // A full address vector is a local limit, reported here with its message.
        if (r.error().code() == Errc::no_memory) return r.error();
        return fail_async(l, ctx, std::move(cb), type, Errc::unreachable, r.error().message());
    }
    OfiOp* op = l.ops.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(fmt::format("{} {}", scheme_, what), opts_.max_ops);
    op->completion.size = len;
    OpId id = op->id();
    op->buf = reinterpret_cast<std::byte*>(lm->base()) + local_off;
    op->cap = len;
    op->desc = lm->desc;
    op->raddr = (rm->virt ? rm->base() : 0) + remote_off;
    op->rkey = rm->key;
    op->peer = remote_addr;
    op->rem = rem;
    op->counted = true;
    watch_inc(l, rem);
    if (rem->deferred > 0 || (rem->solo && rem->in_provider > 0)) {
        defer_locked(l, op);
        return id;
    }
    ssize_t rc = try_post_locked(l, op);
    if (rc == 0) {
        to_provider_locked(l, op);
    } else if (rc == -FI_EAGAIN) {
        count_pressure(op);
        defer_locked(l, op);
    } else {
        TALARIA_LOG(ofi, warn, "{}: {} to {} on {} failed: {}", scheme_,
                    is_put ? "fi_write" : "fi_read", peer->str, prov_.prov_name,
                    fi_strerror(int(-rc)));
        op->first_error = Errc::disconnected;
        if (op->fragments == 0)
            op_finished(l, op, Errc::disconnected);
        else
            to_provider_locked(l, op);
    }
    return id;
}

Errc OfiTransport::serve_self_rma(bool is_put, std::byte* mine, const OfiMem& rm,
                                  std::size_t remote_off, std::size_t len, std::string& why) {
    std::lock_guard g(reg_mu_);  // a deregistration waits for the copy
    auto it = regs_.find(rm.key);
    if (it == regs_.end()) {
        why =
            "the handle names no live registration of this transport (deregistered, or never "
            "made)";
        return Errc::invalid_argument;
    }
    const OfiMem& m = *it->second;
    // The address as the provider reads it: virtual, or an offset into the registration.
    const uint64_t at = (rm.virt ? rm.base() : m.base()) + remote_off;
    if (Errc st = check_region(m.access(), m.base(), m.length(), is_put, at, len); st != Errc::ok) {
        why = st == Errc::access_denied
                  ? fmt::format("the registration does not allow {}", is_put ? "writes" : "reads")
                  : fmt::format("[{:#x}, +{}) is outside the registered [{:#x}, +{})", at, len,
                                m.base(), m.length());
        return st;
    }
    auto* where = reinterpret_cast<std::byte*>(at);
    std::memmove(is_put ? where : mine, is_put ? mine : where, len);
    return Errc::ok;
}

Result<OpId> OfiTransport::post_put(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::put, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<OpId> OfiTransport::post_get(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::get, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<void> OfiTransport::cancel(OpId id) {
    OfiLane* l = nullptr;
    for (std::size_t i = 0; !l && i < opts_.max_contexts; ++i) {
        OfiLane* c = lane_at(uint8_t(i));
        if (c && c->ops.owns(id.op)) l = c;
    }
    if (!l)
        return Error(Errc::not_found,
                     fmt::format("{} cancel: not an operation of this transport", scheme_));
    std::lock_guard g(l->mu);
    OfiOp* op = l->ops.lookup(id);
    if (!op)
        return Error(
            Errc::not_found,
            fmt::format("{} cancel: the operation already finished (stale OpId)", scheme_));
    if (op->state == OpState::recv_posted) {
        // Receives are matched in software: withdrawn here, completed once.
        l->match.withdraw(op);
        op_finished(*l, op, Errc::canceled);
    } else if (op->state == OpState::routing) {
        op->route->waiting.erase(*op);
        op_finished(*l, op, Errc::canceled);
    } else if (op->state == OpState::deferred && op->fragments == 0) {
        l->deferred.erase(*op);
        --op->rem->deferred;
        op_finished(*l, op, Errc::canceled);
    } else if (op->state == OpState::in_provider) {
        // Sends and put/get in the provider: ask it; if it cannot stop them they complete
        // normally (fi_cancel reports completion through the CQ either way).
        op->cancel_asked = true;
        const bool rma = op->completion.type == OpType::put || op->completion.type == OpType::get;
        fi_cancel(rma && l->rma_ep ? &l->rma_ep->fid : &l->ep->fid, static_cast<FiCtx*>(op));
    }
    return ok();
}

// --- receiving -----------------------------------------------------------------------------------

void OfiTransport::repost_rx(OfiLane& l, RxBuf* rb) {
    if (!l.ep) return;
    ssize_t rc;
    if (prov_.multi_recv) {
        iovec iov{rb->data, rb->size};
        void* desc = l.rx_desc;
        fi_msg msg{};
        msg.msg_iov = &iov;
        msg.desc = &desc;
        msg.iov_count = 1;
        msg.addr = FI_ADDR_UNSPEC;
        msg.context = static_cast<FiCtx*>(rb);
        rc = post_retry_locked(l, [&] { return fi_recvmsg(l.ep, &msg, FI_MULTI_RECV); });
    } else {
        rc = post_retry_locked(l, [&] {
            return fi_recv(l.ep, rb->data, rb->size, l.rx_desc, FI_ADDR_UNSPEC,
                           static_cast<FiCtx*>(rb));
        });
    }
    rb->posted = rc == 0;
    if (rc != 0)
        TALARIA_LOG(ofi, error, "{}: reposting a receive buffer of context {} failed: {}",
                    prov_.prov_name, l.id, fi_strerror(int(-rc)));
}

Addr OfiTransport::find_raw(std::string_view raw, uint64_t instance) {
    std::lock_guard g(intern_mu_);
    char key[1 + kMaxRawAddr];
    key[0] = '\x01';
    std::memcpy(key + 1, raw.data(), raw.size());
    Addr a = addrs_.find(std::string_view(key, 1 + raw.size()));
    if (a && instance != 0) {
        uint64_t zero = 0;
        ofi_addr(a)->instance.compare_exchange_strong(zero, instance, std::memory_order_relaxed);
    }
    return a;
}

Source* OfiTransport::source_locked(OfiLane& l, const MsgHeader& h, bool admit) {
    std::string_view raw(reinterpret_cast<const char*>(h.raw_addr.data()), h.raw_addr.size());
    if (Source* s = l.last_source; s && s->instance == h.instance && l.last_source_raw == raw &&
                                   !ofi_addr(s->addr)->dead.load(std::memory_order_relaxed))
        return s;  // (a lane keeps sources only of senders that proved the secret, if asked)
    auto it = l.sources.find(raw);
    if (opts_.auth.enabled() && !admit) {
        // Only a sender that proved the secret is delivered; a new process at the address of
        // one that did must prove it again (on_auth_locked admits it then).
        bool proved = it != l.sources.end() && it->second.instance == h.instance &&
                      ofi_addr(it->second.addr)->proved.load(std::memory_order_acquire);
        if (!proved) {
            Addr known = find_raw(raw, 0);
            proved = known &&
                     ofi_addr(known)->instance.load(std::memory_order_relaxed) == h.instance &&
                     ofi_addr(known)->proved.load(std::memory_order_acquire);
        }
        if (!proved) {
            refuse_stranger_locked(l, h);
            return nullptr;
        }
    }
    if (it != l.sources.end() && it->second.instance == h.instance) {
        if (!ofi_addr(it->second.addr)->dead.load(std::memory_order_relaxed)) {
            l.last_source = &it->second;
            l.last_source_raw.assign(raw);
            return &it->second;
        }
        // A process declared dead speaks again. If another process now lives at its address,
        // this is a late message of the old one: dropped (it must not declare the new one
        // dead). Else it was declared dead wrongly (a slow peer): it gets a new address below.
        Addr now_there = find_raw(raw, 0);
        if (now_there &&
            ofi_addr(now_there)->instance.load(std::memory_order_relaxed) != h.instance) {
            TALARIA_LOG(ofi, debug,
                        "{}: dropping a late message of {} (declared dead; a new "
                        "process uses its address)",
                        scheme_, ofi_addr(it->second.addr)->str);
            return nullptr;
        }
    }
    // A process this lane has not heard from (or a new instance of one): intern it.
    Addr src = find_raw(raw, h.instance);
    if (src && ofi_addr(src)->instance.load(std::memory_order_relaxed) != h.instance) {
        // A new endpoint at the address of an old one: the old one is gone.
        peer_failed_locked(l, ofi_addr(src), Errc::disconnected,
                           "a new endpoint now uses its address");
        src.reset();
    }
    if (!src) {
        std::string canonical = canonical_of(h.raw_addr);
        if (canonical.empty()) {
            TALARIA_LOG(ofi, warn,
                        "{}: dropping a message from an address that is not an {} endpoint",
                        scheme_, scheme_);
            return nullptr;
        }
        std::lock_guard g(intern_mu_);
        src = intern_locked(canonical, std::string(raw));
        uint64_t zero = 0;
        ofi_addr(src)->instance.compare_exchange_strong(zero, h.instance,
                                                        std::memory_order_relaxed);
    }
    if (it == l.sources.end()) it = l.sources.try_emplace(std::string(raw)).first;
    Source& s = it->second;
    s.addr = alias_of(this, src);
    s.instance = h.instance;
    s.learned[0].reset();
    s.learned[1].reset();
    l.last_source = &s;
    l.last_source_raw.assign(raw);
    return &s;
}

void OfiTransport::on_message(OfiLane& l, std::span<const std::byte> msg) {
    auto h = decode_msg_header(msg);
    if (!h) {
        TALARIA_LOG(ofi, warn, "{}: dropping a message: {}", scheme_, h.error().message());
        return;
    }
    if (h->kind == MsgKind::auth) {
        on_auth_locked(l, *h, msg.subspan(h->header_size));
        return;
    }
    Source* s = source_locked(l, *h);
    if (!s) return;
    if (opts_.auth.enabled() && !token_ok(ofi_addr(s->addr), h->token)) [[unlikely]] {
        // Its header names a process that proved the secret, but not the token of their
        // session: someone else wrote it.
        refuse_stranger_locked(l, *h);
        return;
    }
    if (!l.watched.empty()) s->heard = Clock::now();
    const Addr& src = s->addr;
    std::span<const std::byte> lane_raw = h->lane_addr.empty() ? h->raw_addr : h->lane_addr;
    std::string_view lraw(reinterpret_cast<const char*>(lane_raw.data()), lane_raw.size());
    // Where the sender's context lives, for our replies: its expected messages go to the
    // endpoint it sent from, and so do its unexpected ones when its context takes them.
    const uint8_t sc = h->source_ctx;
    const bool serves = (h->flags & kFlagServes) != 0;
    if (!s->learned[0].test(sc) || (serves && !s->learned[1].test(sc))) {
        if (!h->lane_addr.empty() && canonical_of(h->lane_addr).empty()) {
            TALARIA_LOG(ofi, warn,
                        "{}: dropping a message from {}: its lane address is not an "
                        "{} endpoint",
                        scheme_, ofi_addr(src)->str, scheme_);
            return;
        }
        Remote* rem = remote_locked(l, lraw, src);
        for (int kind = 0; kind < (serves ? 2 : 1); ++kind) {
            Route* r = route_locked(l, src, sc, kind == 1);
            if (!r->rem) route_found_locked(l, *r, rem);
            s->learned[kind].set(sc);
        }
    }
    std::span<const std::byte> payload = msg.subspan(h->header_size);
    switch (h->kind) {
        case MsgKind::probe:
            return;
        case MsgKind::locate:
            // The answer goes to the lane address the header names: it must be one of ours.
            if (!h->lane_addr.empty() && canonical_of(h->lane_addr).empty()) {
                TALARIA_LOG(ofi, warn,
                            "{}: dropping a locate from {}: its lane address is not "
                            "an {} endpoint",
                            scheme_, ofi_addr(src)->str, scheme_);
                return;
            }
            answer_locate_locked(l, remote_locked(l, lraw, src), h->tag, payload);
            return;
        case MsgKind::located:
            on_located_locked(l, src, h->tag, payload);
            return;
        default:
            break;
    }
    ++l.rx_buffer_messages;
    const bool expected = h->kind == MsgKind::expected;
    bool no_context = false;
    OfiOp* op = l.match.match(expected, h->context_id, src, h->tag, &no_context);
    if (!op) {
        Queued q = l.match.queue_copy(expected, h->context_id, src, h->tag, payload,
                                      &ofi_addr(src)->unexpected_bytes);
        std::size_t unlogged = 0;
        if (q != Queued::ok && l.match.log_refusal(&unlogged))
            TALARIA_LOG(ofi, warn,
                        "{}: dropping a {}-byte {} message (tag {}) from {} for context {}: {}{}",
                        scheme_, payload.size(), expected ? "expected" : "unexpected", h->tag,
                        ofi_addr(src)->str, h->context_id, l.match.refusal(q),
                        unlogged_note(unlogged));
        return;
    }
    Errc st = copy_message(payload.data(), payload.size(), op->buf, op->cap);
    complete_recv(l, op, src, h->context_id, h->tag, payload.size(), st);
}

void OfiTransport::on_rx(OfiLane& l, RxBuf* rb, const fi_cq_tagged_entry& e) {
    if (e.len > 0) {
        const auto* p = prov_.multi_recv ? static_cast<const std::byte*>(e.buf) : rb->data;
        on_message(l, std::span<const std::byte>(p, e.len));
    }
    // A multi-recv buffer is ours again once the provider says so; a plain one at once.
    if (!prov_.multi_recv || (e.flags & FI_MULTI_RECV)) repost_rx(l, rb);
}

// --- completions ---------------------------------------------------------------------------------

void OfiTransport::on_completion(OfiLane& l, const fi_cq_tagged_entry& e) {
    auto* c = static_cast<FiCtx*>(e.op_context);
    if (!c) return;
    switch (c->fi_kind) {
        case FiCtx::Kind::rx:
            on_rx(l, static_cast<RxBuf*>(c), e);
            break;
        case FiCtx::Kind::ctl: {
            auto* m = static_cast<Ctl*>(c);
            if (m->probe) {
                m->rem->probing = false;
                m->rem->probe_breaks = 0;
                m->rem->connected = true;
                m->rem->heard = Clock::now();
                m->rem = nullptr;
                m->peer.reset();
                m->probe = false;
            }
            m->in_use = false;
            break;
        }
        case FiCtx::Kind::op: {
            auto* op = static_cast<OfiOp*>(c);
            if (op->orphaned) [[unlikely]] {
                release_orphan(l, op);
                break;
            }
            if (op->completion.type == OpType::put || op->completion.type == OpType::get) {
                --op->fragments;
                rma_fragment_done_locked(l, op);
            } else {
                op->rem->connected = true;
                op_finished(l, op, Errc::ok);
            }
            break;
        }
    }
}

void OfiTransport::on_error(OfiLane& l, fid_cq* cq, const fi_cq_err_entry& e) {
    auto* c = static_cast<FiCtx*>(e.op_context);
    char buf[256] = {};
    const char* perr = fi_cq_strerror(cq, e.prov_errno, e.err_data, buf, sizeof buf);
    std::string why =
        fmt::format("{} (provider {}: {})", fi_strerror(e.err), prov_.prov_name, perr ? perr : "");
    if (!c) {
        TALARIA_LOG(ofi, warn, "{}: completion error without a context: {}", scheme_, why);
        return;
    }
    // shm 1.17 reports some errors negated (-FI_ETRUNC): the code is its absolute value.
    const int err = e.err < 0 ? -e.err : e.err;
    Errc st = errc_of(err);
    switch (c->fi_kind) {
        case FiCtx::Kind::rx: {
            auto* rb = static_cast<RxBuf*>(c);
            if (err == FI_ECANCELED) {
                rb->posted = false;
                return;
            }
            TALARIA_LOG(ofi, warn, "{}: receive error: {}", scheme_, why);
            if (!prov_.multi_recv || (e.flags & FI_MULTI_RECV)) repost_rx(l, rb);
            break;
        }
        case FiCtx::Kind::ctl: {
            auto* m = static_cast<Ctl*>(c);
            m->in_use = false;
            if (!m->probe) {
                TALARIA_LOG(ofi, debug, "{}: a locate or its answer failed: {}", scheme_, why);
                break;
            }
            Addr peer = std::move(m->peer);
            Remote* rem = m->rem;
            rem->probing = false;
            m->rem = nullptr;
            m->probe = false;
            if (connection_broke(err) && rem->probe_breaks < kResends) {
                // As for an op (kResends): the next look probes again, on a new connection.
                ++rem->probe_breaks;
                rem->heard = TimePoint{};
                TALARIA_LOG(ofi, debug, "{}: a probe of {} met a broken connection: {}", scheme_,
                            ofi_addr(peer)->str, why);
                break;
            }
            peer_failed_locked(l, ofi_addr(peer), Errc::disconnected, "probe failed: " + why);
            break;
        }
        case FiCtx::Kind::op: {
            auto* op = static_cast<OfiOp*>(c);
            if (op->orphaned) [[unlikely]] {
                release_orphan(l, op);
                break;
            }
            TALARIA_LOG(ofi, debug, "{} failed: {}", op_type_name(op->completion.type), why);
            // rxm fails the operations of a connection that broke with FI_ECANCELED: that is
            // a lost peer unless we asked for the cancel.
            const bool rma =
                op->completion.type == OpType::put || op->completion.type == OpType::get;
            // The tcp provider closes the connection whose target refused a put/get, and
            // rxm fails everything it held there alike (FI_ECANCELED): post each again, one
            // at a time. The one that fails again while alone is the refused one.
            const bool refused = rma && err == FI_ECANCELED && !op->cancel_asked && op->solo_post &&
                                 refused_by_target(e.prov_errno);
            if (!op->cancel_asked && !refused && connection_broke(err) && op->peer &&
                !ofi_addr(op->peer)->dead.load(std::memory_order_relaxed)) {
                if (op->rem) op->rem->solo = true;
                if (rma) {
                    op->resend = true;
                    --op->fragments;
                    rma_fragment_done_locked(l, op);
                    break;
                }
                if (resend_locked(l, op)) break;
            }
            if (st == Errc::canceled && !op->cancel_asked) {
                if (refused)
                    st = Errc::access_denied;  // this op alone: the peer is fine
                else
                    st = op->first_error != Errc::ok ? op->first_error : Errc::disconnected;
            }
            Addr peer = op->peer;
            if (rma) {
                if (op->first_error == Errc::ok) op->first_error = st;
                --op->fragments;
                rma_fragment_done_locked(l, op);
            } else {
                op_finished(l, op, st);
            }
            if (peer && peer_lost(st)) peer_failed_locked(l, ofi_addr(peer), st, why);
            break;
        }
    }
}

void OfiTransport::poll_cq_locked(OfiLane& l) {
    if (!l.cq || l.polling) return;
    l.polling = true;
    struct Done {
        bool& f;
        ~Done() { f = false; }
    } done{l.polling};
    // While put/get are in flight, a pass that found no message reads the message CQ again
    // only every 4th pass (on tcp each read is a system call).
    if (l.rma_inflight == 0 || l.cq_busy || (++l.rma_skip & 3) == 0)
        l.cq_busy = poll_one_cq_locked(l, l.cq);
    if (l.rma_cq && (l.rma_inflight > 0 || l.rma_poke || !l.deferred.empty())) {
        l.rma_poke = false;
        poll_one_cq_locked(l, l.rma_cq);
    }
}

bool OfiTransport::trywait_locked(OfiLane& l) {
    fid* f[2] = {&l.cq->fid, l.rma_cq ? &l.rma_cq->fid : nullptr};
    if (fi_trywait(fabric_, f, l.rma_cq ? 2 : 1) == FI_SUCCESS) return true;
    l.rma_poke = l.rma_cq != nullptr;
    return false;
}

bool OfiTransport::poll_one_cq_locked(OfiLane& l, fid_cq* cq) {
    fi_cq_tagged_entry entries[kCqBatch];
    bool found = false;
    for (int round = 0; round < 4; ++round) {
        ssize_t n = fi_cq_read(cq, entries, kCqBatch);
        found = found || n > 0 || n == -FI_EAVAIL;
        if (n > 0) {
            if (!prov_.wait_fd) {
                l.last_completion = Clock::now();
                l.poll_slice = kPollSliceMin;
            }
            for (ssize_t i = 0; i < n; ++i)
                on_completion(l, entries[i]);
            if (n < kCqBatch) break;
            continue;
        }
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(cq, &err, 0) > 0) on_error(l, cq, err);
            continue;
        }
        if (n != -FI_EAGAIN)
            TALARIA_LOG(ofi, error, "{}: fi_cq_read failed: {}", prov_.prov_name,
                        fi_strerror(int(-n)));
        break;
    }
    return found;
}

// --- peer death ----------------------------------------------------------------------------------

void OfiTransport::peer_failed_locked(OfiLane& l, OfiAddr* a, Errc status, const std::string& why) {
    Addr hold(a);  // failing the last op on it must not free it under us
    if (!a->dead.exchange(true)) {
        TALARIA_LOG(ofi, debug, "{}: peer {} is dead: {}", scheme_, a->str, why);
        // An unreachable peer was never reached: the cause alone says it (the core prefixes
        // "cannot be reached"); any other status ends a peer that was there.
        note_failure(a, status == Errc::unreachable ? why : "declared dead: " + why);
        // A peer a link came up with is lost; one never reached was an attempt that failed.
        note(a->linked.load(std::memory_order_relaxed) ? LinkEvent::lost
                                                       : LinkEvent::connect_failed);
        {
            // The next lookup of that name makes a new address (a restarted peer).
            std::lock_guard g(intern_mu_);
            addrs_.unlink(a->str, a);
            for (const std::string& s : a->aliases)
                addrs_.unlink(s, a);
            if (a->raw_alias) addrs_.unlink("\x01" + a->raw, a);
        }
        deaths_.fetch_add(1, std::memory_order_release);
        if (a->pid > 0 && prov_.prov_name == "shm" && process_gone(a->pid)) {
            // A killed shm peer cannot remove its regions: do it for it (their names carry its
            // pid, which no longer exists, so nobody uses them any more).
            for (const auto& [raw, r] : l.remotes) {
                if (ofi_addr(r->peer) != a) continue;
                std::string name = raw.substr(raw.find("://") + 3);
                if (::shm_unlink(name.c_str()) == 0)
                    TALARIA_LOG(ofi, debug, "removed the shm region {} of dead peer {}", name,
                                a->str);
            }
        }
    }
    fail_peer_ops_locked(l, a, status);
}

void OfiTransport::defer_death_locked(OfiLane& l, OfiAddr* a, Errc status, std::string why) {
    l.deaths.push_back(PendingDeath{Addr(a), status, std::move(why)});
}

void OfiTransport::flush_deaths_locked(OfiLane& l) {
    while (!l.deaths.empty()) {
        PendingDeath d = std::move(l.deaths.back());
        l.deaths.pop_back();
        peer_failed_locked(l, ofi_addr(d.peer), d.status, d.why);
    }
}

void OfiTransport::retry_ctls_locked(OfiLane& l) {
    for (std::size_t i = 0; i < l.ctl_retry.size();) {
        CtlRetry& c = l.ctl_retry[i];
        ssize_t rc = ctl_send_locked(l, c.ctl, c.total, c.to);
        if (rc == -FI_EAGAIN) {
            ++i;
            continue;
        }
        if (rc != 0) {
            c.ctl->in_use = false;
            TALARIA_LOG(ofi, debug, "{}: answering a locate failed: {} (it asks again)", scheme_,
                        fi_strerror(int(-rc)));
        }
        l.ctl_retry[i] = l.ctl_retry.back();
        l.ctl_retry.pop_back();
    }
}

void OfiTransport::fail_peer_ops_locked(OfiLane& l, OfiAddr* a, Errc status) {
    Addr hold(a);
    l.deferred.for_each_safe([&](OfiOp& op) {
        if (ofi_addr(op.peer) != a) return;
        l.deferred.erase(op);
        --op.rem->deferred;
        op.first_error = status;
        if (op.fragments == 0)
            op_finished(l, &op, status);
        else
            to_provider_locked(l, &op);
    });
    l.match.take_expected_from(hold, [&](OfiOp* op) {
        complete_recv(l, op, hold, op->ctx->id(), op->match_tag, 0, status);
    });
    for (auto it = l.routes.begin(); it != l.routes.end();) {
        if (ofi_addr(it->second.peer) != a) {
            ++it;
            continue;
        }
        route_failed_locked(l, it->second, status, "the peer was declared dead");
        if (l.last_route == &it->second) l.last_route = nullptr;
        it = l.routes.erase(it);
    }
    // Its sources stay (the message being handled may be its): source_locked() replaces an
    // entry whose process is dead when that address speaks again.
}

void OfiTransport::sweep_dead_locked(OfiLane& l) {
    l.deaths_seen = deaths_.load(std::memory_order_acquire);
    std::vector<Addr> dead;
    auto mark = [&](const Addr& p) {
        if (p && ofi_addr(p)->dead.load(std::memory_order_relaxed) &&
            std::find(dead.begin(), dead.end(), p) == dead.end())
            dead.push_back(Addr(ofi_addr(p)));
    };
    for (auto& [k, r] : l.routes)
        mark(r.peer);
    for (Remote& r : l.watched)
        mark(r.peer);
    for (const Addr& p : dead)
        fail_peer_ops_locked(l, ofi_addr(p), Errc::disconnected);
}

void OfiTransport::send_probe_locked(OfiLane& l, Remote* r, TimePoint now) {
    OfiAddr* a = ofi_addr(r->peer);
    if (!shm_local_peer_ok_locked(l, r)) return;
    if (auto ins = av_insert_locked(l, r); !ins) {
        defer_death_locked(l, a, Errc::unreachable, ins.error().message());
        return;
    }
    Ctl* c = ctl_alloc_locked(l);
    if (!c) return;
    struct Unreserve {
        Ctl* c;
        ~Unreserve() {
            if (c) c->in_use = false;
        }
    } unreserve{c};
    std::byte* start = c->buf.data() - l.header_size;
    std::memcpy(start, l.header, l.header_size);
    start[1] = std::byte(uint8_t(MsgKind::probe));
    stamp_token(start, ofi_addr(r->peer));
    ssize_t rc = ctl_send_locked(l, c, l.header_size, r);
    if (rc == -FI_EAGAIN) {
        // rxm answers -FI_EAGAIN while it (re)connects, forever if the peer is gone. A peer
        // whose address now refuses TCP connections is gone at once.
        if (listener_gone_locked(r, now)) {
            defer_death_locked(l, a, Errc::disconnected,
                               "nothing listens on its port any more (and the provider cannot "
                               "reach it): its process is gone");
            return;
        }
        if (r->refused_since == TimePoint{}) {
            r->refused_since = now;  // a spell of refusals begins
            note(LinkEvent::backpressure);
        } else if (now - r->refused_since > kProbeTimeout) {
            defer_death_locked(l, a, Errc::disconnected,
                               fmt::format("the provider refused to send to it (-FI_EAGAIN, "
                                           "connecting) for {} ms",
                                           std::chrono::duration_cast<std::chrono::milliseconds>(
                                               now - r->refused_since)
                                               .count()));
        }
        return;
    }
    r->refused_since = TimePoint{};
    if (rc != 0) {
        defer_death_locked(l, a, Errc::disconnected,
                           fmt::format("probe send failed: {}", fi_strerror(int(-rc))));
        return;
    }
    unreserve.c = nullptr;
    c->probe = true;
    c->peer = r->peer;
    c->rem = r;
    r->probing = true;
    r->probe_sent = now;
}

namespace {

bool is_loopback(const SockAddr& sa) noexcept {
    if (sa.family() == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(sa.sa());
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa.sa());
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
}

/// Does a socket of this network namespace listen on TCP `port` (any address)? nullopt when
/// neither /proc/net/tcp nor /proc/net/tcp6 can be read.
std::optional<bool> tcp_port_listened(uint16_t port) {
    bool read_any = false;
    for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::FILE* f = std::fopen(path, "re");
        if (!f) continue;
        read_any = true;
        char line[512];
        bool found = false;
        // "  sl  local_address rem_address   st ...": the first line names the columns.
        for (bool header = true; !found && std::fgets(line, sizeof line, f); header = false) {
            char local[64];
            unsigned state = 0;
            if (header || std::sscanf(line, "%*s %63s %*s %x", local, &state) != 2) continue;
            const char* colon = std::strrchr(local, ':');
            found = colon && state == 0x0A /* TCP_LISTEN */ &&
                    std::strtoul(colon + 1, nullptr, 16) == port;
        }
        std::fclose(f);
        if (found) return true;
    }
    if (!read_any) return std::nullopt;
    return false;
}

}  // namespace

bool OfiTransport::listener_gone_locked(Remote* r, TimePoint now) {
    if (!prov_.tcp_listener || now - r->listen_checked_at < kProbeAfterSilence) return false;
    r->listen_checked_at = now;
    auto sa = sock_addr_of(std::as_bytes(std::span(r->raw)));
    if (!sa || !is_loopback(*sa)) return false;
    auto listened = tcp_port_listened(sa->port());
    return listened && !*listened;
}

std::optional<std::string> OfiTransport::connect_refused_locked(Remote* r, TimePoint now) {
    if (!prov_.tcp_listener || now - r->refused_since < kConnectProbeAfter) return std::nullopt;
    auto failure = [&](int err) -> std::optional<std::string> {
        if (err != ECONNREFUSED && err != EHOSTUNREACH && err != ENETUNREACH && err != ETIMEDOUT)
            return std::nullopt;  // anything else: the provider's own retries decide
        return connect_failure_text(host_port_of(ofi_addr(r->peer)), err);
    };
    if (r->connect_probe < 0) {
        if (r->connect_probed) return std::nullopt;
        r->connect_probed = true;
        auto sa = sock_addr_of(std::as_bytes(std::span(r->raw)));
        if (!sa || is_loopback(*sa)) return std::nullopt;  // listener_gone_locked's part
        const int fd = ::socket(sa->family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return std::nullopt;
        if (::connect(fd, sa->sa(), sa->len) == 0) {
            ::close(fd);  // it listens
            return std::nullopt;
        }
        if (errno != EINPROGRESS) {
            const int err = errno;
            ::close(fd);
            return failure(err);
        }
        r->connect_probe = fd;
        TALARIA_LOG(
            ofi, debug, "{}: the provider has not connected to {} for {} ms: probing its port",
            scheme_, ofi_addr(r->peer)->str,
            std::chrono::duration_cast<std::chrono::milliseconds>(now - r->refused_since).count());
        return std::nullopt;
    }
    pollfd p{r->connect_probe, POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return std::nullopt;  // still connecting
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(r->connect_probe, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    r->close_connect_probe();
    return err == 0 ? std::nullopt : failure(err);
}

void OfiTransport::check_peers_locked(OfiLane& l, TimePoint now) {
    if (l.watched.empty() || now < l.next_check) return;
    l.next_check = now + kProbeCheckEvery;
    if (l.rma_inflight > 0 && prov_.shm) check_stuck_rma_locked(l, now);
    l.watched.for_each_safe([&](Remote& r) {
        OfiAddr* a = ofi_addr(r.peer);
        if (a->dead.load(std::memory_order_relaxed) || a == self_.impl()) return;
        if (r.pid > 0 && process_gone(r.pid)) {
            defer_death_locked(l, a, Errc::disconnected,
                               fmt::format("its process {} is gone", r.pid));
            return;
        }
        // A message from any of its endpoints proves it alive.
        if (auto s = l.sources.find(std::string_view(a->raw)); s != l.sources.end())
            r.heard = std::max(r.heard, s->second.heard);
        if (r.probing) {
            if (now - r.probe_sent > kProbeTimeout)
                defer_death_locked(l, a, Errc::disconnected, "a probe got no completion in time");
            else if (now - r.probe_sent > kProbeAfterSilence && listener_gone_locked(&r, now))
                defer_death_locked(l, a, Errc::disconnected,
                                   "a probe is unanswered and nothing listens on its port any "
                                   "more: its process is gone");
            return;
        }
        if (now - r.heard >= kProbeAfterSilence || r.probe_now) {
            r.probe_now = false;
            send_probe_locked(l, &r, now);
        }
    });
    flush_deaths_locked(l);
}

namespace {
/// How long the provider may hold an shm put/get of `len` bytes before its target is probed:
/// 1 s, and 10 ms more per MiB (a copy at 100 MB/s, far below what shm does on any host).
Duration rma_stuck_after(std::size_t len) noexcept {
    return std::chrono::seconds(1) + std::chrono::microseconds(len / 100);
}
}  // namespace

void OfiTransport::check_stuck_rma_locked(OfiLane& l, TimePoint now) {
    std::vector<OfiOp*> orphans;
    for (OfiOp& op : l.inflight) {
        const OpType t = op.completion.type;
        if ((t != OpType::put && t != OpType::get) || !op.rem || op.rma_posted == TimePoint{} ||
            now - op.rma_posted < rma_stuck_after(op.cap))
            continue;
        Remote* r = op.rem;
        if (ofi_addr(r->peer)->dead.load(std::memory_order_relaxed)) {
            orphans.push_back(&op);
            continue;
        }
        // Probe it at once (check_peers_locked's next look), however recently it spoke: shm
        // refuses every send to a target that dropped our put/get, and a spell of refused
        // probes declares it dead.
        if (!r->probing) r->probe_now = true;
    }
    for (OfiOp* op : orphans)
        rma_dropped_locked(l, op, Errc::disconnected,
                           "its target is gone, or the provider stopped sending to it (shm "
                           "does once the target dropped a put/get of ours)");
}

void OfiTransport::rma_dropped_locked(OfiLane& l, OfiOp* op, Errc status, std::string_view why) {
    if (auto held = rma_dropped_log_.admit())
        TALARIA_LOG(
            ofi, warn,
            "{}: a {} of {} bytes to {} fails after the provider held it for {} ms: {}. "
            "libfabric's shm drops a put/get whose memory key the target does not hold "
            "(the region was deregistered, or the handle is not one it made) without "
            "a word{}",
            scheme_, op->completion.type == OpType::put ? "put" : "get", op->cap,
            op->rem ? ofi_addr(op->rem->peer)->str : std::string("its target"),
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - op->rma_posted)
                .count(),
            why, log::held_back(*held));
    // The provider may still name `op` (its record of it is never freed, or a target that was
    // only slow answers after all): the caller is answered through a fresh op, and `op` stays
    // out of the pool until a completion for it comes. Without a fresh op (max_ops in flight),
    // `op` itself completes.
    OfiOp* sub =
        op->ctx ? l.ops.acquire(*op->ctx, std::move(op->cb), op->completion.type) : nullptr;
    op->fragments = 0;
    if (sub == nullptr) {
        op_finished(l, op, status);
        return;
    }
    op_finished_quietly_locked(l, op);
    op->orphaned = true;
    l.orphans.push_back(op);
    op->completed = true;  // its OpId is stale now: cancel() says so
    op_finished(l, sub, status);
}

void OfiTransport::release_orphan(OfiLane& l, OfiOp* op) noexcept {
    std::erase(l.orphans, op);
    op->releaser->release(op);  // acquire() resets what it held
}

std::size_t OfiTransport::watched_peers() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < opts_.max_contexts; ++i) {
        OfiLane* l = lane_at(uint8_t(i));
        if (!l) continue;
        std::lock_guard g(l->mu);
        for (Remote& r : l->watched) {
            (void)r;
            ++n;
        }
    }
    return n;
}

uint64_t OfiTransport::rx_buffer_messages() {
    uint64_t n = 0;
    for (std::size_t i = 0; i < opts_.max_contexts; ++i) {
        OfiLane* l = lane_at(uint8_t(i));
        if (!l) continue;
        std::lock_guard g(l->mu);
        n += l->rx_buffer_messages;
    }
    return n;
}

// --- progress ------------------------------------------------------------------------------------

Result<void> OfiTransport::progress(Context& ctx, TimePoint deadline) {
    auto& oc = static_cast<OfiContext&>(ctx);
    OfiLane& l = oc.lane();
    for (bool woke = false;; woke = true) {
        bool block_ok;
        bool watching;
        bool spinning = false;
        TimePoint resend_due;
        TimePoint now{};  // read for the listener guard only (ofi_guard.cpp)
        {
            std::lock_guard g(l.mu);
            // A wake that brought nothing (the call would have returned): count it. Busy
            // polling never wakes: every 1024th call looks at the clock for the idle sweep.
            if (guarding_ && (woke || (++l.guard_passes & 1023) == 0)) [[unlikely]] {
                now = Clock::now();
                if (woke) spinning = guard_spinning_locked(l, now);
                if (spinning ||
                    now.time_since_epoch().count() >= guard_due_.load(std::memory_order_relaxed))
                    guard(now);
            }
            poll_cq_locked(l);
            if (!l.deferred.empty()) retry_deferred_locked(l);
            if (!l.ctl_retry.empty()) retry_ctls_locked(l);
            flush_deaths_locked(l);
            if (l.deaths_seen != deaths_.load(std::memory_order_relaxed)) sweep_dead_locked(l);
            if (!l.watched.empty() || l.locating > 0) {
                const TimePoint t = Clock::now();
                if (l.locating > 0) check_locates_locked(l, t);
                check_peers_locked(l, t);
            }
            if (ctx.has_completions()) return ok();
            if (deadline_passed(deadline)) return Errc::timeout;
            // Block only when the provider says nothing is pending (fi_trywait), else poll.
            block_ok = true;
            if (prov_.wait_fd) {
                block_ok = trywait_locked(l);
            } else {
                // Without a wait fd (shm): poll on while the lane was active a moment ago,
                // else sleep one slice (the timer wakes us; see kPollSpin).
                block_ok = poll_sleep_armed(l);
            }
            watching =
                !l.watched.empty() || l.locating > 0 || !l.deferred.empty() || !l.ctl_retry.empty();
            resend_due = l.resend_due;
        }
        if (spinning) [[unlikely]]
            std::this_thread::sleep_for(std::chrono::milliseconds(1));  // bound the spin
        if (!block_ok) continue;
        if (!ctx.prepare_block()) return ok();
        int ms = ms_until(deadline);
        if (watching) {
            Duration until = kProbeCheckEvery;
            if (resend_due != TimePoint::max())
                until = std::clamp<Duration>(resend_due - Clock::now(), Duration::zero(), until);
            int cap = int(std::chrono::ceil<std::chrono::milliseconds>(until).count());
            if (ms < 0 || ms > cap) ms = cap;
        }
        epoll_event ev;
        ::epoll_wait(oc.block_fd(), &ev, 1, ms);
        ctx.end_block();
        ctx.drain_event_fd();
        uint64_t ticks;
        while (::read(l.timer_fd, &ticks, sizeof ticks) > 0) {
        }
    }
}

bool OfiTransport::try_wait_for(Context& ctx) {
    OfiLane& l = lane_of(ctx);
    std::lock_guard g(l.mu);
    if (prov_.wait_fd && !trywait_locked(l)) return false;
    // The timer makes the lane's fd readable for what no fd announces: the poll-sleep without
    // a wait fd, the probing of watched peers, locates and deferred posts to retry.
    if (!prov_.wait_fd) return poll_sleep_armed(l);
    uint64_t ticks;
    while (::read(l.timer_fd, &ticks, sizeof ticks) > 0) {
    }
    itimerspec its{};
    if (!l.watched.empty() || l.locating > 0 || !l.deferred.empty() || !l.ctl_retry.empty()) {
        Duration until = kProbeCheckEvery;
        if (l.resend_due != TimePoint::max())
            until = std::clamp<Duration>(l.resend_due - Clock::now(), std::chrono::microseconds(1),
                                         until);
        its.it_value.tv_nsec = long(std::chrono::nanoseconds(until).count());
    }
    ::timerfd_settime(l.timer_fd, 0, &its, nullptr);
    return true;
}

bool OfiTransport::poll_sleep_armed(OfiLane& l) {
    TimePoint now = Clock::now();
    if (now - l.last_completion < kPollSpin) return false;
    uint64_t ticks;
    while (::read(l.timer_fd, &ticks, sizeof ticks) > 0) {
    }
    // One slice, then the next one twice as long (reset by the next completion). Watched
    // peers are looked at every kProbeCheckEvery anyway, longer than any slice.
    itimerspec its{};
    its.it_value.tv_nsec = long(std::chrono::nanoseconds(l.poll_slice).count());
    ::timerfd_settime(l.timer_fd, 0, &its, nullptr);
    l.poll_slice = std::min<Duration>(l.poll_slice * 2, kPollSleep);
    return true;
}

}  // namespace talaria::na::ofi
