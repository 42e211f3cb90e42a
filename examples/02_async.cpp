// 02: asynchronous handlers and calls.
//
// The server answers "square" later, from a worker of a pool the application owns (the handler
// takes its Request by value and returns at once), and runs "slow" on that pool, so a slow
// computation never blocks the server's progress thread.
// The client keeps many calls in flight with futures and then() callbacks, and shows a deadline.
#include <talaria/talaria.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "example_util.hpp"

using namespace std::chrono_literals;

static int serve(const std::string& address) {
    talaria::Engine server{address, talaria::listen};
    // The application's own workers (after the engine: destroyed first, so every job they hold
    // answers while the engine still works; stop() runs the jobs queued, then joins).
    talaria::ThreadPool workers(2);

    // The handler runs on the progress thread and returns at once: it hands its Request to a
    // worker, which answers later.
    server.define("square", [&](talaria::Request req, long x) {
        workers.post([req = std::move(req), x]() mutable {
            req.respond(x * x);  // from a worker thread, after the handler returned
        });
    });
    // The same without the hand-off: the engine runs the handler on the workers.
    server.define(
        "slow",
        [](int ms) {
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            return ms;
        },
        workers);
    server.on_shutdown([&] { workers.stop(); });
    server.enable_remote_shutdown();
    example::announce(server.self_address());
    server.wait_for_shutdown();
    return 0;
}

static int client(const std::string& server_address) {
    talaria::Engine client{example::client_address_for(server_address)};
    auto server = client.lookup(server_address);
    auto square = client.remote<long(long)>("square").on(server);

    // 100 calls in flight at once; collect the results as they come.
    std::vector<talaria::Future<long>> calls;
    for (long i = 0; i < 100; ++i)
        calls.push_back(square(i));
    long total = 0;
    for (auto& f : calls)
        total += f.get();
    std::printf("sum of squares 0..99 = %ld\n", total);

    // A callback instead of waiting: it runs on the engine's progress thread.
    std::atomic<long> seen{-1};
    square(12).then([&](talaria::Result<long>&& r) { seen = r ? *r : -2; });
    for (int i = 0; i < 500 && seen == -1; ++i)
        std::this_thread::sleep_for(10ms);
    std::printf("then(): 12 * 12 = %ld\n", seen.load());

    // A deadline: the server takes 300 ms, the call allows 50 ms.
    bool timed_out = false;
    try {
        client.remote<int(int)>("slow").on(server).timeout(50ms)(300).get();
    } catch (const talaria::Exception& e) {
        timed_out = e.code() == talaria::Errc::timeout;
        std::printf("as expected: %s\n", e.what());
    }
    client.shutdown_remote(server).get();
    return total == 328350 && seen == 144 && timed_out ? 0 : 1;
}

int main(int argc, char** argv) {
    return example::run(argc, argv, "02_async", serve, client);
}
