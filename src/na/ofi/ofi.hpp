// The ofi transport: libfabric reliable-datagram endpoints (FI_EP_RDM). Every context is a
// progress domain, a lane: its own endpoint, completion queue, address vector, receive buffers,
// op pool, matcher and lock; the fabric, the domain, memory registrations and message-buffer
// slabs are the transport's. Setup (fabric, domain, lanes, addresses, memory registration,
// message-buffer pool) is in ofi_setup.cpp; the data path (posting, routing, completion
// processing, software matching, peer probing, progress) in ofi_io.cpp; the wire format in
// ofi_wire.hpp. Design notes: docs/architecture.md (ofi); wire layout: docs/protocol.md (ofi).
//
// Every message is an untagged libfabric send of [header | payload] into FI_MULTI_RECV buffers
// owned by the receiving lane (or posted buffers where the provider lacks multi-recv), matched
// in software by that lane (na/base/matcher.hpp); the header names the sending process and
// lane, so no provider needs FI_SOURCE. A lane learns where a peer's context lives (which of
// the peer's endpoints serves it) from the peer's headers or by asking the peer's context 0
// (locate / located messages).
//
// Locking: a lane's lock `mu` guards its endpoint, CQ, AV and every structure of the lane (a
// no-op without Options::thread_safe); the domain is opened FI_THREAD_COMPLETION (we serialize
// each endpoint with its CQ; the provider serializes shared objects such as registrations).
// The transport's `setup_mu_` guards lane creation and registration keys (a lane never holds
// it while it takes a lane lock); `buf_mu_` the message-buffer free lists (leaf).
#pragma once

#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <array>
#include <atomic>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "na/base/addr_table.hpp"
#include "na/base/auth.hpp"
#include "na/base/matcher.hpp"
#include "na/base/op.hpp"
#include "na/base/url.hpp"
#include "na/ofi/ofi_wire.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"
#include "talaria/util/log.hpp"
#include "talaria/util/spin_lock.hpp"

namespace talaria::na::ofi {

class OfiTransport;

/// How often (at most) progress looks at the peers that have operations pending on them.
inline constexpr Duration kProbeCheckEvery = std::chrono::milliseconds(100);
/// A lane whose progress wakes this often with nothing to do spins (the listener guard).
inline constexpr uint32_t kSpinWakes = 512;
inline constexpr Duration kSpinWindow = std::chrono::milliseconds(500);
/// Silence from a watched peer after which it is probed.
inline constexpr Duration kProbeAfterSilence = std::chrono::milliseconds(300);
/// A probe not completed, or refused by the provider (-FI_EAGAIN: rxm reconnecting to a peer
/// that refuses connections), for this long declares the peer dead.
inline constexpr Duration kProbeTimeout = std::chrono::milliseconds(2500);
/// A connection that broke under an operation (the tcp provider closes one when its target
/// refuses a put/get: an unknown key, a range outside the region, the wrong access) is made
/// again by rxm on the next post. A put/get (idempotent) or a send of at most kResendMax bytes
/// (sent whole by rxm's eager protocol, so never delivered when it failed) is posted again,
/// at most kResends times, after kResendDelay, 10x it, 100x it, one at a time (Remote::solo);
/// only then is the peer dead. A put/get that breaks the connection while alone on it is the
/// one the target refused.
inline constexpr int kResends = 3;
inline constexpr Duration kResendDelay = std::chrono::milliseconds(20);
inline constexpr std::size_t kResendMax = 4096;
/// Where the completion queue has no wait fd (shm), a blocked progress keeps polling for
/// kPollSpin after the lane's last completion (the next message of a conversation is usually
/// microseconds away), then sleeps in slices that start at kPollSliceMin and double up to
/// kPollSleep while nothing arrives: a busy lane answers in microseconds, an idle one wakes
/// about a thousand times a second.
inline constexpr Duration kPollSpin = std::chrono::microseconds(20);
inline constexpr Duration kPollSliceMin = std::chrono::microseconds(50);
inline constexpr Duration kPollSleep = std::chrono::milliseconds(1);

/// A peer on another host that the provider has refused to send to (-FI_EAGAIN, connecting) for
/// this long gets one TCP connect of our own to its address (Remote::connect_probe): a refusal
/// (or an unreachable host or network) fails it at once, instead of after kProbeTimeout. Not
/// sooner: against a live rxm listener the probe is a connection without a handshake (which
/// libfabric 1.17 keeps a small allocation for), so it is made only when the provider's own
/// connection is already slow (a first call to a peer on another host takes about 150 ms here).
inline constexpr Duration kConnectProbeAfter = std::chrono::milliseconds(300);
/// A locate not answered within this is sent again; after kLocateTries, the sends waiting for
/// it fail (unreachable).
inline constexpr Duration kLocateRetry = std::chrono::seconds(1);
inline constexpr int kLocateTries = 3;
/// Locate answers the provider refused (-FI_EAGAIN) kept to send again, per lane: beyond it an
/// answer is dropped (the asker asks again), so a peer naming an unreachable lane address in
/// its locates cannot grow the queue and the buffers behind it without bound.
inline constexpr std::size_t kMaxCtlRetry = 64;

/// Authentication (Options::auth; ofi_auth.cpp): a handshake not finished within this fails
/// the sends waiting for it (unreachable); a refusal fails sends to that peer at once for
/// kAuthRefusedFor, then the next send tries again; challenges waiting for their response are
/// kept at most kMaxAuthPending (the oldest goes) and for at most kAuthTimeout.
inline constexpr Duration kAuthTimeout = std::chrono::seconds(10);
inline constexpr Duration kAuthRefusedFor = std::chrono::seconds(1);
inline constexpr std::size_t kMaxAuthPending = 256;
/// Remote endpoints a lane keeps (each an AV entry, kept for the lane's life) past which an
/// endpoint it does not know yet gets no answer to an auth request or to a message refused
/// for want of one: strangers cannot grow the AV without bound.
inline constexpr std::size_t kMaxStrangerRemotes = 16384;
/// OfiAddr::auth: our side of the handshake with that process.
enum class AuthState : uint8_t {
    none,      ///< not begun (without Options::auth: sends go as they are)
    dialing,   ///< our request is out: sends wait
    admitted,  ///< both proved the secret to each other: sends go
    refused,   ///< it refused us, or failed to prove it holds the secret: sends fail
};
/// A challenge we sent, waiting for its response.
struct AuthPending {
    std::string raw;  ///< the connector's transport address
    uint64_t instance = 0;
    /// The nonces bound to both ends (addresses and instances): ours, the connector's.
    std::array<std::byte, kAuthNonceSize> own{}, peer{};
    TimePoint since{};
};

/// What a libfabric operation context points at (the first member of each kind).
struct FiCtx {
    enum class Kind : uint8_t { op, rx, ctl };
    Kind fi_kind = Kind::op;
};

struct WatchTag {};
struct LaneTag {};

class OfiLane;

/// One peer process (one transport instance, named by the address of its context 0's
/// endpoint), interned weakly (see na/base/addr_table.hpp) under its canonical string and, as
/// an alias, under "\x01" + its raw provider address (how a received header names it). Lives
/// while a user Addr, an alias, a lane's route, source or remote endpoint, a pending op, a
/// queued message or a remote memory handle holds it. `str`, `raw` and `pid` are written
/// before it is handed out; `instance` and `dead` are atomics; `aliases`/`raw_alias` are under
/// the transport's setup lock.
struct OfiAddr final : AddrImpl {
    OfiAddr(OfiTransport* t, std::string s);
    ~OfiAddr() override;
    OfiAddr(const OfiAddr&) = delete;
    OfiAddr& operator=(const OfiAddr&) = delete;

    std::string str;  ///< canonical "ofi+tcp://127.0.0.1:5000", "ofi+shm://name"
    std::string raw;  ///< provider address of its context 0's endpoint (what fi_av_insert takes)
    int pid = 0;      ///< shm: the owner's pid (from the name), 0 if unknown
    std::atomic<uint64_t> instance{0};  ///< the peer's endpoint instance, once heard from
    std::atomic<bool> dead{false};      ///< declared dead: every op on it fails (disconnected)
    /// A link with it came up (LinkEvent::connected or accepted counted, OfiTransport::link_up):
    /// its death counts as LinkEvent::lost, else as connect_failed.
    std::atomic<bool> linked{false};
    /// Options::auth: it proved the secret to us (its messages are delivered); our side of
    /// the handshake (AuthState). What follows is under OfiTransport::auth_mu_.
    std::atomic<bool> proved{false};
    std::atomic<AuthState> auth{AuthState::none};
    std::array<std::byte, kAuthNonceSize> auth_nonce{};  ///< ours, in our request
    /// The session's tokens (Options::auth): what our messages to it carry, and what its
    /// messages to us must carry (the latest two sessions': two handshakes may cross).
    std::atomic<uint64_t> send_token{0};
    std::atomic<uint64_t> recv_token{0};
    std::atomic<uint64_t> recv_token_prev{0};
    TimePoint auth_since{};    ///< when we asked, or were refused
    std::string auth_refusal;  ///< why it refused us
    /// Bytes of its unexpected messages queued for receives on any of our contexts
    /// (QueuedMsg::charge; kMaxQueuedUnexpectedPerPeer).
    std::atomic<std::size_t> unexpected_bytes{0};
    std::vector<std::string> aliases;  ///< other lookup strings interned for it
    bool raw_alias = false;            ///< interned under "\x01" + raw
    /// Why it could not be reached or was declared dead (Transport::peer_failure), under
    /// failure_mu: written on those failures, read for error messages; never on a fast path.
    std::mutex failure_mu;
    std::string failure;

  private:
    OfiTransport* owner_;
};

/// The peer process behind an address of this transport (canonical or an alias).
inline OfiAddr* ofi_addr(const Addr& a) noexcept {
    return static_cast<OfiAddr*>(a.impl()->canonical());
}

/// One endpoint of a peer (the lane of one of its contexts) as one lane of ours sees it: its
/// entry in our lane's address vector and what our lane knows of it. Under our lane's lock.
struct Remote : ListHook<WatchTag> {
    std::string raw;                  ///< its provider address
    Addr peer;                        ///< the process it belongs to
    fi_addr_t fi = FI_ADDR_NOTAVAIL;  ///< its entry in our lane's AV (once inserted)
    int pid = 0;                      ///< shm: the owner's pid (from the name)
    uint32_t pending = 0;             ///< our ops in flight on it (watched while nonzero)
    bool probing = false;             ///< a probe is in flight
    /// Probe it at the next look however recently it spoke (check_stuck_rma_locked).
    bool probe_now = false;
    uint8_t probe_breaks = 0;  ///< probes in a row that met a broken connection
    /// Its connection broke under ops of ours (kResends): they go again one at a time, so that
    /// one the target refuses fails alone; cleared once nothing of ours waits or is posted.
    bool solo = false;
    uint32_t in_provider = 0;   ///< our ops on it that the provider holds
    bool connected = false;     ///< a send to it completed (so injects may be used)
    uint32_t deferred = 0;      ///< its ops on the deferred list (later sends queue behind)
    uint64_t stalled_pass = 0;  ///< the retry pass in which the provider refused it
    TimePoint heard{};          ///< last message or successful probe from it
    TimePoint probe_sent{};
    TimePoint refused_since{};      ///< first -FI_EAGAIN of a probe not yet posted (or epoch)
    TimePoint listen_checked_at{};  ///< last listener_gone_locked look (rate limit)
    /// The socket of our own connect to it, in progress (connect_refused_locked), or -1.
    int connect_probe = -1;
    /// A connect probe was made in this spell of refusals (reset with refused_since).
    bool connect_probed = false;

    Remote() = default;
    Remote(const Remote&) = delete;
    Remote& operator=(const Remote&) = delete;
    ~Remote() { close_connect_probe(); }
    void close_connect_probe() noexcept {
        if (connect_probe >= 0) ::close(connect_probe);
        connect_probe = -1;
    }
};

/// Where our lane sends one kind of message (unexpected or expected) for one context of one
/// peer: the peer's endpoint that serves it, or, while that is not known (a locate is in
/// flight), the sends waiting, in order.
struct Route {
    Addr peer;
    uint8_t ctx = 0;
    bool unexpected = true;
    Remote* rem = nullptr;
    IntrusiveList<struct OfiOp> waiting;
    uint32_t token = 0;     ///< the locate in flight (its answer echoes it)
    TimePoint since{};      ///< when that locate was sent
    int tries = 0;          ///< locates sent
    bool locating = false;  ///< a locate is due or in flight (counted in OfiLane::locating)
    /// Options::auth: its sends wait for the handshake with its peer (counted in locating).
    bool authing = false;
};
using RouteKey = std::tuple<const OfiAddr*, uint8_t, bool>;

/// A process our lane receives from: its address as this lane keeps it (an alias, so lanes
/// do not share one reference count), keyed by its raw address.
struct Source {
    Addr addr;  ///< alias of the canonical address
    uint64_t instance = 0;
    TimePoint heard{};  ///< last message from it (read when probing its endpoints)
    /// Its contexts whose routes this lane learned from their headers (expected; unexpected).
    std::bitset<256> learned[2];
};

/// Hash of the string-keyed maps of a lane (lookups by string_view, no allocation).
struct RawHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
        return std::hash<std::string_view>{}(s);
    }
};
template <class V>
using RawMap = std::unordered_map<std::string, V, RawHash, std::equal_to<>>;

/// A registration (local) or a deserialized peer's handle (remote).
struct OfiMem final : MemImpl {
    OfiMem(OfiTransport* t, uint64_t base, uint64_t length, Access access, bool local);
    ~OfiMem() override;
    OfiTransport* owner_transport;
    fid_mr* mr = nullptr;  ///< local
    void* desc = nullptr;  ///< local: fi_mr_desc
    uint64_t key = 0;
    bool virt = false;  ///< remote: RMA addresses are virtual (FI_MR_VIRT_ADDR at the owner)
    std::string owner;  ///< remote: owner's address string
    Addr owner_addr;    ///< remote: interned owner
};

/// A registered slab of message buffers of one size class; MsgBuffer::priv points here.
struct Slab {
    static constexpr uint32_t kMagic = 0x0f1ab5u;
    uint32_t magic = kMagic;
    OfiTransport* owner = nullptr;
    uint8_t size_class = 0;
    fid_mr* mr = nullptr;
    void* desc = nullptr;
    std::unique_ptr<std::byte[]> mem;
};

enum class OpState : uint8_t {
    idle,
    recv_posted,  ///< on a posted-receive list (software matching), cancelable
    routing,      ///< a send waiting for its route (a locate in flight), cancelable
    deferred,     ///< a send or put/get the provider refused for now (-FI_EAGAIN): retried by
                  ///< progress, in order per remote endpoint; cancelable
    in_provider,  ///< posted to libfabric: completes through the CQ
};

/// A user operation. Its Op hook links it on a posted-receive list, a route's waiting list or
/// the deferred list.
struct OfiOp : Op, FiCtx {
    OpState state = OpState::idle;
    std::byte* buf = nullptr;      ///< recv: destination; send: header + payload; put/get: local
    std::size_t cap = 0;           ///< recv: capacity; send: bytes; put/get: length
    void* desc = nullptr;          ///< send, put/get: local descriptor
    uint64_t raddr = 0;            ///< put/get: remote address (or offset) of byte 0
    uint64_t rkey = 0;             ///< put/get: remote key
    std::size_t posted_bytes = 0;  ///< put/get: bytes of fragments already posted
    Addr peer;               ///< send/put/get: destination; recv_expected: source (the Matcher's)
    Remote* rem = nullptr;   ///< send/put/get: the endpoint; recv_expected: the peer's context 0
    Route* route = nullptr;  ///< routing: the route it waits for
    Tag match_tag = 0;
    uint32_t fragments = 0;  ///< put/get: fragments still in the provider
    Errc first_error = Errc::ok;
    std::byte* bounce = nullptr;  ///< send of a foreign buffer: our copy (freed on completion)
    bool counted = false;         ///< counted in rem->pending
    bool cancel_asked = false;    ///< cancel() called fi_cancel on it
    /// put/get: a fragment failed with its connection; the whole op is posted again once the
    /// rest are back (kResends).
    bool resend = false;
    bool solo_post = false;  ///< posted alone (Remote::solo): its failure is its own
    uint8_t resends = 0;     ///< times posted again after its connection broke
    bool pressed = false;    ///< counted as LinkEvent::backpressure in this wait to be posted
    TimePoint retry_at{};    ///< deferred after a broken connection: not posted before
    /// shm put/get: when it went to the provider (check_stuck_rma_locked).
    TimePoint rma_posted{};
    /// Failed while the provider still names it (rma_dropped_locked: its caller was answered
    /// through another op): kept out of the pool until a completion for it comes, if ever.
    bool orphaned = false;
};

/// A receive buffer posted to the provider (multi-recv, or one message each).
struct RxBuf : FiCtx {
    std::byte* data = nullptr;
    std::size_t size = 0;
    bool posted = false;
};

/// An internal message in flight (a probe, a locate or its answer): a registered buffer of
/// its own; outlives a peer declared dead while the provider holds it.
struct Ctl : FiCtx {
    MsgBuffer buf;          ///< a message buffer (registered; header room in front)
    Addr peer;              ///< probes: the peer probed
    Remote* rem = nullptr;  ///< probes: the endpoint probed
    bool probe = false;
    bool in_use = false;
};

/// A peer found dead where failing it at once could pull lists or routes out from under the
/// caller (inside a walk of them): failed at the next safe point (flush_deaths_locked).
struct PendingDeath {
    Addr peer;
    Errc status = Errc::disconnected;
    std::string why;
};

/// An internal message the provider refused for now (-FI_EAGAIN), sent again from progress.
struct CtlRetry {
    Ctl* ctl = nullptr;
    Remote* to = nullptr;
    std::size_t total = 0;
};

/// One context's progress domain: its endpoint, completion queue and address vector, and
/// everything its progress and posts touch, under its own lock. Lane 0 is made with the
/// transport (its endpoint's address is the transport's address); the others with their
/// contexts. A lane outlives its context (a context made again with its id reuses it, so its
/// address stays what peers learned) and goes with the transport.
class OfiLane {
  public:
    OfiLane(OfiTransport* t, uint8_t id, const Options& o);
    OfiTransport* const t;
    const uint8_t id;
    MaybeMutex mu;  ///< guards everything below and every call on ep, cq and av
    OpPool<OfiOp> ops;
    fid_ep* ep = nullptr;
    /// rxm-based providers: the endpoint put/get go out on, so they never share a connection
    /// with messages. The tcp provider closes a connection whose target refuses a put/get,
    /// discarding what followed it there: a message already reported sent would be lost,
    /// while a put/get behind it fails and goes again (kResends). Posts no receives. Null elsewhere
    /// (put/get go out on `ep`). Its CQ, `rma_cq`, is read only while put/get are in the provider
    /// (`rma_inflight`) or after fi_trywait found something on it (`rma_poke`): a lane that only
    /// sends messages pays nothing for it. Same AV as `ep`.
    fid_ep* rma_ep = nullptr;
    fid_cq* rma_cq = nullptr;
    int rma_cq_fd = -1;
    uint32_t rma_inflight = 0;
    bool rma_poke = false;
    uint32_t rma_skip = 0;  ///< passes while put/get are in flight (`cq` read every 4th)
    bool cq_busy = false;   ///< the last read of `cq` found something
    fid_cq* cq = nullptr;
    fid_av* av = nullptr;
    int cq_fd = -1;        ///< the CQ's wait fd, or -1
    int timer_fd = -1;     ///< one-shot timer: poll-sleep without a wait fd, and peer probing
    int pfd = -1;          ///< epoll over cq_fd, rma_cq_fd and timer_fd (in the context's wait set)
    std::string raw;       ///< our endpoint's provider address (immutable once made)
    std::string shm_name;  ///< shm: our region name (its /dev/shm file)
    std::byte header[kHeaderRoom]{};  ///< header template (kind/ctx/tag/flags patched per send)
    std::size_t header_size = 0;
    const Context* ctx = nullptr;  ///< the attached context
    /// Its context exists (`attached`), and takes unexpected messages (`serves`): read by
    /// other lanes' progress, to answer a locate.
    std::atomic<bool> attached{false};
    std::atomic<bool> serves{false};

    std::vector<std::unique_ptr<RxBuf>> rx;
    std::unique_ptr<std::byte[]> rx_mem;
    fid_mr* rx_mr = nullptr;
    void* rx_desc = nullptr;
    std::vector<std::unique_ptr<Ctl>> ctls;
    std::vector<CtlRetry> ctl_retry;   ///< answers refused with -FI_EAGAIN, sent again
    std::vector<PendingDeath> deaths;  ///< peers to fail at the next safe point
    bool polling = false;              ///< inside poll_cq_locked (no nested poll)
    /// Without a wait fd: when the CQ last gave a completion (or an op was posted), and the
    /// next poll-sleep slice.
    TimePoint last_completion{};
    Duration poll_slice = kPollSliceMin;

    /// Posted receives and early messages of this lane's context. An unexpected message
    /// naming a context this lane does not serve (the peer's route led here: its own context
    /// takes none) goes to this lane's context, still naming the one it was sent to.
    Matcher<OfiOp, QueuedMsg, &OfiOp::peer> match;
    IntrusiveList<OfiOp> deferred;
    IntrusiveList<OfiOp> inflight;  ///< ops the provider holds (released at teardown)
    /// Ops failed while the provider still names them (OfiOp::orphaned): back to the pool
    /// when a completion for one comes, or at teardown once the endpoints are closed.
    std::vector<OfiOp*> orphans;
    uint64_t pass = 0;
    uint32_t guard_passes = 0;  ///< progress calls, for the guard's look at the clock
    /// Wakes of progress that brought nothing, since `wakes_since` (guard_spinning_locked).
    uint32_t wakes = 0;
    TimePoint wakes_since{};
    bool spinning = false;
    TimePoint resend_due = TimePoint::max();  ///< earliest retry_at on the deferred list
    uint64_t rx_buffer_messages = 0;
    IntrusiveList<Remote, WatchTag> watched;
    TimePoint next_check{};
    RawMap<std::unique_ptr<Remote>> remotes;  ///< by raw address
    std::map<RouteKey, Route> routes;
    std::size_t locating = 0;  ///< routes waiting for a locate answer
    uint32_t next_token = 0;
    uint64_t token_salt = 0;   ///< random, never sent: locate tokens are not guessable
    RawMap<Source> sources;    ///< by the peer's raw address
    uint64_t deaths_seen = 0;  ///< OfiTransport::deaths_ when this lane last looked
    Route* last_route = nullptr;
    Source* last_source = nullptr;
    std::string last_source_raw;
};

class OfiContext final : public Context {
  public:
    OfiContext(OfiTransport* t, uint8_t id, bool thread_safe, OfiLane* lane);
    ~OfiContext() override;
    [[nodiscard]] int block_fd() const noexcept { return block_epfd_; }
    [[nodiscard]] OfiLane& lane() const noexcept { return *lane_; }
    bool attached = false;

  private:
    OfiTransport* ot_;
    OfiLane* lane_;
    int block_epfd_ = -1;  ///< epoll over its lane's fd and this context's eventfd
};

/// What the provider offers, read from its fi_info.
struct ProviderInfo {
    std::string prov_name;  ///< "tcp;ofi_rxm", "shm", "verbs;ofi_rxm"
    bool shm = false;       ///< prov_name is "shm" (read per put/get: no string compare)
    std::string fabric;
    std::string domain;
    uint32_t addr_format = 0;
    uint64_t mr_mode = 0;
    std::size_t inject_size = 0;
    std::size_t max_msg_size = 0;
    bool multi_recv = false;
    bool wait_fd = false;
    /// A peer's address is a TCP socket it listens on (tcp;ofi_rxm), so no listener on a
    /// loopback peer's port proves its process gone (listener_gone_locked). Not verbs: its
    /// socket addresses name rdma_cm listeners, not TCP ones.
    bool tcp_listener = false;
};

class OfiTransport final : public Transport {
  public:
    OfiTransport(const Options& o, std::string scheme);
    ~OfiTransport() override;
    Result<void> init(std::string_view sub, std::string_view rest);

    std::string_view name() const noexcept override { return scheme_; }
    PeerIdentity peer_identity(const Addr& a) override;
    using Transport::context_create;
    Result<std::unique_ptr<Context>> context_create(uint8_t id,
                                                    const ContextOptions& opts) override;

    Result<Addr> addr_lookup(std::string_view address) override;
    Addr addr_self() override { return self_; }
    Addr addr_alias(const Addr& a) override;
    [[nodiscard]] std::size_t live_addrs() const noexcept { return addrs_.live(); }
    std::string addr_to_string(const Addr& a) override;
    std::string peer_failure(const Addr& a) override;
    std::size_t addr_serialize_size(const Addr& a) override;
    Result<std::size_t> addr_serialize(const Addr& a, std::span<std::byte> out) override;
    Result<Addr> addr_deserialize(std::span<const std::byte> in) override;

    std::size_t max_unexpected_size() const noexcept override { return kMaxMessageSize; }
    std::size_t max_expected_size() const noexcept override { return kMaxMessageSize; }
    Result<MsgBuffer> msg_buf_alloc(std::size_t size) override;
    void msg_buf_free(MsgBuffer& buf) noexcept override;

    Result<OpId> post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                      std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                      Tag tag) override;
    Result<OpId> post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) override;
    Result<OpId> post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                    std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                    Tag tag) override;
    Result<OpId> post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf, const Addr& source,
                                    Tag tag) override;

    Result<MemHandle> mem_register(void* buf, std::size_t len, Access access) override;
    std::size_t mem_serialize_size(const MemHandle& h) override;
    Result<std::size_t> mem_serialize(const MemHandle& h, std::span<std::byte> out) override;
    Result<MemHandle> mem_deserialize(std::span<const std::byte> in) override;

    Result<OpId> post_put(Context& ctx, Callback cb, const MemHandle& local, std::size_t local_off,
                          const MemHandle& remote, std::size_t remote_off, std::size_t len,
                          const Addr& remote_addr) override;
    Result<OpId> post_get(Context& ctx, Callback cb, const MemHandle& local, std::size_t local_off,
                          const MemHandle& remote, std::size_t remote_off, std::size_t len,
                          const Addr& remote_addr) override;

    Result<void> cancel(OpId id) override;
    Result<void> progress(Context& ctx, TimePoint deadline) override;
    /// An eventfd nobody writes: a context's messages wake its lane's fd, in the context's
    /// wait_fd(). Block on Context::wait_fd() after Context::try_wait().
    int progress_fd() const noexcept override { return pfd_; }
    bool try_wait() override { return false; }
    bool try_wait_for(Context& ctx) override;
    /// Without a wait fd: false while the lane had a completion within kPollSpin (poll on),
    /// else arms the lane timer for one poll-sleep slice and returns true. Under l.mu.
    bool poll_sleep_armed(OfiLane& l);

    [[nodiscard]] const ProviderInfo& provider() const noexcept { return prov_; }
    /// Peer endpoints currently watched (with operations pending on them), over all lanes;
    /// for tests.
    [[nodiscard]] std::size_t watched_peers();
    /// Messages taken from our receive buffers and matched in software, over all lanes; for
    /// tests.
    [[nodiscard]] uint64_t rx_buffer_messages();

    // --- used by OfiContext / OfiMem / OfiAddr ------------------------------------------------
    void context_destroyed(OfiContext* c) noexcept;
    void mem_unregister(OfiMem* m) noexcept;
    /// A put (`is_put`) or get of `len` bytes between `mine` and the region `rm` names at
    /// `remote_off`, when `rm` is this transport's own memory: copied here after the checks a
    /// target's provider makes (a live registration of the key, its access, the range; `why`
    /// says which failed). Through the provider it would wait for the target endpoint's
    /// progress, which a handler blocking on the transfer holds: it never completed.
    Errc serve_self_rma(bool is_put, std::byte* mine, const OfiMem& rm, std::size_t remote_off,
                        std::size_t len, std::string& why);

  private:
    friend struct OfiAddr;
    friend class OfiLane;

    [[nodiscard]] OfiLane* lane_at(uint8_t id) const noexcept {
        return lane_ptr_[id].load(std::memory_order_acquire);
    }
    static OfiLane& lane_of(Context& ctx) noexcept { return static_cast<OfiContext&>(ctx).lane(); }

    // setup (ofi_setup.cpp)
    Result<void> open_provider(std::string_view sub, std::string_view rest);
    Result<OfiLane*> lane_create_locked(uint8_t id);
    Result<void> lane_open(OfiLane& l);
    void lane_close(OfiLane& l) noexcept;
    Result<void> post_rx_buffers(OfiLane& l);
    Result<Addr> lookup_locked(std::string_view address, bool from_wire);
    Addr intern_locked(const std::string& canonical, std::string raw);
    /// The canonical address string of a raw provider address (empty if not representable).
    std::string canonical_of(std::span<const std::byte> raw) const;
    /// The socket address in a raw provider address (FI_SOCKADDR_IN / _IN6 providers): family
    /// and length checked, port nonzero; nullopt for other formats or bad bytes.
    std::optional<SockAddr> sock_addr_of(std::span<const std::byte> raw) const;
    /// The raw provider address of a canonical string's part after "scheme://".
    Result<std::string> raw_of(std::string_view rest, bool from_wire) const;
    /// shm: the peer endpoint with this raw address closed or died (its region is gone).
    bool shm_peer_gone(std::string_view raw) const;
    Result<Slab*> slab_grow(uint8_t size_class);
    /// A maximal registered slot for a copy of a foreign buffer, and its descriptor.
    std::byte* bounce_alloc(void** desc) noexcept;
    void bounce_free(std::byte* p) noexcept;
    uint64_t next_key_locked() noexcept;
    void close_all() noexcept;

    // data path (ofi_io.cpp), each on one lane under its lock
    Result<OpId> post_send(Context& ctx, Callback cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, bool expected);
    Result<OpId> fail_async(OfiLane& l, Context& ctx, Callback&& cb, OpType type, Errc status,
                            const std::string& why);
    /// An op completed at once with `status` and `size` bytes moved (fail_async, a put/get
    /// served by serve_self_rma).
    Result<OpId> complete_now(OfiLane& l, Context& ctx, Callback&& cb, OpType type, Errc status,
                              std::size_t size);
    Result<OpId> post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                          std::size_t local_off, const MemHandle& remote, std::size_t remote_off,
                          std::size_t len, const Addr& remote_addr);
    /// Post with retries on -FI_EAGAIN (progressing the CQ in between); the libfabric result.
    template <class F>
    ssize_t post_retry_locked(OfiLane& l, F&& f);
    /// Our lane's view of the peer endpoint at `raw` (made on first use), owned by `peer`.
    Remote* remote_locked(OfiLane& l, std::string_view raw, const Addr& peer);
    Result<void> av_insert_locked(OfiLane& l, Remote* r);
    /// The route of (peer, context, kind): made on first use; a locate goes out when the
    /// endpoint is not known yet.
    Route* route_locked(OfiLane& l, const Addr& peer, uint8_t ctx, bool unexpected);
    void send_locate_locked(OfiLane& l, Route& r, TimePoint now);
    void route_found_locked(OfiLane& l, Route& r, Remote* rem);
    void route_failed_locked(OfiLane& l, Route& r, Errc status, const std::string& why);
    void check_locates_locked(OfiLane& l, TimePoint now);
    /// Start a send whose endpoint is known (routing done).
    void start_send_locked(OfiLane& l, OfiOp* op);
    Ctl* ctl_alloc_locked(OfiLane& l);
    /// Send an internal message (its header written at ctl->buf.data() - header bytes).
    ssize_t ctl_send_locked(OfiLane& l, Ctl* c, std::size_t total, Remote* to);
    void answer_locate_locked(OfiLane& l, Remote* to, uint32_t token,
                              std::span<const std::byte> payload);
    void on_located_locked(OfiLane& l, const Addr& peer, uint32_t token,
                           std::span<const std::byte> payload);
    void poll_cq_locked(OfiLane& l);
    /// Reads `cq`; true when it held something.
    bool poll_one_cq_locked(OfiLane& l, fid_cq* cq);
    /// fi_trywait over the lane's CQs (rma_cq too, which is then read once).
    bool trywait_locked(OfiLane& l);
    /// Post (the rest of) a send or put/get: 0 when all of it is in the provider.
    ssize_t try_post_locked(OfiLane& l, OfiOp* op);
    void defer_locked(OfiLane& l, OfiOp* op);
    void to_provider_locked(OfiLane& l, OfiOp* op);
    void retry_deferred_locked(OfiLane& l);
    /// `op` leaves the provider (off the inflight list, uncounted on its Remote).
    void from_provider_locked(OfiLane& l, OfiOp* op);
    /// `op` failed with its connection (the peer may be fine: rxm connects again on the next
    /// post). True when it was put back on the deferred list to be posted again (kResends).
    bool resend_locked(OfiLane& l, OfiOp* op);
    /// A put/get fragment came back: once none is left, the op finishes or is posted again.
    void rma_fragment_done_locked(OfiLane& l, OfiOp* op);
    void on_completion(OfiLane& l, const fi_cq_tagged_entry& e);
    void on_error(OfiLane& l, fid_cq* cq, const fi_cq_err_entry& e);
    void on_rx(OfiLane& l, RxBuf* rb, const fi_cq_tagged_entry& e);
    void repost_rx(OfiLane& l, RxBuf* rb);
    void on_message(OfiLane& l, std::span<const std::byte> msg);
    /// The sender of a received header, as this lane keeps it; empty (and logged) when the
    /// header names no endpoint of this transport. With Options::auth, also empty for a sender
    /// that has not proved the secret, unless `admit` (it just did).
    Source* source_locked(OfiLane& l, const MsgHeader& h, bool admit = false);
    // authentication (ofi_auth.cpp; Options::auth)
    /// Sends to `a` may not go yet (its handshake is not done, or it refused us): `op` waits on
    /// `route`, or fails at once when `a` refused us. True if the op was taken.
    bool auth_hold_locked(OfiLane& l, OfiAddr* a, Route& route, OfiOp* op);
    /// Begin our handshake with `a` from lane `l` unless one is under way.
    void dial_locked(OfiLane& l, OfiAddr* a, TimePoint now);
    /// Routes waiting for a handshake: go on, fail, or time out.
    void check_auth_locked(OfiLane& l, TimePoint now);
    void on_auth_locked(OfiLane& l, const MsgHeader& h, std::span<const std::byte> payload);
    /// An unauthenticated sender's message arrived: drop it, and tell the sender why (both
    /// rate-limited).
    void refuse_stranger_locked(OfiLane& l, const MsgHeader& h);
    /// The process at `raw` to answer an auth message (found, or interned without taking the
    /// header's instance: that waits until it proves the secret); empty if not ours.
    Addr auth_peer_locked(std::span<const std::byte> raw);
    /// Post control message `c` (`total` bytes with the header) to `to`; while rxm is still
    /// connecting (-FI_EAGAIN) it is sent again from progress (kMaxCtlRetry at most), other
    /// failures free it and are logged naming `what`.
    void send_ctl_or_retry_locked(OfiLane& l, Ctl* c, std::size_t total, Remote* to,
                                  std::string_view what);
    /// Send one auth message of `step` to `to` (its lane endpoint).
    void send_auth_locked(OfiLane& l, Remote* to, AuthStep step, std::span<const std::byte> body);
    void send_refusal_locked(OfiLane& l, Remote* to, std::string_view why);
    /// The remote endpoint `lraw` of `who`, to answer an auth message or a stranger's message:
    /// null (logged, rate-limited) when it is new and the lane holds kMaxStrangerRemotes.
    Remote* stranger_remote_locked(OfiLane& l, std::string_view lraw, const Addr& who);
    /// Whether a stranger's refusal (or silence) is logged now: one line a second, which then
    /// counts in `unlogged` those kept out since.
    bool stranger_log_due(std::size_t* unlogged);
    /// Write the session token of `to` into a header copied from the lane's template.
    void stamp_token(std::byte* start, const OfiAddr* to) const noexcept {
        if (opts_.auth.enabled())
            detail::store_le(start + kMsgFixedSize, to->send_token.load(std::memory_order_acquire),
                             int(kTokenSize));
    }
    /// A message of `src` carries a token of its session with us.
    [[nodiscard]] static bool token_ok(const OfiAddr* src, uint64_t token) noexcept {
        return token != 0 && (token == src->recv_token.load(std::memory_order_acquire) ||
                              token == src->recv_token_prev.load(std::memory_order_acquire));
    }
    /// A nonce bound to the two ends of a handshake (their transport addresses and instances),
    /// so that a proof made for one pair of processes proves nothing between another pair.
    auth::Proof bind(std::span<const std::byte> nonce, std::span<const std::byte> raw_c,
                     uint64_t inst_c, std::span<const std::byte> raw_a, uint64_t inst_a) const;
    /// Both sides' tokens once the handshake is done (to the acceptor, to the connector).
    std::pair<uint64_t, uint64_t> tokens(const auth::Proof& bound_c,
                                         const auth::Proof& bound_a) const;
    /// The live process interned under raw address `raw` (or none); its instance becomes
    /// `instance` if it had none yet (0: leave it).
    Addr find_raw(std::string_view raw, uint64_t instance);
    void op_finished(OfiLane& l, OfiOp* op, Errc status);
    /// A link with `a` came up: LinkEvent::connected (our locate was answered, or our
    /// handshake finished) or accepted (we answered its locate, or admitted it); counted once
    /// per peer process (OfiAddr::linked), never for ourselves or a peer declared dead.
    void link_up(OfiAddr* a, LinkEvent e) noexcept {
        if (a != self_.impl() && !a->dead.load(std::memory_order_relaxed) &&
            !a->linked.exchange(true, std::memory_order_relaxed))
            note(e);
    }
    /// The provider refused to take `op` for now (-FI_EAGAIN): LinkEvent::backpressure, once
    /// per wait (until it is in the provider).
    void count_pressure(OfiOp* op) noexcept {
        if (!op->pressed) note(LinkEvent::backpressure);
        op->pressed = true;
    }
    void complete_recv(OfiLane& l, OfiOp* op, const Addr& source, uint8_t ctx_id, Tag tag,
                       std::size_t size, Errc status);
    void watch_inc(OfiLane& l, Remote* r);
    void watch_dec(OfiLane& l, Remote* r);
    void check_peers_locked(OfiLane& l, TimePoint now);
    /// Listener guard (ofi_guard.cpp): count a wake of `l`'s progress that brought nothing;
    /// true while they come faster than kSpinWakes per kSpinWindow (the lane spins).
    bool guard_spinning_locked(OfiLane& l, TimePoint now) noexcept;
    /// At the descriptor limit, refuse what waits on our listeners (at most every 250 ms,
    /// any lane).
    void guard(TimePoint now);
    /// Under guard_mu_: learn the ports our lanes listen on; reset the connections the provider
    /// accepted that stayed silent for hello_timeout (every hello_timeout / 2 at most).
    void guard_ports_locked();
    void guard_idle_locked(TimePoint now);
    void guard_open();
    void guard_close() noexcept;
    /// shm: libfabric 1.17's shm drops a put/get whose memory key its target does not hold
    /// (deregistered, or edited) without answering it, and from then on refuses to send to
    /// that target (-FI_EAGAIN). A put/get it has held past rma_stuck_after gets its target
    /// probed now, which such refusals declare dead within kProbeTimeout; one held past the
    /// bound whose target is dead fails (rma_dropped_locked): nothing will answer it.
    void check_stuck_rma_locked(OfiLane& l, TimePoint now);
    /// Fail shm put/get `op`, which the provider will never complete, with `status`, saying
    /// `why` (a warning, at most one a second).
    void rma_dropped_locked(OfiLane& l, OfiOp* op, Errc status, std::string_view why);
    /// Take `op` off the provider's books and its peer's counts, completing nothing (the
    /// first half of op_finished).
    void op_finished_quietly_locked(OfiLane& l, OfiOp* op);
    /// A completion came for an orphaned op (rma_dropped_locked): back to its pool.
    void release_orphan(OfiLane& l, OfiOp* op) noexcept;
    void send_probe_locked(OfiLane& l, Remote* r, TimePoint now);
    /// Is a loopback peer endpoint's listening socket gone? True when /proc/net/tcp{,6} of
    /// this network namespace shows nothing listening on its port: the process that listened
    /// there is gone. Nothing is sent to the peer (a TCP connect to a live rxm listener leaks
    /// memory inside libfabric 1.17 when it carries no handshake). False for remote peers
    /// (connect_refused_locked and the probes' kProbeTimeout decide), other providers, or when
    /// /proc cannot tell; at most one look per endpoint per kProbeAfterSilence.
    bool listener_gone_locked(Remote* r, TimePoint now);
    /// Remote peers (not loopback) of the tcp provider only, once the provider has refused to
    /// send to `r` for kConnectProbeAfter: a TCP connect of our own to its address, made once
    /// per spell of refusals and looked at (never waited for) on each call. The words of the
    /// failure when it was refused, or found no host or network; nullopt otherwise (not due,
    /// in progress, connected: the peer listens, the provider is only slow).
    std::optional<std::string> connect_refused_locked(Remote* r, TimePoint now);
    /// Peer `a` is dead: marked for every lane (each fails its own ops on it when it next
    /// looks, see sweep_dead_locked); this lane's ops on it fail now.
    void peer_failed_locked(OfiLane& l, OfiAddr* a, Errc status, const std::string& why);
    /// Fail this lane's ops on peers another lane declared dead, and forget their routes.
    void sweep_dead_locked(OfiLane& l);
    void fail_peer_ops_locked(OfiLane& l, OfiAddr* a, Errc status);
    void defer_death_locked(OfiLane& l, OfiAddr* a, Errc status, std::string why);
    void flush_deaths_locked(OfiLane& l);
    void retry_ctls_locked(OfiLane& l);
    /// shm peers in this very process: false (and the peer declared dead) once that endpoint
    /// closed. shm 1.17 reaches an in-process peer's region through that endpoint's own
    /// mapping, so a send after it closed would touch unmapped memory.
    bool shm_local_peer_ok_locked(OfiLane& l, Remote* r);

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;
    Options opts_;
    std::string scheme_;  ///< "ofi+tcp"
    ProviderInfo prov_;
    MaybeMutex setup_mu_;   ///< lanes' creation (then a lane's lock; never the other way)
    MaybeMutex intern_mu_;  ///< interning (a lane may take it under its lock; takes none)
    MaybeMutex reg_mu_;     ///< registration keys and slab growth (leaf)
    /// Live registrations by key (under reg_mu_): a put/get to this transport's own address is
    /// served from them by serve_self_rma().
    std::unordered_map<uint64_t, OfiMem*> regs_;

    fi_info* info_ = nullptr;
    fid_fabric* fabric_ = nullptr;
    fid_domain* domain_ = nullptr;
    int pfd_ = -1;  ///< progress_fd(): an eventfd nobody writes

    uint64_t instance_ = 0;
    Addr self_;
    /// Options::auth: the handshakes' state on OfiAddr, and challenges waiting for their
    /// response (a leaf lock, taken under a lane's).
    std::mutex auth_mu_;
    std::vector<AuthPending> auth_pending_;
    log::Limiter strangers_log_;    ///< refusals of strangers, one line a second
    log::Limiter rma_dropped_log_;  ///< rma_dropped_locked, one line a second
    // The listener guard (ofi_guard.cpp): tcp providers only (`guarding_`, set at open).
    bool guarding_ = false;
    std::mutex guard_mu_;  ///< over the four below; try_lock (a lane that finds it taken goes on)
    std::vector<uint16_t> guard_ports_;  ///< the ports our lanes' endpoints listen on
    int guard_spare_ = -1;               ///< a descriptor to give up for one accept
    TimePoint guard_next_{};             ///< not before
    TimePoint guard_idle_next_{};        ///< guard_idle_locked: not before
    /// The same, read by progress without the lock (steady-clock ticks).
    std::atomic<TimePoint::rep> guard_due_{0};
    log::Limiter guard_log_;
    std::string shm_base_;  ///< shm: our region names' stem (lane k adds ".k" for k > 0)
    const pid_t self_pid_ = ::getpid();  ///< read once: getpid() is a system call per send
    std::string raw_prefix_;  ///< FI_ADDR_STR providers: "fi_shm://" (from lane 0's address)
    uint64_t next_key_ = 1;   ///< requested keys, without FI_MR_PROV_KEY (under setup_mu_)
    std::atomic<uint64_t> deaths_{0};  ///< peers declared dead so far (lanes sweep on change)

    std::vector<std::unique_ptr<OfiLane>> lanes_;        ///< under setup_mu_
    std::unique_ptr<std::atomic<OfiLane*>[]> lane_ptr_;  ///< by id, published once made

    // Message buffers. Providers without FI_MR_LOCAL (tcp;ofi_rxm, shm): the heap, each with
    // kHeaderRoom in front, tagged with heap_slab_ (no registration, no descriptor, no lock
    // the contexts share). With FI_MR_LOCAL: per size class a free list of slots of registered
    // slabs (each kHeaderRoom + class size), also the bounce slots of foreign buffers.
    Slab heap_slab_;        ///< MsgBuffer::priv of heap buffers (mr and desc null)
    MaybeSpinLock buf_mu_;  ///< leaf lock: free lists (msg_buf_alloc/free from any thread)
    std::vector<std::unique_ptr<Slab>> slabs_;
    std::vector<std::byte*> free_slots_[2];
};

/// The pid in an shm endpoint name ("[fi_shm://]<prefix>-<pid>-<instance>[.<lane>]"), or 0.
int shm_pid_of(std::string_view raw) noexcept;

/// libfabric 1.17's shm address vector capacity (SMR_MAX_PEERS).
inline constexpr std::size_t kShmMaxPeers = 256;
/// Size classes of message buffers (payload bytes; kHeaderRoom more in front of each).
inline constexpr std::size_t kSizeClass[2] = {4096, kMaxMessageSize};
/// Buffers per registered slab.
inline constexpr std::size_t kSlabSlots = 16;

/// Sends libfabric's own log messages to Talaria's log (ofi_log.cpp); called before each
/// transport first asks libfabric anything, acts once per process.
void route_ofi_log();

}  // namespace talaria::na::ofi
