// Placeholder until the tcp transport lands (replaced in this same change).
#include "na/base/transports.hpp"

namespace talaria::na {
Result<std::unique_ptr<Transport>> open_tcp(std::string_view, const Options&) {
    return Error(Errc::not_supported, "tcp transport not written yet");
}
}  // namespace talaria::na
