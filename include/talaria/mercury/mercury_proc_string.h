/* Talaria's Mercury-compatible C API: procs of strings (Mercury 2.4.1's mercury_proc_string.h
 * and its encoding: a uint64_t length counting the terminating NUL, 0 for a NULL string, then
 * that many bytes and two bytes, is_const and is_owned). A decoded string is malloc()ed and
 * freed by the HG_FREE pass; a decode refuses a length past the bytes left (HG_OVERFLOW) and
 * bytes without the terminating NUL (HG_PROTOCOL_ERROR). */
#ifndef MERCURY_PROC_STRING_H
#define MERCURY_PROC_STRING_H

#include "mercury_proc.h"
#include "mercury_string_object.h"

typedef const char *hg_const_string_t;
typedef char *hg_string_t;

#ifdef __cplusplus
extern "C" {
#endif

/* A string object, encoded, decoded (its data then malloc()ed and owned) or freed. */
HG_PUBLIC hg_return_t hg_proc_hg_string_object_t(hg_proc_t proc, void *string);

static HG_INLINE hg_return_t hg_proc_hg_const_string_t(hg_proc_t proc, void *data) {
    hg_const_string_t *s = (hg_const_string_t *)data;
    hg_string_object_t string;
    hg_return_t ret = HG_SUCCESS;
    switch (hg_proc_get_op(proc)) {
        case HG_ENCODE:
            hg_string_object_init_const_char(&string, *s, 0);
            ret = hg_proc_hg_string_object_t(proc, &string);
            break;
        case HG_DECODE:
            ret = hg_proc_hg_string_object_t(proc, &string);
            if (ret == HG_SUCCESS) *s = hg_string_object_swap(&string, 0);
            break;
        case HG_FREE:
            hg_string_object_init_const_char(&string, *s, 1);
            ret = hg_proc_hg_string_object_t(proc, &string);
            break;
    }
    return ret;
}

static HG_INLINE hg_return_t hg_proc_hg_string_t(hg_proc_t proc, void *data) {
    hg_string_t *s = (hg_string_t *)data;
    hg_string_object_t string;
    hg_return_t ret = HG_SUCCESS;
    switch (hg_proc_get_op(proc)) {
        case HG_ENCODE:
            hg_string_object_init_char(&string, *s, 0);
            ret = hg_proc_hg_string_object_t(proc, &string);
            break;
        case HG_DECODE:
            ret = hg_proc_hg_string_object_t(proc, &string);
            if (ret == HG_SUCCESS) *s = hg_string_object_swap(&string, 0);
            break;
        case HG_FREE:
            hg_string_object_init_char(&string, *s, 1);
            ret = hg_proc_hg_string_object_t(proc, &string);
            break;
    }
    return ret;
}

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_PROC_STRING_H */
