// The ucx transport: UCP (UCX 1.12+) under the na interface. One UCP context and one worker per
// transport, configured from the address string without touching the process environment;
// endpoints made on first use (by sockaddr through a listener, or by packed worker address);
// one active-message id carrying hello, unexpected and expected messages, matched in software;
// put/get with ucp_put_nbx/ucp_get_nbx on ucp_mem_map'ed regions whose packed rkeys travel in
// the serialized memory handle (ucx+sm: process_vm_readv/writev, see init_direct_rma()). Setup
// (config, worker, listener, addresses, endpoints, registration) is in ucx_setup.cpp; the data path
// (posting, the AM handler, completions, endpoint failure, progress) in ucx_io.cpp. Wire format:
// wire.hpp and docs/protocol.md (ucx).
#pragma once

#include <ucp/api/ucp.h>

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
#include "na/ucx/wire.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"

namespace talaria::na::ucx {

class UcxTransport;
struct Ep;

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

struct InflightTag {};
struct EpTag {};

enum class OpState : uint8_t {
    idle,
    recv_posted,  ///< on a posted-receive list (software matching), cancelable
    inflight,     ///< a UCX request is pending (send, put/flush, get)
};

/// A user operation.
struct UcxOp : Op, ListHook<InflightTag> {
    OpState state = OpState::idle;
    void* req = nullptr;       ///< the pending UCX request (inflight)
    std::byte* buf = nullptr;  ///< recv: destination
    std::size_t cap = 0;       ///< recv: capacity
    Addr match_source;         ///< recv_expected
    Tag match_tag = 0;         ///< recv_expected
    UcxTransport* owner = nullptr;
    alignas(8) std::byte header[kMsgHeaderSize]{};  ///< send: the AM header (UCX may keep it)
};

/// An incoming message nobody had posted a receive for yet (queued by the Matcher), or one not
/// deliverable yet (held_: its sender's hello or its turn has not come).
struct UcxMsg : QueuedMsg {
    bool bye = false;       ///< held_: a bye
    uint64_t instance = 0;  ///< held_: the sender's instance
    uint32_t seq = 0;       ///< held_: its place in the sender's stream
};

/// Messages that cannot be delivered yet are held, at most this many: from a sender whose
/// hello has not arrived, or ahead of their turn in the sender's stream (UCP may reorder the
/// messages sent while an endpoint is being wired up).
inline constexpr std::size_t kMaxHeldMsgs = 4096;

/// One peer, interned weakly (na/base/addr_table.hpp). Alive while a user Addr, an endpoint
/// (Ep::peer), a pending op, a queued message, a remote memory handle or self_ holds it.
/// Fields other than `str`/`key`/`instance` are guarded by the transport lock.
struct UcxAddr final : AddrImpl {
    UcxAddr(UcxTransport* t, std::string s, std::string k);
    ~UcxAddr() override;
    UcxAddr(const UcxAddr&) = delete;
    UcxAddr& operator=(const UcxAddr&) = delete;
    std::string str;  ///< canonical "ucx+<sub>://<key>"
    std::string key;  ///< table key: "host:port", "~<instance>" or the worker address hex
    SockAddr sa;      ///< sockaddr mode
    std::vector<std::byte> worker_addr;  ///< worker mode: the packed worker address
    bool anonymous = false;              ///< a client that does not listen ("~<instance>")
    bool dead = false;  ///< an endpoint to it failed: its ops fail with `dead_status`
    Errc dead_status = Errc::disconnected;
    std::string dead_why;
    Ep* ep = nullptr;       ///< the endpoint we send on
    uint64_t instance = 0;  ///< from its hello (0: not heard from yet)
    uint32_t tx_seq = 0;    ///< next sequence number of our messages to it
    uint32_t rx_next = 0;   ///< sequence number of its next message to deliver

  private:
    UcxTransport* ut_;
};

/// One UCP endpoint we created (outgoing, or accepted from a listener's connection request).
struct Ep : ListHook<EpTag> {
    ucp_ep_h h = nullptr;
    UcxTransport* t = nullptr;
    uint64_t serial = 0;  ///< unique per transport (remote keys are unpacked per endpoint)
    TimePoint created{};  ///< when ucp_ep_create returned (blocking waits spin while it is new)
    Addr peer;            ///< outgoing: at creation; accepted: from the peer's hello
    bool outgoing = false;
    uint64_t client_id = 0;  ///< accepted: the peer's instance, from its connection request
    bool failed = false;     ///< its error callback ran
    bool closing = false;    ///< ucp_ep_close_nbx called; `close_req` may be pending
    ucs_status_t fail_status = UCS_OK;
    void* close_req = nullptr;
    alignas(8) std::byte hello_hdr[kMsgHeaderSize]{};
    std::vector<std::byte> hello;  ///< our hello payload (UCX may send it after we return)
};

/// A registration (local: ucp_mem_map'ed here) or a deserialized peer's handle (remote).
struct UcxMem final : MemImpl {
    UcxMem(UcxTransport* t, uint64_t base, uint64_t length, Access access, bool local);
    ~UcxMem() override;
    UcxTransport* ut;
    ucp_mem_h memh = nullptr;     ///< local
    std::vector<std::byte> rkey;  ///< packed remote key (local: ours; remote: the owner's)
    std::string owner;            ///< owner's address string (remote)
    Addr owner_addr;              ///< interned owner (remote)
    ucp_rkey_h rkey_h = nullptr;  ///< unpacked on endpoint `rkey_ep`
    uint64_t rkey_ep = 0;         ///< Ep::serial the rkey was unpacked for
    uint32_t pid = 0;             ///< remote: owner's process for process_vm_* (0: use ucp_put/get)
    uint32_t pidns = 0;           ///< remote: owner's pid namespace
};

class UcxContext final : public Context {
  public:
    UcxContext(UcxTransport* t, uint8_t id, bool thread_safe);
    ~UcxContext() override;
    [[nodiscard]] int block_fd() const noexcept { return block_epfd_; }

  private:
    UcxTransport* ut_;
    int block_epfd_ = -1;  ///< epoll over the worker's event fd and this context's eventfd
};

class UcxTransport final : public Transport {
  public:
    explicit UcxTransport(const Options& o);
    ~UcxTransport() override;
    Result<void> init(std::string_view sub, std::string_view rest);

    std::string_view name() const noexcept override { return scheme_; }
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
    int progress_fd() const noexcept override { return efd_; }
    bool try_wait() override;

    // --- for tests and diagnostics -----------------------------------------------------------
    /// The UCX configuration our context was read with (key=value lines of what we set).
    [[nodiscard]] const std::vector<std::pair<std::string, std::string>>& ucx_settings()
        const noexcept {
        return settings_;
    }
    /// ucp_ep_print_info of the endpoint we send to `a` on (empty if none yet): the lanes and
    /// the UCT transports they use.
    std::string ep_info(const Addr& a);
    [[nodiscard]] Mode mode() const noexcept { return spec_.mode; }
    /// True if put/get to handles of ucx+sm peers copy with process_vm_readv/writev (the
    /// owner's pid travels in the handle) instead of ucp_put_nbx/ucp_get_nbx.
    [[nodiscard]] bool direct_rma() const noexcept { return pidns_ != 0; }

    // --- used by UcxContext / UcxMem / UcxAddr and the UCX callbacks ---------------------------
    void context_destroyed(uint8_t id) noexcept;
    void mem_release(UcxMem* m) noexcept;
    void addr_destroyed(UcxAddr* a) noexcept;
    void on_conn_request(ucp_conn_request_h req);
    void on_ep_error(Ep* e, ucs_status_t status);
    void on_op_done(UcxOp* op, ucs_status_t status);
    ucs_status_t on_am(const void* header, std::size_t header_len, void* data, std::size_t len,
                       const ucp_am_recv_param_t* param);

  private:
    // setup (ucx_setup.cpp)
    Result<void> init_context();
    Result<void> init_worker();
    Result<void> init_listener();
    /// ucx+sm: enable put/get by process_vm_readv/writev if this process may use them.
    void init_direct_rma() noexcept;
    Result<Addr> lookup_locked(std::string_view address, bool from_wire);
    Addr intern_locked(const std::string& key);
    /// The endpoint to send to `peer` on, created (with our hello queued on it) if absent.
    Result<Ep*> ep_for_locked(UcxAddr* peer);
    Result<Ep*> ep_create_locked(const ucp_ep_params_t& params, bool outgoing,
                                 const std::string& who);
    void send_hello_locked(Ep* e);
    void close_ep_locked(Ep* e);
    void reap_closed_locked();
    Error ucs_error(Errc code, std::string_view call, ucs_status_t st,
                    std::string_view detail = {}) const;

    // data path (ucx_io.cpp)
    Result<OpId> post_send(Context& ctx, Callback cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, bool expected);
    Result<OpId> fail_async(Context& ctx, Callback&& cb, OpType type, Errc status,
                            const std::string& why);
    Result<OpId> post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                          std::size_t local_off, const MemHandle& remote, std::size_t remote_off,
                          std::size_t len, const Addr& remote_addr);
    /// put/get by process_vm_writev/readv into the owner process `pid`: ok, or why not.
    static Errc copy_direct(bool is_put, uint32_t pid, void* local, uint64_t remote,
                            std::size_t len, std::string& why) noexcept;
    /// Finish a just-issued UCX operation: complete at once, fail, or track its request.
    void track_locked(UcxOp* op, ucs_status_ptr_t r, const char* call);
    void complete_recv(UcxOp* op, const Addr& source, uint8_t ctx_id, Tag tag, std::size_t size,
                       Errc status);
    void deliver_locked(const MsgHeader& h, const Addr& source, const std::byte* data,
                        std::size_t len);
    /// A message from a known sender: deliver it if it is its turn (then any held ones whose
    /// turn came), else hold it.
    void sequence_locked(const MsgHeader& h, UcxAddr* source, std::span<const std::byte> data);
    void hold_locked(const MsgHeader& h, std::span<const std::byte> data);
    /// Deliver held messages whose sender is known and whose turn it is.
    void release_held_locked();
    void on_hello_locked(const MsgHeader& h, std::span<const std::byte> payload);
    void handle_failures_locked();
    /// `peer` is gone (an endpoint failed, or it said bye): fail what waits for it, close its
    /// endpoints, and let a later lookup of its name make a fresh address.
    void peer_gone_locked(const Addr& peer, Errc status, const std::string& why);
    /// Tell every peer we have an endpoint to that we are closing (transport destructor).
    void say_bye_locked();
    void progress_locked();

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;
    Options opts_;
    Spec spec_;
    std::string scheme_;  ///< "ucx+tcp"
    MaybeMutex mu_;       ///< guards everything below and every call into the worker
    MaybeMutex inst_mu_;  ///< leaf lock of instances_ (UcxAddr's destructor takes it)
    OpPool<UcxOp> ops_;
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
    ucp_listener_h listener_ = nullptr;
    int efd_ = -1;
    uint64_t instance_ = 0;
    uint64_t ep_serial_ = 0;
    bool closing_ = false;  ///< in the destructor: callbacks complete nothing
    uint32_t pid_ = 0;      ///< ours, advertised in handles when pidns_ != 0
    uint32_t pidns_ = 0;    ///< our pid namespace; nonzero only for ucx+sm (peers on this host)
    Addr self_;
    std::vector<std::pair<std::string, std::string>> settings_;
    std::unordered_map<uint64_t, UcxAddr*> instances_;  ///< peers' instance ids (weak)
    uint64_t last_instance_ = 0;  ///< the last sender's instance, and its address (on_am)
    Addr last_source_;
    /// Posted receives and early messages of every context (na/base/matcher.hpp); its message
    /// storage also holds held_.
    Matcher<UcxOp, UcxMsg> match_;
    IntrusiveList<UcxMsg> held_;  ///< not deliverable yet (kMaxHeldMsgs), arrival order
    std::size_t held_count_ = 0;
    IntrusiveList<UcxOp, InflightTag> inflight_;
    IntrusiveList<Ep, EpTag> eps_;          ///< live endpoints
    IntrusiveList<Ep, EpTag> closing_eps_;  ///< being closed (close_req pending)
    std::vector<Ep*> failed_;               ///< error callback ran, not handled yet
    std::vector<Addr> byes_;                ///< peers that said bye, not handled yet
};

/// Errc for a UCS status of a failed operation or endpoint.
Errc errc_of(ucs_status_t st) noexcept;

}  // namespace talaria::na::ucx
