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
#include "na/base/signals.hpp"
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
    // secure_getenv: a setuid or file-capability program ignores it, and loads only the
    // plugins installed with the library.
    if (const char* d = ::secure_getenv("TALARIA_PLUGIN_DIR"); d && *d)
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

Result<const Plugin*> load(std::string_view family, const PluginNeeds& needs) {
    Dir dir = plugin_dir();
    std::string path = fmt::format("{}/na_{}.so", dir.path, family);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        int err = errno;
        return Error(Errc::not_supported,
                     fmt::format("the {0} transport is a plugin, and {1} ({2}) cannot be read: "
                                 "{3}: install Talaria's {0} plugin (built where {4} is found), "
                                 "or set TALARIA_PLUGIN_DIR to the folder that holds na_{0}.so",
                                 family, path, dir.how, std::strerror(err), needs.name));
    }
    // Loaded without RTLD_NODELETE until it is checked, so that a file refused below is
    // unloaded again (with whatever it pulled in, e.g. another version of libtalaria).
    // The libraries it pulls in (libfabric, UCX and theirs) may take signals as they load:
    // the application's handlers are put back (signals.hpp).
    void* handle = nullptr;
    {
        KeepSignals keep(fmt::format("loading {}", path));
        handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (!handle) {
        const char* e = ::dlerror();
        std::string why = e ? e : "unknown error";
        // The library the plugin links missing (its file name, e.g. libfabric.so.1, appears in
        // the message), or the plugin itself unusable.
        bool dependency = why.find(needs.file) != std::string::npos;
        return Error(
            Errc::not_supported,
            dependency
                ? fmt::format("the {} transport's plugin {} could not be loaded: {}: is {} "
                              "installed where the dynamic linker looks?",
                              family, path, why, needs.name)
                : fmt::format("the {} transport's plugin {} could not be loaded: {}: reinstall "
                              "the plugin built with this library, or point TALARIA_PLUGIN_DIR "
                              "at its folder",
                              family, path, why));
    }
    auto* entry = reinterpret_cast<const Plugin* (*)() noexcept>(::dlsym(handle, kPluginEntry));
    const Plugin* p = entry ? entry() : nullptr;
    auto refuse = [&](std::string why) -> Error {
        ::dlclose(handle);
        return Error(Errc::not_supported,
                     fmt::format("{} is not a plugin for this library: {}: install the plugin "
                                 "built with this library (Talaria {}), or point "
                                 "TALARIA_PLUGIN_DIR elsewhere",
                                 path, why, TALARIA_VERSION_STRING));
    };
    if (!p) return refuse(fmt::format("it has no {}()", kPluginEntry));
    auto text = [](const char* v) { return v ? std::string_view(v) : std::string_view("(null)"); };
    if (p->abi != kPluginAbi)
        return refuse(fmt::format("its plugin ABI is {}, this library's {}", p->abi, kPluginAbi));
    if (text(p->version) != TALARIA_VERSION_STRING)
        return refuse(fmt::format("it was built for Talaria {}", text(p->version)));
    if (text(p->build) != kPluginBuild)
        return refuse(
            fmt::format("it comes from another build of Talaria {} (build {}, this "
                        "library's {})",
                        TALARIA_VERSION_STRING, text(p->build), kPluginBuild));
    if (p->layout != kPluginLayout)
        return refuse(fmt::format("its layout stamp is {:#x}, this library's {:#x}", p->layout,
                                  kPluginLayout));
    if (text(p->family) != family || !p->open)
        return refuse(fmt::format("it holds the '{}' transport", text(p->family)));
    // Checked: keep it loaded for the life of the process (its code runs the Transports it
    // makes), then let go of this handle.
    if (!::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) {
        const char* e = ::dlerror();
        return refuse(fmt::format("it could not be kept loaded: {}", e ? e : "unknown error"));
    }
    ::dlclose(handle);
    TALARIA_LOG(na, debug, "loaded the {} transport from {}", family, path);
    return p;
}

}  // namespace

Result<std::unique_ptr<Transport>> open_plugin(std::string_view family, const PluginNeeds& needs,
                                               std::string_view sub, std::string_view rest,
                                               const Options& options) {
    TALARIA_TRY(p, load(family, needs));
    return p->open(sub, rest, options);
}

#if TALARIA_HAVE_OFI
Result<std::unique_ptr<Transport>> open_ofi(std::string_view sub, std::string_view rest,
                                            const Options& o) {
    return open_plugin("ofi", {"libfabric", "libfabric"}, sub, rest, o);
}
#endif
#if TALARIA_HAVE_UCX
Result<std::unique_ptr<Transport>> open_ucx(std::string_view sub, std::string_view rest,
                                            const Options& o) {
    return open_plugin("ucx", {"UCX", "libuc"}, sub, rest, o);
}
#endif

}  // namespace talaria::na
