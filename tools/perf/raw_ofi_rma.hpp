// talaria-perf: the raw libfabric RMA bandwidth baseline (there is no fabtests package with
// fi_rma_bw here). `talaria-perf raw-ofi-rma` (a hidden subcommand) is spawned twice, server
// and client, like fi_pingpong: the server registers a buffer and serves (progresses its
// completion queue) until the client hangs up; the client reads (fi_read) or writes
// (fi_write) `size` bytes of it `iters` times with `inflight` operations in flight, from a
// registered buffer of its own, and prints one line with the elapsed time (see ext_parse.hpp).
// Endpoint names, buffer address and key go over an out-of-band TCP connection (RmaHello).
// Only built with libfabric (TALARIA_HAVE_OFI).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace talaria::perf {

struct RawOfiRmaOptions {
    bool server = false;
    std::string provider;  ///< libfabric provider name as fi_getinfo takes it ("tcp;ofi_rxm")
    std::string node;      ///< local address to open the endpoint on ("" for shm)
    std::string host = "127.0.0.1";  ///< client: where the server's OOB socket listens
    uint16_t port = 0;               ///< OOB TCP port
    bool write = false;              ///< fi_write (put) instead of fi_read (get)
    std::size_t size = 0;
    unsigned inflight = 1;
    uint64_t iters = 1;
    uint64_t warmup = 1;
    unsigned timeout_s = 60;  ///< give up (exit 1) after this long
};

/// The process exit code (0 = ok; errors are printed on stderr, naming the libfabric call,
/// fi_strerror and the provider).
int run_raw_ofi_rma(const RawOfiRmaOptions& opt);

}  // namespace talaria::perf
