// The loader of transport plugins, linked into libtalaria.so in place of the libfabric and UCX
// transports themselves (a static build and the tests link those directly). Nothing is cached
// here: each open asks the dynamic linker, which keeps a loaded plugin (RTLD_NODELETE) and
// answers a second dlopen of it from its own table.
#include <dlfcn.h>
#include <sys/stat.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "na/base/plugin.hpp"
#include "na/base/transports.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

namespace {

struct Dir {
    std::string path;
    std::string how;  ///< where the path came from, for errors
};

/// TALARIA_PLUGIN_DIR when set, else the folder beside this library that the build and
/// `cmake --install` put the plugins in, found from where the library itself was loaded.
Dir plugin_dir() {
    if (const char* d = std::getenv("TALARIA_PLUGIN_DIR"); d && *d)
        return {d, "set by TALARIA_PLUGIN_DIR"};
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&plugin_dir), &info) != 0 && info.dli_fname) {
        std::string lib = info.dli_fname;
        auto slash = lib.rfind('/');
        std::string dir = slash == std::string::npos ? std::string(".") : lib.substr(0, slash);
        return {dir + "/" TALARIA_PLUGIN_SUBDIR, fmt::format("beside {}", lib)};
    }
    return {TALARIA_PLUGIN_SUBDIR,
            "relative to the working directory: dladdr did not find "
            "libtalaria"};
}

Result<const Plugin*> load(std::string_view family, std::string_view needs) {
    Dir dir = plugin_dir();
    std::string path = fmt::format("{}/na_{}.so", dir.path, family);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        int err = errno;
        return Error(Errc::not_supported,
                     fmt::format("the {0} transport is a plugin, and {1} ({2}) cannot be read: "
                                 "{3}: install Talaria's {0} plugin (built where {4} is found), "
                                 "or set TALARIA_PLUGIN_DIR to the folder that holds na_{0}.so",
                                 family, path, dir.how, std::strerror(err), needs));
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!handle) {
        const char* why = ::dlerror();
        return Error(Errc::not_supported,
                     fmt::format("the {} transport's plugin {} could not be loaded: {}: is {} "
                                 "installed where the dynamic linker looks?",
                                 family, path, why ? why : "unknown error", needs));
    }
    // RTLD_NODELETE keeps the plugin mapped after this dlclose: its code and the Transport
    // objects it makes outlive the handle.
    auto* entry = reinterpret_cast<const Plugin* (*)() noexcept>(::dlsym(handle, kPluginEntry));
    const Plugin* p = entry ? entry() : nullptr;
    ::dlclose(handle);
    if (!p)
        return Error(Errc::not_supported,
                     fmt::format("{} is not a Talaria transport plugin: it has no {}() (remove it, "
                                 "or point TALARIA_PLUGIN_DIR elsewhere)",
                                 path, kPluginEntry));
    if (p->abi != kPluginAbi || std::strcmp(p->version, TALARIA_VERSION_STRING) != 0 ||
        p->layout != kPluginLayout || std::string_view(p->family) != family || !p->open)
        return Error(
            Errc::not_supported,
            fmt::format("{} was built for Talaria {} (plugin ABI {}, family '{}'), and "
                        "this library is Talaria {} (plugin ABI {}): install the plugin "
                        "built with this library",
                        path, p->version, p->abi, p->family, TALARIA_VERSION_STRING, kPluginAbi));
    TALARIA_LOG(na, debug, "loaded the {} transport from {}", family, path);
    return p;
}

}  // namespace

Result<std::unique_ptr<Transport>> open_plugin(std::string_view family, std::string_view needs,
                                               std::string_view sub, std::string_view rest,
                                               const Options& options) {
    TALARIA_TRY(p, load(family, needs));
    return p->open(sub, rest, options);
}

#if TALARIA_HAVE_OFI
Result<std::unique_ptr<Transport>> open_ofi(std::string_view sub, std::string_view rest,
                                            const Options& o) {
    return open_plugin("ofi", "libfabric", sub, rest, o);
}
#endif
#if TALARIA_HAVE_UCX
Result<std::unique_ptr<Transport>> open_ucx(std::string_view sub, std::string_view rest,
                                            const Options& o) {
    return open_plugin("ucx", "UCX", sub, rest, o);
}
#endif

}  // namespace talaria::na
