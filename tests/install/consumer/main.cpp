// Opens every built transport by scheme and prints what it reports: proves that the installed
// headers, config header and libraries work for a downstream project.
#include <cstdio>
#include <string>

#include <talaria/config.hpp>
#include <talaria/na/na.hpp>

int main() {
    std::printf("talaria %s\n", TALARIA_VERSION);
    for (auto scheme : talaria::na::transports_built()) {
        std::string addr = std::string(scheme) + "://";
        if (scheme == "tcp") addr += "127.0.0.1:0";
        auto t = talaria::na::open(addr);
        if (!t) {
            std::printf("%.*s: %s\n", int(scheme.size()), scheme.data(),
                        t.error().describe().c_str());
            return 1;
        }
        std::printf("%.*s: %s\n", int(scheme.size()), scheme.data(),
                    (*t)->addr_to_string((*t)->addr_self()).c_str());
    }
    return 0;
}
