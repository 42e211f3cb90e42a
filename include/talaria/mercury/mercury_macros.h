/* Talaria's Mercury-compatible C API: the macros that generate a struct and its proc from a
 * list of fields (Mercury 2.4.1's mercury_macros.h), over Boost.Preprocessor (Debian's
 * libboost-dev).
 *
 *   MERCURY_GEN_PROC(sum_in_t, ((int32_t)(x)) ((int32_t)(y)) ((hg_const_string_t)(name)))
 *
 * declares `typedef struct { int32_t x; int32_t y; hg_const_string_t name; } sum_in_t;` and
 * `hg_proc_sum_in_t`, which runs hg_proc_<type> on each field in order. MERCURY_GEN_STRUCT_PROC
 * generates the proc alone, for a struct declared elsewhere. MERCURY_REGISTER registers a
 * procedure by name with the procs of its input and output structs; hg_proc_void stands for
 * "no input" or "no output". */
#ifndef MERCURY_MACROS_H
#define MERCURY_MACROS_H

#include <boost/preprocessor.hpp>

#include "mercury.h"
#include "mercury_bulk.h"
#include "mercury_proc.h"
#include "mercury_proc_bulk.h"

/* A field is a two-element sequence, (type)(name). */
#define TALARIA_HG_FIELD_TYPE(field) BOOST_PP_SEQ_HEAD(field)
#define TALARIA_HG_FIELD_NAME(field) BOOST_PP_SEQ_CAT(BOOST_PP_SEQ_TAIL(field))

#define TALARIA_HG_DECLARE_FIELD(r, unused, field) \
    TALARIA_HG_FIELD_TYPE(field) TALARIA_HG_FIELD_NAME(field);

#define TALARIA_HG_PROC_FIELD(r, s, field)                      \
    ret = BOOST_PP_CAT(hg_proc_, TALARIA_HG_FIELD_TYPE(field))( \
        proc, &(s)->TALARIA_HG_FIELD_NAME(field));              \
    if (unlikely(ret != HG_SUCCESS)) return ret;

#define MERCURY_GEN_STRUCT_PROC(struct_type_name, fields)                                 \
    static HG_INLINE hg_return_t BOOST_PP_CAT(hg_proc_, struct_type_name)(hg_proc_t proc, \
                                                                          void* data) {   \
        hg_return_t ret = HG_SUCCESS;                                                     \
        struct_type_name* struct_data = (struct_type_name*)data;                          \
        BOOST_PP_SEQ_FOR_EACH(TALARIA_HG_PROC_FIELD, struct_data, fields)                 \
        return ret;                                                                       \
    }

#define MERCURY_GEN_PROC(struct_type_name, fields)                \
    typedef struct {                                              \
        BOOST_PP_SEQ_FOR_EACH(TALARIA_HG_DECLARE_FIELD, , fields) \
    } struct_type_name;                                           \
    MERCURY_GEN_STRUCT_PROC(struct_type_name, fields)

#define MERCURY_REGISTER(hg_class, func_name, in_struct_type_name, out_struct_type_name, rpc_cb) \
    HG_Register_name(hg_class, func_name, BOOST_PP_CAT(hg_proc_, in_struct_type_name),           \
                     BOOST_PP_CAT(hg_proc_, out_struct_type_name), rpc_cb)

#define hg_proc_void NULL

#endif /* MERCURY_MACROS_H */
