/* The sizes, offsets and values of Mercury 2.4.1's user-visible types on x86-64 that programs
 * written for Mercury depend on (../shared/mercury-api.md, read from Mercury's headers), checked
 * against Talaria's headers. Included by a C11 and a C++ program: each runs every check and
 * says which failed. */
#ifndef TALARIA_MERCURY_LAYOUT_CHECKS_H
#define TALARIA_MERCURY_LAYOUT_CHECKS_H

#include <stddef.h>
#include <stdio.h>

#include "mercury_types.h"

static int layout_failures = 0;

#define LAYOUT_EQ(what, got, want)                                                                 \
    do {                                                                                           \
        if ((unsigned long long)(got) != (unsigned long long)(want)) {                             \
            fprintf(stderr, "%s: %llu, Mercury 2.4.1 has %llu\n", what, (unsigned long long)(got), \
                    (unsigned long long)(want));                                                   \
            ++layout_failures;                                                                     \
        }                                                                                          \
    } while (0)
#define SIZE_IS(type, n) LAYOUT_EQ("sizeof(" #type ")", sizeof(type), n)
#define OFFSET_IS(type, f, n) LAYOUT_EQ("offsetof(" #type ", " #f ")", offsetof(type, f), n)
#define VALUE_IS(name, n) LAYOUT_EQ(#name, name, n)

static int run_layout_checks(void) {
    /* scalars and handles */
    SIZE_IS(hg_id_t, 8);
    SIZE_IS(hg_size_t, 8);
    SIZE_IS(hg_ptr_t, 8);
    SIZE_IS(hg_bool_t, 1);
    SIZE_IS(na_tag_t, 4);
    SIZE_IS(na_offset_t, 8);
    SIZE_IS(hg_addr_t, sizeof(void*));
    SIZE_IS(hg_handle_t, sizeof(void*));
    SIZE_IS(hg_bulk_t, sizeof(void*));
    SIZE_IS(hg_proc_t, sizeof(void*));
    SIZE_IS(hg_op_id_t, sizeof(void*));
    LAYOUT_EQ("HG_OP_ID_IGNORE", (size_t)HG_OP_ID_IGNORE, 1);

    /* struct hg_info: 40 bytes */
    SIZE_IS(struct hg_info, 40);
    OFFSET_IS(struct hg_info, hg_class, 0);
    OFFSET_IS(struct hg_info, context, 8);
    OFFSET_IS(struct hg_info, addr, 16);
    OFFSET_IS(struct hg_info, id, 24);
    OFFSET_IS(struct hg_info, context_id, 32);

    /* struct hg_cb_info: 48 bytes */
    SIZE_IS(struct hg_cb_info, 48);
    OFFSET_IS(struct hg_cb_info, info.lookup.addr, 0);
    OFFSET_IS(struct hg_cb_info, info.forward.handle, 0);
    OFFSET_IS(struct hg_cb_info, info.respond.handle, 0);
    OFFSET_IS(struct hg_cb_info, info.bulk.origin_handle, 0);
    OFFSET_IS(struct hg_cb_info, info.bulk.local_handle, 8);
    OFFSET_IS(struct hg_cb_info, info.bulk.op, 16);
    OFFSET_IS(struct hg_cb_info, info.bulk.size, 24);
    OFFSET_IS(struct hg_cb_info, arg, 32);
    OFFSET_IS(struct hg_cb_info, type, 40);
    OFFSET_IS(struct hg_cb_info, ret, 44);

    /* struct na_init_info and its 4.0 form: 48 bytes */
    SIZE_IS(struct na_init_info, 48);
    OFFSET_IS(struct na_init_info, ip_subnet, 0);
    OFFSET_IS(struct na_init_info, auth_key, 8);
    OFFSET_IS(struct na_init_info, max_unexpected_size, 16);
    OFFSET_IS(struct na_init_info, max_expected_size, 24);
    OFFSET_IS(struct na_init_info, progress_mode, 32);
    OFFSET_IS(struct na_init_info, addr_format, 36);
    OFFSET_IS(struct na_init_info, max_contexts, 40);
    OFFSET_IS(struct na_init_info, thread_mode, 41);
    OFFSET_IS(struct na_init_info, request_mem_device, 42);
    OFFSET_IS(struct na_init_info, traffic_class, 44);
    SIZE_IS(struct na_init_info_4_0, 48);
    OFFSET_IS(struct na_init_info_4_0, request_mem_device, 42);

    /* struct hg_init_info: 112 bytes */
    SIZE_IS(struct hg_init_info, 112);
    OFFSET_IS(struct hg_init_info, na_init_info, 0);
    OFFSET_IS(struct hg_init_info, na_class, 48);
    OFFSET_IS(struct hg_init_info, request_post_init, 56);
    OFFSET_IS(struct hg_init_info, request_post_incr, 60);
    OFFSET_IS(struct hg_init_info, auto_sm, 64);
    OFFSET_IS(struct hg_init_info, sm_info_string, 72);
    OFFSET_IS(struct hg_init_info, checksum_level, 80);
    OFFSET_IS(struct hg_init_info, no_bulk_eager, 84);
    OFFSET_IS(struct hg_init_info, no_loopback, 85);
    OFFSET_IS(struct hg_init_info, stats, 86);
    OFFSET_IS(struct hg_init_info, no_multi_recv, 87);
    OFFSET_IS(struct hg_init_info, release_input_early, 88);
    OFFSET_IS(struct hg_init_info, traffic_class, 92);
    OFFSET_IS(struct hg_init_info, no_overflow, 96);
    OFFSET_IS(struct hg_init_info, multi_recv_op_max, 100);
    OFFSET_IS(struct hg_init_info, multi_recv_copy_threshold, 104);

    /* the others */
    SIZE_IS(struct hg_diag_counters, 9 * 8);
    OFFSET_IS(struct hg_diag_counters, bulk_count, 64);
    SIZE_IS(struct na_protocol_info, 32);
    SIZE_IS(struct na_segment, 16);
    SIZE_IS(struct hg_bulk_attr, 16);
    SIZE_IS(struct na_cb_info, 56);

    /* values */
    VALUE_IS(HG_SUCCESS, 0);
    VALUE_IS(HG_NOENTRY, 2);
    VALUE_IS(HG_BUSY, 8);
    VALUE_IS(HG_INVALID_ARG, 11);
    VALUE_IS(HG_OVERFLOW, 13);
    VALUE_IS(HG_OPNOTSUPPORTED, 16);
    VALUE_IS(HG_TIMEOUT, 20);
    VALUE_IS(HG_CANCELED, 21);
    VALUE_IS(HG_HOSTFIREWALL, 23);
    VALUE_IS(HG_CHECKSUM_ERROR, 24);
    VALUE_IS(HG_NA_ERROR, 25);
    VALUE_IS(HG_OTHER_ERROR, 26);
    VALUE_IS(HG_RETURN_MAX, 27);
    VALUE_IS(HG_INVALID_PARAM, HG_INVALID_ARG);
    VALUE_IS(HG_SIZE_ERROR, HG_MSGSIZE);
    VALUE_IS(HG_NOMEM_ERROR, HG_NOMEM);
    VALUE_IS(HG_NO_MATCH, HG_NOENTRY);
    VALUE_IS(NA_RETURN_MAX, 24);
    VALUE_IS(NA_HOSTFIREWALL, HG_HOSTFIREWALL);
    VALUE_IS(NA_TIMEOUT, HG_TIMEOUT);
    VALUE_IS(NA_CB_GET, 6);
    VALUE_IS(NA_CB_MAX, 7);
    VALUE_IS(HG_CB_BULK, 3);
    VALUE_IS(HG_OUTPUT, 2);
    VALUE_IS(HG_FREE, 2);
    VALUE_IS(HG_BULK_PUSH, 0);
    VALUE_IS(HG_BULK_PULL, 1);
    VALUE_IS(NA_MEM_READ_ONLY, 1);
    VALUE_IS(NA_MEM_WRITE_ONLY, 2);
    VALUE_IS(NA_MEM_READWRITE, 3);
    VALUE_IS(NA_NO_BLOCK, 1);
    VALUE_IS(NA_THREAD_MODE_SINGLE, 3);
    VALUE_IS(NA_ADDR_NATIVE, 3);
    VALUE_IS(NA_TC_NETWORK_CTRL, 6);
    VALUE_IS(NA_MEM_TYPE_UNKNOWN, 4);
    VALUE_IS(HG_MEM_TYPE_CUDA, 1);
    VALUE_IS(HG_CHECKSUM_RPC_PAYLOAD, 2);
    VALUE_IS(HG_VERSION(HG_VERSION_MAJOR, HG_VERSION_MINOR), (2 << 16) | 4);
    VALUE_IS(HG_VERSION_PATCH, 1);
    VALUE_IS(HG_SIZE_MAX, UINT64_MAX);
    VALUE_IS(NA_TAG_MAX, 0xFFFFFFFFu);
    VALUE_IS(NA_CONTEXT_ID_MAX, 255);

    if (layout_failures == 0) printf("every size, offset and value matches Mercury 2.4.1\n");
    return layout_failures == 0 ? 0 : 1;
}

#endif /* TALARIA_MERCURY_LAYOUT_CHECKS_H */
