// NA_*: Mercury's NA C API over Talaria's na transports (include/talaria/mercury/na.h says
// what each function does).
//
// Objects and ownership: a class owns its transport; contexts, addresses, memory handles and
// op ids are the program's (each freed by its NA_* call) and are counted on their class, which
// NA_Finalize refuses to close (NA_BUSY) while any lives. An op id is busy from the post until
// just before its callback runs (so that the callback may post with it again, as in Mercury),
// and holds what the transport needs of the post until then: the message buffer object that
// names the caller's memory. Callbacks run in NA_Trigger only (Talaria's na::Context::trigger).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "mercury/info.hpp"
#include "mercury/na_impl.hpp"
#include "na.h"
#include "talaria/na/na.hpp"
#include "talaria/util/log.hpp"

namespace tna = talaria::na;
using talaria::Errc;

struct na_context {
    na_class* cls = nullptr;
    std::unique_ptr<tna::Context> ctx;
    std::atomic<unsigned> posted{0};  // operations whose callback has not run
};

struct na_addr {
    na_class* cls = nullptr;
    tna::Addr a;
};

struct na_op_id {
    na_class* cls = nullptr;
    std::atomic<bool> busy{false};
    na_context* ctx = nullptr;
    tna::OpId id;
    na_cb_t cb = nullptr;
    void* arg = nullptr;
    tna::MsgBuffer view;  // names the caller's buffer for the transport (owns nothing)
};

struct na_mem_handle {
    na_class* cls = nullptr;
    void* buf = nullptr;
    size_t size = 0;
    unsigned long flags = NA_MEM_READWRITE;
    tna::MemHandle h;  // registered, or deserialized from a peer
};

namespace {

/// What NA_Msg_buf_alloc hands out as plugin data: the transport's buffer.
struct MsgBuf {
    tna::MsgBuffer b;
};

na_return_t to_na(Errc e) noexcept {
    switch (e) {
        case Errc::ok:
            return NA_SUCCESS;
        case Errc::again:
            return NA_AGAIN;
        case Errc::timeout:
            return NA_TIMEOUT;
        case Errc::canceled:
            return NA_CANCELED;
        case Errc::disconnected:
            return NA_HOSTUNREACH;
        case Errc::invalid_argument:
            return NA_INVALID_ARG;
        case Errc::out_of_range:
            return NA_OVERFLOW;
        case Errc::access_denied:
            return NA_ACCESS;
        case Errc::permission_denied:
            return NA_PERMISSION;
        case Errc::no_memory:
            return NA_NOMEM;
        case Errc::not_supported:
            return NA_OPNOTSUPPORTED;
        case Errc::address_in_use:
            return NA_ADDRINUSE;
        case Errc::address_invalid:
            return NA_ADDRNOTAVAIL;
        case Errc::unreachable:
            return NA_HOSTUNREACH;
        case Errc::protocol_error:
            return NA_PROTOCOL_ERROR;
        case Errc::message_too_large:
            return NA_MSGSIZE;
        case Errc::busy:
            return NA_BUSY;
        case Errc::not_found:
            return NA_NOENTRY;
        case Errc::already_exists:
            return NA_EXIST;
        case Errc::io_error:
            return NA_IO_ERROR;
        case Errc::shutdown:
            return NA_CANCELED;
        case Errc::internal:
            return NA_PROTOCOL_ERROR;
        case Errc::invalid_state:
            return NA_PERMISSION;
    }
    return NA_PROTOCOL_ERROR;
}

na_return_t fail(const talaria::Error& e, std::string_view what) {
    TALARIA_LOG(na, error, "{}: {}", what, e.describe());
    return to_na(e.code());
}

template <class T>
T* counted(na_class* c, T* obj) {
    if (obj) c->live.fetch_add(1, std::memory_order_relaxed);
    return obj;
}

void uncount(na_class* c) {
    c->live.fetch_sub(1, std::memory_order_relaxed);
}

/// Take an idle op id for a post on `ctx`; NA_BUSY if it is in use.
na_return_t claim(na_op_id* op, na_context* ctx, na_cb_t cb, void* arg) {
    if (!op || !ctx || op == reinterpret_cast<na_op_id*>(1)) return NA_INVALID_ARG;
    bool idle = false;
    if (!op->busy.compare_exchange_strong(idle, true)) return NA_BUSY;
    op->ctx = ctx;
    op->cb = cb;
    op->arg = arg;
    ctx->posted.fetch_add(1, std::memory_order_relaxed);
    return NA_SUCCESS;
}

void unclaim(na_op_id* op) {
    op->ctx->posted.fetch_sub(1, std::memory_order_relaxed);
    op->busy.store(false, std::memory_order_release);
}

/// The transport's callback for an op: the op id is free again before the program's callback
/// runs (which may post with it).
tna::Callback completion(na_op_id* op, na_cb_type_t type) {
    return [op, type](const tna::Completion& c) {
        na_cb_info info{};
        info.arg = op->arg;
        info.type = type;
        info.ret = to_na(c.status);
        if (type == NA_CB_RECV_UNEXPECTED) {
            info.info.recv_unexpected.actual_buf_size = c.size;
            info.info.recv_unexpected.tag = c.tag;
            if (c.status == Errc::ok && c.source) {
                auto* a = new (std::nothrow) na_addr;
                if (a) {
                    a->cls = op->cls;
                    a->a = c.source;
                }
                info.info.recv_unexpected.source = counted(op->cls, a);
            }
        } else if (type == NA_CB_RECV_EXPECTED) {
            info.info.recv_expected.actual_buf_size = c.size;
        }
        na_cb_t cb = op->cb;
        unclaim(op);
        if (cb) cb(&info);
    };
}

/// A view of the caller's buffer: the transport's own when it came from NA_Msg_buf_alloc.
void view_of(na_op_id* op, const void* buf, size_t size, void* plugin_data) {
    auto* mb = static_cast<MsgBuf*>(plugin_data);
    void* priv = mb && mb->b.data() == buf ? mb->b.priv() : nullptr;
    op->view = tna::MsgBuffer(nullptr, static_cast<std::byte*>(const_cast<void*>(buf)), size, priv);
}

tna::Access access_of(unsigned long flags) {
    switch (flags) {
        case NA_MEM_READ_ONLY:
            return tna::Access::read_only;
        case NA_MEM_WRITE_ONLY:
            return tna::Access::write_only;
        default:
            return tna::Access::read_write;
    }
}

}  // namespace

extern "C" {

NA_PUBLIC void NA_Version_get(unsigned int* major, unsigned int* minor, unsigned int* patch) {
    // NA's own version in Mercury 2.4.1 (libna.so.6).
    if (major) *major = 5;
    if (minor) *minor = 0;
    if (patch) *patch = 0;
}

NA_PUBLIC na_return_t NA_Get_protocol_info(const char* info_string,
                                           struct na_protocol_info** info_p) {
    if (!info_p) return NA_INVALID_ARG;
    *info_p = nullptr;
    // What each built transport family serves, as Mercury names class and protocol.
    struct Entry {
        std::string_view family, cls, protocol;
    };
    static constexpr Entry kEntries[] = {
        {"sm", "na", "sm"},    {"tcp", "na", "tcp"},  {"inproc", "na", "inproc"},
        {"ofi", "ofi", "tcp"}, {"ofi", "ofi", "shm"}, {"ofi", "ofi", "verbs"},
        {"ucx", "ucx", "tcp"}, {"ucx", "ucx", "sm"},  {"ucx", "ucx", "all"},
    };
    std::string want_cls, want_proto;
    if (info_string && *info_string) {
        const std::string_view in(info_string);
        const auto p = talaria::mercury::parse_info(in);
        want_proto = p.protocol;
        // A bare protocol ("tcp") matches every class; "na+tcp" or "ofi+tcp" one.
        if (in.substr(0, in.find("://")).find('+') != std::string_view::npos)
            want_cls = p.class_name;
    }
    const auto built = tna::transports_built();
    struct na_protocol_info** tail = info_p;
    for (const Entry& e : kEntries) {
        if (std::find(built.begin(), built.end(), e.family) == built.end()) continue;
        if (!want_cls.empty() && want_cls != e.cls) continue;
        if (!want_proto.empty() && want_proto != e.protocol) continue;
        auto* node =
            static_cast<struct na_protocol_info*>(std::calloc(1, sizeof(struct na_protocol_info)));
        if (!node) {
            NA_Free_protocol_info(*info_p);
            *info_p = nullptr;
            return NA_NOMEM;
        }
        node->class_name = ::strndup(e.cls.data(), e.cls.size());
        node->protocol_name = ::strndup(e.protocol.data(), e.protocol.size());
        *tail = node;
        tail = &node->next;
    }
    return *info_p ? NA_SUCCESS : NA_PROTONOSUPPORT;
}

NA_PUBLIC void NA_Free_protocol_info(struct na_protocol_info* info) {
    while (info) {
        struct na_protocol_info* next = info->next;
        std::free(info->class_name);
        std::free(info->protocol_name);
        std::free(info->device_name);
        std::free(info);
        info = next;
    }
}

NA_PUBLIC na_class_t* NA_Initialize_opt2(const char* info_string, bool listen, unsigned int,
                                         const struct na_init_info* init) {
    if (!info_string) {
        TALARIA_LOG(na, error, "NA_Initialize: NULL info string");
        return nullptr;
    }
    talaria::mercury::Info p = talaria::mercury::parse_info(info_string);
    tna::Options o;
    o.listen = listen;
    if (init) {
        if (init->max_contexts > 0) o.max_contexts = init->max_contexts;
        o.thread_safe = (init->thread_mode & NA_THREAD_MODE_SINGLE) != NA_THREAD_MODE_SINGLE;
    }
    auto t = tna::open(p.address, o);
    if (!t) {
        TALARIA_LOG(na, error, "NA_Initialize(\"{}\"): {}", info_string, t.error().describe());
        return nullptr;
    }
    auto* c = new (std::nothrow) na_class;
    if (!c) return nullptr;
    c->t = std::move(*t);
    c->class_name = std::move(p.class_name);
    c->protocol = std::move(p.protocol);
    c->listen = listen;
    c->busy = init && (init->progress_mode & NA_NO_BLOCK);
    return c;
}

NA_PUBLIC na_class_t* NA_Initialize_opt(const char* info_string, bool listen,
                                        const struct na_init_info* init) {
    return NA_Initialize_opt2(info_string, listen, NA_VERSION(5, 0), init);
}

NA_PUBLIC na_class_t* NA_Initialize(const char* info_string, bool listen) {
    return NA_Initialize_opt2(info_string, listen, NA_VERSION(5, 0), nullptr);
}

NA_PUBLIC na_return_t NA_Finalize(na_class_t* na_class) {
    if (!na_class) return NA_SUCCESS;
    if (int n = na_class->live.load(); n != 0) {
        TALARIA_LOG(na, error,
                    "NA_Finalize: {} context(s), address(es), memory handle(s), op id(s) or "
                    "buffer(s) of this class are still live: free them first",
                    n);
        return NA_BUSY;
    }
    delete na_class;
    return NA_SUCCESS;
}

NA_PUBLIC void NA_Cleanup(void) {}

NA_PUBLIC bool NA_Has_opt_feature(na_class_t*, unsigned long) {
    return false;
}

NA_PUBLIC void NA_Set_log_level(const char* level) {
    if (!level) return;
    const std::string_view l(level);
    const char* ours = l == "none"        ? "na=off"
                       : l == "error"     ? "na=error"
                       : l == "warning"   ? "na=warn"
                       : l == "min_debug" ? "na=info"
                       : l == "debug"     ? "na=debug"
                                          : nullptr;
    if (ours) (void)talaria::log::configure(ours);
}

NA_PUBLIC const char* NA_Get_class_name(const na_class_t* c) {
    return c ? c->class_name.c_str() : nullptr;
}

NA_PUBLIC const char* NA_Get_class_protocol(const na_class_t* c) {
    return c ? c->protocol.c_str() : nullptr;
}

NA_PUBLIC bool NA_Is_listening(const na_class_t* c) {
    return c && c->listen;
}

NA_PUBLIC na_context_t* NA_Context_create_id(na_class_t* c, uint8_t id) {
    if (!c) return nullptr;
    auto r = c->t->context_create(id);
    if (!r) {
        TALARIA_LOG(na, error, "NA_Context_create_id({}): {}", id, r.error().describe());
        return nullptr;
    }
    auto* ctx = new (std::nothrow) na_context;
    if (!ctx) return nullptr;
    ctx->cls = c;
    ctx->ctx = std::move(*r);
    return counted(c, ctx);
}

NA_PUBLIC na_context_t* NA_Context_create(na_class_t* c) {
    return NA_Context_create_id(c, 0);
}

NA_PUBLIC na_return_t NA_Context_destroy(na_class_t* c, na_context_t* ctx) {
    if (!ctx) return NA_SUCCESS;
    if (!c || ctx->cls != c) return NA_INVALID_ARG;
    if (unsigned n = ctx->posted.load(); n != 0) {
        TALARIA_LOG(na, error,
                    "NA_Context_destroy: {} operation(s) posted on it have not completed "
                    "(cancel them and trigger their callbacks first)",
                    n);
        return NA_BUSY;
    }
    delete ctx;
    uncount(c);
    return NA_SUCCESS;
}

NA_PUBLIC unsigned int NA_Context_get_completion_count(const na_context_t* ctx) {
    return ctx ? talaria::mercury::completion_count(*ctx->ctx) : 0;
}

NA_PUBLIC na_op_id_t* NA_Op_create(na_class_t* c, unsigned long) {
    if (!c) return nullptr;
    auto* op = new (std::nothrow) na_op_id;
    if (op) op->cls = c;
    return counted(c, op);
}

NA_PUBLIC void NA_Op_destroy(na_class_t* c, na_op_id_t* op) {
    if (!op || !c) return;
    if (op->busy.load()) {
        TALARIA_LOG(na, error, "NA_Op_destroy: the operation is still in progress; not freed");
        return;
    }
    delete op;
    uncount(c);
}

NA_PUBLIC na_return_t NA_Addr_lookup(na_class_t* c, const char* name, na_addr_t** addr_p) {
    if (!c || !name || !addr_p) return NA_INVALID_ARG;
    auto r = c->t->addr_lookup(talaria::mercury::talaria_string(name));
    if (!r) return fail(r.error(), fmt::format("NA_Addr_lookup(\"{}\")", name));
    auto* a = new (std::nothrow) na_addr;
    if (!a) return NA_NOMEM;
    a->cls = c;
    a->a = std::move(*r);
    *addr_p = counted(c, a);
    return NA_SUCCESS;
}

NA_PUBLIC void NA_Addr_free(na_class_t* c, na_addr_t* addr) {
    if (!addr || !c) return;
    delete addr;
    uncount(c);
}

NA_PUBLIC na_return_t NA_Addr_set_remove(na_class_t* c, na_addr_t* addr) {
    if (!c || !addr) return NA_INVALID_ARG;
    (void)c->t->addr_disconnect(addr->a, "NA_Addr_set_remove");
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Addr_self(na_class_t* c, na_addr_t** addr_p) {
    if (!c || !addr_p) return NA_INVALID_ARG;
    auto* a = new (std::nothrow) na_addr;
    if (!a) return NA_NOMEM;
    a->cls = c;
    a->a = c->t->addr_self();
    *addr_p = counted(c, a);
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Addr_dup(na_class_t* c, na_addr_t* addr, na_addr_t** new_p) {
    if (!c || !addr || !new_p) return NA_INVALID_ARG;
    auto* a = new (std::nothrow) na_addr;
    if (!a) return NA_NOMEM;
    a->cls = c;
    a->a = addr->a;
    *new_p = counted(c, a);
    return NA_SUCCESS;
}

NA_PUBLIC bool NA_Addr_cmp(na_class_t*, na_addr_t* a1, na_addr_t* a2) {
    return a1 && a2 && a1->a == a2->a;
}

NA_PUBLIC bool NA_Addr_is_self(na_class_t* c, na_addr_t* addr) {
    return c && addr && addr->a == c->t->addr_self();
}

NA_PUBLIC na_return_t NA_Addr_to_string(na_class_t* c, char* buf, size_t* buf_size,
                                        na_addr_t* addr) {
    if (!c || !buf_size || !addr) return NA_INVALID_ARG;
    const std::string s =
        talaria::mercury::mercury_string(c->class_name, c->t->addr_to_string(addr->a));
    if (!buf) {
        *buf_size = s.size() + 1;
        return NA_SUCCESS;
    }
    if (*buf_size < s.size() + 1) {
        *buf_size = s.size() + 1;
        return NA_OVERFLOW;
    }
    std::memcpy(buf, s.c_str(), s.size() + 1);
    *buf_size = s.size() + 1;
    return NA_SUCCESS;
}

NA_PUBLIC size_t NA_Addr_get_serialize_size(na_class_t* c, na_addr_t* addr) {
    return c && addr ? c->t->addr_serialize_size(addr->a) : 0;
}

NA_PUBLIC na_return_t NA_Addr_serialize(na_class_t* c, void* buf, size_t buf_size,
                                        na_addr_t* addr) {
    if (!c || !buf || !addr) return NA_INVALID_ARG;
    auto r = c->t->addr_serialize(addr->a, {static_cast<std::byte*>(buf), buf_size});
    return r ? NA_SUCCESS : fail(r.error(), "NA_Addr_serialize");
}

NA_PUBLIC na_return_t NA_Addr_deserialize(na_class_t* c, na_addr_t** addr_p, const void* buf,
                                          size_t buf_size, uint64_t) {
    if (!c || !addr_p || !buf) return NA_INVALID_ARG;
    auto r = c->t->addr_deserialize({static_cast<const std::byte*>(buf), buf_size});
    if (!r) return fail(r.error(), "NA_Addr_deserialize");
    auto* a = new (std::nothrow) na_addr;
    if (!a) return NA_NOMEM;
    a->cls = c;
    a->a = std::move(*r);
    *addr_p = counted(c, a);
    return NA_SUCCESS;
}

NA_PUBLIC size_t NA_Msg_get_max_unexpected_size(const na_class_t* c) {
    return c ? c->t->max_unexpected_size() : 0;
}

NA_PUBLIC size_t NA_Msg_get_max_expected_size(const na_class_t* c) {
    return c ? c->t->max_expected_size() : 0;
}

NA_PUBLIC size_t NA_Msg_get_unexpected_header_size(const na_class_t*) {
    return 0;
}
NA_PUBLIC size_t NA_Msg_get_expected_header_size(const na_class_t*) {
    return 0;
}
NA_PUBLIC na_tag_t NA_Msg_get_max_tag(const na_class_t*) {
    return UINT32_MAX;
}

NA_PUBLIC void* NA_Msg_buf_alloc(na_class_t* c, size_t buf_size, unsigned long,
                                 void** plugin_data_p) {
    if (!c || !plugin_data_p) return nullptr;
    auto r = c->t->msg_buf_alloc(buf_size);
    if (!r) {
        (void)fail(r.error(), "NA_Msg_buf_alloc");
        return nullptr;
    }
    auto* mb = new (std::nothrow) MsgBuf{std::move(*r)};
    if (!mb) return nullptr;
    *plugin_data_p = mb;
    c->live.fetch_add(1, std::memory_order_relaxed);
    return mb->b.data();
}

NA_PUBLIC void NA_Msg_buf_free(na_class_t* c, void* buf, void* plugin_data) {
    auto* mb = static_cast<MsgBuf*>(plugin_data);
    if (!c || !mb || mb->b.data() != buf) return;
    delete mb;
    uncount(c);
}

NA_PUBLIC na_return_t NA_Msg_init_unexpected(na_class_t*, void*, size_t) {
    return NA_SUCCESS;
}
NA_PUBLIC na_return_t NA_Msg_init_expected(na_class_t*, void*, size_t) {
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Msg_send_unexpected(na_class_t* c, na_context_t* ctx, na_cb_t cb,
                                             void* arg, const void* buf, size_t buf_size,
                                             void* plugin_data, na_addr_t* dest, uint8_t dest_id,
                                             na_tag_t tag, na_op_id_t* op) {
    if (!c || !dest || (!buf && buf_size)) return NA_INVALID_ARG;
    if (na_return_t r = claim(op, ctx, cb, arg); r != NA_SUCCESS) return r;
    view_of(op, buf, buf_size, plugin_data);
    auto r = c->t->post_send_unexpected(*ctx->ctx, completion(op, NA_CB_SEND_UNEXPECTED), op->view,
                                        buf_size, dest->a, dest_id, tag);
    if (!r) {
        unclaim(op);
        return fail(r.error(), "NA_Msg_send_unexpected");
    }
    op->id = *r;
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Msg_recv_unexpected(na_class_t* c, na_context_t* ctx, na_cb_t cb,
                                             void* arg, void* buf, size_t buf_size,
                                             void* plugin_data, na_op_id_t* op) {
    if (!c || !buf) return NA_INVALID_ARG;
    if (na_return_t r = claim(op, ctx, cb, arg); r != NA_SUCCESS) return r;
    view_of(op, buf, buf_size, plugin_data);
    auto r = c->t->post_recv_unexpected(*ctx->ctx, completion(op, NA_CB_RECV_UNEXPECTED), op->view);
    if (!r) {
        unclaim(op);
        return fail(r.error(), "NA_Msg_recv_unexpected");
    }
    op->id = *r;
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Msg_multi_recv_unexpected(na_class_t*, na_context_t*, na_cb_t, void*,
                                                   void*, size_t, void*, na_op_id_t*) {
    // NA_Has_opt_feature(NA_OPT_MULTI_RECV) says no: programs fall back to single receives.
    TALARIA_LOG(na, warn, "NA_Msg_multi_recv_unexpected is not supported by Talaria");
    return NA_OPNOTSUPPORTED;
}

NA_PUBLIC na_return_t NA_Msg_send_expected(na_class_t* c, na_context_t* ctx, na_cb_t cb, void* arg,
                                           const void* buf, size_t buf_size, void* plugin_data,
                                           na_addr_t* dest, uint8_t dest_id, na_tag_t tag,
                                           na_op_id_t* op) {
    if (!c || !dest || (!buf && buf_size)) return NA_INVALID_ARG;
    if (na_return_t r = claim(op, ctx, cb, arg); r != NA_SUCCESS) return r;
    view_of(op, buf, buf_size, plugin_data);
    auto r = c->t->post_send_expected(*ctx->ctx, completion(op, NA_CB_SEND_EXPECTED), op->view,
                                      buf_size, dest->a, dest_id, tag);
    if (!r) {
        unclaim(op);
        return fail(r.error(), "NA_Msg_send_expected");
    }
    op->id = *r;
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Msg_recv_expected(na_class_t* c, na_context_t* ctx, na_cb_t cb, void* arg,
                                           void* buf, size_t buf_size, void* plugin_data,
                                           na_addr_t* source, uint8_t, na_tag_t tag,
                                           na_op_id_t* op) {
    if (!c || !buf || !source) return NA_INVALID_ARG;
    if (na_return_t r = claim(op, ctx, cb, arg); r != NA_SUCCESS) return r;
    view_of(op, buf, buf_size, plugin_data);
    auto r = c->t->post_recv_expected(*ctx->ctx, completion(op, NA_CB_RECV_EXPECTED), op->view,
                                      source->a, tag);
    if (!r) {
        unclaim(op);
        return fail(r.error(), "NA_Msg_recv_expected");
    }
    op->id = *r;
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Mem_handle_create(na_class_t* c, void* buf, size_t buf_size,
                                           unsigned long flags, na_mem_handle_t** mh_p) {
    if (!c || !mh_p || (!buf && buf_size)) return NA_INVALID_ARG;
    auto* m = new (std::nothrow) na_mem_handle;
    if (!m) return NA_NOMEM;
    m->cls = c;
    m->buf = buf;
    m->size = buf_size;
    m->flags = flags;
    *mh_p = counted(c, m);
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Mem_handle_create_segments(na_class_t* c, struct na_segment* segs,
                                                    size_t count, unsigned long flags,
                                                    na_mem_handle_t** mh_p) {
    if (count == 1 && segs) return NA_Mem_handle_create(c, segs->base, segs->len, flags, mh_p);
    TALARIA_LOG(na, warn,
                "NA_Mem_handle_create_segments: one segment at most "
                "(NA_Mem_handle_get_max_segments)");
    return NA_OPNOTSUPPORTED;
}

NA_PUBLIC void NA_Mem_handle_free(na_class_t* c, na_mem_handle_t* m) {
    if (!c || !m) return;
    delete m;
    uncount(c);
}

NA_PUBLIC size_t NA_Mem_handle_get_max_segments(const na_class_t*) {
    return 1;
}

NA_PUBLIC na_return_t NA_Mem_register(na_class_t* c, na_mem_handle_t* m, enum na_mem_type type,
                                      uint64_t) {
    if (!c || !m) return NA_INVALID_ARG;
    if (type != NA_MEM_TYPE_HOST) return NA_OPNOTSUPPORTED;
    auto r = c->t->mem_register(m->buf, m->size, access_of(m->flags));
    if (!r) return fail(r.error(), "NA_Mem_register");
    m->h = std::move(*r);
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Mem_deregister(na_class_t* c, na_mem_handle_t* m) {
    if (!c || !m) return NA_INVALID_ARG;
    m->h.reset();
    return NA_SUCCESS;
}

NA_PUBLIC size_t NA_Mem_handle_get_serialize_size(na_class_t* c, na_mem_handle_t* m) {
    return c && m && m->h ? c->t->mem_serialize_size(m->h) : 0;
}

NA_PUBLIC na_return_t NA_Mem_handle_serialize(na_class_t* c, void* buf, size_t buf_size,
                                              na_mem_handle_t* m) {
    if (!c || !buf || !m || !m->h) return NA_INVALID_ARG;
    auto r = c->t->mem_serialize(m->h, {static_cast<std::byte*>(buf), buf_size});
    return r ? NA_SUCCESS : fail(r.error(), "NA_Mem_handle_serialize");
}

NA_PUBLIC na_return_t NA_Mem_handle_deserialize(na_class_t* c, na_mem_handle_t** mh_p,
                                                const void* buf, size_t buf_size) {
    if (!c || !mh_p || !buf) return NA_INVALID_ARG;
    auto r = c->t->mem_deserialize({static_cast<const std::byte*>(buf), buf_size});
    if (!r) return fail(r.error(), "NA_Mem_handle_deserialize");
    auto* m = new (std::nothrow) na_mem_handle;
    if (!m) return NA_NOMEM;
    m->cls = c;
    m->h = std::move(*r);
    *mh_p = counted(c, m);
    return NA_SUCCESS;
}

static na_return_t one_sided(bool put, na_class_t* c, na_context_t* ctx, na_cb_t cb, void* arg,
                             na_mem_handle_t* local, na_offset_t local_off, na_mem_handle_t* remote,
                             na_offset_t remote_off, size_t len, na_addr_t* remote_addr,
                             na_op_id_t* op) {
    if (!c || !local || !remote || !remote_addr || !local->h || !remote->h) return NA_INVALID_ARG;
    if (na_return_t r = claim(op, ctx, cb, arg); r != NA_SUCCESS) return r;
    auto cbk = completion(op, put ? NA_CB_PUT : NA_CB_GET);
    auto r = put ? c->t->post_put(*ctx->ctx, std::move(cbk), local->h, local_off, remote->h,
                                  remote_off, len, remote_addr->a)
                 : c->t->post_get(*ctx->ctx, std::move(cbk), local->h, local_off, remote->h,
                                  remote_off, len, remote_addr->a);
    if (!r) {
        unclaim(op);
        return fail(r.error(), put ? "NA_Put" : "NA_Get");
    }
    op->id = *r;
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Put(na_class_t* c, na_context_t* ctx, na_cb_t cb, void* arg,
                             na_mem_handle_t* local, na_offset_t local_off, na_mem_handle_t* remote,
                             na_offset_t remote_off, size_t len, na_addr_t* remote_addr, uint8_t,
                             na_op_id_t* op) {
    return one_sided(true, c, ctx, cb, arg, local, local_off, remote, remote_off, len, remote_addr,
                     op);
}

NA_PUBLIC na_return_t NA_Get(na_class_t* c, na_context_t* ctx, na_cb_t cb, void* arg,
                             na_mem_handle_t* local, na_offset_t local_off, na_mem_handle_t* remote,
                             na_offset_t remote_off, size_t len, na_addr_t* remote_addr, uint8_t,
                             na_op_id_t* op) {
    return one_sided(false, c, ctx, cb, arg, local, local_off, remote, remote_off, len, remote_addr,
                     op);
}

// The context's wait fd (readable when progress has work: completions queued or transport
// I/O), none in busy mode, as Mercury's.
NA_PUBLIC int NA_Poll_get_fd(na_class_t* c, na_context_t* ctx) {
    return c && ctx && !c->busy ? ctx->ctx->wait_fd() : -1;
}

NA_PUBLIC bool NA_Poll_try_wait(na_class_t* c, na_context_t* ctx) {
    return c && ctx && ctx->ctx->try_wait();
}

NA_PUBLIC na_return_t NA_Poll_wait(na_class_t* c, na_context_t* ctx, unsigned int timeout_ms,
                                   unsigned* count_p) {
    if (!c || !ctx) return NA_INVALID_ARG;
    auto r = ctx->ctx->progress(std::chrono::milliseconds(timeout_ms));
    if (count_p) *count_p = NA_Context_get_completion_count(ctx);
    if (r || ctx->ctx->has_completions()) return NA_SUCCESS;
    return r.code() == Errc::timeout ? NA_TIMEOUT : fail(r.error(), "NA_Poll_wait");
}

NA_PUBLIC na_return_t NA_Poll(na_class_t* c, na_context_t* ctx, unsigned int* count_p) {
    na_return_t r = NA_Poll_wait(c, ctx, 0, count_p);
    return r == NA_TIMEOUT ? NA_SUCCESS : r;
}

NA_PUBLIC na_return_t NA_Progress(na_class_t* c, na_context_t* ctx, unsigned int timeout_ms) {
    return NA_Poll_wait(c, ctx, timeout_ms, nullptr);
}

NA_PUBLIC na_return_t NA_Trigger(na_context_t* ctx, unsigned int max_count,
                                 unsigned int* actual_count) {
    if (!ctx) return NA_INVALID_ARG;
    const unsigned n = max_count == 0 ? 0 : ctx->ctx->trigger(max_count);
    if (actual_count) *actual_count = n;
    return NA_SUCCESS;
}

NA_PUBLIC na_return_t NA_Cancel(na_class_t* c, na_context_t*, na_op_id_t* op) {
    if (!c || !op) return NA_INVALID_ARG;
    if (!op->busy.load()) return NA_SUCCESS;  // completed already
    auto r = c->t->cancel(op->id);
    if (!r && r.code() != Errc::not_found) return fail(r.error(), "NA_Cancel");
    return NA_SUCCESS;
}

NA_PUBLIC const char* NA_Error_to_string(na_return_t errnum) {
#define X(a) #a,
    static const char* const kNames[] = {NA_RETURN_VALUES};
#undef X
    const auto i = static_cast<unsigned>(errnum);
    return i < sizeof kNames / sizeof kNames[0] - 1 ? kNames[i] : nullptr;
}

}  // extern "C"
