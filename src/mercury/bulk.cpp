// HG_Bulk_*: bulk handles and transfers of Mercury's C API over Talaria's bulk layer
// (include/talaria/mercury/mercury_bulk.h says what each does), and their proc.
//
// A handle keeps the program's segments as given (zero-size ones included) and the memory the
// library allocated for NULL pointers, and registers the segments that hold bytes as one
// talaria::bulk::Handle (none when the total is zero). HG_Bulk_bind registers them again with
// the class's address embedded. The encoding (HG_Bulk_serialize) is a byte of flags, the total
// size (uint64_t), the segment count (uint32_t), then Talaria's own handle encoding when the
// total is not zero (docs/protocol.md, "bulk handle"). A decoded handle is remote: it names the
// sender's memory and can only be transferred against.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "mercury/hg_impl.hpp"
#include "mercury_bulk.h"
#include "mercury_proc_bulk.h"
#include "talaria/proc/archive.hpp"
#include "talaria/util/log.hpp"

namespace tb = talaria::bulk;
using talaria::mercury::to_hg;

struct hg_bulk {
    hg_class_t* cls = nullptr;
    std::atomic<int> refs{1};
    uint8_t flags = HG_BULK_READWRITE;
    bool remote = false;
    std::vector<void*> ptrs;  // as given (local handles)
    std::vector<hg_size_t> sizes;
    std::vector<std::vector<std::byte>> owned;  // the library's segments
    hg_size_t total = 0;
    uint32_t count = 0;
    tb::Handle h;      // empty when total is 0
    hg_addr addr_obj;  // the owner, when bound or received with one
};

struct hg_op_id {
    hg_context_t* ctx = nullptr;
    tb::TransferId id;
};

namespace {

constexpr std::size_t kHeader = 1 + 8 + 4;

talaria::na::Access access_of(uint8_t flags) {
    switch (flags & HG_BULK_READWRITE) {
        case HG_BULK_READ_ONLY:
            return talaria::na::Access::read_only;
        case HG_BULK_WRITE_ONLY:
            return talaria::na::Access::write_only;
        default:
            return talaria::na::Access::read_write;
    }
}

hg_return_t register_segments(hg_bulk* b, bool with_owner) {
    if (b->total == 0) return HG_SUCCESS;
    std::vector<tb::Segment> segs;
    for (uint32_t i = 0; i < b->count; ++i)
        if (b->sizes[i] != 0) segs.push_back({b->ptrs[i], std::size_t(b->sizes[i])});
    auto r = tb::Handle::create(b->cls->eng->context(0).na_context().transport(), segs,
                                access_of(b->flags), with_owner);
    if (!r) {
        TALARIA_LOG(bulk, error, "HG_Bulk_create: {}", r.error().describe());
        return to_hg(r.code());
    }
    b->h = std::move(*r);
    return HG_SUCCESS;
}

void count(hg_class_t* c, int d) {
    c->live.fetch_add(d, std::memory_order_relaxed);
}

struct Transfer {
    hg_context_t* ctx;
    hg_cb_t cb;
    void* arg;
    hg_bulk_op_t op;
    hg_bulk_t origin;
    hg_bulk_t local;
    hg_size_t size;
    hg_op_id* op_id;  // freed with the transfer
};

void finish(Transfer* t, hg_return_t ret) {
    hg_cb_info info{};
    info.info.bulk.origin_handle = t->origin;
    info.info.bulk.local_handle = t->local;
    info.info.bulk.op = t->op;
    info.info.bulk.size = ret == HG_SUCCESS ? t->size : 0;
    info.arg = t->arg;
    info.type = HG_CB_BULK;
    info.ret = ret;
    if (t->cb) t->cb(&info);
    HG_Bulk_free(t->origin);
    HG_Bulk_free(t->local);
    delete t->op_id;
    delete t;
}

hg_return_t transfer(hg_context_t* ctx, hg_cb_t cb, void* arg, hg_bulk_op_t op,
                     const talaria::na::Addr* peer, hg_bulk_t origin, hg_size_t origin_off,
                     hg_bulk_t local, hg_size_t local_off, hg_size_t size, hg_op_id_t* op_id_p) {
    if (!ctx || !origin || !local || (op != HG_BULK_PUSH && op != HG_BULK_PULL))
        return HG_INVALID_ARG;
    if (origin_off > origin->total || size > origin->total - origin_off ||
        local_off > local->total || size > local->total - local_off) {
        TALARIA_LOG(bulk, error,
                    "HG_Bulk_transfer: {} bytes at offsets {} (origin, {} bytes) and {} (local, "
                    "{} bytes) fall outside the handles",
                    size, origin_off, origin->total, local_off, local->total);
        return HG_OVERFLOW;
    }
    auto* t = new (std::nothrow) Transfer{ctx, cb, arg, op, origin, local, size, nullptr};
    if (!t) return HG_NOMEM;
    HG_Bulk_ref_incr(origin);  // both live until the callback has run
    HG_Bulk_ref_incr(local);
    if (op_id_p && op_id_p != HG_OP_ID_IGNORE) {
        t->op_id = new (std::nothrow) hg_op_id{ctx, {}};
        *op_id_p = t->op_id;
    }
    if (size == 0) {  // nothing moves, but the callback still runs in trigger
        auto r = ctx->ctx->na_context().post(
            [t](const talaria::na::Completion&) { finish(t, HG_SUCCESS); });
        if (!r) {
            finish(t, to_hg(r.code()));
            return HG_SUCCESS;
        }
        return HG_SUCCESS;
    }
    if (!peer || !*peer) {
        TALARIA_LOG(bulk, error,
                    "HG_Bulk_transfer: no origin address (bind the handle, or name "
                    "the address)");
        HG_Bulk_free(origin);
        HG_Bulk_free(local);
        if (t->op_id && op_id_p) *op_id_p = HG_OP_ID_NULL;
        delete t->op_id;
        delete t;
        return HG_INVALID_ARG;
    }
    const tb::Direction dir = op == HG_BULK_PULL ? tb::Direction::pull : tb::Direction::push;
    auto r = ctx->bulk->transfer(
        dir, *peer, origin->h, std::size_t(origin_off), local->h, std::size_t(local_off),
        std::size_t(size),
        [t](talaria::Result<void>&& res) { finish(t, res ? HG_SUCCESS : to_hg(res.code())); });
    if (!r) {
        TALARIA_LOG(bulk, error, "HG_Bulk_transfer: {}", r.error().describe());
        HG_Bulk_free(origin);
        HG_Bulk_free(local);
        if (t->op_id && op_id_p) *op_id_p = HG_OP_ID_NULL;
        delete t->op_id;
        delete t;
        return to_hg(r.code());
    }
    if (t->op_id) t->op_id->id = *r;
    return HG_SUCCESS;
}

}  // namespace

extern "C" {

HG_PUBLIC hg_return_t HG_Bulk_create(hg_class_t* c, uint32_t count_, void** buf_ptrs,
                                     const hg_size_t* buf_sizes, uint8_t flags, hg_bulk_t* handle) {
    if (!c || !handle || count_ == 0 || !buf_sizes) return HG_INVALID_ARG;
    if ((flags & HG_BULK_READWRITE) == 0) return HG_INVALID_ARG;
    auto* b = new (std::nothrow) hg_bulk;
    if (!b) return HG_NOMEM;
    b->cls = c;
    b->flags = flags;
    b->count = count_;
    b->ptrs.resize(count_);
    b->sizes.assign(buf_sizes, buf_sizes + count_);
    for (uint32_t i = 0; i < count_; ++i) {
        void* p = buf_ptrs ? buf_ptrs[i] : nullptr;
        if (!p && b->sizes[i] != 0) {  // the library's memory, zeroed
            b->owned.emplace_back(std::size_t(b->sizes[i]));
            p = b->owned.back().data();
        }
        b->ptrs[i] = p;
        b->total += b->sizes[i];
    }
    if (hg_return_t ret = register_segments(b, false); ret != HG_SUCCESS) {
        delete b;
        return ret;
    }
    count(c, 1);
    *handle = b;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Bulk_create_attr(hg_class_t* c, uint32_t count_, void** buf_ptrs,
                                          const hg_size_t* buf_sizes, uint8_t flags,
                                          const struct hg_bulk_attr* attrs, hg_bulk_t* handle) {
    if (attrs && attrs->mem_type != HG_MEM_TYPE_HOST) {
        TALARIA_LOG(bulk, error, "HG_Bulk_create_attr: only host memory is supported");
        return HG_OPNOTSUPPORTED;
    }
    return HG_Bulk_create(c, count_, buf_ptrs, buf_sizes, flags, handle);
}

HG_PUBLIC hg_return_t HG_Bulk_free(hg_bulk_t b) {
    if (!b) return HG_SUCCESS;
    if (b->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return HG_SUCCESS;
    hg_class_t* c = b->cls;
    delete b;
    count(c, -1);
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Bulk_ref_incr(hg_bulk_t b) {
    if (!b) return HG_INVALID_ARG;
    b->refs.fetch_add(1, std::memory_order_relaxed);
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Bulk_bind(hg_bulk_t b, hg_context_t* ctx) {
    if (!b || !ctx || b->remote) return HG_INVALID_ARG;
    // A class that does not listen cannot be reached by a process it has not contacted, so its
    // handles carry no owner: the process they are sent to takes the sender as the owner, which
    // is this class when it sends the handle itself (what Mercury's clients do). A handle such a
    // class's peer relays to a third process has no owner there, and a transfer on it fails
    // saying so.
    const bool reachable = b->cls->eng->transport().listens();
    if (hg_return_t ret = register_segments(b, reachable); ret != HG_SUCCESS) return ret;
    b->addr_obj.cls = b->cls;
    b->addr_obj.a = b->cls->eng->self();
    return HG_SUCCESS;
}

HG_PUBLIC hg_addr_t HG_Bulk_get_addr(hg_bulk_t b) {
    return b && b->addr_obj.a ? &b->addr_obj : HG_ADDR_NULL;
}

HG_PUBLIC uint8_t HG_Bulk_get_context_id(hg_bulk_t) {
    return 0;
}

HG_PUBLIC hg_return_t HG_Bulk_access(hg_bulk_t b, hg_size_t offset, hg_size_t size, uint8_t,
                                     uint32_t max_count, void** buf_ptrs, hg_size_t* buf_sizes,
                                     uint32_t* actual_count) {
    if (!b || b->remote) return HG_INVALID_ARG;
    if (offset > b->total || size > b->total - offset) return HG_OVERFLOW;
    uint32_t n = 0;
    hg_size_t at = 0;
    for (uint32_t i = 0; i < b->count && n < max_count && size > 0; ++i) {
        const hg_size_t seg = b->sizes[i];
        if (offset >= at + seg) {
            at += seg;
            continue;
        }
        const hg_size_t from = offset > at ? offset - at : 0;
        const hg_size_t len = std::min(seg - from, size);
        if (buf_ptrs) buf_ptrs[n] = static_cast<char*>(b->ptrs[i]) + from;
        if (buf_sizes) buf_sizes[n] = len;
        ++n;
        offset += len;
        size -= len;
        at += seg;
    }
    if (actual_count) *actual_count = n;
    return HG_SUCCESS;
}

HG_PUBLIC hg_size_t HG_Bulk_get_size(hg_bulk_t b) {
    return b ? b->total : 0;
}
HG_PUBLIC uint32_t HG_Bulk_get_segment_count(hg_bulk_t b) {
    return b ? b->count : 0;
}
HG_PUBLIC uint8_t HG_Bulk_get_flags(hg_bulk_t b) {
    return b ? b->flags : 0;
}

HG_PUBLIC hg_size_t HG_Bulk_get_serialize_size(hg_bulk_t b, unsigned long) {
    if (!b) return 0;
    std::vector<std::byte> enc;
    if (b->h && !b->h.encode(enc)) return 0;
    return kHeader + enc.size();
}

HG_PUBLIC hg_return_t HG_Bulk_serialize(void* buf, hg_size_t buf_size, unsigned long, hg_bulk_t b) {
    if (!buf || !b) return HG_INVALID_ARG;
    std::vector<std::byte> enc;
    if (b->h) {
        auto r = b->h.encode(enc);
        if (!r) return to_hg(r.code());
    }
    if (buf_size < kHeader + enc.size()) return HG_OVERFLOW;
    auto* out = static_cast<unsigned char*>(buf);
    out[0] = b->flags;
    const uint64_t total = b->total;
    std::memcpy(out + 1, &total, 8);
    std::memcpy(out + 9, &b->count, 4);
    if (!enc.empty()) std::memcpy(out + kHeader, enc.data(), enc.size());
    return HG_SUCCESS;
}

namespace {
/// HG_Bulk_deserialize; a handle that names no owner takes `source` (the process that sent it,
/// when it is decoded from a request or a response) as its owner.
hg_return_t deserialize(hg_class_t* c, hg_bulk_t* handle, const void* buf, hg_size_t buf_size,
                        const talaria::na::Addr* source) {
    if (!c || !handle || !buf) return HG_INVALID_ARG;
    if (buf_size < kHeader) return HG_OVERFLOW;
    const auto* in = static_cast<const unsigned char*>(buf);
    auto* b = new (std::nothrow) hg_bulk;
    if (!b) return HG_NOMEM;
    b->cls = c;
    b->remote = true;
    b->flags = in[0];
    uint64_t total = 0;
    std::memcpy(&total, in + 1, 8);
    std::memcpy(&b->count, in + 9, 4);
    b->total = total;
    if (total != 0) {
        talaria::proc::Decoder d(
            {reinterpret_cast<const std::byte*>(in) + kHeader, std::size_t(buf_size - kHeader)},
            {&c->eng->context(0).na_context().transport(), source});
        auto r = tb::Handle::decode(d);
        if (!r || r->size() != total) {
            TALARIA_LOG(bulk, error, "HG_Bulk_deserialize: {}",
                        r ? "the sizes disagree" : r.error().describe());
            delete b;
            return HG_PROTOCOL_ERROR;
        }
        b->h = std::move(*r);
        if (b->h.owner()) {
            b->addr_obj.cls = c;
            b->addr_obj.a = b->h.owner();
        }
    }
    count(c, 1);
    *handle = b;
    return HG_SUCCESS;
}
}  // namespace

HG_PUBLIC hg_return_t HG_Bulk_deserialize(hg_class_t* c, hg_bulk_t* handle, const void* buf,
                                          hg_size_t buf_size) {
    return deserialize(c, handle, buf, buf_size, nullptr);
}

HG_PUBLIC hg_return_t HG_Bulk_transfer(hg_context_t* ctx, hg_cb_t cb, void* arg, hg_bulk_op_t op,
                                       hg_addr_t origin_addr, hg_bulk_t origin,
                                       hg_size_t origin_off, hg_bulk_t local, hg_size_t local_off,
                                       hg_size_t size, hg_op_id_t* op_id) {
    return transfer(ctx, cb, arg, op, origin_addr ? &origin_addr->a : nullptr, origin, origin_off,
                    local, local_off, size, op_id);
}

HG_PUBLIC hg_return_t HG_Bulk_transfer_id(hg_context_t* ctx, hg_cb_t cb, void* arg, hg_bulk_op_t op,
                                          hg_addr_t origin_addr, uint8_t, hg_bulk_t origin,
                                          hg_size_t origin_off, hg_bulk_t local,
                                          hg_size_t local_off, hg_size_t size, hg_op_id_t* op_id) {
    return HG_Bulk_transfer(ctx, cb, arg, op, origin_addr, origin, origin_off, local, local_off,
                            size, op_id);
}

HG_PUBLIC hg_return_t HG_Bulk_bind_transfer(hg_context_t* ctx, hg_cb_t cb, void* arg,
                                            hg_bulk_op_t op, hg_bulk_t origin, hg_size_t origin_off,
                                            hg_bulk_t local, hg_size_t local_off, hg_size_t size,
                                            hg_op_id_t* op_id) {
    if (!origin) return HG_INVALID_ARG;
    return transfer(ctx, cb, arg, op, origin->addr_obj.a ? &origin->addr_obj.a : nullptr, origin,
                    origin_off, local, local_off, size, op_id);
}

HG_PUBLIC hg_return_t HG_Bulk_cancel(hg_op_id_t op_id) {
    if (!op_id || op_id == reinterpret_cast<hg_op_id_t>(1)) return HG_INVALID_ARG;
    if (!op_id->id.valid()) return HG_SUCCESS;  // a zero-size transfer: nothing to stop
    auto r = op_id->ctx->bulk->cancel(op_id->id);
    if (!r && r.code() != talaria::Errc::not_found) return to_hg(r.code());
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_proc_hg_bulk_t(hg_proc_t proc, void* data) {
    auto* bp = static_cast<hg_bulk_t*>(data);
    if (!proc || !bp) return HG_INVALID_ARG;
    switch (hg_proc_get_op(proc)) {
        case HG_ENCODE: {
            uint64_t size = *bp ? HG_Bulk_get_serialize_size(*bp, 0) : 0;
            hg_return_t ret = hg_proc_uint64_t(proc, &size);
            if (ret != HG_SUCCESS || size == 0) return ret;
            void* at = hg_proc_save_ptr(proc, size);
            if (!at) return HG_NOMEM;
            return HG_Bulk_serialize(at, size, 0, *bp);
        }
        case HG_DECODE: {
            uint64_t size = 0;
            hg_return_t ret = hg_proc_uint64_t(proc, &size);
            if (ret != HG_SUCCESS) return ret;
            if (size == 0) {
                *bp = HG_BULK_NULL;
                return HG_SUCCESS;
            }
            if (size > hg_proc_get_size_left(proc)) return HG_OVERFLOW;
            void* at = hg_proc_save_ptr(proc, size);
            if (!at) return HG_OVERFLOW;
            return deserialize(hg_proc_get_class(proc), bp, at, size,
                               talaria::mercury::peer_of(hg_proc_get_handle(proc)));
        }
        case HG_FREE:
            if (*bp) HG_Bulk_free(*bp);
            *bp = HG_BULK_NULL;
            return HG_SUCCESS;
    }
    return HG_INVALID_ARG;
}

}  // extern "C"
