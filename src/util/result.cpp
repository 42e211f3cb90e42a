#include "talaria/util/result.hpp"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace talaria {

std::string_view errc_name(Errc code) noexcept {
    switch (code) {
        case Errc::ok:
            return "ok";
        case Errc::again:
            return "again";
        case Errc::timeout:
            return "timeout";
        case Errc::canceled:
            return "canceled";
        case Errc::disconnected:
            return "disconnected";
        case Errc::invalid_argument:
            return "invalid_argument";
        case Errc::out_of_range:
            return "out_of_range";
        case Errc::access_denied:
            return "access_denied";
        case Errc::permission_denied:
            return "permission_denied";
        case Errc::no_memory:
            return "no_memory";
        case Errc::not_supported:
            return "not_supported";
        case Errc::address_in_use:
            return "address_in_use";
        case Errc::address_invalid:
            return "address_invalid";
        case Errc::unreachable:
            return "unreachable";
        case Errc::protocol_error:
            return "protocol_error";
        case Errc::message_too_large:
            return "message_too_large";
        case Errc::busy:
            return "busy";
        case Errc::not_found:
            return "not_found";
        case Errc::already_exists:
            return "already_exists";
        case Errc::io_error:
            return "io_error";
        case Errc::shutdown:
            return "shutdown";
        case Errc::internal:
            return "internal";
        case Errc::invalid_state:
            return "invalid_state";
    }
    return "unknown";
}

std::string Error::describe() const {
    if (message_.empty()) return std::string(errc_name(code_));
    return fmt::format("{}: {}", errc_name(code_), message_);
}

Error errno_error(std::string_view what, int err) {
    Errc c;
    switch (err) {
        case EAGAIN:
            c = Errc::again;
            break;
        case ETIMEDOUT:
            c = Errc::timeout;
            break;
        case ECANCELED:
            c = Errc::canceled;
            break;
        case EPIPE:
        case ECONNRESET:
        case ENOTCONN:
        case ECONNABORTED:
        case ESHUTDOWN:
            c = Errc::disconnected;
            break;
        case ECONNREFUSED:
        case EHOSTUNREACH:
        case ENETUNREACH:
        case ESRCH:
        case ENOENT:
            c = Errc::unreachable;
            break;
        case EINVAL:
            c = Errc::invalid_argument;
            break;
        case EFAULT:
            c = Errc::out_of_range;
            break;
        case EPERM:
        case EACCES:
            c = Errc::permission_denied;
            break;
        case ENOMEM:
        case ENOBUFS:
            c = Errc::no_memory;
            break;
        case EADDRINUSE:
            c = Errc::address_in_use;
            break;
        case EADDRNOTAVAIL:
            c = Errc::address_invalid;
            break;
        case EMSGSIZE:
            c = Errc::message_too_large;
            break;
        case EBUSY:
            c = Errc::busy;
            break;
        case EEXIST:
            c = Errc::already_exists;
            break;
        case ENOSYS:
        case EOPNOTSUPP:
            c = Errc::not_supported;
            break;
        default:
            c = Errc::io_error;
            break;
    }
    return Error(c, fmt::format("{}: {} (errno {})", what, std::strerror(err), err));
}

}  // namespace talaria
