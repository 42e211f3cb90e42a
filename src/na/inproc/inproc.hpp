// The inproc transport: endpoints inside one process, found by name in a process-wide registry,
// exchanging messages and memory by memcpy. It exists for tests: full na semantics (queueing,
// matching, cancel, blocking progress woken from other threads) plus fault injection
// (inproc_faults.hpp), with no wire to get wrong.
//
// Locking: each context of an endpoint is a progress domain (Lane, kept in the endpoint's Port):
// its op pool, its receives and early messages, the senders and destinations it knows, under
// its own lock. A sender delivers under the receiving lane's lock only, never holding its own.
// What the lanes of an endpoint share (its registrations, fault injection and the delayed
// sends it makes) sits under the Port's endpoint lock, taken off the message path (faults are
// looked at through an atomic flag first). Order: the endpoint lock, then a lane's, then the
// leaf locks (the address table's, the registry's after an endpoint lock or alone); a lane's
// lock is never held while another lane's or an endpoint lock is taken, except that a lane
// interns addresses (intern_mu_, a leaf).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "na/base/addr_table.hpp"
#include "na/base/op.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"

namespace talaria::na::inproc {

/// Largest message (unexpected or expected).
inline constexpr std::size_t kMaxMsgSize = 64 * 1024;
/// Longest endpoint name ("inproc://<name>").
inline constexpr std::size_t kMaxNameLen = 128;
inline constexpr std::string_view kScheme = "inproc://";

class InprocTransport;

struct Lane;

/// What peers hold of an endpoint: its lock, its lanes and, while it is open, the transport
/// behind it. Shared so that a sender that resolved the port may still lock it (or one of its
/// lanes) while the endpoint closes.
struct Port {
    Port(bool thread_safe, uint64_t id, std::string n, std::size_t max_contexts);
    ~Port();
    MaybeMutex mu;
    InprocTransport* t = nullptr;  ///< guarded by mu; nullptr once the endpoint closed
    std::atomic<bool> open{true};  ///< false from the moment it leaves the registry
    const uint64_t uid;            ///< process-unique endpoint id (memory handles name it)
    const std::string name;
    const std::size_t max_contexts;
    /// By context id, created with the first context of that id (under mu) and kept as long
    /// as the port: a sender reads the pointer without a lock.
    std::unique_ptr<std::atomic<Lane*>[]> lanes;
    [[nodiscard]] Lane* lane(uint8_t id) const noexcept {
        return id < max_contexts ? lanes[id].load(std::memory_order_acquire) : nullptr;
    }
};

/// An interned peer address: the peer's name and its port, resolved at first use.
///
/// Interned weakly (see na/base/addr_table.hpp): the endpoint's table holds a raw pointer, and
/// the address lives while a user Addr, a pending op (InprocOp::peer, a completion's source)
/// or a queued message (Incoming::source) holds it. Its destructor may run on any thread, also
/// under the endpoint's lock: it takes only the table's leaf lock to erase its entry.
class InprocAddr final : public AddrImpl {
  public:
    InprocAddr(Transport* t, AddrTable* table, std::string n)
        : AddrImpl(t), name(std::move(n)), table_(table) {}
    ~InprocAddr() override { table_->remove(name, this); }
    InprocAddr(const InprocAddr&) = delete;
    InprocAddr& operator=(const InprocAddr&) = delete;
    const std::string name;
    // Guarded by the owning endpoint's lock.
    std::weak_ptr<Port> port;
    bool resolved_once = false;  ///< a later failure to resolve means disconnected

  private:
    AddrTable* table_;
};

/// The InprocAddr of an address of this transport (an InprocAddr or an AddrAlias of one).
inline InprocAddr* peer_of(const Addr& a) noexcept {
    return static_cast<InprocAddr*>(a.impl()->canonical());
}

/// A registration (local) or a handle deserialized from a peer (remote). The owner checks every
/// access against its own registration table, never trusting a handle's fields.
class InprocMem final : public MemImpl {
  public:
    InprocMem(InprocTransport* t, uint64_t base, uint64_t length, Access access, bool local,
              uint64_t owner_uid, uint64_t reg_id) noexcept;
    ~InprocMem() override;
    const uint64_t owner_uid;
    const uint64_t reg_id;
};

struct InprocOp : Op {
    enum class Where : uint8_t { none, unexpected_list, expected_list, delay_list };
    Where where = Where::none;
    bool expected = false;  ///< send/recv: expected kind
    uint8_t dest_ctx = 0;   ///< delayed send
    Tag tag = 0;
    Errc result = Errc::ok;           ///< delayed send: outcome of its delivery
    std::byte* buf = nullptr;         ///< recv: destination buffer
    std::size_t cap = 0;              ///< recv: its capacity
    Addr peer;                        ///< recv_expected: source; delayed send: destination
    TimePoint due{};                  ///< delayed send: when to deliver
    std::shared_ptr<Port> dest_port;  ///< delayed send
    std::vector<std::byte> payload;   ///< delayed send: copy of the message
};

/// A message that arrived before a receive matched it.
struct Incoming {
    Addr source;
    Tag tag = 0;
    uint8_t ctx_id = 0;
    std::vector<std::byte> data;
};

class InprocContext;

/// The progress domain of one context id of an endpoint: what a message to that context, and a
/// post on it, touches. Lives in the Port (senders reach it without the endpoint lock).
struct Lane {
    Lane(bool thread_safe, uint8_t lane_id, std::size_t max_ops)
        : mu(thread_safe), id(lane_id), ops(max_ops, thread_safe) {}
    alignas(64) MaybeMutex mu;
    const uint8_t id;
    InprocTransport* t = nullptr;   ///< under mu; nullptr once the endpoint closed
    InprocContext* ctx = nullptr;   ///< under mu; nullptr while no context has this id
    bool takes_unexpected = false;  ///< under mu, with ctx
    OpPool<InprocOp> ops;
    IntrusiveList<InprocOp> recvs;           ///< unexpected receives, in post order
    std::deque<Incoming> queued;             ///< unexpected messages, in arrival order
    IntrusiveList<InprocOp> expected_recvs;  ///< matched on (peer, tag)
    std::deque<Incoming> expected_queued;
    /// Senders by name, as this endpoint's addresses (an alias each): the source of what
    /// they deliver here. Dropped when the sender is lost and when the context goes.
    std::unordered_map<std::string, Addr> sources;
    /// Destinations this lane's posts resolved, by name (while their endpoint is open).
    std::unordered_map<std::string, std::shared_ptr<Port>> routes;
};

class InprocContext final : public Context {
  public:
    InprocContext(InprocTransport* t, uint8_t id, bool thread_safe, Lane* lane);
    ~InprocContext() override;
    [[nodiscard]] Lane& lane() const noexcept { return *lane_; }

  private:
    InprocTransport* t_;
    Lane* lane_;
};

struct FaultState {
    unsigned drop_next = 0;
    unsigned fail_next = 0;
    Errc fail_code = Errc::io_error;
    Duration delay{0};
};

class InprocTransport final : public Transport {
  public:
    InprocTransport(std::string name, const Options& o, int epfd, int timerfd);
    ~InprocTransport() override;

    [[nodiscard]] std::string_view name() const noexcept override { return "inproc"; }
    using Transport::context_create;
    Result<std::unique_ptr<Context>> context_create(uint8_t id,
                                                    const ContextOptions& opts) override;

    Result<Addr> addr_lookup(std::string_view address) override;
    Addr addr_self() override;
    /// A new alias of `a` (alias_of).
    Addr addr_alias(const Addr& a) override;
    std::string addr_to_string(const Addr& a) override;
    std::size_t addr_serialize_size(const Addr& a) override;
    Result<std::size_t> addr_serialize(const Addr& a, std::span<std::byte> out) override;
    Result<Addr> addr_deserialize(std::span<const std::byte> in) override;

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

    // --- used by contexts, memory handles, peers and the fault API --------------------------
    void context_closing(InprocContext& ctx) noexcept;
    void deregister(uint64_t reg_id) noexcept;
    /// Deliver one message into lane `l` of this endpoint. Call under l.mu with l.t == this
    /// and a context on the lane that takes it.
    void deliver_lane_locked(Lane& l, const std::string& src_name, bool expected, uint8_t ctx_id,
                             Tag tag, std::span<const std::byte> data);
    /// `peer` went away (closed, or the link was broken): its pending ops fail with
    /// disconnected. Call under port().mu (it takes each lane's lock).
    void peer_lost_locked(const std::string& peer) noexcept;
    [[nodiscard]] Port& port() const noexcept { return *port_; }
    [[nodiscard]] std::shared_ptr<Port> port_shared() const noexcept { return port_; }
    [[nodiscard]] const std::string& endpoint_name() const noexcept { return name_; }
    /// Interned addresses alive now; for tests and diagnostics.
    [[nodiscard]] std::size_t live_addrs() const noexcept { return addrs_.live(); }
    FaultState& faults() noexcept { return faults_; }  ///< under port().mu
    /// After a change to faults() (under port().mu): tell the posts whether to look at them.
    void refresh_faulty_locked() noexcept;

  private:
    struct Reg {
        uint64_t base;
        uint64_t length;
        Access access;
    };
    /// A resolved destination: the port, and a reference when it did not come from the lane's
    /// cache (which otherwise keeps it alive).
    struct Route {
        Port* port = nullptr;
        std::shared_ptr<Port> hold;
    };

    static Lane& lane_of(Context& ctx) noexcept;
    Result<OpId> post_send(Context& ctx, Callback cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, bool expected);
    Result<OpId> post_rma(Context& ctx, Callback cb, const MemHandle& local, std::size_t local_off,
                          const MemHandle& remote, std::size_t remote_off, std::size_t len,
                          const Addr& remote_addr, bool is_put);
    Result<void> check_ctx(const Context& ctx, std::string_view what) const;
    Result<InprocAddr*> check_addr(const Addr& a, std::string_view what) const;
    /// Under port().mu: apply a pending "fail next" fault; true when the op was completed.
    bool fault_fail_locked(InprocOp* op) noexcept;
    /// The address interned under `name` (intern_mu_, a leaf).
    Addr intern(std::string_view name);
    /// Under port().mu.
    Result<std::shared_ptr<Port>> resolve_locked(InprocAddr& a);
    /// The port of `a` for a post on lane `l`: from the lane's cache while it is open, else
    /// resolved (under port().mu) and cached the first time. Takes l.mu; call without it.
    Result<Route> route(Lane& l, InprocAddr& a);
    /// The source address of messages from `name` delivered on `l` (under l.mu).
    const Addr& source_locked(Lane& l, const std::string& name);
    void fill_recv(InprocOp* op, const Addr& src, Tag tag, uint8_t ctx_id,
                   std::span<const std::byte> data) noexcept;
    void arm_timer_locked() noexcept;
    void run_due_deliveries();

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;  ///< interned peers, weakly (see InprocAddr); find+add under intern_mu_
    const std::string name_;
    const Options opts_;
    const int epfd_;
    const int timerfd_;
    MaybeMutex intern_mu_;
    std::shared_ptr<Port> port_;
    /// Anything in faults_, delayed_ or delivering_: posts and progress look under port().mu.
    std::atomic<bool> faulty_{false};
    // Guarded by port_->mu.
    IntrusiveList<InprocOp> delayed_;
    bool delivering_ = false;
    std::unordered_map<uint64_t, Reg> regs_;
    FaultState faults_;
};

/// Is `name` acceptable as an endpoint name: 1..kMaxNameLen of [A-Za-z0-9._:-].
bool valid_name(std::string_view name) noexcept;

/// The port registered under `name`, if open.
std::shared_ptr<Port> registry_find(std::string_view name);

}  // namespace talaria::na::inproc
