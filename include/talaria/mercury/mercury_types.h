/* Talaria's Mercury-compatible C API: the HG layer's types (Mercury 2.4.1's mercury_types.h:
 * the same names, values and layouts on x86-64). */
#ifndef MERCURY_TYPES_H
#define MERCURY_TYPES_H

#include "mercury_core_types.h"

typedef struct hg_class hg_class_t;
typedef struct hg_context hg_context_t;
typedef struct hg_addr* hg_addr_t;
typedef struct hg_handle* hg_handle_t;
typedef struct hg_bulk* hg_bulk_t;
typedef struct hg_proc* hg_proc_t;
typedef struct hg_op_id* hg_op_id_t;

/* HG_Get_info: who a handle talks to (40 bytes; addr is borrowed). */
struct hg_info {
    hg_class_t* hg_class;
    hg_context_t* context;
    hg_addr_t addr;
    hg_id_t id;
    uint8_t context_id;
};

typedef enum hg_mem_type {
    HG_MEM_TYPE_HOST = NA_MEM_TYPE_HOST,
    HG_MEM_TYPE_CUDA = NA_MEM_TYPE_CUDA,
    HG_MEM_TYPE_ROCM = NA_MEM_TYPE_ROCM,
    HG_MEM_TYPE_ZE = NA_MEM_TYPE_ZE,
    HG_MEM_TYPE_MAX = NA_MEM_TYPE_MAX,
    HG_MEM_TYPE_UNKNOWN = NA_MEM_TYPE_UNKNOWN
} hg_mem_type_t;

/* HG_Bulk_create_attr */
struct hg_bulk_attr {
    hg_mem_type_t mem_type;
    uint64_t device;
};

typedef enum hg_bulk_op {
    HG_BULK_PUSH, /* from local memory to the origin's */
    HG_BULK_PULL  /* from the origin's memory to local */
} hg_bulk_op_t;

struct hg_cb_info_lookup {
    hg_addr_t addr;
};

struct hg_cb_info_forward {
    hg_handle_t handle;
};

struct hg_cb_info_respond {
    hg_handle_t handle;
};

struct hg_cb_info_bulk {
    hg_bulk_t origin_handle;
    hg_bulk_t local_handle;
    hg_bulk_op_t op;
    hg_size_t size; /* bytes moved */
};

/* What a completion callback is given (48 bytes). */
struct hg_cb_info {
    union {
        struct hg_cb_info_lookup lookup;
        struct hg_cb_info_forward forward;
        struct hg_cb_info_respond respond;
        struct hg_cb_info_bulk bulk;
    } info;
    void* arg;
    hg_cb_type_t type;
    hg_return_t ret;
};

typedef hg_return_t (*hg_rpc_cb_t)(hg_handle_t handle);
typedef hg_return_t (*hg_cb_t)(const struct hg_cb_info* callback_info);
typedef hg_return_t (*hg_proc_cb_t)(hg_proc_t proc, void* data);

#define HG_ADDR_NULL ((hg_addr_t)0)
#define HG_HANDLE_NULL ((hg_handle_t)0)
#define HG_BULK_NULL ((hg_bulk_t)0)
#define HG_PROC_NULL ((hg_proc_t)0)
#define HG_OP_ID_NULL ((hg_op_id_t)0)
#define HG_OP_ID_IGNORE ((hg_op_id_t*)1)

#endif /* MERCURY_TYPES_H */
