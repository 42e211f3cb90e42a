// bulk: handles over one or many local memory segments, serialized inside RPC arguments, and
// one-sided transfers (pull: remote -> local, push: local -> remote) between any offsets of two
// handles, split into as many na put/get operations as the segments need, completing once.
//
// Ownership: the memory of a local handle belongs to the caller and must stay valid while any
// copy of the handle exists (copies share one registration; the last copy deregisters) and
// while transfers using it are in flight. A transfer keeps both handles alive until it
// completes.
//
// Small read-only handles travel inline: when a local read_only handle of at most
// kInlineMax bytes is serialized, its bytes are copied into the encoding, and a pull from the
// decoded handle is a memcpy (no network operation). The bytes are those at serialization time.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "talaria/na/na.hpp"
#include "talaria/proc/archive.hpp"
#include "talaria/util/inplace_function.hpp"
#include "talaria/util/result.hpp"

namespace talaria::bulk {

using na::Access;

/// One local region.
struct Segment {
    void* data = nullptr;
    std::size_t size = 0;
};

/// Read-only handles up to this size are encoded with their bytes inline.
inline constexpr std::size_t kInlineMax = 512;

/// A bulk handle: local (registered here) or remote (decoded from a peer's encoding).
/// Copyable: copies share the registration (a reference count), like a file descriptor dup.
/// The access, bounds and liveness a handle states are checked at the target on tcp, ofi+tcp
/// and ucx+tcp; on sm the caller checks them against the owner's registration table before
/// each copy (a peer's own code could skip that: it is the same user); ofi+shm and ucx+sm peers
/// copy from the owner's process on the handle's word (docs/architecture.md, "Trust model").
class Handle {
  public:
    Handle() noexcept = default;

    /// Register `segments` (each at least one byte) with `transport` for `access` by peers.
    /// With `embed_owner`, the encoding carries this process's address, so a third process
    /// that receives the handle can transfer against it.
    static Result<Handle> create(na::Transport& transport, std::span<const Segment> segments,
                                 Access access, bool embed_owner = false);

    [[nodiscard]] bool valid() const noexcept { return impl_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }
    /// Total bytes over all segments.
    [[nodiscard]] std::size_t size() const noexcept;
    [[nodiscard]] Access access() const noexcept;
    [[nodiscard]] bool local() const noexcept;
    [[nodiscard]] std::size_t segment_count() const noexcept;
    /// The transport it belongs to (registered with, or decoded by).
    [[nodiscard]] na::Transport* transport() const noexcept;
    /// The owner: the embedded address if the encoding carried one, else the source named in
    /// the DecodeContext, else (local handles) invalid.
    [[nodiscard]] const na::Addr& owner() const noexcept;
    /// True for a decoded handle relayed here by a process other than its owner, when the
    /// owner does not listen (na::Transport::listens): it names no owner, and transfers that
    /// need the network fail with unreachable, on every transport.
    [[nodiscard]] bool owner_unreachable() const noexcept;
    /// True for a decoded handle whose bytes came inline.
    [[nodiscard]] bool is_inline() const noexcept;

    /// Append the encoding (docs/protocol.md, "bulk handle").
    Result<void> encode(std::vector<std::byte>& out) const;
    /// The same, through an encoder: in a send buffer's room while it fits (arguments carrying
    /// handles are then encoded in place, not spilled to a vector and copied). On failure
    /// nothing of the handle stays written.
    Result<void> encode(proc::Encoder& e) const;
    /// Read an encoding (bounds-checked; needs d.context().transport).
    static Result<Handle> decode(proc::Decoder& d);

    struct Impl;
    [[nodiscard]] const std::shared_ptr<const Impl>& impl() const noexcept { return impl_; }

  private:
    explicit Handle(std::shared_ptr<const Impl> p) noexcept : impl_(std::move(p)) {}
    std::shared_ptr<const Impl> impl_;
};

/// proc customisation point: bulk handles serialize inside RPC arguments.
template <class Archive>
void serialize(Archive& ar, Handle& h) {
    if constexpr (Archive::encoding) {
        if (auto r = h.encode(ar); !r) ar.fail(r.error().code(), r.error().message());
    } else {
        auto r = Handle::decode(ar);
        if (r)
            h = std::move(*r);
        else if (ar.ok())
            ar.fail(r.error().code(), r.error().message());
    }
}

enum class Direction : uint8_t {
    pull,  ///< remote -> local (na get)
    push,  ///< local -> remote (na put)
};

/// Completes a transfer, once, from the context's trigger(): ok, or the first error
/// (out_of_range, access_denied, disconnected, canceled, ...). When an error stops a transfer
/// the operations already posted are drained before the callback runs, so both buffers are
/// free again when it runs.
using DoneFn = InplaceFunction<void(Result<void>&&), 48>;

/// Names a transfer, for Context::cancel(). Valid while the Context that started it lives.
struct TransferId {
    void* state = nullptr;
    uint64_t gen = 0;
    [[nodiscard]] bool valid() const noexcept { return state != nullptr; }
};

/// The bulk transfers of one na::Context. It owns their states (a pool that grows in chunks
/// and is freed with this object; nothing is shared with other contexts or kept by the
/// process) and completes them from that na context's trigger(); delayed retries after
/// back-pressure are timers of that na context (na::Context::post_at), so whoever drives it
/// drives them, and no thread of ours runs in the background.
///
/// Ownership: `ctx` must outlive this object. The destructor cancels the transfers still in
/// flight and drives `ctx` (progress + trigger) until they have completed, for up to 10 s:
/// destroy it from the thread that drives `ctx`, or once that thread has stopped. Should some
/// never complete (a transport that lost them), their states are leaked on purpose, with an
/// error in the log, rather than freed under callbacks that may still run.
class Context {
  public:
    explicit Context(na::Context& ctx);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    [[nodiscard]] na::Context& na_context() const noexcept;

    /// Move `len` bytes between remote[remote_off..] and local[local_off..] in direction `dir`,
    /// with the remote handle's owner at `peer` (pass remote.owner() unless you know better).
    /// Bounds and access modes are checked here, before anything moves: out_of_range,
    /// access_denied (pull needs remote readable and local writable; push the reverse),
    /// invalid_argument (a handle of another transport, or not local/remote as needed).
    /// Operations refused for back-pressure (again) are retried as earlier ones complete.
    /// Any thread may call it; `done` runs from the na context's trigger().
    Result<TransferId> transfer(Direction dir, const na::Addr& peer, const Handle& remote,
                                std::size_t remote_off, const Handle& local, std::size_t local_off,
                                std::size_t len, DoneFn done);

    /// Stop a transfer: it completes with canceled (or normally, if it finished first);
    /// not_found if it already completed. Any thread. Both buffers are free when the callback
    /// runs; after a canceled push the remote bytes are undefined, and pieces already sent may
    /// still land there (na::Transport::cancel) until a later transfer from this context to
    /// that peer has completed.
    Result<void> cancel(TransferId id);
    /// Cancel every transfer in flight; returns how many were asked to stop.
    std::size_t cancel_all();

    /// Transfers started and not yet completed (a snapshot).
    [[nodiscard]] std::size_t in_flight() const noexcept;

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace talaria::bulk

#pragma GCC visibility pop
