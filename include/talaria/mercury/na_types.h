/* Talaria's Mercury-compatible C API: the NA layer's types (Mercury 2.4.1's na_types.h: the same
 * names, values and layouts on x86-64). */
#ifndef NA_TYPES_H
#define NA_TYPES_H

#include "na_config.h"

#include <limits.h>

/* Opaque objects. */
typedef struct na_class na_class_t;
typedef struct na_context na_context_t;
typedef struct na_addr na_addr_t;
typedef struct na_op_id na_op_id_t;
typedef struct na_mem_handle na_mem_handle_t;
typedef uint32_t na_tag_t;
typedef uint64_t na_offset_t;

/* Which address family a class prefers. */
enum na_addr_format { NA_ADDR_UNSPEC, NA_ADDR_IPV4, NA_ADDR_IPV6, NA_ADDR_NATIVE };

/* Flags of NA_Addr_deserialize. */
enum na_addr_flags { NA_ADDR_FIREWALL = (1 << 0) };

/* Traffic classes (a hint; Talaria's transports take none). */
enum na_traffic_class {
    NA_TC_UNSPEC,
    NA_TC_BEST_EFFORT,
    NA_TC_LOW_LATENCY,
    NA_TC_BULK_DATA,
    NA_TC_DEDICATED_ACCESS,
    NA_TC_SCAVENGER,
    NA_TC_NETWORK_CTRL
};

/* Kinds of memory a registration may name. */
enum na_mem_type {
    NA_MEM_TYPE_HOST,
    NA_MEM_TYPE_CUDA,
    NA_MEM_TYPE_ROCM,
    NA_MEM_TYPE_ZE,
    NA_MEM_TYPE_MAX,
    NA_MEM_TYPE_UNKNOWN = NA_MEM_TYPE_MAX
};

/* Options of NA_Initialize_opt / NA_Initialize_opt2 (48 bytes). */
struct na_init_info {
    const char* ip_subnet;           /* preferred IP subnet */
    const char* auth_key;            /* a key every process shares */
    size_t max_unexpected_size;      /* hint: unexpected message size */
    size_t max_expected_size;        /* hint: expected message size */
    uint8_t progress_mode;           /* NA_NO_BLOCK: busy polling */
    enum na_addr_format addr_format; /* preferred address family */
    uint8_t max_contexts;            /* contexts the program will create */
    uint8_t thread_mode;             /* NA_THREAD_MODE_* */
    bool request_mem_device;         /* transfers to or from device memory */
    enum na_traffic_class traffic_class;
};

/* The same before NA 4.1 (what struct hg_init_info embeds). */
struct na_init_info_4_0 {
    const char* ip_subnet;
    const char* auth_key;
    size_t max_unexpected_size;
    size_t max_expected_size;
    uint8_t progress_mode;
    enum na_addr_format addr_format;
    uint8_t max_contexts;
    uint8_t thread_mode;
    bool request_mem_device;
};

/* One piece of memory of a segmented registration. */
struct na_segment {
    void* base;
    size_t len;
};

/* One protocol a class can serve (a list: NA_Get_protocol_info). */
struct na_protocol_info {
    struct na_protocol_info* next;
    char* class_name;
    char* protocol_name;
    char* device_name;
};

/* Return codes: the first 24 of hg_return_t are the same values. */
#define NA_RETURN_VALUES \
    X(NA_SUCCESS)        \
    X(NA_PERMISSION)     \
    X(NA_NOENTRY)        \
    X(NA_INTERRUPT)      \
    X(NA_AGAIN)          \
    X(NA_NOMEM)          \
    X(NA_ACCESS)         \
    X(NA_FAULT)          \
    X(NA_BUSY)           \
    X(NA_EXIST)          \
    X(NA_NODEV)          \
    X(NA_INVALID_ARG)    \
    X(NA_PROTOCOL_ERROR) \
    X(NA_OVERFLOW)       \
    X(NA_MSGSIZE)        \
    X(NA_PROTONOSUPPORT) \
    X(NA_OPNOTSUPPORTED) \
    X(NA_ADDRINUSE)      \
    X(NA_ADDRNOTAVAIL)   \
    X(NA_HOSTUNREACH)    \
    X(NA_TIMEOUT)        \
    X(NA_CANCELED)       \
    X(NA_IO_ERROR)       \
    X(NA_HOSTFIREWALL)   \
    X(NA_RETURN_MAX)

#define X(a) a,
typedef enum na_return { NA_RETURN_VALUES } na_return_t;
#undef X

/* What a completed operation was. */
#define NA_CB_TYPES                \
    X(NA_CB_SEND_UNEXPECTED)       \
    X(NA_CB_RECV_UNEXPECTED)       \
    X(NA_CB_MULTI_RECV_UNEXPECTED) \
    X(NA_CB_SEND_EXPECTED)         \
    X(NA_CB_RECV_EXPECTED)         \
    X(NA_CB_PUT)                   \
    X(NA_CB_GET)                   \
    X(NA_CB_MAX)

#define X(a) a,
typedef enum na_cb_type { NA_CB_TYPES } na_cb_type_t;
#undef X

struct na_cb_info_recv_unexpected {
    size_t actual_buf_size; /* bytes received */
    na_addr_t* source;      /* the sender (NA_Addr_free it when done) */
    na_tag_t tag;
};

struct na_cb_info_multi_recv_unexpected {
    size_t actual_buf_size;
    na_addr_t* source;
    na_tag_t tag;
    void* actual_buf; /* where in the posted buffer this message lies */
    bool last;        /* the buffer is released: no more messages land in it */
};

struct na_cb_info_recv_expected {
    size_t actual_buf_size;
};

/* What a completion callback is given. */
struct na_cb_info {
    union {
        struct na_cb_info_recv_unexpected recv_unexpected;
        struct na_cb_info_multi_recv_unexpected multi_recv_unexpected;
        struct na_cb_info_recv_expected recv_expected;
    } info;
    void* arg;
    na_cb_type_t type;
    na_return_t ret;
};

typedef void (*na_cb_t)(const struct na_cb_info* callback_info);

#define NA_VERSION(major, minor) (((major) << 16) | (minor))
#define NA_MAJOR(version) (version >> 16)
#define NA_MINOR(version) (version & 0xffff)
#define NA_VERSION_GE(v1, v2) (v1 >= v2)
#define NA_VERSION_LT(v1, v2) (v1 < v2)

/* Optional features a class may have (NA_Has_opt_feature). */
#define NA_OPT_MULTI_RECV (1 << 0)
#define NA_OPT_FIREWALL_ADDR (1 << 1)

#define NA_MAX_IDLE_TIME (3600 * 1000) /* ms */
#define NA_CONTEXT_ID_MAX UINT8_MAX
#define NA_TAG_MAX UINT_MAX

/* Flags of NA_Msg_buf_alloc. */
#define NA_SEND (1 << 0)
#define NA_RECV (1 << 1)
#define NA_MULTI_RECV (1 << 2)
#define NA_ALLOC_MAX (1 << 3)

/* Flags of NA_Op_create. */
#define NA_OP_SINGLE 0x00
#define NA_OP_MULTI 0x01

/* Access of a memory handle. */
#define NA_MEM_READ_ONLY 0x01
#define NA_MEM_WRITE_ONLY 0x02
#define NA_MEM_READWRITE 0x03

/* na_init_info.progress_mode */
#define NA_NO_BLOCK 0x01
#define NA_NO_RETRY 0x02

/* na_init_info.thread_mode (default: thread-safe) */
#define NA_THREAD_MODE_SINGLE_CLS (0x01)
#define NA_THREAD_MODE_SINGLE_CTX (0x02)
#define NA_THREAD_MODE_SINGLE (NA_THREAD_MODE_SINGLE_CLS | NA_THREAD_MODE_SINGLE_CTX)

#define NA_INIT_INFO_INITIALIZER                          \
    ((struct na_init_info){.ip_subnet = NULL,             \
                           .auth_key = NULL,              \
                           .max_unexpected_size = 0,      \
                           .max_expected_size = 0,        \
                           .progress_mode = 0,            \
                           .addr_format = NA_ADDR_UNSPEC, \
                           .max_contexts = 1,             \
                           .thread_mode = 0,              \
                           .request_mem_device = false,   \
                           .traffic_class = NA_TC_UNSPEC})

#define NA_INIT_INFO_INITIALIZER_4_0                          \
    ((struct na_init_info_4_0){.ip_subnet = NULL,             \
                               .auth_key = NULL,              \
                               .max_unexpected_size = 0,      \
                               .max_expected_size = 0,        \
                               .progress_mode = 0,            \
                               .addr_format = NA_ADDR_UNSPEC, \
                               .max_contexts = 1,             \
                               .thread_mode = 0,              \
                               .request_mem_device = false})

#endif /* NA_TYPES_H */
