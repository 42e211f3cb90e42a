// bulk::Handle: registration of local segments, and the encoding peers exchange
// (docs/protocol.md, "bulk handle").
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "bulk/handle_impl.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/util/log.hpp"

namespace talaria::bulk {

namespace {

bool valid_access(Access a) noexcept {
    return a == Access::read_only || a == Access::write_only || a == Access::read_write;
}

/// Returned by owner() when a handle has none (a reference must outlive the call).
const na::Addr& no_addr() noexcept {
    static const na::Addr empty;
    return empty;
}

/// Append a u32 length followed by the bytes `write(span) -> Result<size_t>` produces into at
/// most `max` bytes (the serialize_size the transport announced).
template <class WriteFn>
Result<void> write_blob(proc::Encoder& out, std::size_t max, WriteFn&& write, const char* what) {
    if (max == 0 || max > UINT32_MAX)
        return Error(Errc::internal,
                     fmt::format("bulk handle: {} size {} is implausible", what, max));
    // Written where the encoding is (a send buffer's room, or the vector): the length prefix,
    // then at most `max` bytes, the unused ones given back.
    std::span<std::byte> dst = out.take(4 + max);
    auto w = write(dst.subspan(4));
    if (!w) return Error(w.code(), fmt::format("bulk handle: {}: {}", what, w.error().describe()));
    if (*w == 0 || *w > max)
        return Error(Errc::internal,
                     fmt::format("bulk handle: {} wrote {} bytes of {} allowed", what, *w, max));
    auto n = static_cast<uint32_t>(*w);
    std::memcpy(dst.data(), &n, 4);
    out.give_back(max - *w);
    return ok();
}

}  // namespace

std::size_t Handle::Impl::segment_at(uint64_t off) const noexcept {
    // The first segment whose offset is greater than `off`, minus one.
    auto it = std::upper_bound(segs.begin(), segs.end(), off,
                               [](uint64_t o, const Seg& s) { return o < s.offset; });
    return static_cast<std::size_t>(it - segs.begin()) - 1;
}

// --- creation and accessors ----------------------------------------------------------------------

Result<Handle> Handle::create(na::Transport& transport, std::span<const Segment> segments,
                              Access access, bool embed_owner) {
    if (transport.inherited()) [[unlikely]]
        return Error(Errc::invalid_state,
                     fmt::format("bulk::Handle::create: the transport was opened by process {} "
                                 "and inherited across fork; open an engine in this process",
                                 transport.opened_by()));
    if (embed_owner && !transport.listens()) [[unlikely]]
        return Error(Errc::invalid_argument,
                     fmt::format("bulk::Handle::create: embed_owner (bind_owner) names this "
                                 "process as the owner to whoever the handle reaches, but {} "
                                 "does not listen, so a process it has not contacted cannot "
                                 "reach it: open it with listen (na::Options::listen; "
                                 "talaria::listen for an Engine), or leave embed_owner off (the "
                                 "process the handle is sent to then takes the sender as its "
                                 "owner)",
                                 transport.addr_to_string(transport.addr_self())));
    // No segments, or only empty ones: a zero-size handle (nothing registered; a transfer of
    // 0 bytes from or to it completes at once). Empty segments among others are skipped.
    if (segments.size() > UINT32_MAX)
        return Error(Errc::invalid_argument,
                     fmt::format("bulk::Handle::create: {} segments (at most 2^32-1 encode)",
                                 segments.size()));
    if (!valid_access(access))
        return Error(Errc::invalid_argument,
                     fmt::format("bulk::Handle::create: invalid access {}", unsigned(access)));
    uint64_t total = 0;
    for (std::size_t i = 0; i < segments.size(); ++i) {
        const Segment& s = segments[i];
        if (s.size > 0 && s.data == nullptr)
            return Error(Errc::invalid_argument,
                         fmt::format("bulk::Handle::create: segment {} is {} bytes at a null "
                                     "pointer",
                                     i, s.size));
        if (s.size > std::numeric_limits<uint64_t>::max() - total)
            return Error(Errc::invalid_argument,
                         "bulk::Handle::create: the segment sizes overflow 64 bits");
        total += s.size;
    }

    auto impl = std::make_shared<Impl>();
    impl->transport = &transport;
    impl->access = access;
    impl->local = true;
    impl->embed_owner = embed_owner;
    impl->size = total;
    impl->segs.reserve(segments.size());
    uint64_t off = 0;
    for (std::size_t i = 0; i < segments.size(); ++i) {
        const Segment& s = segments[i];
        if (s.size == 0) continue;
        auto m = transport.mem_register(s.data, s.size, access);
        // The segments registered so far are deregistered when `impl` goes.
        if (!m)
            return Error(m.code(), fmt::format("bulk::Handle::create: segment {} ({} bytes): {}", i,
                                               s.size, m.error().describe()));
        impl->segs.push_back({off, s.size, static_cast<std::byte*>(s.data), std::move(*m)});
        off += s.size;
    }
    return Handle(std::shared_ptr<const Impl>(std::move(impl)));
}

std::size_t Handle::size() const noexcept {
    return impl_ ? static_cast<std::size_t>(impl_->size) : 0;
}

Access Handle::access() const noexcept {
    return impl_ ? impl_->access : Access::read_only;
}

bool Handle::local() const noexcept {
    return impl_ && impl_->local;
}

std::size_t Handle::segment_count() const noexcept {
    return impl_ ? impl_->segs.size() : 0;
}

na::Transport* Handle::transport() const noexcept {
    return impl_ ? impl_->transport : nullptr;
}

const na::Addr& Handle::owner() const noexcept {
    return impl_ ? impl_->owner : no_addr();
}

bool Handle::is_inline() const noexcept {
    return impl_ && impl_->is_inline;
}

bool Handle::owner_unreachable() const noexcept {
    return impl_ && impl_->relayed;
}

// --- encoding ------------------------------------------------------------------------------------

Result<void> Handle::encode(std::vector<std::byte>& out) const {
    proc::Encoder e(out);
    return encode(e);
}

Result<void> Handle::encode(proc::Encoder& e) const {
    if (!impl_) {
        // A null handle travels too (an optional buffer): one byte.
        e.write<uint8_t>(static_cast<uint8_t>(kEncodingVersion << 4 | kFlagNull));
        if (!e.ok()) return e.error();
        return ok();
    }
    const Impl& im = *impl_;
    na::Transport& t = *im.transport;
    // Small read-only local handles travel with their bytes: the peer's pull is then a memcpy.
    bool inl =
        im.is_inline || (im.local && im.access == Access::read_only && im.size <= kInlineMax);
    na::Addr owner;
    bool deaf = false;     // the owner does not listen
    bool relayed = false;  // ... and is not the sender: no owner at all
    if (im.local) {
        if (im.embed_owner)
            owner = t.addr_self();
        else
            deaf = !t.listens();
    } else if (im.owner_does_not_listen || im.relayed) {
        deaf = relayed = true;  // a third party could not reach it: say so, name nobody
    } else {
        owner = im.owner;  // forwarding keeps the owner, so a third party can reach it
    }

    const std::size_t start = e.mark();
    auto fail = [&](Error err) -> Result<void> {
        e.rollback(start);  // leave nothing half-written
        return err;
    };
    uint8_t flags = (inl ? kFlagInline : 0) | (owner || relayed ? kFlagHasOwner : 0) |
                    (deaf ? kFlagOwnerDoesNotListen : 0);
    e.write<uint8_t>(static_cast<uint8_t>(kEncodingVersion << 4 | flags));
    e.write<uint8_t>(static_cast<uint8_t>(im.access));
    e.write<uint32_t>(static_cast<uint32_t>(im.segs.size()));
    e.write<uint64_t>(im.size);
    for (std::size_t i = 0; i < im.segs.size(); ++i) {
        const Impl::Seg& s = im.segs[i];
        e.write<uint64_t>(s.size);
        if (inl) {
            // A local handle's bytes as they are now; a decoded inline handle's as received.
            const std::byte* src = im.is_inline ? im.bytes.data() + s.offset : s.data;
            e.write_bytes(src, s.size);
            continue;
        }
        auto r = write_blob(
            e, t.mem_serialize_size(s.mem),
            [&](std::span<std::byte> dst) { return t.mem_serialize(s.mem, dst); }, "memory handle");
        if (!r) return fail(Error(r.code(), fmt::format("segment {}: {}", i, r.error().message())));
    }
    if (owner) {
        auto r = write_blob(
            e, t.addr_serialize_size(owner),
            [&](std::span<std::byte> dst) { return t.addr_serialize(owner, dst); },
            "owner address");
        if (!r) return fail(r.error());
    }
    if (!e.ok()) return fail(e.error());
    return ok();
}

// --- decoding ------------------------------------------------------------------------------------

Result<Handle> Handle::decode(proc::Decoder& d) {
    // Every failure also fails the decoder, so an archive stops at the first bad field.
    auto fail = [&d](Errc code, std::string msg) -> Error {
        d.fail(code, msg);
        return Error(code, std::move(msg));
    };
    if (!d.ok()) return d.error();
    na::Transport* t = d.context().transport;
    if (!t)
        return fail(Errc::invalid_argument,
                    "bulk handle: decoding needs a transport in the DecodeContext");
    const na::Addr* source = d.context().source;
    if (source && *source && source->impl()->transport() != t)
        return fail(Errc::invalid_argument,
                    "bulk handle: the DecodeContext's source belongs to another transport");

    auto vf = d.read<uint8_t>();
    if (!d.ok()) return d.error();
    if ((vf >> 4) != kEncodingVersion)
        return fail(Errc::protocol_error,
                    fmt::format("bulk handle: encoding version {} (this build reads {})", vf >> 4,
                                kEncodingVersion));
    uint8_t flags = vf & 0x0f;
    if (flags & ~kFlagsKnown)
        return fail(Errc::protocol_error,
                    fmt::format("bulk handle: unknown flags {:#x}", unsigned(flags)));
    if (flags & kFlagNull) {
        if (flags != kFlagNull)
            return fail(
                Errc::protocol_error,
                fmt::format("bulk handle: the null flag with others ({:#x})", unsigned(flags)));
        return Handle();
    }
    auto acc = d.read<uint8_t>();
    if (!d.ok()) return d.error();
    auto access = static_cast<Access>(acc);
    if (!valid_access(access))
        return fail(Errc::protocol_error,
                    fmt::format("bulk handle: invalid access {}", unsigned(acc)));
    bool inl = flags & kFlagInline;
    if (inl && access != Access::read_only)
        return fail(Errc::protocol_error, "bulk handle: an inline handle must be read_only");

    // Each segment needs at least its u64 length plus one byte (inline) or a u32 length plus
    // one byte of memory handle: a count the input cannot hold fails before anything is
    // allocated by it.
    std::size_t count = d.read_length(inl ? 8 + 1 : 8 + 4 + 1);
    auto total = d.read<uint64_t>();
    if (!d.ok()) return d.error();
    if (count == 0 && total != 0)
        return fail(Errc::protocol_error,
                    fmt::format("bulk handle: zero segments but a total of {} bytes", total));
    if (total > std::numeric_limits<std::size_t>::max())
        return fail(Errc::protocol_error,
                    fmt::format("bulk handle: total size {} does not fit this host", total));
    if (inl && total > kInlineMax)
        return fail(
            Errc::protocol_error,
            fmt::format("bulk handle: inline size {} exceeds the maximum {}", total, kInlineMax));

    auto impl = std::make_shared<Impl>();
    impl->transport = t;
    impl->access = access;
    impl->is_inline = inl;
    impl->size = total;
    impl->segs.reserve(count);
    if (inl) impl->bytes.reserve(static_cast<std::size_t>(total));
    uint64_t sum = 0;
    for (std::size_t i = 0; i < count; ++i) {
        auto len = d.read<uint64_t>();
        if (!d.ok()) return d.error();
        if (len == 0)
            return fail(Errc::protocol_error,
                        fmt::format("bulk handle: segment {} has length 0", i));
        if (len > total - sum)
            return fail(Errc::protocol_error,
                        fmt::format("bulk handle: segments 0..{} add up to more than the total "
                                    "size {}",
                                    i, total));
        Impl::Seg seg;
        seg.offset = sum;
        seg.size = len;
        if (inl) {
            auto b = d.take(static_cast<std::size_t>(len));
            if (!d.ok()) return d.error();
            impl->bytes.insert(impl->bytes.end(), b.begin(), b.end());
        } else {
            auto mlen = d.read<uint32_t>();
            if (!d.ok()) return d.error();
            if (mlen == 0)
                return fail(Errc::protocol_error,
                            fmt::format("bulk handle: segment {} has an empty memory handle", i));
            auto mb = d.take(mlen);
            if (!d.ok()) return d.error();
            auto m = t->mem_deserialize(mb);
            if (!m)
                return fail(Errc::protocol_error,
                            fmt::format("bulk handle: segment {}: memory handle: {}", i,
                                        m.error().describe()));
            if ((*m)->length() != len)
                return fail(Errc::protocol_error,
                            fmt::format("bulk handle: segment {} is {} bytes but its memory "
                                        "handle covers {}",
                                        i, len, (*m)->length()));
            if ((*m)->access() != access)
                return fail(Errc::protocol_error,
                            fmt::format("bulk handle: segment {}'s memory handle has access {}, "
                                        "the handle {}",
                                        i, unsigned((*m)->access()), unsigned(access)));
            seg.mem = std::move(*m);
        }
        impl->segs.push_back(std::move(seg));
        sum += len;
    }
    if (sum != total)
        return fail(
            Errc::protocol_error,
            fmt::format("bulk handle: segments add up to {} bytes, the total says {}", sum, total));
    if ((flags & kFlagOwnerDoesNotListen) && (flags & kFlagHasOwner)) {
        impl->relayed = true;  // no address follows
    } else if (flags & kFlagHasOwner) {
        auto alen = d.read<uint32_t>();
        if (!d.ok()) return d.error();
        if (alen == 0) return fail(Errc::protocol_error, "bulk handle: empty owner address");
        auto ab = d.take(alen);
        if (!d.ok()) return d.error();
        auto a = t->addr_deserialize(ab);
        if (!a)
            return fail(Errc::protocol_error,
                        fmt::format("bulk handle: owner address: {}", a.error().describe()));
        impl->owner = std::move(*a);
    } else if (source) {
        impl->owner = *source;
        impl->owner_does_not_listen = flags & kFlagOwnerDoesNotListen;
    }
    TALARIA_LOG(bulk, trace, "decoded a {}-byte handle of {} segments{}{}{}", total, count,
                inl ? ", inline" : "", (flags & kFlagHasOwner) ? ", with owner" : "",
                impl->relayed                 ? " (relayed; its owner does not listen)"
                : impl->owner_does_not_listen ? " (its owner does not listen)"
                                              : "");
    return Handle(std::shared_ptr<const Impl>(std::move(impl)));
}

}  // namespace talaria::bulk
