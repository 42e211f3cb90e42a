// 06: a service with several instances on one server, and handlers that know their caller.
//
// The server runs two instances of a key-value store, each a talaria::Provider under its own
// provider id, and a "scan" procedure that works in steps on the engine's handler pool and stops
// as soon as its caller stops waiting (its deadline passed, or it canceled the call):
// Request::cancelled(). A handler that blocks its context's thread instead stalls that context,
// and still sees the deadline but not a cancel, which arrives on that thread. The client
// writes to each instance, asks for a scan with a short deadline, and calls a procedure with the
// wrong types, which the server refuses, naming the types it has.
#include <talaria/talaria.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "example_util.hpp"

using namespace std::chrono_literals;

namespace {

class KvStore : public talaria::Provider {
  public:
    KvStore(talaria::Engine& e, uint16_t id) : Provider(e, id) {
        define("kv.put", &KvStore::put);
        define("kv.get", &KvStore::get);
        define("kv.size", &KvStore::size);
    }
    ~KvStore() override { undefine_all(); }  // before data_ goes

  private:
    void put(std::string key, std::string value) {
        std::lock_guard g(mu_);
        data_[std::move(key)] = std::move(value);
    }
    std::string get(std::string key) const {
        std::lock_guard g(mu_);
        auto it = data_.find(key);
        return it == data_.end() ? std::string() : it->second;
    }
    uint64_t size() const {
        std::lock_guard g(mu_);
        return data_.size();
    }
    mutable std::mutex mu_;
    std::map<std::string, std::string> data_;
};

}  // namespace

static int serve(const std::string& address) {
    talaria::Engine server{address, talaria::listen};
    KvStore hot(server, 1), cold(server, 2);
    std::atomic<int> scans_stopped{0};
    // A long job in steps, run on the engine's handler pool so that the context's thread stays
    // free (to serve other calls, and to hear of a cancel): between steps it checks whether its
    // caller still waits.
    server.define(
        "scan",
        [&](const talaria::Request& req, int steps) {
            int done = 0;
            for (; done < steps && !req.cancelled(); ++done)
                std::this_thread::sleep_for(10ms);
            if (done < steps) ++scans_stopped;
            return done;  // dropped by a caller that gave up
        },
        server.handler_pool());
    server.define("scans_stopped", [&] { return scans_stopped.load(); });
    server.define("add", [](int a, int b) { return a + b; });
    server.enable_remote_shutdown();
    example::announce(server.self_address());
    server.wait_for_shutdown();
    return 0;
}

static int client(const std::string& server_address) {
    talaria::Engine client{example::client_address_for(server_address)};
    auto server = client.lookup(server_address);
    auto put = client.remote<void(std::string, std::string)>("kv.put").on(server);
    auto get = client.remote<std::string(std::string)>("kv.get").on(server);

    // The same procedure names, two instances: provider 1 and provider 2.
    put.provider(1)("colour", "red").get();
    put.provider(2)("colour", "blue").get();
    std::string one = get.provider(1)("colour").get();
    std::string two = get.provider(2)("colour").get();
    std::printf("provider 1 has colour=%s, provider 2 has colour=%s\n", one.c_str(), two.c_str());

    // A scan of 500 steps (5 s) with a 100 ms deadline: the server sees the deadline and stops.
    auto scan = client.remote<int(int)>("scan").on(server);
    auto late = scan.timeout(100ms)(500).try_get();
    std::printf("scan with a 100 ms deadline: %s\n",
                late ? "finished" : late.error().describe().c_str());
    // The same, canceled by the client after 100 ms: the server hears of it and stops too.
    auto f = scan(500);
    std::this_thread::sleep_for(100ms);
    f.cancel();
    // Both scans stopped early on the server (it may take a step to notice).
    int stopped = 0;
    for (int i = 0; i < 200 && stopped < 2; ++i) {
        stopped = client.remote<int()>("scans_stopped").on(server)().get();
        if (stopped < 2) std::this_thread::sleep_for(10ms);
    }
    std::printf("the server stopped %d scans early\n", stopped);

    // The wrong types: refused by the server before its handler runs.
    auto wrong = client.remote<float(float, float)>("add").on(server)(1.5f, 2.5f).try_get();
    std::printf("float(float, float) against int(int, int): %s\n",
                wrong ? "answered?!" : wrong.error().describe().c_str());
    int right = client.remote<int(int, int)>("add").on(server)(2, 3).get();

    client.shutdown_remote(server).get();
    return one == "red" && two == "blue" && !late && late.code() == talaria::Errc::timeout &&
                   stopped == 2 && !wrong && wrong.code() == talaria::Errc::invalid_argument &&
                   right == 5
               ? 0
               : 1;
}

int main(int argc, char** argv) {
    return example::run(argc, argv, "06_providers", serve, client);
}
