// 04: coroutines. Calls are awaitable: a coroutine co_awaits them one after another (each
// result feeding the next call), or starts several and awaits them together. The coroutine
// resumes on the engine's progress thread when a response arrives; no thread blocks per call.
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
    server.define("add", [](long a, long b) { return a + b; });
    server.define("fib", [](int n) {
        long a = 0, b = 1;
        for (int i = 0; i < n; ++i) {
            long next = a + b;
            a = b;
            b = next;
        }
        return a;
    });
    server.enable_remote_shutdown();  // a client may stop it (shutdown_remote)
    example::announce(server.self_address());
    server.wait_for_shutdown();
    return 0;
}

/// Sequential: 1 + 2 + ... + 10, one remote addition at a time.
static talaria::Task<long> sum_to_ten(talaria::Engine& client, talaria::Endpoint server) {
    auto add = client.remote<long(long, long)>("add").on(server).timeout(2s);
    long total = 0;
    for (long i = 1; i <= 10; ++i)
        total = co_await add(total, i);
    co_return total;
}

/// Concurrent: start 20 calls, then await them all.
static talaria::Task<long> fibs(talaria::Engine& client, talaria::Endpoint server) {
    auto fib = client.remote<long(int)>("fib").on(server);
    std::vector<talaria::Future<long>> pending;
    for (int n = 0; n < 20; ++n)
        pending.push_back(fib(n));
    long total = 0;
    for (auto& f : pending)
        total += co_await std::move(f);
    co_return total;
}

static talaria::Task<int> run(talaria::Engine& client, const std::string& address) {
    auto server = client.lookup(address);
    long s = co_await sum_to_ten(client, server);
    long f = co_await fibs(client, server);
    std::printf("1 + ... + 10 = %ld\nfib(0) + ... + fib(19) = %ld\n", s, f);
    co_await client.shutdown_remote(server);
    co_return s == 55 && f == 10945 ? 0 : 1;
}

static int client(const std::string& server_address) {
    talaria::Engine client{example::client_address_for(server_address)};
    return talaria::sync_wait(run(client, server_address));
}

int main(int argc, char** argv) {
    return example::run(argc, argv, "04_coroutines", serve, client);
}
