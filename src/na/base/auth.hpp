// Shared-secret authentication of connections (na::Options::auth): the nonces and proofs of the
// challenge-response a transport runs at connection set-up (docs/protocol.md, tcp "auth"), over
// OpenSSL's libcrypto (HMAC-SHA256, its random generator, its constant-time comparison).
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "talaria/na/na.hpp"

namespace talaria::na::auth {

inline constexpr std::size_t kNonceSize = 32;
inline constexpr std::size_t kProofSize = 32;
using Nonce = std::array<std::byte, kNonceSize>;
using Proof = std::array<std::byte, kProofSize>;

/// Which side a proof is made by: the two are labelled apart, so that a proof one side sends can
/// never be reflected back as the other's. `session`: not a proof but the key both sides derive
/// from a finished handshake (ucx signs its hellos with it), labelled apart from both proofs.
enum class Role { acceptor, connector, session };

/// Unpredictable bytes (the caller's nonce for one connection).
Result<Nonce> random_nonce();
/// HMAC-SHA256 under `secret` of a label naming `role`, the nonce of the side that proves,
/// the other side's nonce, and the key id.
Proof prove(std::span<const std::byte> secret, Role role, std::span<const std::byte> own_nonce,
            std::span<const std::byte> peer_nonce, std::string_view key_id);
/// HMAC-SHA256 under `secret` of `label` (at most 64 bytes), nonce `a`, nonce `b`, key id length
/// and key id: a key both sides of a handshake derive (what prove() computes, under a label of
/// the caller's).
Proof derive(std::span<const std::byte> secret, std::string_view label,
             std::span<const std::byte> a, std::span<const std::byte> b, std::string_view key_id);
/// HMAC-SHA256 under `key` of the concatenation of `parts` (a message authentication code).
Proof mac(std::span<const std::byte> key, std::initializer_list<std::span<const std::byte>> parts);
/// Compares a received proof with the expected one in constant time.
bool matches(const Proof& expected, std::span<const std::byte> received) noexcept;
/// Options::auth is usable: a key id of at most 255 bytes and a secret of at least 16.
Result<void> check(const Auth& a);
/// What a client refused at connection set-up (by the server's check or its own) has on its side
/// and what to change there: appended to the reason in the error of the calls the refusal fails,
/// so that the caller reads both sides' settings in one message.
std::string client_side(const Auth& mine);
/// A peer's words (a refusal's reason) as they may be logged and shown: printable ASCII as it
/// is, every other byte as \xNN.
std::string printable(std::string_view peer_text);

}  // namespace talaria::na::auth
