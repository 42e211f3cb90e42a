// The libfabric section: every provider with a reliable datagram (FI_EP_RDM) endpoint, one row per
// provider, fabric and domain, with the capabilities the ofi transport looks at.
#include <set>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "info.hpp"
#include "talaria/config.hpp"

#if TALARIA_HAVE_OFI
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#endif

namespace talaria::info {

#if TALARIA_HAVE_OFI
namespace {

std::string yes_no(bool b) {
    return b ? "yes" : "no";
}

std::string mr_mode_text(int mode) {
    static constexpr std::pair<int, const char*> kBits[] = {
        {FI_MR_LOCAL, "local"},         {FI_MR_VIRT_ADDR, "virt_addr"},
        {FI_MR_ALLOCATED, "allocated"}, {FI_MR_PROV_KEY, "prov_key"},
        {FI_MR_ENDPOINT, "endpoint"},   {FI_MR_RAW, "raw"},
        {FI_MR_HMEM, "hmem"},           {FI_MR_RMA_EVENT, "rma_event"},
    };
    std::string s;
    for (auto [bit, name] : kBits)
        if (mode & bit) s += s.empty() ? name : std::string(",") + name;
    if (mode & FI_MR_BASIC) s += s.empty() ? "basic" : ",basic";
    if (mode & FI_MR_SCALABLE) s += s.empty() ? "scalable" : ",scalable";
    return s.empty() ? "none" : s;
}

std::string size_text(std::size_t n) {
    if (n >= (std::size_t(1) << 62)) return "unlimited";
    if (n >= (std::size_t(1) << 30) && n % (std::size_t(1) << 30) == 0)
        return fmt::format("{}G", n >> 30);
    if (n >= (std::size_t(1) << 20) && n % (std::size_t(1) << 20) == 0)
        return fmt::format("{}M", n >> 20);
    if (n >= 1024 && n % 1024 == 0) return fmt::format("{}K", n >> 10);
    return fmt::format("{}", n);
}

using Key = std::tuple<std::string, std::string, std::string>;

Key key_of(const fi_info* i) {
    auto str = [](const char* p) { return std::string(p ? p : "?"); };
    return {str(i->fabric_attr->prov_name), str(i->fabric_attr->name), str(i->domain_attr->name)};
}

fi_info* rdm_hints() {
    fi_info* hints = fi_allocinfo();
    if (!hints) return nullptr;
    hints->ep_attr->type = FI_EP_RDM;
    // Every mode and MR mode bit the ofi transport honours, so providers that need them are listed.
    hints->mode = ~0ULL;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    return hints;
}

/// The (provider, fabric, domain) triples that offer the secondary capability `cap`: providers
/// report those only when asked, so ask.
std::set<Key> offering(uint64_t cap) {
    std::set<Key> keys;
    fi_info* hints = rdm_hints();
    if (!hints) return keys;
    hints->caps = cap;
    fi_info* list = nullptr;
    if (fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints, &list) == 0) {
        for (fi_info* i = list; i; i = i->next)
            keys.insert(key_of(i));
        fi_freeinfo(list);
    }
    fi_freeinfo(hints);
    return keys;
}

}  // namespace

Section libfabric_section() {
    Section s;
    s.key = "libfabric";
    uint32_t v = fi_version();
    s.title = fmt::format("libfabric {}.{} providers with FI_EP_RDM endpoints (fi_getinfo)",
                          FI_MAJOR(v), FI_MINOR(v));
    fi_info* hints = fi_allocinfo();
    if (!hints) {
        s.notes.push_back("fi_allocinfo failed");
        return s;
    }
    hints->ep_attr->type = FI_EP_RDM;
    // Ask for every mode and MR mode bit we can honour, so providers that need them are listed.
    hints->mode = ~0ULL;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    fi_info* list = nullptr;
    int rc = fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints, &list);
    fi_freeinfo(hints);
    if (rc != 0) {
        s.notes.push_back(
            fmt::format("fi_getinfo found no RDM provider: {} ({})", fi_strerror(-rc), rc));
        return s;
    }
    const std::set<Key> source = offering(FI_SOURCE);
    const std::set<Key> directed = offering(FI_DIRECTED_RECV);
    std::set<Key> seen;
    for (fi_info* i = list; i; i = i->next) {
        Key key = key_of(i);
        if (!seen.insert(key).second) continue;
        const auto& [prov, fabric, domain] = key;
        // Utility providers stack as "core;util": Talaria's string names the core provider.
        std::string core = prov.substr(0, prov.find(';'));
        bool tagged = i->caps & FI_TAGGED;
        bool rma = (i->caps & FI_RMA) && (i->caps & FI_READ) && (i->caps & FI_WRITE);
        Row r;
        r.add("provider", prov);
        r.add("fabric", fabric);
        r.add("domain", domain);
        r.add("talaria", tagged && rma ? "ofi+" + core : "-");
        r.add("tagged", yes_no(tagged));
        r.add("rma", yes_no(rma));
        r.add("multi_recv", yes_no(i->caps & FI_MULTI_RECV));
        r.add("source", yes_no(source.count(key) != 0));
        r.add("directed_recv", yes_no(directed.count(key) != 0));
        r.add("mr_mode", mr_mode_text(i->domain_attr->mr_mode));
        r.add("max_msg", size_text(i->ep_attr->max_msg_size));
        r.add("inject", size_text(i->tx_attr->inject_size));
        s.rows.push_back(std::move(r));
    }
    fi_freeinfo(list);
    s.notes.push_back(
        "talaria: the address scheme that reaches the provider ('-': it lacks tagged "
        "messages or RMA read/write, which the ofi transport needs)");
    return s;
}
#else
Section libfabric_section() {
    Section s;
    s.key = "libfabric";
    s.title = "libfabric providers";
    s.notes.push_back(
        "this build has no ofi transport (libfabric was not found by pkg-config, or "
        "TALARIA_WITH_OFI=OFF)");
    return s;
}
#endif

}  // namespace talaria::info
