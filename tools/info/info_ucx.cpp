// The UCX section: every UCT transport resource (transport + device) of every memory domain, with
// the capabilities its interface reports once opened (what `ucx_info -d` prints, one row each).
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "info.hpp"
#include "talaria/config.hpp"

#if TALARIA_HAVE_UCX
#include <ucp/api/ucp.h>
#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>
#endif

namespace talaria::info {

#if TALARIA_HAVE_UCX
namespace {

std::string yes_no(bool b) {
    return b ? "yes" : "no";
}

/// The ucx+<transports> scheme that uses this UCT transport.
std::string talaria_scheme(std::string_view tl) {
    for (std::string_view sm : {"posix", "sysv", "cma", "xpmem", "knem", "self"})
        if (tl == sm) return "ucx+sm";
    if (tl == "tcp") return "ucx+tcp";
    if (tl.starts_with("rc")) return "ucx+rc";
    if (tl.starts_with("ud")) return "ucx+ud";
    if (tl.starts_with("dc")) return "ucx+dc";
    return "ucx+all";
}

std::string_view device_type(uct_device_type_t t) {
    switch (t) {
        case UCT_DEVICE_TYPE_NET:
            return "net";
        case UCT_DEVICE_TYPE_SHM:
            return "shm";
        case UCT_DEVICE_TYPE_ACC:
            return "acc";
        case UCT_DEVICE_TYPE_SELF:
            return "self";
        default:
            return "?";
    }
}

/// Open the interface of one resource and describe it; false (with `why`) if it cannot open.
bool describe_iface(uct_md_h md, uct_worker_h worker, const uct_tl_resource_desc_t& res, Row& r,
                    std::string& why) {
    uct_iface_config_t* cfg = nullptr;
    ucs_status_t st = uct_md_iface_config_read(md, res.tl_name, nullptr, nullptr, &cfg);
    if (st != UCS_OK) {
        why = fmt::format("uct_md_iface_config_read: {}", ucs_status_string(st));
        return false;
    }
    uct_iface_params_t p{};
    p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
                   UCT_IFACE_PARAM_FIELD_STATS_ROOT | UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
    p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    p.mode.device.tl_name = res.tl_name;
    p.mode.device.dev_name = res.dev_name;
    p.stats_root = nullptr;
    p.rx_headroom = 0;
    uct_iface_h iface = nullptr;
    st = uct_iface_open(md, worker, &p, cfg, &iface);
    uct_config_release(cfg);
    if (st != UCS_OK) {
        why = fmt::format("uct_iface_open: {}", ucs_status_string(st));
        return false;
    }
    uct_iface_attr_t a{};
    st = uct_iface_query(iface, &a);
    if (st != UCS_OK) {
        uct_iface_close(iface);
        why = fmt::format("uct_iface_query: {}", ucs_status_string(st));
        return false;
    }
    uint64_t f = a.cap.flags;
    std::string connect;
    if (f & UCT_IFACE_FLAG_CONNECT_TO_IFACE) connect = "iface";
    if (f & UCT_IFACE_FLAG_CONNECT_TO_EP) connect += connect.empty() ? "ep" : ",ep";
    r.add("am_short", (f & UCT_IFACE_FLAG_AM_SHORT) ? fmt::format("{}", a.cap.am.max_short) : "no");
    r.add("am_bcopy", (f & UCT_IFACE_FLAG_AM_BCOPY) ? fmt::format("{}", a.cap.am.max_bcopy) : "no");
    r.add("put_zcopy", yes_no(f & UCT_IFACE_FLAG_PUT_ZCOPY));
    r.add("get_zcopy", yes_no(f & UCT_IFACE_FLAG_GET_ZCOPY));
    r.add("connect_to", connect.empty() ? "-" : connect);
    r.add("peer_failure", yes_no(f & UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE));
    r.add("event_fd", yes_no(a.cap.event_flags & UCT_IFACE_FLAG_EVENT_FD));
    r.add("latency_ns", fmt::format("{:.0f}", a.latency.c * 1e9));
    uct_iface_close(iface);
    return true;
}

}  // namespace

Section ucx_section() {
    Section s;
    s.key = "ucx";
    s.title = fmt::format("UCX {} transports (UCT resources, each interface opened once)",
                          ucp_get_version_string());
    ucs_async_context_t* async = nullptr;
    ucs_status_t st = ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async);
    if (st != UCS_OK) {
        s.notes.push_back(fmt::format("ucs_async_context_create: {}", ucs_status_string(st)));
        return s;
    }
    uct_worker_h worker = nullptr;
    st = uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker);
    if (st != UCS_OK) {
        s.notes.push_back(fmt::format("uct_worker_create: {}", ucs_status_string(st)));
        ucs_async_context_destroy(async);
        return s;
    }
    uct_component_h* comps = nullptr;
    unsigned ncomps = 0;
    st = uct_query_components(&comps, &ncomps);
    if (st != UCS_OK) {
        s.notes.push_back(fmt::format("uct_query_components: {}", ucs_status_string(st)));
        ncomps = 0;
    }
    for (unsigned c = 0; c < ncomps; ++c) {
        uct_component_attr_t ca{};
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
        if (uct_component_query(comps[c], &ca) != UCS_OK) continue;
        std::vector<uct_md_resource_desc_t> mds(ca.md_resource_count);
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        ca.md_resources = mds.data();
        if (!mds.empty() && uct_component_query(comps[c], &ca) != UCS_OK) continue;
        for (const auto& mdr : mds) {
            uct_md_config_t* mdc = nullptr;
            if (uct_md_config_read(comps[c], nullptr, nullptr, &mdc) != UCS_OK) continue;
            uct_md_h md = nullptr;
            st = uct_md_open(comps[c], mdr.md_name, mdc, &md);
            uct_config_release(mdc);
            if (st != UCS_OK) {
                s.notes.push_back(fmt::format("memory domain {}: uct_md_open: {}", mdr.md_name,
                                              ucs_status_string(st)));
                continue;
            }
            uct_tl_resource_desc_t* res = nullptr;
            unsigned nres = 0;
            if (uct_md_query_tl_resources(md, &res, &nres) == UCS_OK) {
                for (unsigned i = 0; i < nres; ++i) {
                    Row r;
                    r.add("transport", res[i].tl_name);
                    r.add("device", res[i].dev_name);
                    r.add("type", std::string(device_type(res[i].dev_type)));
                    r.add("memory domain", mdr.md_name);
                    r.add("talaria", talaria_scheme(res[i].tl_name));
                    std::string why;
                    if (!describe_iface(md, worker, res[i], r, why))
                        s.notes.push_back(
                            fmt::format("{}/{}: {}", res[i].tl_name, res[i].dev_name, why));
                    s.rows.push_back(std::move(r));
                }
                uct_release_tl_resource_list(res);
            }
            uct_md_close(md);
        }
    }
    if (comps) uct_release_component_list(comps);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    s.notes.push_back(
        "talaria: the ucx+<transports> scheme that uses the transport (ucx+all "
        "lets UCX pick among all of them); peer_failure: the transport reports a "
        "dead peer, which the ucx transport needs for its error handling");
    return s;
}
#else
Section ucx_section() {
    Section s;
    s.key = "ucx";
    s.title = "UCX transports";
    s.notes.push_back(
        "this build has no ucx transport (UCX was not found by pkg-config, or "
        "TALARIA_WITH_UCX=OFF)");
    return s;
}
#endif

}  // namespace talaria::info
