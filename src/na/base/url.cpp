#include "na/base/url.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace talaria::na {

Result<Url> parse_url(std::string_view address) {
    auto pos = address.find("://");
    if (pos == std::string_view::npos || pos == 0)
        return Error(
            Errc::address_invalid,
            fmt::format("address '{}' has no scheme (expected e.g. tcp://host:port)", address));
    return Url{address.substr(0, pos), address.substr(pos + 3)};
}

uint16_t SockAddr::port() const noexcept {
    if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
}

void SockAddr::set_port(uint16_t port) noexcept {
    if (family() == AF_INET)
        reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
    else
        reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

SockAddr advertised(const SockAddr& bound) {
    const bool wildcard =
        bound.family() == AF_INET
            ? reinterpret_cast<const sockaddr_in*>(&bound.storage)->sin_addr.s_addr ==
                  htonl(INADDR_ANY)
            : IN6_IS_ADDR_UNSPECIFIED(
                  &reinterpret_cast<const sockaddr_in6*>(&bound.storage)->sin6_addr);
    if (!wildcard) return bound;
    SockAddr lo;
    if (bound.family() == AF_INET) {
        auto* a = reinterpret_cast<sockaddr_in*>(&lo.storage);
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        lo.len = sizeof(sockaddr_in);
    } else {
        auto* a = reinterpret_cast<sockaddr_in6*>(&lo.storage);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        lo.len = sizeof(sockaddr_in6);
    }
    lo.set_port(bound.port());
    return lo;
}

std::string SockAddr::to_string() const {
    char buf[INET6_ADDRSTRLEN] = {};
    if (family() == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf,
                  sizeof buf);
        return fmt::format("{}:{}", buf, port());
    }
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf,
              sizeof buf);
    return fmt::format("[{}]:{}", buf, port());
}

Result<SockAddr> parse_host_port(std::string_view s, bool empty_ok) {
    std::string host;
    std::string_view port_str;
    if (s.empty()) {
        if (!empty_ok) return Error(Errc::address_invalid, "empty host:port");
        host = "0.0.0.0";
    } else if (s.front() == '[') {
        auto close = s.find(']');
        if (close == std::string_view::npos)
            return Error(Errc::address_invalid, fmt::format("'{}': missing ']'", s));
        host = std::string(s.substr(1, close - 1));
        auto after = s.substr(close + 1);
        if (!after.empty()) {
            if (after.front() != ':')
                return Error(Errc::address_invalid, fmt::format("'{}': junk after ']'", s));
            port_str = after.substr(1);
        }
    } else {
        if (auto slash = s.find('/'); slash != std::string_view::npos) {
            // "tcp:/host:port", "tcp:host:port/x": a scheme written wrong, or a path.
            auto colon = s.find(':');
            if (colon != std::string_view::npos && colon < slash) {
                auto rest = s.substr(colon + 1);
                while (!rest.empty() && rest.front() == '/')
                    rest.remove_prefix(1);
                return Error(Errc::address_invalid,
                             fmt::format("'{}' is not host:port: a scheme is followed by \"://\" "
                                         "(did you mean '{}://{}'?)",
                                         s, s.substr(0, colon), rest));
            }
            return Error(Errc::address_invalid,
                         fmt::format("'{}' is not host:port: a host name or address holds no "
                                     "'/'",
                                     s));
        }
        auto colon = s.rfind(':');
        if (colon != std::string_view::npos && s.find(':') != colon)
            return Error(
                Errc::address_invalid,
                s.find_first_not_of("0123456789abcdefABCDEF:.") == std::string_view::npos
                    ? fmt::format("'{}': write IPv6 addresses as [addr]:port", s)
                    : fmt::format("'{}' is not host:port (more than one ':'; an IPv6 address is "
                                  "written [addr]:port)",
                                  s));
        host = std::string(s.substr(0, colon));
        if (colon != std::string_view::npos) port_str = s.substr(colon + 1);
        if (host.empty()) host = "0.0.0.0";
    }
    unsigned port = 0;
    if (!port_str.empty()) {
        auto [p, ec] = std::from_chars(port_str.data(), port_str.data() + port_str.size(), port);
        if (ec != std::errc{} || p != port_str.data() + port_str.size() || port > 65535)
            return Error(Errc::address_invalid, fmt::format("'{}': bad port '{}'", s, port_str));
    }
    SockAddr out;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&out.storage);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        out.len = sizeof(sockaddr_in);
    } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        out.len = sizeof(sockaddr_in6);
    } else {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* res = nullptr;
        int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
        if (rc != 0 || !res)
            return Error(Errc::address_invalid,
                         fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc)));
        std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
        out.len = res->ai_addrlen;
        freeaddrinfo(res);
    }
    out.set_port(static_cast<uint16_t>(port));
    return out;
}

std::string connect_failure_text(std::string_view where, int err) {
    const char* name = ::strerrorname_np(err);
    std::string errno_name = name ? std::string(name) : std::to_string(err);
    if (err == ECONNREFUSED)
        return fmt::format(
            "connection refused by {} ({}): is the server running, and listening "
            "on that address?",
            where, errno_name);
    return fmt::format("connect to {} failed: {} ({})", where, std::strerror(err), errno_name);
}

}  // namespace talaria::na
