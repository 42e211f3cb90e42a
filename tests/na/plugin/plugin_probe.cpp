// The transport plugins of a shared build, seen by a program linked against libtalaria.so as
// any application is. One mode per ctest case (CMakeLists.txt):
//   loads    libfabric and UCX are not in the process until an ofi+ / ucx+ address is opened;
//            then the plugin loads and the transport works.
//   missing  TALARIA_PLUGIN_DIR names an empty folder: tcp works, ofi+/ucx+ fail naming the
//            file looked for and the variable.
//   foreign  TALARIA_PLUGIN_DIR holds a plugin of another version and a file without the entry:
//            both refused, saying why.
//   other_build  a plugin of this version from another build: refused.
//   hidden   run by hide.sh with libfabric's and UCX's libraries hidden (a mount namespace): tcp
//            works, ofi+/ucx+ fail naming the library that is missing.
#include <talaria/config.hpp>
#include <talaria/na/na.hpp>
#include <talaria/talaria.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace na = talaria::na;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
    if (!ok) ++failures;
}

/// Whether a shared object whose file name contains `name` is mapped into this process.
bool mapped(std::string_view name) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (auto slash = line.rfind('/');
            slash != std::string::npos && line.find(name, slash) != std::string::npos)
            return true;
    return false;
}

struct Family {
    std::string_view name;     ///< "ofi"
    std::string_view library;  ///< a library its plugin links: "libfabric"
    std::string_view needs;    ///< how errors name it
};

std::vector<Family> families() {
    std::vector<Family> v;
#if TALARIA_HAVE_OFI
    v.push_back({"ofi", "libfabric", "libfabric"});
#endif
#if TALARIA_HAVE_UCX
    v.push_back({"ucx", "libucp", "UCX"});
#endif
    return v;
}

void no_transport_library_loaded(const char* when) {
    for (const auto& f : families())
        check(!mapped(f.library), std::string(f.library) + " is not loaded " + when);
}

/// An RPC over tcp through the public API.
void tcp_works() {
    try {
        talaria::Engine server{"tcp://127.0.0.1:0", talaria::listen};
        server.define("sum", [](int a, int b) { return a + b; });
        talaria::Engine client{"tcp://127.0.0.1:0"};
        auto ep = client.lookup(server.self_address());
        int sum = client.remote<int(int, int)>("sum").on(ep)(40, 2).get();
        check(sum == 42, "an RPC over tcp answers 40 + 2 = " + std::to_string(sum));
    } catch (const talaria::Exception& e) {
        check(false, std::string("an RPC over tcp: ") + e.what());
    }
}

std::string address(const Family& f) {
    return std::string(f.name) + "+tcp://127.0.0.1:0";
}

/// Opening `f` fails with not_supported and a message containing every one of `words`.
void refused(const Family& f, const std::vector<std::string>& words) {
    auto t = na::open(address(f));
    if (t) {
        check(false, address(f) + " was refused");
        return;
    }
    std::string text = t.error().describe();
    std::printf("  %s: %s\n", address(f).c_str(), text.c_str());
    check(t.error().code() == talaria::Errc::not_supported,
          address(f) + " fails with not_supported");
    for (auto w : words)
        check(text.find(w) != std::string::npos, address(f) + "'s error says '" + w + "'");
}

}  // namespace

int main(int argc, char** argv) {
    std::string_view mode = argc > 1 ? argv[1] : "";
    no_transport_library_loaded("at start");
    tcp_works();
    no_transport_library_loaded("after an RPC over tcp");
    if (mode == "loads") {
        for (const auto& f : families()) {
            auto t = na::open(address(f));
            check(bool(t), address(f) + " opens through its plugin" +
                               (t ? "" : ": " + t.error().describe()));
            check(mapped(f.library), std::string(f.library) + " is loaded once it is used");
            check(mapped("na_" + std::string(f.name) + ".so"),
                  "na_" + std::string(f.name) + ".so is loaded");
            if (t) {
                // A second transport of the family loads nothing again and works as well.
                auto u = na::open(address(f));
                check(bool(u), address(f) + " opens a second time");
            }
        }
    } else if (mode == "missing") {
        for (const auto& f : families())
            refused(f, {"na_" + std::string(f.name) + ".so", "TALARIA_PLUGIN_DIR", "No such file"});
    } else if (mode == "foreign") {
        // foreign/na_ofi.so claims another version; foreign/na_ucx.so has no entry.
        for (const auto& f : families()) {
            if (f.name == "ofi")
                refused(
                    f,
                    {"is not a plugin for this library: it was built for Talaria "
                     "0.0.0-foreign",
                     "install the plugin built with this library (Talaria " TALARIA_VERSION_STRING
                     ")"});
            else
                refused(f, {"is not a plugin for this library: it has no talaria_na_plugin_v1()"});
        }
    } else if (mode == "other_build") {
        // other_build/na_ofi.so: this version, another build.
        for (const auto& f : families())
            if (f.name == "ofi")
                refused(f, {"comes from another build of Talaria " TALARIA_VERSION_STRING,
                            "(build another-build, this library's "});
    } else if (mode == "hidden") {
        for (const auto& f : families())
            refused(f, {"could not be loaded", std::string(f.needs)});
        tcp_works();
    } else {
        std::printf("usage: %s loads|missing|foreign|other_build|hidden\n", argv[0]);
        return 2;
    }
    if (mode != "loads") no_transport_library_loaded("after the refusals");
    std::printf("%d failed\n", failures);
    return failures == 0 ? 0 : 1;
}
