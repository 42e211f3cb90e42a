// Placeholder until the inproc transport lands (replaced in this same change).
#include "na/base/transports.hpp"

namespace talaria::na {
Result<std::unique_ptr<Transport>> open_inproc(std::string_view, const Options&) {
    return Error(Errc::not_supported, "inproc transport not written yet");
}
}  // namespace talaria::na
