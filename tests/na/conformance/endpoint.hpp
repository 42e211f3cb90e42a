// An open transport with context 0, for the transport-specific tests that look at the private
// transport class behind na::Transport (its live_addrs(), ...).
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "talaria/na/na.hpp"

namespace talaria::na::test {

/// na::open(address, o) and context 0; `impl` is the transport as its class T (a test failure,
/// and null, if it is not a T or the open failed).
template <class T>
struct TransportEndpoint {
    std::unique_ptr<Transport> t;
    std::unique_ptr<Context> ctx;
    T* impl = nullptr;

    explicit TransportEndpoint(const std::string& address, Options o = {}) {
        auto r = open(address, o);
        EXPECT_TRUE(r) << r.error().describe();
        if (!r) return;
        t = std::move(*r);
        impl = dynamic_cast<T*>(t.get());
        EXPECT_NE(impl, nullptr) << address << " did not open the expected transport class";
        auto c = t->context_create(0);
        EXPECT_TRUE(c) << c.error().describe();
        if (c) ctx = std::move(*c);
    }
    TransportEndpoint(const TransportEndpoint&) = delete;
    TransportEndpoint& operator=(const TransportEndpoint&) = delete;
    ~TransportEndpoint() {
        ctx.reset();  // contexts before their transport
        t.reset();
    }

    [[nodiscard]] std::string self() const { return t->addr_to_string(t->addr_self()); }
};

}  // namespace talaria::na::test
