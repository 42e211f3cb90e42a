// hg_proc_*: the encoders and decoders of Mercury's C API (include/talaria/mercury/
// mercury_proc.h says what each does).
//
// A proc is a cursor (hg_proc_cursor, which the inline scalar procs read and advance) over one
// buffer at a time: the caller's, or the extra buffer that encoding grows into once the
// caller's is full (its bytes copied over first, as Mercury does, so that the extra buffer
// holds the whole encoding). Decoding never grows: a value past the end is HG_OVERFLOW.
// Ownership: the caller's buffer stays the caller's; the extra buffer is the proc's (freed at
// reset and free) until hg_proc_set_extra_buf_is_mine(proc, true) hands it to the caller.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "mercury_proc.h"

struct hg_proc {
    hg_proc_cursor cur{};  // first: the inline procs cast the proc to it
    hg_class_t* hg_class = nullptr;
    hg_handle_t handle = nullptr;
    char* buf = nullptr;  // the caller's
    hg_size_t buf_size = 0;
    char* extra = nullptr;  // encoding's overflow (malloc'ed)
    hg_size_t extra_size = 0;
    bool extra_mine = false;  // the proc frees it
};

namespace {

hg_proc* of(hg_proc_t p) noexcept {
    return static_cast<hg_proc*>(p);
}

void drop_extra(hg_proc* p) noexcept {
    if (p->extra && p->extra_mine) std::free(p->extra);
    p->extra = nullptr;
    p->extra_size = 0;
    p->extra_mine = false;
}

hg_size_t page_size() noexcept {
    const long n = ::sysconf(_SC_PAGESIZE);
    return n > 0 ? hg_size_t(n) : 4096;
}

}  // namespace

extern "C" {

HG_PUBLIC hg_return_t hg_proc_create(hg_class_t* hg_class, hg_proc_hash_t, hg_proc_t* proc_p) {
    if (hg_class == nullptr || proc_p == nullptr) return HG_INVALID_ARG;
    auto* p = new (std::nothrow) hg_proc;
    if (!p) return HG_NOMEM;
    p->hg_class = hg_class;
    p->cur.op = HG_ENCODE;
    *proc_p = p;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_proc_create_set(hg_class_t* hg_class, void* buf, hg_size_t buf_size,
                                         hg_proc_op_t op, hg_proc_hash_t hash, hg_proc_t* proc_p) {
    hg_proc_t p = HG_PROC_NULL;
    hg_return_t ret = hg_proc_create(hg_class, hash, &p);
    if (ret != HG_SUCCESS) return ret;
    ret = hg_proc_reset(p, buf, buf_size, op);
    if (ret != HG_SUCCESS) {
        hg_proc_free(p);
        return ret;
    }
    *proc_p = p;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_proc_free(hg_proc_t proc) {
    if (!proc) return HG_SUCCESS;
    drop_extra(of(proc));
    delete of(proc);
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_proc_reset(hg_proc_t proc, void* buf, hg_size_t buf_size,
                                    hg_proc_op_t op) {
    if (!proc) return HG_INVALID_ARG;
    if (op != HG_ENCODE && op != HG_DECODE && op != HG_FREE) return HG_INVALID_ARG;
    if (!buf && op != HG_FREE) return HG_INVALID_ARG;
    hg_proc* p = of(proc);
    drop_extra(p);
    p->buf = static_cast<char*>(buf);
    p->buf_size = buf ? buf_size : 0;
    p->cur.pos = p->buf;
    p->cur.size = p->buf_size;
    p->cur.left = p->buf_size;
    p->cur.op = op;
    p->cur.flags = 0;
    return HG_SUCCESS;
}

HG_PUBLIC hg_class_t* hg_proc_get_class(hg_proc_t proc) {
    return proc ? of(proc)->hg_class : nullptr;
}

HG_PUBLIC void hg_proc_set_handle(hg_proc_t proc, hg_handle_t handle) {
    if (proc) of(proc)->handle = handle;
}

HG_PUBLIC hg_handle_t hg_proc_get_handle(hg_proc_t proc) {
    return proc ? of(proc)->handle : HG_HANDLE_NULL;
}

HG_PUBLIC hg_size_t hg_proc_get_size(hg_proc_t proc) {
    return proc ? of(proc)->buf_size + of(proc)->extra_size : 0;
}

HG_PUBLIC hg_return_t hg_proc_set_size(hg_proc_t proc, hg_size_t req_size) {
    if (!proc) return HG_INVALID_ARG;
    hg_proc* p = of(proc);
    const hg_size_t page = page_size();
    if (req_size > HG_SIZE_MAX - page) return HG_OVERFLOW;
    const hg_size_t new_size = (req_size / page + 1) * page;
    if (new_size <= hg_proc_get_size(proc)) return HG_INVALID_ARG;  // not bigger
    if (new_size > hg_size_t(SIZE_MAX)) return HG_NOMEM;
    const hg_size_t used = p->cur.size - p->cur.left;
    char* grown =
        static_cast<char*>(std::realloc(p->extra_mine ? p->extra : nullptr, std::size_t(new_size)));
    if (!grown) return HG_NOMEM;
    if (!p->extra_mine || !p->extra) {
        // First growth (or the caller took the last extra buffer): what was written so far
        // comes along, so that the extra buffer holds the whole encoding.
        const char* from = p->extra ? p->extra : p->buf;
        if (used != 0 && from) std::memcpy(grown, from, std::size_t(used));
    }
    p->extra = grown;
    p->extra_size = new_size;
    p->extra_mine = true;
    p->cur.pos = grown + used;
    p->cur.size = new_size;
    p->cur.left = new_size - used;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_proc_talaria_reserve(hg_proc_t proc, hg_size_t size) {
    if (!proc) return HG_INVALID_ARG;
    hg_proc* p = of(proc);
    if (p->cur.left >= size) return HG_SUCCESS;
    if (p->cur.op != HG_ENCODE) return HG_OVERFLOW;  // never read past what arrived
    const hg_size_t used = p->cur.size - p->cur.left;
    if (size > HG_SIZE_MAX - used - p->buf_size) return HG_OVERFLOW;
    return hg_proc_set_size(proc, hg_proc_get_size(proc) + size);
}

HG_PUBLIC void* hg_proc_save_ptr(hg_proc_t proc, hg_size_t data_size) {
    if (!proc || of(proc)->cur.op == HG_FREE) return nullptr;
    hg_proc* p = of(proc);
    if (data_size != 0 && hg_proc_talaria_reserve(proc, data_size) != HG_SUCCESS) return nullptr;
    char* at = p->cur.pos;
    p->cur.pos += data_size;
    p->cur.left -= data_size;
    return at;
}

HG_PUBLIC hg_return_t hg_proc_restore_ptr(hg_proc_t proc, void*, hg_size_t) {
    if (!proc || of(proc)->cur.op == HG_FREE) return HG_INVALID_ARG;
    return HG_SUCCESS;
}

HG_PUBLIC void* hg_proc_get_extra_buf(hg_proc_t proc) {
    return proc ? of(proc)->extra : nullptr;
}

HG_PUBLIC hg_size_t hg_proc_get_extra_size(hg_proc_t proc) {
    return proc ? of(proc)->extra_size : 0;
}

HG_PUBLIC hg_return_t hg_proc_set_extra_buf_is_mine(hg_proc_t proc, uint8_t theirs) {
    if (!proc || !of(proc)->extra) return HG_INVALID_ARG;
    of(proc)->extra_mine = theirs == 0;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_proc_flush(hg_proc_t proc) {
    return proc ? HG_SUCCESS : HG_INVALID_ARG;
}

HG_PUBLIC hg_return_t hg_proc_checksum_get(hg_proc_t, void*, hg_size_t) {
    return HG_INVALID_ARG;  // no checksum in this build (a proc without one, in Mercury)
}

HG_PUBLIC hg_return_t hg_proc_checksum_verify(hg_proc_t, const void*, hg_size_t) {
    return HG_INVALID_ARG;
}

}  // extern "C"
