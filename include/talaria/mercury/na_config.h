/* Talaria's Mercury-compatible C API: the NA library's configuration (see mercury_config.h). */
#ifndef NA_CONFIG_H
#define NA_CONFIG_H

#include "mercury_config.h"

#define NA_PUBLIC HG_ATTR_ABI_EXPORT
#define NA_PRIVATE HG_ATTR_ABI_HIDDEN
#define NA_INLINE __inline__
#define NA_UNUSED HG_ATTR_UNUSED
#define NA_WARN_UNUSED_RESULT HG_ATTR_WARN_UNUSED_RESULT

/* Shared memory is always there (na+sm is Talaria's sm transport); ofi+* and ucx+* are served
 * when Talaria was built with libfabric and UCX, which a program learns at run time
 * (NA_Get_protocol_info), not from a macro. */
#define NA_HAS_SM

#endif /* NA_CONFIG_H */
