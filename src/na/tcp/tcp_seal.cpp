// Protected tcp connections (na::Auth::protect; docs/protocol.md, tcp "records"). After the
// handshake both directions carry records sealed with AES-256-GCM (na/base/seal.hpp) under keys
// derived from the secret and both nonces, one per direction: the frames inside are the same as
// without protection, and the frame parser (process_rx) reads them from the opened records. The
// send side copies what is queued into records (an op is sent once its bytes are sealed), the
// receive side opens records into the receive buffer: one copy each way more than a plain
// connection, and the cipher.
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "na/tcp/tcp.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na::tcp {

namespace {

std::string_view label(bool to_acceptor, Protect p) {
    if (p == Protect::encryption)
        return to_acceptor ? "talaria tcp v1 to acceptor encryption"
                           : "talaria tcp v1 to connector encryption";
    return to_acceptor ? "talaria tcp v1 to acceptor integrity"
                       : "talaria tcp v1 to connector integrity";
}

/// Feed up to `room` bytes of `it`, from where it was left (it->sent), to the record `d` is
/// sealing (the cipher reads them where they are); returns how many.
std::size_t seal_item(seal::Direction& d, SendItem* it, std::size_t room) {
    std::size_t skip = it->sent, n = 0;
    for (int i = 0; i < it->iovcnt && n < room; ++i) {
        const std::size_t len = it->iov[i].iov_len;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        const std::size_t take = std::min(len - skip, room - n);
        d.add(static_cast<const std::byte*>(it->iov[i].iov_base) + skip, take);
        n += take;
        skip = 0;
    }
    it->sent += n;
    return n;
}

}  // namespace

bool TcpTransport::start_protection(Conn* c) {
    const Auth& a = opts_.auth;
    // The connector's nonce first in every derivation, whichever side derives.
    const auth::Nonce& nc = c->outgoing ? c->own_nonce : c->peer_nonce;
    const auth::Nonce& na = c->outgoing ? c->peer_nonce : c->own_nonce;
    const auth::Proof to_acceptor =
        auth::derive(a.secret, label(true, a.protect), nc, na, a.key_id);
    const auth::Proof to_connector =
        auth::derive(a.secret, label(false, a.protect), nc, na, a.key_id);
    c->seal_tx = std::make_unique<seal::Direction>();
    c->seal_rx = std::make_unique<seal::Direction>();
    auto tx =
        c->seal_tx->init(c->outgoing ? to_acceptor : to_connector, c->outgoing ? 0 : 1, a.protect);
    auto rx =
        c->seal_rx->init(c->outgoing ? to_connector : to_acceptor, c->outgoing ? 1 : 0, a.protect);
    if (!tx || !rx) {
        close_conn(c, Errc::io_error, (!tx ? tx : rx).error().describe());
        return false;
    }
    c->tx_sealed = std::unique_ptr<std::byte[]>(new std::byte[kSealedBufferSize]);
    c->rx_sealed = std::unique_ptr<std::byte[]>(new std::byte[kSealedBufferSize]);
    // What was read past the handshake (the acceptor may have the first records already): sealed.
    const std::size_t rest = c->rx_len - c->rx_pos;
    if (rest > kSealedBufferSize) {
        close_conn(c, Errc::protocol_error, "too much sent before the handshake ended");
        return false;
    }
    std::memcpy(c->rx_sealed.get(), c->rx.get() + c->rx_pos, rest);
    c->rx_sealed_len = rest;
    c->rx_pos = c->rx_len = 0;
    return true;
}

void TcpTransport::flush_sealed(Conn* c) {
    std::byte* buf = c->tx_sealed.get();
    while (c->state == Conn::State::open) {
        while (c->tx_sealed_pos < c->tx_sealed_len) {
            ssize_t w = ::send(c->fd, buf + c->tx_sealed_pos, c->tx_sealed_len - c->tx_sealed_pos,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    update_events(c);
                    return;
                }
                int e = errno;
                close_conn(c, Errc::disconnected,
                           fmt::format("send to {} failed: {}",
                                       c->peer ? peer_of(c->peer)->str : "peer", std::strerror(e)));
                return;
            }
            c->tx_sealed_pos += std::size_t(w);
        }
        c->tx_sealed_pos = c->tx_sealed_len = 0;
        if (!sendable(c)) break;
        // Seal the queue's front into as many records as the buffer takes.
        while (!c->sendq.empty() &&
               c->tx_sealed_len + seal::kMaxRecordBody + seal::kRecordOverhead <=
                   kSealedBufferSize) {
            // The record's size first (its header is authenticated before its body).
            std::size_t n = 0;
            for (SendItem& it : c->sendq) {
                n += it.total - it.sent;
                if (n >= seal::kMaxRecordBody) break;
            }
            n = std::min(n, seal::kMaxRecordBody);
            if (n == 0) break;
            c->seal_tx->begin(buf + c->tx_sealed_len, n);
            for (std::size_t done = 0; done < n;) {
                SendItem* it = c->sendq.front();
                const std::size_t took = seal_item(*c->seal_tx, it, n - done);
                done += took;
                c->queued_bytes -= took;
                if (it->sent < it->total) break;  // the record is full
                c->sendq.pop_front();
                item_done(c, it);
            }
            c->tx_sealed_len += c->seal_tx->finish();
        }
        if (c->tx_sealed_len == 0) break;
    }
    update_events(c);
}

bool TcpTransport::open_records(Conn* c) {
    for (;;) {
        if (!process_rx(c)) return false;
        // Not before the connection has its lane; nor while back-pressure holds its frames.
        if (c->lane == nullptr || c->paused || c->state != Conn::State::open) return true;
        const std::size_t avail = c->rx_sealed_len - c->rx_sealed_pos;
        if (avail < seal::kRecordHeaderSize) return true;
        const std::byte* rec = c->rx_sealed.get() + c->rx_sealed_pos;
        uint32_t magic = 0;
        std::memcpy(&magic, rec, 4);  // little-endian hosts only, as the frame format
        if (magic == kFrameMagic && !c->opened_any && c->outgoing) {
            // The acceptor refused our response instead (an unprotected auth frame): that is
            // the only unprotected frame that may come, and only before any record.
            if (avail < kFrameHeaderSize) return true;
            auto h = decode_frame_header(std::span<const std::byte>(rec, kFrameHeaderSize));
            if (!h || h->type != FrameType::auth || AuthStep(h->context_id) != AuthStep::refused) {
                close_conn(c, Errc::protocol_error,
                           "an unprotected frame after the handshake (the peer does not protect "
                           "its stream: do both sides set the same na::Auth::protect?)");
                return false;
            }
            std::memcpy(c->rx.get() + c->rx_len, rec, std::min(avail, c->rx_cap - c->rx_len));
            c->rx_len += std::min(avail, c->rx_cap - c->rx_len);
            c->rx_sealed_pos = c->rx_sealed_len = 0;
            c->seal_rx.reset();  // what follows is read as it comes (the refusal closes it)
            return process_rx(c);
        }
        auto n = seal::record_length(std::span<const std::byte>(rec, seal::kRecordHeaderSize));
        if (!n && magic == kFrameMagic && !c->outgoing && !c->opened_any) {
            refuse_protect_mismatch(c);  // we protect, the client does not: tell it
            return false;
        }
        if (!n) {
            close_conn(c, Errc::protocol_error, n.error().message());
            return false;
        }
        if (avail < *n + seal::kRecordOverhead) return true;
        // A record that is all payload of the frame being read opens straight into its
        // destination, as a plain connection reads it there; other records open into rx, for
        // the frame parser. Not a put's into our registered region with encryption: the
        // cipher writes its plaintext before the tag is checked, and a put that fails there
        // tells nobody here (into a receive's or a get's buffer it does: their op fails).
        const bool direct =
            c->in_payload && c->dest && c->rx_pos == c->rx_len && c->remaining >= *n &&
            (opts_.auth.protect == Protect::integrity || c->sink != Conn::Sink::put);
        if (!direct && c->rx_pos > 0) {
            std::memmove(c->rx.get(), c->rx.get() + c->rx_pos, c->rx_len - c->rx_pos);
            c->rx_len -= c->rx_pos;
            c->rx_pos = 0;
        }
        if (!direct && c->rx_cap - c->rx_len < *n) return true;  // parsed as it frees up
        if (!c->seal_rx->open(rec, *n, direct ? c->dest : c->rx.get() + c->rx_len)) {
            close_conn(c, Errc::protocol_error,
                       fmt::format("a record from {} failed its integrity check: changed on the "
                                   "way, or sealed with another key or mode (do both sides set "
                                   "the same na::Auth::protect?)",
                                   c->peer ? peer_of(c->peer)->str : std::string("the peer")));
            return false;
        }
        if (direct) {
            c->dest += *n;
            c->remaining -= *n;
        } else {
            c->rx_len += *n;
        }
        c->rx_sealed_pos += *n + seal::kRecordOverhead;
        c->opened_any = true;
    }
}

void TcpTransport::read_sealed(Conn* c) {
    for (int round = 0; round < 16 && c->state != Conn::State::closed; ++round) {
        if (!open_records(c)) return;
        if (!c->seal_rx) {  // an unprotected refusal arrived instead
            if (c->state != Conn::State::closed) read_ready(c);
            return;
        }
        if (c->lane == nullptr || c->paused || c->state != Conn::State::open) break;
        if (c->rx_sealed_pos > 0) {
            std::memmove(c->rx_sealed.get(), c->rx_sealed.get() + c->rx_sealed_pos,
                         c->rx_sealed_len - c->rx_sealed_pos);
            c->rx_sealed_len -= c->rx_sealed_pos;
            c->rx_sealed_pos = 0;
        }
        const std::size_t asked = kSealedBufferSize - c->rx_sealed_len;
        if (asked == 0) break;  // records wait for room in rx
        ssize_t n = ::recv(c->fd, c->rx_sealed.get() + c->rx_sealed_len, asked, MSG_DONTWAIT);
        const ReadResult r = read_result(
            c, n, c->in_payload || c->rx_len != c->rx_pos || c->rx_sealed_len != c->rx_sealed_pos);
        if (r == ReadResult::retry) continue;
        if (r == ReadResult::drained) break;
        if (r == ReadResult::closed) return;
        c->rx_sealed_len += std::size_t(n);
        if (!open_records(c)) return;
        if (std::size_t(n) < asked) break;
    }
    if (c->state == Conn::State::open && !c->sendq.empty()) flush(c);
}

}  // namespace talaria::na::tcp
