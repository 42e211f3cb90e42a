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
    try {
        std::string mode = argc > 1 ? argv[1] : "tcp://127.0.0.1:0";
        if (mode == "server") return serve(argc > 2 ? argv[2] : "tcp://127.0.0.1:0");
        if (mode == "client" && argc > 2) return client(argv[2]);
        example::ServerProcess server(argv[0], mode);  // the server half, in another process
        return client(server.address());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "01_hello: %s\n", e.what());
        return 1;
    }
}
