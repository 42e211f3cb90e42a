// talaria-perf: choosing the raw baseline of a transport.
#include <fmt/format.h>

#include "baseline.hpp"

namespace talaria::perf {

std::unique_ptr<Runner> make_raw_sm(int ctl_fd, const BaselineOptions& opt);
std::unique_ptr<Runner> make_raw_tcp(int ctl_fd);

Result<std::unique_ptr<Runner>> make_baseline(std::string_view transport, int ctl_fd,
                                              const BaselineOptions& opt) {
    if (transport == "sm") return make_raw_sm(ctl_fd, opt);
    if (transport == "tcp") return make_raw_tcp(ctl_fd);
    return Error(Errc::not_supported,
                 fmt::format("no raw baseline for transport '{}' (have: sm, tcp)", transport));
}

}  // namespace talaria::perf
