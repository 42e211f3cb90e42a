// The ucx transport: UCP (UCX 1.12+) under the na interface. One UCP context per transport,
// configured from the address string without touching the process environment, and one UCP
// worker per na context (a Lane: each context is a progress domain of its own); endpoints made
// on first use (to a peer's context 0 by sockaddr through its listener or by its packed worker
// address; to its other contexts by their worker addresses, learned from hellos or asked for
// with locate); one active-message id carrying hello, unexpected and expected messages,
// matched in software per lane;
// put/get served by the target over active messages wherever UCX would only emulate them
// (ucx+tcp, ucx+all, ...: the target checks key, bounds, access and liveness, see serves_rma()),
// else with ucp_put_nbx/ucp_get_nbx on ucp_mem_map'ed regions whose packed rkeys travel in the
// serialized memory handle (NIC-checked keys on rc/dc; ucx+sm: process_vm_readv/writev, see
// init_direct_rma()). Setup
// (config, worker, listener, addresses, endpoints, registration) is in ucx_setup.cpp; the data path
// (posting, the AM handler, completions, endpoint failure, progress) in ucx_io.cpp. Wire format:
// wire.hpp and docs/protocol.md (ucx).
#pragma once

#include <ucp/api/ucp.h>

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "na/base/addr_table.hpp"
#include "na/base/auth.hpp"
#include "na/base/matcher.hpp"
#include "na/base/op.hpp"
#include "na/base/url.hpp"
#include "na/ucx/wire.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"
#include "talaria/util/log.hpp"
#include "talaria/util/spin_lock.hpp"

namespace talaria::na::ucx {

class UcxTransport;
struct Ep;
struct Lane;
struct Route;

/// How peers are named and reached: by IP address and port through a UCP listener
/// ("ucx+tcp://127.0.0.1:5000"), or by the hex of a packed UCP worker address ("ucx+sm://0a1b..").
enum class Mode : uint8_t { sockaddr, worker };

/// What an address string of this transport family means, parsed (see parse_spec()).
struct Spec {
    std::string sub;      ///< "tcp", "sm", "all", "rc", ...; also "tcp,sm" lists
    std::string tls;      ///< the UCX_TLS value for our context
    std::string devices;  ///< the UCX_NET_DEVICES value ("" = UCX's default, all)
    Mode mode = Mode::worker;
    std::string host;  ///< sockaddr mode: "host[:port]" to listen on ("" = 0.0.0.0:0)
};
/// Parse `sub` and `rest` of "ucx+<sub>://<rest>": rest = [devices "/"] [host[:port]].
/// Worker mode when there is no host, or for sub "sm" (no IP to listen on); sockaddr otherwise.
Result<Spec> parse_spec(std::string_view sub, std::string_view rest);
/// Whether a transport of this spec serves put/get itself (MsgKind::rma_*, the target checks
/// every request) and leaves UCP's RMA feature off: unless the list is "sm" alone (same host:
/// process_vm_* or UCX's copies) or made of rc* and dc* entries alone (the NIC checks remote
/// keys), docs/architecture.md "Trust model". UCX emulates put/get over active messages
/// wherever a transport lacks RDMA, and its handler writes wherever it is told.
bool serves_rma(const Spec& s);

struct InflightTag {};
struct EpTag {};

enum class OpState : uint8_t {
    idle,
    recv_posted,  ///< on a posted-receive list (software matching), cancelable
    routing,      ///< a send waiting for its route (a locate in flight), cancelable
    inflight,     ///< a UCX request is pending (send, put/flush, get)
    served,       ///< a put/get the target serves (UcxOp::xfer), cancelable
};

struct RmaXfer;

/// A user operation. Its Op hook links it on a posted-receive list or on a route's list of
/// sends waiting for the route (routing).
struct UcxOp : Op, ListHook<InflightTag> {
    OpState state = OpState::idle;
    void* req = nullptr;       ///< the pending UCX request (inflight)
    std::byte* buf = nullptr;  ///< recv: destination; send (routing): the payload
    std::size_t cap = 0;       ///< recv: capacity; send (routing): payload bytes
    Addr match_source;         ///< recv_expected
    Tag match_tag = 0;         ///< recv_expected
    Lane* lane = nullptr;      ///< the lane (context) it was posted on
    Route* route = nullptr;    ///< routing: the route it waits for
    RmaXfer* xfer = nullptr;   ///< served: its transfer
    MsgHeader hdr;             ///< send: what goes in the header (seq set when it leaves)
    alignas(8) std::byte header[kMsgHeaderSize]{};  ///< send: the AM header (UCX may keep it)
};

/// An incoming message nobody had posted a receive for yet (queued by the Matcher), or one not
/// deliverable yet (Lane::held: its sender's hello or its turn has not come).
struct UcxMsg : QueuedMsg {
    MsgKind kind = MsgKind::unexpected;  ///< held: what it is
    uint8_t source_ctx = 0;              ///< held: the sender's context
    uint32_t stream = 0;                 ///< held: the sender's endpoint (its stream)
    uint64_t instance = 0;               ///< held: the sender's instance
    uint32_t seq = 0;                    ///< held: its place in the sender's stream
};

/// Messages that cannot be delivered yet are held, at most this many per lane: from a sender
/// whose hello has not arrived, or ahead of their turn in the sender's stream (UCP may reorder
/// the messages sent while an endpoint is being wired up).
inline constexpr std::size_t kMaxHeldMsgs = 4096;
inline constexpr std::size_t kMaxHeldBytes = std::size_t{32} << 20;
/// Streams (peer endpoints sending to it) one lane keeps at most: a hello beyond is dropped.
inline constexpr std::size_t kMaxStreams = 4096;
/// A locate not answered within this is sent again; after kLocateTries, the sends waiting for
/// it fail (unreachable).
inline constexpr Duration kLocateRetry = std::chrono::seconds(1);
inline constexpr int kLocateTries = 3;
/// Bootstrap (ucx_boot.cpp): connections waiting for their request at most (the oldest goes
/// when another comes), accepted per wake-up at most, the pause after accept fails for want of
/// descriptors, and how long a request may take when na::Options::hello_timeout is 0.
inline constexpr std::size_t kMaxBootConns = 64;
inline constexpr int kBootAcceptBurst = 16;
inline constexpr Duration kBootPause = std::chrono::milliseconds(100);
inline constexpr Duration kBootDefaultTimeout = std::chrono::seconds(10);
/// Authenticated sessions (Options::auth) kept at most, in all and per peer instance (the
/// oldest goes). Only peers that proved the secret make them.
inline constexpr std::size_t kMaxSessions = 4096;
inline constexpr std::size_t kMaxSessionsPerPeer = 256;  // one per context it may bootstrap from

/// What an authenticated bootstrap leaves both sides with (Options::auth): the key that signs
/// the hellos between this process and the peer instance, named by an id both know (the first
/// 8 bytes of the server's nonce).
struct Session {
    uint64_t instance = 0;  ///< the peer's
    uint64_t id = 0;
    auth::Proof key{};
};

/// One peer process (one transport instance), interned weakly (na/base/addr_table.hpp).
/// Alive while a user Addr, an alias, an endpoint or route or stream of a lane, a pending op,
/// a queued message, a remote memory handle or self_ holds it. `str`, `key`, `sa`,
/// `worker_addr` and `anonymous` are written before the address is handed out (under the
/// setup lock) and only read after; `instance` and `dead` are atomics; the rest is under `dmu`,
/// a leaf lock taken only when a lane sets up a route, learns where a context of the peer
/// lives, or the peer dies (never per message).
struct UcxAddr final : AddrImpl {
    UcxAddr(UcxTransport* t, std::string s, std::string k, bool thread_safe);
    ~UcxAddr() override;
    UcxAddr(const UcxAddr&) = delete;
    UcxAddr& operator=(const UcxAddr&) = delete;
    std::string str;  ///< canonical "ucx+<sub>://<key>"
    std::string key;  ///< table key: "host:port", "~<instance>" or the worker address hex
    SockAddr sa;      ///< sockaddr mode
    std::vector<std::byte> worker_addr;  ///< worker mode: the packed address of its context 0
    bool anonymous = false;              ///< a client that does not listen ("~<instance>")
    std::atomic<uint64_t> instance{0};   ///< from its hello (0: not heard from yet)
    /// Its process, from its hello (ucx+sm, in our pid namespace; 0: not known): watched
    /// with process_gone, which a zombie does not fool as UCX's keepalive is fooled.
    std::atomic<uint32_t> pid{0};
    std::atomic<bool> dead{false};  ///< declared dead: its ops fail with dead_status
    /// Bytes of its unexpected messages queued for receives on any of our contexts
    /// (QueuedMsg::charge; kMaxQueuedUnexpectedPerPeer).
    std::atomic<std::size_t> unexpected_bytes{0};
    /// Why the last bootstrap to it failed (Transport::peer_failure), under failure_mu; written
    /// by bootstrap() (which holds the address const), read for error messages only.
    mutable std::mutex failure_mu;
    mutable std::string failure;

    /// Where one of its contexts is served: by its context (worker) `lane`, at `worker`, for
    /// unexpected messages or for expected ones (they differ when the context takes no
    /// unexpected messages, or does not exist).
    struct Where {
        uint8_t ctx = 0;
        bool unexpected = false;
        uint8_t lane = 0;
        std::vector<std::byte> worker;
    };
    MaybeSpinLock dmu;
    Errc dead_status = Errc::disconnected;  ///< under dmu
    std::string dead_why;                   ///< under dmu
    bool dead_by_bye = false;  ///< under dmu: it said bye (closed its transport), not failed
    std::vector<Where> dir;    ///< under dmu: learned from hellos and located
    int last_heard = -1;       ///< under dmu: the context it last said hello from

  private:
    UcxTransport* ut_;
};

/// A host admitted to UCX's own listeners (ucx_guard.cpp): an IPv4 or IPv6 address.
struct AdmittedHost {
    bool v6 = false;
    std::array<uint8_t, 16> bytes{};  ///< IPv4: the first 4
    bool operator==(const AdmittedHost&) const = default;
};

/// One of UCX's own listening sockets (its tcp interfaces', ucx_guard.cpp): the descriptor
/// and the socket it named when found, so that a descriptor UCX closed and the process reused
/// is not taken for it.
struct UctListener {
    int fd = -1;
    ino_t ino = 0;
    SockAddr local;     ///< where it listens
    std::string where;  ///< the same as text
    uint8_t lane = 0;   ///< the context whose worker made it
    bool lost = false;  ///< UCX closed it (said once)
};

/// The process's listening TCP sockets now (/proc/self/fd).
std::vector<UctListener> listening_sockets();

/// A bootstrap connection a server accepted, waiting for its request, or for its response to
/// our challenge (ucx_boot.cpp).
struct BootConn {
    int fd = -1;
    TimePoint deadline{};
    std::size_t got = 0;
    bool challenged = false;
    uint64_t instance = 0;  ///< the client's, from its request
    auth::Nonce own{};      ///< ours, in the challenge
    auth::Nonce peer{};     ///< the client's, from its request
    SockAddr from;          ///< where it connected from (admit_host once it proved the secret)
    std::byte buf[kBootFixedSize + kBootMaxRequestBody]{};
};

/// What a client's bootstrap learns: the server's context-0 worker and instance, and with
/// Options::auth the session both sides now hold.
struct BootResult {
    std::vector<std::byte> worker;
    uint64_t instance = 0;
    std::optional<Session> session;
};

/// One UCP endpoint of a lane, to one context's worker of a peer (`peer_lane`), made by worker
/// address. Guarded by its lane's lock.
struct Ep : ListHook<EpTag> {
    ucp_ep_h h = nullptr;
    Lane* lane = nullptr;
    uint64_t serial = 0;  ///< unique per transport (remote keys are unpacked per endpoint)
    TimePoint created{};  ///< when ucp_ep_create returned (blocking waits spin while it is new)
    Addr peer;
    uint8_t peer_lane = 0;  ///< the peer's context whose worker it reaches
    /// A hello from the peer context at its other end reached this lane: the connection is up
    /// (until then, a blocked progress() does not sleep long: see progress()).
    bool established = false;
    /// A served put/get sent on it was answered: the peer's stream from it is up, so a
    /// transfer may keep kRmaWindow requests in flight (one before: a request that arrives
    /// ahead of our hello is held at the peer, and held bytes are bounded).
    bool rma_answered = false;
    bool failed = false;   ///< its error callback ran
    bool closing = false;  ///< ucp_ep_close_nbx called; `close_req` may be pending
    ucs_status_t fail_status = UCS_OK;
    void* close_req = nullptr;
    uint32_t tx_seq = 0;  ///< next sequence number of our messages on it (one stream per Ep)
    [[nodiscard]] uint32_t stream_id() const noexcept { return uint32_t(serial); }
    alignas(8) std::byte hello_hdr[kMsgHeaderSize]{};
    std::vector<std::byte> hello;  ///< our hello payload (UCX may send it after we return)
};

/// Where a lane sends one kind of message (unexpected or expected) for one context of one
/// peer: the endpoint to the worker that serves it, or, while that is not known yet (a locate
/// is in flight), the sends waiting.
struct Route {
    Addr peer;
    uint8_t ctx = 0;
    bool unexpected = true;
    Ep* ep = nullptr;
    IntrusiveList<UcxOp> waiting;  ///< sends posted before the route was known, in order
    uint32_t token = 0;            ///< the locate in flight (its answer echoes it)
    TimePoint since{};             ///< when that locate was sent
    int tries = 0;                 ///< locates sent
};
using RouteKey = std::tuple<const UcxAddr*, uint8_t, bool>;

/// What a lane receives on one endpoint of a peer (the sender's context and endpoint id are in
/// every header): the messages of that stream are delivered in its order, with `source` (an
/// alias: this lane's own reference count).
struct Stream {
    Addr source;
    UcxAddr* peer = nullptr;  ///< canonical (kept alive by `source`)
    uint8_t source_ctx = 0;   ///< the peer's context that sends on it
    uint32_t rx_next = 0;     ///< sequence number of its next message to deliver
    bool bye = false;         ///< its bye came (the peer is gone once all its streams said so)
};

/// A remote key unpacked on one endpoint of one lane (UcxMem::rkeys).
struct RkeyOnEp {
    Lane* lane = nullptr;
    uint64_t ep_serial = 0;
    ucp_rkey_h h = nullptr;
};

/// One request of a served put or get in flight (RmaXfer::slots): its AM header, its payload's
/// header and the iov the send reads, kept until UCX completes the send.
struct RmaSlot {
    RmaXfer* x = nullptr;
    uint8_t index = 0;
    bool used = false;    ///< its request went out and its answer has not come
    bool in_ucx = false;  ///< UCX has not completed its send
    bool retry = false;   ///< answered busy: goes again at retry_at
    uint8_t tries = 0;    ///< busy answers so far (the wait doubles, up to 64 ms)
    uint32_t length = 0;
    uint64_t offset = 0;  ///< into the transfer
    TimePoint retry_at{};
    alignas(8) std::byte header[kMsgHeaderSize]{};
    alignas(8) std::byte rma[kRmaHeaderSize]{};
    ucp_dt_iov_t iov[2]{};
};

/// A put or get the target serves (served RMA: MsgKind::rma_*): the transfer of one user op,
/// cut into kRmaChunk requests, at most kRmaWindow in flight. Owned by its lane (Lane::xfers,
/// reused); `op` is null while free. Its cookie names index, slot and generation, so a late or
/// forged answer finds nothing.
struct RmaXfer {
    Lane* lane = nullptr;
    uint32_t index = 0;  ///< in Lane::xfers
    uint32_t gen = 0;    ///< changes when it finishes
    UcxOp* op = nullptr;
    Addr peer;
    bool put = false;
    uint64_t key = 0;      ///< the target's registration
    uint64_t address = 0;  ///< the target's address of the transfer's first byte
    std::byte* local = nullptr;
    std::size_t length = 0;
    std::size_t next = 0;    ///< bytes handed to requests so far
    std::size_t done = 0;    ///< bytes answered ok
    uint64_t ep_serial = 0;  ///< the endpoint its requests went on last
    Errc status = Errc::ok;  ///< the first failure
    std::string why;
    unsigned in_ucx = 0;  ///< slots whose send UCX has not completed
    RmaSlot slots[kRmaWindow];
};

/// A registration (local: ucp_mem_map'ed here, or served: in UcxTransport::regions_) or a
/// deserialized peer's handle (remote).
struct UcxMem final : MemImpl {
    UcxMem(UcxTransport* t, uint64_t base, uint64_t length, Access access, bool local,
           bool thread_safe);
    ~UcxMem() override;
    UcxTransport* ut;
    ucp_mem_h memh = nullptr;     ///< local
    std::vector<std::byte> rkey;  ///< packed remote key (local: ours; remote: the owner's)
    std::string owner;            ///< owner's address string (remote)
    Addr owner_addr;              ///< interned owner (remote)
    MaybeSpinLock rk_mu;          ///< leaf lock of rkeys
    std::vector<RkeyOnEp> rkeys;  ///< remote: unpacked per (lane, endpoint), destroyed with it
    uint32_t pid = 0;             ///< remote: owner's process for process_vm_* (0: use ucp_put/get)
    uint32_t pidns = 0;           ///< remote: owner's pid namespace
    uint64_t key = 0;             ///< served regions: the owner's key (local: ours); else 0
};

/// One context's progress domain: its UCP worker and everything its progress and posts touch,
/// under its own lock. Lane 0 is made with the transport (its worker is the one a peer reaches
/// first: it holds the listener, and its address is ours in worker mode); the others with
/// their contexts. A lane outlives its context (a context made again with its id reuses it)
/// and goes with the transport.
struct Lane {
    Lane(UcxTransport* t, uint8_t id, const Options& o);
    ~Lane();
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;
    UcxTransport* t;
    const uint8_t id;
    MaybeMutex mu;  ///< guards everything below and every call into the worker
    OpPool<UcxOp> ops;
    ucp_worker_h worker = nullptr;
    int efd = -1;  ///< the worker's event fd (in the context's wait set)
    /// An epoll set (ours) over UCX's listening sockets of this worker, edge-triggered, in the
    /// context's block and wait sets: a peer's connection to them wakes the lane, which UCX's
    /// accept (on its async thread) does not always do through `efd`; -1 without listeners.
    int listen_epfd = -1;
    /// When a connection to those listeners was last seen (note_connects_locked): the peer's
    /// wire-up follows, partly unsignalled, so the lane does not sleep long for a while.
    TimePoint connect_seen{};
    std::vector<std::byte> worker_addr;  ///< packed address of `worker` (immutable once made)
    const Context* ctx = nullptr;        ///< attached context
    /// Its context exists (`attached`), and takes unexpected messages (`serves`): read by
    /// other lanes' progress, to answer a locate (serving_lane()).
    std::atomic<bool> attached{false};
    std::atomic<bool> serves{false};
    /// Posted receives and early messages of this lane's context; its storage also holds
    /// `held`. Every unexpected message arriving here goes to the context (the locate answer
    /// sent a peer here for it).
    Matcher<UcxOp, UcxMsg> match;
    IntrusiveList<UcxMsg> held;  ///< not deliverable yet (kMaxHeldMsgs), arrival order
    std::size_t held_count = 0;
    std::size_t held_bytes = 0;  ///< their payload bytes (kMaxHeldBytes)
    IntrusiveList<UcxOp, InflightTag> inflight;
    IntrusiveList<Ep, EpTag> eps;          ///< live endpoints
    IntrusiveList<Ep, EpTag> closing_eps;  ///< being closed (close_req pending)
    std::vector<Ep*> failed;               ///< error callback ran, not handled yet
    std::vector<Addr> byes;                ///< peers that said bye, not handled yet
    std::map<RouteKey, Route> routes;      ///< (peer, its context, unexpected?)
    std::size_t locating = 0;              ///< routes waiting for a locate answer
    uint32_t next_token = 0;
    uint64_t deaths_seen = 0;    ///< UcxTransport::deaths_ when this lane last looked
    TimePoint next_pid_check{};  ///< when check_pids_locked looks again
    uint32_t pid_passes = 0;     ///< progress passes since it last read the clock for it
    std::map<std::pair<uint64_t, uint32_t>, Stream> streams;  ///< (instance, its endpoint)
    Route* last_route = nullptr;    ///< cache of the last route used by a send
    Stream* last_stream = nullptr;  ///< cache of the last stream a message came on
    uint64_t last_instance = 0;     ///< ... and its key
    uint32_t last_stream_id = 0;
    /// Served put/get this lane started (RmaXfer), the free ones to reuse, how many run, and
    /// how many slots wait to be sent again after a busy answer.
    std::vector<std::unique_ptr<RmaXfer>> xfers;
    std::vector<uint32_t> free_xfers;
    std::size_t xfers_active = 0;
    std::size_t rma_retrying = 0;
    /// Target side: bytes of get answers UCX has not sent yet (kRmaAnswerBudget).
    std::size_t rma_answer_bytes = 0;
};

/// Target side of served RMA: bytes of get answers (copies of a region) one lane keeps queued
/// at most; a get beyond is answered busy, and the origin asks again shortly.
inline constexpr std::size_t kRmaAnswerBudget = std::size_t{64} << 20;

class UcxContext final : public Context {
  public:
    UcxContext(UcxTransport* t, uint8_t id, bool thread_safe, Lane* lane);
    ~UcxContext() override;
    [[nodiscard]] int block_fd() const noexcept { return block_epfd_; }
    [[nodiscard]] Lane& lane() const noexcept { return *lane_; }
    bool attached = false;

  private:
    UcxTransport* ut_;
    Lane* lane_;
    int block_epfd_ = -1;  ///< epoll over its lane's worker fd and this context's eventfd
};

class UcxTransport final : public Transport {
  public:
    explicit UcxTransport(const Options& o);
    ~UcxTransport() override;
    Result<void> init(std::string_view sub, std::string_view rest);

    std::string_view name() const noexcept override { return scheme_; }
    PeerIdentity peer_identity(const Addr& a) override;
    using Transport::context_create;
    Result<std::unique_ptr<Context>> context_create(uint8_t id,
                                                    const ContextOptions& opts) override;

    Result<Addr> addr_lookup(std::string_view address) override;
    Addr addr_self() override { return self_; }
    Addr addr_alias(const Addr& a) override;
    /// Interned addresses alive now (self included); for tests and diagnostics.
    [[nodiscard]] std::size_t live_addrs() const noexcept { return addrs_.live(); }
    std::string addr_to_string(const Addr& a) override;
    std::string peer_failure(const Addr& a) override;
    std::size_t addr_serialize_size(const Addr& a) override;
    Result<std::size_t> addr_serialize(const Addr& a, std::span<std::byte> out) override;
    Result<Addr> addr_deserialize(std::span<const std::byte> in) override;

    std::size_t max_unexpected_size() const noexcept override { return kMaxMessageSize; }
    std::size_t max_expected_size() const noexcept override { return kMaxMessageSize; }

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
    /// Never readable: a context's events come on its own lane's worker fd, which its
    /// wait_fd() holds. Block on Context::wait_fd() after Context::try_wait().
    int progress_fd() const noexcept override { return pfd_; }
    bool try_wait() override;
    bool try_wait_for(Context& ctx) override;

    // --- for tests and diagnostics -----------------------------------------------------------
    /// The UCX configuration our context was read with (key=value lines of what we set).
    [[nodiscard]] const std::vector<std::pair<std::string, std::string>>& ucx_settings()
        const noexcept {
        return settings_;
    }
    /// ucp_ep_print_info of the endpoint context 0 sends to `a`'s context 0 on (empty if none
    /// yet): the lanes and the UCT transports they use.
    std::string ep_info(const Addr& a);
    [[nodiscard]] Mode mode() const noexcept { return spec_.mode; }
    /// True if put/get to handles of ucx+sm peers copy with process_vm_readv/writev (the
    /// owner's pid travels in the handle) instead of ucp_put_nbx/ucp_get_nbx.
    [[nodiscard]] bool direct_rma() const noexcept { return pidns_ != 0; }
    /// True if this transport serves put/get to its regions itself (served RMA) rather than
    /// letting UCX move the bytes (see serves_rma()).
    [[nodiscard]] bool served_rma() const noexcept { return served_rma_; }

    // --- used by UcxContext / UcxMem / UcxAddr and the UCX callbacks ---------------------------
    void context_destroyed(UcxContext* ctx) noexcept;
    void mem_release(UcxMem* m) noexcept;
    void addr_destroyed(UcxAddr* a) noexcept;
    void on_ep_error(Ep* e, ucs_status_t status);
    void on_op_done(UcxOp* op, ucs_status_t status);
    /// A served put/get request's send completed (its lane's lock held).
    void on_rma_sent(RmaXfer& x, RmaSlot& s, ucs_status_t status);
    ucs_status_t on_am(Lane& l, const void* header, std::size_t header_len, void* data,
                       std::size_t len, const ucp_am_recv_param_t* param);

  private:
    // setup (ucx_setup.cpp)
    Result<void> init_context();
    Result<Lane*> lane_create_locked(uint8_t id);
    // bootstrap in sockaddr mode (ucx_boot.cpp)
    /// Listen on the address's host:port with a plain TCP socket (never UCX's listener), and
    /// start the thread that answers it.
    Result<void> init_bootstrap();
    /// Stop and join that thread, close the listener and its connections.
    void close_bootstrap() noexcept;
    /// The bootstrap thread: accept, answer whole requests, close the rest, until stopped.
    void boot_run() noexcept;
    void boot_accept(TimePoint now);
    /// Read what `c` sent; true when it is done with (answered or refused).
    bool boot_read(BootConn& c);
    /// A whole frame of `c` (request or response): challenge, answer or refuse it; true when
    /// `c` is done with.
    bool boot_handle(BootConn& c, const BootFixed& f, std::span<const std::byte> body);
    /// Send our answer (lane 0's worker) on `c` and wake lane 0 for the wire-up that follows.
    bool boot_answer(BootConn& c);
    /// ucx_guard.cpp: after a worker was made, take the listening sockets that were not in
    /// `before` as UCX's (of context `lane`) and filter them; admit a host that proved the
    /// secret; the bootstrap thread's check that UCX still has them, and when it is next due.
    /// Returns the descriptors of the listeners it found (the lane's).
    std::vector<int> guard_new_listeners(const std::vector<UctListener>& before, uint8_t lane);
    /// Take the lane's listener wakes (Lane::listen_epfd), note when one came; true if any.
    bool note_connects_locked(Lane& l);
    void admit_host(const SockAddr& peer);
    void attach_filters_locked();
    void check_listeners(TimePoint now);
    [[nodiscard]] TimePoint next_listener_check() const noexcept;
    /// Send a refusal naming `why` on `c`, and log it.
    bool boot_refuse(BootConn& c, const std::string& why);
    /// Log a warning of the bootstrap thread, at most one line a second.
    void boot_warn(const std::string& what);
    /// A fresh nonzero value for the instance field of a challenge or a refusal.
    uint64_t boot_alias() noexcept;
    /// Connect to `peer`'s bootstrap port, authenticate both ways where Options::auth says so,
    /// and return its context-0 worker address (blocks the calling thread for one TCP round
    /// trip, two with authentication, at most boot_timeout()).
    Result<BootResult> bootstrap(const UcxAddr& peer);
    // Sessions (Options::auth; ucx_boot.cpp): under auth_mu_, a leaf lock.
    void add_session(const Session& s);
    /// The newest session with `instance` (our own: self_session_); `id`, if given, must match.
    std::optional<Session> find_session(uint64_t instance, std::optional<uint64_t> id = {});
    /// Sign the hello of `e` (header and payload already encoded, room for the tail left).
    void sign_hello(const Session& s, Ep* e) const;
    /// A signed hello's session is ours and its MAC right (with the reason it is not).
    Result<void> check_hello(const MsgHeader& h, const Hello& hello);
    [[nodiscard]] Duration boot_timeout() const noexcept;
    /// ucx+sm: enable put/get by process_vm_readv/writev if this process may use them.
    void init_direct_rma() noexcept;
    Result<Addr> lookup_locked(std::string_view address, bool from_wire);
    Addr intern_locked(const std::string& key, bool anonymous = false);
    Ep* find_ep_locked(Lane& l, const UcxAddr* peer, uint8_t peer_lane);
    /// The endpoint of lane `l` to the worker of `peer`'s context `peer_lane`, created (with
    /// our hello queued on it) if absent: at `worker` (a packed worker address) or, when that
    /// is empty, at the peer's own address (its context 0: listener or worker).
    Result<Ep*> ep_to_locked(Lane& l, UcxAddr* peer, uint8_t peer_lane,
                             std::span<const std::byte> worker);
    Result<Ep*> ep_create_locked(Lane& l, const ucp_ep_params_t& params, const std::string& who);
    void send_hello_locked(Lane& l, Ep* e, const Session* session);
    void close_ep_locked(Lane& l, Ep* e);
    void reap_closed_locked(Lane& l);
    /// Which of our lanes serves context `ctx`: for expected messages its own when it exists;
    /// for unexpected ones its own when it exists and takes them, else the lowest that does (as
    /// route_unexpected); else 0. Takes no lock.
    uint8_t serving_lane(uint8_t ctx, bool unexpected);
    Error ucs_error(Errc code, std::string_view call, ucs_status_t st,
                    std::string_view detail = {}) const;

    // data path (ucx_io.cpp)
    Result<OpId> post_send(Context& ctx, Callback cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, bool expected);
    Result<OpId> fail_async(Lane& l, Context& ctx, Callback&& cb, OpType type, Errc status,
                            const std::string& why);
    Result<OpId> post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                          std::size_t local_off, const MemHandle& remote, std::size_t remote_off,
                          std::size_t len, const Addr& remote_addr);
    /// Served put/get (the handle names a key): start the transfer.
    Result<OpId> post_served_locked(Lane& l, Context& ctx, Callback&& cb, OpType type,
                                    std::byte* local, const UcxMem& remote, std::size_t remote_off,
                                    std::size_t len, UcxAddr* target);
    /// Send the requests the window of `x` has room for.
    void rma_pump_locked(Lane& l, RmaXfer& x);
    /// Send slot `s` of `x` (its offset and length set) on `e` (null: the peer's endpoint,
    /// made if absent); false if `x` failed.
    bool rma_send_locked(Lane& l, RmaXfer& x, RmaSlot& s, Ep* e = nullptr);
    /// After an answer, a completed send or a failure: more requests, or finish.
    void rma_settle_locked(Lane& l, RmaXfer& x);
    /// Fail `x` (the first failure counts); it finishes once UCX holds none of its sends.
    void rma_fail_locked(Lane& l, RmaXfer& x, Errc st, std::string why);
    void rma_finish_locked(Lane& l, RmaXfer& x);
    /// Slots answered busy whose wait is over go again.
    void rma_retry_locked(Lane& l);
    /// Target: serve an rma_put or rma_get from stream `s`.
    void on_rma_request_locked(Lane& l, const MsgHeader& h, Stream& s,
                               std::span<const std::byte> payload);
    /// Origin: an rma_ack or rma_data for one of this lane's transfers.
    void on_rma_answer_locked(Lane& l, const MsgHeader& h, Stream& s,
                              std::span<const std::byte> payload);
    /// put/get by process_vm_writev/readv into the owner process `pid`: ok, or why not.
    static Errc copy_direct(bool is_put, uint32_t pid, void* local, uint64_t remote,
                            std::size_t len, std::string& why) noexcept;
    /// The route of lane `l` to `peer`'s context `ctx`, made if absent: its endpoint when the
    /// worker serving that context is known (or is the peer's context 0), else waiting for the
    /// answer to a locate sent to the peer's context 0.
    Result<Route*> route_locked(Lane& l, UcxAddr* peer, uint8_t ctx, bool unexpected);
    /// The endpoint of lane `l` to `peer`'s context `ctx` itself (its worker, from the peer's
    /// hellos; its context 0 by its address), made if absent; for control answers.
    Result<Ep*> ep_to_context_locked(Lane& l, UcxAddr* peer, uint8_t ctx);
    void send_locate_locked(Lane& l, Ep* e, Route& r);
    /// Route `r` now sends on `e`: the sends waiting go, in order.
    void route_ready_locked(Lane& l, Route& r, Ep* e);
    /// Route `r` cannot be made: the sends waiting fail with `st`; the route goes.
    void route_failed_locked(Lane& l, RouteKey key, Errc st, const std::string& why);
    /// Waiting routes of `peer` that its directory can now complete.
    void resolve_routes_locked(Lane& l, UcxAddr* peer);
    /// Locates not answered in time: again, or give up.
    void check_locates_locked(Lane& l);
    /// Another lane declared peers dead: fail what waits for them here too.
    void sweep_dead_locked(Lane& l);
    /// Every kPidCheckEvery: the peers of `l`'s endpoints whose process has ended
    /// (UcxAddr::pid, process_gone) are gone.
    void check_pids_locked(Lane& l);
    /// Any endpoint of lane `l` to `peer` (for put/get and for watching it), made if absent.
    Result<Ep*> any_ep_locked(Lane& l, UcxAddr* peer);
    /// Send `op` (hdr set) on `e` now.
    void send_on_locked(Lane& l, Ep* e, UcxOp* op, const std::byte* data, std::size_t len);
    /// A control message (locate, located, rma answers) on `e`, in its stream; `charge` bytes
    /// count against the lane's kRmaAnswerBudget until UCX has sent it.
    void send_control_locked(Lane& l, Ep* e, MsgKind kind, uint8_t ctx, uint32_t tag,
                             std::vector<std::byte> payload, std::size_t charge = 0);
    /// Finish a just-issued UCX operation: complete at once, fail, or track its request.
    void track_locked(Lane& l, UcxOp* op, ucs_status_ptr_t r, const char* call);
    void complete_recv(UcxOp* op, const Addr& source, uint8_t ctx_id, Tag tag, std::size_t size,
                       Errc status);
    void deliver_locked(Lane& l, const MsgHeader& h, Stream& s, const std::byte* data,
                        std::size_t len);
    /// A message from a known sender: deliver it if it is its turn (then any held ones whose
    /// turn came), else hold it.
    void sequence_locked(Lane& l, const MsgHeader& h, Stream& s, std::span<const std::byte> data);
    void hold_locked(Lane& l, const MsgHeader& h, std::span<const std::byte> data);
    /// Take held message `m` off the lane's list and free it.
    void unhold_locked(Lane& l, UcxMsg& m) noexcept;
    /// Drop what the lane holds from the sender `instance` (gone, or restarted).
    void drop_held_locked(Lane& l, uint64_t instance) noexcept;
    /// Deliver held messages whose sender is known and whose turn it is.
    void release_held_locked(Lane& l);
    /// A hello: who sends on that stream, and where its context is served.
    void on_hello_locked(Lane& l, const MsgHeader& h, std::span<const std::byte> payload);
    void on_locate_locked(Lane& l, const MsgHeader& h, Stream& s,
                          std::span<const std::byte> payload);
    void on_located_locked(Lane& l, const MsgHeader& h, Stream& s,
                           std::span<const std::byte> payload);
    void handle_failures_locked(Lane& l);
    /// `peer` is gone (an endpoint failed, or it said bye): mark it dead (every lane's posts
    /// to it fail from now on), fail what waits for it on this lane, close this lane's
    /// endpoints to it, and let a later lookup of its name make a fresh address.
    void peer_gone_locked(Lane& l, UcxAddr* peer, Errc status, const std::string& why,
                          bool by_bye = false);
    /// Tell every peer lane `l` has an endpoint to that we are closing (transport destructor).
    void say_bye_locked(Lane& l);
    void progress_locked(Lane& l);
    /// Close a lane at transport teardown.
    void lane_close(Lane& l) noexcept;
    [[nodiscard]] Lane* lane_at(uint8_t id) const noexcept {
        return lane_ptr_[id].load(std::memory_order_acquire);
    }

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;
    Options opts_;
    Spec spec_;
    bool served_rma_ = false;  ///< serves_rma(spec_): put/get as rma_* messages, no UCP RMA
    /// Served regions by key (a leaf lock, held while a region's bytes are copied, so that a
    /// region deregistered is never touched again).
    MaybeMutex regions_mu_;
    std::unordered_map<uint64_t, UcxMem*> regions_;
    bool counted_ = false;  ///< counted in the process's live ucx transports (ucx_setup.cpp)
    std::string scheme_;    ///< "ucx+tcp"
    /// Setup lock: making lanes, attaching and detaching contexts. Taken before a lane's lock,
    /// never under one.
    MaybeMutex setup_mu_;
    /// Interning addresses (lookup_locked, intern_locked): a leaf but for the address table's
    /// own lock; taken under a lane's lock (a hello) or alone.
    MaybeMutex intern_mu_;
    ucp_context_h context_ = nullptr;
    int pfd_ = -1;  ///< progress_fd(): an eventfd nobody writes
    /// Sockaddr-mode servers: the bootstrap listener, the epoll set its thread waits on, the
    /// eventfd that stops it, and what only that thread touches (connections, pause).
    int boot_fd_ = -1;
    int boot_epfd_ = -1;
    int boot_stop_fd_ = -1;
    std::thread boot_thread_;
    pid_t boot_pid_ = 0;  ///< the process that started it (a child across fork() has none)
    std::vector<BootConn> boot_conns_;
    bool boot_paused_ = false;
    TimePoint boot_paused_until_{};
    log::Limiter boot_log_;  ///< boot_warn: one line a second
    /// UCX's own listeners and the hosts they admit (ucx_guard.cpp), under guard_mu_ (a leaf:
    /// taken under the setup lock, by the bootstrap thread, or by a client's bootstrap).
    std::mutex guard_mu_;
    std::vector<UctListener> uct_listeners_;
    std::vector<AdmittedHost> admitted_;
    bool filter_listeners_ = false;  ///< Options::auth in sockaddr mode: filter them (set at open)
    bool filter_overflow_ = false;   ///< too many hosts: left unfiltered (said once)
    std::atomic<bool> any_listener_{false};
    TimePoint next_listener_check_{};    ///< the bootstrap thread's (check_listeners)
    std::vector<std::byte> boot_reply_;  ///< the one answer: lane 0's worker, our instance
    /// When the bootstrap thread last answered (steady-clock ns, 0: never). The client's UCX
    /// wire-up follows over a connection UCX accepts from its async thread without always
    /// signalling lane 0's worker fd: lane 0 does not sleep long while it is recent.
    std::atomic<int64_t> boot_answered_at_{0};
    /// Options::auth: sessions with peers (newest last) and the one that signs hellos to
    /// ourselves; auth_mu_ is a leaf, taken under a lane's lock or by the bootstrap thread.
    std::mutex auth_mu_;
    std::vector<Session> sessions_;
    Session self_session_;
    uint64_t instance_ = 0;
    uint64_t token_salt_ = 0;  ///< random, never sent: mixed into locate tokens
    std::atomic<uint64_t> ep_serial_{0};
    std::atomic<bool> closing_{false};  ///< in the destructor: callbacks complete nothing
    std::atomic<uint64_t> deaths_{0};   ///< peers declared dead so far (lanes sweep on change)
    uint32_t pid_ = 0;                  ///< ours, advertised in handles when pidns_ != 0
    uint32_t pidns_ = 0;  ///< our pid namespace; nonzero only for ucx+sm (peers on this host)
    /// Ours and our pid namespace, sent in hellos (kHelloProcess) on ucx+sm; 0 elsewhere.
    uint32_t hello_pid_ = 0;
    uint32_t hello_pidns_ = 0;
    /// A hello told a peer's pid (UcxAddr::pid): from then on progress checks the processes
    /// of each lane's peers every kPidCheckEvery (check_pids_locked).
    std::atomic<bool> watching_pids_{false};
    Addr self_;
    std::vector<std::pair<std::string, std::string>> settings_;
    std::vector<std::unique_ptr<Lane>> lanes_;        ///< under setup_mu_
    std::unique_ptr<std::atomic<Lane*>[]> lane_ptr_;  ///< by id, published once made
};

/// The UcxAddr an address of a ucx transport (or an alias of one) stands for.
inline UcxAddr* ucx_addr(const Addr& a) noexcept {
    return static_cast<UcxAddr*>(a.impl()->canonical());
}

/// Errc for a UCS status of a failed operation or endpoint.
Errc errc_of(ucs_status_t st) noexcept;

/// Sends UCX's own log messages to Talaria's log instead of stdout (ucx_log.cpp); called before
/// each UCX context is made, acts once per process.
void route_ucx_log();

}  // namespace talaria::na::ucx
