// talaria-perf: transport names (see transports.hpp).
#include "transports.hpp"

#include <fmt/format.h>

namespace talaria::perf {

namespace {

/// Sub-schemes of the ofi and ucx families that name shared-memory providers / UCX transports.
constexpr std::string_view kShmSubs[] = {"shm", "sm",    "posix", "sysv",
                                         "cma", "xpmem", "knem",  "self"};

bool valid_sub(std::string_view sub) noexcept {
    if (sub.empty()) return false;
    for (char c : sub)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    return true;
}

}  // namespace

Result<Family> transport_family(std::string_view t) {
    if (t == "sm") return Family::sm;
    if (t == "tcp") return Family::tcp;
    auto plus = t.find('+');
    if (plus != std::string_view::npos && valid_sub(t.substr(plus + 1))) {
        auto fam = t.substr(0, plus);
        if (fam == "ofi") return Family::ofi;
        if (fam == "ucx") return Family::ucx;
    }
    return Error(Errc::invalid_argument,
                 fmt::format("transport '{}': talaria-perf measures sm, tcp, ofi+<provider> "
                             "(ofi+tcp, ofi+shm, ...) and ucx+<transports> (ucx+tcp, ucx+sm, ...)",
                             t));
}

std::string_view sub_scheme(std::string_view t) noexcept {
    auto plus = t.find('+');
    return plus == std::string_view::npos ? std::string_view{} : t.substr(plus + 1);
}

bool is_shared_memory(std::string_view t) noexcept {
    if (t == "sm") return true;
    auto sub = sub_scheme(t);
    for (auto s : kShmSubs)
        if (sub == s) return true;
    return false;
}

bool is_ip_transport(std::string_view t) noexcept {
    return t == "tcp" || (!sub_scheme(t).empty() && !is_shared_memory(t));
}

std::string default_url(std::string_view t) {
    if (is_ip_transport(t)) return fmt::format("{}://127.0.0.1:0", t);
    return fmt::format("{}://", t);
}

}  // namespace talaria::perf
