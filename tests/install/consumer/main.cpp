// A downstream project against an installed Talaria: opens every built transport (ofi and ucx
// over tcp), then makes an RPC through the C++ API, proving that the installed headers, config
// header and libraries (every layer, exported as talaria::talaria) work.
#include <cstdio>
#include <string>

#include <talaria/config.hpp>
#include <talaria/na/na.hpp>
#include <talaria/talaria.hpp>

int main() {
    std::printf("talaria %s\n", TALARIA_VERSION);
    // The installed version header and the installed library agree.
    if (talaria::version().string != TALARIA_VERSION_STRING ||
        talaria::version().number() != TALARIA_VERSION_NUMBER) {
        std::printf("headers %s, library %.*s\n", TALARIA_VERSION_STRING,
                    int(talaria::version().string.size()), talaria::version().string.data());
        return 1;
    }
    for (auto scheme : talaria::na::transports_built()) {
        // ofi and ucx are families: name a provider / UCX transports.
        std::string addr = std::string(scheme);
        if (scheme == "ofi" || scheme == "ucx") addr += "+tcp";
        addr += "://";
        if (scheme != "inproc" && scheme != "sm") addr += "127.0.0.1:0";
        auto t = talaria::na::open(addr);
        if (!t) {
            std::printf("%.*s: %s\n", int(scheme.size()), scheme.data(),
                        t.error().describe().c_str());
            return 1;
        }
        std::printf("%.*s: %s\n", int(scheme.size()), scheme.data(),
                    (*t)->addr_to_string((*t)->addr_self()).c_str());
    }
    try {
        talaria::Engine server{"inproc://consumer-server", talaria::listen};
        server.define("sum", [](int a, int b) { return a + b; });
        talaria::Engine client{"inproc://consumer-client"};
        auto ep = client.lookup(server.self_address());
        int sum = client.remote<int(int, int)>("sum").on(ep)(40, 2).get();
        std::printf("rpc sum(40, 2) = %d\n", sum);
        return sum == 42 ? 0 : 1;
    } catch (const talaria::Exception& e) {
        std::printf("rpc failed: %s\n", e.what());
        return 1;
    }
}
