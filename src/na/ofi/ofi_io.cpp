// ofi transport data path: posting, completion processing, software matching of messages from
// the receive buffers, put/get, peer-death probing, cancel, progress.
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "na/ofi/ofi.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::ofi {

namespace {

/// Completions read per fi_cq_read.
constexpr int kCqBatch = 16;
/// Times a post retries -FI_EAGAIN (progressing in between) before returning Errc::again.
constexpr int kPostRetries = 64;

/// The status of a failed libfabric operation (the positive FI_E* code of a CQ error entry).
Errc errc_of(int err) {
    switch (err) {
        case FI_ECANCELED:
            return Errc::canceled;
        case FI_EACCES:
        case FI_EKEYREJECTED:
        case FI_EPERM:
            return Errc::access_denied;
        case FI_ETRUNC:
        case FI_EMSGSIZE:
            return Errc::message_too_large;
        case FI_ECONNREFUSED:
        case FI_ECONNRESET:
        case FI_ECONNABORTED:
        case FI_ENOTCONN:
        case FI_EHOSTUNREACH:
        case FI_ENETUNREACH:
        case FI_ENETDOWN:
        case FI_ESHUTDOWN:
        case FI_ETIMEDOUT:
        case FI_EADDRNOTAVAIL:
        case FI_EIO:
            return Errc::disconnected;
        case FI_ENOMEM:
            return Errc::no_memory;
        default:
            return Errc::io_error;
    }
}

bool peer_lost(Errc e) {
    return e == Errc::disconnected || e == Errc::unreachable;
}

}  // namespace

template <class F>
ssize_t OfiTransport::post_retry_locked(F&& f) {
    ssize_t rc = f();
    for (int i = 0; rc == -FI_EAGAIN && i < kPostRetries; ++i) {
        poll_cq_locked();
        rc = f();
    }
    return rc;
}

// --- posting ------------------------------------------------------------------------------------

Result<OpId> OfiTransport::fail_async(Context& ctx, Callback&& cb, OpType type, Errc status,
                                      const std::string& why) {
    OfiOp* op = ops_.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    TALARIA_LOG(ofi, debug, "{} fails with {}: {}", op_type_name(type), errc_name(status), why);
    OpId id = op->id();
    complete_op(op, status);
    return id;
}

void OfiTransport::watch_inc(OfiAddr* a) {
    if (a->pending++ == 0) {
        a->heard = Clock::now();
        watched_.push_back(*a);
    }
}

void OfiTransport::watch_dec(OfiAddr* a) {
    if (--a->pending == 0) watched_.erase(*a);
}

void OfiTransport::to_provider_locked(OfiOp* op) {
    op->state = OpState::in_provider;
    inflight_.push_back(*op);
}

void OfiTransport::op_finished(OfiOp* op, Errc status) {
    if (op->state == OpState::in_provider) inflight_.erase(*op);
    if (op->bounce) {
        bounce_free(op->bounce);
        op->bounce = nullptr;
    }
    if (op->counted) watch_dec(op->peer.as<OfiAddr>());
    op->counted = false;
    op->tagged = false;
    op->peer.reset();
    op->state = OpState::idle;
    complete_op(op, status);
}

Result<OpId> OfiTransport::post_send(Context& ctx, Callback cb, const MsgBuffer& buf,
                                     std::size_t len, const Addr& dest, uint8_t dest_ctx, Tag tag,
                                     bool expected) {
    OpType type = expected ? OpType::send_expected : OpType::send_unexpected;
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    if (len > kMaxMessageSize)
        return Error(Errc::message_too_large,
                     fmt::format("{}: a {}-byte message exceeds max_{}_size() = {}", scheme_, len,
                                 expected ? "expected" : "unexpected", kMaxMessageSize));
    if (len > buf.size())
        return Error(Errc::invalid_argument, fmt::format("{}: send of {} bytes from a {}-byte "
                                                         "buffer",
                                                         scheme_, len, buf.size()));
    if (!dest || dest.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: destination is not an address of this transport", scheme_));
    auto* slab = static_cast<Slab*>(buf.priv());
    const bool ours = slab && slab->magic == Slab::kMagic && slab->owner == this;
    auto* peer = dest.as<OfiAddr>();

    std::lock_guard g(mu_);
    if (peer->dead)
        return fail_async(ctx, std::move(cb), type, Errc::disconnected,
                          fmt::format("{} was declared dead", peer->str));
    if (auto r = av_insert_locked(peer); !r) {
        // A full address vector is a local limit, reported here with its message.
        if (r.error().code() == Errc::no_memory) return r.error();
        return fail_async(ctx, std::move(cb), type, Errc::unreachable, r.error().message());
    }
    OfiOp* op = ops_.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->completion.size = len;
    // Expected messages with a tagged provider: no header, the tag says it all (the provider
    // knows the source). Else the header goes in the room in front of the payload (ours), or
    // both into a bounce slot (a buffer we did not allocate): one registered send either way.
    const bool tagged = expected && prov_.tagged;
    const std::size_t hdr = tagged ? 0 : self_header_size_;
    std::byte* start;
    void* desc;
    if (ours) {
        start = buf.data() - hdr;
        desc = slab->desc;
    } else {
        op->bounce = bounce_alloc(&desc);
        if (!op->bounce) {
            op->releaser->release(op);
            return Error(Errc::no_memory, fmt::format("{}: no bounce buffer for a send from a "
                                                      "buffer not from msg_buf_alloc",
                                                      scheme_));
        }
        start = op->bounce;
        if (len) std::memcpy(start + hdr, buf.data(), len);
    }
    if (tagged) {
        op->tagged = true;
        op->ftag = expected_tag(dest_ctx, tag);
    } else {
        std::memcpy(start, self_header_, self_header_size_);
        start[1] = std::byte(uint8_t(expected ? MsgKind::expected : MsgKind::unexpected));
        start[2] = std::byte(dest_ctx);
        detail::store_le(start + 4, tag, 4);
    }
    const std::size_t total = hdr + len;
    OpId id = op->id();
    if (total <= prov_.inject_size && !op->bounce && peer->connected && peer->deferred == 0 &&
        shm_local_peer_ok_locked(peer)) {
        // Small: the provider copies it at once and reports no completion. (Not before the
        // first send to the peer completed: rxm refuses injects while it connects.)
        ssize_t rc = tagged ? fi_tinject(ep_, start, total, peer->fi, op->ftag)
                            : fi_inject(ep_, start, total, peer->fi);
        if (rc == 0) {
            complete_op(op, Errc::ok);
            return id;
        }
        if (rc != -FI_EAGAIN) {
            TALARIA_LOG(ofi, debug, "{} to {} on {} failed: {}",
                        tagged ? "fi_tinject" : "fi_inject", peer->str, prov_.prov_name,
                        fi_strerror(int(-rc)));
            complete_op(op, Errc::disconnected);
            return id;
        }
        // Provider queue full: a send with a completion waits in the provider instead.
    }
    op->peer = dest;
    op->buf = start;
    op->cap = total;
    op->desc = desc;
    op->counted = true;
    watch_inc(peer);
    if (peer->deferred > 0) {
        defer_locked(op);  // behind the sends already waiting: messages stay in order
        return id;
    }
    ssize_t rc = try_post_locked(op);
    if (rc == 0) {
        to_provider_locked(op);
    } else if (rc == -FI_EAGAIN) {
        defer_locked(op);  // e.g. rxm connecting: the peer must progress too
    } else if (rc != 0 && peer->dead) {
        op_finished(op, Errc::disconnected);
    } else if (rc != 0) {
        TALARIA_LOG(ofi, debug, "{}: {} of {} bytes to {} on {} failed: {}", scheme_,
                    tagged ? "fi_tsend" : "fi_send", total, peer->str, prov_.prov_name,
                    fi_strerror(int(-rc)));
        op_finished(op, Errc::disconnected);
    }
    return id;
}

ssize_t OfiTransport::try_post_locked(OfiOp* op) {
    auto* peer = op->peer.as<OfiAddr>();
    if (!shm_local_peer_ok_locked(peer)) return -FI_ENOTCONN;
    const OpType t = op->completion.type;
    if (t == OpType::send_unexpected || t == OpType::send_expected) {
        if (op->tagged)
            return fi_tsend(ep_, op->buf, op->cap, op->desc, peer->fi, op->ftag,
                            static_cast<FiCtx*>(op));
        return fi_send(ep_, op->buf, op->cap, op->desc, peer->fi, static_cast<FiCtx*>(op));
    }
    // put/get: split at the provider's largest message; each fragment completes on its own.
    const bool is_put = t == OpType::put;
    const std::size_t chunk = std::max<std::size_t>(
        4096, std::min<std::size_t>(prov_.max_msg_size, std::size_t(1) << 30));
    while (op->posted_bytes < op->cap) {
        std::size_t off = op->posted_bytes;
        std::size_t n = std::min(chunk, op->cap - off);
        ssize_t rc;
        if (is_put) {
            // Delivery complete: a put completes once the data is in the target's memory (a
            // plain completion of tcp;ofi_rxm only says it left this process).
            iovec iov{op->buf + off, n};
            fi_rma_iov riov{op->raddr + off, n, op->rkey};
            fi_msg_rma msg{};
            msg.msg_iov = &iov;
            msg.desc = &op->desc;
            msg.iov_count = 1;
            msg.addr = peer->fi;
            msg.rma_iov = &riov;
            msg.rma_iov_count = 1;
            msg.context = static_cast<FiCtx*>(op);
            rc = fi_writemsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
        } else {
            rc = fi_read(ep_, op->buf + off, n, op->desc, peer->fi, op->raddr + off, op->rkey,
                         static_cast<FiCtx*>(op));
        }
        if (rc != 0) return rc;
        op->posted_bytes += n;
        ++op->fragments;
    }
    return 0;
}

void OfiTransport::defer_locked(OfiOp* op) {
    op->state = OpState::deferred;
    deferred_.push_back(*op);
    ++op->peer.as<OfiAddr>()->deferred;
}

void OfiTransport::retry_deferred_locked() {
    ++pass_;
    deferred_.for_each_safe([&](OfiOp& op) {
        auto* peer = op.peer.as<OfiAddr>();
        if (peer->stalled_pass == pass_) return;  // keep its order: try again next pass
        ssize_t rc = try_post_locked(&op);
        if (rc == -FI_EAGAIN) {
            peer->stalled_pass = pass_;
            return;
        }
        deferred_.erase(op);
        --peer->deferred;
        if (rc == 0) {
            to_provider_locked(&op);
            return;
        }
        TALARIA_LOG(ofi, debug, "{}: posting {} to {} failed: {}", scheme_,
                    op_type_name(op.completion.type), peer->str, fi_strerror(int(-rc)));
        op.first_error = Errc::disconnected;
        if (op.fragments == 0)
            op_finished(&op, Errc::disconnected);
        else
            to_provider_locked(&op);  // the fragments in flight finish it
    });
}

Result<OpId> OfiTransport::post_send_unexpected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                                std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                                Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, false);
}

Result<OpId> OfiTransport::post_send_expected(Context& ctx, Callback cb, const MsgBuffer& buf,
                                              std::size_t len, const Addr& dest, uint8_t dest_ctx,
                                              Tag tag) {
    return post_send(ctx, std::move(cb), buf, len, dest, dest_ctx, tag, true);
}

void OfiTransport::complete_recv(OfiOp* op, const Addr& source, uint8_t ctx_id, Tag tag,
                                 std::size_t size, Errc status) {
    op->completion.source = source;
    op->completion.context_id = ctx_id;
    op->completion.tag = tag;
    op->completion.size = size;
    op_finished(op, status);
}

Result<OpId> OfiTransport::post_recv_unexpected(Context& ctx, Callback cb, MsgBuffer& buf) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    std::lock_guard g(mu_);
    OfiOp* op = ops_.acquire(ctx, std::move(cb), OpType::recv_unexpected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    op->state = OpState::recv_posted;
    if (QueuedMsg* m = match_.post_unexpected(ctx.id(), op)) {
        match_.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
    }
    return id;
}

Result<OpId> OfiTransport::post_recv_expected(Context& ctx, Callback cb, MsgBuffer& buf,
                                              const Addr& source, Tag tag) {
    if (&ctx.transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: the context belongs to another transport", scheme_));
    if (!source || source.impl()->transport() != this)
        return Error(Errc::invalid_argument,
                     fmt::format("{}: source is not an address of this transport", scheme_));
    std::lock_guard g(mu_);
    OfiOp* op = ops_.acquire(ctx, std::move(cb), OpType::recv_expected);
    if (!op) return ops_exhausted(scheme_, opts_.max_ops);
    op->buf = buf.data();
    op->cap = buf.size();
    OpId id = op->id();
    if (prov_.tagged) return post_trecv_locked(op, buf, source, tag);
    op->state = OpState::recv_posted;
    if (QueuedMsg* m = match_.post_expected(op, source, tag)) {
        // It arrived before its receive (also from a peer that died since).
        match_.deliver(m, op, [this](auto&&... a) { complete_recv(a...); });
        return id;
    }
    auto* peer = source.as<OfiAddr>();
    if (peer->dead) {
        match_.withdraw(op);
        complete_recv(op, source, 0, tag, 0, Errc::disconnected);
        return id;
    }
    op->counted = true;  // op->peer is the source (set by the matcher)
    watch_inc(peer);     // a receive from a peer that dies must fail: watch it
    return id;
}

Result<OpId> OfiTransport::post_trecv_locked(OfiOp* op, MsgBuffer& buf, const Addr& source,
                                             Tag tag) {
    OpId id = op->id();
    auto* peer = source.as<OfiAddr>();
    if (peer->dead) {
        complete_recv(op, source, 0, tag, 0, Errc::disconnected);
        return id;
    }
    if (auto r = av_insert_locked(peer); !r) {
        if (r.error().code() == Errc::no_memory)
            TALARIA_LOG(ofi, warn, "{}: recv_expected fails: {}", scheme_, r.error().message());
        else
            TALARIA_LOG(ofi, debug, "recv_expected fails: {}", r.error().message());
        complete_recv(op, source, 0, tag, 0,
                      r.error().code() == Errc::no_memory ? Errc::no_memory : Errc::unreachable);
        return id;
    }
    // Straight into the user's buffer: ours is registered (its slab's descriptor); a foreign
    // one needs a registered bounce slot only where the provider wants descriptors
    // (FI_MR_LOCAL), copied out on completion.
    auto* slab = static_cast<Slab*>(buf.priv());
    std::byte* dst = op->buf;
    std::size_t cap = op->cap;
    void* desc = nullptr;
    if (slab && slab->magic == Slab::kMagic && slab->owner == this) {
        desc = slab->desc;
    } else if (prov_.mr_mode & FI_MR_LOCAL) {
        op->bounce = bounce_alloc(&desc);
        if (!op->bounce) {
            op->releaser->release(op);
            return Error(Errc::no_memory, fmt::format("{}: no bounce buffer for a receive into a "
                                                      "buffer not from msg_buf_alloc",
                                                      scheme_));
        }
        dst = op->bounce;
        cap = std::min(cap, kHeaderRoom + kMaxMessageSize);
    }
    const uint64_t ftag = expected_tag(0, tag);
    ssize_t rc = post_retry_locked([&] {
        return fi_trecv(ep_, dst, cap, desc, peer->fi, ftag, kTagCtxIgnore,
                        static_cast<FiCtx*>(op));
    });
    if (rc != 0) {
        TALARIA_LOG(ofi, warn, "{}: fi_trecv from {} on {} failed: {}", scheme_, peer->str,
                    prov_.prov_name, fi_strerror(int(-rc)));
        complete_recv(op, source, 0, tag, 0, rc == -FI_EAGAIN ? Errc::again : Errc::io_error);
        return id;
    }
    op->tagged = true;
    op->peer = source;
    op->match_tag = tag;
    op->counted = true;
    watch_inc(peer);  // a receive from a peer that dies must fail: watch it
    to_provider_locked(op);
    // post_retry_locked may have polled the CQ and declared this peer dead meanwhile (before
    // the op was in flight, so peer_failed_locked could not withdraw it): withdraw it now.
    if (peer->dead && op->first_error == Errc::ok) {
        op->first_error = Errc::disconnected;
        int crc = fi_cancel(&ep_->fid, static_cast<FiCtx*>(op));
        if (crc != 0 && crc != -FI_ENOENT)
            TALARIA_LOG(ofi, warn, "{}: fi_cancel of a receive from dead peer {} on {}: {}",
                        scheme_, peer->str, prov_.prov_name, fi_strerror(-crc));
    }
    return id;
}

Result<OpId> OfiTransport::post_rma(Context& ctx, Callback cb, OpType type, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    const bool is_put = type == OpType::put;
    const char* what = is_put ? "post_put" : "post_get";
    TALARIA_CHECK(
        check_rma_args(this, scheme_, what, ctx, local, local_off, remote, len, remote_addr));
    auto* lm = local.as<OfiMem>();
    auto* rm = remote.as<OfiMem>();
    auto* peer = remote_addr.as<OfiAddr>();

    std::lock_guard g(mu_);
    // The provider checks keys, ranges and access at the target too; checking what the handle
    // says here first gives the exact status and leaves the target untouched.
    bool allowed = is_put ? (uint8_t(rm->access()) & uint8_t(Access::write_only))
                          : (uint8_t(rm->access()) & uint8_t(Access::read_only));
    if (!allowed)
        return fail_async(ctx, std::move(cb), type, Errc::access_denied,
                          fmt::format("the remote region does not allow {}",
                                      is_put ? "writes (put)" : "reads (get)"));
    if (remote_off > rm->length() || len > rm->length() - remote_off)
        return fail_async(ctx, std::move(cb), type, Errc::out_of_range,
                          fmt::format("remote range [{}, +{}) is outside the {}-byte region",
                                      remote_off, len, rm->length()));
    Addr owner = rm->local() ? self_ : rm->owner_addr;
    if (owner && owner != remote_addr)
        return fail_async(ctx, std::move(cb), type, Errc::invalid_argument,
                          fmt::format("the remote handle was registered by {}, not by {}",
                                      owner.as<OfiAddr>()->str, peer->str));
    if (peer->dead)
        return fail_async(ctx, std::move(cb), type, Errc::disconnected,
                          fmt::format("{} was declared dead", peer->str));
    if (len == 0) return fail_async(ctx, std::move(cb), type, Errc::ok, "empty transfer");
    if (auto r = av_insert_locked(peer); !r) {
        // A full address vector is a local limit, reported here with its message.
        if (r.error().code() == Errc::no_memory) return r.error();
        return fail_async(ctx, std::move(cb), type, Errc::unreachable, r.error().message());
    }
    OfiOp* op = ops_.acquire(ctx, std::move(cb), type);
    if (!op) return ops_exhausted(fmt::format("{} {}", scheme_, what), opts_.max_ops);
    op->completion.size = len;
    OpId id = op->id();
    op->buf = reinterpret_cast<std::byte*>(lm->base()) + local_off;
    op->cap = len;
    op->desc = lm->desc;
    op->raddr = (rm->virt ? rm->base() : 0) + remote_off;
    op->rkey = rm->key;
    op->peer = remote_addr;
    op->counted = true;
    watch_inc(peer);
    if (peer->deferred > 0) {
        defer_locked(op);
        return id;
    }
    ssize_t rc = try_post_locked(op);
    if (rc == 0) {
        to_provider_locked(op);
    } else if (rc == -FI_EAGAIN) {
        defer_locked(op);
    } else if (rc != 0) {
        TALARIA_LOG(ofi, warn, "{}: {} to {} on {} failed: {}", scheme_,
                    is_put ? "fi_write" : "fi_read", peer->str, prov_.prov_name,
                    fi_strerror(int(-rc)));
        op->first_error = Errc::disconnected;
        if (op->fragments == 0)
            op_finished(op, Errc::disconnected);
        else
            to_provider_locked(op);
    }
    return id;
}

Result<OpId> OfiTransport::post_put(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::put, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<OpId> OfiTransport::post_get(Context& ctx, Callback cb, const MemHandle& local,
                                    std::size_t local_off, const MemHandle& remote,
                                    std::size_t remote_off, std::size_t len,
                                    const Addr& remote_addr) {
    return post_rma(ctx, std::move(cb), OpType::get, local, local_off, remote, remote_off, len,
                    remote_addr);
}

Result<void> OfiTransport::cancel(OpId id) {
    std::lock_guard g(mu_);
    OfiOp* op = ops_.lookup(id);
    if (!op)
        return Error(
            Errc::not_found,
            fmt::format("{} cancel: the operation already finished (stale OpId)", scheme_));
    if (op->state == OpState::recv_posted) {
        // Receives are matched in software: withdrawn here, completed once.
        match_.withdraw(op);
        op_finished(op, Errc::canceled);
    } else if (op->state == OpState::deferred && op->fragments == 0) {
        deferred_.erase(*op);
        --op->peer.as<OfiAddr>()->deferred;
        op_finished(op, Errc::canceled);
    } else if (op->state == OpState::in_provider) {
        // Sends and put/get in the provider: ask it; if it cannot stop them they complete
        // normally (fi_cancel reports completion through the CQ either way).
        op->cancel_asked = true;
        fi_cancel(&ep_->fid, static_cast<FiCtx*>(op));
    }
    return ok();
}

// --- receiving ----------------------------------------------------------------------------------

void OfiTransport::repost_rx(RxBuf* rb) {
    if (!ep_) return;
    ssize_t rc;
    if (prov_.multi_recv) {
        iovec iov{rb->data, rb->size};
        void* desc = rx_desc_;
        fi_msg msg{};
        msg.msg_iov = &iov;
        msg.desc = &desc;
        msg.iov_count = 1;
        msg.addr = FI_ADDR_UNSPEC;
        msg.context = static_cast<FiCtx*>(rb);
        rc = post_retry_locked([&] { return fi_recvmsg(ep_, &msg, FI_MULTI_RECV); });
    } else {
        rc = post_retry_locked([&] {
            return fi_recv(ep_, rb->data, rb->size, rx_desc_, FI_ADDR_UNSPEC,
                           static_cast<FiCtx*>(rb));
        });
    }
    rb->posted = rc == 0;
    if (rc != 0)
        TALARIA_LOG(ofi, error, "{}: reposting a receive buffer failed: {}", prov_.prov_name,
                    fi_strerror(int(-rc)));
}

void OfiTransport::on_message(std::span<const std::byte> msg) {
    auto h = decode_msg_header(msg);
    if (!h) {
        TALARIA_LOG(ofi, warn, "{}: dropping a message: {}", scheme_, h.error().message());
        return;
    }
    // Who sent it: the raw address in the header, interned under "\x01" + raw.
    char key[1 + kMaxRawAddr];
    key[0] = '\x01';
    std::memcpy(key + 1, h->raw_addr.data(), h->raw_addr.size());
    std::string_view k(key, 1 + h->raw_addr.size());
    Addr src = addrs_.find(k);
    if (src && src.as<OfiAddr>()->instance != 0 && src.as<OfiAddr>()->instance != h->instance) {
        // A new endpoint at the address of an old one: the old one is gone.
        peer_failed_locked(src.as<OfiAddr>(), Errc::disconnected,
                           "a new endpoint now uses its address");
        src.reset();
    }
    if (!src) {
        std::string canonical = canonical_of(h->raw_addr);
        if (canonical.empty()) {
            TALARIA_LOG(ofi, warn,
                        "{}: dropping a message from an address that is not an {} "
                        "endpoint",
                        scheme_, scheme_);
            return;
        }
        src = intern_locked(
            canonical,
            std::string(reinterpret_cast<const char*>(h->raw_addr.data()), h->raw_addr.size()));
    }
    auto* a = src.as<OfiAddr>();
    a->instance = h->instance;
    if (a->pending) a->heard = Clock::now();
    if (a->fi == FI_ADDR_NOTAVAIL) {
        // First message from it: into the AV now, so its expected messages (tagged, matched on
        // its fi_addr) can be received and the reply needs no insertion. If that fails (shm:
        // AV full) the message is still delivered (the header names its sender), but replies to
        // it will fail: say so.
        if (auto r = av_insert_locked(a); !r)
            TALARIA_LOG(ofi, warn,
                        "{}: a message from {} is delivered, but replies to it will fail: {}",
                        scheme_, a->str, r.error().message());
    }
    std::span<const std::byte> payload = msg.subspan(h->header_size);
    if (h->kind == MsgKind::probe) return;
    ++rx_buffer_messages_;

    const bool expected = h->kind != MsgKind::unexpected;
    bool no_context = false;
    OfiOp* op = match_.match(expected, h->context_id, src, h->tag, &no_context);
    if (!op) {
        Queued q = match_.queue_copy(expected, h->context_id, src, h->tag, payload);
        if (q != Queued::ok)
            TALARIA_LOG(ofi, warn,
                        "{}: dropping a {}-byte {} message (tag {}) from {} for context {}: {}",
                        scheme_, payload.size(), expected ? "expected" : "unexpected", h->tag,
                        a->str, h->context_id, match_.refusal(q));
        return;
    }
    Errc st = copy_message(payload.data(), payload.size(), op->buf, op->cap);
    complete_recv(op, src, h->context_id, h->tag, payload.size(), st);
}

void OfiTransport::on_rx(RxBuf* rb, const fi_cq_tagged_entry& e) {
    if (e.len > 0) {
        const auto* p = prov_.multi_recv ? static_cast<const std::byte*>(e.buf) : rb->data;
        on_message(std::span<const std::byte>(p, e.len));
    }
    // A multi-recv buffer is ours again once the provider says so; a plain one at once.
    if (!prov_.multi_recv || (e.flags & FI_MULTI_RECV)) repost_rx(rb);
}

// --- completions --------------------------------------------------------------------------------

void OfiTransport::on_completion(const fi_cq_tagged_entry& e) {
    auto* c = static_cast<FiCtx*>(e.op_context);
    if (!c) return;
    switch (c->fi_kind) {
        case FiCtx::Kind::rx:
            on_rx(static_cast<RxBuf*>(c), e);
            break;
        case FiCtx::Kind::probe: {
            auto* p = static_cast<Probe*>(c);
            auto* a = p->peer.as<OfiAddr>();
            a->probing = false;
            a->connected = true;
            a->heard = Clock::now();
            p->peer.reset();
            p->in_use = false;
            break;
        }
        case FiCtx::Kind::op: {
            auto* op = static_cast<OfiOp*>(c);
            if (op->completion.type == OpType::put || op->completion.type == OpType::get) {
                if (--op->fragments == 0 && op->state != OpState::deferred)
                    op_finished(op, op->first_error);
            } else if (op->completion.type == OpType::recv_expected) {
                // A tagged receive: the message is in the user's buffer (or our bounce slot).
                Addr src = op->peer;
                std::size_t n = std::min<std::size_t>(e.len, op->cap);
                if (op->bounce && n) std::memcpy(op->buf, op->bounce, n);
                auto* a = src.as<OfiAddr>();
                if (a->pending) a->heard = Clock::now();
                complete_recv(op, src, uint8_t(e.tag >> 32), Tag(e.tag & 0xffffffffu), n, Errc::ok);
            } else {
                op->peer.as<OfiAddr>()->connected = true;
                op_finished(op, Errc::ok);
            }
            break;
        }
    }
}

void OfiTransport::on_error(const fi_cq_err_entry& e) {
    auto* c = static_cast<FiCtx*>(e.op_context);
    char buf[256] = {};
    const char* perr = fi_cq_strerror(cq_, e.prov_errno, e.err_data, buf, sizeof buf);
    std::string why =
        fmt::format("{} (provider {}: {})", fi_strerror(e.err), prov_.prov_name, perr ? perr : "");
    if (!c) {
        TALARIA_LOG(ofi, warn, "{}: completion error without a context: {}", scheme_, why);
        return;
    }
    // shm 1.17 reports some errors negated (-FI_ETRUNC): the code is its absolute value.
    const int err = e.err < 0 ? -e.err : e.err;
    Errc st = errc_of(err);
    switch (c->fi_kind) {
        case FiCtx::Kind::rx: {
            auto* rb = static_cast<RxBuf*>(c);
            if (err == FI_ECANCELED) {
                rb->posted = false;
                return;
            }
            TALARIA_LOG(ofi, warn, "{}: receive error: {}", scheme_, why);
            if (!prov_.multi_recv || (e.flags & FI_MULTI_RECV)) repost_rx(rb);
            break;
        }
        case FiCtx::Kind::probe: {
            auto* p = static_cast<Probe*>(c);
            Addr peer = std::move(p->peer);
            p->in_use = false;
            auto* a = peer.as<OfiAddr>();
            a->probing = false;
            peer_failed_locked(a, Errc::disconnected, "probe failed: " + why);
            break;
        }
        case FiCtx::Kind::op: {
            auto* op = static_cast<OfiOp*>(c);
            TALARIA_LOG(ofi, debug, "{} failed: {}", op_type_name(op->completion.type), why);
            // rxm fails the operations of a connection that broke with FI_ECANCELED: that is
            // a lost peer unless we asked for the cancel.
            // A tagged receive we withdrew because its peer died carries that status.
            if (st == Errc::canceled && !op->cancel_asked)
                st = op->first_error != Errc::ok ? op->first_error : Errc::disconnected;
            Addr peer = op->peer;
            if (op->completion.type == OpType::put || op->completion.type == OpType::get) {
                if (op->first_error == Errc::ok) op->first_error = st;
                if (--op->fragments == 0 && op->state != OpState::deferred)
                    op_finished(op, op->first_error);
            } else if (op->completion.type == OpType::recv_expected) {
                // FI_ETRUNC: olen bytes did not fit (message_too_large); the rest: no data.
                std::size_t n = st == Errc::message_too_large ? std::min(e.len, op->cap) : 0;
                if (op->bounce && n) std::memcpy(op->buf, op->bounce, n);
                complete_recv(op, peer, uint8_t(e.tag >> 32), op->match_tag, n, st);
            } else {
                op_finished(op, st);
            }
            if (peer && peer_lost(st)) peer_failed_locked(peer.as<OfiAddr>(), st, why);
            break;
        }
    }
}

void OfiTransport::poll_cq_locked() {
    if (!cq_) return;
    fi_cq_tagged_entry entries[kCqBatch];
    for (int round = 0; round < 4; ++round) {
        ssize_t n = fi_cq_read(cq_, entries, kCqBatch);
        if (n > 0) {
            for (ssize_t i = 0; i < n; ++i)
                on_completion(entries[i]);
            if (n < kCqBatch) break;
            continue;
        }
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(cq_, &err, 0) > 0) on_error(err);
            continue;
        }
        if (n != -FI_EAGAIN)
            TALARIA_LOG(ofi, error, "{}: fi_cq_read failed: {}", prov_.prov_name,
                        fi_strerror(int(-n)));
        break;
    }
}

// --- peer death ---------------------------------------------------------------------------------

void OfiTransport::peer_failed_locked(OfiAddr* a, Errc status, const std::string& why) {
    if (a->dead) return;
    a->dead = true;
    TALARIA_LOG(ofi, debug, "{}: peer {} is dead: {}", scheme_, a->str, why);
    // The next lookup of that name makes a new address (a restarted peer).
    addrs_.unlink(a->str, a);
    for (const std::string& s : a->aliases)
        addrs_.unlink(s, a);
    if (a->raw_alias) addrs_.unlink("\x01" + a->raw, a);
    Addr hold(a);  // failing the last op on it must not free it under us
    deferred_.for_each_safe([&](OfiOp& op) {
        if (op.peer != hold) return;
        deferred_.erase(op);
        --a->deferred;
        op.first_error = status;
        if (op.fragments == 0)
            op_finished(&op, status);
        else
            to_provider_locked(&op);
    });
    match_.take_expected_from(
        hold, [&](OfiOp* op) { complete_recv(op, hold, 0, op->match_tag, 0, status); });
    // Tagged receives from it sit in the provider, which never fails them: withdraw them. The
    // FI_ECANCELED completion finishes each once, with this status (see on_error); one the
    // provider could no longer withdraw completes as it would have.
    inflight_.for_each_safe([&](OfiOp& op) {
        if (op.completion.type != OpType::recv_expected || op.peer != hold || op.cancel_asked ||
            op.first_error != Errc::ok)
            return;
        op.first_error = status;
        int rc = fi_cancel(&ep_->fid, static_cast<FiCtx*>(&op));
        if (rc != 0 && rc != -FI_ENOENT)
            TALARIA_LOG(ofi, warn, "{}: fi_cancel of a receive from dead peer {} on {}: {}",
                        scheme_, a->str, prov_.prov_name, fi_strerror(-rc));
    });
    if (a->pid > 0 && prov_.prov_name == "shm" && ::kill(a->pid, 0) != 0 && errno == ESRCH) {
        // A killed shm peer cannot remove its region: do it for it (its name carries its pid,
        // which no longer exists, so nobody uses the region any more).
        std::string name = a->raw.substr(a->raw.find("://") + 3);
        if (::shm_unlink(name.c_str()) == 0)
            TALARIA_LOG(ofi, debug, "removed the shm region of dead peer {}", a->str);
    }
}

void OfiTransport::send_probe_locked(OfiAddr* a, TimePoint now) {
    if (!shm_local_peer_ok_locked(a)) return;
    if (auto r = av_insert_locked(a); !r) {
        peer_failed_locked(a, Errc::unreachable, r.error().message());
        return;
    }
    Probe* p = nullptr;
    for (auto& q : probes_)
        if (!q->in_use) p = q.get();
    if (!p) {
        probes_.push_back(std::make_unique<Probe>());
        p = probes_.back().get();
        p->fi_kind = FiCtx::Kind::probe;
    }
    ssize_t rc = fi_send(ep_, probe_mem_.get(), self_header_size_, probe_desc_, a->fi,
                         static_cast<FiCtx*>(p));
    if (rc == -FI_EAGAIN) {
        // rxm answers -FI_EAGAIN while it (re)connects, forever if the peer is gone. A peer
        // whose address now refuses TCP connections is gone at once.
        if (listener_gone_locked(a, now)) {
            peer_failed_locked(a, Errc::disconnected,
                               "nothing listens on its port any more (and the provider cannot "
                               "reach it): its process is gone");
            return;
        }
        if (a->refused_since == TimePoint{}) {
            a->refused_since = now;
        } else if (now - a->refused_since > kProbeTimeout) {
            peer_failed_locked(a, Errc::disconnected,
                               fmt::format("the provider refused to send to it (-FI_EAGAIN, "
                                           "connecting) for {} ms",
                                           std::chrono::duration_cast<std::chrono::milliseconds>(
                                               now - a->refused_since)
                                               .count()));
        }
        return;
    }
    a->refused_since = TimePoint{};
    if (rc != 0) {
        peer_failed_locked(a, Errc::disconnected,
                           fmt::format("probe send failed: {}", fi_strerror(int(-rc))));
        return;
    }
    p->in_use = true;
    p->peer = Addr(a);
    a->probing = true;
    a->probe_sent = now;
}

namespace {

bool is_loopback(const SockAddr& sa) noexcept {
    if (sa.family() == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(sa.sa());
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa.sa());
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
}

/// Does a socket of this network namespace listen on TCP `port` (any address)? nullopt when
/// neither /proc/net/tcp nor /proc/net/tcp6 can be read.
std::optional<bool> tcp_port_listened(uint16_t port) {
    bool read_any = false;
    for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::FILE* f = std::fopen(path, "re");
        if (!f) continue;
        read_any = true;
        char line[512];
        bool found = false;
        // "  sl  local_address rem_address   st ...": the first line names the columns.
        for (bool header = true; !found && std::fgets(line, sizeof line, f); header = false) {
            char local[64];
            unsigned state = 0;
            if (header || std::sscanf(line, "%*s %63s %*s %x", local, &state) != 2) continue;
            const char* colon = std::strrchr(local, ':');
            found = colon && state == 0x0A /* TCP_LISTEN */ &&
                    std::strtoul(colon + 1, nullptr, 16) == port;
        }
        std::fclose(f);
        if (found) return true;
    }
    if (!read_any) return std::nullopt;
    return false;
}

}  // namespace

bool OfiTransport::listener_gone_locked(OfiAddr* a, TimePoint now) {
    if (!prov_.tcp_listener || now - a->listen_checked_at < kProbeAfterSilence) return false;
    a->listen_checked_at = now;
    auto sa = sock_addr_of(std::as_bytes(std::span(a->raw)));
    if (!sa || !is_loopback(*sa)) return false;
    auto listened = tcp_port_listened(sa->port());
    return listened && !*listened;
}

void OfiTransport::check_peers_locked(TimePoint now) {
    if (watched_.empty() || now < next_check_) return;
    next_check_ = now + kProbeCheckEvery;
    watched_.for_each_safe([&](OfiAddr& a) {
        if (a.dead || &a == self_.impl()) return;
        if (a.pid > 0 && ::kill(a.pid, 0) != 0 && errno == ESRCH) {
            peer_failed_locked(&a, Errc::disconnected,
                               fmt::format("its process {} is gone", a.pid));
            return;
        }
        if (a.probing) {
            if (now - a.probe_sent > kProbeTimeout)
                peer_failed_locked(&a, Errc::disconnected, "a probe got no completion in time");
            else if (now - a.probe_sent > kProbeAfterSilence && listener_gone_locked(&a, now))
                peer_failed_locked(&a, Errc::disconnected,
                                   "a probe is unanswered and nothing listens on its port any "
                                   "more: its process is gone");
            return;
        }
        if (now - a.heard >= kProbeAfterSilence) send_probe_locked(&a, now);
    });
}

std::size_t OfiTransport::watched_peers() {
    std::lock_guard g(mu_);
    std::size_t n = 0;
    for (OfiAddr& a : watched_) {
        (void)a;
        ++n;
    }
    return n;
}

uint64_t OfiTransport::rx_buffer_messages() {
    std::lock_guard g(mu_);
    return rx_buffer_messages_;
}

// --- progress -----------------------------------------------------------------------------------

Result<void> OfiTransport::progress(Context& ctx, TimePoint deadline) {
    auto& oc = static_cast<OfiContext&>(ctx);
    for (;;) {
        bool block_ok;
        bool watching;
        {
            std::lock_guard g(mu_);
            poll_cq_locked();
            if (!deferred_.empty()) retry_deferred_locked();
            if (!watched_.empty()) check_peers_locked(Clock::now());
            if (ctx.has_completions()) return ok();
            if (deadline_passed(deadline)) return Errc::timeout;
            // Block only when the provider says nothing is pending (fi_trywait), else poll.
            block_ok = true;
            if (prov_.wait_fd) {
                fid* f = &cq_->fid;
                block_ok = fi_trywait(fabric_, &f, 1) == FI_SUCCESS;
            }
            watching = !watched_.empty();
        }
        if (!block_ok) continue;
        if (!ctx.prepare_block()) return ok();
        int ms = ms_until(deadline);
        // Without a wait fd (shm): a bounded poll-sleep. With watched peers: wake to probe.
        if (!prov_.wait_fd) ms = (ms < 0 || ms > 1) ? 1 : ms;
        if (watching) {
            int cap = int(
                std::chrono::duration_cast<std::chrono::milliseconds>(kProbeCheckEvery).count());
            if (ms < 0 || ms > cap) ms = cap;
        }
        epoll_event ev;
        ::epoll_wait(oc.block_fd(), &ev, 1, ms);
        ctx.end_block();
        ctx.drain_event_fd();
        uint64_t ticks;
        while (::read(timer_fd_, &ticks, sizeof ticks) > 0) {
        }
    }
}

bool OfiTransport::try_wait() {
    std::lock_guard g(mu_);
    if (prov_.wait_fd) {
        fid* f = &cq_->fid;
        if (fi_trywait(fabric_, &f, 1) != FI_SUCCESS) return false;
    }
    // The timer makes progress_fd() readable for what no fd announces: the poll-sleep without
    // a wait fd, and the probing of watched peers.
    uint64_t ticks;
    while (::read(timer_fd_, &ticks, sizeof ticks) > 0) {
    }
    itimerspec its{};
    if (!prov_.wait_fd)
        its.it_value.tv_nsec = long(std::chrono::nanoseconds(kPollSleep).count());
    else if (!watched_.empty())
        its.it_value.tv_nsec = long(std::chrono::nanoseconds(kProbeCheckEvery).count());
    ::timerfd_settime(timer_fd_, 0, &its, nullptr);
    return true;
}

}  // namespace talaria::na::ofi
