/* Talaria's Mercury-compatible C API: the HG layer's core types (Mercury 2.4.1's
 * mercury_core_types.h: the same names, values and layouts on x86-64). */
#ifndef MERCURY_CORE_TYPES_H
#define MERCURY_CORE_TYPES_H

#include "mercury_config.h"
#include "na_types.h"

typedef uint64_t hg_size_t;
typedef uint64_t hg_id_t; /* an RPC id (64 bits; its proc encodes 32) */

typedef enum hg_checksum_level {
    HG_CHECKSUM_NONE,
    HG_CHECKSUM_RPC_HEADERS,
    HG_CHECKSUM_RPC_PAYLOAD
} hg_checksum_level_t;

/* Options of HG_Init_opt2 (112 bytes; HG_Init_opt reads the 2.2 layout). */
struct hg_init_info {
    struct na_init_info_4_0 na_init_info; /* options of the NA class HG opens */
    na_class_t* na_class;       /* an NA class the program opened (HG_Init's string is then
                                   ignored, and HG_Finalize leaves the class open) */
    uint32_t request_post_init; /* receives posted at first (0: the default) */
    int32_t request_post_incr;  /* posted when those run out (-1: none) */
    uint8_t auto_sm;            /* shared memory to peers on the same node */
    const char* sm_info_string; /* suffix of the shared-memory objects auto_sm makes */
    hg_checksum_level_t checksum_level;
    uint8_t no_bulk_eager;       /* never send small bulk data with the request */
    uint8_t no_loopback;         /* calls to self go through NA */
    uint8_t stats;               /* print statistics at exit */
    uint8_t no_multi_recv;       /* post separate receive buffers */
    uint8_t release_input_early; /* release input buffers after HG_Get_input */
    enum na_traffic_class traffic_class;
    bool no_overflow;                       /* messages past the eager size fail */
    unsigned int multi_recv_op_max;         /* multi-receive buffers posted */
    unsigned int multi_recv_copy_threshold; /* copy when this few remain (0: never) */
};

/* Return codes: the first 24 are na_return_t's values. */
#define HG_RETURN_VALUES \
    X(HG_SUCCESS)        \
    X(HG_PERMISSION)     \
    X(HG_NOENTRY)        \
    X(HG_INTERRUPT)      \
    X(HG_AGAIN)          \
    X(HG_NOMEM)          \
    X(HG_ACCESS)         \
    X(HG_FAULT)          \
    X(HG_BUSY)           \
    X(HG_EXIST)          \
    X(HG_NODEV)          \
    X(HG_INVALID_ARG)    \
    X(HG_PROTOCOL_ERROR) \
    X(HG_OVERFLOW)       \
    X(HG_MSGSIZE)        \
    X(HG_PROTONOSUPPORT) \
    X(HG_OPNOTSUPPORTED) \
    X(HG_ADDRINUSE)      \
    X(HG_ADDRNOTAVAIL)   \
    X(HG_HOSTUNREACH)    \
    X(HG_TIMEOUT)        \
    X(HG_CANCELED)       \
    X(HG_IO_ERROR)       \
    X(HG_HOSTFIREWALL)   \
    X(HG_CHECKSUM_ERROR) \
    X(HG_NA_ERROR)       \
    X(HG_OTHER_ERROR)    \
    X(HG_RETURN_MAX)

#define X(a) a,
typedef enum hg_return { HG_RETURN_VALUES } hg_return_t;
#undef X

/* Older names. */
#define HG_INVALID_PARAM HG_INVALID_ARG
#define HG_SIZE_ERROR HG_MSGSIZE
#define HG_NOMEM_ERROR HG_NOMEM
#define HG_NO_MATCH HG_NOENTRY

typedef enum hg_cb_type { HG_CB_LOOKUP, HG_CB_FORWARD, HG_CB_RESPOND, HG_CB_BULK } hg_cb_type_t;

typedef enum { HG_UNDEF, HG_INPUT, HG_OUTPUT } hg_op_t;

/* What a proc does with the value it is given. */
typedef enum { HG_ENCODE, HG_DECODE, HG_FREE } hg_proc_op_t;

#define HG_CORE_SM (1 << 0)

/* HG_Class_get_counters (9 counters). */
struct hg_diag_counters {
    uint64_t rpc_req_sent_count;
    uint64_t rpc_req_recv_count;
    uint64_t rpc_resp_sent_count;
    uint64_t rpc_resp_recv_count;
    uint64_t rpc_req_extra_count;       /* requests that needed an extra (overflow) buffer */
    uint64_t rpc_resp_extra_count;      /* responses that did */
    uint64_t rpc_req_recv_active_count; /* requests being handled now */
    uint64_t rpc_multi_recv_copy_count; /* requests copied out of a multi-receive buffer */
    uint64_t bulk_count;                /* bulk transfers */
};

#define HG_VERSION(major, minor) (((major) << 16) | (minor))
#define HG_MAJOR(version) (version >> 16)
#define HG_MINOR(version) (version & 0xffff)
#define HG_VERSION_GE(v1, v2) (v1 >= v2)
#define HG_VERSION_LT(v1, v2) (v1 < v2)

#define HG_MAX_IDLE_TIME (3600 * 1000) /* ms */
#define HG_SIZE_MAX (UINT64_MAX)

#define HG_INIT_INFO_INITIALIZER                                                                \
    (struct hg_init_info) {                                                                     \
        .na_init_info = NA_INIT_INFO_INITIALIZER_4_0, .na_class = NULL, .request_post_init = 0, \
        .request_post_incr = 0, .auto_sm = false, .sm_info_string = NULL,                       \
        .checksum_level = HG_CHECKSUM_NONE, .no_bulk_eager = false, .no_loopback = false,       \
        .stats = false, .no_multi_recv = false, .release_input_early = false,                   \
        .no_overflow = false, .multi_recv_op_max = 0, .multi_recv_copy_threshold = 0            \
    }

#endif /* MERCURY_CORE_TYPES_H */
