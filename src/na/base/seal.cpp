#include "na/base/seal.hpp"

#include <openssl/err.h>

#include <cstring>

#include <fmt/format.h>

namespace talaria::na::seal {

namespace {
void store_le(std::byte* p, uint64_t v, int n) noexcept {
    for (int i = 0; i < n; ++i)
        p[i] = std::byte(uint8_t(v >> (8 * i)));
}
uint64_t load_le(const std::byte* p, int n) noexcept {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v |= uint64_t(uint8_t(p[i])) << (8 * i);
    return v;
}
unsigned char* uc(std::byte* p) noexcept {
    return reinterpret_cast<unsigned char*>(p);
}
const unsigned char* uc(const std::byte* p) noexcept {
    return reinterpret_cast<const unsigned char*>(p);
}
}  // namespace

Result<std::size_t> record_length(std::span<const std::byte> header) {
    if (header.size() < kRecordHeaderSize)
        return Error(Errc::protocol_error, "a protected record's header is 8 bytes");
    if (load_le(header.data(), 4) != kRecordMagic)
        return Error(Errc::protocol_error,
                     fmt::format("expected a protected record (magic {:08x}), got {:08x}: does the "
                                 "peer set the same na::Auth::protect?",
                                 kRecordMagic, uint32_t(load_le(header.data(), 4))));
    std::size_t n = load_le(header.data() + 4, 4);
    if (n == 0 || n > kMaxRecordBody)
        return Error(
            Errc::protocol_error,
            fmt::format("a protected record announces a {}-byte body (1..{})", n, kMaxRecordBody));
    return n;
}

Direction::~Direction() {
    if (ctx_) EVP_CIPHER_CTX_free(ctx_);
}

Result<void> Direction::init(std::span<const std::byte> key, uint32_t direction, Protect mode) {
    if (key.size() != kKeySize || mode == Protect::none)
        return Error(Errc::invalid_argument, "seal: a 32-byte key and a protection mode");
    ctx_ = EVP_CIPHER_CTX_new();
    if (!ctx_ ||
        EVP_CipherInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, uc(key.data()), nullptr, -1) != 1)
        return Error(Errc::io_error, fmt::format("seal: AES-256-GCM set-up failed (OpenSSL error "
                                                 "{:#x})",
                                                 ERR_get_error()));
    dir_ = direction;
    mode_ = mode;
    seq_ = 0;
    return ok();
}

void Direction::nonce(unsigned char iv[12]) const noexcept {
    auto* b = reinterpret_cast<std::byte*>(iv);
    store_le(b, dir_, 4);
    store_le(b + 4, seq_, 8);
}

void Direction::begin(std::byte* rec, std::size_t n) {
    store_le(rec, kRecordMagic, 4);
    store_le(rec + 4, n, 4);
    rec_ = rec;
    n_ = n;
    added_ = 0;
    unsigned char iv[12];
    nonce(iv);
    ++seq_;
    int len = 0;
    // Failures of these calls would be bugs of ours (wrong sizes), not conditions of the
    // input: every argument is fixed here.
    (void)EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv);
    (void)EVP_EncryptUpdate(ctx_, nullptr, &len, uc(rec), int(kRecordHeaderSize));
}

void Direction::add(const std::byte* src, std::size_t len) {
    std::byte* out = rec_ + kRecordHeaderSize + added_;
    int l = 0;
    if (mode_ == Protect::encryption) {
        (void)EVP_EncryptUpdate(ctx_, uc(out), &l, uc(src), int(len));
    } else {
        if (out != src) std::memcpy(out, src, len);
        (void)EVP_EncryptUpdate(ctx_, nullptr, &l, uc(src), int(len));
    }
    added_ += len;
}

std::size_t Direction::finish() {
    std::byte* tag = rec_ + kRecordHeaderSize + n_;
    int len = 0;
    (void)EVP_EncryptFinal_ex(ctx_, uc(tag), &len);
    (void)EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, int(kRecordTagSize), uc(tag));
    rec_ = nullptr;
    return n_ + kRecordOverhead;
}

std::size_t Direction::seal(std::byte* rec, std::size_t n) {
    begin(rec, n);
    add(rec + kRecordHeaderSize, n);
    return finish();
}

bool Direction::open(const std::byte* rec, std::size_t n, std::byte* out) {
    unsigned char iv[12];
    nonce(iv);
    const std::byte* body = rec + kRecordHeaderSize;
    int len = 0;
    if (EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) != 1 ||
        EVP_DecryptUpdate(ctx_, nullptr, &len, uc(rec), int(kRecordHeaderSize)) != 1)
        return false;
    if (mode_ == Protect::encryption) {
        if (EVP_DecryptUpdate(ctx_, uc(out), &len, uc(body), int(n)) != 1) return false;
    } else if (EVP_DecryptUpdate(ctx_, nullptr, &len, uc(body), int(n)) != 1) {
        return false;
    }
    unsigned char tag[kRecordTagSize];
    std::memcpy(tag, body + n, kRecordTagSize);
    if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, int(kRecordTagSize), tag) != 1 ||
        EVP_DecryptFinal_ex(ctx_, uc(out) + (mode_ == Protect::encryption ? n : 0), &len) != 1)
        return false;
    if (mode_ == Protect::integrity && out != body) std::memcpy(out, body, n);
    ++seq_;
    return true;
}

}  // namespace talaria::na::seal
