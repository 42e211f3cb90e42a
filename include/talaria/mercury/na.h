/* Talaria's Mercury-compatible C API: the NA layer (Mercury 2.4.1's na.h: the same functions
 * and semantics), over Talaria's na transports.
 *
 * A class is one Talaria transport, opened from Mercury's info strings: "na+sm[://name]" or
 * "sm" (Talaria's sm), "na+tcp://host:port" or "tcp://..." (Talaria's tcp), "ofi+tcp://",
 * "ofi+shm://", "ucx+tcp://", "ucx+sm://", "ucx+all://" (libfabric and UCX, where built), and
 * "inproc://name" (Talaria's in-process transport). Callbacks run only in NA_Trigger; NA_Progress
 * and NA_Poll move completions to the context's queue. Every operation is posted with an op id
 * from NA_Op_create, busy (NA_BUSY) until its callback has run. Message buffers may come from
 * NA_Msg_buf_alloc or be the program's own memory. Unexpected and expected messages carry no
 * NA header (the header sizes are 0). */
#ifndef NA_H
#define NA_H

#include "na_types.h"

#ifdef __cplusplus
extern "C" {
#endif

NA_PUBLIC void NA_Version_get(unsigned int* major, unsigned int* minor, unsigned int* patch);

/* Protocols a string could open (NULL: all): a list freed with NA_Free_protocol_info. */
NA_PUBLIC na_return_t NA_Get_protocol_info(const char* info_string,
                                           struct na_protocol_info** na_protocol_info_p);
NA_PUBLIC void NA_Free_protocol_info(struct na_protocol_info* na_protocol_info);

/* Open a class (NULL on failure, the cause logged). */
NA_PUBLIC na_class_t* NA_Initialize(const char* info_string, bool listen) NA_WARN_UNUSED_RESULT;
NA_PUBLIC na_class_t* NA_Initialize_opt(const char* info_string, bool listen,
                                        const struct na_init_info* na_init_info)
    NA_WARN_UNUSED_RESULT;
NA_PUBLIC na_class_t* NA_Initialize_opt2(const char* info_string, bool listen, unsigned int version,
                                         const struct na_init_info* na_init_info)
    NA_WARN_UNUSED_RESULT;
/* Close a class: NA_BUSY while contexts, addresses, memory handles or op ids of it live. */
NA_PUBLIC na_return_t NA_Finalize(na_class_t* na_class);
NA_PUBLIC void NA_Cleanup(void);
NA_PUBLIC bool NA_Has_opt_feature(na_class_t* na_class, unsigned long flags) NA_WARN_UNUSED_RESULT;
/* "none", "error", "warning", "min_debug", "debug": Talaria's log level for its na layer. */
NA_PUBLIC void NA_Set_log_level(const char* level);
NA_PUBLIC const char* NA_Get_class_name(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC const char* NA_Get_class_protocol(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC bool NA_Is_listening(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;

NA_PUBLIC na_context_t* NA_Context_create(na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC na_context_t* NA_Context_create_id(na_class_t* na_class,
                                             uint8_t id) NA_WARN_UNUSED_RESULT;
/* NA_BUSY while operations posted on it have not completed and been triggered. */
NA_PUBLIC na_return_t NA_Context_destroy(na_class_t* na_class, na_context_t* context);
NA_PUBLIC unsigned int NA_Context_get_completion_count(const na_context_t* context)
    NA_WARN_UNUSED_RESULT;

NA_PUBLIC na_op_id_t* NA_Op_create(na_class_t* na_class, unsigned long flags) NA_WARN_UNUSED_RESULT;
NA_PUBLIC void NA_Op_destroy(na_class_t* na_class, na_op_id_t* op_id);

NA_PUBLIC na_return_t NA_Addr_lookup(na_class_t* na_class, const char* name, na_addr_t** addr_p);
NA_PUBLIC void NA_Addr_free(na_class_t* na_class, na_addr_t* addr);
NA_PUBLIC na_return_t NA_Addr_set_remove(na_class_t* na_class, na_addr_t* addr);
NA_PUBLIC na_return_t NA_Addr_self(na_class_t* na_class, na_addr_t** addr_p);
NA_PUBLIC na_return_t NA_Addr_dup(na_class_t* na_class, na_addr_t* addr, na_addr_t** new_addr_p);
NA_PUBLIC bool NA_Addr_cmp(na_class_t* na_class, na_addr_t* addr1,
                           na_addr_t* addr2) NA_WARN_UNUSED_RESULT;
NA_PUBLIC bool NA_Addr_is_self(na_class_t* na_class, na_addr_t* addr) NA_WARN_UNUSED_RESULT;
/* `*buf_size` counts the NUL; a NULL buf asks for the size. NA_OVERFLOW if buf is too small. */
NA_PUBLIC na_return_t NA_Addr_to_string(na_class_t* na_class, char* buf, size_t* buf_size,
                                        na_addr_t* addr);
NA_PUBLIC size_t NA_Addr_get_serialize_size(na_class_t* na_class,
                                            na_addr_t* addr) NA_WARN_UNUSED_RESULT;
NA_PUBLIC na_return_t NA_Addr_serialize(na_class_t* na_class, void* buf, size_t buf_size,
                                        na_addr_t* addr);
NA_PUBLIC na_return_t NA_Addr_deserialize(na_class_t* na_class, na_addr_t** addr_p, const void* buf,
                                          size_t buf_size, uint64_t flags);

NA_PUBLIC size_t NA_Msg_get_max_unexpected_size(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC size_t NA_Msg_get_max_expected_size(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC size_t NA_Msg_get_unexpected_header_size(const na_class_t* na_class)
    NA_WARN_UNUSED_RESULT;
NA_PUBLIC size_t NA_Msg_get_expected_header_size(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC na_tag_t NA_Msg_get_max_tag(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC void* NA_Msg_buf_alloc(na_class_t* na_class, size_t buf_size, unsigned long flags,
                                 void** plugin_data_p) NA_WARN_UNUSED_RESULT;
NA_PUBLIC void NA_Msg_buf_free(na_class_t* na_class, void* buf, void* plugin_data);
NA_PUBLIC na_return_t NA_Msg_init_unexpected(na_class_t* na_class, void* buf, size_t buf_size);
NA_PUBLIC na_return_t NA_Msg_send_unexpected(na_class_t* na_class, na_context_t* context,
                                             na_cb_t callback, void* arg, const void* buf,
                                             size_t buf_size, void* plugin_data,
                                             na_addr_t* dest_addr, uint8_t dest_id, na_tag_t tag,
                                             na_op_id_t* op_id);
NA_PUBLIC na_return_t NA_Msg_recv_unexpected(na_class_t* na_class, na_context_t* context,
                                             na_cb_t callback, void* arg, void* buf,
                                             size_t buf_size, void* plugin_data, na_op_id_t* op_id);
NA_PUBLIC na_return_t NA_Msg_multi_recv_unexpected(na_class_t* na_class, na_context_t* context,
                                                   na_cb_t callback, void* arg, void* buf,
                                                   size_t buf_size, void* plugin_data,
                                                   na_op_id_t* op_id);
NA_PUBLIC na_return_t NA_Msg_init_expected(na_class_t* na_class, void* buf, size_t buf_size);
NA_PUBLIC na_return_t NA_Msg_send_expected(na_class_t* na_class, na_context_t* context,
                                           na_cb_t callback, void* arg, const void* buf,
                                           size_t buf_size, void* plugin_data, na_addr_t* dest_addr,
                                           uint8_t dest_id, na_tag_t tag, na_op_id_t* op_id);
NA_PUBLIC na_return_t NA_Msg_recv_expected(na_class_t* na_class, na_context_t* context,
                                           na_cb_t callback, void* arg, void* buf, size_t buf_size,
                                           void* plugin_data, na_addr_t* source_addr,
                                           uint8_t source_id, na_tag_t tag, na_op_id_t* op_id);

NA_PUBLIC na_return_t NA_Mem_handle_create(na_class_t* na_class, void* buf, size_t buf_size,
                                           unsigned long flags, na_mem_handle_t** mem_handle_p);
NA_PUBLIC na_return_t NA_Mem_handle_create_segments(na_class_t* na_class,
                                                    struct na_segment* segments,
                                                    size_t segment_count, unsigned long flags,
                                                    na_mem_handle_t** mem_handle_p);
NA_PUBLIC void NA_Mem_handle_free(na_class_t* na_class, na_mem_handle_t* mem_handle);
NA_PUBLIC size_t NA_Mem_handle_get_max_segments(const na_class_t* na_class) NA_WARN_UNUSED_RESULT;
NA_PUBLIC na_return_t NA_Mem_register(na_class_t* na_class, na_mem_handle_t* mem_handle,
                                      enum na_mem_type mem_type, uint64_t device);
NA_PUBLIC na_return_t NA_Mem_deregister(na_class_t* na_class, na_mem_handle_t* mem_handle);
NA_PUBLIC size_t NA_Mem_handle_get_serialize_size(na_class_t* na_class, na_mem_handle_t* mem_handle)
    NA_WARN_UNUSED_RESULT;
NA_PUBLIC na_return_t NA_Mem_handle_serialize(na_class_t* na_class, void* buf, size_t buf_size,
                                              na_mem_handle_t* mem_handle);
NA_PUBLIC na_return_t NA_Mem_handle_deserialize(na_class_t* na_class,
                                                na_mem_handle_t** mem_handle_p, const void* buf,
                                                size_t buf_size);
NA_PUBLIC na_return_t NA_Put(na_class_t* na_class, na_context_t* context, na_cb_t callback,
                             void* arg, na_mem_handle_t* local_mem_handle, na_offset_t local_offset,
                             na_mem_handle_t* remote_mem_handle, na_offset_t remote_offset,
                             size_t data_size, na_addr_t* remote_addr, uint8_t remote_id,
                             na_op_id_t* op_id);
NA_PUBLIC na_return_t NA_Get(na_class_t* na_class, na_context_t* context, na_cb_t callback,
                             void* arg, na_mem_handle_t* local_mem_handle, na_offset_t local_offset,
                             na_mem_handle_t* remote_mem_handle, na_offset_t remote_offset,
                             size_t data_size, na_addr_t* remote_addr, uint8_t remote_id,
                             na_op_id_t* op_id);

/* A descriptor that becomes readable when the context has something to progress (-1: none). */
NA_PUBLIC int NA_Poll_get_fd(na_class_t* na_class, na_context_t* context) NA_WARN_UNUSED_RESULT;
/* True when nothing is pending and the caller may wait on the descriptor. */
NA_PUBLIC bool NA_Poll_try_wait(na_class_t* na_class, na_context_t* context) NA_WARN_UNUSED_RESULT;
/* Progress without waiting; `*count_p` (may be NULL): completions now queued. */
NA_PUBLIC na_return_t NA_Poll(na_class_t* na_class, na_context_t* context, unsigned int* count_p);
NA_PUBLIC na_return_t NA_Poll_wait(na_class_t* na_class, na_context_t* context,
                                   unsigned int timeout_ms, unsigned* count_p);
/* Wait up to timeout_ms for a completion: NA_SUCCESS once one is queued, else NA_TIMEOUT. */
NA_PUBLIC na_return_t NA_Progress(na_class_t* na_class, na_context_t* context,
                                  unsigned int timeout_ms);
/* Run up to max_count queued callbacks; `*actual_count` (may be NULL): how many. */
NA_PUBLIC na_return_t NA_Trigger(na_context_t* context, unsigned int max_count,
                                 unsigned int* actual_count);
/* The callback still runs, with NA_CANCELED, unless the operation had already completed. */
NA_PUBLIC na_return_t NA_Cancel(na_class_t* na_class, na_context_t* context, na_op_id_t* op_id);

/* The code's name ("NA_SUCCESS"); NULL out of range. */
NA_PUBLIC const char* NA_Error_to_string(na_return_t errnum) NA_WARN_UNUSED_RESULT;

#ifdef __cplusplus
}
#endif

#endif /* NA_H */
