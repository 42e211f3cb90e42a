// talaria-perf: the explicit list of layer back ends.
#include "backend.hpp"

#include <fmt/format.h>

namespace talaria::perf {

Result<na::Auth> perf_auth(const std::string& path, const std::string& protect) {
    na::Auth a;
    if (protect == "integrity")
        a.protect = na::Protect::integrity;
    else if (protect == "encryption")
        a.protect = na::Protect::encryption;
    else if (!protect.empty() && protect != "none")
        return Error(Errc::invalid_argument,
                     fmt::format("--protect {}: none, integrity or encryption", protect));
    if (path.empty()) {
        if (a.protect != na::Protect::none)
            return Error(Errc::invalid_argument, "--protect needs --auth-secret-file");
        return a;
    }
    auto secret = na::read_secret_file(path);
    if (!secret)
        return Error(secret.error().code(),
                     fmt::format("--auth-secret-file: {}", secret.error().describe()));
    a.key_id = std::string(kPerfAuthKeyId);
    a.secret = std::move(*secret);
    return a;
}

void push_auth_args(std::vector<std::string>& args, const std::string& path,
                    const std::string& protect) {
    if (!path.empty()) {
        args.push_back("--auth-secret-file");
        args.push_back(path);
    }
    if (!protect.empty()) {
        args.push_back("--protect");
        args.push_back(protect);
    }
}

namespace {
constexpr Pattern kNaPatterns[] = {Pattern::pingpong, Pattern::blast, Pattern::put, Pattern::get};
constexpr Pattern kRpcPatterns[] = {Pattern::pingpong, Pattern::rate, Pattern::first};
constexpr Pattern kBulkPatterns[] = {Pattern::pull, Pattern::push};
constexpr Pattern kApiPatterns[] = {Pattern::pingpong, Pattern::rate, Pattern::pull, Pattern::push};
constexpr Pattern kHgPatterns[] = {Pattern::pingpong, Pattern::rate, Pattern::pull, Pattern::push};
constexpr Layer kLayers[] = {
    {"na", kNaPatterns, &make_na_server, &make_na_client},
    {"rpc", kRpcPatterns, &make_rpc_server, &make_rpc_client},
    {"bulk", kBulkPatterns, &make_rpc_server, &make_bulk_client},
    {"api", kApiPatterns, &make_rpc_server, &make_api_client},
    {"hg", kHgPatterns, &make_rpc_server, &make_hg_client},
};
}  // namespace

std::span<const Layer> layers() {
    return kLayers;
}

const Layer* find_layer(std::string_view name) {
    for (const auto& l : kLayers)
        if (l.name == name) return &l;
    return nullptr;
}

bool shares_server(const Layer& a, const Layer& b) noexcept {
    return a.make_server == b.make_server;
}

}  // namespace talaria::perf
