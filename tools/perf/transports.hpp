// talaria-perf: the transport names it measures. "sm" and "tcp" as before, and the families
// of the libfabric and UCX transports: "ofi+<provider>" (ofi+tcp, ofi+shm, ...) and
// "ucx+<transports>" (ucx+tcp, ucx+sm, ...), opened as "<scheme>://127.0.0.1:0" when the
// sub-scheme runs over IP and "<scheme>://" when it is shared memory.
#pragma once

#include <string>
#include <string_view>

#include "talaria/util/result.hpp"

namespace talaria::perf {

enum class Family : unsigned char { sm, tcp, ofi, ucx };

/// The family of a transport name; an error naming the accepted forms for anything else.
Result<Family> transport_family(std::string_view transport);

/// "tcp" of "ofi+tcp", "sm" of "ucx+sm"; empty for sm and tcp.
std::string_view sub_scheme(std::string_view transport) noexcept;

/// Shared memory within one host (sm, ofi+shm, ucx+sm, ucx+posix...): no IP address to open.
bool is_shared_memory(std::string_view transport) noexcept;

/// Connection set-up is the point of the first-call pattern: measured by default on the
/// transports that run over IP.
bool is_ip_transport(std::string_view transport) noexcept;

/// The address a transport is opened with when --url/--listen does not say:
/// "tcp://127.0.0.1:0", "ofi+tcp://127.0.0.1:0", "sm://", "ucx+sm://".
std::string default_url(std::string_view transport);

}  // namespace talaria::perf
