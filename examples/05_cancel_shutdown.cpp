// 05: combining, canceling, and stopping a server cleanly.
//
// The server holds "wait" calls until a "release" arrives (as a lock service or a queue would),
// keeps a worker thread it stops from an on_shutdown callback, and lets a client shut it down.
// The client waits for several calls at once with when_all, takes the first of two with
// when_any, gives up on a call it no longer needs with cancel(), and stops the server with
// shutdown_remote.
#include <talaria/talaria.hpp>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "example_util.hpp"

using namespace std::chrono_literals;

static int serve(const std::string& address) {
    talaria::Engine server{address, talaria::listen};
    std::mutex mu;
    std::vector<talaria::Request> waiting;  // "wait" calls not answered yet
    server.define("wait", [&](talaria::Request req) {
        std::lock_guard g(mu);
        waiting.push_back(std::move(req));
    });
    server.define("release", [&](int value) {
        std::lock_guard g(mu);
        for (auto& r : waiting)
            r.respond(value);
        auto n = static_cast<int>(waiting.size());
        waiting.clear();
        return n;
    });
    server.define("square", [](int x) { return x * x; });
    // Runs on the thread that returns from wait_for_shutdown(), while the engine still works:
    // the calls still held are answered before the server goes.
    server.on_shutdown([&] {
        std::lock_guard g(mu);
        for (auto& r : waiting)
            r.respond_error(talaria::Errc::shutdown, "the server is stopping");
        waiting.clear();
        std::printf("server: shut down cleanly\n");
    });
    server.enable_remote_shutdown();
    example::announce(server.self_address());
    server.wait_for_shutdown();
    return 0;
}

static int client(const std::string& server_address) {
    talaria::Engine client{example::client_address_for(server_address)};
    auto server = client.lookup(server_address);
    auto square = client.remote<int(int)>("square").on(server);
    auto wait = client.remote<int()>("wait").on(server);

    // Several calls at once: every result, in order, each its own Result.
    std::vector<talaria::Future<int>> calls;
    for (int i = 1; i <= 4; ++i)
        calls.push_back(square(i));
    int sum = 0;
    for (auto& r : talaria::when_all(std::move(calls)).get())
        sum += r.value();
    std::printf("1 + 4 + 9 + 16 = %d\n", sum);

    // The first of two: "wait" is held by the server, "square" answers at once.
    std::vector<talaria::Future<int>> race;
    race.push_back(wait());
    race.push_back(square(7));
    auto [first, result] = talaria::when_any(std::move(race)).get();
    std::printf("when_any: call %zu answered first with %d\n", first, result.value());

    // A call we stop waiting for: it completes at once with canceled.
    auto held = wait();
    std::this_thread::sleep_for(50ms);  // let it reach the server (not needed to cancel)
    bool canceled = held.cancel();
    auto r = held.try_get();
    std::printf("cancel(): %s (%s)\n", canceled ? "canceled" : "already complete",
                r ? "answered" : r.error().describe().c_str());

    // Release what the server still holds (the answers to the calls above are dropped), then
    // stop it.
    int released = client.remote<int(int)>("release").on(server)(0).get();
    std::printf("released %d held calls\n", released);
    client.shutdown_remote(server).get();
    return sum == 30 && first == 1 && result.value() == 49 && canceled && !r &&
                   r.code() == talaria::Errc::canceled
               ? 0
               : 1;
}

int main(int argc, char** argv) {
    return example::run(argc, argv, "05_cancel_shutdown", serve, client);
}
