// EngineConfig and Engine::config_json (talaria/api/config.hpp): every key read and written
// back, defaults, the errors of a bad document (each names the key), and a running engine's
// configuration read back into a second engine that serves.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "talaria/talaria.hpp"

namespace talaria {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

/// The message of the error `text` gets from EngineConfig::parse (which must fail).
std::string refusal(std::string_view text) {
    auto c = EngineConfig::parse(text);
    EXPECT_FALSE(c) << text;
    if (c) return "";
    EXPECT_EQ(c.error().code(), Errc::invalid_argument) << c.error().describe();
    return c.error().describe();
}

TEST(Config, DefaultsAreTheStructsDefaults) {
    EngineConfig c = EngineConfig::from_json("{}");
    EngineOptions d;
    EXPECT_EQ(c.address, "");
    EXPECT_FALSE(c.listen);
    EXPECT_EQ(c.options.contexts, d.contexts);
    EXPECT_EQ(c.options.handler_threads, d.handler_threads);
    EXPECT_EQ(c.options.core.recv_depth, d.core.recv_depth);
    EXPECT_EQ(c.options.core.ack_linger, d.core.ack_linger);
    EXPECT_EQ(c.options.core.na.max_ops, d.core.na.max_ops);
    EXPECT_EQ(c.options.core.na.sm_group, d.core.na.sm_group);
    // The dump of the defaults names every key, and reads back to itself.
    auto dumped = EngineConfig{}.to_json();
    EXPECT_EQ(EngineConfig::from_json(dumped).to_json(), dumped);
    auto doc = json::parse(dumped);
    EXPECT_EQ(doc["core"]["ack_linger_ms"], 60000);
    EXPECT_EQ(doc["na"]["hello_timeout_ms"], 10000);
    EXPECT_EQ(doc["na"]["auth"]["secret"], "none");
}

TEST(Config, EveryKeyIsReadAndWrittenBack) {
    const char* text = R"({
      "address": "tcp://127.0.0.1:0", "listen": true,
      "progress": "manual", "wait": "busy", "contexts": 3, "checksum": true,
      "default_timeout_ms": 2.5, "handler_threads": 7,
      "core": { "recv_depth": 32, "max_inflight": 100, "ack_linger_ms": 1500, "eager_limit": 1024,
                "max_payload": 65536, "large_budget": 131072, "pull_timeout_ms": 999,
                "max_requests": 200, "max_requests_per_peer": 50, "peer_window": 8,
                "busy_retry_after_ms": 3, "stats": false, "stats_timing_gap_ms": 0.005 },
      "na": { "thread_safe": false, "max_ops": 512, "max_contexts": 9, "hello_timeout_ms": 250,
              "sm_group": 1234, "auth": { "key_id": "svc", "protect": "integrity" } }
    })";
    EngineConfig c = EngineConfig::from_json(text);
    const auto& o = c.options;
    EXPECT_EQ(c.address, "tcp://127.0.0.1:0");
    EXPECT_TRUE(c.listen);
    EXPECT_EQ(o.progress, ProgressMode::manual);
    EXPECT_EQ(o.wait, WaitMode::busy);
    EXPECT_EQ(o.contexts, 3);
    EXPECT_TRUE(o.checksum);
    EXPECT_EQ(o.default_timeout, 2500us);
    EXPECT_EQ(o.handler_threads, 7u);
    EXPECT_EQ(o.core.recv_depth, 32u);
    EXPECT_EQ(o.core.max_inflight, 100u);
    EXPECT_EQ(o.core.ack_linger, 1500ms);
    EXPECT_EQ(o.core.eager_limit, 1024u);
    EXPECT_EQ(o.core.max_payload, 65536u);
    EXPECT_EQ(o.core.large_budget, 131072u);
    EXPECT_EQ(o.core.pull_timeout, 999ms);
    EXPECT_EQ(o.core.max_requests, 200u);
    EXPECT_EQ(o.core.max_requests_per_peer, 50u);
    EXPECT_EQ(o.core.peer_window, 8u);
    EXPECT_EQ(o.core.busy_retry_after, 3ms);
    EXPECT_FALSE(o.core.stats);
    EXPECT_EQ(o.core.stats_timing_gap, 5us);
    EXPECT_FALSE(o.core.na.thread_safe);
    EXPECT_EQ(o.core.na.max_ops, 512u);
    EXPECT_EQ(o.core.na.max_contexts, 9);
    EXPECT_EQ(o.core.na.hello_timeout, 250ms);
    EXPECT_EQ(o.core.na.sm_group, 1234);
    EXPECT_EQ(o.core.na.auth.key_id, "svc");
    EXPECT_EQ(o.core.na.auth.protect, na::Protect::integrity);
    // Written back key for key: the dump equals the input, as JSON values.
    auto back = json::parse(c.to_json());
    auto in = json::parse(text);
    in["na"]["auth"]["secret_file"] = "";
    in["na"]["auth"]["secret"] = "none";
    EXPECT_EQ(back, in) << c.to_json();
    EXPECT_EQ(c.to_json(-1).find('\n'), std::string::npos);
}

TEST(Config, ErrorsNameTheKeyWhatItMustBeAndWhatItWas) {
    EXPECT_NE(refusal(R"({"core": {"recv_depht": 16}})")
                  .find("core.recv_depht: unknown key (known in core: recv_depth, "),
              std::string::npos);
    EXPECT_NE(refusal(R"({"contexts": 300})")
                  .find("contexts: must be an unsigned integer (at most 255), not 300"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"core": {"recv_depth": "16"}})")
                  .find("core.recv_depth: must be an unsigned integer (at most 4294967295), not "
                        "\"16\""),
              std::string::npos);
    EXPECT_NE(refusal(R"({"core": {"max_inflight": -1}})").find("core.max_inflight: must be"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"wait": "spin"})").find("wait: must be one of \"block\", \"busy\""),
              std::string::npos);
    EXPECT_NE(refusal(R"({"listen": 1})").find("listen: must be true or false, not 1"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"na": {"hello_timeout_ms": -5}})")
                  .find("na.hello_timeout_ms: must be a number of milliseconds"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"na": {"auth": {"protect": "tls"}}})")
                  .find("na.auth.protect: must be one of \"none\", \"integrity\", "
                        "\"encryption\""),
              std::string::npos);
    EXPECT_NE(refusal(R"({"na": []})").find("na: must be an object, not []"), std::string::npos);
    EXPECT_NE(refusal("[1, 2]").find("must be a JSON object, not array"), std::string::npos);
    EXPECT_NE(refusal(R"({"na": {"sm_group": 18446744073709551615}})")
                  .find("na.sm_group: must be an integer (of 64 bits)"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"core": {"ack_linger_ms": 4e12}})")
                  .find("core.ack_linger_ms: must be a number of milliseconds, from 0 to 100 "
                        "years"),
              std::string::npos);
    // A syntax error: where, by the parser's account.
    auto syntax = refusal("{\"contexts\": 2,\n \"wait\" \"busy\"}");
    EXPECT_NE(syntax.find("not valid JSON"), std::string::npos) << syntax;
    EXPECT_NE(syntax.find("line 2"), std::string::npos) << syntax;
    // A dump says a secret is set; without the file it came from, it cannot be read back.
    EXPECT_NE(refusal(R"({"na": {"auth": {"key_id": "k", "secret": "set"}}})")
                  .find("no na.auth.secret_file names the file"),
              std::string::npos);
    // from_json throws what parse returns.
    try {
        (void)EngineConfig::from_json(R"({"contexts": 0.5})");
        ADD_FAILURE() << "no exception";
    } catch (const Exception& e) {
        EXPECT_EQ(e.code(), Errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("contexts: must be an unsigned integer"),
                  std::string::npos);
    }
}

TEST(Config, DurationsReadBackToTheNanosecond) {
    EngineConfig c;
    c.options.default_timeout = std::chrono::nanoseconds(1'000'001);
    c.options.core.ack_linger = std::chrono::nanoseconds(2'999'999'999);
    c.options.core.busy_retry_after = std::chrono::nanoseconds(7);
    auto back = EngineConfig::from_json(c.to_json());
    EXPECT_EQ(back.options.default_timeout, c.options.default_timeout);
    EXPECT_EQ(back.options.core.ack_linger, c.options.core.ack_linger);
    EXPECT_EQ(back.options.core.busy_retry_after, c.options.core.busy_retry_after);
    EXPECT_EQ(
        EngineConfig::from_json(R"({"default_timeout_ms": 1.000001})").options.default_timeout,
        std::chrono::nanoseconds(1'000'001));
}

TEST(Config, ASecretIsReadFromItsFileAndNeverDumped) {
    char path[] = "/tmp/talaria-config-secret-XXXXXX";
    int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    const std::string secret = "0123456789abcdef-config-test";
    ASSERT_EQ(::write(fd, secret.data(), secret.size()), ssize_t(secret.size()));
    ::close(fd);
    ASSERT_EQ(::chmod(path, 0600), 0);
    auto c = EngineConfig::from_json(
        fmt::format(R"({{"na": {{"auth": {{"key_id": "k1", "secret_file": "{}"}}}}}})", path));
    EXPECT_EQ(c.secret_file, path);
    EXPECT_EQ(c.options.core.na.auth.secret.size(), secret.size());
    auto dumped = c.to_json();
    EXPECT_EQ(dumped.find("0123456789abcdef"), std::string::npos) << dumped;
    auto doc = json::parse(dumped);
    EXPECT_EQ(doc["na"]["auth"]["secret"], "set");
    EXPECT_EQ(doc["na"]["auth"]["secret_file"], path);
    EXPECT_EQ(EngineConfig::from_json(dumped).options.core.na.auth.secret,
              c.options.core.na.auth.secret);
    // A file others may read is refused as read_secret_file refuses it.
    ASSERT_EQ(::chmod(path, 0644), 0);
    auto bad = EngineConfig::parse(
        fmt::format(R"({{"na": {{"auth": {{"key_id": "k1", "secret_file": "{}"}}}}}})", path));
    EXPECT_FALSE(bad);
    if (!bad) {
        EXPECT_EQ(bad.error().code(), Errc::permission_denied) << bad.error().describe();
    }
    ::unlink(path);
}

class ConfigEngine : public ::testing::TestWithParam<const char*> {};

TEST_P(ConfigEngine, ARunningEnginesConfigurationOpensAnotherThatServes) {
    auto server_config = EngineConfig::from_json(fmt::format(
        R"({{"address": "{}", "listen": true, "contexts": 2, "handler_threads": 3,
            "core": {{"max_requests": 999}}}})",
        GetParam()));
    Engine server(server_config);
    server.define("sum", [](int a, int b) { return a + b; });
    server.set_wait_mode(WaitMode::busy);
    auto doc = json::parse(server.config_json());
    EXPECT_EQ(doc["address"], server.self_address());
    EXPECT_EQ(doc["listen"], true);
    EXPECT_EQ(doc["contexts"], 2);
    EXPECT_EQ(doc["handler_threads"], 3);
    EXPECT_EQ(doc["wait"], "busy");  // as it is now
    EXPECT_EQ(doc["core"]["max_requests"], 999);

    // The client's configuration: the server's, as a client of the same transport.
    auto client_doc = doc;
    client_doc["listen"] = false;
    client_doc["address"] = std::string(GetParam());
    client_doc["wait"] = "block";
    Engine client(EngineConfig::from_json(client_doc.dump()));
    EXPECT_EQ(json::parse(client.config_json())["listen"], false);
    auto ep = client.lookup(server.self_address());
    EXPECT_EQ(client.remote<int(int, int)>("sum").on(ep)(40, 2).get(), 42);
}

INSTANTIATE_TEST_SUITE_P(Transports, ConfigEngine, ::testing::Values("tcp://127.0.0.1:0", "sm://"),
                         [](const auto& param_info) {
                             return std::string(param_info.param).substr(0, 2) == "sm" ? "sm"
                                                                                       : "tcp";
                         });

}  // namespace
}  // namespace talaria
