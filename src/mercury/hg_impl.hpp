// What the HG and bulk functions of Mercury's C API share: the class, context and address
// objects (hg.cpp says how they work).
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mercury_types.h"
#include "talaria/api/engine.hpp"
#include "talaria/bulk/bulk.hpp"
#include "talaria/core/core.hpp"

namespace talaria::mercury {

namespace tc = talaria::core;
namespace tna = talaria::na;
using talaria::Errc;

struct Proc {
    hg_id_t id = 0;
    /// Registered by name (HG_Register_name): the name, and the core's id of it
    /// (core::rpc_id(name), what talaria::Engine::define and remote use), registered at the core
    /// beside `id`'s key when free (`alias_registered`), so that C++ callers reach this
    /// procedure; a forward sends `wire` (the core's id first, the Mercury id where the target
    /// answered that it has no procedure of the other).
    std::string name;
    talaria::core::RpcId alias = 0;
    bool alias_registered = false;
    std::atomic<talaria::core::RpcId> wire{0};
    hg_proc_cb_t in = nullptr;
    hg_proc_cb_t out = nullptr;
    hg_rpc_cb_t rpc = nullptr;
    void* data = nullptr;
    void (*data_free)(void*) = nullptr;
    bool no_response = false;
    ~Proc() {
        if (data_free) data_free(data);
    }
};

using Key = std::pair<tc::RpcId, uint16_t>;

inline bool key_of(hg_id_t id, Key& k) {
    tc::RpcId rpc;
    uint16_t provider = 0;
    if ((id >> 32) == 0) {
        rpc = tc::RpcId(id);
    } else if ((id & 0xFFFF0000ull) == 0) {
        rpc = tc::RpcId(id >> 32);
        provider = uint16_t(id);
    } else {
        return false;
    }
    if (rpc == 0 || rpc >= 0xFFFFFF00u) rpc ^= 0x80000001u;  // as core::rpc_id keeps clear
    k = {rpc, provider};
    return true;
}

inline hg_return_t to_hg(Errc e) noexcept {
    switch (e) {
        case Errc::ok:
            return HG_SUCCESS;
        case Errc::again:
            return HG_AGAIN;
        case Errc::timeout:
            return HG_TIMEOUT;
        case Errc::canceled:
            return HG_CANCELED;
        case Errc::disconnected:
            return HG_HOSTUNREACH;
        case Errc::invalid_argument:
            return HG_INVALID_ARG;
        case Errc::out_of_range:
            return HG_OVERFLOW;
        case Errc::access_denied:
            return HG_ACCESS;
        case Errc::permission_denied:
            return HG_PERMISSION;
        case Errc::no_memory:
            return HG_NOMEM;
        case Errc::not_supported:
            return HG_OPNOTSUPPORTED;
        case Errc::address_in_use:
            return HG_ADDRINUSE;
        case Errc::address_invalid:
            return HG_ADDRNOTAVAIL;
        case Errc::unreachable:
            return HG_HOSTUNREACH;
        case Errc::protocol_error:
            return HG_PROTOCOL_ERROR;
        case Errc::message_too_large:
            return HG_MSGSIZE;
        case Errc::busy:
            return HG_BUSY;
        case Errc::not_found:
            return HG_NOENTRY;
        case Errc::already_exists:
            return HG_EXIST;
        case Errc::io_error:
            return HG_IO_ERROR;
        case Errc::shutdown:
            return HG_CANCELED;
        case Errc::internal:
            return HG_OTHER_ERROR;
        case Errc::invalid_state:
            return HG_PERMISSION;
    }
    return HG_OTHER_ERROR;
}

/// The peer of a handle: the origin of a request a target handle holds, the address an origin
/// handle forwards to; null when it has none.
const na::Addr* peer_of(hg_handle_t h) noexcept;

}  // namespace talaria::mercury

struct hg_addr {
    hg_class_t* cls = nullptr;
    talaria::na::Addr a;
};

struct hg_class {
    // The class is a talaria::Engine in manual progress (what talaria::mercury::engine gives
    // the program), whose waiting threads progress the HG contexts as HG_Progress does; `eng`
    // is its core engine, what the HG functions use.
    std::unique_ptr<talaria::Engine> api;
    talaria::core::Engine* eng = nullptr;
    na_class_t* na = nullptr;  // the program's NA class the engine borrows, or null
    std::string class_name;
    std::string protocol;
    void* data = nullptr;  // HG_Class_set_data
    void (*data_free)(void*) = nullptr;
    hg_return_t (*create_cb)(hg_handle_t, void*) = nullptr;  // set_handle_create_callback
    void* create_arg = nullptr;
    bool listen = false;
    // Busy mode (hg_init_info.na_init_info.progress_mode has NA_NO_BLOCK, or the NA class's
    // does): progress polls instead of sleeping in the kernel, and there is no wait fd.
    bool busy = false;
    std::mutex mu;  // procs, contexts
    std::map<talaria::mercury::Key, std::shared_ptr<talaria::mercury::Proc>> procs;
    std::vector<hg_context_t*> contexts;
    std::atomic<int> live{0};  // contexts, addresses, handles

    std::shared_ptr<talaria::mercury::Proc> find(hg_id_t id) {
        talaria::mercury::Key k;
        if (!talaria::mercury::key_of(id, k)) return nullptr;
        std::lock_guard g(mu);
        auto it = procs.find(k);
        return it != procs.end() && it->second->id == id ? it->second : nullptr;
    }
};

struct hg_context {
    hg_class_t* cls = nullptr;
    talaria::core::Context* ctx = nullptr;
    talaria::na::Context* na = nullptr;            // ctx's na context (its completion queue)
    std::unique_ptr<talaria::bulk::Context> bulk;  // its transfers (HG_Bulk_transfer)
    uint8_t id = 0;
    std::atomic<int> handles{0};
    void* data = nullptr;  // HG_Context_set_data
    void (*data_free)(void*) = nullptr;
    // Several threads may progress and trigger one context (Mercury allows it; the core's
    // context is progressed by one thread at a time): one progresses while the others wait for
    // it (progress_mu), triggers are one at a time (trigger_mu), and a trigger with nothing to
    // run waits for the progressing thread's next return (cv; cv_waiters counts the threads
    // that may be in it, so that a lone busy-polling thread does not signal it every poll).
    std::mutex progress_mu;
    std::mutex trigger_mu;
    std::mutex cv_mu;
    std::condition_variable cv;
    std::atomic<int> cv_waiters{0};
    // Handles whose last reference went, kept for the next HG_Create or request with their
    // buffers and procs (at most kHandlePool; hg.cpp): a call allocates no handle. Any thread
    // releases, so under pool_mu; freed by HG_Context_destroy.
    std::mutex pool_mu;
    std::vector<hg_handle_t> pool;
};
