// The sm (shared-memory) transport: processes on one host exchange messages through lock-free
// rings in a shared segment per connection, and move bulk data with a single copy through
// process_vm_readv/writev. A UNIX-domain SOCK_SEQPACKET socket per connection carries the
// handshake (segment and eventfds passed with SCM_RIGHTS) and stays open so that a dead peer is
// seen as EOF/EPOLLHUP.
//
// Files: setup (open, names, handshake, lookup, registration) in sm_setup.cpp; the hot path
// (send, receive, rings, progress, put/get, cancel) in sm_datapath.cpp; bytes in sm_wire.*.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "na/base/addr_table.hpp"
#include "na/base/op.hpp"
#include "na/sm/sm_wire.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"

namespace talaria::na::sm {

class SmTransport;
class SmContext;
struct Conn;
struct Lane;

/// Unexpected messages a context keeps stashed for receives not yet posted (each in a
/// kMaxMsgSize slot), and how many of them one peer may have stashed in all contexts. Past
/// either, the lane stops draining the ring the last one came on: the ring fills and the
/// sender's sends wait on its side (nothing is dropped) until the stash is below half of it.
/// docs/architecture.md, "Back-pressure on tcp and sm".
inline constexpr std::size_t kMaxStashedUnexpected = 4096;
inline constexpr uint32_t kMaxStashedPerPeer = 1024;

/// One posted operation. `list` names the pending list holding it (for cancel), if any.
struct SmOp : Op {
    IntrusiveList<SmOp>* list = nullptr;
    struct Peer* peer = nullptr;  ///< send: destination; recv_expected: source; rma: target
    // messages
    std::byte* data = nullptr;  ///< send: payload; recv: the receive buffer
    std::size_t len = 0;        ///< send: payload length; recv: buffer capacity
    Tag tag = 0;
    uint8_t dest_ctx = 0;
    MsgKind kind = MsgKind::unexpected;
    // put/get
    bool is_put = false;
    std::byte* local = nullptr;
    uint64_t remote = 0;
    uint32_t remote_pid = 0;
    uint64_t remote_instance = 0;
    uint32_t remote_slot = 0;  ///< the handle's entry in the owner's registration table
    uint64_t remote_key = 0;   ///< ... and the key it must hold
};

/// A peer endpoint, interned by name: one Peer per live peer, so Addr equality is identity.
///
/// Interned weakly (see na/base/addr_table.hpp): the table holds a raw pointer. The transport
/// pins every Peer it creates (SmTransport::pins_) because connections (Conn::peer) and posted
/// ops (SmOp::peer) point at it without a reference; sweep_peers_locked() drops the pin of a
/// peer nobody else references (count 1) with no connection and no op pointing at it, which
/// destroys it. The destructor may run on any thread: it only takes the table's leaf lock.
///
/// Threads: everything but `dead` and `rma_ready` is written under the transport's setup lock
/// (handshakes, failures). Lanes read `dead` (atomic) on every post, and the identity fields
/// only after an acquire of `rma_ready`, after which they never change.
struct Peer final : AddrImpl {
    Peer(Transport* t, AddrTable* table, std::string n)
        : AddrImpl(t), name(std::move(n)), table_(table) {}
    ~Peer() override {
        if (regs && !self) ::munmap(const_cast<RegEntry*>(regs), kRegsBytes);
        table_->remove(name, this);
    }
    Peer(const Peer&) = delete;
    Peer& operator=(const Peer&) = delete;
    std::string name;
    std::atomic<bool> dead{false};  ///< a connection broke: everything to/from it fails
    /// pid, instance and the rma_* verdict are final (handshake and probe done, or self).
    std::atomic<bool> rma_ready{false};
    bool identified = false;  ///< pid/instance known (handshake done, or self)
    bool self = false;
    bool probed = false;  ///< process_vm_readv tried on its probe word
    uint32_t pid = 0;
    uint32_t uid = 0;  ///< as the kernel reported it (SO_PEERCRED), with pid
    uint64_t instance = 0;
    /// Its registration table, mapped read-only (identity field; ours for self).
    const RegEntry* regs = nullptr;
    /// put/get must fail with this (e.g. the kernel forbids process_vm_* to this peer).
    Errc rma_errc = Errc::ok;
    std::string rma_error;
    std::vector<Conn*> conns;         ///< every connection with it, of every lane
    IntrusiveList<SmOp> pending_rma;  ///< put/get waiting for the handshake
    /// Its unexpected messages stashed in any lane for receives not yet posted
    /// (Stashed::charged; kMaxStashedPerPeer).
    std::atomic<uint32_t> stashed{0};

  private:
    AddrTable* table_;
};

/// The Peer of an address of this transport (a Peer or an AddrAlias of one).
inline Peer* peer_of(const Addr& a) noexcept {
    return static_cast<Peer*>(a.impl()->canonical());
}

/// One connection: a socket plus a mapped segment holding a ring per direction. A connection
/// joins one of our contexts (its lane) with one context of the peer: the lane alone pushes
/// into `tx` and drains `rx`, under its own lock.
struct Conn {
    enum class State : uint8_t { hello_wait, ack_wait, established };
    uint64_t id = 0;
    State state = State::hello_wait;
    bool outbound = false;  ///< we connected (and created the segment)
    /// Queued for process_broken_locked() (fail_conn_later, from any thread).
    std::atomic<bool> broken{false};
    Errc fail_why = Errc::ok;
    /// The handshake refused it (the acceptor has no context): process_broken_locked() closes
    /// this connection alone; the peer is not dead.
    bool refused = false;
    uint8_t remote_ctx = 0;  ///< the peer's context at the other end
    int sock = -1;
    int peer_evfd = -1;  ///< rings the peer's context (its eventfd), -1 until the handshake
    pid_t cred_pid = 0;  ///< the peer's pid as the kernel reports it (SO_PEERCRED)
    uid_t cred_uid = 0;  ///< ... and its uid
    Peer* peer = nullptr;
    /// An alias of `peer` (alias_of), set with it: the source of its messages, so that each
    /// completion's reference is taken on a count only the connection's lane writes.
    Addr source;
    Lane* lane = nullptr;  ///< the lane that owns it (nullptr while an inbound hello is awaited)
    void* seg = nullptr;
    // transmit ring (we produce) and receive ring (we consume)
    RingCtl* tx = nullptr;
    std::byte* tx_slots = nullptr;
    uint64_t tx_tail = 0;
    uint64_t tx_head_cache = 0;
    RingCtl* rx = nullptr;
    const std::byte* rx_slots = nullptr;
    uint64_t rx_head = 0;
    IntrusiveList<SmOp> pending_sends;  ///< sends waiting for ring space, in order
    /// Its receive ring is not drained while the stash of its lane or of its peer is over the
    /// bounds (kMaxStashed*); counted in Lane::paused.
    bool paused = false;
};

/// A message that arrived before its receive was posted: copied out of the ring.
struct Stashed : ListHook<> {
    Addr source;
    Tag tag = 0;
    uint8_t ctx = 0;
    MsgKind kind = MsgKind::unexpected;
    bool loose = false;  ///< allocated alone (handed between lanes): deleted when freed
    uint32_t len = 0;
    /// The peer it is counted against (Peer::stashed) while it waits, or nullptr.
    Peer* charged = nullptr;
    std::byte data[kMaxMsgSize];
};

/// The progress domain of one context id: its connections, op pool, queues and wake-up state,
/// under its own lock, which only the thread driving the context and threads posting on it
/// take. Owned by the transport (lanes_) and kept until it closes, so that ops released after
/// their context is gone and connections pointing here stay valid; a context re-created with
/// the same id gets the same lane back.
struct Lane {
    Lane(uint8_t lane_id, const Options& o);
    ~Lane();
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;
    /// Wake the lane's thread if it sleeps (any thread; the fd lives as long as the lane).
    void ring_own_bell() const noexcept;
    struct Releaser final : OpReleaser {
        explicit Releaser(Lane* owner) noexcept : lane(owner) {}
        void release(Op* op) noexcept override;
        Lane* lane;
    };
    /// Where a send to (peer, its context) goes.
    struct Route {
        Peer* peer;
        uint8_t remote_ctx;
        Conn* conn;
    };
    alignas(64) MaybeSpinLock mu;
    const uint8_t id;
    SmContext* ctx = nullptr;  ///< under mu and the transport's route lock
    /// The doorbell peers ring (an eventfd, passed in the handshake of each connection of the
    /// lane): the lane's own rather than its context's, so that connections outlive a context
    /// and serve the next one created with this id.
    int bell_fd = -1;
    bool orphaned = false;  ///< its context was destroyed (under the setup lock)
    Releaser releaser{this};
    OpPool<SmOp> pool;          ///< no lock of its own: every acquire runs under mu
    std::vector<Conn*> active;  ///< connections whose rings this lane polls
    std::vector<Route> routes;  ///< send connections by (peer, remote context)
    std::size_t last_route = 0;
    IntrusiveList<SmOp> recvs;             ///< posted recv_unexpected
    IntrusiveList<Stashed> msgs;           ///< unexpected messages with no receive yet
    IntrusiveList<SmOp> expected_recvs;    ///< posted recv_expected, matched on (peer, tag)
    IntrusiveList<Stashed> expected_msgs;  ///< expected messages with no receive yet
    std::size_t expected_bytes = 0;  ///< their payload (kMaxEarlyExpectedBytes, like the matcher)
    std::vector<Stashed*> stash_free;
    std::vector<std::unique_ptr<Stashed>> stash_all;
    std::size_t pending_sends = 0;  ///< ops on any of its connections' pending_sends
    std::size_t paused = 0;         ///< connections whose ring is not drained (Conn::paused)
    unsigned armed = 0;             ///< threads of its context that armed the rings' flags to sleep
    bool try_armed = false;         ///< try_wait() armed them: withdrawn by progress
    uint32_t busy_polls = 0;
    uint64_t last_fd_poll_ns = 0;
#if defined(__SANITIZE_THREAD__)
    std::atomic<uint32_t> fence_word{0};  ///< check_space_wanted_locked() under TSan
#endif
    /// Messages another lane drained for this one (misrouted, see deliver_locked), under the
    /// transport's route lock; `has_inbox` tells progress to look without taking it.
    IntrusiveList<Stashed> inbox;
    std::atomic<bool> has_inbox{false};
};

/// A registered (local) or deserialized (remote) region; pid and instance name its owner,
/// slot and key its entry in the owner's registration table (a local one leaves it when
/// destroyed).
class SmMem final : public MemImpl {
  public:
    SmMem(SmTransport* t, const MemWire& w, bool local) noexcept;
    ~SmMem() override;
    SmMem(const SmMem&) = delete;
    SmMem& operator=(const SmMem&) = delete;
    uint32_t pid;
    uint64_t instance;
    uint32_t slot;
    uint64_t key;

  private:
    SmTransport* owner_;
};

class SmTransport final : public Transport {
  public:
    /// Opens the endpoint `rest` ("" generates a name). Everything an error needs is in it.
    static Result<std::unique_ptr<Transport>> open(std::string_view rest, const Options& o);
    ~SmTransport() override;

    [[nodiscard]] std::string_view name() const noexcept override { return "sm"; }
    using Transport::context_create;
    Result<std::unique_ptr<Context>> context_create(uint8_t id,
                                                    const ContextOptions& opts) override;

    Result<Addr> addr_lookup(std::string_view address) override;
    Addr addr_self() override;
    std::string addr_to_string(const Addr& a) override;
    PeerIdentity peer_identity(const Addr& a) override;
    Addr addr_current(const Addr& a) override;
    std::size_t addr_serialize_size(const Addr& a) override;
    Result<std::size_t> addr_serialize(const Addr& a, std::span<std::byte> out) override;
    Result<Addr> addr_deserialize(std::span<const std::byte> in) override;
    /// A new alias of `a` (alias_of).
    Addr addr_alias(const Addr& a) override;

    [[nodiscard]] std::size_t max_unexpected_size() const noexcept override { return kMaxMsgSize; }
    [[nodiscard]] std::size_t max_expected_size() const noexcept override { return kMaxMsgSize; }

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
    [[nodiscard]] int progress_fd() const noexcept override { return epfd_; }
    bool try_wait() override;
    bool try_wait_for(Context& ctx) override;

    // --- for SmContext ---
    void context_destroyed(SmContext* c) noexcept;
    /// Interned addresses alive now (self and peers not swept yet included); for tests.
    [[nodiscard]] std::size_t live_addrs() const noexcept { return addrs_.live(); }

  private:
    friend struct Lane;
    SmTransport(const Options& o, std::string name);

    // setup (sm_setup.cpp); `_locked`: under setup_mu_ (and no lane lock held)
    Result<void> init();
    /// The peer named `name` (created and pinned if absent or dead). The pointer stays valid
    /// under setup_mu_ until the next sweep_peers_locked().
    Result<Peer*> intern_locked(std::string_view name);
    /// Free the peers nobody uses, when pins_ doubled since the last sweep (amortized O(1)).
    /// Call only where no raw Peer* is held without a reference (public entry points).
    void sweep_peers_locked();
    /// May a process with these credentials connect (this user, or Options::sm_group)?
    [[nodiscard]] bool admitted(const ucred& cr) const noexcept;
    /// Is the server we connected to at `path` (credentials `cr`) one of Options::sm_group?
    [[nodiscard]] bool group_server(const ucred& cr, const std::string& path) const noexcept;
    /// Who is admitted, for the message of a refusal.
    [[nodiscard]] std::string who_is_admitted() const;
    /// Connect lane `l` with context `remote_ctx` of `peer` (under setup_mu_, takes l.mu).
    /// Open a connection to `peer`'s context (open_conn_locked); a failure counts as
    /// LinkEvent::connect_failed.
    Result<Conn*> connect_locked(Lane& l, Peer* peer, uint8_t remote_ctx);
    Result<Conn*> open_conn_locked(Lane& l, Peer* peer, uint8_t remote_ctx);
    /// The connection lane `l` sends to (peer, remote_ctx) on, connecting if there is none.
    /// Called without l.mu (takes setup_mu_, then l.mu).
    Result<void> ensure_route(Lane& l, Peer* peer, uint8_t remote_ctx);
    void accept_locked();
    void on_socket_readable_locked(Conn* c);
    void on_hello_locked(Conn* c, const Handshake& m, int* fds, int nfds);
    void on_ack_locked(Conn* c, const Handshake& m, int* fds, int nfds);
    void probe_rma_locked(Peer* p, uint64_t probe_addr);
    void send_wake(Conn* c) noexcept;
    /// Mark `c` broken with its cause (under its lane's lock, or setup_mu_ before it has one).
    void fail_conn_later(Conn* c, Errc why, std::string_view reason) noexcept;
    void process_broken_locked();
    void fail_peer_locked(Peer* p, Errc why);
    /// Close `c` (its lane's lock held when it has one); its pending sends complete with `why`
    /// (or are dropped when !complete).
    void close_conn_locked(Conn* c, Errc why, bool complete) noexcept;
    /// close_conn_locked() from the setup lock: takes c's lane lock when it has a lane.
    void close_conn(Conn* c, Errc why, bool complete) noexcept;
    void run_pending_rma_locked(Peer* p);
    /// The copy of a put/get (no lock needed), once the owner's registration table says the
    /// handle names a live registration that allows it (check_region); a status, with the
    /// cause logged.
    Errc exec_rma(SmOp& op) noexcept;
    /// Read the entry `op` names in its owner's table (ours directly, a peer's with
    /// the mapping its handshake gave) and check key, access and bounds: ok, or the status and why.
    Errc check_region(const SmOp& op, std::string& why) noexcept;

  public:
    /// A local registration is dropped: its entry is freed (SmMem's destructor).
    void mem_unregister(uint32_t slot) noexcept;

  private:
    void handle_event_locked(uint64_t key, uint32_t events);
    /// Look at the sockets (accepts, handshakes, hang-ups) and fail broken connections. Takes
    /// setup_mu_ (only if free when !wait); never called with a lane lock held.
    void poll_fds(bool wait);

    // hot path (sm_datapath.cpp); `_locked`: under the lane's lock
    Result<OpId> post_send(Context& ctx, Callback&& cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, MsgKind kind);
    Result<OpId> post_rma(Context& ctx, Callback&& cb, const MemHandle& local,
                          std::size_t local_off, const MemHandle& remote, std::size_t remote_off,
                          std::size_t len, const Addr& remote_addr, bool is_put);
    static Lane& lane_of(Context& ctx) noexcept;
    /// The send connection of lane `l` to (peer, remote_ctx), or nullptr.
    static Conn* route_locked(Lane& l, const Peer* peer, uint8_t remote_ctx) noexcept;
    /// Push one message into c's transmit ring; false when full (or the peer broke it).
    bool ring_push(Conn* c, const SmOp& op) noexcept;
    /// Consume the messages in c's receive ring (at most a ringful).
    void ring_drain(Conn* c) noexcept;
    /// Is the next message of c's receive ring published?
    [[gnu::always_inline]] static bool ring_ready(const Conn* c) noexcept;
    void deliver_locked(Conn* c, const SlotHeader& h, const std::byte* payload) noexcept;
    /// Hand a message of lane `from` to the lane it belongs to (route lock; rare path).
    void hand_over_locked(Lane& from, const Conn* c, const SlotHeader& h,
                          const std::byte* payload) noexcept;
    /// Take the messages other lanes handed to `l`.
    void drain_inbox_locked(Lane& l) noexcept;
    /// Give `s` to a receive posted on `l`, or queue it there.
    void accept_stashed_locked(Lane& l, Stashed* s) noexcept;
    /// Queue an early expected message on `l`, or drop it (logged) past the matcher's bounds
    /// (kMaxEarlyExpected, kMaxEarlyExpectedBytes): a peer sending expected messages nobody
    /// asked for must not make us hold memory without a bound.
    void queue_expected_locked(Lane& l, Stashed* s) noexcept;
    /// Drain c's receive ring if a message is published (and c is not broken).
    void drain_if_ready(Conn* c) noexcept;
    /// Back-pressure: stop draining c's ring (the lane's stash or its peer's is over the
    /// bounds); drain again the paused rings of `l` whose stashes went below half of them.
    void pause_locked(Lane& l, Conn* c) noexcept;
    void resume_paused_locked(Lane& l) noexcept;
    /// Fence, then wake any producer waiting for ring space (see ring_drain()).
    void check_space_wanted_locked(Lane& l) noexcept;
    void retry_sends_locked(Lane& l) noexcept;
    void poll_rings_locked(Lane& l) noexcept;
    /// A lane whose context was destroyed keeps its connections (see context_destroyed):
    /// poll_fds() drains their rings, handing the messages to the contexts left.
    void poll_orphan_locked(Lane& l) noexcept;
    void ring_bell(Conn* c) noexcept;
    /// Arm the waiting flag of every ring of `l` (and space_wanted where sends wait), then
    /// re-check: false when work is already there (the flags stay set; disarm them).
    bool arm_locked(Lane& l) noexcept;
    void disarm_locked(Lane& l) noexcept;
    static Stashed* stash_alloc(Lane& l) noexcept;
    /// Copy an early message out of its ring slot; nullptr (logged) when out of memory.
    Stashed* stash_copy_locked(Lane& l, const Conn* c, const SlotHeader& h,
                               const std::byte* payload) noexcept;
    static void stash_free(Lane& l, Stashed* s) noexcept;
    static Errc fill_recv(SmOp* op, Addr&& source, Tag tag, uint8_t ctx, const std::byte* data,
                          std::size_t len) noexcept;

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;  ///< interned peers by name, weakly (see Peer); find+add under setup_mu_
    Options opts_;
    std::string name_;
    uint64_t instance_ = 0;
    alignas(8) uint64_t probe_word_ = 0;  ///< holds instance_: peers read it to check us
    /// The registration table: a sealed memfd (regs_fd_, passed to every peer in the
    /// handshake) of kMaxRegistrations entries, pages committed as used; its free slots and
    /// the high-water mark under regs_mu_ (a leaf lock).
    RegEntry* regs_ = nullptr;
    int regs_fd_ = -1;
    MaybeSpinLock regs_mu_;
    std::vector<uint32_t> free_regs_;
    uint32_t regs_top_ = 0;
    pid_t pid_ = 0;
    /// Guards what the contexts share: the connection table, sockets and handshakes, peers,
    /// failures. Taken on first contact, when sockets need attention (every 100 µs while busy,
    /// with try_lock) and on failures, never per message. Order: setup_mu_, then a lane's mu,
    /// then route_mu_.
    MaybeMutex setup_mu_;
    /// Leaf lock over which context each lane holds (routing of misrouted messages) and the
    /// lanes' inboxes.
    MaybeSpinLock route_mu_;
    std::vector<std::unique_ptr<Lane>> lanes_;  ///< by context id; created on first use
    int epfd_ = -1;
    int listen_fd_ = -1;  ///< -1 without Options::listen
    int lock_fd_ = -1;    ///< abstract socket holding our name (released when we die)
    std::string sock_path_;
    uint64_t next_conn_id_ = 1;
    uint64_t next_seg_id_ = 1;
    /// Some connection was marked broken (under broken_mu_): process_broken_locked() runs.
    std::atomic<bool> any_broken_{false};
    MaybeSpinLock broken_mu_;
    std::vector<uint64_t> broken_;  ///< conn ids to fail at the next safe point (broken_mu_)

    Addr self_;
    std::vector<Addr> pins_;     ///< one reference on every Peer we created (see Peer)
    std::size_t sweep_at_ = 64;  ///< sweep_peers_locked() runs when pins_ reaches this
    std::unordered_map<uint64_t, Conn*> conns_;  ///< every open connection by id
};

class SmContext final : public Context {
  public:
    SmContext(SmTransport* t, uint8_t id, bool thread_safe, Lane* lane)
        : Context(t, id, thread_safe), t_(t), lane_(lane) {}
    ~SmContext() override { t_->context_destroyed(this); }
    [[nodiscard]] Lane& lane() const noexcept { return *lane_; }

  private:
    SmTransport* t_;
    Lane* lane_;
};

/// Where sm keeps its files. "/dev/shm".
inline constexpr std::string_view kShmDir = "/dev/shm";
/// Every sm file starts with this, followed by the owner's pid and '-'.
inline constexpr std::string_view kFilePrefix = "talaria-sm-";

/// Parse "talaria-sm-<pid>-<rest>" into pid and rest; false for other names.
bool parse_file_name(std::string_view file, pid_t& pid, std::string_view& rest) noexcept;
/// Remove sm files in `dir` whose owner pid no longer exists. Returns how many were removed.
std::size_t remove_stale_files(std::string_view dir);

}  // namespace talaria::na::sm
