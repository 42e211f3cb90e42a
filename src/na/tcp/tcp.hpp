// The tcp transport: epoll over non-blocking TCP sockets, one listening socket, connections made
// on first use, one per (our context, peer context): each context is a progress domain (Lane)
// with its own connections, epoll set, op pool, matcher and lock. Setup (addresses, registration,
// sockets) is in tcp_setup.cpp; the data path (posting, sending, the receive state machine,
// progress) in tcp_io.cpp. Wire format: frame.hpp and docs/protocol.md (tcp).
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "na/base/addr_table.hpp"
#include "na/base/auth.hpp"
#include "na/base/matcher.hpp"
#include "na/base/op.hpp"
#include "na/base/seal.hpp"
#include "na/base/url.hpp"
#include "na/tcp/frame.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"
#include "talaria/util/log.hpp"
#include "talaria/util/spin_lock.hpp"

namespace talaria::na::tcp {

/// Responses (put/get replies) a peer may have waiting on one connection before we decide it is
/// flooding us without reading, and disconnect it.
inline constexpr std::size_t kMaxRepliesPerConn = 65536;
/// Size of each connection's receive buffer (headers and small payloads land here).
inline constexpr std::size_t kRxBufferSize = 64 * 1024;
/// Protected connections: records sealed per write at most, and the buffers of sealed bytes
/// each way (four records of the largest size).
inline constexpr std::size_t kSealedBufferSize = 4 * (seal::kMaxRecordBody + seal::kRecordOverhead);
/// The receive buffer of an accepted connection until its hello is read: a frame header and a
/// hello fit, and a storm of connections that never say hello costs little (grown to
/// kRxBufferSize when the connection joins its lane).
inline constexpr std::size_t kSetupRxSize = 512;

/// Unexpected messages one context keeps waiting for receives (by count and payload bytes),
/// and the payload bytes one peer may have waiting in all of them. Past either bound the
/// connection that brought the last message is no longer read (the kernel's socket buffers
/// fill and TCP's flow control holds the sender back: nothing is dropped) until the backlog is
/// below half of it again. docs/architecture.md, "Back-pressure on tcp and sm".
inline constexpr std::size_t kMaxUnexpectedCount = 4096;
inline constexpr std::size_t kMaxUnexpectedBytes = std::size_t{32} << 20;
inline constexpr std::size_t kMaxUnexpectedPerPeer = std::size_t{8} << 20;

class TcpTransport;
struct Conn;

struct SendTag {};
struct RmaTag {};
struct ConnTag {};

/// Something queued on a connection's send queue: a header and up to one payload span.
struct Lane;

struct SendItem : ListHook<SendTag> {
    enum class Kind : uint8_t { op, control };
    Kind kind = Kind::op;
    int iovcnt = 0;
    iovec iov[2]{};
    std::size_t total = 0;  ///< bytes of header + payload
    std::size_t sent = 0;   ///< bytes already written
    alignas(8) std::byte header[kFrameHeaderSize]{};
};

enum class OpState : uint8_t {
    idle,
    recv_posted,  ///< on a posted-receive list, cancelable
    receiving,    ///< its payload is being read from a connection
    send_queued,  ///< on a send queue (cancelable while sent == 0)
    await_reply,  ///< put/get fully sent, waiting for the target's response
};

/// A user operation. Its Op hook links it on a posted-receive list; SendItem on a send queue;
/// the RmaTag hook on its connection's list of put/get waiting for a response.
struct TcpOp : Op, SendItem, ListHook<RmaTag> {
    OpState state = OpState::idle;
    std::byte* buf = nullptr;  ///< recv: destination; put: source; get: destination
    std::size_t cap = 0;       ///< recv: capacity; put/get: length
    Addr match_source;         ///< recv_expected
    Tag match_tag = 0;         ///< recv_expected
    Conn* conn = nullptr;      ///< send/put/get: the connection it was queued on
    /// Queued on another lane's connection (borrow()): that lane, `lender`, completes it, and
    /// cancel() withdraws it under that lane's lock.
    bool borrowed = false;
    Lane* lender = nullptr;
    /// On rma_wait: how many responses of canceled put/get follow this op's response (they are
    /// read and dropped; abandon_reply()).
    uint32_t skip_after = 0;
};

/// A frame the transport sends on its own (hello, put/get responses).
struct Control : SendItem {
    bool reply = false;  ///< a put/get response (counted in Conn::replies)
    bool setup = false;  ///< the hello: sent while the connection still authenticates
    /// A private copy of a get response's data, made only when its region is deregistered
    /// while the response is half sent.
    std::unique_ptr<std::byte[]> owned;
    alignas(8) std::byte payload[kMaxHelloPayload]{};
};

/// One peer, interned weakly (see na/base/addr_table.hpp): the transport's table holds a raw
/// pointer. It lives while a user Addr, a connection (Conn::peer), an alias of it, a pending op
/// (TcpOp::match_source), a queued message (QueuedMsg::source), a remote memory handle
/// (TcpMem::owner_addr) or the transport's self_ holds it. An anonymous client ("tcp://~<id>")
/// thus vanishes once its connections are closed and nobody holds its Addr. The destructor may
/// run on any thread, also under a transport lock: it only takes the table's leaf lock to erase
/// its own entries. `str`, `sa` and `anonymous` are written once, before the address is handed
/// out (under the setup lock), and only read after.
struct TcpAddr final : AddrImpl {
    TcpAddr(Transport* t, AddrTable* table, std::string s, bool anon)
        : AddrImpl(t), str(std::move(s)), anonymous(anon), table_(table) {}
    ~TcpAddr() override;
    TcpAddr(const TcpAddr&) = delete;
    TcpAddr& operator=(const TcpAddr&) = delete;
    const std::string str;  ///< canonical "tcp://host:port" or "tcp://~<instance>" (anonymous)
    /// Where it listens; for an anonymous client, where its first connection came from (for
    /// logs: addr_describe).
    SockAddr sa;
    const bool anonymous;
    /// Other strings it was looked up by (table aliases), under the setup lock.
    std::vector<std::string> aliases;
    /// Payload bytes of its unexpected messages that wait for receives here, in every lane
    /// (QueuedMsg::charge; kMaxUnexpectedPerPeer).
    std::atomic<std::size_t> unexpected_bytes{0};
    /// Its connections not yet closed (Conn::peer), in every lane and the setup set. At 0 the
    /// receives waiting for it have failed, and the early expected messages it left are freed
    /// (TcpTransport::drop_early_of_closed_locked): a peer that sent what nobody asked for and
    /// went must not hold that memory, nor the bound that other peers share.
    std::atomic<uint32_t> open_conns{0};
    /// Why the last connect to it failed (Transport::peer_failure), under failure_mu: written
    /// when a connect fails, read for the layer above's error messages; never on a fast path.
    std::mutex failure_mu;
    std::string failure;

  private:
    AddrTable* table_;
};

/// The TcpAddr of an address of this transport (a TcpAddr or an AddrAlias of one).
inline TcpAddr* peer_of(const Addr& a) noexcept {
    return static_cast<TcpAddr*>(a.impl()->canonical());
}

/// Words for a failed connect to `peer` (errno `err`), naming the cause and, for a refused
/// connection, the remedy; recorded as the peer's failure (TcpTransport::peer_failure).
std::string connect_failure(TcpAddr* peer, int err);

/// Most aliases remembered per address (more lookups by other names just resolve again).
inline constexpr std::size_t kMaxAliases = 4;

/// A registration (local) or a deserialized peer's handle (remote).
struct TcpMem final : MemImpl {
    TcpMem(TcpTransport* t, uint64_t base, uint64_t length, Access access, bool local,
           uint64_t key_);
    ~TcpMem() override;
    TcpTransport* owner_transport;
    uint64_t key;
    std::string owner;  ///< owner's address string
    Addr owner_addr;    ///< interned owner, when known (remote handles)
};

struct Lane;

struct Conn : ListHook<ConnTag> {
    enum class State : uint8_t { connecting, await_hello, open, closed };
    enum class Sink : uint8_t { discard, op, queued, hello, put, get, auth };

    int fd = -1;
    State state = State::connecting;
    bool outgoing = false;
    /// The lane that owns it (its lock guards everything below); nullptr while an accepted
    /// connection waits for its hello (then the setup lock guards it).
    Lane* lane = nullptr;
    /// The peer's context at the other end: the one we asked for (outgoing), or the one the
    /// peer's hello named as its own (accepted).
    uint8_t remote_ctx = 0;
    /// The context of ours an accepted connection's hello asked for.
    uint8_t asked_ctx = 0;
    Addr peer;            ///< unknown on an accepted connection until its hello
    Addr source;          ///< an alias of `peer` (alias_of): the source of the messages it delivers
    uint32_t events = 0;  ///< what its epoll entry asks for (0 while paused and not writing)
    bool in_set = false;  ///< it has an entry in an epoll set (watch())

    IntrusiveList<SendItem, SendTag> sendq;
    std::size_t queued_bytes = 0;
    IntrusiveList<TcpOp, RmaTag> rma_wait;
    /// Responses to read and drop before the front of rma_wait's: those of put/get canceled
    /// while they waited (abandon_reply()).
    uint32_t skip_front = 0;
    std::size_t replies = 0;

    // Receive state: [rx_pos, rx_len) of rx (rx_cap bytes) holds unparsed bytes.
    std::unique_ptr<std::byte[]> rx;
    std::size_t rx_cap = 0;
    std::size_t rx_pos = 0;
    std::size_t rx_len = 0;
    bool in_payload = false;
    bool rx_foreign = false;  ///< the message being read goes to another lane (hand_over)
    /// Not read (no EPOLLIN) while its peer's or its lane's unexpected backlog is over the
    /// bounds (kMaxUnexpected*); counted in Lane::paused.
    bool paused = false;
    /// A send failed and what the peer wrote before is being read first (flush): once.
    bool last_read = false;
    /// read_ready runs on it (a send it causes, such as a put/get answer, must not read
    /// again from inside the parse).
    bool reading = false;
    FrameHeader hdr;
    Sink sink = Sink::discard;
    std::byte* dest = nullptr;  ///< where the payload goes (nullptr: discard)
    uint64_t remaining = 0;     ///< payload bytes still to read
    TcpOp* rx_op = nullptr;
    QueuedMsg* rx_msg = nullptr;
    Errc rx_status = Errc::ok;
    std::byte hello_buf[kMaxHelloPayload]{};
    TimePoint accepted_at{};  ///< accepted: when (Options::hello_timeout)

    // Authentication (Options::auth; docs/protocol.md, tcp "auth").
    /// Set from the hello until the peer proved it holds the secret. Outgoing: only the hello
    /// is sent meanwhile (the ops queued behind it wait). Accepted: it stays await_hello (and
    /// under hello_timeout) until the response.
    bool auth_wait = false;
    auth::Nonce own_nonce{};
    auth::Nonce peer_nonce{};

    // Protection (Auth::protect; docs/protocol.md, tcp "records"), from the end of the
    // handshake: both directions carry sealed records. Sending: the send queue is sealed into
    // [tx_sealed_pos, tx_sealed_len) of tx_sealed, then written. Receiving: bytes read go to
    // [rx_sealed_pos, rx_sealed_len) of rx_sealed; each whole record is opened into rx, where
    // process_rx parses frames as without protection.
    std::unique_ptr<seal::Direction> seal_tx, seal_rx;
    std::unique_ptr<std::byte[]> tx_sealed, rx_sealed;
    std::size_t tx_sealed_pos = 0, tx_sealed_len = 0;
    std::size_t rx_sealed_pos = 0, rx_sealed_len = 0;
    bool opened_any = false;  ///< a record was opened (an unprotected refusal can come before)
};

class TcpContext;

/// The progress domain of one context id (docs/architecture.md, "Contexts are progress
/// domains"): its connections (one per (this context, peer context) pair, both directions),
/// their epoll set, its op pool, its matcher and its spare control frames, all under its own
/// lock, which no other context's progress or posts take on the call path.
struct Lane {
    /// Releases the lane's ops into its pool, counting down `borrowed`.
    struct Releaser final : OpReleaser {
        explicit Releaser(Lane* lane) noexcept : l(lane) {}
        void release(Op* op) noexcept override;
        Lane* l;
    };

    Lane(uint8_t lane_id, const Options& o);
    ~Lane();
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;

    alignas(64) MaybeMutex mu;
    const uint8_t id;
    TcpContext* ctx = nullptr;  ///< under mu and the transport's route lock
    int epfd = -1;              ///< the lane's connections, and its bell
    /// An eventfd in `epfd` that another lane rings after handing this one a message (the
    /// lane's own, so that it outlives contexts: it may be rung after the route lock is left).
    int bell_fd = -1;
    Releaser releaser{this};
    OpPool<TcpOp> ops;
    /// Ops of this lane queued on other lanes' connections (borrow()) and not yet released:
    /// while there are some, this lane's progress also polls the others (with try_lock), so
    /// that they finish even while the lending context's thread is busy elsewhere (a handler
    /// waiting for this very transfer).
    std::atomic<uint32_t> borrowed{0};
    /// Receives posted on this lane's context, and the messages that wait for one.
    Matcher<TcpOp> match;
    IntrusiveList<Conn, ConnTag> conns;
    std::vector<Conn*> dead;
    /// Send connections by (peer, peer context): key() below.
    std::unordered_map<uint64_t, Conn*> routes;
    unsigned polls = 0;  ///< poll_once calls, to ask epoll only every kEpollEvery busy polls
    uint64_t last_setup_poll_ns = 0;
    std::vector<std::unique_ptr<Control>> controls;
    std::vector<Control*> free_controls;
    /// Messages other lanes read for this one (misrouted), under the transport's route lock;
    /// `has_inbox` tells progress to look without taking it.
    std::vector<std::unique_ptr<QueuedMsg>> inbox;
    std::atomic<bool> has_inbox{false};
    std::size_t inbox_bytes = 0;  ///< their payload (bounded like early expected messages)
    /// TcpTransport::peers_closed_ when this lane last freed the early expected messages of
    /// peers with no connection left.
    uint64_t peers_closed_seen = 0;
    /// Connections of the lane not read for back-pressure (Conn::paused): while there are
    /// some, progress looks whether the backlog went down enough to read them again.
    std::size_t paused = 0;

    static uint64_t key(const TcpAddr* peer, uint8_t remote_ctx) noexcept {
        return (uint64_t(reinterpret_cast<uintptr_t>(peer)) << 8) | remote_ctx;
    }
    /// The send connection to context `remote_ctx` of `peer`, or nullptr (under mu).
    [[nodiscard]] Conn* route(const TcpAddr* peer, uint8_t remote_ctx) const noexcept {
        auto it = routes.find(key(peer, remote_ctx));
        return it == routes.end() ? nullptr : it->second;
    }
    /// That, else any connection to `peer` not closed (put/get name no context; a client
    /// that does not listen hands a message on to the context it names), or nullptr.
    [[nodiscard]] Conn* route_or_any(const TcpAddr* peer, uint8_t remote_ctx) noexcept {
        if (Conn* c = route(peer, remote_ctx)) return c;
        for (Conn& c : conns)
            if (c.peer.impl() == peer && c.state != Conn::State::closed) return &c;
        return nullptr;
    }
};

class TcpContext final : public Context {
  public:
    TcpContext(TcpTransport* t, uint8_t id, bool thread_safe, Lane* lane);
    ~TcpContext() override;
    [[nodiscard]] int block_fd() const noexcept { return block_epfd_; }
    [[nodiscard]] Lane& lane() const noexcept { return *lane_; }
    /// Attached to its lane (context_create succeeded): its destruction detaches it.
    bool attached = false;

  private:
    TcpTransport* tt_;
    Lane* lane_;
    /// epoll over the lane's epoll set, the transport's setup set and this context's eventfd
    int block_epfd_ = -1;
};

class TcpTransport final : public Transport {
  public:
    TcpTransport(const Options& o);
    ~TcpTransport() override;
    Result<void> init(std::string_view rest);

    std::string_view name() const noexcept override { return "tcp"; }
    using Transport::context_create;
    Result<std::unique_ptr<Context>> context_create(uint8_t id,
                                                    const ContextOptions& opts) override;

    Result<Addr> addr_lookup(std::string_view address) override;
    Addr addr_self() override { return self_; }
    /// A new alias of `a` (alias_of).
    Addr addr_alias(const Addr& a) override;
    /// Interned addresses alive now (self included); for tests and diagnostics.
    [[nodiscard]] std::size_t live_addrs() const noexcept { return addrs_.live(); }
    std::string addr_to_string(const Addr& a) override;
    std::string addr_describe(const Addr& a) override;
    /// Closes every connection to `a`, in every lane, with protocol_error.
    bool addr_disconnect(const Addr& a, std::string_view why) override;
    PeerIdentity peer_identity(const Addr& a) override;
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
    /// The setup set: the listening socket and accepted connections waiting for their hello.
    /// A context's traffic is on its lane's set, in its wait_fd() (see try_wait()).
    int progress_fd() const noexcept override { return setup_epfd_; }
    bool try_wait() override;
    bool try_wait_for(Context& ctx) override;

    // --- used by TcpContext / TcpMem -----------------------------------------------------------
    void context_destroyed(TcpContext* ctx) noexcept;
    void mem_unregister(uint64_t key) noexcept;

  private:
    // setup (tcp_setup.cpp); `_locked`: under setup_mu_
    Result<Addr> lookup_locked(std::string_view address, bool numeric_only);
    /// The address interned under `canonical`, created if absent (or dying).
    /// `from`: for a new anonymous peer, where its connection comes from (kept for logs).
    Addr intern_locked(const std::string& canonical, bool anonymous,
                       const SockAddr* from = nullptr);
    /// Open a connection of lane `l` to context `remote_ctx` of `peer` (under l.mu).
    Result<Conn*> connect(Lane& l, TcpAddr* peer, uint8_t remote_ctx);
    void accept_ready_locked();
    /// Out of descriptors: accept one pending connection with the spare descriptor and close it
    /// at once (its peer sees the connection refused). False when there is no spare.
    bool refuse_one_locked();
    /// Close accepted connections whose hello did not come within Options::hello_timeout, and
    /// resume accepting after a pause.
    void expire_setup_locked();
    Conn* new_conn(int fd, bool outgoing);
    /// Set c's epoll events in its lane's set (or the setup set before it has a lane).
    Result<void> watch(Conn* c, uint32_t events);
    /// The hello of accepted connection `c` arrived: move it to the lane of the context it
    /// asked for (or the one that takes its messages), then parse what followed the hello.
    void adopt_locked(Conn* c);
    /// Look at the setup set: accepts and hellos. Takes setup_mu_ (only if free unless
    /// `wait`); never called with a lane lock held.
    void poll_setup(bool wait);
    Control* control_alloc(Lane& l);
    void control_free(Lane& l, Control* c) noexcept;

    // data path (tcp_io.cpp); `_locked`: under the lane's lock
    Result<OpId> post_send(Context& ctx, Callback cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, bool expected);
    Result<OpId> fail_async(Lane& l, Context& ctx, Callback&& cb, OpType type, Errc status,
                            const std::string& why);
    /// An op that is done at once: queued on `ctx` with `status` and `size` bytes moved.
    Result<OpId> complete_now(Lane& l, Context& ctx, Callback&& cb, OpType type, Errc status,
                              std::size_t size);
    Result<OpId> post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                          std::size_t local_off, const MemHandle& remote, std::size_t remote_off,
                          std::size_t len, const Addr& remote_addr);
    /// Lane l's connection to context `remote_ctx` of `peer` (any of its contexts when
    /// `any_ctx`), connecting if there is none and the peer listens; nullptr for an anonymous
    /// peer that l has no connection to (see borrow()).
    Result<Conn*> conn_for_locked(Lane& l, TcpAddr* peer, uint8_t remote_ctx, bool any_ctx);
    /// A send to an anonymous peer (a client that does not listen) from a lane it never
    /// connected to: queued on another lane's connection to it (setup_mu_, then that lane's
    /// lock; a rare path: a server's context answering a client of another context, or its
    /// bulk context reaching a client). `fill(op, conn)` fills the op taken from `own`.
    template <class Fill>
    Result<OpId> borrow(Lane& own, Context& ctx, Callback&& cb, OpType type, TcpAddr* peer,
                        uint8_t remote_ctx, Fill&& fill);
    void enqueue_send(Conn* c, SendItem* item, bool flush_now);
    void flush(Conn* c);
    void item_done(Conn* c, SendItem* item);
    void update_events(Conn* c);
    void poll_once(Lane& l, bool use_epoll);
    /// Poll the other lanes whose lock is free (see Lane::borrowed).
    void poll_lenders(Lane& own);
    void on_event(Conn* c, uint32_t events);
    void on_connected(Conn* c);
    /// Read and handle what `c` has to read (Conn::reading while it runs).
    void read_ready(Conn* c);
    void read_available(Conn* c);
    bool process_rx(Conn* c);
    bool start_frame(Conn* c);
    bool finish_frame(Conn* c);
    /// Authentication: the hello was read on an accepted connection (challenge or refuse it);
    /// an auth frame was read (Sink::auth). False when the connection was closed.
    bool auth_hello(Conn* c, const Hello& hello);
    bool auth_frame(Conn* c);
    // Protection (tcp_seal.cpp)
    /// Both directions of `c` carry sealed records from here (keys from the handshake's
    /// nonces); what was read past the handshake is a record's. False when it was closed.
    bool start_protection(Conn* c);
    /// What a read's result `n` on `c` means: bytes to parse, try again (EINTR), nothing more
    /// now (EAGAIN), or the connection is closed (closed here, with the reason; `mid_frame`:
    /// the peer left a frame unfinished).
    enum class ReadResult : uint8_t { data, retry, drained, closed };
    ReadResult read_result(Conn* c, ssize_t n, bool mid_frame);
    /// flush() of a protected connection: seal what is queued, write what is sealed.
    void flush_sealed(Conn* c);
    /// read_ready() of a protected connection.
    void read_sealed(Conn* c);
    /// Open the whole records read so far into rx as it has room, parsing frames as they come;
    /// false when the connection was closed.
    bool open_records(Conn* c);
    /// Refuse `c` during set-up: log, tell the peer why (best effort), close it.
    void refuse_conn(Conn* c, const std::string& why);
    /// An accepted connection whose first bytes after the handshake are not of this side's
    /// na::Auth::protect (records where frames belong, or the other way round): refused with
    /// words the client's calls carry (refuse_conn), naming this side's setting.
    void refuse_protect_mismatch(Conn* c);
    /// Write one auth frame straight to the socket (set-up only: nothing else is queued or
    /// half sent on it then). False when it could not be written whole.
    bool send_auth_direct(Conn* c, AuthStep step, Errc status, std::span<const std::byte> payload);
    /// The front of the send queue may go out now (not while authenticating, but the hello).
    [[nodiscard]] static bool sendable(Conn* c) noexcept;
    /// Does a message for `ctx_id` (expected or not) belong to lane `l`? Fast when it names
    /// l's own context; otherwise asks the route table.
    bool is_local_locked(Lane& l, uint8_t ctx_id, bool expected);
    /// The lane a message for context `ctx_id` goes to (under route_mu_): its own when it
    /// exists (and takes unexpected messages, for those), else the lowest that takes
    /// unexpected messages; nullptr when none does.
    Lane* route_target_locked(uint8_t ctx_id, bool expected) noexcept;
    /// A message read off `c` into `m` with no receive posted at its start: to a receive posted
    /// since, or queued (or refused, and logged), or handed to the lane it belongs to.
    void deliver_queued(Conn* c, QueuedMsg* m);
    /// Give a message of lane `from` to the lane it belongs to (its inbox; the message is
    /// copied into a loose QueuedMsg and `m` freed into `from`), or drop it (logged) when none
    /// takes it. `who` names the sender in the log.
    void hand_over_locked(Lane& from, QueuedMsg* m, const Addr& who);
    /// Give `m` to a receive posted on `l`, or queue it there (or drop it, logged). True when
    /// it was queued and the backlog of `l` or of its sender is now over the bounds: the
    /// connection it came on should not be read for now (pause()).
    bool deliver_local_locked(Lane& l, QueuedMsg* m, const Addr& who);
    /// Back-pressure: stop reading `c` (its lane's lock held), or read it again.
    void pause(Conn* c);
    void resume(Conn* c);
    /// Read again the paused connections of `l` whose backlogs went below half the bounds.
    void resume_paused_locked(Lane& l);
    /// Take the messages other lanes handed to `l`.
    void drain_inbox_locked(Lane& l);
    /// `c` is with `peer` from now on (Conn::peer and Conn::source), counted in its open_conns.
    void set_peer(Conn* c, Addr peer);
    /// `c`, whose peer is set, closes: its peer's count of open connections goes down, and at
    /// 0 the peers_closed_ epoch goes up (every lane then frees what that peer left early).
    void conn_unpeered(Conn* c) noexcept;
    /// Free the early expected messages in `l` from peers with no connection left (under l.mu).
    void drop_early_of_closed_locked(Lane& l) noexcept;
    void complete_recv(TcpOp* op, const Addr& source, uint8_t ctx_id, Tag tag, std::size_t size,
                       Errc status);
    Errc validate_target(const FrameHeader& h, bool write, std::byte** where);
    bool queue_reply(Conn* c, FrameType type, uint64_t cookie, Errc status, std::byte* data,
                     std::size_t len);
    void close_conn(Conn* c, Errc status, const std::string& why);
    /// Take `op`, queued with none of its bytes sent, off its connection and complete it
    /// canceled (under its connection's lane lock).
    void withdraw_unsent(TcpOp* op) noexcept;
    /// Cancel a put/get whose request is sent and whose response has not come: it completes
    /// with canceled now, and its response, when it comes, is read and dropped.
    void abandon_reply(TcpOp* op) noexcept;
    /// Close every connection of lane `l` (its context goes, or the transport).
    void close_lane_locked(Lane& l, Errc status, const std::string& why);
    /// Context `ctx` goes: its ops queued on other lanes' connections (borrow()) are withdrawn
    /// and completed canceled, or their connection is closed when they are on the wire (under
    /// setup_mu_, taking each other lane's lock).
    void withdraw_borrowed_locked(Lane& own, const Context* ctx);
    void reap_dead(Lane& l);
    static Lane& lane_of(Context& ctx) noexcept;
    void add_route(Lane& l, Conn* c);
    void drop_route(Lane& l, Conn* c);

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;  ///< interned peers, weakly (raw pointers; see TcpAddr)
    Options opts_;
    /// Guards what the contexts share: the listening socket, accepted connections until their
    /// hello, the lanes' creation, address lookups. Taken on first contact, by a context's
    /// progress every 100 µs with try_lock (or when the setup set woke it), and never per
    /// message. Order: setup_mu_, then a lane's mu, then route_mu_ or regions_mu_.
    MaybeMutex setup_mu_;
    /// close_conn's protocol-error warnings: a peer can cause them at will (log::Limiter).
    log::Limiter protocol_error_log_;
    /// Peers whose last connection closed, ever (an epoch: a lane that has seen fewer frees
    /// the early expected messages such peers left, at its next progress).
    std::atomic<uint64_t> peers_closed_{0};
    /// Leaf lock: which context each lane holds (routing misrouted messages) and the inboxes.
    MaybeSpinLock route_mu_;
    /// Leaf lock over regions_ (registrations, read by the target side of put/get).
    MaybeMutex regions_mu_;
    /// By context id, created on first use and kept until the transport goes; a pointer read
    /// outside setup_mu_ is read through the atomics.
    std::vector<std::unique_ptr<Lane>> lanes_;
    std::unique_ptr<std::atomic<Lane*>[]> lane_ptr_;
    int setup_epfd_ = -1;
    int listen_fd_ = -1;
    /// A descriptor kept open (/dev/null) to give up when accept() runs out of them: accept the
    /// pending connection with it and close it, instead of leaving it to wake epoll for ever.
    int spare_fd_ = -1;
    bool accept_paused_ = false;   ///< no spare either: the listener is out of the epoll set
    TimePoint accept_resume_{};    ///< until then (setup_mu_)
    TimePoint next_fd_warning_{};  ///< refused connections are logged once a second
    uint64_t refused_ = 0;         ///< connections refused for lack of descriptors, unlogged
    uint64_t instance_ = 0;
    Addr self_;
    std::unordered_map<uint64_t, TcpMem*> regions_;
    IntrusiveList<Conn, ConnTag> pending_;  ///< accepted, hello not yet read (setup_mu_)
    std::vector<Conn*> pending_dead_;
};

}  // namespace talaria::na::tcp
