// The explicit list of compiled-in transports (no static registration). Each transport's
// open function lives in src/na/<name>/.
#pragma once

#include <memory>
#include <string_view>

#include "talaria/na/na.hpp"

namespace talaria::na {

/// `rest` is the address string after "scheme://".
Result<std::unique_ptr<Transport>> open_inproc(std::string_view rest, const Options& o);
Result<std::unique_ptr<Transport>> open_sm(std::string_view rest, const Options& o);
Result<std::unique_ptr<Transport>> open_tcp(std::string_view rest, const Options& o);

}  // namespace talaria::na
