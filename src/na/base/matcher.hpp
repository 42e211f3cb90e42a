// The software matcher shared by the transports that match messages themselves (tcp, ofi
// without provider tag matching, ucx): per-context unexpected queues, expected matching on
// (source, tag), routing an unexpected message to the context that takes it, and the queue of
// messages that arrived before their receive. docs/architecture.md, "Messages" and "Matching".
//
// The matcher owns the queued messages (from its own free list, reused) and the lists of posted
// receives; it never owns the operations and never completes them: it hands back the receive a
// message goes to (or the message a new receive takes), and the transport copies and completes,
// since what a completion touches (op state, watch counts, provider requests) is its own. No
// lock of its own: call it under the lock that guards the state it belongs to.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "na/base/op.hpp"
#include "talaria/na/na.hpp"
#include "talaria/util/intrusive_list.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

/// A message that arrived before a receive for it was posted, copied off the wire. A
/// transport that holds messages for reasons of its own (ucx: out of order) derives from it.
struct QueuedMsg : ListHook<> {
    Addr source;
    Tag tag = 0;
    uint8_t context_id = 0;  ///< the destination context the sender named
    bool expected = false;
    std::vector<std::byte> data;  ///< capacity kept across reuse
    /// A count of bytes this message is charged to while it waits (a transport's per-peer
    /// backlog, set by the transport after it was queued), paid back when it is freed.
    std::atomic<std::size_t>* charge = nullptr;
};

/// Copy a `len`-byte message into a receive buffer of `cap` bytes: ok, or message_too_large
/// (nothing copied) when it does not fit.
inline Errc copy_message(const std::byte* data, std::size_t len, std::byte* buf,
                         std::size_t cap) noexcept {
    if (len > cap) return Errc::message_too_large;
    if (len != 0) std::memcpy(buf, data, len);
    return Errc::ok;
}

/// Early expected messages one matcher keeps at most, by count and by payload bytes. An expected
/// message answers a receive its receiver posts (the core posts them before it asks), so a
/// pile of early ones is a peer sending what nobody asked for: beyond these bounds the newest
/// is dropped (Queued::full) instead of holding memory without a bound.
inline constexpr std::size_t kMaxEarlyExpected = 4096;
inline constexpr std::size_t kMaxEarlyExpectedBytes = std::size_t{32} << 20;

/// Would one more early expected message of `size` bytes, on top of `count` messages holding
/// `bytes`, pass those bounds? (The matcher's own check; sm's lanes and tcp's inboxes use it.)
inline bool early_expected_full(std::size_t count, std::size_t bytes, std::size_t size) noexcept {
    return count >= kMaxEarlyExpected || bytes + size > kMaxEarlyExpectedBytes;
}

/// Why an early expected message was dropped at those bounds, for a log line.
inline std::string early_expected_refusal(std::size_t count, std::size_t bytes) {
    return fmt::format(
        "{} early expected messages ({} bytes) already wait for receives, the most kept (post "
        "expected receives before the peer sends; a peer that sends what nobody asked for is "
        "misbehaving)",
        count, bytes);
}

/// Unexpected messages one matcher keeps at most, through queue_copy(), for the transports that
/// cannot hold a sender back (ofi, ucx: the provider hands over what arrived; tcp and sm stop
/// reading a sender long before these): beyond them the newest is dropped and logged. With a
/// charge (the sender's count of queued bytes), one sender keeps at most
/// kMaxQueuedUnexpectedPerPeer, so that a flood from one peer drops its own messages, not its
/// neighbours'.
inline constexpr std::size_t kMaxQueuedUnexpected = 8192;
inline constexpr std::size_t kMaxQueuedUnexpectedBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxQueuedUnexpectedPerPeer = std::size_t{16} << 20;

/// The tail of a log line for refusals that Matcher::log_refusal() kept out of the log.
inline std::string unlogged_note(std::size_t unlogged) {
    return unlogged == 0
               ? std::string()
               : fmt::format(" ({} more refused since the last such line, not logged)", unlogged);
}

/// What became of a message no receive waited for.
enum class Queued : uint8_t {
    ok,               ///< queued until a receive takes it
    no_context,       ///< unexpected, and no context here takes unexpected messages: dropped
    full,             ///< expected, and kMaxEarlyExpected(Bytes) are reached: dropped
    unexpected_full,  ///< unexpected, and kMaxQueuedUnexpected(Bytes) are reached: dropped
    peer_full,        ///< unexpected, and its sender's kMaxQueuedUnexpectedPerPeer: dropped
};

/// OpT: a transport's op type, derived from Op (its ListHook<> links it on one list here), with
/// `Tag match_tag`, and the Addr member `Source` (default `match_source`) that an expected
/// receive's source is kept in (set here).
template <class OpT, class MsgT = QueuedMsg, Addr OpT::*Source = &OpT::match_source>
class Matcher {
  public:
    explicit Matcher(std::size_t max_contexts) : slots_(max_contexts) {}
    ~Matcher() { clear(); }
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // --- contexts -------------------------------------------------------------------------
    /// Context `ctx` (id < max_contexts) receives from now on.
    void attach(const Context* ctx) noexcept { slots_[ctx->id()].ctx = ctx; }
    /// The context attached under `id`, or nullptr.
    [[nodiscard]] const Context* context(uint8_t id) const noexcept { return slots_[id].ctx; }
    /// Context `id` is going: its posted unexpected receives are removed and handed to
    /// `on_posted(OpT*)` (the caller completes them), and so are the expected receives it
    /// posted; the unexpected messages queued for it are dropped.
    template <class F>
    void detach(uint8_t id, F&& on_posted) {
        Slot& s = slots_[id];
        const Context* ctx = s.ctx;
        s.ctx = nullptr;
        while (OpT* op = s.posted.pop_front())
            on_posted(op);
        while (MsgT* m = s.msgs.pop_front()) {
            unqueued(*m);
            msg_free(m);
        }
        if (ctx == nullptr) return;
        expected_.for_each_safe([&](OpT& op) {
            if (op.ctx != ctx) return;
            expected_.erase(op);
            on_posted(&op);
        });
    }

    // --- receives ---------------------------------------------------------------------------
    /// An unexpected receive on context `ctx_id`: the queued message it takes at once (hand it
    /// over with deliver()), or nullptr, and `op` waits for one.
    MsgT* post_unexpected(uint8_t ctx_id, OpT* op) noexcept {
        Slot& s = slots_[ctx_id];
        if (MsgT* m = s.msgs.pop_front()) {
            unqueued(*m);
            return m;
        }
        s.posted.push_back(*op);
        return nullptr;
    }
    /// An expected receive from `source` with `tag`: the queued message it takes (first come,
    /// first matched), or nullptr, and `op` (with its Source and match_tag set) waits for it.
    MsgT* post_expected(OpT* op, const Addr& source, Tag tag) {
        for (MsgT& m : early_expected_) {
            if (m.source == source && m.tag == tag) {
                early_expected_.erase(m);
                early_bytes_ -= m.data.size();
                return &m;
            }
        }
        op->*Source = source;
        op->match_tag = tag;
        expected_.push_back(*op);
        return nullptr;
    }
    /// An unexpected receive that lost the message it was taking (its sender died mid-message)
    /// goes back to the head of its context's queue. False when its context left meanwhile.
    bool repost_front(OpT* op) noexcept {
        Slot& s = slots_[op->ctx->id()];
        if (s.ctx == nullptr) return false;
        s.posted.push_front(*op);
        return true;
    }
    /// Take back a receive posted here and still waiting (cancel).
    void withdraw(OpT* op) noexcept {
        if (op->completion.type == OpType::recv_unexpected)
            slots_[op->ctx->id()].posted.erase(*op);
        else
            expected_.erase(*op);
    }
    /// The expected receives waiting for a message from `source`: removed and handed to
    /// `f(OpT*)` (a dead peer fails them).
    template <class F>
    void take_expected_from(const Addr& source, F&& f) {
        expected_.for_each_safe([&](OpT& op) {
            if (op.*Source != source) return;
            expected_.erase(op);
            f(&op);
        });
    }

    /// Free the early expected messages whose source `gone(const Addr&)` says is gone (tcp: a
    /// peer whose connections have all closed, whose waiting receives have failed). Returns
    /// how many were freed. Their buffers go back to the allocator, not to the free list: a
    /// peer must not leave what it made us hold as capacity kept for reuse.
    template <class Gone>
    std::size_t drop_early_if(Gone&& gone) noexcept {
        std::size_t n = 0;
        early_expected_.for_each_safe([&](MsgT& m) {
            if (!gone(m.source)) return;
            early_expected_.erase(m);
            early_bytes_ -= m.data.size();
            std::vector<std::byte>().swap(m.data);
            msg_free(&m);
            ++n;
        });
        return n;
    }
    /// Early expected messages waiting for their receives.
    [[nodiscard]] std::size_t early_count() const noexcept { return early_expected_.size(); }

    // --- messages ---------------------------------------------------------------------------
    /// Where an arriving message goes. Returns the waiting receive it completes (removed from
    /// its list), or nullptr: then queue it with queue_copy(), unless `*no_context` says that no
    /// context takes it (unexpected, and this side has no context that takes unexpected
    /// messages: drop it, and say so). An unexpected message naming a context that does not
    /// exist or takes none goes to the lowest one that does (route_unexpected).
    OpT* match(bool expected, uint8_t ctx_id, const Addr& source, Tag tag,
               bool* no_context) noexcept {
        *no_context = false;
        if (!expected) {
            Slot* s = route(ctx_id);
            if (s == nullptr) {
                *no_context = true;
                return nullptr;
            }
            return s->posted.pop_front();
        }
        for (OpT& op : expected_) {
            if (op.*Source == source && op.match_tag == tag) {
                expected_.erase(op);
                return &op;
            }
        }
        return nullptr;
    }
    /// Queue a copy of a message no receive waits for (match() returned nullptr), unless it
    /// is refused (no_context, full, unexpected_full, peer_full: then nothing is copied and the
    /// caller logs why, with refusal()). An unexpected message is charged to `charge` (its
    /// sender's queued bytes, paid back when it leaves) when one is given.
    Queued queue_copy(bool expected, uint8_t ctx_id, const Addr& source, Tag tag,
                      std::span<const std::byte> data, std::atomic<std::size_t>* charge = nullptr) {
        if (!expected && route(ctx_id) == nullptr) return Queued::no_context;
        if (expected && early_full(data.size())) return Queued::full;
        if (!expected) {
            if (unexpected_count_ >= kMaxQueuedUnexpected ||
                unexpected_bytes_ + data.size() > kMaxQueuedUnexpectedBytes)
                return Queued::unexpected_full;
            if (charge &&
                charge->load(std::memory_order_relaxed) + data.size() > kMaxQueuedUnexpectedPerPeer)
                return Queued::peer_full;
        }
        MsgT* m = msg_alloc();
        if (!expected && charge) {
            m->charge = charge;
            charge->fetch_add(data.size(), std::memory_order_relaxed);
        }
        m->source = source;
        m->tag = tag;
        m->context_id = ctx_id;
        m->expected = expected;
        m->data.assign(data.begin(), data.end());
        return queue(m);
    }
    /// Queue message `m` (every field set) that no receive waits for. Refused (no_context,
    /// full): `m` is freed and the caller logs why.
    Queued queue(MsgT* m) noexcept {
        if (m->expected) {
            if (early_full(m->data.size())) {
                msg_free(m);
                return Queued::full;
            }
            early_bytes_ += m->data.size();
            early_expected_.push_back(*m);
            return Queued::ok;
        }
        Slot* s = route(m->context_id);
        if (s == nullptr) {
            msg_free(m);
            return Queued::no_context;
        }
        s->msgs.push_back(*m);
        ++unexpected_count_;
        unexpected_bytes_ += m->data.size();
        return Queued::ok;
    }
    /// A message that was read into `m` while receives may have been posted (tcp reads a
    /// payload over several polls): the receive it completes, or nullptr and `*how` says
    /// whether it was queued or refused (and freed).
    OpT* match_or_queue(MsgT* m, Queued* how) noexcept {
        bool none = false;
        *how = Queued::ok;
        if (OpT* op = match(m->expected, m->context_id, m->source, m->tag, &none)) return op;
        *how = queue(m);
        return nullptr;
    }
    /// Whether to log a refused message now: the first of a burst at once, then at most one line
    /// a second, `*unlogged` saying how many were refused since the last line (a peer flooding
    /// what nobody receives must not flood the log too).
    bool log_refusal(std::size_t* unlogged) noexcept {
        auto held = refusals_log_.admit();
        if (!held) return false;
        *unlogged = std::size_t(*held);
        return true;
    }
    /// Why a message was refused, for the transport's log line.
    [[nodiscard]] std::string refusal(Queued q) const {
        if (q == Queued::no_context) return "no context here takes unexpected messages";
        if (q == Queued::unexpected_full)
            return fmt::format(
                "{} unexpected messages ({} bytes) already wait for receives here, the most kept "
                "(post receives faster, or bound what callers send: core::Options::peer_window, "
                "max_requests)",
                unexpected_count_, unexpected_bytes_);
        if (q == Queued::peer_full)
            return fmt::format(
                "that sender's unexpected messages waiting here would pass {} MiB, the most kept "
                "for one peer (it sends faster than receives are posted)",
                kMaxQueuedUnexpectedPerPeer >> 20);
        return early_expected_refusal(early_expected_.size(), early_bytes_);
    }
    /// Hand early message `m` (from post_unexpected, post_expected or match_or_queue) to
    /// receive `op` (it needs `buf` and `cap`): copy it in, or message_too_large when it does
    /// not fit, call `complete(op, source, context_id, tag, size, status)`, free `m`.
    template <class Complete>
    void deliver(MsgT* m, OpT* op, Complete&& complete) {
        Errc st = copy_message(m->data.data(), m->data.size(), op->buf, op->cap);
        complete(op, m->source, m->context_id, m->tag, m->data.size(), st);
        msg_free(m);
    }

    // --- message storage -------------------------------------------------------------------
    MsgT* msg_alloc() {
        if (free_.empty()) {
            all_.push_back(std::make_unique<MsgT>());
            return all_.back().get();
        }
        MsgT* m = free_.back();
        free_.pop_back();
        return m;
    }
    void msg_free(MsgT* m) noexcept {
        if (m->charge) {  // before the source goes: it may keep the charged peer alive
            m->charge->fetch_sub(m->data.size(), std::memory_order_relaxed);
            m->charge = nullptr;
        }
        m->source.reset();
        free_.push_back(m);
    }

    /// Drop everything (transport teardown): waiting receives are unlinked (the ops are the
    /// caller's), queued messages freed and their addresses released.
    void clear() noexcept {
        for (Slot& s : slots_) {
            s.posted.clear();
            while (MsgT* m = s.msgs.pop_front())
                msg_free(m);
        }
        unexpected_count_ = 0;
        unexpected_bytes_ = 0;
        expected_.clear();
        while (MsgT* m = early_expected_.pop_front())
            msg_free(m);
        early_bytes_ = 0;
    }
    /// Queued messages and waiting receives (for tests and leak checks).
    [[nodiscard]] std::size_t queued() const noexcept {
        std::size_t n = early_expected_.size();
        for (const Slot& s : slots_)
            n += s.msgs.size();
        return n;
    }
    /// Unexpected messages queued for receives not yet posted, and their payload bytes (a
    /// transport bounds them: tcp stops reading the connections that bring more).
    [[nodiscard]] std::size_t unexpected_count() const noexcept { return unexpected_count_; }
    [[nodiscard]] std::size_t unexpected_bytes() const noexcept { return unexpected_bytes_; }
    [[nodiscard]] std::size_t waiting() const noexcept {
        std::size_t n = expected_.size();
        for (const Slot& s : slots_)
            n += s.posted.size();
        return n;
    }

  private:
    struct Slot {
        const Context* ctx = nullptr;
        IntrusiveList<OpT> posted;  ///< unexpected receives waiting, in post order
        IntrusiveList<MsgT> msgs;   ///< unexpected messages waiting, in arrival order
    };
    [[nodiscard]] bool early_full(std::size_t size) const noexcept {
        return early_expected_full(early_expected_.size(), early_bytes_, size);
    }
    void unqueued(const MsgT& m) noexcept {
        --unexpected_count_;
        unexpected_bytes_ -= m.data.size();
    }
    Slot* route(uint8_t id) noexcept {
        return route_unexpected(slots_, slots_.size(), id, [](const Slot& s) { return s.ctx; });
    }

    std::vector<Slot> slots_;
    IntrusiveList<OpT> expected_;         ///< expected receives waiting, in post order
    IntrusiveList<MsgT> early_expected_;  ///< expected messages waiting, in arrival order
    std::size_t early_bytes_ = 0;         ///< their payload bytes (kMaxEarlyExpectedBytes)
    log::Limiter refusals_log_;           ///< log_refusal()
    std::size_t unexpected_count_ = 0;    ///< messages on the slots' msgs lists
    std::size_t unexpected_bytes_ = 0;    ///< their payload bytes
    std::vector<MsgT*> free_;
    std::vector<std::unique_ptr<MsgT>> all_;
};

}  // namespace talaria::na
