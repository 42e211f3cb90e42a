// mercury_macros.h from C++ (Thallium's world): the same program as macros_test.c.
#include "macros_test.c"
