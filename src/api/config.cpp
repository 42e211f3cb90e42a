// EngineConfig <-> JSON (include/talaria/api/config.hpp), with nlohmann-json (header-only,
// private to this file: nothing of it is in an installed header or exported).
#include "talaria/api/config.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "talaria/api/error.hpp"

namespace talaria {

namespace {

using json = nlohmann::json;

/// Reads the members of one JSON object, remembering which keys it has read, so that an unknown
/// (misspelt) key is an error naming the keys known at its level instead of being ignored.
/// Errors carry the key's path ("core.na.max_ops").
class ObjectReader {
  public:
    ObjectReader(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

    template <class T>
    Result<void> unsigned_int(std::string_view key, T& out) {
        const json* v = take(key);
        if (!v) return ok();
        constexpr auto kMax = std::numeric_limits<T>::max();
        if (!v->is_number_unsigned() || v->get<std::uint64_t>() > std::uint64_t(kMax))
            return wrong(key, *v, fmt::format("an unsigned integer (at most {})", kMax));
        out = static_cast<T>(v->get<std::uint64_t>());
        return ok();
    }
    Result<void> signed_int(std::string_view key, std::int64_t& out) {
        const json* v = take(key);
        if (!v) return ok();
        if (!v->is_number_integer() ||
            (v->is_number_unsigned() &&
             v->get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max())))
            return wrong(key, *v, "an integer (of 64 bits)");
        out = v->get<std::int64_t>();
        return ok();
    }
    Result<void> boolean(std::string_view key, bool& out) {
        const json* v = take(key);
        if (!v) return ok();
        if (!v->is_boolean()) return wrong(key, *v, "true or false");
        out = v->get<bool>();
        return ok();
    }
    Result<void> string(std::string_view key, std::string& out) {
        const json* v = take(key);
        if (!v) return ok();
        if (!v->is_string()) return wrong(key, *v, "a string");
        out = v->get<std::string>();
        return ok();
    }
    /// Milliseconds, fractions allowed, 0 or more.
    Result<void> millis(std::string_view key, Duration& out) {
        const json* v = take(key);
        if (!v) return ok();
        // Up to 100 years: nanoseconds in 64 bits reach 292, and no setting needs more.
        constexpr double kMaxMs = 100.0 * 365 * 24 * 3600 * 1000;
        if (!v->is_number() || !(v->get<double>() >= 0) || v->get<double>() > kMaxMs)
            return wrong(key, *v, "a number of milliseconds, from 0 to 100 years");
        // Rounded, not truncated: a dump of n ns (n / 1e6 ms) reads back as n ns.
        out = std::chrono::round<Duration>(
            std::chrono::duration<double, std::milli>(v->get<double>()));
        return ok();
    }
    /// One of `names`, giving its index.
    template <class E>
    Result<void> choice(std::string_view key, std::span<const std::string_view> names, E& out) {
        const json* v = take(key);
        if (!v) return ok();
        if (v->is_string()) {
            auto s = v->get<std::string>();
            auto it = std::find(names.begin(), names.end(), s);
            if (it != names.end()) {
                out = static_cast<E>(it - names.begin());
                return ok();
            }
        }
        return wrong(key, *v, fmt::format("one of \"{}\"", fmt::join(names, "\", \"")));
    }
    /// A member object, read by `fn(ObjectReader&)`.
    template <class F>
    Result<void> object(std::string_view key, F&& fn) {
        const json* v = take(key);
        if (!v) return ok();
        if (!v->is_object()) return wrong(key, *v, "an object");
        ObjectReader sub(*v, at(key));
        TALARIA_CHECK(fn(sub));
        return sub.finish();
    }
    /// Every key present was read: an unknown one is an error.
    Result<void> finish() const {
        for (const auto& [k, v] : obj_.items()) {
            if (std::find(known_.begin(), known_.end(), k) != known_.end()) continue;
            return Error(
                Errc::invalid_argument,
                fmt::format("{}: unknown key (known {}: {})", at(k),
                            path_.empty() ? "at the top" : "in " + path_, fmt::join(known_, ", ")));
        }
        return ok();
    }
    [[nodiscard]] std::string at(std::string_view key) const {
        return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
    }

  private:
    /// Records `key` as known here, and gives its value (null when absent).
    const json* take(std::string_view key) {
        known_.emplace_back(key);
        auto it = obj_.find(std::string(key));
        return it == obj_.end() ? nullptr : &*it;
    }
    [[nodiscard]] Error wrong(std::string_view key, const json& v, std::string_view what) const {
        return Error(Errc::invalid_argument,
                     fmt::format("{}: must be {}, not {}", at(key), what, v.dump()));
    }

    const json& obj_;
    std::string path_;
    std::vector<std::string> known_;
};

// Enumerators by name, in the order of their values.
constexpr std::string_view kProgress[] = {"background", "manual"};
constexpr std::string_view kWait[] = {"block", "busy"};
constexpr std::string_view kProtect[] = {"none", "integrity", "encryption"};
constexpr std::string_view kSecret[] = {"none", "set"};

template <class E>
std::string_view name_of(std::span<const std::string_view> names, E e) {
    auto i = static_cast<std::size_t>(e);
    return i < names.size() ? names[i] : "unknown";
}

/// Milliseconds as JSON: an integer when whole (60000, not 60000.0).
nlohmann::ordered_json ms(Duration d) {
    if (d.count() % 1'000'000 == 0) return d.count() / 1'000'000;
    return std::chrono::duration<double, std::milli>(d).count();
}

Result<void> read_auth(ObjectReader& r, na::Auth& auth, std::string& secret_file) {
    TALARIA_CHECK(r.string("key_id", auth.key_id));
    TALARIA_CHECK(r.string("secret_file", secret_file));
    TALARIA_CHECK(r.choice("protect", kProtect, auth.protect));
    int secret_set = 0;  // what a dump says in the secret's place: read, then checked
    TALARIA_CHECK(r.choice("secret", kSecret, secret_set));
    if (!secret_file.empty()) {
        TALARIA_TRY(secret, na::read_secret_file(secret_file));
        auth.secret = std::move(secret);
    } else if (secret_set == 1) {
        return Error(Errc::invalid_argument,
                     fmt::format("{}: says a secret is set, but no {} names the file to read it "
                                 "from (a secret never appears in JSON)",
                                 r.at("secret"), r.at("secret_file")));
    }
    return ok();
}

Result<void> read_core(ObjectReader& r, core::Options& co) {
    TALARIA_CHECK(r.unsigned_int("recv_depth", co.recv_depth));
    TALARIA_CHECK(r.unsigned_int("max_inflight", co.max_inflight));
    TALARIA_CHECK(r.millis("ack_linger_ms", co.ack_linger));
    TALARIA_CHECK(r.unsigned_int("eager_limit", co.eager_limit));
    TALARIA_CHECK(r.unsigned_int("max_payload", co.max_payload));
    TALARIA_CHECK(r.unsigned_int("large_budget", co.large_budget));
    TALARIA_CHECK(r.millis("pull_timeout_ms", co.pull_timeout));
    TALARIA_CHECK(r.unsigned_int("max_requests", co.max_requests));
    TALARIA_CHECK(r.unsigned_int("max_requests_per_peer", co.max_requests_per_peer));
    TALARIA_CHECK(r.unsigned_int("peer_window", co.peer_window));
    TALARIA_CHECK(r.boolean("stats", co.stats));
    TALARIA_CHECK(r.millis("stats_timing_gap_ms", co.stats_timing_gap));
    return r.millis("busy_retry_after_ms", co.busy_retry_after);
}

Result<void> read_na(ObjectReader& r, na::Options& no, std::string& secret_file) {
    TALARIA_CHECK(r.boolean("thread_safe", no.thread_safe));
    TALARIA_CHECK(r.unsigned_int("max_ops", no.max_ops));
    TALARIA_CHECK(r.unsigned_int("max_contexts", no.max_contexts));
    TALARIA_CHECK(r.millis("hello_timeout_ms", no.hello_timeout));
    TALARIA_CHECK(r.signed_int("sm_group", no.sm_group));
    auto auth = [&](ObjectReader& ar) { return read_auth(ar, no.auth, secret_file); };
    return r.object("auth", auth);
}

Result<void> read_config(ObjectReader& r, EngineConfig& c) {
    EngineOptions& o = c.options;
    TALARIA_CHECK(r.string("address", c.address));
    TALARIA_CHECK(r.boolean("listen", c.listen));
    TALARIA_CHECK(r.choice("progress", kProgress, o.progress));
    TALARIA_CHECK(r.choice("wait", kWait, o.wait));
    TALARIA_CHECK(r.unsigned_int("contexts", o.contexts));
    TALARIA_CHECK(r.boolean("checksum", o.checksum));
    TALARIA_CHECK(r.millis("default_timeout_ms", o.default_timeout));
    TALARIA_CHECK(r.unsigned_int("handler_threads", o.handler_threads));
    auto core = [&](ObjectReader& cr) { return read_core(cr, o.core); };
    TALARIA_CHECK(r.object("core", core));
    auto na = [&](ObjectReader& nr) { return read_na(nr, o.core.na, c.secret_file); };
    TALARIA_CHECK(r.object("na", na));
    return r.finish();
}

}  // namespace

Result<EngineConfig> EngineConfig::parse(std::string_view text) {
    json doc;
    try {
        doc = json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
    } catch (const json::exception& e) {  // the parser's account of where and why
        return Error(Errc::invalid_argument,
                     fmt::format("engine configuration is not valid JSON: {}", e.what()));
    }
    if (!doc.is_object())
        return Error(
            Errc::invalid_argument,
            fmt::format("engine configuration must be a JSON object, not {}", doc.type_name()));
    EngineConfig c;
    ObjectReader r(doc, "");
    TALARIA_CHECK(read_config(r, c));
    return c;
}

EngineConfig EngineConfig::from_json(std::string_view text) {
    return detail::value_or_throw(parse(text));
}

std::string EngineConfig::to_json(int indent) const {
    const EngineOptions& o = options;
    const core::Options& co = o.core;
    const na::Options& no = co.na;
    // ordered_json: keys in the order of the structs, as the header documents them.
    nlohmann::ordered_json auth = {
        {"key_id", no.auth.key_id},
        {"secret_file", secret_file},
        {"secret", no.auth.enabled() ? "set" : "none"},
        {"protect", name_of(kProtect, no.auth.protect)},
    };
    nlohmann::ordered_json doc = {
        {"address", address},
        {"listen", listen},
        {"progress", name_of(kProgress, o.progress)},
        {"wait", name_of(kWait, o.wait)},
        {"contexts", o.contexts},
        {"checksum", o.checksum},
        {"default_timeout_ms", ms(o.default_timeout)},
        {"handler_threads", o.handler_threads},
        {"core",
         {
             {"recv_depth", co.recv_depth},
             {"max_inflight", co.max_inflight},
             {"ack_linger_ms", ms(co.ack_linger)},
             {"eager_limit", co.eager_limit},
             {"max_payload", co.max_payload},
             {"large_budget", co.large_budget},
             {"pull_timeout_ms", ms(co.pull_timeout)},
             {"max_requests", co.max_requests},
             {"max_requests_per_peer", co.max_requests_per_peer},
             {"peer_window", co.peer_window},
             {"busy_retry_after_ms", ms(co.busy_retry_after)},
             {"stats", co.stats},
             {"stats_timing_gap_ms", ms(co.stats_timing_gap)},
         }},
        {"na",
         {
             {"thread_safe", no.thread_safe},
             {"max_ops", no.max_ops},
             {"max_contexts", no.max_contexts},
             {"hello_timeout_ms", ms(no.hello_timeout)},
             {"sm_group", no.sm_group},
             {"auth", auth},
         }},
    };
    return doc.dump(indent);
}

}  // namespace talaria
