// The ofi transport: libfabric reliable-datagram endpoints (FI_EP_RDM), one endpoint, completion
// queue and address vector per transport. Setup (fabric, domain, endpoint, addresses, memory
// registration, message-buffer pool) is in ofi_setup.cpp; the data path (posting, completion
// processing, software matching, peer probing, progress) in ofi_io.cpp; the wire format in
// ofi_wire.hpp. Design notes: docs/architecture.md (ofi); wire layout: docs/protocol.md (ofi).
//
// Unexpected messages and probes are untagged libfabric sends of [header | payload] into
// FI_MULTI_RECV buffers owned by the transport (or a pool of posted buffers where the provider
// lacks multi-recv), dispatched to contexts in software; the header names the sender, so no
// provider needs FI_SOURCE. Expected messages are tagged sends (fi_tsend/fi_tinject, no header)
// received by fi_trecv straight into the user's buffer, matched by the provider on (source
// fi_addr, tag) with FI_DIRECTED_RECV; where a provider lacks FI_TAGGED|FI_DIRECTED_RECV they
// take the untagged path and are matched in software (ProviderInfo::tagged).
//
// Locking: one transport lock `mu_` (a no-op without Options::thread_safe) around every
// libfabric call and all matching state (the domain is opened FI_THREAD_DOMAIN: we serialize).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "na/base/addr_table.hpp"
#include "na/base/matcher.hpp"
#include "na/base/op.hpp"
#include "na/base/url.hpp"
#include "na/ofi/ofi_wire.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"
#include "talaria/util/spin_lock.hpp"

namespace talaria::na::ofi {

class OfiTransport;

/// How often (at most) progress looks at the peers that have operations pending on them.
inline constexpr Duration kProbeCheckEvery = std::chrono::milliseconds(100);
/// Silence from a watched peer after which it is probed.
inline constexpr Duration kProbeAfterSilence = std::chrono::milliseconds(300);
/// A probe not completed, or refused by the provider (-FI_EAGAIN: rxm reconnecting to a peer
/// that refuses connections), for this long declares the peer dead.
inline constexpr Duration kProbeTimeout = std::chrono::milliseconds(2500);
/// Poll-sleep period where the completion queue has no wait fd (shm).
inline constexpr Duration kPollSleep = std::chrono::milliseconds(1);

/// The 64-bit libfabric tag of an expected message: a marker bit, the destination context id
/// (bits 32..39, ignored when matching, reported in the completion) and the na tag (bits 0..31).
inline constexpr uint64_t kTagExpected = uint64_t(1) << 63;
inline constexpr uint64_t kTagCtxIgnore = uint64_t(0xff) << 32;
[[nodiscard]] constexpr uint64_t expected_tag(uint8_t dest_ctx, uint32_t tag) noexcept {
    return kTagExpected | (uint64_t(dest_ctx) << 32) | tag;
}

/// What a libfabric operation context points at (the first member of each kind).
struct FiCtx {
    enum class Kind : uint8_t { op, rx, probe };
    Kind fi_kind = Kind::op;
};

struct WatchTag {};

/// One peer, interned weakly (see na/base/addr_table.hpp) under its canonical string and, as an
/// alias, under "\x01" + its raw provider address (how a received header names it). Lives while
/// a user Addr, a pending op, a queued message, a remote memory handle or a probe holds it.
struct OfiAddr final : AddrImpl, ListHook<WatchTag> {
    OfiAddr(OfiTransport* t, std::string s);
    ~OfiAddr() override;
    OfiAddr(const OfiAddr&) = delete;
    OfiAddr& operator=(const OfiAddr&) = delete;

    std::string str;                  ///< canonical "ofi+tcp://127.0.0.1:5000", "ofi+shm://name"
    std::string raw;                  ///< provider address bytes (what fi_av_insert takes)
    fi_addr_t fi = FI_ADDR_NOTAVAIL;  ///< AV entry (lookup / first use); under the lock
    int pid = 0;                      ///< shm: the owner's pid (from the name), 0 if unknown
    uint64_t instance = 0;            ///< the peer's endpoint instance, once heard from
    bool dead = false;                ///< declared dead: every op on it fails with disconnected
    uint32_t pending = 0;             ///< ops in flight on it (watched while nonzero)
    bool probing = false;             ///< a probe is in flight
    bool connected = false;           ///< a send to it completed (so injects may be used)
    uint32_t deferred = 0;            ///< its ops on the deferred list (later sends queue behind)
    uint64_t stalled_pass = 0;        ///< the retry pass in which the provider refused it
    TimePoint heard{};                ///< last message or successful probe from it
    TimePoint probe_sent{};
    TimePoint refused_since{};         ///< first -FI_EAGAIN of a probe not yet posted (or epoch)
    TimePoint listen_checked_at{};     ///< last listener_gone_locked look (rate limit)
    std::vector<std::string> aliases;  ///< other lookup strings interned for it
    bool raw_alias = false;            ///< interned under "\x01" + raw

  private:
    OfiTransport* owner_;
};

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
    deferred,     ///< a send or put/get the provider refused for now (-FI_EAGAIN): retried by
                  ///< progress, in order per peer; cancelable
    in_provider,  ///< posted to libfabric: completes through the CQ
};

/// A user operation. Its Op hook links it on a posted-receive list or on the deferred list.
struct OfiOp : Op, FiCtx {
    OpState state = OpState::idle;
    std::byte* buf = nullptr;      ///< recv: destination; send: header + payload; put/get: local
    std::size_t cap = 0;           ///< recv: capacity; send: bytes; put/get: length
    void* desc = nullptr;          ///< send, put/get: local descriptor
    uint64_t raddr = 0;            ///< put/get: remote address (or offset) of byte 0
    uint64_t rkey = 0;             ///< put/get: remote key
    std::size_t posted_bytes = 0;  ///< put/get: bytes of fragments already posted
    Addr peer;  ///< send/put/get: destination; recv_expected: source (watched; the Matcher's)
    Tag match_tag = 0;
    uint32_t fragments = 0;  ///< put/get: fragments still in the provider
    Errc first_error = Errc::ok;
    std::byte* bounce = nullptr;  ///< send of a foreign buffer: our copy (freed on completion)
    bool counted = false;         ///< counted in peer->pending
    bool cancel_asked = false;    ///< cancel() called fi_cancel on it
    bool tagged = false;          ///< an fi_tsend / fi_trecv (expected message, provider-matched)
    uint64_t ftag = 0;            ///< tagged send: the 64-bit libfabric tag
};

/// A receive buffer posted to the provider (multi-recv, or one message each).
struct RxBuf : FiCtx {
    std::byte* data = nullptr;
    std::size_t size = 0;
    bool posted = false;
};

/// An internal probe in flight (outlives a peer declared dead while the provider holds it).
struct Probe : FiCtx {
    Addr peer;
    bool in_use = false;
};

class OfiContext final : public Context {
  public:
    OfiContext(OfiTransport* t, uint8_t id, bool thread_safe);
    ~OfiContext() override;
    [[nodiscard]] int block_fd() const noexcept { return block_epfd_; }

  private:
    OfiTransport* ot_;
    int block_epfd_ = -1;  ///< epoll over the transport's progress fd and this context's eventfd
};

/// What the provider offers, read from its fi_info.
struct ProviderInfo {
    std::string prov_name;  ///< "tcp;ofi_rxm", "shm", "verbs;ofi_rxm"
    std::string fabric;
    std::string domain;
    uint32_t addr_format = 0;
    uint64_t mr_mode = 0;
    std::size_t inject_size = 0;
    std::size_t max_msg_size = 0;
    bool multi_recv = false;
    bool wait_fd = false;
    bool tagged = false;        ///< FI_TAGGED | FI_DIRECTED_RECV: expected messages are tagged
    bool av_on_lookup = false;  ///< addr_lookup inserts into the AV (not shm: bounded AV)
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
    using Transport::context_create;
    Result<std::unique_ptr<Context>> context_create(uint8_t id,
                                                    const ContextOptions& opts) override;

    Result<Addr> addr_lookup(std::string_view address) override;
    Addr addr_self() override { return self_; }
    [[nodiscard]] std::size_t live_addrs() const noexcept { return addrs_.live(); }
    std::string addr_to_string(const Addr& a) override;
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
    int progress_fd() const noexcept override { return pfd_; }
    bool try_wait() override;

    [[nodiscard]] const ProviderInfo& provider() const noexcept { return prov_; }
    /// Peers currently watched (with operations pending on them); for tests.
    [[nodiscard]] std::size_t watched_peers();
    /// Messages (not probes) taken from our receive buffers and dispatched in software (copied
    /// into the user's buffer); tagged expected messages never count. For tests.
    [[nodiscard]] uint64_t rx_buffer_messages();

    // --- used by OfiContext / OfiMem / OfiAddr ------------------------------------------------
    void context_destroyed(uint8_t id) noexcept;
    void mem_unregister(OfiMem* m) noexcept;

  private:
    friend struct OfiAddr;

    // setup (ofi_setup.cpp)
    Result<void> open_provider(std::string_view sub, std::string_view rest);
    Result<void> post_rx_buffers();
    Result<Addr> lookup_locked(std::string_view address, bool from_wire);
    Addr intern_locked(const std::string& canonical, std::string raw);
    /// The canonical address string of a raw provider address (empty if not representable).
    std::string canonical_of(std::span<const std::byte> raw) const;
    /// The socket address in a raw provider address (FI_SOCKADDR_IN / _IN6 providers): family
    /// and length checked, port nonzero; nullopt for other formats or bad bytes.
    std::optional<SockAddr> sock_addr_of(std::span<const std::byte> raw) const;
    /// The raw provider address of a canonical string's part after "scheme://".
    Result<std::string> raw_of(std::string_view rest, bool from_wire) const;
    Result<void> av_insert_locked(OfiAddr* a);
    /// shm: the peer with this raw address closed its endpoint or died.
    bool shm_peer_gone_locked(std::string_view raw) const;
    Result<Slab*> slab_grow_locked(uint8_t size_class);
    /// A maximal slot for a copy of a foreign buffer (called under mu_), and its descriptor.
    std::byte* bounce_alloc(void** desc) noexcept;
    void bounce_free(std::byte* p) noexcept;
    void close_all() noexcept;

    // data path (ofi_io.cpp)
    Result<OpId> post_send(Context& ctx, Callback cb, const MsgBuffer& buf, std::size_t len,
                           const Addr& dest, uint8_t dest_ctx, Tag tag, bool expected);
    Result<OpId> fail_async(Context& ctx, Callback&& cb, OpType type, Errc status,
                            const std::string& why);
    /// An expected receive as an fi_trecv from the source's fi_addr (tagged providers).
    Result<OpId> post_trecv_locked(OfiOp* op, MsgBuffer& buf, const Addr& source, Tag tag);
    Result<OpId> post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                          std::size_t local_off, const MemHandle& remote, std::size_t remote_off,
                          std::size_t len, const Addr& remote_addr);
    /// Post with retries on -FI_EAGAIN (progressing the CQ in between); the libfabric result.
    template <class F>
    ssize_t post_retry_locked(F&& f);
    void poll_cq_locked();
    /// Post (the rest of) a send or put/get: 0 when all of it is in the provider.
    ssize_t try_post_locked(OfiOp* op);
    void defer_locked(OfiOp* op);
    void to_provider_locked(OfiOp* op);
    void retry_deferred_locked();
    void on_completion(const fi_cq_tagged_entry& e);
    void on_error(const fi_cq_err_entry& e);
    void on_rx(RxBuf* rb, const fi_cq_tagged_entry& e);
    void repost_rx(RxBuf* rb);
    void on_message(std::span<const std::byte> msg);
    void op_finished(OfiOp* op, Errc status);
    void complete_recv(OfiOp* op, const Addr& source, uint8_t ctx_id, Tag tag, std::size_t size,
                       Errc status);
    void watch_inc(OfiAddr* a);
    void watch_dec(OfiAddr* a);
    void check_peers_locked(TimePoint now);
    void send_probe_locked(OfiAddr* a, TimePoint now);
    /// Is a loopback peer's listening socket gone? True when /proc/net/tcp{,6} of this network
    /// namespace shows nothing listening on its port: the process that listened there is gone.
    /// Nothing is sent to the peer (a TCP connect to a live rxm listener leaks memory inside
    /// libfabric 1.17 when it carries no handshake). False for remote peers (the probes'
    /// kProbeTimeout decides), other providers, or when /proc cannot tell; at most one look
    /// per peer per kProbeAfterSilence.
    bool listener_gone_locked(OfiAddr* a, TimePoint now);
    void peer_failed_locked(OfiAddr* a, Errc status, const std::string& why);
    /// shm peers in this very process: false (and the peer declared dead) once that endpoint
    /// closed. shm 1.17 reaches an in-process peer's region through that endpoint's own
    /// mapping, so a send after it closed would touch unmapped memory.
    bool shm_local_peer_ok_locked(OfiAddr* a);

    // First member, so destroyed last: every Addr the members below hold leaves it on the way.
    AddrTable addrs_;
    Options opts_;
    std::string scheme_;  ///< "ofi+tcp"
    ProviderInfo prov_;
    MaybeMutex mu_;
    OpPool<OfiOp> ops_;

    fi_info* info_ = nullptr;
    fid_fabric* fabric_ = nullptr;
    fid_domain* domain_ = nullptr;
    fid_av* av_ = nullptr;
    fid_cq* cq_ = nullptr;
    fid_ep* ep_ = nullptr;
    int cq_fd_ = -1;     ///< the CQ's wait fd, or -1
    int timer_fd_ = -1;  ///< one-shot timer: poll-sleep without a wait fd, and peer probing
    int pfd_ = -1;       ///< epoll over cq_fd_ and timer_fd_: progress_fd()

    uint64_t instance_ = 0;
    Addr self_;
    std::string self_raw_;
    std::byte self_header_[kHeaderRoom]{};  ///< our header template (kind/ctx/tag patched)
    std::size_t self_header_size_ = 0;
    std::string shm_name_;   ///< shm: our region name (its /dev/shm file)
    uint64_t next_key_ = 1;  ///< requested keys, without FI_MR_PROV_KEY

    std::vector<std::unique_ptr<RxBuf>> rx_;
    std::unique_ptr<std::byte[]> rx_mem_;
    fid_mr* rx_mr_ = nullptr;
    void* rx_desc_ = nullptr;
    std::unique_ptr<std::byte[]> probe_mem_;  ///< a probe message (header only), registered
    fid_mr* probe_mr_ = nullptr;
    void* probe_desc_ = nullptr;
    std::vector<std::unique_ptr<Probe>> probes_;

    // Message buffers: per size class a free list of slots (each kHeaderRoom + class size).
    MaybeSpinLock buf_mu_;  ///< leaf lock: free lists (msg_buf_alloc/free from any thread)
    std::vector<std::unique_ptr<Slab>> slabs_;
    std::vector<std::byte*> free_slots_[2];

    /// Posted receives and early messages of every context (na/base/matcher.hpp); expected
    /// ones only without provider tag matching (!prov_.tagged).
    Matcher<OfiOp, QueuedMsg, &OfiOp::peer> match_;
    IntrusiveList<OfiOp> deferred_;
    IntrusiveList<OfiOp> inflight_;  ///< ops the provider holds (released at teardown)
    uint64_t pass_ = 0;
    uint64_t rx_buffer_messages_ = 0;  ///< see rx_buffer_messages()
    IntrusiveList<OfiAddr, WatchTag> watched_;
    TimePoint next_check_{};

    /// Raw address -> AV entry, for every peer looked up (not on shm), used or heard from.
    /// Never removed: fi_av_remove of a peer in another process and reuse of its slot crashes
    /// shm 1.17 (a send into the new peer touched the old one's unmapped region); on shm (an
    /// AV of 256 peers) lookups alone insert nothing, and a full AV fails sends with no_memory.
    std::unordered_map<std::string, fi_addr_t> av_cache_;
};

/// libfabric 1.17's shm address vector capacity (SMR_MAX_PEERS).
inline constexpr std::size_t kShmMaxPeers = 256;
/// Size classes of message buffers (payload bytes; kHeaderRoom more in front of each).
inline constexpr std::size_t kSizeClass[2] = {4096, kMaxMessageSize};
/// Buffers per registered slab.
inline constexpr std::size_t kSlabSlots = 16;

}  // namespace talaria::na::ofi
