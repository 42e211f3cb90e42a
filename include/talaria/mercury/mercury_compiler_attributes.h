/* Talaria's Mercury-compatible C API: the compiler attributes Mercury's headers and its users
 * spell as HG_ATTR_*.
 *
 * Mercury ships this header with its util library, and its mercury_config.h and na_config.h
 * include it; a program may include it directly, or get it again from Mercury's util headers
 * (which it keeps linking, see docs/architecture.md). The include guard is Mercury's, so that
 * whichever copy the include path finds first is the only one compiled, and the two define the
 * same names. */
#ifndef MERCURY_COMPILER_ATTRIBUTES_H
#define MERCURY_COMPILER_ATTRIBUTES_H

#if defined(__GNUC__) || defined(__clang__)
#define HG_ATTR_ABI_IMPORT __attribute__((__visibility__("default")))
#define HG_ATTR_ABI_EXPORT __attribute__((__visibility__("default")))
#define HG_ATTR_ABI_HIDDEN __attribute__((__visibility__("hidden")))
#define HG_ATTR_WARN_UNUSED_RESULT __attribute__((__warn_unused_result__))
#define HG_ATTR_UNUSED __attribute__((__unused__))
#define HG_ATTR_ALIGNED(x, a) x __attribute__((__aligned__(a)))
#define HG_ATTR_PACKED_PUSH
#define HG_ATTR_PACKED_POP __attribute__((__packed__))
#define HG_ATTR_PRINTF(_fmt, _firstarg) __attribute__((__format__(printf, _fmt, _firstarg)))
#define HG_ATTR_CONSTRUCTOR __attribute__((__constructor__))
#define HG_ATTR_CONSTRUCTOR_PRIORITY(x) __attribute__((__constructor__(x)))
#define HG_ATTR_DESTRUCTOR __attribute__((__destructor__))
#if defined(__has_attribute)
#if __has_attribute(__fallthrough__)
#define HG_ATTR_FALLTHROUGH __attribute__((__fallthrough__))
#endif
#endif
#else
#define HG_ATTR_ABI_IMPORT
#define HG_ATTR_ABI_EXPORT
#define HG_ATTR_ABI_HIDDEN
#define HG_ATTR_WARN_UNUSED_RESULT
#define HG_ATTR_UNUSED
#define HG_ATTR_ALIGNED(x, a) x
#define HG_ATTR_PACKED_PUSH
#define HG_ATTR_PACKED_POP
#define HG_ATTR_PRINTF(_fmt, _firstarg)
#define HG_ATTR_CONSTRUCTOR
#define HG_ATTR_CONSTRUCTOR_PRIORITY(x)
#define HG_ATTR_DESTRUCTOR
#endif
#ifndef HG_ATTR_FALLTHROUGH
#define HG_ATTR_FALLTHROUGH \
    do {                    \
    } while (0) /* fallthrough */
#endif
#define HG_ATTR_PACKED(x) HG_ATTR_PACKED_PUSH x HG_ATTR_PACKED_POP

#endif /* MERCURY_COMPILER_ATTRIBUTES_H */
