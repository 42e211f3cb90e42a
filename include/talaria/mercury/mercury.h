/* Talaria's Mercury-compatible C API: the HG layer, RPCs (Mercury 2.4.1's mercury.h: the same
 * functions and semantics), over Talaria's core.
 *
 * A class is a Talaria core engine opened from Mercury's info string (see na.h), with as many
 * contexts as na_init_info.max_contexts asks (1 by default), each made an HG context by
 * HG_Context_create_id. An RPC id is 64 bits: ids below 2^32 (HG_Register_name's djb2 hash of
 * the name, as Mercury's) travel as Talaria's procedure id; ids whose low 32 bits are a 16-bit
 * provider (Margo's hash << 32 | provider) travel as procedure id and provider; HG_Get_info
 * gives back the id exactly. Callbacks and RPC handlers run only in HG_Trigger. HG_Forward and
 * HG_Respond encode before they return. A handle is reference counted: HG_Create and a handler's
 * handle start at one, HG_Forward holds one until its callback returns, HG_Get_input and
 * HG_Get_output one until the matching HG_Free_*, HG_Ref_incr one more; HG_Destroy drops one.
 * The input of a request lives until HG_Free_input and may be read from any thread. */
#ifndef MERCURY_H
#define MERCURY_H

#include "mercury_types.h"

#include <stdio.h>

#include "na.h"

#ifdef __cplusplus
extern "C" {
#endif

HG_PUBLIC hg_return_t HG_Version_get(unsigned int* major_p, unsigned int* minor_p,
                                     unsigned int* patch_p);
/* The code's name ("HG_SUCCESS"); NULL out of range. */
HG_PUBLIC const char* HG_Error_to_string(hg_return_t errnum) HG_WARN_UNUSED_RESULT;

HG_PUBLIC hg_class_t* HG_Init(const char* na_info_string, uint8_t na_listen) HG_WARN_UNUSED_RESULT;
HG_PUBLIC hg_class_t* HG_Init_opt(const char* na_info_string, uint8_t na_listen,
                                  const struct hg_init_info* hg_init_info) HG_WARN_UNUSED_RESULT;
HG_PUBLIC hg_class_t* HG_Init_opt2(const char* na_info_string, uint8_t na_listen,
                                   unsigned int version,
                                   const struct hg_init_info* hg_init_info) HG_WARN_UNUSED_RESULT;
/* HG_BUSY while contexts, addresses or handles of the class live. */
HG_PUBLIC hg_return_t HG_Finalize(hg_class_t* hg_class);
HG_PUBLIC bool HG_Class_is_listening(const hg_class_t* hg_class) HG_WARN_UNUSED_RESULT;
/* Nothing to clean up (Talaria keeps no process-wide state). */
HG_PUBLIC void HG_Cleanup(void);
/* NA_Get_protocol_info / NA_Free_protocol_info. */
HG_PUBLIC hg_return_t HG_Get_na_protocol_info(const char* info_string,
                                              struct na_protocol_info** na_protocol_info_p);
HG_PUBLIC void HG_Free_na_protocol_info(struct na_protocol_info* na_protocol_info);
/* "none", "error", "warning", "min_debug", "debug": Talaria's log level for its RPC and bulk
 * layers (TALARIA_LOG sets the rest). */
HG_PUBLIC void HG_Set_log_level(const char* level);
/* Not supported (Talaria's log is configured with TALARIA_LOG and TALARIA_LOG_FILE): each says
 * so once in the log. */
HG_PUBLIC void HG_Set_log_subsys(const char* subsys);
HG_PUBLIC void HG_Set_log_func(int (*log_func)(FILE* stream, const char* format, ...));
HG_PUBLIC void HG_Set_log_stream(const char* level, FILE* stream);
/* Not supported (no process-wide counters): use HG_Class_get_counters. */
HG_PUBLIC void HG_Diag_dump_counters(void);
/* The info string's class ("na", "ofi", "ucx") and protocol ("sm", "tcp", ...). */
HG_PUBLIC const char* HG_Class_get_name(const hg_class_t* hg_class) HG_WARN_UNUSED_RESULT;
HG_PUBLIC const char* HG_Class_get_protocol(const hg_class_t* hg_class) HG_WARN_UNUSED_RESULT;
/* The largest input or output sent with the request itself (larger ones are pulled). */
HG_PUBLIC hg_size_t HG_Class_get_input_eager_size(const hg_class_t* hg_class) HG_WARN_UNUSED_RESULT;
HG_PUBLIC hg_size_t HG_Class_get_output_eager_size(const hg_class_t* hg_class)
    HG_WARN_UNUSED_RESULT;
/* Reserve `offset` bytes before every encoded input (output) for the program's own header:
 * HG_Get_input_buf's buffer starts with them. */
HG_PUBLIC hg_return_t HG_Class_set_input_offset(hg_class_t* hg_class, hg_size_t offset);
HG_PUBLIC hg_return_t HG_Class_set_output_offset(hg_class_t* hg_class, hg_size_t offset);
HG_PUBLIC hg_return_t HG_Class_set_data(hg_class_t* hg_class, void* data,
                                        void (*free_callback)(void*));
HG_PUBLIC void* HG_Class_get_data(const hg_class_t* hg_class) HG_WARN_UNUSED_RESULT;
/* Run `callback` on every handle the class makes (HG_Create, and a handler's), before use. */
HG_PUBLIC hg_return_t HG_Class_set_handle_create_callback(
    hg_class_t* hg_class, hg_return_t (*callback)(hg_handle_t, void*), void* arg);

HG_PUBLIC hg_context_t* HG_Context_create(hg_class_t* hg_class) HG_WARN_UNUSED_RESULT;
HG_PUBLIC hg_context_t* HG_Context_create_id(hg_class_t* hg_class,
                                             uint8_t id) HG_WARN_UNUSED_RESULT;
/* HG_BUSY while handles of the context live. */
HG_PUBLIC hg_return_t HG_Context_destroy(hg_context_t* context);
HG_PUBLIC hg_class_t* HG_Context_get_class(const hg_context_t* context) HG_WARN_UNUSED_RESULT;
HG_PUBLIC uint8_t HG_Context_get_id(const hg_context_t* context) HG_WARN_UNUSED_RESULT;
HG_PUBLIC hg_return_t HG_Context_set_data(hg_context_t* context, void* data,
                                          void (*free_callback)(void*));
HG_PUBLIC void* HG_Context_get_data(const hg_context_t* context) HG_WARN_UNUSED_RESULT;
/* Talaria posts no receives of its own per context: nothing to unpost. */
HG_PUBLIC hg_return_t HG_Context_unpost(hg_context_t* context);

/* Register `func_name` under the djb2 hash of its name (the id returned; 0 on failure), and,
 * where free, under Talaria's id of the name, so that a talaria::Engine's remote("func_name")
 * reaches it; a forward of it reaches a talaria::Engine that defined the name too
 * (docs/architecture.md, "The Mercury C API": which argument encodings agree). */
HG_PUBLIC hg_id_t HG_Register_name(hg_class_t* hg_class, const char* func_name,
                                   hg_proc_cb_t in_proc_cb, hg_proc_cb_t out_proc_cb,
                                   hg_rpc_cb_t rpc_cb) HG_WARN_UNUSED_RESULT;
HG_PUBLIC hg_return_t HG_Registered_name(hg_class_t* hg_class, const char* func_name, hg_id_t* id_p,
                                         uint8_t* flag_p);
/* Register (or register again, replacing) `id`. rpc_cb NULL: calls of it are not served here. */
HG_PUBLIC hg_return_t HG_Register(hg_class_t* hg_class, hg_id_t id, hg_proc_cb_t in_proc_cb,
                                  hg_proc_cb_t out_proc_cb, hg_rpc_cb_t rpc_cb);
HG_PUBLIC hg_return_t HG_Deregister(hg_class_t* hg_class, hg_id_t id);
HG_PUBLIC hg_return_t HG_Registered(hg_class_t* hg_class, hg_id_t id, uint8_t* flag_p);
HG_PUBLIC hg_return_t HG_Registered_proc_cb(hg_class_t* hg_class, hg_id_t id, uint8_t* flag_p,
                                            hg_proc_cb_t* in_proc_cb_p,
                                            hg_proc_cb_t* out_proc_cb_p);
HG_PUBLIC hg_return_t HG_Register_data(hg_class_t* hg_class, hg_id_t id, void* data,
                                       void (*free_callback)(void*));
HG_PUBLIC void* HG_Registered_data(hg_class_t* hg_class, hg_id_t id) HG_WARN_UNUSED_RESULT;
/* Calls of `id` get no response (one-way); both sides must say so. */
HG_PUBLIC hg_return_t HG_Registered_disable_response(hg_class_t* hg_class, hg_id_t id,
                                                     uint8_t disable);
HG_PUBLIC hg_return_t HG_Registered_disabled_response(hg_class_t* hg_class, hg_id_t id,
                                                      uint8_t* disabled_p);

/* HG_Class_get_counters: the class's counters, from Talaria's engine counters (requests and
 * responses sent and received, bulk operations; the extra-buffer and multi-receive counts are
 * 0: Talaria moves large payloads itself and posts no multi-receive buffers). */
HG_PUBLIC hg_return_t HG_Class_get_counters(const hg_class_t* hg_class,
                                            struct hg_diag_counters* diag_counters);

/* The lookup's callback runs in HG_Trigger with info.lookup.addr (HG_Addr_free it). The lookup
 * itself sends nothing (Talaria connects on the first call). */
HG_PUBLIC hg_return_t HG_Addr_lookup1(hg_context_t* context, hg_cb_t callback, void* arg,
                                      const char* name, hg_op_id_t* op_id_p);
#ifndef HG_Addr_lookup
#define HG_Addr_lookup HG_Addr_lookup1
#endif
/* Synchronous: nothing is sent. */
HG_PUBLIC hg_return_t HG_Addr_lookup2(hg_class_t* hg_class, const char* name, hg_addr_t* addr_p);
HG_PUBLIC hg_return_t HG_Addr_free(hg_class_t* hg_class, hg_addr_t addr);
HG_PUBLIC hg_return_t HG_Addr_self(hg_class_t* hg_class, hg_addr_t* addr_p);
HG_PUBLIC hg_return_t HG_Addr_dup(hg_class_t* hg_class, hg_addr_t addr, hg_addr_t* new_addr_p);
/* Forget what is cached about the peer (its connections are closed). */
HG_PUBLIC hg_return_t HG_Addr_set_remove(hg_class_t* hg_class, hg_addr_t addr);
HG_PUBLIC uint8_t HG_Addr_cmp(hg_class_t* hg_class, hg_addr_t addr1,
                              hg_addr_t addr2) HG_WARN_UNUSED_RESULT;
/* `*buf_size_p` counts the NUL; a NULL buf asks for the size (HG_OVERFLOW if too small). */
HG_PUBLIC hg_return_t HG_Addr_to_string(hg_class_t* hg_class, char* buf, hg_size_t* buf_size_p,
                                        hg_addr_t addr);

/* A handle to call `id` at `addr` (HG_NOENTRY if `id` is not registered here). */
HG_PUBLIC hg_return_t HG_Create(hg_context_t* context, hg_addr_t addr, hg_id_t id,
                                hg_handle_t* handle_p);
HG_PUBLIC hg_return_t HG_Destroy(hg_handle_t handle);
/* Point an idle handle at another address and id (id 0 keeps its id): HG_BUSY while it is
 * forwarding or referenced elsewhere, HG_NOENTRY for an id not registered here. */
HG_PUBLIC hg_return_t HG_Reset(hg_handle_t handle, hg_addr_t addr, hg_id_t id);
/* Cancel the handle's forward in flight: its callback runs in HG_Trigger with HG_CANCELED
 * (unless it had completed). */
HG_PUBLIC hg_return_t HG_Cancel(hg_handle_t handle);
HG_PUBLIC hg_return_t HG_Ref_incr(hg_handle_t handle);
HG_PUBLIC int32_t HG_Ref_get(hg_handle_t handle) HG_WARN_UNUSED_RESULT;
HG_PUBLIC const struct hg_info* HG_Get_info(hg_handle_t handle) HG_WARN_UNUSED_RESULT;
HG_PUBLIC hg_return_t HG_Set_data(hg_handle_t handle, void* data, void (*free_callback)(void*));
HG_PUBLIC void* HG_Get_data(hg_handle_t handle) HG_WARN_UNUSED_RESULT;
/* Which context of the target runs the handler (default 0). */
HG_PUBLIC hg_return_t HG_Set_target_id(hg_handle_t handle, uint8_t id);

HG_PUBLIC hg_return_t HG_Get_input(hg_handle_t handle, void* in_struct);
HG_PUBLIC hg_return_t HG_Free_input(hg_handle_t handle, void* in_struct);
HG_PUBLIC hg_size_t HG_Get_input_payload_size(hg_handle_t handle);
HG_PUBLIC hg_return_t HG_Get_output(hg_handle_t handle, void* out_struct);
HG_PUBLIC hg_return_t HG_Free_output(hg_handle_t handle, void* out_struct);
HG_PUBLIC hg_size_t HG_Get_output_payload_size(hg_handle_t handle);
/* The encoded input (target) or output (origin) as received, the class's offset first. The
 * whole payload is in this buffer (Talaria pulls large payloads itself), so the extra-buffer
 * calls give NULL and 0. */
HG_PUBLIC hg_return_t HG_Get_input_buf(hg_handle_t handle, void** in_buf_p,
                                       hg_size_t* in_buf_size_p);
HG_PUBLIC hg_return_t HG_Get_output_buf(hg_handle_t handle, void** out_buf_p,
                                        hg_size_t* out_buf_size_p);
HG_PUBLIC hg_return_t HG_Get_input_extra_buf(hg_handle_t handle, void** in_buf_p,
                                             hg_size_t* in_buf_size_p);
HG_PUBLIC hg_return_t HG_Get_output_extra_buf(hg_handle_t handle, void** out_buf_p,
                                              hg_size_t* out_buf_size_p);
/* The input buffer may be released early: HG_Get_input must have been called, and no later
 * HG_Get_input_buf is valid. */
HG_PUBLIC hg_return_t HG_Release_input_buf(hg_handle_t handle);

/* Encode `in_struct` and send it; `callback` runs in HG_Trigger once the response (or, for a
 * call without one, the send) is done. HG_BUSY while the handle's last forward is. */
HG_PUBLIC hg_return_t HG_Forward(hg_handle_t handle, hg_cb_t callback, void* arg, void* in_struct);
/* Encode `out_struct` and answer; `callback` runs in HG_Trigger. */
HG_PUBLIC hg_return_t HG_Respond(hg_handle_t handle, hg_cb_t callback, void* arg, void* out_struct);

/* Wait up to `timeout` ms for something to trigger: HG_SUCCESS, or HG_TIMEOUT. */
HG_PUBLIC hg_return_t HG_Progress(hg_context_t* context, unsigned int timeout);
/* Run up to `max_count` callbacks, waiting up to `timeout` ms for a first: HG_TIMEOUT if none. */
HG_PUBLIC hg_return_t HG_Trigger(hg_context_t* context, unsigned int timeout,
                                 unsigned int max_count, unsigned int* actual_count_p);

/* Progress driven by the program's own event loop: wait on the descriptor for readability
 * (it becomes readable when the context has work to progress), then HG_Event_progress and
 * HG_Event_trigger, neither of which blocks. */
HG_PUBLIC int HG_Event_get_wait_fd(const hg_context_t* context) HG_WARN_UNUSED_RESULT;
/* Something is queued for HG_Event_trigger. */
HG_PUBLIC bool HG_Event_ready(hg_context_t* context) HG_WARN_UNUSED_RESULT;
/* Progress without waiting; `*count_p` (may be NULL): 1 if something is then queued, else 0. */
HG_PUBLIC hg_return_t HG_Event_progress(hg_context_t* context, unsigned int* count_p);
/* Run up to `max_count` queued callbacks without waiting. */
HG_PUBLIC hg_return_t HG_Event_trigger(hg_context_t* context, unsigned int max_count,
                                       unsigned int* actual_count_p);

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_H */
