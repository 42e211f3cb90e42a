// Group::from_pmix: a group of the ranks a PMIx launcher started (include/talaria/api/group.hpp).
// Built with PMIx when CMake found it (TALARIA_HAVE_PMIX); otherwise from_pmix says so.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>

#include "api/group_impl.hpp"
#include "talaria/api/engine.hpp"
#include "talaria/config.hpp"

#if TALARIA_HAVE_PMIX
#include <pmix.h>
#endif

namespace talaria {

#if TALARIA_HAVE_PMIX

namespace {

std::string pmix_says(pmix_status_t rc) {
    return fmt::format("{} ({})", PMIx_Error_string(rc), int(rc));
}

/// One PMIx_Init of this process (PMIx counts them), finalized with the last group that uses
/// it. PMIx's calls are thread-safe: they hand the work to PMIx's own progress thread.
class PmixSource final : public GroupSource {
  public:
    static constexpr int kGetTimeoutSeconds = 10;
    PmixSource(const pmix_proc_t& me, std::string key) : me_(me), key_(std::move(key)) {}
    ~PmixSource() override { (void)PMIx_Finalize(nullptr, 0); }
    PmixSource(const PmixSource&) = delete;
    PmixSource& operator=(const PmixSource&) = delete;

    /// A job-level value (PMIX_JOB_SIZE, PMIX_NUM_NODES) as a uint32.
    Result<uint32_t> job_value(const char* key) const {
        pmix_proc_t job;
        PMIX_LOAD_PROCID(&job, me_.nspace, PMIX_RANK_WILDCARD);
        pmix_value_t* v = nullptr;
        pmix_status_t rc = PMIx_Get(&job, key, nullptr, 0, &v);
        if (rc != PMIX_SUCCESS)
            return Error{Errc::not_found, fmt::format("PMIx_Get({}): {}", key, pmix_says(rc))};
        uint32_t out = 0;
        bool ok = true;
        const int type = v->type;
        switch (v->type) {
            case PMIX_UINT32:
                out = v->data.uint32;
                break;
            case PMIX_UINT16:
                out = v->data.uint16;
                break;
            case PMIX_INT:
                out = v->data.integer < 0 ? 0 : uint32_t(v->data.integer);
                break;
            default:
                ok = false;
        }
        PMIX_VALUE_RELEASE(v);
        if (!ok)
            return Error{Errc::protocol_error,
                         fmt::format("PMIx_Get({}): not an integer (type {})", key, type)};
        return out;
    }

    Result<void> publish(const std::string& address) {
        pmix_value_t v;
        PMIX_VALUE_CONSTRUCT(&v);
        v.type = PMIX_STRING;
        v.data.string = const_cast<char*>(address.c_str());  // PMIx_Put copies it
        pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key_.c_str(), &v);
        if (rc != PMIX_SUCCESS)
            return Error{Errc::io_error, fmt::format("PMIx_Put({}): {}", key_, pmix_says(rc))};
        rc = PMIx_Commit();
        if (rc != PMIX_SUCCESS)
            return Error{Errc::io_error, fmt::format("PMIx_Commit: {}", pmix_says(rc))};
        return ok();
    }

    Result<std::string> address(uint32_t rank) override {
        pmix_proc_t p;
        PMIX_LOAD_PROCID(&p, me_.nspace, rank);
        pmix_value_t* v = nullptr;
        // Bounded: a rank's address may be fetched on a progress thread (a collective's
        // handler), which must not wait for good on a launcher that does not answer.
        pmix_info_t limit;
        PMIX_INFO_CONSTRUCT(&limit);
        int seconds = kGetTimeoutSeconds;
        PMIX_INFO_LOAD(&limit, PMIX_TIMEOUT, &seconds, PMIX_INT);
        pmix_status_t rc = PMIx_Get(&p, key_.c_str(), &limit, 1, &v);
        PMIX_INFO_DESTRUCT(&limit);
        if (rc != PMIX_SUCCESS)
            return Error{rc == PMIX_ERR_NOT_FOUND ? Errc::not_found
                         : rc == PMIX_ERR_TIMEOUT ? Errc::timeout
                                                  : Errc::unreachable,
                         fmt::format("PMIx_Get({}) of rank {} in job {}: {} (did that rank call "
                                     "Group::from_pmix with the same name?)",
                                     key_, rank, me_.nspace, pmix_says(rc))};
        std::string out;
        const bool is_string = v->type == PMIX_STRING && v->data.string != nullptr;
        if (is_string) out = v->data.string;
        PMIX_VALUE_RELEASE(v);
        if (!is_string || out.empty())
            return Error{Errc::protocol_error,
                         fmt::format("PMIx_Get({}) of rank {}: not an address string", key_, rank)};
        return out;
    }

    Result<void> fence() override {
        pmix_proc_t job;
        PMIX_LOAD_PROCID(&job, me_.nspace, PMIX_RANK_WILDCARD);
        // No PMIX_COLLECT_DATA: addresses are fetched when a rank is first used.
        pmix_status_t rc = PMIx_Fence(&job, 1, nullptr, 0);
        if (rc != PMIX_SUCCESS)
            return Error{rc == PMIX_ERR_TIMEOUT ? Errc::timeout : Errc::disconnected,
                         fmt::format("PMIx_Fence of job {}: {} (a process of the job died or "
                                     "left it)",
                                     me_.nspace, pmix_says(rc))};
        return ok();
    }

  private:
    pmix_proc_t me_;
    std::string key_;
};

/// Whether `address` can be reached only from this host: a loopback or shared-memory one.
bool host_local(std::string_view address) {
    for (std::string_view local : {"sm://", "inproc://", "na+sm://"})
        if (address.substr(0, local.size()) == local) return true;
    const auto scheme = address.find("://");
    std::string_view host = scheme == std::string_view::npos ? address : address.substr(scheme + 3);
    return host.substr(0, 4) == "127." || host.substr(0, 5) == "[::1]" ||
           host.substr(0, 9) == "localhost";
}

}  // namespace

Result<Group> Group::from_pmix(Engine& engine, std::string_view name) {
    if (name.empty() || name.size() > 400)
        return Error{Errc::invalid_argument,
                     "Group::from_pmix: the name is empty or longer than 400 characters"};
    pmix_proc_t me;
    PMIX_PROC_CONSTRUCT(&me);
    pmix_status_t rc = PMIx_Init(&me, nullptr, 0);
    if (rc != PMIX_SUCCESS) {
        (void)PMIx_Finalize(nullptr, 0);  // a singleton's init counts, and fails
        if (rc != PMIX_ERR_UNREACH)
            return Error{Errc::io_error,
                         fmt::format("Group::from_pmix: PMIx_Init: {} (is the launcher's PMIx "
                                     "server of another version than this process's libpmix?)",
                                     pmix_says(rc))};
        return Error{Errc::unreachable,
                     fmt::format("Group::from_pmix: PMIx_Init: {}: this process was not started "
                                 "by a PMIx launcher (mpirun, srun --mpi=pmix, prterun); without "
                                 "one, make the group from a list or a file of addresses",
                                 pmix_says(rc))};
    }
    auto source = std::make_shared<PmixSource>(me, std::string(name) + ".address");
    auto size = source->job_value(PMIX_JOB_SIZE);
    if (!size)
        return Error{size.code(), "Group::from_pmix: the job's size: " + size.error().message()};
    if (*size == 0 || me.rank >= *size)
        return Error{
            Errc::protocol_error,
            fmt::format("Group::from_pmix: PMIx says rank {} of a job of {}", me.rank, *size)};
    const std::string self_address = engine.self_address();
    if (auto nodes = source->job_value(PMIX_NUM_NODES);
        nodes && *nodes > 1 && host_local(self_address))
        return Error{Errc::address_invalid,
                     fmt::format("Group::from_pmix: the job spans {} nodes, but this engine's "
                                 "address {} is reached only from this node; open the engine on "
                                 "this node's network address (tcp://<its address>:0, or an ofi "
                                 "or ucx address)",
                                 *nodes, self_address)};
    if (auto put = source->publish(self_address); !put)
        return Error{put.code(), "Group::from_pmix: " + put.error().message()};
    if (auto f = source->fence(); !f)
        return Error{f.code(), "Group::from_pmix: " + f.error().message()};

    auto impl = std::make_shared<Impl>();
    impl->engine = engine.self().engine();
    impl->self_address = self_address;
    impl->self = me.rank;
    impl->source = std::move(source);
    impl->ranks.resize(*size);
    impl->ranks[me.rank].address = self_address;
    return Group(std::move(impl));
}

#else

Result<Group> Group::from_pmix(Engine&, std::string_view) {
    return Error{Errc::not_supported,
                 "Group::from_pmix: this Talaria was built without PMIx (install libpmix-dev, "
                 "or your site's PMIx, and rebuild; CMake option TALARIA_WITH_PMIX)"};
}

#endif

}  // namespace talaria
