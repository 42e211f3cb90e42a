// The ucx transport's plugin entry (shared builds: na_ucx.so, which libtalaria loads when an
// address ucx+<...>:// is first opened; src/na/base/plugin.hpp).
#include "na/base/plugin.hpp"
#include "na/base/transports.hpp"

TALARIA_NA_PLUGIN(ucx, &::talaria::na::open_ucx)
