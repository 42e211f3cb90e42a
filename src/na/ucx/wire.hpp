// The ucx transport's wire format (docs/protocol.md (ucx)): the 24-byte header every active
// message carries, the hello and located payloads, the serialized address and the serialized
// memory handle.
// Everything here is pure (no UCX, no I/O, no allocation) so that fuzz/fuzz_ucx_wire.cpp can
// drive the decoders with arbitrary bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "talaria/util/result.hpp"

namespace talaria::na::ucx {

/// 2: per-context workers (the header names the sending context; hello carries the sending
/// worker's address; locate/located). 3: put/get served by the target (rma_*).
inline constexpr uint8_t kWireVersion = 3;
/// The one UCP active-message id this transport registers (hello and both message kinds).
inline constexpr unsigned kAmId = 0x54;
inline constexpr std::size_t kMsgHeaderSize = 24;
/// Largest message payload (unexpected and expected): max_*_size() of the transport.
inline constexpr std::size_t kMaxMessageSize = 64 * 1024;
/// Longest address string: a hex-packed UCP worker address with shared-memory, tcp and IB
/// transports is a few hundred bytes to about 2 KiB.
inline constexpr std::size_t kMaxAddrString = 8192;
/// Longest packed UCP worker address carried in a hello or a located answer.
inline constexpr std::size_t kMaxWorkerAddr = kMaxAddrString / 2;
/// Longest packed remote key carried in a memory handle.
inline constexpr std::size_t kMaxRkeySize = 4096;

enum class MsgKind : uint8_t {
    hello = 1,       ///< first message on every endpoint, from each side: who the sender is
    unexpected = 2,  ///< unexpected message for context `context_id`
    expected = 3,    ///< expected message, matched on (source, tag)
    bye = 4,         ///< the sender's transport is closing: fail what waits for it
    locate = 5,      ///< which of your workers serves context `context_id`? (tag: a token)
    located = 6,     ///< answer to locate: the worker serving context `context_id` (same tag)
    // Put and get served by the target (docs/protocol.md, ucx served RMA): the payload starts
    // with an RmaHeader (kRmaHeaderSize bytes), followed by the data for rma_put and rma_data.
    rma_put = 7,    ///< write the data at `address` of registration `key` (at most kRmaChunk)
    rma_get = 8,    ///< read `length` bytes at `address` of registration `key`
    rma_ack = 9,    ///< answer to rma_put: its status (same cookie, address and length)
    rma_data = 10,  ///< answer to rma_get: its status, and the bytes when it is ok
};

struct MsgHeader {
    MsgKind kind = MsgKind::hello;
    /// Messages: the destination context; hello: the context whose worker the endpoint reaches;
    /// locate/located: the context asked about.
    uint8_t context_id = 0;
    /// The sender's context (its worker): with `instance`, names the sender's stream.
    uint8_t source_ctx = 0;
    uint32_t tag = 0;
    uint64_t instance = 0;  ///< the sender's random instance id (its hello maps it to an address)
    /// Messages and byes (not hellos): position in the sender's stream to this receiver, from 0.
    /// UCP does not keep active messages in order (it reorders those sent while an endpoint is
    /// still being wired up), so the receiver restores the order.
    uint32_t seq = 0;
    /// The sender's endpoint the message goes on (its id, unique in the sender's transport):
    /// each endpoint is one stream, which its hello starts.
    uint32_t stream = 0;
};

/// The start of a served put or get's payload: which registration and where, the origin's
/// cookie (echoed in the answer: it names the transfer and its window slot), and in answers the
/// target's verdict. Layout: u64 key, u64 address, u64 cookie, u32 length, u8
/// status (an Errc; 0 in requests), 3 reserved zero bytes.
struct RmaHeader {
    uint64_t key = 0;
    uint64_t address = 0;
    uint64_t cookie = 0;
    uint32_t length = 0;
    uint8_t status = 0;
};
inline constexpr std::size_t kRmaHeaderSize = 32;
/// Bytes per served put or get request, and requests of one transfer in flight at most.
inline constexpr std::size_t kRmaChunk = 256 * 1024;
inline constexpr std::size_t kRmaWindow = 8;
/// True for the kinds whose payload starts with an RmaHeader.
inline constexpr bool is_rma_kind(MsgKind k) noexcept {
    return k == MsgKind::rma_put || k == MsgKind::rma_get || k == MsgKind::rma_ack ||
           k == MsgKind::rma_data;
}
void encode_rma_header(const RmaHeader& r, std::byte* out) noexcept;
/// Decode exactly kRmaHeaderSize bytes: length at most kRmaChunk, status a known Errc (0 in
/// requests: `is_request`), reserved bytes zero; protocol_error otherwise.
Result<RmaHeader> decode_rma_header(std::span<const std::byte> in, bool is_request);

namespace detail {
inline void store_le(std::byte* p, uint64_t v, int n) noexcept {
    for (int i = 0; i < n; ++i)
        p[i] = std::byte(uint8_t(v >> (8 * i)));
}
inline uint64_t load_le(const std::byte* p, int n) noexcept {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v |= uint64_t(uint8_t(p[i])) << (8 * i);
    return v;
}
}  // namespace detail

/// Write `h` into out[0..kMsgHeaderSize).
inline void encode_msg_header(const MsgHeader& h, std::byte* out) noexcept {
    out[0] = std::byte(kWireVersion);
    out[1] = std::byte(uint8_t(h.kind));
    out[2] = std::byte(h.context_id);
    out[3] = std::byte(h.source_ctx);
    detail::store_le(out + 4, h.tag, 4);
    detail::store_le(out + 8, h.instance, 8);
    detail::store_le(out + 16, h.seq, 4);
    detail::store_le(out + 20, h.stream, 4);
}
/// Decode and validate an AM header (exactly kMsgHeaderSize bytes): version, kind, nonzero
/// instance. protocol_error otherwise.
Result<MsgHeader> decode_msg_header(std::span<const std::byte> in);

/// Hello payload: u16 address length, the sender's canonical address string ("ucx+tcp://
/// 127.0.0.1:5000", "ucx+tcp://~<instance>" for a client that does not listen, "ucx+sm://<hex
/// worker address>"), u16 worker address length, the packed address of the sending context's
/// UCP worker (how the receiver reaches that context: it connects back to it).
struct Hello {
    std::string_view address;
    std::span<const std::byte> worker;
    /// kHelloProcess: the sender's pid and pid namespace (the inode of /proc/self/ns/pid).
    uint32_t pid = 0;
    uint32_t pidns = 0;
    /// Signed hellos (kHelloSigned): the payload before the tail, the session id, the MAC.
    std::span<const std::byte> body;
    uint64_t session = 0;
    std::span<const std::byte> mac;
};
/// The process part of a hello (kHelloProcess): u32 pid, u32 pid namespace, after the worker
/// address and before the authentication tail.
inline constexpr std::size_t kHelloProcessSize = 8;
inline std::size_t hello_size(std::string_view address, std::size_t worker_len,
                              bool process = false) noexcept {
    return 4 + address.size() + worker_len + (process ? kHelloProcessSize : 0);
}
/// With a nonzero `pidns`, the process part too (then the header's tag has kHelloProcess).
void encode_hello(std::string_view address, std::span<const std::byte> worker, std::byte* out,
                  uint32_t pid = 0, uint32_t pidns = 0) noexcept;
/// The hello a payload carries (views `in`), with its process part when `has_process`
/// (kHelloProcess) and its authentication tail when `is_signed` (kHelloSigned);
/// protocol_error if malformed, either part empty or over its limit (kMaxAddrString,
/// kMaxWorkerAddr), or a process part of pid or namespace 0.
Result<Hello> decode_hello(std::span<const std::byte> in, bool is_signed = false,
                           bool has_process = false);

/// Hello flags (in the header's tag): the sending context takes unexpected messages; the
/// payload ends in an authentication tail (Options::auth): u64 the session's id, then the
/// HMAC-SHA256 under the session's key of the encoded header, the payload before the tail, and
/// the session id (docs/protocol.md, ucx hello).
inline constexpr uint32_t kHelloTakesUnexpected = 1;
inline constexpr uint32_t kHelloSigned = 2;
/// The payload has the process part (ucx+sm): the receiver watches that process's end
/// (process_gone), which UCX's keepalive misses while the process is an unreaped zombie.
inline constexpr uint32_t kHelloProcess = 4;
inline constexpr std::size_t kHelloTailSize = 8 + 32;

/// Locate payload: u8 kind: 0 where the context's unexpected messages go, 1 where its expected
/// messages go (they differ when it takes no unexpected messages, or does not exist).
inline constexpr std::size_t kLocateSize = 1;
/// The kind a locate payload asks about (true: unexpected); protocol_error if malformed.
Result<bool> decode_locate(std::span<const std::byte> in);

/// Located payload: u8 the answering side's context (worker) that serves the context asked
/// about, u8 the kind asked about (as in locate), u16 worker address length, the packed worker
/// address.
struct Located {
    uint8_t lane = 0;
    bool unexpected = true;
    std::span<const std::byte> worker;
};
inline std::size_t located_size(std::size_t worker_len) noexcept {
    return 4 + worker_len;
}
void encode_located(const Located& l, std::byte* out) noexcept;
Result<Located> decode_located(std::span<const std::byte> in);

/// Bootstrap (sockaddr mode, "ucx+tcp://host:port"): the port is a plain TCP socket of this
/// transport, never UCX's own listener (UCX 1.13's socket connection manager aborts the process
/// on foreign bytes). A client connects, sends a request, reads the answer, which names the
/// server's context-0 worker, and closes; it then reaches that worker by its address and says
/// hello as in worker mode. With Options::auth the server challenges the request first and the
/// client responds (docs/protocol.md, ucx bootstrap).
/// Every frame, both ways: u32 kBootMagic, u8 kBootVersion, u8 kind, u16 body length, u64 the
/// sender's instance (nonzero), then the body:
///   request   (client): empty, or u8 key id length (1..255), key id, the client's nonce (32)
///   challenge (server): the server's nonce (32), its proof (32)
///   response  (client): its proof (32)
///   answer    (server): the packed worker address of its context 0 (1..kMaxWorkerAddr)
///   refused   (server): why, in printable ASCII (1..kBootMaxReason)
inline constexpr uint32_t kBootMagic = 0x42554c54u;  // "TLUB"
inline constexpr uint8_t kBootVersion = 2;
inline constexpr std::size_t kBootFixedSize = 16;
inline constexpr std::size_t kBootNonceSize = 32;
inline constexpr std::size_t kBootProofSize = 32;
inline constexpr std::size_t kBootMaxReason = 255;
/// Largest request body: a key id of 255 bytes and a nonce.
inline constexpr std::size_t kBootMaxRequestBody = 1 + 255 + kBootNonceSize;
enum class BootKind : uint8_t { request = 1, challenge = 2, response = 3, answer = 4, refused = 5 };
struct BootFixed {
    BootKind kind = BootKind::request;
    std::size_t length = 0;  ///< of the body that follows
    uint64_t instance = 0;
};
void encode_boot_fixed(const BootFixed& f, std::byte* out) noexcept;
/// A frame's fixed part (exactly kBootFixedSize bytes): magic, version, a known kind whose body
/// length is within that kind's bounds, nonzero instance; protocol_error otherwise.
Result<BootFixed> decode_boot_fixed(std::span<const std::byte> fixed);
/// A request's authentication part: empty key id when the client does not authenticate.
struct BootRequest {
    std::string_view key_id;
    std::span<const std::byte> nonce;  ///< kBootNonceSize bytes, or empty
};
inline std::size_t boot_request_body_size(std::string_view key_id) noexcept {
    return key_id.empty() ? 0 : 1 + key_id.size() + kBootNonceSize;
}
/// Writes the body (nothing for an empty key id); `nonce` has kBootNonceSize bytes.
void encode_boot_request_body(std::string_view key_id, std::span<const std::byte> nonce,
                              std::byte* out) noexcept;
Result<BootRequest> decode_boot_request_body(std::span<const std::byte> body);
/// A refusal's reason (views `body`); protocol_error unless printable ASCII.
Result<std::string_view> decode_boot_refused(std::span<const std::byte> body);

/// Serialized address: u16 length, then the address string (as for tcp).
Result<std::string_view> decode_addr_blob(std::span<const std::byte> in);

/// Serialized memory handle: what the origin checks locally, the packed UCP remote key (or, for
/// a region its owner serves itself, the registration's key and no remote key), the owner's
/// address, and (ucx+sm only) the owner's process id and pid namespace, with which an
/// origin on the same host copies with process_vm_readv/writev (UCX 1.13 runs ucp_put/get on
/// user memory as active-message emulation over shared memory: see docs/architecture.md).
struct MemBlob {
    uint64_t base = 0;
    uint64_t length = 0;
    uint8_t access = 0;
    uint32_t pid = 0;    ///< owner's process id; 0: no direct copy
    uint32_t pidns = 0;  ///< owner's pid namespace (inode of /proc/self/ns/pid); 0 with pid 0
    /// Served regions (no rkey): the owner's key for rma_put/rma_get; 0 otherwise.
    uint64_t key = 0;
    std::span<const std::byte> rkey;  ///< packed rkey (views the input when decoded)
    std::string_view owner;           ///< owner's address string (views the input when decoded)
};
inline constexpr uint32_t kMemMagic = 0x55524c54u;  // "TLRU"
/// 3: u64 key at offset 40 (served regions).
inline constexpr uint8_t kMemVersion = 3;
inline constexpr std::size_t kMemBlobFixedSize = 48;
inline std::size_t mem_blob_size(std::size_t rkey_len, std::size_t owner_len) noexcept {
    return kMemBlobFixedSize + rkey_len + owner_len;
}
void encode_mem_blob(const MemBlob& m, std::byte* out) noexcept;
Result<MemBlob> decode_mem_blob(std::span<const std::byte> in);

/// True if `s` is a non-empty, even-length string of lower-case hex digits.
bool is_hex(std::string_view s) noexcept;

}  // namespace talaria::na::ucx
