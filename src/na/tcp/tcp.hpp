// The tcp transport: epoll over non-blocking TCP sockets, one listening socket, connections made
// on first use. Setup (addresses, registration, sockets) is in tcp_setup.cpp; the data path
// (posting, sending, the receive state machine, progress) in tcp_io.cpp. Wire format: frame.hpp
// and docs/protocol.md (tcp).
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "na/base/addr_table.hpp"
#include "na/base/matcher.hpp"
#include "na/base/op.hpp"
#include "na/base/url.hpp"
#include "na/tcp/frame.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"

namespace talaria::na::tcp {

/// Past this many unsent bytes on one connection, post_* returns Errc::again (the post that
/// crosses the bound is still accepted, so one large put always fits an idle connection).
inline constexpr std::size_t kSendQueueMaxBytes = std::size_t(64) << 20;
/// Responses (put/get replies) a peer may have waiting on one connection before we decide it is
/// flooding us without reading, and disconnect it.
inline constexpr std::size_t kMaxRepliesPerConn = 65536;
/// Size of each connection's receive buffer (headers and small payloads land here).
inline constexpr std::size_t kRxBufferSize = 64 * 1024;

class TcpTransport;
struct Conn;

struct SendTag {};
struct RmaTag {};
struct ConnTag {};

/// Something queued on a connection's send queue: a header and up to one payload span.
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
};

/// A frame the transport sends on its own (hello, put/get responses).
struct Control : SendItem {
    bool reply = false;  ///< a put/get response (counted in Conn::replies)
    /// A private copy of a get response's data, made only when its region is deregistered
    /// while the response is half sent.
    std::unique_ptr<std::byte[]> owned;
    alignas(8) std::byte payload[kMaxHelloPayload]{};
};

/// One peer. `conn` is the connection we send on (set by our own connect, or by the first
/// connection the peer opened to us); guarded by the transport lock.
///
/// Interned weakly (see na/base/addr_table.hpp): the transport's table holds a raw pointer.
/// It lives while a user Addr, a connection (Conn::peer, so a peer with `conn` set is alive),
/// a pending op (TcpOp::match_source), a queued message (QueuedMsg::source), a remote memory
/// handle (TcpMem::owner_addr) or the transport's self_ holds it. An anonymous client
/// ("tcp://~<id>") thus vanishes once its connections are closed and nobody holds its Addr.
/// The destructor may run on any thread, also under the transport lock: it only takes the
/// table's leaf lock to erase its own entries.
struct TcpAddr final : AddrImpl {
    TcpAddr(Transport* t, AddrTable* table, std::string s)
        : AddrImpl(t), str(std::move(s)), table_(table) {}
    ~TcpAddr() override;
    TcpAddr(const TcpAddr&) = delete;
    TcpAddr& operator=(const TcpAddr&) = delete;
    std::string str;  ///< canonical "tcp://host:port" or "tcp://~<instance>" (anonymous)
    SockAddr sa;
    bool anonymous = false;
    Conn* conn = nullptr;
    /// Other strings it was looked up by (table aliases), under the transport lock.
    std::vector<std::string> aliases;

  private:
    AddrTable* table_;
};

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

struct Conn : ListHook<ConnTag> {
    enum class State : uint8_t { connecting, await_hello, open, closed };
    enum class Sink : uint8_t { discard, op, queued, hello, put, get };

    int fd = -1;
    State state = State::connecting;
    bool outgoing = false;
    Addr peer;  ///< unknown on an accepted connection until its hello
    uint32_t events = 0;

    IntrusiveList<SendItem, SendTag> sendq;
    std::size_t queued_bytes = 0;
    IntrusiveList<TcpOp, RmaTag> rma_wait;
    std::size_t replies = 0;

    // Receive state: [rx_pos, rx_len) of rx holds unparsed bytes.
    std::unique_ptr<std::byte[]> rx;
    std::size_t rx_pos = 0;
    std::size_t rx_len = 0;
    bool in_payload = false;
    FrameHeader hdr;
    Sink sink = Sink::discard;
    std::byte* dest = nullptr;  ///< where the payload goes (nullptr: discard)
    uint64_t remaining = 0;     ///< payload bytes still to read
    TcpOp* rx_op = nullptr;
    QueuedMsg* rx_msg = nullptr;
    Errc rx_status = Errc::ok;
    std::byte hello_buf[kMaxHelloPayload]{};
};

class TcpContext final : public Context {
  public:
    TcpContext(TcpTransport* t, uint8_t id, bool thread_safe);
    ~TcpContext() override;
    [[nodiscard]] int block_fd() const noexcept { return block_epfd_; }

  private:
    TcpTransport* tt_;
    int block_epfd_ = -1;  ///< epoll over the transport's epoll fd and this context's eventfd
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
    /// Interned addresses alive now (self included); for tests and diagnostics.
    [[nodiscard]] std::size_t live_addrs() const noexcept { return addrs_.live(); }
    std::string addr_to_string(const Addr& a) override;
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
    int progress_fd() const noexcept override { return epfd_; }
    bool try_wait() override;

    // --- used by TcpContext / TcpMem -----------------------------------------------------------
    void context_destroyed(uint8_t id) noexcept;
    void mem_unregister(uint64_t key) noexcept;

  private:
    // setup (tcp_setup.cpp)
    Result<Addr> lookup_locked(std::string_view address, bool numeric_only);
    /// The address interned under `canonical`, created if absent (or dying).
    Addr intern_locked(const std::string& canonical);
    Result<Conn*> connect_locked(TcpAddr* peer);
    void accept_ready();
    Conn* new_conn(int fd, bool outgoing);
    Result<void> watch(Conn* c, uint32_t events);
    Control* control_alloc();
    void control_free(Control* c) noexcept;

    // data path (tcp_io.cpp)
    Result<OpId> post_send(Context& ctx, Callback cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, bool expected);
    Result<OpId> fail_async(Context& ctx, Callback&& cb, OpType type, Errc status,
                            const std::string& why);
    Result<OpId> post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                          std::size_t local_off, const MemHandle& remote, std::size_t remote_off,
                          std::size_t len, const Addr& remote_addr);
    Result<Conn*> conn_for_locked(const Addr& dest);
    void enqueue_send(Conn* c, SendItem* item, bool flush_now);
    void flush(Conn* c);
    void item_done(Conn* c, SendItem* item);
    void update_events(Conn* c);
    void poll_once(bool use_epoll);
    void on_event(Conn* c, uint32_t events);
    void on_connected(Conn* c);
    void read_ready(Conn* c);
    bool process_rx(Conn* c);
    bool start_frame(Conn* c);
    bool finish_frame(Conn* c);
    /// A message read off `c` into `m` with no receive posted at its start: to a receive posted
    /// since, or queued (or refused, and logged).
    void deliver_queued(Conn* c, QueuedMsg* m);
    void complete_recv(TcpOp* op, const Addr& source, uint8_t ctx_id, Tag tag, std::size_t size,
                       Errc status);
    Errc validate_target(const FrameHeader& h, bool write, std::byte** where);
    bool queue_reply(Conn* c, FrameType type, uint64_t cookie, Errc status, std::byte* data,
                     std::size_t len);
    void close_conn(Conn* c, Errc status, const std::string& why);
    void reap_dead();

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;  ///< interned peers, weakly (raw pointers; see TcpAddr)
    Options opts_;
    MaybeMutex mu_;
    OpPool<TcpOp> ops_;
    int epfd_ = -1;
    int listen_fd_ = -1;
    uint64_t instance_ = 0;
    Addr self_;
    std::unordered_map<uint64_t, TcpMem*> regions_;
    /// Posted receives and early messages of every context (na/base/matcher.hpp).
    Matcher<TcpOp> match_;
    IntrusiveList<Conn, ConnTag> conns_;
    std::vector<Conn*> dead_;
    unsigned polls_ = 0;  ///< poll_once calls, to ask epoll only every kEpollEvery busy polls
    std::vector<std::unique_ptr<Control>> controls_;
    std::vector<Control*> free_controls_;
};

}  // namespace talaria::na::tcp
