// The transport plugins of a shared build: the transports that link libfabric or UCX are shared
// objects (<libdir>/talaria-<soversion>/na_<family>.so) that libtalaria loads when an address
// of their family is first opened, so that a program using sm or tcp never loads libfabric or
// UCX and runs where they are not installed (docs/architecture.md, "Transport plugins").
//
// A plugin exports one C symbol, kPluginEntry, returning its Plugin. The plugin and the library
// exchange C++ objects (Options, Transport, Result), so a plugin is loaded only by the library
// of the build that built it: the loader compares `abi`, `version`, `build` and `layout`.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "talaria/na/na.hpp"
#include "talaria/version.hpp"

namespace talaria::na {

/// Raised when the exchange between the library and a plugin changes shape.
inline constexpr std::uint32_t kPluginAbi = 1;
/// The build the library and its plugins come from: chosen once per build tree at configure
/// time (TALARIA_PLUGIN_BUILD_ID), so that a plugin from another build of the same version,
/// perhaps configured differently, is refused rather than trusted.
#ifndef TALARIA_PLUGIN_BUILD_ID
#define TALARIA_PLUGIN_BUILD_ID "none"
#endif
inline constexpr const char* kPluginBuild = TALARIA_PLUGIN_BUILD_ID;
/// The sizes of the objects that cross, as a last check that both were compiled alike.
inline constexpr std::uint64_t kPluginLayout =
    (std::uint64_t(sizeof(Options)) << 32) | (std::uint64_t(sizeof(Context)) << 16) |
    std::uint64_t(sizeof(Result<std::unique_ptr<Transport>>));
inline constexpr const char* kPluginEntry = "talaria_na_plugin_v1";

struct Plugin {
    std::uint32_t abi;
    const char* version;  ///< TALARIA_VERSION_STRING of the build
    const char* build;    ///< kPluginBuild of the build
    std::uint64_t layout;
    const char* family;  ///< "ofi", "ucx"
    Result<std::unique_ptr<Transport>> (*open)(std::string_view sub, std::string_view rest,
                                               const Options& options);
};

/// The library a plugin links, for the error when it is missing.
struct PluginNeeds {
    std::string_view name;  ///< as a user knows it: "libfabric", "UCX"
    std::string_view file;  ///< what its file names start with: "libfabric", "libuc"
};

/// Opens "<family>+<sub>://rest" through the family's plugin: loads it, checks it, pins it
/// (RTLD_NODELETE: once accepted it stays), and calls its open. Errors (not_supported) say
/// which file was looked for where, why it could not be used, and what to do.
Result<std::unique_ptr<Transport>> open_plugin(std::string_view family, const PluginNeeds& needs,
                                               std::string_view sub, std::string_view rest,
                                               const Options& options);

}  // namespace talaria::na

/// Defines a plugin's entry: TALARIA_NA_PLUGIN(ofi, &open_ofi) in the plugin's one source that
/// is compiled only into the plugin.
#define TALARIA_NA_PLUGIN(family_name, open_fn)                                                \
    extern "C" [[gnu::visibility("default")]] const ::talaria::na::Plugin*                     \
    talaria_na_plugin_v1() noexcept {                                                          \
        static constexpr ::talaria::na::Plugin kPlugin{                                        \
            ::talaria::na::kPluginAbi,    TALARIA_VERSION_STRING, ::talaria::na::kPluginBuild, \
            ::talaria::na::kPluginLayout, #family_name,           open_fn};                    \
        return &kPlugin;                                                                       \
    }
