// The explicit list of compiled-in transports (no static registration). Each transport's
// open function lives in src/na/<name>/.
#pragma once

#include <memory>
#include <string_view>

#include "talaria/config.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {

/// `rest` is the address string after "scheme://".
Result<std::unique_ptr<Transport>> open_inproc(std::string_view rest, const Options& o);
Result<std::unique_ptr<Transport>> open_sm(std::string_view rest, const Options& o);
Result<std::unique_ptr<Transport>> open_tcp(std::string_view rest, const Options& o);
#if TALARIA_HAVE_OFI
/// "ofi+<provider>://rest": `sub` is the part after "ofi+" ("tcp", "shm", "verbs", ...).
Result<std::unique_ptr<Transport>> open_ofi(std::string_view sub, std::string_view rest,
                                            const Options& o);
#endif
#if TALARIA_HAVE_UCX
/// "ucx+<transports>://rest": `sub` is the part after "ucx+" ("tcp", "sm", "all", "rc", ...).
Result<std::unique_ptr<Transport>> open_ucx(std::string_view sub, std::string_view rest,
                                            const Options& o);
#endif

}  // namespace talaria::na
