// Placeholder until the sm transport lands (replaced in this same change).
#include "na/base/transports.hpp"

namespace talaria::na {
Result<std::unique_ptr<Transport>> open_sm(std::string_view, const Options&) {
    return Error(Errc::not_supported, "sm transport not written yet");
}
}  // namespace talaria::na
