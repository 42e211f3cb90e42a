#include "na/base/auth.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace talaria::na {

namespace auth {

Result<Nonce> random_nonce() {
    Nonce n;
    if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), int(n.size())) != 1)
        return Error(Errc::io_error,
                     fmt::format("RAND_bytes failed (OpenSSL error {:#x})", ERR_get_error()));
    return n;
}

Proof prove(std::span<const std::byte> secret, Role role, std::span<const std::byte> own_nonce,
            std::span<const std::byte> peer_nonce, std::string_view key_id) {
    std::string_view label = role == Role::acceptor    ? "talaria auth v1 acceptor"
                             : role == Role::connector ? "talaria auth v1 connector"
                                                       : "talaria auth v1 session";
    return derive(secret, label, own_nonce, peer_nonce, key_id);
}

Proof derive(std::span<const std::byte> secret, std::string_view label,
             std::span<const std::byte> own_nonce, std::span<const std::byte> peer_nonce,
             std::string_view key_id) {
    // label || own nonce || peer nonce || key id length || key id
    std::array<unsigned char, 64 + kNonceSize * 2 + 1 + 255> msg{};
    std::size_t n = 0;
    std::memcpy(msg.data() + n, label.data(), label.size());
    n += label.size();
    std::memcpy(msg.data() + n, own_nonce.data(), own_nonce.size());
    n += own_nonce.size();
    std::memcpy(msg.data() + n, peer_nonce.data(), peer_nonce.size());
    n += peer_nonce.size();
    msg[n++] = static_cast<unsigned char>(key_id.size());
    std::memcpy(msg.data() + n, key_id.data(), key_id.size());
    n += key_id.size();
    Proof out{};
    unsigned int len = 0;
    HMAC(EVP_sha256(), secret.data(), int(secret.size()), msg.data(), n,
         reinterpret_cast<unsigned char*>(out.data()), &len);
    return out;
}

Proof mac(std::span<const std::byte> key, std::initializer_list<std::span<const std::byte>> parts) {
    std::size_t total = 0;
    for (auto p : parts)
        total += p.size();
    std::vector<unsigned char> msg(total);
    std::size_t n = 0;
    for (auto p : parts) {
        if (!p.empty()) std::memcpy(msg.data() + n, p.data(), p.size());
        n += p.size();
    }
    Proof out{};
    unsigned int len = 0;
    HMAC(EVP_sha256(), key.data(), int(key.size()), msg.data(), msg.size(),
         reinterpret_cast<unsigned char*>(out.data()), &len);
    return out;
}

bool matches(const Proof& expected, std::span<const std::byte> received) noexcept {
    return received.size() == expected.size() &&
           CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

Result<void> check(const Auth& a) {
    if (a.protect != Protect::none && !a.enabled())
        return Error(Errc::invalid_argument,
                     "Options::auth: protect needs a shared secret (its keys come from it)");
    if (!a.enabled()) return ok();
    if (a.key_id.size() > 255)
        return Error(
            Errc::invalid_argument,
            fmt::format("Options::auth: key id of {} bytes (at most 255)", a.key_id.size()));
    if (a.secret.size() < 16)
        return Error(Errc::invalid_argument,
                     fmt::format("Options::auth: a secret of {} bytes is too short (at least 16)",
                                 a.secret.size()));
    return ok();
}

std::string client_side(const Auth& mine) {
    constexpr std::string_view where =
        "(na::Options::auth; in an engine's config, na.auth's key_id and secret_file)";
    if (!mine.enabled())
        return fmt::format(
            "this client holds no secret: give it the server's key id and "
            "secret {}",
            where);
    std::string_view protect = mine.protect == Protect::none ? "does not protect its stream"
                               : mine.protect == Protect::integrity
                                   ? "protects its stream (integrity)"
                                   : "protects its stream (encryption)";
    return fmt::format(
        "this client holds the secret of key '{}' and {} (na::Auth::protect): set "
        "the same key id, secret and protect on both sides {}",
        mine.key_id, protect, where);
}

std::string printable(std::string_view peer_text) {
    std::string out;
    out.reserve(peer_text.size());
    for (char ch : peer_text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out += ch;
        else
            out += fmt::format("\\x{:02x}", c);
    }
    return out;
}

}  // namespace auth

std::string PeerIdentity::describe() const {
    if (!key_id.empty()) return fmt::format("key {:?}", key_id);
    if (uid >= 0)
        return pid >= 0 ? fmt::format("uid {} pid {}", uid, pid) : fmt::format("uid {}", uid);
    return "unauthenticated";
}

Result<std::vector<std::byte>> read_secret_file(std::string_view path) {
    std::string p(path);
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return errno_error(fmt::format("read_secret_file: open {}", p), errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        return errno_error(fmt::format("read_secret_file: stat {}", p), e);
    }
    auto refuse = [&](std::string why) -> Error {
        ::close(fd);
        return Error(Errc::permission_denied, fmt::format("read_secret_file: {}: {}", p, why));
    };
    if (!S_ISREG(st.st_mode)) return refuse("not a regular file");
    if (st.st_uid != ::geteuid())
        return refuse(
            fmt::format("owned by uid {}, not by this user (uid {}): a secret must be "
                        "its user's own",
                        st.st_uid, ::geteuid()));
    if (st.st_mode & 077)
        return refuse(fmt::format("mode {:04o} lets others read it; chmod 600 (or 400) it",
                                  st.st_mode & 07777));
    if (st.st_size < 16 || st.st_size > 4096)
        return refuse(fmt::format("{} bytes (a secret has 16 to 4096)", st.st_size));
    std::vector<std::byte> out(std::size_t(st.st_size));
    std::size_t got = 0;
    while (got < out.size()) {
        ssize_t r = ::read(fd, out.data() + got, out.size() - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            ::close(fd);
            return errno_error(fmt::format("read_secret_file: read {}", p), e);
        }
        got += std::size_t(r);
    }
    ::close(fd);
    return out;
}

}  // namespace talaria::na
