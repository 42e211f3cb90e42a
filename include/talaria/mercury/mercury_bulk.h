/* Talaria's Mercury-compatible C API: bulk handles and transfers (Mercury 2.4.1's
 * mercury_bulk.h), over Talaria's bulk layer.
 *
 * A handle describes segments of the program's memory (a NULL pointer: the library allocates
 * that segment, zeroed, and HG_Bulk_access reads it back; zero-size segments are kept and hold
 * nothing) registered for the access its flags name. Transfers complete through HG_Trigger, a
 * zero-size one too. HG_BULK_PUSH moves local bytes to the origin's handle, HG_BULK_PULL the
 * origin's into local ones. A handle bound (HG_Bulk_bind) carries its class's address, so a
 * process that receives it transfers with HG_Bulk_bind_transfer, naming no address. */
#ifndef MERCURY_BULK_H
#define MERCURY_BULK_H

#include "mercury_types.h"

#define HG_BULK_READ_ONLY (1 << 0)
#define HG_BULK_WRITE_ONLY (1 << 1)
#define HG_BULK_READWRITE (HG_BULK_READ_ONLY | HG_BULK_WRITE_ONLY)

/* Flags of HG_Bulk_get_serialize_size / HG_Bulk_serialize (accepted; Talaria's encoding does
 * not depend on them). */
#define HG_BULK_SM (1 << 0)
#define HG_BULK_EAGER (1 << 1)

#ifdef __cplusplus
extern "C" {
#endif

HG_PUBLIC hg_return_t HG_Bulk_create(hg_class_t* hg_class, uint32_t count, void** buf_ptrs,
                                     const hg_size_t* buf_sizes, uint8_t flags, hg_bulk_t* handle);
/* Host memory only (HG_OPNOTSUPPORTED for another memory type). */
HG_PUBLIC hg_return_t HG_Bulk_create_attr(hg_class_t* hg_class, uint32_t count, void** buf_ptrs,
                                          const hg_size_t* buf_sizes, uint8_t flags,
                                          const struct hg_bulk_attr* attrs, hg_bulk_t* handle);
/* Drop a reference; the last frees the handle (and the memory the library allocated). */
HG_PUBLIC hg_return_t HG_Bulk_free(hg_bulk_t handle);
HG_PUBLIC hg_return_t HG_Bulk_ref_incr(hg_bulk_t handle);
HG_PUBLIC hg_return_t HG_Bulk_bind(hg_bulk_t handle, hg_context_t* context);
/* The address a bound or received handle names (borrowed; HG_ADDR_NULL if none). */
HG_PUBLIC hg_addr_t HG_Bulk_get_addr(hg_bulk_t handle);
HG_PUBLIC uint8_t HG_Bulk_get_context_id(hg_bulk_t handle);
/* The segments of a local handle covering [offset, offset + size). */
HG_PUBLIC hg_return_t HG_Bulk_access(hg_bulk_t handle, hg_size_t offset, hg_size_t size,
                                     uint8_t flags, uint32_t max_count, void** buf_ptrs,
                                     hg_size_t* buf_sizes, uint32_t* actual_count);
HG_PUBLIC hg_size_t HG_Bulk_get_size(hg_bulk_t handle);
HG_PUBLIC uint32_t HG_Bulk_get_segment_count(hg_bulk_t handle);
HG_PUBLIC uint8_t HG_Bulk_get_flags(hg_bulk_t handle);
HG_PUBLIC hg_size_t HG_Bulk_get_serialize_size(hg_bulk_t handle, unsigned long flags);
HG_PUBLIC hg_return_t HG_Bulk_serialize(void* buf, hg_size_t buf_size, unsigned long flags,
                                        hg_bulk_t handle);
HG_PUBLIC hg_return_t HG_Bulk_deserialize(hg_class_t* hg_class, hg_bulk_t* handle, const void* buf,
                                          hg_size_t buf_size);
HG_PUBLIC hg_return_t HG_Bulk_transfer(hg_context_t* context, hg_cb_t callback, void* arg,
                                       hg_bulk_op_t op, hg_addr_t origin_addr,
                                       hg_bulk_t origin_handle, hg_size_t origin_offset,
                                       hg_bulk_t local_handle, hg_size_t local_offset,
                                       hg_size_t size, hg_op_id_t* op_id);
HG_PUBLIC hg_return_t HG_Bulk_bind_transfer(hg_context_t* context, hg_cb_t callback, void* arg,
                                            hg_bulk_op_t op, hg_bulk_t origin_handle,
                                            hg_size_t origin_offset, hg_bulk_t local_handle,
                                            hg_size_t local_offset, hg_size_t size,
                                            hg_op_id_t* op_id);
/* origin_id: the origin's context (Talaria's put/get reach its memory from any context). */
HG_PUBLIC hg_return_t HG_Bulk_transfer_id(hg_context_t* context, hg_cb_t callback, void* arg,
                                          hg_bulk_op_t op, hg_addr_t origin_addr, uint8_t origin_id,
                                          hg_bulk_t origin_handle, hg_size_t origin_offset,
                                          hg_bulk_t local_handle, hg_size_t local_offset,
                                          hg_size_t size, hg_op_id_t* op_id);
/* The transfer's callback then runs with HG_CANCELED, unless it had completed. */
HG_PUBLIC hg_return_t HG_Bulk_cancel(hg_op_id_t op_id);

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_BULK_H */
