// 03: send a file with a bulk transfer (the classic Mercury example).
//
// The client exposes the file's bytes read-only and calls "save" with the file's name and the
// bulk handle. The server's handler pulls the bytes straight from the client's memory (one-sided:
// the client's CPU does nothing meanwhile), writes them to a file of its own, and answers with a
// checksum that the client compares with its own.
#include <talaria/talaria.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "example_util.hpp"
#include "talaria/util/crc32c.hpp"

using namespace std::chrono_literals;
namespace fs = std::filesystem;

static int serve(const std::string& address) {
    talaria::Engine server{address, talaria::listen};
    fs::path dir = fs::temp_directory_path() / ("talaria-example-" + std::to_string(::getpid()));
    fs::create_directories(dir);

    server.define("save", [&](const talaria::Request& req, std::string name, talaria::Bulk data) {
        std::vector<std::byte> buf(data.size());
        auto local = server.expose(talaria::Segment{buf.data(), buf.size()}, talaria::write_only);
        req.pull(data, 0, local, 0, data.size()).get();  // from the caller's memory
        fs::path out = dir / fs::path(name).filename();
        std::ofstream(out, std::ios::binary)
            .write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
        std::printf("server: saved %zu bytes to %s\n", buf.size(), out.c_str());
        std::fflush(stdout);
        return talaria::crc32c(0, buf.data(), buf.size());
    });
    server.enable_remote_shutdown();  // a client may stop it (shutdown_remote)
    example::announce(server.self_address());
    server.wait_for_shutdown();
    fs::remove_all(dir);
    return 0;
}

static int client(const std::string& server_address, const std::string& path) {
    // The file to send: the one named, or 8 MiB of random bytes.
    std::vector<std::byte> bytes;
    std::string name = path;
    if (!path.empty()) {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw std::runtime_error("cannot read " + path);
        bytes.resize(fs::file_size(path));
        in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
    } else {
        name = "random.bin";
        bytes.resize(8 << 20);
        std::mt19937_64 rng(42);
        for (auto& b : bytes)
            b = std::byte(rng());
    }

    talaria::Engine client{example::client_address_for(server_address)};
    auto server = client.lookup(server_address);
    auto exposed = client.expose(talaria::Segment{bytes.data(), bytes.size()}, talaria::read_only);
    auto save = client.remote<uint32_t(std::string, talaria::Bulk)>("save").on(server);
    auto t0 = std::chrono::steady_clock::now();
    uint32_t crc = save(name, exposed).get();
    auto dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint32_t mine = talaria::crc32c(0, bytes.data(), bytes.size());
    std::printf("client: sent %s (%zu bytes) in %.1f ms; checksum %08x, server's %08x: %s\n",
                name.c_str(), bytes.size(), dt * 1e3, mine, crc, mine == crc ? "ok" : "MISMATCH");
    client.shutdown_remote(server).get();
    return mine == crc ? 0 : 1;
}

int main(int argc, char** argv) {
    return example::run(argc, argv, "03_bulk_file", serve, client);
}
