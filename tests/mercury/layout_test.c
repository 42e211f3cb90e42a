/* Mercury's user-visible layouts and values, compiled as C11 (layout_checks.h). */
#include "layout_checks.h"

int main(void) {
    struct hg_init_info info = HG_INIT_INFO_INITIALIZER; /* the initializer compiles in C */
    struct na_init_info na = NA_INIT_INFO_INITIALIZER;
    if (info.na_class != NULL || na.max_contexts != 1 || info.na_init_info.max_contexts != 1) {
        fprintf(stderr, "the init info initializers set the wrong defaults\n");
        return 1;
    }
    return run_layout_checks();
}
