/* Talaria's Mercury-compatible C API: procs, the encoders and decoders of RPC arguments
 * (Mercury 2.4.1's mercury_proc.h: the same functions and encodings).
 *
 * A proc walks a buffer in one of three modes (hg_proc_op_t): HG_ENCODE writes each value at
 * the current position, growing into an extra buffer of its own when the caller's runs out;
 * HG_DECODE reads them back (a value past the end fails with HG_OVERFLOW: bytes from a peer
 * never make a proc read outside its buffer); HG_FREE releases what a decode allocated (the
 * scalar procs do nothing). Values are copied in the host's byte order without padding: a
 * uint8_t takes 1 byte, a uint64_t 8, hg_id_t 4 (as Mercury encodes it).
 *
 * The scalar procs are inline over struct hg_proc_cursor, the part of Talaria's proc they read
 * and advance (the rest of the proc is private to the library). */
#ifndef MERCURY_PROC_H
#define MERCURY_PROC_H

#include <string.h>

#include "mercury_types.h"

/* Checksum methods of hg_proc_create (this build computes none: they are accepted and
 * ignored, as by a Mercury built without checksums). */
typedef enum { HG_CRC16, HG_CRC32, HG_CRC64, HG_NOHASH } hg_proc_hash_t;

/* hg_proc_get_flags / hg_proc_set_flags */
#define HG_PROC_SM (1 << 0)
#define HG_PROC_BULK_EAGER (1 << 1)

#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#endif
#ifndef unlikely
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

/* The start of every proc: where the next value goes or comes from. */
struct hg_proc_cursor {
    char* pos;       /* the next byte */
    hg_size_t left;  /* bytes from pos to the end of the current buffer */
    hg_size_t size;  /* bytes of the current buffer */
    hg_proc_op_t op; /* HG_ENCODE, HG_DECODE or HG_FREE */
    uint8_t flags;   /* HG_PROC_SM, HG_PROC_BULK_EAGER */
};

#ifdef __cplusplus
extern "C" {
#endif

/* A proc for `hg_class` (kept, never read here; NULL is refused), without a buffer. */
HG_PUBLIC hg_return_t hg_proc_create(hg_class_t* hg_class, hg_proc_hash_t hash, hg_proc_t* proc_p);

/* hg_proc_create, then hg_proc_reset with `buf`. */
HG_PUBLIC hg_return_t hg_proc_create_set(hg_class_t* hg_class, void* buf, hg_size_t buf_size,
                                         hg_proc_op_t op, hg_proc_hash_t hash, hg_proc_t* proc_p);

/* Free the proc and its extra buffer if it is the proc's. NULL is a no-op. */
HG_PUBLIC hg_return_t hg_proc_free(hg_proc_t proc);

/* Start over on `buf` (NULL only for HG_FREE) in mode `op`: flags cleared, the extra buffer
 * dropped. */
HG_PUBLIC hg_return_t hg_proc_reset(hg_proc_t proc, void* buf, hg_size_t buf_size, hg_proc_op_t op);

HG_PUBLIC hg_class_t* hg_proc_get_class(hg_proc_t proc);
HG_PUBLIC void hg_proc_set_handle(hg_proc_t proc, hg_handle_t handle);
HG_PUBLIC hg_handle_t hg_proc_get_handle(hg_proc_t proc);

/* The caller's buffer and the extra one together. */
HG_PUBLIC hg_size_t hg_proc_get_size(hg_proc_t proc);

/* Encoding: grow to at least `buf_size` bytes (a whole number of pages, more than now), the
 * bytes written so far copied to the extra buffer, which the proc then writes on. */
HG_PUBLIC hg_return_t hg_proc_set_size(hg_proc_t proc, hg_size_t buf_size);

/* Take `data_size` bytes at the current position for the caller to write or read itself, and
 * move past them: their address, or NULL (decoding past the end; HG_FREE). */
HG_PUBLIC void* hg_proc_save_ptr(hg_proc_t proc, hg_size_t data_size);

/* Give back what hg_proc_save_ptr took (nothing to do without checksums). */
HG_PUBLIC hg_return_t hg_proc_restore_ptr(hg_proc_t proc, void* data, hg_size_t data_size);

/* The extra buffer encoding grew into (NULL, 0 if none). */
HG_PUBLIC void* hg_proc_get_extra_buf(hg_proc_t proc);
HG_PUBLIC hg_size_t hg_proc_get_extra_size(hg_proc_t proc);

/* `theirs` true: the caller takes the extra buffer (and frees it with free()); the proc no
 * longer frees it. */
HG_PUBLIC hg_return_t hg_proc_set_extra_buf_is_mine(hg_proc_t proc, uint8_t theirs);

/* The end of an encode or decode (nothing to finish without checksums). */
HG_PUBLIC hg_return_t hg_proc_flush(hg_proc_t proc);

/* Checksums: this build computes none, so these answer HG_INVALID_ARG as Mercury does for a
 * proc without a checksum. */
HG_PUBLIC hg_return_t hg_proc_checksum_get(hg_proc_t proc, void* hash, hg_size_t hash_size);
HG_PUBLIC hg_return_t hg_proc_checksum_verify(hg_proc_t proc, const void* hash,
                                              hg_size_t hash_size);

/* The slow path of the inline procs: make room for `size` more bytes (encode: grow; decode:
 * HG_OVERFLOW). Talaria's, not Mercury's: programs call the procs, not this. */
HG_PUBLIC hg_return_t hg_proc_talaria_reserve(hg_proc_t proc, hg_size_t size);

static HG_INLINE hg_proc_op_t hg_proc_get_op(hg_proc_t proc) {
    return ((struct hg_proc_cursor*)(void*)proc)->op;
}

static HG_INLINE void hg_proc_set_flags(hg_proc_t proc, uint8_t flags) {
    ((struct hg_proc_cursor*)(void*)proc)->flags = flags;
}

static HG_INLINE uint8_t hg_proc_get_flags(hg_proc_t proc) {
    return ((struct hg_proc_cursor*)(void*)proc)->flags;
}

/* Bytes encoded or decoded so far. */
static HG_INLINE hg_size_t hg_proc_get_size_used(hg_proc_t proc) {
    const struct hg_proc_cursor* c = (const struct hg_proc_cursor*)(void*)proc;
    return c->size - c->left;
}

static HG_INLINE hg_size_t hg_proc_get_size_left(hg_proc_t proc) {
    return ((struct hg_proc_cursor*)(void*)proc)->left;
}

/* `data_size` bytes at `data`, copied in or out. */
static HG_INLINE hg_return_t hg_proc_bytes(hg_proc_t proc, void* data, hg_size_t data_size) {
    struct hg_proc_cursor* c = (struct hg_proc_cursor*)(void*)proc;
    if (c->op == HG_FREE) return HG_SUCCESS;
    if (unlikely(c->left < data_size)) {
        hg_return_t ret = hg_proc_talaria_reserve(proc, data_size);
        if (ret != HG_SUCCESS) return ret;
    }
    if (data_size != 0) {
        if (c->op == HG_ENCODE)
            memcpy(c->pos, data, (size_t)data_size);
        else
            memcpy(data, c->pos, (size_t)data_size);
    }
    c->pos += data_size;
    c->left -= data_size;
    return HG_SUCCESS;
}

static HG_INLINE hg_return_t hg_proc_int8_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(int8_t));
}
static HG_INLINE hg_return_t hg_proc_uint8_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(uint8_t));
}
static HG_INLINE hg_return_t hg_proc_int16_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(int16_t));
}
static HG_INLINE hg_return_t hg_proc_uint16_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(uint16_t));
}
static HG_INLINE hg_return_t hg_proc_int32_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(int32_t));
}
static HG_INLINE hg_return_t hg_proc_uint32_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(uint32_t));
}
static HG_INLINE hg_return_t hg_proc_int64_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(int64_t));
}
static HG_INLINE hg_return_t hg_proc_uint64_t(hg_proc_t proc, void* data) {
    return hg_proc_bytes(proc, data, sizeof(uint64_t));
}

/* Mercury's own types. hg_id_t is 64 bits but encoded in 32, as Mercury does. */
#define hg_proc_hg_size_t hg_proc_uint64_t
#define hg_proc_hg_id_t hg_proc_uint32_t
#define hg_proc_hg_int8_t hg_proc_int8_t
#define hg_proc_hg_uint8_t hg_proc_uint8_t
#define hg_proc_hg_int16_t hg_proc_int16_t
#define hg_proc_hg_uint16_t hg_proc_uint16_t
#define hg_proc_hg_int32_t hg_proc_int32_t
#define hg_proc_hg_uint32_t hg_proc_uint32_t
#define hg_proc_hg_int64_t hg_proc_int64_t
#define hg_proc_hg_uint64_t hg_proc_uint64_t
#define hg_proc_hg_bool_t hg_proc_uint8_t
#define hg_proc_hg_ptr_t hg_proc_uint64_t
#define hg_proc_memcpy hg_proc_raw
#define hg_proc_raw hg_proc_bytes

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_PROC_H */
