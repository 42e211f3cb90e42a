/* Talaria's Mercury-compatible C API: the proc of bulk handles (Mercury 2.4.1's
 * mercury_proc_bulk.h): a uint64_t size (0 for HG_BULK_NULL), then HG_Bulk_serialize's bytes.
 * A decoded handle belongs to the input or output struct and is freed by the HG_FREE pass
 * (HG_Free_input, HG_Free_output); keep it longer with HG_Bulk_ref_incr. */
#ifndef MERCURY_PROC_BULK_H
#define MERCURY_PROC_BULK_H

#include "mercury_proc.h"

#ifdef __cplusplus
extern "C" {
#endif

HG_PUBLIC hg_return_t hg_proc_hg_bulk_t(hg_proc_t proc, void* data);

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_PROC_BULK_H */
