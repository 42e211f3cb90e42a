/* Talaria's Mercury-compatible C API: build configuration and portable types.
 *
 * Part of the headers that let a program written for Mercury 2.4 (mercury-hpc/mercury) build
 * unchanged against Talaria: the same names, types, values and macros, written for Talaria.
 * docs/architecture.md, "The Mercury C API". */
#ifndef MERCURY_CONFIG_H
#define MERCURY_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Fixed-width integer names the proc layer and user code use. */
typedef int8_t hg_int8_t;
typedef int16_t hg_int16_t;
typedef int32_t hg_int32_t;
typedef int64_t hg_int64_t;
typedef uint8_t hg_uint8_t;
typedef uint16_t hg_uint16_t;
typedef uint32_t hg_uint32_t;
typedef uint64_t hg_uint64_t;
typedef hg_uint64_t hg_ptr_t; /* a pointer carried as a 64-bit value */
typedef hg_uint8_t hg_bool_t; /* one byte, HG_TRUE or HG_FALSE */

#define HG_TRUE 1
#define HG_FALSE 0

/* The Mercury release whose interface these headers reproduce. */
#define HG_VERSION_MAJOR 2
#define HG_VERSION_MINOR 4
#define HG_VERSION_PATCH 1

/* Set: this is Talaria's implementation of the interface, not Mercury's. */
#define HG_TALARIA 1

#include "mercury_compiler_attributes.h"

#define HG_WARN_UNUSED_RESULT HG_ATTR_WARN_UNUSED_RESULT
#define HG_UNUSED HG_ATTR_UNUSED
#define HG_PACKED(x) HG_ATTR_PACKED(x)
#define HG_FALLTHROUGH HG_ATTR_FALLTHROUGH
#define HG_INLINE __inline__

/* Every function of the interface is exported from libmercury (the library is built with
 * hidden visibility by default); nothing is imported differently on ELF platforms. */
#define HG_PUBLIC HG_ATTR_ABI_EXPORT
#define HG_PRIVATE HG_ATTR_ABI_HIDDEN

/* What this build has, as Mercury's configuration names it. */
#define HG_BUILD_SHARED_LIBS  /* libmercury is a shared library */
#define HG_HAS_BOOST          /* mercury_macros.h over Boost.Preprocessor */
#define HG_HAS_DIAG           /* HG_Class_get_counters */
#define HG_HAS_MULTI_PROGRESS /* several threads may progress one context */

#endif /* MERCURY_CONFIG_H */
