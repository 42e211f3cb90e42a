// The api suite's fixture: a server and a client engine of the transport under test, and
// bounded waits (a broken call fails the test after a few seconds, never hangs it).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

#include "harness.hpp"
#include "talaria/talaria.hpp"

namespace talaria::api_test {

using namespace std::chrono_literals;
using na::test::TransportKind;

inline constexpr Duration kWait = 10s;

/// The result of `f` within kWait, or a timeout error naming the wait (the test then fails
/// on its expectations instead of hanging).
template <class T>
Result<T> result_within(Future<T>&& f, Duration d = kWait) {
    if (!f.wait_for(d)) return Error(Errc::timeout, "the test gave up waiting for the future");
    return f.try_get();
}

/// The value of `f` within kWait (throws talaria::Exception otherwise, failing the test).
template <class T>
T value_within(Future<T>&& f, Duration d = kWait) {
    return detail::value_or_throw(result_within(std::move(f), d));
}

class Api : public ::testing::TestWithParam<TransportKind> {
  protected:
    /// A server (listening) and a client of the transport under test.
    void open(EngineOptions server_opts = {}, EngineOptions client_opts = {}) {
        server.emplace(GetParam().address, listen, server_opts);
        client.emplace(GetParam().address, client_opts);
        ep = client->lookup(server->self_address());
    }
    void SetUp() override {}
    void TearDown() override {
        ep = {};  // addresses go before their engine's transport
        client.reset();
        server.reset();
    }

    std::optional<Engine> server;
    std::optional<Engine> client;
    Endpoint ep;
};

inline std::string kind_name(const ::testing::TestParamInfo<TransportKind>& info) {
    return info.param.label;
}

}  // namespace talaria::api_test
