// Mercury's info strings and address strings, shared by the NA and HG functions.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace talaria::mercury {

/// Mercury's info string ("na+sm", "na+tcp://host:port", "ofi+tcp://...", "sm", "tcp://...",
/// "inproc://name") as Talaria's address string, with its class and protocol names.
struct Info {
    std::string address, class_name, protocol;
};

inline Info parse_info(std::string_view info) {
    Info p;
    std::string_view head = info, rest;
    if (auto at = info.find("://"); at != std::string_view::npos) {
        head = info.substr(0, at);
        rest = info.substr(at + 3);
    }
    std::string_view cls, proto = head;
    if (auto plus = head.find('+'); plus != std::string_view::npos) {
        cls = head.substr(0, plus);
        proto = head.substr(plus + 1);
    }
    if (cls.empty() || cls == "na") {  // Mercury's own plugins: sm and tcp are Talaria's
        p.class_name = "na";
        p.protocol = std::string(proto);
        p.address = fmt::format("{}://{}", proto, rest);
    } else {
        p.class_name = std::string(cls);
        p.protocol = std::string(proto);
        p.address = fmt::format("{}+{}://{}", cls, proto, rest);
    }
    return p;
}

/// Talaria's address string as Mercury's programs expect it: "na+" before sm and tcp.
inline std::string mercury_string(std::string_view class_name, std::string s) {
    if (class_name == "na" && !s.starts_with("inproc")) return "na+" + s;
    return s;
}

/// A Mercury address string as Talaria's (the "na+" prefix dropped).
inline std::string_view talaria_string(std::string_view s) {
    if (s.starts_with("na+")) s.remove_prefix(3);
    return s;
}

}  // namespace talaria::mercury
