// talaria-info --attach against a live engine in this process (two processes: this test and
// talaria-info): it reads the server's statistics while a client loads it, and once the load
// stops the server's counts equal what the client made; health, in-flight, Prometheus and
// config answer; an engine without introspection is named with the remedy.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "talaria/talaria.hpp"

namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

struct Ran {
    int status = -1;
    std::string out;  ///< stdout and stderr
};

/// talaria-info with `args` (and `env`, "VAR=value ...", in its environment); its stdout and
/// stderr together, or stdout alone.
Ran info(const std::string& args, bool with_stderr = true, const std::string& env = "") {
    Ran r;
    const std::string cmd = (env.empty() ? "" : "env " + env + " ") +
                            std::string(TALARIA_INFO_PATH) + " " + args +
                            (with_stderr ? " 2>&1" : " 2>/dev/null");
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
        r.out.append(buf, n);
    const int w = ::pclose(p);
    r.status = WIFEXITED(w) ? WEXITSTATUS(w) : -1;
    return r;
}

const Json* proc(const Json& stats, const std::string& name) {
    for (const auto& p : stats["procedures"])
        if (p["name"] == name) return &p;
    return nullptr;
}

class Attach : public ::testing::TestWithParam<const char*> {};

TEST_P(Attach, ReadsTheServersStatisticsUnderLoadAndTheyMatchTheClients) {
    talaria::Engine server(GetParam(), talaria::listen);
    server.define("echo", [](std::string s) { return s; });
    server.enable_introspection();
    talaria::Engine client(GetParam());
    auto echo =
        client.remote<std::string(std::string)>("echo").on(client.lookup(server.self_address()));
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> made{0};
    std::thread load([&] {
        while (!stop.load()) {
            std::vector<talaria::Future<std::string>> batch;
            for (int i = 0; i < 8; ++i)
                batch.push_back(echo("x"));
            for (auto& f : batch)
                if (f.wait_for(10s) && f.try_get()) made.fetch_add(1);
        }
    });
    while (made.load() < 100)
        std::this_thread::sleep_for(1ms);

    // While it serves: valid JSON, the procedure counted.
    Ran live = info("--attach " + server.self_address() + " --json");
    ASSERT_EQ(live.status, 0) << live.out;
    Json j = Json::parse(live.out);
    const Json* e = proc(j, "echo");
    ASSERT_NE(e, nullptr) << live.out;
    EXPECT_GT((*e)["server"]["calls"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["address"], server.self_address());

    // The table, refreshed twice (--watch --count).
    Ran table = info("--attach " + server.self_address() + " --watch 0.1 --count 2");
    ASSERT_EQ(table.status, 0) << table.out;
    EXPECT_NE(table.out.find("echo"), std::string::npos) << table.out;
    EXPECT_NE(table.out.find("server"), std::string::npos) << table.out;
    EXPECT_NE(table.out.find("p99"), std::string::npos) << table.out;

    stop = true;
    load.join();
    // After the load: the server's counts are the client's, exactly.
    const auto mine = client.stats();
    uint64_t calls = 0, ok = 0;
    for (const auto& p : mine)
        if (p.name == "echo") calls = p.client.calls, ok = p.client.ok;
    EXPECT_EQ(ok, made.load());
    Ran after = info("--attach " + server.self_address() + " --json");
    ASSERT_EQ(after.status, 0) << after.out;
    Json k = Json::parse(after.out);
    const Json* f = proc(k, "echo");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ((*f)["server"]["calls"].get<uint64_t>(), calls);
    EXPECT_EQ((*f)["server"]["ok"].get<uint64_t>(), ok);
    EXPECT_EQ((*f)["server"]["bytes_in"].get<uint64_t>(), mine.empty() ? 0 : [&] {
        for (const auto& p : mine)
            if (p.name == "echo") return p.client.bytes_out;
        return uint64_t{0};
    }());
    // The introspection calls are counted too: talaria.stats itself is a procedure.
    EXPECT_NE(proc(k, "talaria.stats"), nullptr);
}

TEST_P(Attach, HealthInFlightPrometheusAndConfigAnswer) {
    talaria::Engine server(GetParam(), talaria::listen);
    server.enable_introspection();
    const std::string at = "--attach " + server.self_address();
    Ran h = info(at + " --what health --json");
    ASSERT_EQ(h.status, 0) << h.out;
    Json hj = Json::parse(h.out);
    EXPECT_EQ(hj["status"], "serving");
    EXPECT_TRUE(hj["uptime_ms"].is_number_unsigned());
    server.shutdown();
    EXPECT_EQ(Json::parse(info(at + " --what health --json").out)["status"], "shutting_down");
    Ran f = info(at + " --what in-flight");
    ASSERT_EQ(f.status, 0) << f.out;
    EXPECT_NE(f.out.find("requests held"), std::string::npos) << f.out;
    Ran p = info(at + " --what prometheus");
    ASSERT_EQ(p.status, 0) << p.out;
    EXPECT_NE(p.out.find("# TYPE talaria_rpc_server_calls_total counter"), std::string::npos)
        << p.out;
    Ran c = info(at + " --what config --json");
    ASSERT_EQ(c.status, 0) << c.out;
    EXPECT_EQ(Json::parse(c.out)["listen"], true);
}

TEST_P(Attach, AnEngineWithoutIntrospectionIsNamedWithTheRemedy) {
    talaria::Engine server(GetParam(), talaria::listen);
    Ran r = info("--attach " + server.self_address());
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("not_found"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("enable_introspection()"), std::string::npos) << r.out;
}

TEST(AttachArgs, AnAddressThatIsNotOneIsRefusedWithTheForms) {
    Ran r = info("--attach localhost:4000");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("tcp://HOST:PORT"), std::string::npos) << r.out;
}

// Issue 12: --json is valid JSON whatever the transports print (UCX at debug level writes from
// the moment it loads), with yes/no as booleans, counts as numbers, and error text whole.
TEST(InfoJson, ValidAndTypedWhileUcxPrintsDiagnostics) {
    Ran r = info("--json", false);
    Ran noisy = info("--json", false, "UCX_LOG_LEVEL=debug UCX_NET_DEVICES=bogus0");
    for (const Ran* x : {&r, &noisy}) {
        ASSERT_EQ(x->status, 0) << x->out;
        Json j;
        ASSERT_NO_THROW(j = Json::parse(x->out)) << x->out.substr(0, 2000);
        ASSERT_TRUE(j["transports"]["rows"].is_array());
        bool some_open = false;
        for (const auto& row : j["transports"]["rows"]) {
            EXPECT_TRUE(row["here"].is_boolean()) << row.dump();
            if (row["here"] == true) {
                some_open = true;
                EXPECT_TRUE(row["max_unexpected"].is_number_unsigned()) << row.dump();
            } else {
                EXPECT_TRUE(row["max_unexpected"].is_null()) << row.dump();
                ASSERT_TRUE(row["error"].is_string()) << row.dump();
                const auto e = row["error"].get<std::string>();
                EXPECT_FALSE(e.size() >= 3 && e.compare(e.size() - 3, 3, "...") == 0)
                    << "error text whole: " << row.dump();
            }
        }
        EXPECT_TRUE(some_open);
    }
}

// -c: every environment variable and configuration key, each with a default and a meaning.
TEST(InfoVariables, EveryKeyHasItsDefaultAndMeaning) {
    Ran r = info("-c --json", false);
    ASSERT_EQ(r.status, 0) << r.out;
    Json j = Json::parse(r.out);
    const Json& v = j["variables"];
    for (const auto& n : v["notes"])
        EXPECT_EQ(n.get<std::string>().find("no description"), std::string::npos) << n;
    std::map<std::string, Json> rows;
    for (const auto& row : v["rows"]) {
        EXPECT_TRUE(row["meaning"].is_string()) << row.dump();
        rows[row["name"].get<std::string>()] = row;
    }
    for (const char* name : {"TALARIA_LOG", "TALARIA_LOG_FILE", "TALARIA_PLUGIN_DIR", "core.stats",
                             "core.max_inflight", "na.auth.protect", "contexts"})
        EXPECT_TRUE(rows.count(name)) << name;
    EXPECT_EQ(rows["core.stats"]["default"], true);
    EXPECT_EQ(rows["core.max_inflight"]["default"], 4096);
    Ran table = info("-c");
    EXPECT_NE(table.out.find("TALARIA_LOG"), std::string::npos) << table.out;
}

// --doctor: the host's checks, and a port that answers or refuses (exit 1 on a failed check).
TEST(InfoDoctor, ChecksTheHostAndWhetherAPortAnswers) {
    talaria::Engine server("tcp://127.0.0.1:0", talaria::listen);
    Ran ok = info("--doctor " + server.self_address() + " --json", false);
    Json j = Json::parse(ok.out);
    std::map<std::string, Json> rows;
    for (const auto& row : j["doctor"]["rows"])
        rows[row["check"].get<std::string>()] = row;
    for (const char* c : {"transports", "ptrace scope", "/dev/shm", "locked memory", "address"})
        ASSERT_TRUE(rows.count(c)) << c << " in " << ok.out;
    EXPECT_EQ(rows["address"]["status"], "ok") << rows["address"].dump();
    EXPECT_NE(rows["address"]["detail"].get<std::string>().find("accepts TCP connections"),
              std::string::npos);
    for (const auto& [name, row] : rows)
        EXPECT_TRUE(row["status"] == "ok" || row["status"] == "warn" || row["status"] == "fail")
            << row.dump();
    // A port nothing listens on: refused, named, with the remedy; exit status 1.
    std::string closed = server.self_address();
    { talaria::Engine gone(std::move(server)); }
    Ran refused = info("--doctor " + closed);
    EXPECT_EQ(refused.status, 1) << refused.out;
    EXPECT_NE(refused.out.find("ECONNREFUSED"), std::string::npos) << refused.out;
    EXPECT_NE(refused.out.find("is the server running"), std::string::npos) << refused.out;
}

// A port whose SYNs go unanswered is "filtered" (what a dropping firewall looks like): a
// listener whose accept queue is full drops them, here without a firewall.
TEST(InfoDoctor, APortThatDropsConnectionsIsCalledFiltered) {
    const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(l, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(l, 0), 0);  // an accept queue of one, never accepted from
    socklen_t len = sizeof a;
    ASSERT_EQ(::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
    std::vector<int> fill;
    for (int i = 0; i < 4; ++i) {  // fill the queue; later SYNs are dropped
        const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        ASSERT_GE(c, 0);
        (void)::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
        fill.push_back(c);
    }
    std::this_thread::sleep_for(100ms);
    Ran dropped = info(fmt::format("--doctor tcp://127.0.0.1:{}", ntohs(a.sin_port)));
    for (int c : fill)
        ::close(c);
    ::close(l);
    EXPECT_EQ(dropped.status, 1) << dropped.out;
    EXPECT_NE(dropped.out.find("filtered"), std::string::npos) << dropped.out;
    EXPECT_NE(dropped.out.find("open the port in the firewall"), std::string::npos) << dropped.out;
}

// The probes are quiet: no tuning advice (FI_OFI_RXM_*: a doctor check) and no UCX warnings
// before the tables; JSON keys have no spaces; long cells (an error, a meaning) wrap, whole.
TEST(InfoQuiet, ProbesPrintTablesOnlyAndCutNothing) {
    Ran r = info("", true, "-u FI_OFI_RXM_ENABLE_DYN_RBUF -u FI_OFI_RXM_CM_PROGRESS_INTERVAL");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.find("FI_OFI_RXM"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("UCX  "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(" warn "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.rfind("Talaria ", 0), 0u) << "the first line is ours: " << r.out;
    Ran v = info("-c");
    Ran j = info("--json -c", false);
    Json all = Json::parse(j.out);
    Ran t = info("--json", false);
    Json tables = Json::parse(t.out);
    // Every word of every error and meaning (whole in the JSON) is in the tables: wrapped, not
    // cut.
    auto whole = [](const Json& doc, const char* column, const std::string& text) {
        for (const auto& [key, section] : doc.items()) {
            if (!section.is_object()) continue;
            for (const auto& row : section["rows"]) {
                if (!row.contains(column) || !row[column].is_string()) continue;
                std::istringstream words(row[column].get<std::string>());
                for (std::string w; words >> w;)
                    EXPECT_NE(text.find(w), std::string::npos) << column << ": " << w;
            }
        }
    };
    whole(tables, "error", r.out);
    whole(all, "meaning", v.out);
    for (const Json* doc : {&all, &tables})
        for (const auto& [key, section] : doc->items()) {
            if (!section.is_object()) continue;
            for (const auto& row : section["rows"])
                for (const auto& [column, value] : row.items())
                    EXPECT_EQ(column.find(' '), std::string::npos) << key << ": " << column;
        }
}

// --doctor says what to set for libfabric's rxm when the environment lacks it.
TEST(InfoDoctor, TuningAdviceIsACheck) {
    if (!talaria::na::recommended_env().size()) GTEST_SKIP() << "ofi is not built";
    Ran r = info("--doctor --json", false,
                 "-u FI_OFI_RXM_ENABLE_DYN_RBUF -u FI_OFI_RXM_CM_PROGRESS_INTERVAL");
    Json j = Json::parse(r.out);
    bool found = false;
    for (const auto& row : j["doctor"]["rows"])
        if (row["check"] == "libfabric tuning") {
            found = true;
            EXPECT_EQ(row["status"], "warn") << row.dump();
            EXPECT_NE(row["remedy"].get<std::string>().find("FI_OFI_RXM_ENABLE_DYN_RBUF=0"),
                      std::string::npos)
                << row.dump();
        }
    EXPECT_TRUE(found) << r.out;
}

// --doctor sm://NAME reaches the name as the library does: a live engine answers; a name
// nobody holds fails, naming it.
TEST(InfoDoctor, AnSmNameIsCheckedAsTheLibraryConnects) {
    const std::string name = "sm://doctor-" + std::to_string(::getpid());
    talaria::Engine server(name, talaria::listen);
    Ran ok = info("--doctor " + name);
    EXPECT_NE(ok.out.find("a live engine answers on its socket"), std::string::npos) << ok.out;
    Ran none = info("--doctor sm://nobody-" + std::to_string(::getpid()));
    EXPECT_EQ(none.status, 1) << none.out;
    EXPECT_NE(none.out.find("no sm endpoint"), std::string::npos) << none.out;
}

// --attach to an engine that asks for a secret says how to give talaria-info one.
TEST(InfoAttach, ASecretServiceNamesClientConfig) {
    talaria::EngineOptions o;
    o.core.na.auth.key_id = "svc";
    o.core.na.auth.secret.assign(32, std::byte{'s'});
    talaria::Engine server("tcp://127.0.0.1:0", talaria::listen, o);
    server.enable_introspection();
    Ran r = info("--attach " + server.self_address());
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("--client-config"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(info, Attach, ::testing::Values("tcp://127.0.0.1:0", "sm://"),
                         [](const auto& i) { return std::string(i.index == 0 ? "tcp" : "sm"); });

}  // namespace
