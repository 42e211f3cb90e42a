// Two files a plugin folder should not hold, for plugin_probe's "foreign" case: built with
// FOREIGN_ENTRY, a plugin that claims another Talaria version (the loader must refuse it before
// calling anything); without, a shared object that has no plugin entry at all.
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
    static constexpr talaria::na::Plugin kPlugin{talaria::na::kPluginAbi, "0.0.0-foreign",
                                                 talaria::na::kPluginLayout, "ofi", &never};
    return &kPlugin;
}
#else
extern "C" [[gnu::visibility("default")]] int talaria_not_a_plugin() {
    return 0;
}
#endif
