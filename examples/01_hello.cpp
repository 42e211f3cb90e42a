// 01: hello. Define procedures on a server, call them from a client, get the results.
//
// The server defines two procedures by name; the client looks the server up and calls them
// with futures. Arguments and results are any serializable C++ types (talaria/proc).
#include <talaria/talaria.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "example_util.hpp"

using namespace std::chrono_literals;

static int serve(const std::string& address) {
    talaria::Engine server{address, talaria::listen};
    server.define("hello", [](const std::string& name) { return "hello, " + name + "!"; });
    server.define("sum", [](int a, int b) { return a + b; });
    server.enable_remote_shutdown();  // a client may stop it (shutdown_remote)
    example::announce(server.self_address());
    server.wait_for_shutdown();
    return 0;
}

static int client(const std::string& server_address) {
    talaria::Engine client{example::client_address_for(server_address)};
    auto server = client.lookup(server_address);

    std::string greeting =
        client.remote<std::string(std::string)>("hello").on(server)("world").get();
    int sum = client.remote<int(int, int)>("sum").on(server)(40, 2).get();
    std::printf("%s\n40 + 2 = %d\n", greeting.c_str(), sum);

    // Calling a procedure the server does not have is an error that names it.
    try {
        client.remote<void()>("no-such-procedure").on(server)().get();
    } catch (const talaria::Exception& e) {
        std::printf("as expected: %s\n", e.what());
    }
    client.shutdown_remote(server).get();
    return greeting == "hello, world!" && sum == 42 ? 0 : 1;
}

int main(int argc, char** argv) {
    return example::run(argc, argv, "01_hello", serve, client);
}
