// The network abstraction (na): one interface over every transport.
//
// A Transport is opened from an address string ("inproc://name", "sm://", "tcp://host:port").
// Operations are posted on a Context; each completes exactly once, by queueing its Callback on
// that Context, which runs it from Context::trigger() -- never from inside a post_* call or from
// deep inside the transport. Context::progress() drives the transport.
//
// Ownership (see docs/architecture.md):
//  - Message buffers passed to post_* belong to the caller but must stay valid and untouched
//    until the operation's callback has run.
//  - Registered memory must stay valid until its MemHandle is destroyed, and must not be
//    deregistered while a put/get using it is in flight.
//  - Addr, MemHandle, MsgBuffer and Context objects must all be destroyed before their
//    Transport. Destroying a Context completes nothing: cancel and drain it first.
//
// Threading: with Options::thread_safe (the default), any thread may post operations and each
// Context may be progressed/triggered by one thread at a time (different contexts by
// different threads). Without it, the caller promises a single thread and the transport
// takes no locks.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "talaria/util/clock.hpp"
#include "talaria/util/fork_guard.hpp"
#include "talaria/util/inplace_function.hpp"
#include "talaria/util/result.hpp"

namespace talaria::na {

class Transport;
class Context;
struct Op;

using Tag = uint32_t;

/// Access granted to remote peers on a registered region.
/// read_only: peers may get from it; write_only: peers may put into it; read_write: both.
enum class Access : uint8_t { read_only = 1, write_only = 2, read_write = 3 };

enum class OpType : uint8_t {
    send_unexpected,
    send_expected,
    recv_unexpected,
    recv_expected,
    put,
    get,
    user,  ///< a callback queued with Context::post()
};
std::string_view op_type_name(OpType t) noexcept;

// ---------------------------------------------------------------------------------------------
// Addresses

/// Base of every transport's address object. Transports intern addresses: one AddrImpl per
/// peer, so two Addr compare equal exactly when they point at the same AddrImpl.
class AddrImpl {
  public:
    explicit AddrImpl(Transport* t) noexcept : transport_(t) {}
    /// An alias of `canonical` (which must outlive it: hold a reference): a transport may hand
    /// out several objects for one endpoint, e.g. one per connection so that the contexts
    /// receiving from one peer do not all write one reference count. Addr compares canonicals.
    AddrImpl(Transport* t, AddrImpl* canonical) noexcept : canonical_(canonical), transport_(t) {}
    AddrImpl(const AddrImpl&) = delete;
    AddrImpl& operator=(const AddrImpl&) = delete;
    virtual ~AddrImpl() = default;
    [[nodiscard]] Transport* transport() const noexcept { return transport_; }
    /// The object that stands for this endpoint (itself unless this is an alias).
    [[nodiscard]] AddrImpl* canonical() const noexcept { return canonical_; }

    /// For transports that intern weakly (their table holds raw pointers): take one more
    /// reference unless the count already dropped to zero, i.e. the address is being destroyed
    /// (its destructor is about to remove it from the table). Wrap the reference taken with
    /// Addr::adopt. Call only while the object is known to be allocated (e.g. under the lock
    /// its destructor must take to leave the table).
    bool try_ref() noexcept {
        uint32_t n = refs_.load(std::memory_order_relaxed);
        while (n != 0)
            if (refs_.compare_exchange_weak(n, n + 1, std::memory_order_acquire,
                                            std::memory_order_relaxed))
                return true;
        return false;
    }
    /// The current reference count (a snapshot: other threads may change it at once).
    [[nodiscard]] uint32_t ref_count() const noexcept {
        return refs_.load(std::memory_order_acquire);
    }
    /// The process behind this address is gone for good, and another may take its name (sm: a
    /// dead peer): the layer above asks Transport::addr_current who answers now. One relaxed
    /// load, on the canonical object; set once, by its transport.
    [[nodiscard]] bool superseded() const noexcept {
        return canonical_->superseded_.load(std::memory_order_relaxed);
    }
    void mark_superseded() noexcept {
        canonical_->superseded_.store(true, std::memory_order_relaxed);
    }
    /// One more message of this peer that the layer above could not read (core: a header that
    /// does not decode): how many in a row. The layer above disconnects a peer that keeps
    /// sending them (Transport::addr_disconnect), and clears the count at a good message.
    uint32_t note_malformed() noexcept {
        return canonical_->malformed_.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    void clear_malformed() noexcept {
        if (canonical_->malformed_.load(std::memory_order_relaxed) != 0) [[unlikely]]
            canonical_->malformed_.store(0, std::memory_order_relaxed);
    }

  private:
    friend class Addr;
    std::atomic<uint32_t> refs_{0};
    std::atomic<bool> superseded_{false};
    std::atomic<uint32_t> malformed_{0};
    AddrImpl* canonical_ = this;
    Transport* transport_;
};

/// A reference-counted handle to a peer's address. Copy shares, move steals.
class Addr {
  public:
    Addr() noexcept = default;
    /// Takes a new reference on `p` (may be nullptr).
    explicit Addr(AddrImpl* p) noexcept : p_(p) {
        if (p_) p_->refs_.fetch_add(1, std::memory_order_relaxed);
    }
    /// Wraps a reference the caller already holds (from AddrImpl::try_ref) without taking
    /// another one: the returned Addr releases it.
    [[nodiscard]] static Addr adopt(AddrImpl* p) noexcept {
        Addr a;
        a.p_ = p;
        return a;
    }
    Addr(const Addr& o) noexcept : Addr(o.p_) {}
    Addr(Addr&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    Addr& operator=(const Addr& o) noexcept {
        Addr(o).swap(*this);
        return *this;
    }
    Addr& operator=(Addr&& o) noexcept {
        Addr(std::move(o)).swap(*this);
        return *this;
    }
    ~Addr() { reset(); }

    void reset() noexcept {
        if (p_ && p_->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy(p_);
        p_ = nullptr;
    }
    void swap(Addr& o) noexcept { std::swap(p_, o.p_); }
    [[nodiscard]] bool valid() const noexcept { return p_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }
    [[nodiscard]] AddrImpl* impl() const noexcept { return p_; }
    template <class T>
    [[nodiscard]] T* as() const noexcept {
        return static_cast<T*>(p_);
    }
    /// Same endpoint: the same object, or aliases of one (AddrImpl::canonical).
    friend bool operator==(const Addr& a, const Addr& b) noexcept {
        return a.p_ == b.p_ || (a.p_ && b.p_ && a.p_->canonical() == b.p_->canonical());
    }

  private:
    /// Deletes the last reference's object, except in a child that inherited its transport
    /// across fork(): the child leaves the parent's peers (and their connections) alone.
    static void destroy(AddrImpl* p) noexcept;
    AddrImpl* p_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Memory registration

/// Base of every transport's memory handle, local (registered here) or remote (deserialized).
class MemImpl {
  public:
    MemImpl(Transport* t, uint64_t base, uint64_t length, Access access, bool local) noexcept
        : transport_(t), base_(base), length_(length), access_(access), local_(local) {}
    MemImpl(const MemImpl&) = delete;
    MemImpl& operator=(const MemImpl&) = delete;
    virtual ~MemImpl() = default;

    [[nodiscard]] Transport* transport() const noexcept { return transport_; }
    /// Virtual address of the region in its owner's address space.
    [[nodiscard]] uint64_t base() const noexcept { return base_; }
    [[nodiscard]] uint64_t length() const noexcept { return length_; }
    [[nodiscard]] Access access() const noexcept { return access_; }
    /// True if registered in this process, false if deserialized from a peer.
    [[nodiscard]] bool local() const noexcept { return local_; }

  private:
    Transport* transport_;
    uint64_t base_;
    uint64_t length_;
    Access access_;
    bool local_;
};

/// Owning, move-only handle on a registration. Destroying a local handle deregisters it
/// (except in a child that inherited its transport across fork(): the parent's registration
/// stays as it is).
class MemHandle {
  public:
    MemHandle() noexcept = default;
    explicit MemHandle(std::unique_ptr<MemImpl> p) noexcept : p_(p.release()) {}
    [[nodiscard]] bool valid() const noexcept { return p_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }
    [[nodiscard]] MemImpl* impl() const noexcept { return p_.get(); }
    template <class T>
    [[nodiscard]] T* as() const noexcept {
        return static_cast<T*>(p_.get());
    }
    MemImpl* operator->() const noexcept { return p_.get(); }
    void reset() noexcept { p_.reset(); }

  private:
    struct Release {
        void operator()(MemImpl* p) const noexcept;
    };
    std::unique_ptr<MemImpl, Release> p_;
};

// ---------------------------------------------------------------------------------------------
// Message buffers

/// A buffer for messages, allocated by the transport (it may be pre-registered or specially
/// aligned). Move-only; frees itself through its transport.
class MsgBuffer {
  public:
    MsgBuffer() noexcept = default;
    MsgBuffer(Transport* owner, std::byte* data, std::size_t size, void* priv) noexcept
        : owner_(owner), data_(data), size_(size), priv_(priv) {}
    MsgBuffer(MsgBuffer&& o) noexcept { *this = std::move(o); }
    MsgBuffer& operator=(MsgBuffer&& o) noexcept;
    MsgBuffer(const MsgBuffer&) = delete;
    MsgBuffer& operator=(const MsgBuffer&) = delete;
    ~MsgBuffer();

    [[nodiscard]] std::byte* data() const noexcept { return data_; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] std::span<std::byte> span() const noexcept { return {data_, size_}; }
    /// Transport-private data (e.g. a registration descriptor).
    [[nodiscard]] void* priv() const noexcept { return priv_; }
    [[nodiscard]] bool valid() const noexcept { return data_ != nullptr; }

  private:
    Transport* owner_ = nullptr;
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    void* priv_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Operations and completions

/// What a callback learns about a finished operation.
struct Completion {
    OpType type = OpType::send_unexpected;
    Errc status = Errc::ok;  ///< ok, canceled, disconnected, timeout, access_denied, ...
    Tag tag = 0;             ///< recv: the message's tag
    uint8_t context_id = 0;  ///< recv: the destination context id the sender named
    std::size_t size = 0;    ///< recv: bytes received; put/get: bytes moved
    Addr source;             ///< recv: the sender
};

/// What one context completed, by operation type (index: OpType), counted as trigger() runs
/// each completion (Context::op_counts).
struct OpCounts {
    static constexpr std::size_t kTypes = std::size_t(OpType::user) + 1;
    std::array<uint64_t, kTypes> ok{};
    std::array<uint64_t, kTypes> failed{};    ///< any status but ok and canceled
    std::array<uint64_t, kTypes> canceled{};  ///< canceled (Context::cancel, a closing context)
    std::array<uint64_t, kTypes> bytes{};     ///< of those ok: received (recv), moved (put/get)
    void merge(const OpCounts& o) noexcept {
        for (std::size_t i = 0; i < kTypes; ++i) {
            ok[i] += o.ok[i];
            failed[i] += o.failed[i];
            canceled[i] += o.canceled[i];
            bytes[i] += o.bytes[i];
        }
    }
};

/// What a transport's links did (Transport::link_counts), counted as it happens. What a
/// transport can see differs (docs/transports.md): inproc has no links, ofi's rxm and UCX make
/// and retry their connections out of sight.
enum class LinkEvent : uint8_t {
    connected,       ///< a link this process opened to a peer came up
    accepted,        ///< a link a peer opened to this process came up
    connect_failed,  ///< an attempt to open a link failed (refused, unreachable, denied)
    lost,            ///< a link that was up went down (the peer left, an error), not by close
    backpressure,    ///< a send found the link full and waited for room (or was retried)
};
std::string_view link_event_name(LinkEvent e) noexcept;

struct LinkCounts {
    static constexpr std::size_t kEvents = std::size_t(LinkEvent::backpressure) + 1;
    std::array<uint64_t, kEvents> events{};  ///< index: LinkEvent
    [[nodiscard]] uint64_t operator[](LinkEvent e) const noexcept { return events[std::size_t(e)]; }
    void merge(const LinkCounts& o) noexcept {
        for (std::size_t i = 0; i < kEvents; ++i)
            events[i] += o.events[i];
    }
};

/// Completion callback. Runs from Context::trigger() on the thread that triggers.
using Callback = InplaceFunction<void(const Completion&), 48>;

/// Names a posted operation, for cancel(). Stale ids (the operation finished and its slot was
/// reused) are detected by the generation and rejected with Errc::not_found.
struct OpId {
    Op* op = nullptr;
    uint64_t gen = 0;
    [[nodiscard]] bool valid() const noexcept { return op != nullptr; }
};

// ---------------------------------------------------------------------------------------------
// Transport

/// Shared-secret authentication of connections (Options::auth). Both ends of a tcp connection
/// prove at set-up that they hold the same secret, by HMAC-SHA256 over a nonce from each side
/// (docs/protocol.md, tcp "auth"); a peer that cannot is refused before any of its frames
/// reaches a context, and both sides' operations on that connection fail with
/// Errc::access_denied (the reason is logged on both sides). ucx in host:port mode
/// ("ucx+tcp://host:port") runs the same exchange at its bootstrap port and signs every hello
/// with the session key it leaves; ofi runs it as messages between the two processes before
/// any other (docs/protocol.md). Both ends must agree: a server with a secret refuses clients
/// without one, and a client with one refuses a server without. sm needs none (only processes
/// of the same user connect, or of Options::sm_group: SO_PEERCRED); ucx with a worker address
/// has no set-up to prove it in and refuses to open with it.
/// What protects a tcp connection's bytes after authentication (Auth::protect): nothing; a tag
/// on every record of the stream (integrity: a byte changed, dropped, replayed or injected on
/// the path closes the connection); or that and encryption (AES-256-GCM with keys of the
/// session; docs/protocol.md, tcp "records").
enum class Protect : uint8_t { none, integrity, encryption };

struct Auth {
    std::string key_id;             ///< names the secret (at most 255 bytes; sent in clear)
    std::vector<std::byte> secret;  ///< at least 16 bytes (read_secret_file); empty: off
    /// tcp: protect what follows the handshake (both ends must set the same; a mismatch closes
    /// the connection with a message naming this setting). Needs a secret; other transports
    /// refuse it.
    Protect protect = Protect::none;
    [[nodiscard]] bool enabled() const noexcept { return !secret.empty(); }
};

/// Who a peer proved to be, as far as its transport can tell (Transport::peer_identity; a
/// handler asks with core::Request::peer_identity()).
struct PeerIdentity {
    /// The key id of the secret the peer proved at connection set-up that it holds (tcp with
    /// Options::auth, ofi and ucx+tcp with it: every peer whose messages arrive did); empty
    /// when it proved none.
    std::string key_id;
    /// The peer process's user and process ids as the kernel reported them (sm: SO_PEERCRED at
    /// connect, checked against its handshake); -1 when not known.
    int64_t uid = -1;
    int64_t pid = -1;
    /// Did the peer prove anything (a secret, or its uid to the kernel)?
    [[nodiscard]] bool authenticated() const noexcept { return !key_id.empty() || uid >= 0; }
    /// `key "k"` (escaped), "uid 1000 pid 4242", or "unauthenticated", for logs and messages.
    [[nodiscard]] std::string describe() const;
};

/// Read a secret for Options::auth from a file that belongs to this user and that nobody else
/// may read (mode 0600 or 0400), of 16 to 4096 bytes; permission_denied, naming the fix, if not.
Result<std::vector<std::byte>> read_secret_file(std::string_view path);

struct Options {
    /// Accept connections from peers (server). Without it a tcp transport does not listen; peers
    /// can still reply over the connections it opens.
    bool listen = true;
    /// See the threading note at the top of this file.
    bool thread_safe = true;
    /// Maximum number of operations in flight (posting more returns Errc::again): per context
    /// on sm, tcp, inproc and ucx (each context has its own pool), per transport on ofi.
    std::size_t max_ops = 4096;
    /// Maximum number of contexts (ids 0 .. max_contexts-1).
    uint8_t max_contexts = 16;
    /// tcp: an accepted connection that has not said hello within this is closed (a peer
    /// cannot hold descriptors with connections that never speak).
    Duration hello_timeout = std::chrono::seconds(10);
    /// Authenticate every peer with a shared secret (tcp, ofi, ucx+tcp://host:port); off by
    /// default.
    Auth auth;
    /// sm: also admit peers whose effective group id is this one (SO_PEERCRED; run such a peer
    /// under `sg GROUP` where the group is only a supplementary one), and give the listening
    /// socket file to that group, readable and writable (this user must belong to it); as a
    /// client, also connect to servers of another user whose socket file belongs to that
    /// group. Both ends must set it to talk across users. -1 (the default): only processes of
    /// this user connect. Put/get to a peer of another user still needs the kernel's leave
    /// (ptrace access: CAP_SYS_PTRACE) and fail with permission_denied without it.
    int64_t sm_group = -1;
};

/// How a context is used (Transport::context_create).
struct ContextOptions {
    /// false: the context takes no unexpected messages. One that names it is handed, like one
    /// naming a context that does not exist, to the lowest context that takes them
    /// (Completion::context_id still names it), so the layer above can answer the sender
    /// instead of leaving it waiting. For contexts that only move bulk data (put/get) and
    /// expected messages, such as the api engine's bulk context.
    bool unexpected = true;
};

/// A transport instance: one endpoint of one transport kind (like Mercury's na_class).
class Transport {
  public:
    virtual ~Transport() = default;
    Transport() = default;
    Transport(const Transport&) = delete;
    Transport& operator=(const Transport&) = delete;

    /// This transport was opened by another process: the caller is a child that inherited it
    /// across fork(), with the parent's descriptors and peers but none of its threads. The
    /// core and the API refuse to use it there (Errc::invalid_state) and leave it as it is
    /// when destroyed; a user of this layer must do the same. One load.
    [[nodiscard]] bool inherited() const noexcept { return fork_.inherited(); }
    /// The process that opened it.
    [[nodiscard]] pid_t opened_by() const noexcept { return fork_.creator(); }
    /// It was opened with Options::listen: a peer it has not contacted may reach it. Without
    /// it, only peers it contacted reach it, on every transport (tcp and ucx+tcp have nothing
    /// to connect to; others could, but bulk handles never name such an owner to third
    /// parties: bulk::Handle::create refuses embed_owner).
    [[nodiscard]] bool listens() const noexcept { return listens_; }
    /// What this transport's links did so far (a snapshot; any thread).
    [[nodiscard]] LinkCounts link_counts() const noexcept {
        LinkCounts c;
        for (std::size_t i = 0; i < LinkCounts::kEvents; ++i)
            c.events[i] = links_[i].load(std::memory_order_relaxed);
        return c;
    }

    /// "inproc", "sm", "tcp", ...
    [[nodiscard]] virtual std::string_view name() const noexcept = 0;

    /// Create the context with this id (0 <= id < Options::max_contexts), once per id.
    virtual Result<std::unique_ptr<Context>> context_create(uint8_t id,
                                                            const ContextOptions& opts) = 0;
    Result<std::unique_ptr<Context>> context_create(uint8_t id) {
        return context_create(id, ContextOptions{});
    }

    // --- addresses ---------------------------------------------------------------------------
    /// Resolve an address string of this transport. Does not block on the network: connections
    /// are made on first use. Lookups of the same peer return equal Addr.
    virtual Result<Addr> addr_lookup(std::string_view address) = 0;
    /// This endpoint's own address. Its string form is what peers pass to addr_lookup (for tcp
    /// with port 0, it names the real port).
    virtual Addr addr_self() = 0;
    virtual std::string addr_to_string(const Addr& a) = 0;
    /// `a` for a log line: addr_to_string(a) and, for a peer that has no address of its own
    /// (an anonymous tcp client, "tcp://~<instance>"), where it connected from.
    virtual std::string addr_describe(const Addr& a) { return addr_to_string(a); }
    /// What `a` (a peer that sent us something) proved about itself: see PeerIdentity. The
    /// default knows nothing (ofi, ucx, inproc: their peers prove nothing).
    virtual PeerIdentity peer_identity(const Addr& a) {
        (void)a;
        return {};
    }
    /// Why the last attempt to connect to `a` failed, in words that name the cause and the
    /// remedy ("connection refused by 127.0.0.1:5000 (ECONNREFUSED): is the server running,
    /// and listening on that address?"); empty when none failed or the transport keeps no such
    /// record. The layer above puts it in the error of a call that could not be sent (operations
    /// complete with an Errc only). Not for a fast path: it may take a lock.
    virtual std::string peer_failure(const Addr& a) {
        (void)a;
        return {};
    }
    /// Close what connects this process to `a`, a peer that keeps breaking the protocol
    /// (`why`, logged): what is in flight on those connections fails, and the peer must connect
    /// again to send more. True when something was closed; transports without connections of
    /// their own close nothing (false).
    virtual bool addr_disconnect(const Addr& a, std::string_view why) {
        (void)a;
        (void)why;
        return false;
    }
    /// Who answers for `a` now, where the process behind `a` is gone and another has taken its
    /// name since (sm: a server restarted at the same sm:// name; the Addr of a dead sm peer
    /// stays dead): that process's address, so that the layer above sends there through the
    /// address it already holds. Empty when `a` stands (tcp, ofi, ucx: an address is a host and
    /// port, and the transport connects to whoever listens there). The core asks only for an
    /// address its transport marked superseded (AddrImpl::mark_superseded), with no lock of its
    /// own held; it may take the transport's.
    virtual Addr addr_current(const Addr& a) {
        (void)a;
        return {};
    }
    /// Serialized form (self-contained: a peer deserializes it with addr_deserialize).
    virtual std::size_t addr_serialize_size(const Addr& a) = 0;
    virtual Result<std::size_t> addr_serialize(const Addr& a, std::span<std::byte> out) = 0;
    virtual Result<Addr> addr_deserialize(std::span<const std::byte> in) = 0;

    // --- messages ----------------------------------------------------------------------------
    [[nodiscard]] virtual std::size_t max_unexpected_size() const noexcept = 0;
    [[nodiscard]] virtual std::size_t max_expected_size() const noexcept = 0;
    /// A message buffer of at least `size` bytes (and at most max_*_size()).
    virtual Result<MsgBuffer> msg_buf_alloc(std::size_t size);

    /// Send `len` bytes of `buf` to `dest`, delivered to its context `dest_ctx` as an
    /// unexpected message with `tag`. The callback runs once the buffer may be reused.
    /// If `dest` has no context `dest_ctx`, its lowest-numbered context receives the message
    /// (Completion::context_id still says `dest_ctx`) so the layer above can tell the sender;
    /// a destination with no context at all drops it.
    virtual Result<OpId> post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                              std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                              Tag tag) = 0;
    /// Receive the next unexpected message addressed to `ctx`'s id, from anyone, into `buf`
    /// (its whole size is the capacity). Messages that arrive before a receive is posted are
    /// queued, never lost. A message longer than the buffer completes with message_too_large.
    virtual Result<OpId> post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) = 0;
    /// Send an expected message to `dest`'s context `dest_ctx`: matched there by (source, tag)
    /// against a post_recv_expected on that context (on sm, tcp, inproc and ucx each context
    /// matches its own; on ofi, still against every context's receives). Messages that arrive
    /// before their receive is posted are queued (at most 4096 of them and 32 MiB, per context
    /// on sm, tcp and ucx, per transport on ofi: post the receive first).
    virtual Result<OpId> post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                            std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                            Tag tag) = 0;
    virtual Result<OpId> post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                            const Addr& source, Tag tag) = 0;

    // --- memory and one-sided operations -----------------------------------------------------
    virtual Result<MemHandle> mem_register(void* buf, std::size_t len, Access access) = 0;
    virtual std::size_t mem_serialize_size(const MemHandle& h) = 0;
    virtual Result<std::size_t> mem_serialize(const MemHandle& h, std::span<std::byte> out) = 0;
    virtual Result<MemHandle> mem_deserialize(std::span<const std::byte> in) = 0;

    /// Write `len` bytes from local[local_off..] to remote[remote_off..] at `remote_addr`.
    /// Fails with out_of_range / access_denied (checked by the target where the transport
    /// cannot check locally), changing nothing at the target.
    virtual Result<OpId> post_put(Context& ctx, Callback cb, const MemHandle& local,
                                  std::size_t local_off, const MemHandle& remote,
                                  std::size_t remote_off, std::size_t len,
                                  const Addr& remote_addr) = 0;
    /// Read `len` bytes from remote[remote_off..] at `remote_addr` into local[local_off..].
    virtual Result<OpId> post_get(Context& ctx, Callback cb, const MemHandle& local,
                                  std::size_t local_off, const MemHandle& remote,
                                  std::size_t remote_off, std::size_t len,
                                  const Addr& remote_addr) = 0;

    /// Ask to cancel a posted operation. It still completes exactly once: with canceled if it
    /// was stopped in time, otherwise with its normal status. not_found for a finished op.
    /// A canceled put leaves the target's bytes undefined: where the target serves put/get
    /// (tcp, ucx+tcp), a request already sent still lands when the target's progress reaches
    /// it, and before a later put or get from this context to that peer (same stream).
    virtual Result<void> cancel(OpId id) = 0;

    // --- progress (called through Context) ---------------------------------------------------
    /// Make progress until `ctx` has at least one completion ready (ok) or `deadline` passes
    /// (Errc::timeout). A deadline in the past means poll once. Must wake early when another
    /// thread queues a completion on `ctx`.
    virtual Result<void> progress(Context& ctx, TimePoint deadline) = 0;
    /// An fd that is readable when this transport needs progress (epoll-nestable).
    [[nodiscard]] virtual int progress_fd() const noexcept = 0;
    /// Prepare to block on progress_fd(): false when work is already pending (do not block).
    /// sm, tcp, ucx and ofi always answer false (their messages wake each context's own set,
    /// which progress_fd() does not hold; ucx's and ofi's progress_fd() is never readable):
    /// block on Context::wait_fd() after Context::try_wait().
    virtual bool try_wait() = 0;
    /// An address equal to `a` for one context to keep (a transport whose addresses are
    /// reference counted per peer may return an alias with a count of its own, so that the
    /// contexts keeping one peer do not all write one cache line). Default: `a`.
    virtual Addr addr_alias(const Addr& a) { return a; }
    /// try_wait() on behalf of `ctx` (Context::try_wait): a transport whose contexts are
    /// separate progress domains arms only that context's. Default: try_wait().
    virtual bool try_wait_for(Context& ctx) {
        (void)ctx;
        return try_wait();
    }

    /// Called by MsgBuffer's destructor.
    virtual void msg_buf_free(MsgBuffer& buf) noexcept;

  protected:
    /// Count a link event, from any thread (a relaxed add: link events are off a message's
    /// fast path; a send meets back-pressure only once its link is full).
    void note(LinkEvent e) noexcept {
        links_[std::size_t(e)].fetch_add(1, std::memory_order_relaxed);
    }

  private:
    friend Result<std::unique_ptr<Transport>> open(std::string_view, const Options&);
    ForkGuard fork_;
    bool listens_ = true;  ///< set by open()
    std::array<std::atomic<uint64_t>, LinkCounts::kEvents> links_{};
};

// ---------------------------------------------------------------------------------------------
// Context

/// A completion queue plus the handle progress is made on. Created by Transport::context_create.
class Context {
  public:
    virtual ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    [[nodiscard]] uint8_t id() const noexcept { return id_; }
    [[nodiscard]] Transport& transport() const noexcept { return *transport_; }

    /// Make progress until a completion is ready on this context or `timeout` passes
    /// (Errc::timeout). timeout 0 polls once; a negative timeout waits forever.
    Result<void> progress(Duration timeout);
    /// Run up to `max` ready callbacks; returns how many ran.
    unsigned trigger(unsigned max = UINT_MAX);

    /// An fd that becomes readable when progress() has something to do (completions queued by
    /// another thread, or transport I/O). Use with try_wait() to block in your own epoll.
    [[nodiscard]] int wait_fd() const noexcept;
    /// True if it is safe to block on wait_fd() now (nothing is already pending). Completions
    /// queued from then on signal wait_fd() until the next progress() on this context (the
    /// caller is awake again then).
    bool try_wait();

    /// Completions queued and not yet triggered.
    [[nodiscard]] bool has_completions() const noexcept;
    /// How many: queued, plus those a trigger() took whose callbacks have not run yet (a
    /// snapshot from any thread; Mercury's completion counts).
    [[nodiscard]] std::size_t completion_count() const noexcept;
    /// The completions this context ran, by type and outcome (a snapshot; any thread).
    [[nodiscard]] OpCounts op_counts() const noexcept;

    /// Queue `cb` to run from trigger() like a completion (type OpType::user, status ok), from
    /// any thread: it wakes a thread blocked in progress() on this context. Upper layers use it
    /// to hand work to the thread that drives a context (a cancel, a response made elsewhere).
    /// Allocates (rarely used; not on a message path).
    Result<void> post(Callback cb);
    /// Queue `cb` like post(), to run from trigger() once `due` has passed: progress() on this
    /// context sleeps no later than the earliest such time and then queues what is due, and
    /// wait_fd() becomes readable then. Any thread may call it; a context's timers are its own
    /// (no thread, nothing shared with other contexts). Callbacks still waiting when the
    /// context is destroyed are dropped without running, like queued completions. Allocates
    /// (meant for retries and delays, not for a message path).
    Result<void> post_at(TimePoint due, Callback cb);
    /// Callbacks waiting in post_at() for their time.
    [[nodiscard]] std::size_t timers_pending() const noexcept;

    /// False for a context created with ContextOptions::unexpected = false.
    [[nodiscard]] bool takes_unexpected() const noexcept { return takes_unexpected_; }

    // --- for transports --------------------------------------------------------------------
    /// Record ContextOptions::unexpected; before the context is published to the transport's
    /// routing (under the transport's lock).
    void set_takes_unexpected(bool v) noexcept { takes_unexpected_ = v; }
    /// Queue a finished operation (thread-safe when the transport is). Wakes a waiter.
    void enqueue(Op* op) noexcept;
    /// The eventfd signalled by enqueue() while a progressing thread may be blocked; transports
    /// add it to the fds they block on and drain it with drain_event_fd().
    [[nodiscard]] int event_fd() const noexcept;
    void drain_event_fd() noexcept;
    /// Before blocking: announce it, so that enqueue() from another thread signals event_fd().
    /// Returns false (and announces nothing) when completions are already queued.
    bool prepare_block() noexcept;
    /// After blocking, when prepare_block() returned true.
    void end_block() noexcept;
    /// Add `fd` (readable when this context has work: a transport's per-context doorbell) to
    /// what wait_fd() waits on. False (errno set) when the kernel refuses.
    bool watch_fd(int fd) noexcept;

  protected:
    Context(Transport* t, uint8_t id, bool thread_safe);

  private:
    struct Impl;
    Transport* transport_;
    uint8_t id_;
    bool takes_unexpected_ = true;
    std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Opening a transport

/// Open a transport from an address string: "inproc://name", "sm://[name]",
/// "tcp://host:port" (IPv4, [IPv6]; port 0 picks a free port), and where built
/// "ofi+<provider>://[host][:port]" (libfabric) and "ucx+<transports>://[host][:port]" (UCX);
/// docs/transports.md says which string fits which fabric. The scheme selects the transport
/// from the compiled-in list; an unknown or not-built scheme fails with not_supported naming
/// the transports that are built.
Result<std::unique_ptr<Transport>> open(std::string_view address, const Options& options = {});

/// A variable that a library under a transport reads only from the process environment, with
/// the value Talaria recommends and what goes wrong without it (docs/transports.md). The
/// library never sets them: an application may, before it opens its first transport, e.g.
/// `for (auto& e : na::recommended_env()) setenv(e.name, e.value, 0);`.
struct EnvSetting {
    const char* name;
    const char* value;
    const char* why;
};
/// The settings for the transports built in (empty when none needs any).
std::span<const EnvSetting> recommended_env() noexcept;

/// The transports compiled into this build, e.g. {"inproc", "sm", "tcp", "ofi", "ucx"}. "ofi"
/// and "ucx" are families: their schemes are "ofi+<provider>" and "ucx+<transports>".
std::vector<std::string_view> transports_built();

}  // namespace talaria::na

#pragma GCC visibility pop
