// Files a plugin folder should not hold, for plugin_probe's "foreign" and "other_build" cases:
// built with FOREIGN_ENTRY, a plugin that claims another Talaria version (FOREIGN_VERSION), or
// this version but another build (TALARIA_PLUGIN_BUILD_ID set differently), which the loader
// must refuse before calling anything; without, a shared object that has no plugin entry.
#include "na/base/plugin.hpp"

#ifdef FOREIGN_ENTRY
namespace {
talaria::Result<std::unique_ptr<talaria::na::Transport>> never(std::string_view, std::string_view,
                                                               const talaria::na::Options&) {
    return talaria::Error(talaria::Errc::internal, "a foreign plugin's open was called");
}
}  // namespace

extern "C" [[gnu::visibility("default")]] const talaria::na::Plugin*
talaria_na_plugin_v1() noexcept {
    static constexpr talaria::na::Plugin kPlugin{
        talaria::na::kPluginAbi,    FOREIGN_VERSION, talaria::na::kPluginBuild,
        talaria::na::kPluginLayout, "ofi",           &never};
    return &kPlugin;
}
#else
extern "C" [[gnu::visibility("default")]] int talaria_not_a_plugin() {
    return 0;
}
#endif
