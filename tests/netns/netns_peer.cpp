// The process the netns tests run inside an emulated host (netns.hpp):
//   netns_peer serve ADDRESS          an Engine listening at ADDRESS, defining echo(string);
//                                     prints its address, serves until its stdin closes
//   netns_peer call CLIENT TARGET MS  an Engine at CLIENT (not listening) calls TARGET's echo
//                                     with a deadline of MS milliseconds; prints one line,
//                                     "ok <ms> <answer>" or "error <errc> <ms> <message>"
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "peer_process.hpp"
#include "talaria/talaria.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (!((mode == "serve" && argc == 3) || (mode == "call" && argc == 5))) {
        std::fprintf(stderr,
                     "usage: netns_peer serve ADDRESS | netns_peer call CLIENT TARGET MS\n");
        return 2;
    }
    ::alarm(60);  // never outlive a test run
    try {
        if (mode == "serve") {
            talaria::Engine server{argv[2], talaria::listen};
            server.define("echo", [](std::string s) { return s; });
            talaria::na::test::print_line(server.self_address());
            while (!talaria::na::test::stdin_closed())
                std::this_thread::sleep_for(20ms);
            return 0;
        }
        talaria::Engine client{argv[2]};
        const auto deadline = std::chrono::milliseconds(std::stol(argv[4]));
        const auto t0 = std::chrono::steady_clock::now();
        auto r = client.remote<std::string(std::string)>("echo")
                     .on(client.lookup(argv[3]))
                     .timeout(deadline)("across hosts")
                     .try_get();
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        std::string line = r ? "ok " + std::to_string(ms) + " " + *r
                             : "error " + std::string(talaria::errc_name(r.code())) + " " +
                                   std::to_string(ms) + " " + r.error().message();
        for (char& c : line)
            if (c == '\n') c = ' ';
        talaria::na::test::print_line(line);
        return 0;
    } catch (const std::exception& e) {
        talaria::na::test::print_line(std::string("exception ") + e.what());
        return 1;
    }
}
