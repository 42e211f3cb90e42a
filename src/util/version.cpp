#include "talaria/version.hpp"

namespace talaria {

// Compiled into the library: the macros here are the library's, whatever headers the caller
// saw.
Version version() noexcept {
    return Version{TALARIA_VERSION_MAJOR, TALARIA_VERSION_MINOR, TALARIA_VERSION_PATCH,
                   TALARIA_VERSION_STRING};
}

}  // namespace talaria
