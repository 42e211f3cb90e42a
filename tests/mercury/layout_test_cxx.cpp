// Mercury's user-visible layouts and values, compiled as C++ (layout_checks.h): a C++ program
// (Thallium's world) includes the same headers.
#include "layout_checks.h"

int main() {
    return run_layout_checks();
}
