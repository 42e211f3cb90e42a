// talaria-perf: the explicit list of layer back ends.
#include "backend.hpp"

namespace talaria::perf {

namespace {
constexpr Pattern kNaPatterns[] = {Pattern::pingpong, Pattern::blast, Pattern::put, Pattern::get};
constexpr Layer kLayers[] = {
    {"na", kNaPatterns, &make_na_server, &make_na_client},
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

}  // namespace talaria::perf
