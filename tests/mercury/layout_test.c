/* Mercury's user-visible layouts and values, compiled as C11 (layout_checks.h). */
#include "layout_checks.h"

/* The configuration macros a Mercury program may test or use, with Mercury 2.4.1's values; the
   attributes header Mercury's util library also ships compiles beside them. */
#include "mercury_compiler_attributes.h"
#include "na.h"
#if NA_VERSION_MAJOR != 6 || NA_VERSION_MINOR != 0 || NA_VERSION_PATCH != 0
#error "NA_VERSION is not Mercury 2.4.1's NA (6.0.0)"
#endif
#if !defined(HG_BUILD_SHARED_LIBS) || !defined(NA_BUILD_SHARED_LIBS)
#error "HG_BUILD_SHARED_LIBS / NA_BUILD_SHARED_LIBS"
#endif
static int NA_ALIGNED(aligned_int, 64);
HG_ATTR_PRINTF(1, 2) static int say(const char* fmt, ...) {
    (void)fmt;
    return 0;
}
struct packed_pair {
    char c;
    int i;
} HG_ATTR_PACKED_POP;

int main(void) {
    struct hg_init_info info = HG_INIT_INFO_INITIALIZER; /* the initializer compiles in C */
    struct na_init_info na = NA_INIT_INFO_INITIALIZER;
    if (info.na_class != NULL || na.max_contexts != 1 || info.na_init_info.max_contexts != 1) {
        fprintf(stderr, "the init info initializers set the wrong defaults\n");
        return 1;
    }
    if (((size_t)&aligned_int) % 64 != 0 || sizeof(struct packed_pair) != 5 || say("%d", 1)) {
        fprintf(stderr, "NA_ALIGNED / HG_ATTR_PACKED_POP / HG_ATTR_PRINTF\n");
        return 1;
    }
    return run_layout_checks();
}
