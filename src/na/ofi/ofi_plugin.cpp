// The ofi transport's plugin entry (shared builds: na_ofi.so, which libtalaria loads when an
// address ofi+<...>:// is first opened; src/na/base/plugin.hpp).
#include "na/base/plugin.hpp"
#include "na/base/transports.hpp"

TALARIA_NA_PLUGIN(ofi, &::talaria::na::open_ofi)
