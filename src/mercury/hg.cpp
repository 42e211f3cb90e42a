// HG_*: Mercury's RPC C API over Talaria's core (include/talaria/mercury/mercury.h says what
// each function does).
//
// A class is a core::Engine; an HG context names one of its contexts; a handle is one call,
// origin or target side, reference counted (mercury.h). Ids map onto the core's (RpcId,
// provider): an id below 2^32 is the RpcId with provider 0, an id whose low 32 bits are a
// 16-bit provider is (id >> 32, provider); RpcIds the core reserves move as core::rpc_id moves
// them. The class keeps its registrations by that key, each with the exact 64-bit id, so that
// a handler's HG_Get_info gives back the id the program registered.
//
// Target side: the core runs a handler in the context's trigger (so in HG_Trigger); it copies
// the input (the core's bytes are valid only during the handler) and moves the Request into a
// new handle, which the program's rpc callback owns. HG_Respond encodes and answers at once,
// and queues its callback on the context (na::Context::post), run by the next trigger.
// Origin side: HG_Forward encodes into the handle's buffer and calls core::Context::forward;
// the response is copied into the handle before the callback runs, in the core's trigger.
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "mercury.h"
#include "mercury/hg_impl.hpp"
#include "mercury/info.hpp"
#include "mercury/na_impl.hpp"
#include "mercury_proc.h"
#include "mercury_talaria.hpp"
#include "na.h"
#include "talaria/core/core.hpp"
#include "talaria/util/log.hpp"

namespace tc = talaria::core;
namespace tna = talaria::na;
using talaria::Errc;

namespace {

using namespace talaria::mercury;

/// djb2, as Mercury's HG_Register_name hashes a name.
hg_id_t djb2(const char* s) {
    uint32_t h = 5381;
    for (; *s; ++s)
        h = (h << 5) + h + uint8_t(*s);
    return h;
}

}  // namespace

namespace {
/// Where a handle encodes: storage that only grows, reused by every call (no allocation, no
/// clearing per call); `len` bytes of it are the encoding.
struct EncodeBuffer {
    std::unique_ptr<std::byte[]> p;
    std::size_t cap = 0;
    std::size_t len = 0;

    [[nodiscard]] std::size_t size() const noexcept { return len; }
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {p.get(), len}; }
    void clear() noexcept { len = 0; }
    /// At least `n` bytes of storage (the contents are not kept).
    bool reserve(std::size_t n) noexcept {
        if (cap >= n) return true;
        std::unique_ptr<std::byte[]> q(new (std::nothrow) std::byte[n]);
        if (!q) return false;
        p = std::move(q);
        cap = n;
        return true;
    }
};
}  // namespace

struct hg_handle {
    hg_info info{};
    hg_addr addr_obj;  // what info.addr points to (borrowed by the program)
    hg_context_t* ctx = nullptr;
    std::atomic<int> refs{1};
    std::shared_ptr<Proc> proc;
    void* data = nullptr;
    void (*data_free)(void*) = nullptr;
    uint8_t target_id = 0;
    // Target side.
    bool target = false;
    tc::Request req;
    std::vector<std::byte> input;
    // Origin side.
    std::atomic<bool> forwarding{false};
    hg_cb_t cb = nullptr;
    void* arg = nullptr;
    std::vector<std::byte> output;
    EncodeBuffer enc;   // the input (origin) or output (target) as encoded
    tc::CallId call{};  // the forward in flight (HG_Cancel)
    // The procs of this handle's encodes and decodes, made on first use and reset for each (no
    // allocation per call): one for each, as a target may read its input while it responds.
    hg_proc_t enc_proc = HG_PROC_NULL;
    hg_proc_t dec_proc = HG_PROC_NULL;

    ~hg_handle() {
        hg_proc_free(enc_proc);
        hg_proc_free(dec_proc);
        if (data_free) data_free(data);
    }
};

namespace {

/// How many released handles a context keeps for reuse.
constexpr std::size_t kHandlePool = 256;

hg_return_t release(hg_handle_t h) {
    if (h->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return HG_SUCCESS;
    hg_context_t* ctx = h->ctx;
    hg_class_t* cls = ctx->cls;
    // What the program and the call left goes now, as if the handle were freed; its buffers,
    // procs and capacity stay for the next use.
    if (h->data_free) h->data_free(h->data);
    h->data = nullptr;
    h->data_free = nullptr;
    h->req = tc::Request{};  // a request never answered is answered as a freed one is
    h->addr_obj.a.reset();
    h->proc.reset();
    h->target = false;
    h->target_id = 0;
    h->cb = nullptr;
    h->arg = nullptr;
    h->input.clear();
    h->output.clear();
    h->enc.clear();
    h->call = {};
    h->info = {};
    bool kept = false;
    {
        std::lock_guard g(ctx->pool_mu);
        if (ctx->pool.size() < kHandlePool) {
            ctx->pool.push_back(h);
            kept = true;
        }
    }
    if (!kept) delete h;
    ctx->handles.fetch_sub(1, std::memory_order_relaxed);
    cls->live.fetch_sub(1, std::memory_order_relaxed);
    return HG_SUCCESS;
}

hg_handle_t new_handle(hg_context_t* ctx, const tna::Addr& a, std::shared_ptr<Proc> proc) {
    hg_handle_t h = nullptr;
    {
        std::lock_guard g(ctx->pool_mu);
        if (!ctx->pool.empty()) {
            h = ctx->pool.back();
            ctx->pool.pop_back();
        }
    }
    if (h) {
        h->refs.store(1, std::memory_order_relaxed);
        h->forwarding.store(false, std::memory_order_relaxed);
    } else {
        h = new (std::nothrow) hg_handle;
        if (!h) return nullptr;
    }
    h->ctx = ctx;
    h->addr_obj.cls = ctx->cls;
    h->addr_obj.a = a;
    h->proc = std::move(proc);
    h->info.hg_class = ctx->cls;
    h->info.context = ctx;
    h->info.addr = &h->addr_obj;
    h->info.id = h->proc ? h->proc->id : 0;
    h->info.context_id = ctx->id;
    ctx->handles.fetch_add(1, std::memory_order_relaxed);
    ctx->cls->live.fetch_add(1, std::memory_order_relaxed);
    if (ctx->cls->create_cb) {
        const hg_return_t ret = ctx->cls->create_cb(h, ctx->cls->create_arg);
        if (ret != HG_SUCCESS)
            TALARIA_LOG(rpc, warn, "the handle create callback returned {}",
                        HG_Error_to_string(ret));
    }
    return h;
}

/// `*p` (made on first use) reset over `buf` for `op`.
hg_return_t proc_over(hg_class_t* cls, hg_proc_t* p, void* buf, hg_size_t size, hg_proc_op_t op) {
    if (*p == HG_PROC_NULL) {
        hg_return_t ret = hg_proc_create(cls, HG_NOHASH, p);
        if (ret != HG_SUCCESS) return ret;
    }
    return hg_proc_reset(*p, buf, size, op);
}

/// Encode `in` with `cb` into `h->enc` (grown as needed), with `h`'s encoding proc.
hg_return_t encode(hg_handle_t h, hg_proc_cb_t cb, void* in) {
    EncodeBuffer& out = h->enc;
    out.clear();
    if (!cb || !in) return HG_SUCCESS;
    if (!out.reserve(4096)) return HG_NOMEM;
    hg_return_t ret = proc_over(h->ctx->cls, &h->enc_proc, out.p.get(), out.cap, HG_ENCODE);
    if (ret != HG_SUCCESS) return ret;
    hg_proc_t p = h->enc_proc;
    ret = cb(p, in);
    if (ret != HG_SUCCESS) return ret;
    const hg_size_t used = hg_proc_get_size_used(p);
    if (void* extra = hg_proc_get_extra_buf(p)) {  // it outgrew the buffer: take the whole
        if (!out.reserve(used)) return HG_NOMEM;
        std::memcpy(out.p.get(), extra, used);
        (void)hg_proc_reset(p, out.p.get(), out.cap, HG_ENCODE);  // the extra buffer goes
    }
    out.len = used;
    return HG_SUCCESS;
}

/// Decode (or free) `out` from the bytes `h` received, with `h`'s decoding proc, which names
/// `h` (hg_proc_get_handle), whose peer is the owner of a bulk handle that carries none.
hg_return_t decode(hg_handle_t h, hg_proc_cb_t cb, std::vector<std::byte>& bytes, void* out,
                   hg_proc_op_t op) {
    if (!cb || !out) return HG_SUCCESS;
    static std::byte none{};  // never written: decoding reads, HG_FREE touches no bytes
    hg_return_t ret = proc_over(h->ctx->cls, &h->dec_proc, bytes.empty() ? &none : bytes.data(),
                                bytes.size(), op);
    if (ret != HG_SUCCESS) return ret;
    hg_proc_set_handle(h->dec_proc, h);
    return cb(h->dec_proc, out);
}

}  // namespace

const talaria::na::Addr* talaria::mercury::peer_of(hg_handle_t h) noexcept {
    if (!h) return nullptr;
    const tna::Addr& a = h->target ? h->req.source() : h->addr_obj.a;
    return a ? &a : nullptr;
}

namespace {

/// The core handler of `weak`'s procedure on `cls`: a new target handle for the request, given
/// to the program's rpc callback (in the context's trigger).
tc::Handler handler_of(hg_class_t* cls, std::weak_ptr<Proc> weak) {
    return [cls, weak](tc::Request& req) {
        auto p = weak.lock();
        hg_context_t* ctx = nullptr;
        {
            std::lock_guard g(cls->mu);
            if (req.context().id() < cls->contexts.size()) ctx = cls->contexts[req.context().id()];
        }
        if (!p || !p->rpc || !ctx) {
            if (!req.one_way())
                (void)req.respond_error(Errc::not_found, p && p->rpc
                                                             ? "no HG context for this context id"
                                                             : "no RPC callback for this id here");
            return;
        }
        hg_handle_t h = new_handle(ctx, req.source(), p);
        if (!h) {
            if (!req.one_way()) (void)req.respond_error(Errc::no_memory, "no handle");
            return;
        }
        h->target = true;
        h->input.assign(req.input().begin(), req.input().end());  // before the move
        h->req = std::move(req);
        const hg_return_t ret = p->rpc(h);
        if (ret != HG_SUCCESS)
            TALARIA_LOG(rpc, warn, "the RPC callback of id 0x{:x} returned {}", p->id,
                        HG_Error_to_string(ret));
    };
}

/// Take `p`'s registrations off the core (its key's and its name's).
void deregister_core(hg_class_t* c, const Key& k, const Proc& p) {
    (void)c->eng->deregister_rpc(k.first, k.second);
    if (p.alias_registered) (void)c->eng->deregister_rpc(p.alias, 0);
}

/// HG_Register and HG_Register_name (`name` not null): the procedure under `id`'s key, and for
/// a name also under the core's id of the name where no other procedure has it (a C++ caller's
/// remote("name") sends that id).
hg_return_t register_proc(hg_class_t* c, hg_id_t id, const char* name, hg_proc_cb_t in_cb,
                          hg_proc_cb_t out_cb, hg_rpc_cb_t rpc_cb) {
    if (!c) return HG_INVALID_ARG;
    Key k;
    if (!key_of(id, k)) {
        TALARIA_LOG(rpc, error,
                    "HG_Register: id 0x{:016x} is neither below 2^32 nor an id << 32 with a "
                    "16-bit provider in its low bits",
                    id);
        return HG_INVALID_ARG;
    }
    auto proc = std::make_shared<Proc>();
    proc->id = id;
    proc->in = in_cb;
    proc->out = out_cb;
    proc->rpc = rpc_cb;
    if (name) {
        proc->name = name;
        proc->alias = tc::rpc_id(proc->name);
        if (proc->alias == k.first) proc->alias = 0;  // the same id already
    }
    proc->wire.store(proc->alias ? proc->alias : k.first, std::memory_order_relaxed);
    {
        std::lock_guard g(c->mu);
        if (auto it = c->procs.find(k); it != c->procs.end()) {
            if (it->second->id != id) return HG_EXIST;  // another id on the same key
            // Registered again: the callbacks are replaced, the data and response kept.
            proc->data = std::exchange(it->second->data, nullptr);
            proc->data_free = std::exchange(it->second->data_free, nullptr);
            proc->no_response = it->second->no_response;
            deregister_core(c, k, *it->second);
        }
        c->procs[k] = proc;
    }
    const std::string label = name ? proc->name : std::to_string(id);
    auto r = c->eng->register_rpc(k.first, label, handler_of(c, proc),
                                  tc::Registration{.provider = k.second});
    if (!r) {
        std::lock_guard g(c->mu);
        c->procs.erase(k);
        TALARIA_LOG(rpc, error, "HG_Register: {}", r.error().describe());
        return to_hg(r.code());
    }
    if (proc->alias) {
        // Where another procedure has the name's id, callers by name reach that one (its
        // registration was first); this one stays reachable by its Mercury id.
        auto a = c->eng->register_rpc(proc->alias, label, handler_of(c, proc));
        proc->alias_registered = a.has_value();
        if (!a)
            TALARIA_LOG(rpc, info,
                        "HG_Register_name(\"{}\"): reachable by its Mercury id 0x{:x} only, not "
                        "by the name's id from talaria::Engine: {}",
                        label, id, a.error().describe());
    }
    return HG_SUCCESS;
}

/// Send `h`'s encoded input to procedure `rpc` (its key's provider); the callback completes
/// the forward. For a procedure registered by name whose target has no procedure of the id
/// sent, a first send (`retry`) is sent once more with the other id (the Mercury id or the core's
/// id of the name), and the one that worked is what the procedure's later forwards send.
hg_return_t send_forward(hg_handle_t h, tc::RpcId rpc, bool retry) {
    Key k;
    key_of(h->proc->id, k);
    tc::CallOptions o;
    o.target_context = h->target_id;
    o.provider = k.second;
    o.one_way = h->proc->no_response;
    auto r = h->ctx->ctx->forward(
        h->addr_obj.a, rpc, h->enc.bytes(), o,
        [h, rpc, retry, first = k.first](talaria::Result<std::span<const std::byte>>&& res) {
            Proc& p = *h->proc;
            if (retry && !res && res.code() == Errc::not_found && p.alias != 0 &&
                res.error().message().starts_with(tc::kNoRpcMessage) &&
                send_forward(h, rpc == p.alias ? first : p.alias, false) == HG_SUCCESS)
                return;
            if (res && !retry) p.wire.store(rpc, std::memory_order_relaxed);
            hg_cb_info info{};
            info.info.forward.handle = h;
            info.arg = h->arg;
            info.type = HG_CB_FORWARD;
            if (res) {
                h->output.assign(res->begin(), res->end());
                info.ret = HG_SUCCESS;
            } else {
                h->output.clear();
                info.ret = to_hg(res.code());
                TALARIA_LOG(rpc, debug, "HG_Forward of id 0x{:x}: {}", p.id,
                            res.error().describe());
            }
            h->forwarding.store(false, std::memory_order_release);
            if (h->cb) h->cb(&info);
            release(h);
        });
    if (!r) {
        TALARIA_LOG(rpc, error, "HG_Forward: {}", r.error().describe());
        return to_hg(r.code());
    }
    h->call = *r;
    return HG_SUCCESS;
}

}  // namespace

extern "C" {

HG_PUBLIC hg_return_t HG_Version_get(unsigned int* major, unsigned int* minor,
                                     unsigned int* patch) {
    if (major) *major = HG_VERSION_MAJOR;
    if (minor) *minor = HG_VERSION_MINOR;
    if (patch) *patch = HG_VERSION_PATCH;
    return HG_SUCCESS;
}

HG_PUBLIC const char* HG_Error_to_string(hg_return_t errnum) {
#define X(a) #a,
    static const char* const kNames[] = {HG_RETURN_VALUES};
#undef X
    const auto i = static_cast<unsigned>(errnum);
    return i < sizeof kNames / sizeof kNames[0] - 1 ? kNames[i] : nullptr;
}

namespace {
// hg_init_info grew at its end: 2.2's layout (what HG_Init_opt is given, and HG_Init_opt2 when
// asked for a version below 2.3) ends with `stats` (88 bytes), 2.3's with `release_input_early`
// (96), 2.4's is the whole struct (112). A reader of an older layout must not read past its end:
// the caller allocated only that much.
static_assert(offsetof(hg_init_info, stats) == 86 && offsetof(hg_init_info, no_multi_recv) == 87 &&
              offsetof(hg_init_info, release_input_early) == 88 && sizeof(hg_init_info) == 112);

hg_return_t progress_once(hg_context_t* ctx, std::chrono::nanoseconds timeout);
unsigned trigger_once(hg_context_t* ctx, unsigned max);

/// Wake the threads waiting for `ctx`'s progressing thread to return (none, mostly: one
/// load). A waiter that counts itself in just after this look waits its bound (1 ms) at most.
void wake_waiters(hg_context_t* ctx) {
    if (ctx->cv_waiters.load(std::memory_order_seq_cst) != 0) ctx->cv.notify_all();
}

/// Wait until the progressing thread returns or `until`.
void wait_for_progress(hg_context_t* ctx, std::chrono::steady_clock::time_point until) {
    ctx->cv_waiters.fetch_add(1, std::memory_order_seq_cst);
    {
        std::unique_lock w(ctx->cv_mu);
        ctx->cv.wait_until(w, until);
    }
    ctx->cv_waiters.fetch_sub(1, std::memory_order_relaxed);
}

/// EngineOptions::drive of a class's talaria::Engine: progress and trigger context `id` as
/// HG_Progress and HG_Trigger do (beside other threads in them), or, where the program has
/// not made it an HG context, the core context itself (nobody else drives it then).
void drive_context(hg_class_t* c, uint8_t id, talaria::Duration d) {
    hg_context_t* ctx = nullptr;
    {
        std::lock_guard g(c->mu);
        if (id < c->contexts.size()) ctx = c->contexts[id];
    }
    if (ctx) {
        (void)progress_once(ctx, d);
        (void)trigger_once(ctx, UINT_MAX);
    } else if (id < c->eng->context_count()) {
        (void)c->eng->context(id).progress(d);
        c->eng->context(id).trigger();
    }
}

/// The caller's options in the layout of `version`, as 2.4.1's struct (zero where older
/// layouts have nothing).
hg_init_info init_info_of(const hg_init_info* in, unsigned version) {
    hg_init_info out{};
    if (!in) return out;
    if (version < HG_VERSION(2, 3)) {
        std::memcpy(&out, in, offsetof(hg_init_info, stats) + 1);
    } else if (version < HG_VERSION(2, 4)) {
        std::memcpy(&out, in, offsetof(hg_init_info, release_input_early) + 1);
    } else {
        out = *in;
    }
    return out;
}
}  // namespace

HG_PUBLIC hg_class_t* HG_Init_opt2(const char* info_string, uint8_t listen, unsigned int version,
                                   const struct hg_init_info* init_p) {
    const hg_init_info init_copy = init_info_of(init_p, version);
    const hg_init_info* init = init_p ? &init_copy : nullptr;
    // Over an NA class the info string is not used, and may be NULL (Mercury's test harness
    // passes NULL); without one it names the transport.
    if (!info_string && !(init && init->na_class)) {
        TALARIA_LOG(rpc, error,
                    "HG_Init: NULL info string (name a transport, e.g. \"na+sm\" or "
                    "\"ofi+tcp://127.0.0.1:0\", or pass hg_init_info.na_class)");
        return nullptr;
    }
    const char* shown = info_string ? info_string : "";  // for the log lines below
    const auto info = talaria::mercury::parse_info(shown);
    tc::Options o;
    o.na.listen = listen != 0;
    if (init && init->na_init_info.max_contexts > 1) {
        o.contexts = init->na_init_info.max_contexts;
        if (o.na.max_contexts < o.contexts) o.na.max_contexts = o.contexts;
    }
    // An NA class of the program's (Mercury's test harness opens one with NA_Initialize_opt2):
    // the engine borrows its transport, and the program finalizes it after HG_Finalize. Its
    // address and listen flag are the NA class's (the info string is not opened); the number
    // of contexts is still hg_init_info.na_init_info.max_contexts, at most the NA class's.
    na_class_t* na = init ? init->na_class : nullptr;
    if (na && !na->t) {
        TALARIA_LOG(rpc, error,
                    "HG_Init_opt2(\"{}\"): hg_init_info.na_class is not an open NA class (pass "
                    "what NA_Initialize returned, before NA_Finalize)",
                    shown);
        return nullptr;
    }
    auto* c = new (std::nothrow) hg_class;
    if (!c) return nullptr;
    talaria::EngineOptions eo;
    eo.progress = talaria::ProgressMode::manual;
    eo.contexts = static_cast<uint8_t>(o.contexts);
    eo.checksum = o.checksum;
    eo.core = o;
    // A thread waiting on a talaria::Engine future of this class progresses the context as
    // HG_Progress and HG_Trigger do, beside the program's own threads in them.
    eo.drive = [c](uint8_t id, talaria::Duration d) { drive_context(c, id, d); };
    auto e = na ? talaria::Engine::open(*na->t, eo)
                : talaria::Engine::open(info.address, listen != 0, eo);
    if (!e) {
        TALARIA_LOG(rpc, error, "HG_Init(\"{}\"): {}", shown, e.error().describe());
        delete c;
        return nullptr;
    }
    c->api = std::make_unique<talaria::Engine>(std::move(*e));
    c->eng = &c->api->core();
    c->na = na;
    c->class_name = na ? na->class_name : info.class_name;
    c->protocol = na ? na->protocol : info.protocol;
    c->listen = na ? na->listen : listen != 0;
    c->busy = (init && (init->na_init_info.progress_mode & NA_NO_BLOCK)) || (na && na->busy);
    if (na) na->live.fetch_add(1);
    c->contexts.assign(c->eng->context_count(), nullptr);
    return c;
}

HG_PUBLIC hg_class_t* HG_Init_opt(const char* info_string, uint8_t listen,
                                  const struct hg_init_info* init) {
    // As Mercury's: HG_Init_opt predates the versioned struct and reads the 2.2 layout.
    return HG_Init_opt2(info_string, listen, HG_VERSION(2, 2), init);
}

HG_PUBLIC hg_class_t* HG_Init(const char* info_string, uint8_t listen) {
    return HG_Init_opt2(info_string, listen, HG_VERSION(2, 4), nullptr);
}

HG_PUBLIC hg_return_t HG_Finalize(hg_class_t* c) {
    if (!c) return HG_SUCCESS;
    if (int n = c->live.load(); n != 0) {
        TALARIA_LOG(rpc, error,
                    "HG_Finalize: {} context(s), address(es) or handle(s) of this class are "
                    "still live: destroy and free them first",
                    n);
        return HG_BUSY;
    }
    c->api.reset();  // fails what is still in flight (its callbacks run here), then closes
    c->eng = nullptr;
    if (c->data_free) c->data_free(c->data);
    na_class_t* na = c->na;
    delete c;  // closes the engine (and with it, its contexts on a borrowed transport)
    if (na) na->live.fetch_sub(1);
    return HG_SUCCESS;
}

HG_PUBLIC void HG_Cleanup(void) {}

HG_PUBLIC hg_return_t HG_Get_na_protocol_info(const char* info_string,
                                              struct na_protocol_info** info_p) {
    return hg_return_t(NA_Get_protocol_info(info_string, info_p));
}

HG_PUBLIC void HG_Free_na_protocol_info(struct na_protocol_info* info) {
    NA_Free_protocol_info(info);
}

HG_PUBLIC void HG_Set_log_level(const char* level) {
    if (!level) return;
    const std::string_view l(level);
    const char* ours = l == "none"        ? "rpc=off,bulk=off"
                       : l == "error"     ? "rpc=error,bulk=error"
                       : l == "warning"   ? "rpc=warn,bulk=warn"
                       : l == "min_debug" ? "rpc=info,bulk=info"
                       : l == "debug"     ? "rpc=debug,bulk=debug"
                                          : nullptr;
    if (ours) (void)talaria::log::configure(ours);
}

HG_PUBLIC void HG_Set_log_subsys(const char*) {
    TALARIA_LOG(rpc, info, "HG_Set_log_subsys is not supported: set TALARIA_LOG (e.g. rpc=debug)");
}

HG_PUBLIC void HG_Set_log_func(int (*)(FILE*, const char*, ...)) {
    TALARIA_LOG(rpc, info,
                "HG_Set_log_func is not supported: Talaria logs to stderr or to TALARIA_LOG_FILE");
}

HG_PUBLIC void HG_Set_log_stream(const char*, FILE*) {
    TALARIA_LOG(
        rpc, info,
        "HG_Set_log_stream is not supported: Talaria logs to stderr or to TALARIA_LOG_FILE");
}

HG_PUBLIC void HG_Diag_dump_counters(void) {
    TALARIA_LOG(rpc, info,
                "HG_Diag_dump_counters is not supported (Talaria keeps no "
                "process-wide counters): use HG_Class_get_counters");
}

HG_PUBLIC const char* HG_Class_get_name(const hg_class_t* c) {
    return c ? c->class_name.c_str() : nullptr;
}

HG_PUBLIC const char* HG_Class_get_protocol(const hg_class_t* c) {
    return c ? c->protocol.c_str() : nullptr;
}

HG_PUBLIC hg_size_t HG_Class_get_input_eager_size(const hg_class_t* c) {
    return c ? c->eng->eager_size() : 0;
}

HG_PUBLIC hg_size_t HG_Class_get_output_eager_size(const hg_class_t* c) {
    return c ? c->eng->eager_size() : 0;
}

static hg_return_t set_offset(hg_class_t* c, hg_size_t offset, const char* what) {
    if (!c) return HG_INVALID_ARG;
    if (offset == 0) return HG_SUCCESS;
    TALARIA_LOG(rpc, error,
                "{}({}): a header reserved before the payload is not supported by Talaria yet",
                what, offset);
    return HG_OPNOTSUPPORTED;
}

HG_PUBLIC hg_return_t HG_Class_set_input_offset(hg_class_t* c, hg_size_t offset) {
    return set_offset(c, offset, "HG_Class_set_input_offset");
}

HG_PUBLIC hg_return_t HG_Class_set_output_offset(hg_class_t* c, hg_size_t offset) {
    return set_offset(c, offset, "HG_Class_set_output_offset");
}

HG_PUBLIC hg_return_t HG_Class_set_data(hg_class_t* c, void* data, void (*free_cb)(void*)) {
    if (!c) return HG_INVALID_ARG;
    if (c->data_free && c->data != data) c->data_free(c->data);
    c->data = data;
    c->data_free = free_cb;
    return HG_SUCCESS;
}

HG_PUBLIC void* HG_Class_get_data(const hg_class_t* c) {
    return c ? c->data : nullptr;
}

HG_PUBLIC hg_return_t HG_Class_set_handle_create_callback(hg_class_t* c,
                                                          hg_return_t (*cb)(hg_handle_t, void*),
                                                          void* arg) {
    if (!c) return HG_INVALID_ARG;
    c->create_cb = cb;
    c->create_arg = arg;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Context_set_data(hg_context_t* ctx, void* data, void (*free_cb)(void*)) {
    if (!ctx) return HG_INVALID_ARG;
    if (ctx->data_free && ctx->data != data) ctx->data_free(ctx->data);
    ctx->data = data;
    ctx->data_free = free_cb;
    return HG_SUCCESS;
}

HG_PUBLIC void* HG_Context_get_data(const hg_context_t* ctx) {
    return ctx ? ctx->data : nullptr;
}

HG_PUBLIC hg_return_t HG_Context_unpost(hg_context_t* ctx) {
    return ctx ? HG_SUCCESS : HG_INVALID_ARG;
}

HG_PUBLIC bool HG_Class_is_listening(const hg_class_t* c) {
    return c && c->listen;
}

HG_PUBLIC hg_context_t* HG_Context_create_id(hg_class_t* c, uint8_t id) {
    if (!c) return nullptr;
    std::lock_guard g(c->mu);
    if (id >= c->contexts.size()) {
        TALARIA_LOG(rpc, error,
                    "HG_Context_create_id({}): the class has {} context(s); ask for more with "
                    "hg_init_info.na_init_info.max_contexts",
                    id, c->contexts.size());
        return nullptr;
    }
    if (c->contexts[id]) {
        TALARIA_LOG(rpc, error, "HG_Context_create_id({}): that context exists already", id);
        return nullptr;
    }
    auto* ctx = new (std::nothrow) hg_context;
    if (!ctx) return nullptr;
    ctx->cls = c;
    ctx->ctx = &c->eng->context(id);
    ctx->id = id;
    ctx->na = &ctx->ctx->na_context();
    ctx->bulk = std::make_unique<talaria::bulk::Context>(*ctx->na);
    c->contexts[id] = ctx;
    c->live.fetch_add(1, std::memory_order_relaxed);
    return ctx;
}

HG_PUBLIC hg_context_t* HG_Context_create(hg_class_t* c) {
    return HG_Context_create_id(c, 0);
}

namespace {
/// How long HG_Progress polls in blocking mode before it sleeps in the transport (what a
/// talaria::Engine's progress threads poll in WaitMode::block).
constexpr std::chrono::microseconds kBlockSpin{50};
/// How long HG_Context_destroy progresses a context whose handles are still live, as
/// Mercury's (HG_CORE_CLEANUP_TIMEOUT).
constexpr std::chrono::seconds kCleanupTimeout{5};
}  // namespace

HG_PUBLIC hg_return_t HG_Context_destroy(hg_context_t* ctx) {
    if (!ctx) return HG_SUCCESS;
    // As Mercury's: while handles of it are live or its transfers run, progress and trigger it
    // (up to kCleanupTimeout), so that callbacks still queued (a respond's, a forward's) run and
    // release their handles; the program's own handles keep it busy.
    for (const auto deadline = std::chrono::steady_clock::now() + kCleanupTimeout;
         (ctx->handles.load() != 0 || ctx->bulk->in_flight() != 0) &&
         std::chrono::steady_clock::now() < deadline;) {
        if (trigger_once(ctx, 64) != 0) continue;
        (void)progress_once(ctx, std::chrono::milliseconds(1));
    }
    if (int n = ctx->handles.load(); n != 0) {
        TALARIA_LOG(rpc, error, "HG_Context_destroy: {} handle(s) of it are still live", n);
        return HG_BUSY;
    }
    if (std::size_t n = ctx->bulk->in_flight(); n != 0) {
        TALARIA_LOG(rpc, error, "HG_Context_destroy: {} bulk transfer(s) of it are in flight", n);
        return HG_BUSY;
    }
    hg_class_t* c = ctx->cls;
    {
        std::lock_guard g(c->mu);
        c->contexts[ctx->id] = nullptr;
    }
    for (hg_handle_t h : ctx->pool)
        delete h;
    ctx->pool.clear();
    if (ctx->data_free) ctx->data_free(ctx->data);
    delete ctx;
    c->live.fetch_sub(1, std::memory_order_relaxed);
    return HG_SUCCESS;
}

HG_PUBLIC hg_class_t* HG_Context_get_class(const hg_context_t* ctx) {
    return ctx ? ctx->cls : nullptr;
}

HG_PUBLIC uint8_t HG_Context_get_id(const hg_context_t* ctx) {
    return ctx ? ctx->id : 0;
}

HG_PUBLIC hg_return_t HG_Register(hg_class_t* c, hg_id_t id, hg_proc_cb_t in_cb,
                                  hg_proc_cb_t out_cb, hg_rpc_cb_t rpc_cb) {
    return register_proc(c, id, nullptr, in_cb, out_cb, rpc_cb);
}

HG_PUBLIC hg_id_t HG_Register_name(hg_class_t* c, const char* name, hg_proc_cb_t in_cb,
                                   hg_proc_cb_t out_cb, hg_rpc_cb_t rpc_cb) {
    if (!c || !name) return 0;
    const hg_id_t id = djb2(name);
    return register_proc(c, id, name, in_cb, out_cb, rpc_cb) == HG_SUCCESS ? id : 0;
}

HG_PUBLIC hg_return_t HG_Registered(hg_class_t* c, hg_id_t id, uint8_t* flag_p) {
    if (!c || !flag_p) return HG_INVALID_ARG;
    *flag_p = c->find(id) != nullptr;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Registered_name(hg_class_t* c, const char* name, hg_id_t* id_p,
                                         uint8_t* flag_p) {
    if (!c || !name || !flag_p) return HG_INVALID_ARG;
    const hg_id_t id = djb2(name);
    if (id_p) *id_p = id;
    return HG_Registered(c, id, flag_p);
}

HG_PUBLIC hg_return_t HG_Registered_proc_cb(hg_class_t* c, hg_id_t id, uint8_t* flag_p,
                                            hg_proc_cb_t* in_p, hg_proc_cb_t* out_p) {
    if (!c || !flag_p) return HG_INVALID_ARG;
    auto p = c->find(id);
    *flag_p = p != nullptr;
    if (p && in_p) *in_p = p->in;
    if (p && out_p) *out_p = p->out;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Deregister(hg_class_t* c, hg_id_t id) {
    if (!c) return HG_INVALID_ARG;
    Key k;
    if (!key_of(id, k)) return HG_NOENTRY;
    {
        std::lock_guard g(c->mu);
        auto it = c->procs.find(k);
        if (it == c->procs.end() || it->second->id != id) return HG_NOENTRY;
        deregister_core(c, k, *it->second);
        c->procs.erase(it);
    }
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Register_data(hg_class_t* c, hg_id_t id, void* data,
                                       void (*free_cb)(void*)) {
    if (!c) return HG_INVALID_ARG;
    auto p = c->find(id);
    if (!p) return HG_NOENTRY;
    std::lock_guard g(c->mu);
    if (p->data_free && p->data != data) p->data_free(p->data);
    p->data = data;
    p->data_free = free_cb;
    return HG_SUCCESS;
}

HG_PUBLIC void* HG_Registered_data(hg_class_t* c, hg_id_t id) {
    if (!c) return nullptr;
    auto p = c->find(id);
    return p ? p->data : nullptr;
}

HG_PUBLIC hg_return_t HG_Registered_disable_response(hg_class_t* c, hg_id_t id, uint8_t disable) {
    if (!c) return HG_INVALID_ARG;
    auto p = c->find(id);
    if (!p) return HG_NOENTRY;
    p->no_response = disable != 0;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Registered_disabled_response(hg_class_t* c, hg_id_t id,
                                                      uint8_t* disabled_p) {
    if (!c || !disabled_p) return HG_INVALID_ARG;
    auto p = c->find(id);
    if (!p) return HG_NOENTRY;
    *disabled_p = p->no_response;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Addr_lookup2(hg_class_t* c, const char* name, hg_addr_t* addr_p) {
    if (!c || !name || !addr_p) return HG_INVALID_ARG;
    auto r = c->eng->lookup(talaria::mercury::talaria_string(name));
    if (!r) {
        TALARIA_LOG(rpc, error, "HG_Addr_lookup2(\"{}\"): {}", name, r.error().describe());
        return to_hg(r.code());
    }
    auto* a = new (std::nothrow) hg_addr;
    if (!a) return HG_NOMEM;
    a->cls = c;
    a->a = std::move(*r);
    c->live.fetch_add(1, std::memory_order_relaxed);
    *addr_p = a;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Addr_free(hg_class_t* c, hg_addr_t addr) {
    if (!addr) return HG_SUCCESS;
    if (!c || addr->cls != c) return HG_INVALID_ARG;
    delete addr;
    c->live.fetch_sub(1, std::memory_order_relaxed);
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Addr_self(hg_class_t* c, hg_addr_t* addr_p) {
    if (!c || !addr_p) return HG_INVALID_ARG;
    auto* a = new (std::nothrow) hg_addr;
    if (!a) return HG_NOMEM;
    a->cls = c;
    a->a = c->eng->self();
    c->live.fetch_add(1, std::memory_order_relaxed);
    *addr_p = a;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Addr_dup(hg_class_t* c, hg_addr_t addr, hg_addr_t* new_p) {
    if (!c || !addr || !new_p) return HG_INVALID_ARG;
    auto* a = new (std::nothrow) hg_addr;
    if (!a) return HG_NOMEM;
    a->cls = c;
    a->a = addr->a;
    c->live.fetch_add(1, std::memory_order_relaxed);
    *new_p = a;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Addr_set_remove(hg_class_t* c, hg_addr_t addr) {
    // Mercury drops the address from its cache so that a later lookup resolves the peer again
    // (a peer that died and came back). Talaria's transports already do that on their own: a
    // broken connection is made again on next use, and an sm peer replaced under its name is
    // found by its new owner (na::Addr::superseded). Nothing to close: the calls in flight to
    // the peer and its later lookups go on as they would.
    if (!c || !addr || !addr->a) return HG_INVALID_ARG;
    return HG_SUCCESS;
}

HG_PUBLIC uint8_t HG_Addr_cmp(hg_class_t*, hg_addr_t a1, hg_addr_t a2) {
    if (a1 == a2) return 1;
    return a1 && a2 && a1->a == a2->a;
}

HG_PUBLIC hg_return_t HG_Addr_to_string(hg_class_t* c, char* buf, hg_size_t* size_p,
                                        hg_addr_t addr) {
    if (!c || !size_p || !addr) return HG_INVALID_ARG;
    const std::string s = talaria::mercury::mercury_string(
        c->class_name, addr->a.impl()->transport()->addr_to_string(addr->a));
    const hg_size_t need = s.size() + 1;
    if (!buf) {
        *size_p = need;
        return HG_SUCCESS;
    }
    if (*size_p < need) {
        *size_p = need;
        return HG_OVERFLOW;
    }
    std::memcpy(buf, s.c_str(), need);
    *size_p = need;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Create(hg_context_t* ctx, hg_addr_t addr, hg_id_t id,
                                hg_handle_t* handle_p) {
    if (!ctx || !handle_p) return HG_INVALID_ARG;
    std::shared_ptr<Proc> p;
    if (id != 0) {
        p = ctx->cls->find(id);
        if (!p) {
            TALARIA_LOG(rpc, error, "HG_Create: id 0x{:x} is not registered on this class", id);
            return HG_NOENTRY;
        }
    }
    hg_handle_t h = new_handle(ctx, addr ? addr->a : tna::Addr{}, std::move(p));
    if (!h) return HG_NOMEM;
    *handle_p = h;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Destroy(hg_handle_t h) {
    return h ? release(h) : HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Ref_incr(hg_handle_t h) {
    if (!h) return HG_INVALID_ARG;
    h->refs.fetch_add(1, std::memory_order_relaxed);
    return HG_SUCCESS;
}

HG_PUBLIC const struct hg_info* HG_Get_info(hg_handle_t h) {
    return h ? &h->info : nullptr;
}

HG_PUBLIC int32_t HG_Ref_get(hg_handle_t h) {
    return h ? h->refs.load(std::memory_order_relaxed) : 0;
}

HG_PUBLIC hg_return_t HG_Get_input_buf(hg_handle_t h, void** buf_p, hg_size_t* size_p) {
    if (!h || !h->target || !buf_p || !size_p) return HG_INVALID_ARG;
    *buf_p = h->input.data();
    *size_p = h->input.size();
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Get_output_buf(hg_handle_t h, void** buf_p, hg_size_t* size_p) {
    if (!h || h->target || !buf_p || !size_p) return HG_INVALID_ARG;
    *buf_p = h->output.data();
    *size_p = h->output.size();
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Get_input_extra_buf(hg_handle_t h, void** buf_p, hg_size_t* size_p) {
    if (!h || !buf_p || !size_p) return HG_INVALID_ARG;
    *buf_p = nullptr;
    *size_p = 0;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Get_output_extra_buf(hg_handle_t h, void** buf_p, hg_size_t* size_p) {
    return HG_Get_input_extra_buf(h, buf_p, size_p);
}

HG_PUBLIC hg_return_t HG_Release_input_buf(hg_handle_t h) {
    if (!h || !h->target) return HG_INVALID_ARG;
    std::vector<std::byte>().swap(h->input);
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Set_data(hg_handle_t h, void* data, void (*free_cb)(void*)) {
    if (!h) return HG_INVALID_ARG;
    if (h->data_free && h->data != data) h->data_free(h->data);
    h->data = data;
    h->data_free = free_cb;
    return HG_SUCCESS;
}

HG_PUBLIC void* HG_Get_data(hg_handle_t h) {
    return h ? h->data : nullptr;
}

HG_PUBLIC hg_return_t HG_Set_target_id(hg_handle_t h, uint8_t id) {
    if (!h) return HG_INVALID_ARG;
    h->target_id = id;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Get_input(hg_handle_t h, void* in_struct) {
    if (!h || !in_struct || !h->target || !h->proc) return HG_INVALID_ARG;
    if (!h->proc->in) return HG_FAULT;  // as Mercury: no proc registered for the input
    hg_return_t ret = decode(h, h->proc->in, h->input, in_struct, HG_DECODE);
    if (ret == HG_SUCCESS) h->refs.fetch_add(1, std::memory_order_relaxed);  // until Free_input
    return ret;
}

HG_PUBLIC hg_return_t HG_Free_input(hg_handle_t h, void* in_struct) {
    if (!h || !in_struct || !h->proc || !h->proc->in) return HG_INVALID_ARG;
    hg_return_t ret = decode(h, h->proc->in, h->input, in_struct, HG_FREE);
    release(h);
    return ret;
}

// As Mercury's: the input's payload is what the origin encoded (HG_Forward) or the target
// received; the output's, what the target encoded (HG_Respond) or the origin received.
HG_PUBLIC hg_size_t HG_Get_input_payload_size(hg_handle_t h) {
    return !h ? 0 : h->target ? h->input.size() : h->enc.size();
}

HG_PUBLIC hg_return_t HG_Get_output(hg_handle_t h, void* out_struct) {
    if (!h || !out_struct || h->target || !h->proc) return HG_INVALID_ARG;
    if (!h->proc->out) return HG_FAULT;
    hg_return_t ret = decode(h, h->proc->out, h->output, out_struct, HG_DECODE);
    if (ret == HG_SUCCESS) h->refs.fetch_add(1, std::memory_order_relaxed);
    return ret;
}

HG_PUBLIC hg_return_t HG_Free_output(hg_handle_t h, void* out_struct) {
    if (!h || !out_struct || !h->proc || !h->proc->out) return HG_INVALID_ARG;
    hg_return_t ret = decode(h, h->proc->out, h->output, out_struct, HG_FREE);
    release(h);
    return ret;
}

HG_PUBLIC hg_size_t HG_Get_output_payload_size(hg_handle_t h) {
    return !h ? 0 : h->target ? h->enc.size() : h->output.size();
}

HG_PUBLIC hg_return_t HG_Forward(hg_handle_t h, hg_cb_t cb, void* arg, void* in_struct) {
    if (!h || h->target || !h->proc || !h->addr_obj.a) return HG_INVALID_ARG;
    bool idle = false;
    if (!h->forwarding.compare_exchange_strong(idle, true)) return HG_BUSY;
    hg_return_t ret = encode(h, h->proc->in, in_struct);
    if (ret != HG_SUCCESS) {
        h->forwarding.store(false);
        return ret;
    }
    h->cb = cb;
    h->arg = arg;
    h->refs.fetch_add(1, std::memory_order_relaxed);  // until the callback returns
    ret = send_forward(h, h->proc->wire.load(std::memory_order_relaxed), true);
    if (ret != HG_SUCCESS) {
        h->forwarding.store(false);
        release(h);
    }
    return ret;
}

HG_PUBLIC hg_return_t HG_Cancel(hg_handle_t h) {
    if (!h) return HG_INVALID_ARG;
    if (h->target || !h->forwarding.load(std::memory_order_acquire)) return HG_SUCCESS;
    auto r = h->ctx->ctx->cancel(h->call);
    if (!r && r.code() != Errc::not_found) return to_hg(r.code());
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Reset(hg_handle_t h, hg_addr_t addr, hg_id_t id) {
    if (!h || h->target) return HG_INVALID_ARG;
    if (h->forwarding.load() || h->refs.load() != 1) return HG_BUSY;
    if (id != 0) {
        auto p = h->ctx->cls->find(id);
        if (!p) return HG_NOENTRY;
        h->proc = std::move(p);
        h->info.id = id;
    }
    h->addr_obj.a = addr ? addr->a : tna::Addr{};
    h->output.clear();
    h->enc.clear();
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Class_get_counters(const hg_class_t* c, struct hg_diag_counters* d) {
    if (!c || !d) return HG_INVALID_ARG;
    const tc::Counters k = c->eng->counters();
    *d = hg_diag_counters{};
    d->rpc_req_sent_count = k.rpcs_sent;
    d->rpc_req_recv_count = k.rpcs_received;
    d->rpc_resp_sent_count = k.responses_sent;
    d->rpc_resp_recv_count = k.responses_received;
    d->rpc_req_recv_active_count = k.held;
    d->bulk_count = k.bulk_ops;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Addr_lookup1(hg_context_t* ctx, hg_cb_t cb, void* arg, const char* name,
                                      hg_op_id_t* op_id_p) {
    if (!ctx || !name) return HG_INVALID_ARG;
    hg_addr_t a = HG_ADDR_NULL;
    const hg_return_t ret = HG_Addr_lookup2(ctx->cls, name, &a);
    if (op_id_p && op_id_p != HG_OP_ID_IGNORE) *op_id_p = HG_OP_ID_NULL;
    auto posted = ctx->na->post([cb, arg, a, ret](const tna::Completion&) {
        hg_cb_info info{};
        info.info.lookup.addr = a;
        info.arg = arg;
        info.type = HG_CB_LOOKUP;
        info.ret = ret;
        if (cb) cb(&info);
    });
    if (!posted) {
        if (a) HG_Addr_free(ctx->cls, a);
        return to_hg(posted.code());
    }
    return HG_SUCCESS;
}

namespace {

/// Progress `ctx` for up to `timeout` as the one thread doing so: another thread progressing
/// it makes this one wait for it (its progress returns when something is ready). Then wakes
/// the threads waiting in HG_Trigger.
hg_return_t progress_once(hg_context_t* ctx, std::chrono::nanoseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        std::unique_lock lk(ctx->progress_mu, std::try_to_lock);
        const auto now = std::chrono::steady_clock::now();
        if (lk.owns_lock()) {
            const bool spin = ctx->cls->busy;  // poll until something is done or time is up
            auto r = ctx->ctx->progress(talaria::Duration(0));
            if (!spin && !r && r.code() == Errc::timeout && now < deadline) {
                // Blocking mode, as Talaria's engines block: poll for up to kBlockSpin (an
                // answer often comes within microseconds, and a sleep and its wake-up cost
                // more), then sleep in the transport for the rest of the timeout.
                const auto spin_end = std::min(deadline, now + kBlockSpin);
                auto t = std::chrono::steady_clock::now();
                for (; t < spin_end && !r && r.code() == Errc::timeout;
                     t = std::chrono::steady_clock::now())
                    r = ctx->ctx->progress(talaria::Duration(0));
                if (!r && r.code() == Errc::timeout && t < deadline)
                    r = ctx->ctx->progress(talaria::Duration(deadline - t));
            }
            lk.unlock();
            wake_waiters(ctx);
            if (r) return HG_SUCCESS;
            if (r.code() != Errc::timeout) return to_hg(r.code());
            if (!spin || std::chrono::steady_clock::now() >= deadline) return HG_TIMEOUT;
            continue;
        }
        // Another thread progresses it: wait for its return (a 1 ms bound on a missed wake).
        if (ctx->na->has_completions()) return HG_SUCCESS;
        if (now >= deadline) return HG_TIMEOUT;
        wait_for_progress(ctx, std::min(deadline, now + std::chrono::milliseconds(1)));
    }
}

unsigned trigger_once(hg_context_t* ctx, unsigned max) {
    std::lock_guard g(ctx->trigger_mu);
    return ctx->ctx->trigger(max);
}

}  // namespace

// No wait fd in busy mode, as Mercury's: the program polls.
HG_PUBLIC int HG_Event_get_wait_fd(const hg_context_t* ctx) {
    return ctx && !ctx->cls->busy ? ctx->ctx->wait_fd() : -1;
}

// As Mercury's: true when the program must progress rather than block on the wait fd, which
// is when callbacks are queued or the context is not armed to wake the fd (core::Context::
// try_wait, which arms it; a context another thread is progressing is not armed by us).
HG_PUBLIC bool HG_Event_ready(hg_context_t* ctx) {
    if (!ctx) return false;
    if (ctx->na->has_completions()) return true;
    std::unique_lock lk(ctx->progress_mu, std::try_to_lock);
    if (!lk.owns_lock()) return true;
    return !ctx->ctx->try_wait();
}

HG_PUBLIC hg_return_t HG_Event_progress(hg_context_t* ctx, unsigned int* count_p) {
    if (!ctx) return HG_INVALID_ARG;
    std::unique_lock lk(ctx->progress_mu, std::try_to_lock);
    if (lk.owns_lock()) {  // another thread progressing it: nothing to add
        auto r = ctx->ctx->progress(std::chrono::milliseconds(0));
        lk.unlock();
        wake_waiters(ctx);
        if (!r && r.code() != Errc::timeout) return to_hg(r.code());
    }
    if (count_p) *count_p = talaria::mercury::completion_count(*ctx->na);
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Event_trigger(hg_context_t* ctx, unsigned int max_count,
                                       unsigned int* actual_p) {
    if (!ctx) return HG_INVALID_ARG;
    const unsigned n = max_count ? trigger_once(ctx, max_count) : 0;
    if (actual_p) *actual_p = n;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Respond(hg_handle_t h, hg_cb_t cb, void* arg, void* out_struct) {
    if (!h || !h->target || !h->proc) return HG_INVALID_ARG;
    hg_return_t ret = HG_SUCCESS;
    if (!h->req.one_way()) {
        ret = encode(h, h->proc->out, out_struct);
        if (ret != HG_SUCCESS) return ret;
        auto r = h->req.respond(h->enc.bytes());
        if (!r) {
            TALARIA_LOG(rpc, warn, "HG_Respond: {}", r.error().describe());
            ret = to_hg(r.code());
        }
    }
    // The callback runs in the next trigger, as in Mercury; the handle lives until it returns.
    h->refs.fetch_add(1, std::memory_order_relaxed);
    auto posted = h->ctx->na->post([h, cb, arg, ret](const tna::Completion&) {
        hg_cb_info info{};
        info.info.respond.handle = h;
        info.arg = arg;
        info.type = HG_CB_RESPOND;
        info.ret = ret;
        if (cb) cb(&info);
        release(h);
    });
    if (!posted) {
        release(h);
        return to_hg(posted.code());
    }
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t HG_Progress(hg_context_t* ctx, unsigned int timeout_ms) {
    if (!ctx) return HG_INVALID_ARG;
    return progress_once(ctx, std::chrono::milliseconds(timeout_ms));
}

HG_PUBLIC hg_return_t HG_Trigger(hg_context_t* ctx, unsigned int timeout_ms, unsigned int max_count,
                                 unsigned int* actual_p) {
    if (!ctx) return HG_INVALID_ARG;
    unsigned n = max_count ? trigger_once(ctx, max_count) : 0;
    if (n == 0 && max_count && timeout_ms) {
        // Nothing queued: wait for a first, as Mercury's trigger waits on its queue, by
        // progressing the context if no other thread is, else by waiting for that thread.
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        for (auto now = std::chrono::steady_clock::now(); n == 0 && now < deadline;
             now = std::chrono::steady_clock::now()) {
            std::unique_lock lk(ctx->progress_mu, std::try_to_lock);
            if (lk.owns_lock()) {
                (void)ctx->ctx->progress(deadline - now);
                lk.unlock();
                wake_waiters(ctx);
            } else {
                wait_for_progress(ctx, std::min(deadline, now + std::chrono::milliseconds(1)));
            }
            n = trigger_once(ctx, max_count);
        }
    }
    if (actual_p) *actual_p = n;
    return n ? HG_SUCCESS : HG_TIMEOUT;
}

}  // extern "C"

HG_PUBLIC talaria::Engine* talaria::mercury::engine(hg_class_t* hg_class) noexcept {
    return hg_class ? hg_class->api.get() : nullptr;
}
