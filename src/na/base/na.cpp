// Transport selection, message buffers and small shared pieces of the na interface.
#include <algorithm>
#include <cstdlib>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "na/base/auth.hpp"
#include "na/base/op.hpp"
#include "na/base/transports.hpp"
#include "na/base/url.hpp"
#include "talaria/config.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {

namespace {
using OpenFn = Result<std::unique_ptr<Transport>> (*)(std::string_view, const Options&);
/// A family of schemes "<family>+<sub>" (ofi+tcp, ucx+sm): the sub-scheme names the provider.
using OpenFamilyFn = Result<std::unique_ptr<Transport>> (*)(std::string_view sub,
                                                            std::string_view rest, const Options&);
struct Entry {
    std::string_view scheme;
    OpenFn open = nullptr;
    OpenFamilyFn open_family = nullptr;
};
constexpr Entry kTransports[] = {
    {"inproc", &open_inproc, nullptr}, {"sm", &open_sm, nullptr}, {"tcp", &open_tcp, nullptr},
#if TALARIA_HAVE_OFI
    {"ofi", nullptr, &open_ofi},
#endif
#if TALARIA_HAVE_UCX
    {"ucx", nullptr, &open_ucx},
#endif
};
}  // namespace

std::string_view op_type_name(OpType t) noexcept {
    switch (t) {
        case OpType::send_unexpected:
            return "send_unexpected";
        case OpType::send_expected:
            return "send_expected";
        case OpType::recv_unexpected:
            return "recv_unexpected";
        case OpType::recv_expected:
            return "recv_expected";
        case OpType::put:
            return "put";
        case OpType::get:
            return "get";
        case OpType::user:
            return "user";
    }
    return "unknown";
}

std::string_view link_event_name(LinkEvent e) noexcept {
    switch (e) {
        case LinkEvent::connected:
            return "connected";
        case LinkEvent::accepted:
            return "accepted";
        case LinkEvent::connect_failed:
            return "connect_failed";
        case LinkEvent::lost:
            return "lost";
        case LinkEvent::backpressure:
            return "backpressure";
    }
    return "unknown";
}

namespace {
/// Edits (insert, delete, substitute, swap two neighbours) from `a` to `b`: optimal string
/// alignment distance, for a typo's suggestion.
std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i)
        d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j)
        d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i)
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}
}  // namespace

std::vector<std::string_view> transports_built() {
    std::vector<std::string_view> v;
    for (const auto& e : kTransports)
        v.push_back(e.scheme);
    return v;
}

Result<std::unique_ptr<Transport>> open(std::string_view address, const Options& options) {
    TALARIA_TRY(url, parse_url(address));
    auto plus = url.scheme.find('+');
    std::string_view family = url.scheme.substr(0, plus);
    TALARIA_CHECK(auth::check(options.auth));
    if (options.auth.protect != Protect::none && family != "tcp")
        return Error(
            Errc::not_supported,
            fmt::format("'{}': na::Auth::protect (integrity or encryption of every record "
                        "after the handshake) is implemented on tcp only; the {} transport "
                        "authenticates its peers but does not protect its messages",
                        address, family));
    auto opened = [&](Result<std::unique_ptr<Transport>> t) {
        if (t) (*t)->listens_ = options.listen;
        return t;
    };
    for (const auto& e : kTransports) {
        if (e.scheme != family) continue;
        if (e.open && plus == std::string_view::npos) return opened(e.open(url.rest, options));
        if (e.open_family) {
            if (plus == std::string_view::npos || plus + 1 == url.scheme.size())
                return Error(Errc::address_invalid,
                             fmt::format("'{}': the {} transport needs a sub-scheme naming the "
                                         "provider, e.g. {}+tcp://",
                                         address, family, family));
            return opened(e.open_family(url.scheme.substr(plus + 1), url.rest, options));
        }
    }
    // A typo ("tpc://", "sn://"): name the nearest transport of the build.
    std::string_view nearest;
    std::size_t best = 3;  // at most two edits away
    for (const auto& e : kTransports) {
        std::size_t d = edit_distance(family, e.scheme);
        if (d < best && d < std::max<std::size_t>(e.scheme.size(), 2)) {
            best = d;
            nearest = e.scheme;
        }
    }
    std::string hint;
    if (!nearest.empty())
        hint = fmt::format(
            ": did you mean '{}{}://'?", nearest,
            plus == std::string_view::npos ? std::string_view() : url.scheme.substr(plus));
    return Error(Errc::not_supported,
                 fmt::format("no transport '{}' in this build (built: {}){}", url.scheme,
                             fmt::join(transports_built(), ", "), hint));
}

// --- message buffers ---------------------------------------------------------------------------

MsgBuffer& MsgBuffer::operator=(MsgBuffer&& o) noexcept {
    if (this != &o) {
        if (owner_ && data_) owner_->msg_buf_free(*this);
        owner_ = o.owner_;
        data_ = o.data_;
        size_ = o.size_;
        priv_ = o.priv_;
        o.owner_ = nullptr;
        o.data_ = nullptr;
        o.size_ = 0;
        o.priv_ = nullptr;
    }
    return *this;
}

MsgBuffer::~MsgBuffer() {
    if (owner_ && data_) owner_->msg_buf_free(*this);
}

Result<MsgBuffer> Transport::msg_buf_alloc(std::size_t size) {
    std::size_t max = std::max(max_unexpected_size(), max_expected_size());
    if (size > max)
        return Error(Errc::message_too_large,
                     fmt::format("message buffer of {} bytes exceeds the {} transport's maximum "
                                 "of {} bytes",
                                 size, name(), max));
    // Cache-line aligned, at least one line so that size 0 still yields a valid pointer.
    std::size_t cap = (std::max<std::size_t>(size, 1) + 63) & ~std::size_t(63);
    void* p = std::aligned_alloc(64, cap);
    if (!p) return Error(Errc::no_memory, "message buffer allocation failed");
    return MsgBuffer(this, static_cast<std::byte*>(p), size, nullptr);
}

void Addr::destroy(AddrImpl* p) noexcept {
    // In a child across fork() the object belongs to the parent's transport: its destructor
    // would take that transport's locks (perhaps held by a parent thread at the fork) and may
    // close connections the parent shares. The child leaves it allocated.
    if (p->transport() && p->transport()->inherited()) return;
    delete p;
}

void MemHandle::Release::operator()(MemImpl* p) const noexcept {
    if (p->transport() && p->transport()->inherited()) return;  // as Addr::destroy
    delete p;
}

void Transport::msg_buf_free(MsgBuffer& buf) noexcept {
    std::free(buf.data());
}

std::span<const EnvSetting> recommended_env() noexcept {
#if TALARIA_HAVE_OFI
    // libfabric's rxm reads these when fi_getinfo first loads the providers (ofi+tcp, verbs).
    static constexpr EnvSetting kSettings[] = {
        {"FI_OFI_RXM_ENABLE_DYN_RBUF", "0",
         "with 1 (libfabric's default) a message larger than the receive buffer posted for it "
         "breaks the connection to that peer instead of failing only that receive"},
        {"FI_OFI_RXM_CM_PROGRESS_INTERVAL", "100",
         "with 10000 (the default) the first call to each new peer waits ~20 ms for the "
         "connection handshake"},
    };
    return kSettings;
#else
    return {};
#endif
}

}  // namespace talaria::na
