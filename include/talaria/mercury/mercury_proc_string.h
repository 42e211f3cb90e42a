/* Talaria's Mercury-compatible C API: procs of strings (Mercury 2.4.1's mercury_proc_string.h
 * and its encoding: a uint64_t length counting the terminating NUL, 0 for a NULL string, then
 * that many bytes and two bytes, is_const and is_owned). A decoded string is malloc()ed and
 * freed by the HG_FREE pass; a decode refuses a length past the bytes left (HG_OVERFLOW) and
 * bytes without the terminating NUL (HG_PROTOCOL_ERROR). */
#ifndef MERCURY_PROC_STRING_H
#define MERCURY_PROC_STRING_H

#include "mercury_proc.h"
#include "mercury_string_object.h"

typedef const char* hg_const_string_t;
typedef char* hg_string_t;

#ifdef __cplusplus
extern "C" {
#endif

/* A string object, encoded, decoded (its data then malloc()ed and owned) or freed. */
HG_PUBLIC hg_return_t hg_proc_hg_string_object_t(hg_proc_t proc, void* string);

/* Both string procs: `*s` encoded, decoded into a malloc()ed copy, or freed. Talaria's, not
 * Mercury's: programs call the two below. */
static HG_INLINE hg_return_t hg_proc_talaria_string(hg_proc_t proc, char** s, bool is_const) {
    hg_string_object_t string;
    string.data = *s;
    string.is_const = is_const;
    string.is_owned = hg_proc_get_op(proc) == HG_FREE; /* the free pass frees the copy */
    const hg_return_t ret = hg_proc_hg_string_object_t(proc, &string);
    if (ret == HG_SUCCESS && hg_proc_get_op(proc) == HG_DECODE)
        *s = hg_string_object_swap(&string, 0);
    return ret;
}

static HG_INLINE hg_return_t hg_proc_hg_const_string_t(hg_proc_t proc, void* data) {
    return hg_proc_talaria_string(proc, (char**)data, true);
}

static HG_INLINE hg_return_t hg_proc_hg_string_t(hg_proc_t proc, void* data) {
    return hg_proc_talaria_string(proc, (char**)data, false);
}

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_PROC_STRING_H */
