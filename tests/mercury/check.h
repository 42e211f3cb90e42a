/* The C tests' check: say what failed, where, and count it (the program's status). */
#ifndef TALARIA_MERCURY_TEST_CHECK_H
#define TALARIA_MERCURY_TEST_CHECK_H

#include <stdio.h>

static int failures = 0;
#define CHECK(cond, what)                                             \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, what); \
            ++failures;                                               \
        }                                                             \
    } while (0)

#endif /* TALARIA_MERCURY_TEST_CHECK_H */
