/* Talaria's Mercury-compatible C API: the NA library's configuration (see mercury_config.h). */
#ifndef NA_CONFIG_H
#define NA_CONFIG_H

#include "mercury_config.h"

/* The NA library release whose interface these headers reproduce (Mercury 2.4.1's NA). */
#define NA_VERSION_MAJOR 6
#define NA_VERSION_MINOR 0
#define NA_VERSION_PATCH 0

#define NA_PUBLIC HG_ATTR_ABI_EXPORT
#define NA_PRIVATE HG_ATTR_ABI_HIDDEN
#define NA_PLUGIN HG_ATTR_ABI_EXPORT
#define NA_PLUGIN_VISIBILITY NA_PUBLIC
#define NA_INLINE __inline__
#define NA_UNUSED HG_ATTR_UNUSED
#define NA_WARN_UNUSED_RESULT HG_ATTR_WARN_UNUSED_RESULT
#define NA_ALIGNED(x, a) HG_ATTR_ALIGNED(x, a)
#define NA_PRINTF(_fmt, _firstarg) HG_ATTR_PRINTF(_fmt, _firstarg)
#define NA_PACKED(x) HG_ATTR_PACKED(x)
#define NA_FALLTHROUGH HG_ATTR_FALLTHROUGH
#define NA_BUILD_SHARED_LIBS /* libna is a shared library */

/* Shared memory is always there (na+sm is Talaria's sm transport); ofi+* and ucx+* are served
 * when Talaria was built with libfabric and UCX, which a program learns at run time
 * (NA_Get_protocol_info), not from a macro. */
#define NA_HAS_SM

#endif /* NA_CONFIG_H */
