// Parsing of transport address strings: "scheme://rest", and host:port for IP transports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <netinet/in.h>
#include <sys/socket.h>

#include "talaria/util/result.hpp"

namespace talaria::na {

struct Url {
    std::string_view scheme;  ///< "tcp", "sm", "ofi+tcp"
    std::string_view rest;    ///< everything after "://"
};

/// Split "scheme://rest". address_invalid when there is no "://".
Result<Url> parse_url(std::string_view address);

/// A resolved IPv4 or IPv6 socket address.
struct SockAddr {
    sockaddr_storage storage{};
    socklen_t len = 0;
    [[nodiscard]] int family() const noexcept { return storage.ss_family; }
    [[nodiscard]] uint16_t port() const noexcept;
    void set_port(uint16_t port) noexcept;
    /// "127.0.0.1:5000" or "[::1]:5000".
    [[nodiscard]] std::string to_string() const;
    [[nodiscard]] const sockaddr* sa() const noexcept {
        return reinterpret_cast<const sockaddr*>(&storage);
    }
    [[nodiscard]] sockaddr* sa() noexcept { return reinterpret_cast<sockaddr*>(&storage); }
};

/// The address a listener bound to `bound` tells peers: the loopback address of its family
/// (with the bound port) for a wildcard bind, else `bound` itself (pass an explicit host to be
/// reachable from other machines).
SockAddr advertised(const SockAddr& bound);

/// Parse "host:port", "[v6]:port", "host" (port 0) or "" (0.0.0.0:0 when `empty_ok`).
/// Numeric hosts parse directly; names ("localhost") resolve with getaddrinfo.
Result<SockAddr> parse_host_port(std::string_view s, bool empty_ok = true);

/// Words for a failed connect to `where` ("host:port") with errno `err`, shared by the
/// transports that connect sockets themselves (tcp, ucx's bootstrap): a refused connection
/// names the remedy, anything else the errno's name and text.
std::string connect_failure_text(std::string_view where, int err);

}  // namespace talaria::na
