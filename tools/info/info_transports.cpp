// The transports section: every transport built in, opened once here with its usual address.
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "info.hpp"
#include "talaria/na/na.hpp"

namespace talaria::info {

namespace {

struct Probe {
    std::string_view family;  ///< na::transports_built() entry
    std::string_view address;
    std::string_view what;
};

// The address strings docs/transports.md recommends, per built transport.
constexpr Probe kProbes[] = {
    {"inproc", "inproc://", "within one process (tests, fault injection)"},
    {"sm", "sm://", "shared memory between processes of one host, single-copy RMA"},
    {"tcp", "tcp://127.0.0.1:0", "TCP sockets (IPv4/IPv6), RMA served by the target"},
    {"ofi", "ofi+tcp://127.0.0.1:0", "libfabric tcp provider"},
    {"ofi", "ofi+shm://", "libfabric shm provider (one host)"},
    {"ofi", "ofi+verbs://", "libfabric verbs;ofi_rxm (InfiniBand, RoCE, iWARP)"},
    {"ucx", "ucx+tcp://127.0.0.1:0", "UCX over TCP"},
    {"ucx", "ucx+sm://", "UCX shared memory (posix, sysv, cma, self)"},
    {"ucx", "ucx+all://", "UCX chooses among every transport it has"},
    {"ucx", "ucx+rc://", "UCX reliable connected (InfiniBand, RoCE)"},
};

}  // namespace

Section transports_section() {
    Section s;
    s.key = "transports";
    s.title = "Transports built into Talaria (each opened here once)";
    for (auto family : na::transports_built()) {
        bool listed = false;
        for (const auto& p : kProbes) {
            if (p.family != family) continue;
            listed = true;
            Row r;
            r.add("transport", std::string(p.address.substr(0, p.address.find(':'))));
            r.add("open with", std::string(p.address));
            na::Options o;
            o.max_ops = 64;
            auto t = na::open(p.address, o);
            if (t) {
                auto self = (*t)->addr_self();
                r.add("here", "yes");
                r.add("max unexpected", fmt::format("{}", (*t)->max_unexpected_size()));
                r.add("max expected", fmt::format("{}", (*t)->max_expected_size()));
                r.add("self address", (*t)->addr_to_string(self));
            } else {
                r.add("here", "no");
                r.add("max unexpected", "-");
                r.add("max expected", "-");
                r.add("self address", "-");
                r.add("error", t.error().describe());
            }
            r.add("what", std::string(p.what));
            s.rows.push_back(std::move(r));
        }
        if (!listed) s.notes.push_back(fmt::format("transport '{}' has no probe here", family));
    }
    s.notes.push_back(
        "ofi+<provider> and ucx+<transports> take other providers and transports "
        "too; docs/transports.md lists which string fits which fabric");
    return s;
}

}  // namespace talaria::info
