// Engine::stats(), stats_json() and stats_prometheus(): the per-procedure statistics of the
// core (core::Engine::proc_stats) and the engine's counters, as JSON and as Prometheus text.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/introspection.hpp"
#include "talaria/api/engine.hpp"
#include "talaria/version.hpp"

namespace talaria {

namespace {

using Json = nlohmann::ordered_json;

/// The quantiles every latency is summarized by.
constexpr double kQuantiles[] = {0.5, 0.9, 0.99, 0.999};
constexpr const char* kQuantileKeys[] = {"p50", "p90", "p99", "p999"};

Json latency_json(const core::Latency& h) {
    Json j = {{"count", h.count()}, {"mean", uint64_t(h.mean() + 0.5)}};
    for (std::size_t i = 0; i < std::size(kQuantiles); ++i)
        j[kQuantileKeys[i]] = h.quantile(kQuantiles[i]);
    j["max"] = h.max();
    return j;
}

Json side_json(const core::ProcSideStats& s) {
    Json errors = Json::object();
    for (std::size_t i = 0; i < core::kErrcCount; ++i)
        if (s.errors[i] != 0) errors[std::string(errc_name(static_cast<Errc>(i)))] = s.errors[i];
    return {{"calls", s.calls},
            {"ok", s.ok},
            {"failed", s.failed()},
            {"errors", std::move(errors)},
            {"bytes_out", s.bytes_out},
            {"bytes_in", s.bytes_in},
            {"latency_ns", latency_json(s.latency)}};
}

Json transfers_json(const std::array<core::TransferStats, 2>& t) {
    Json j = Json::object();
    const char* names[] = {"pull", "push"};
    for (std::size_t i = 0; i < 2; ++i)
        j[names[i]] = {{"transfers", t[i].transfers},
                       {"failed", t[i].failed},
                       {"bytes", t[i].bytes},
                       {"latency_ns", latency_json(t[i].latency)}};
    return j;
}

/// The engine's counters by name, in counters_json()'s order; in_flight and held are
/// snapshots (gauges), the rest totals.
std::vector<std::pair<const char*, uint64_t>> counter_list(const core::Counters& c) {
    return {{"rpcs_sent", c.rpcs_sent},
            {"rpcs_received", c.rpcs_received},
            {"responses_sent", c.responses_sent},
            {"responses_received", c.responses_received},
            {"bytes_sent", c.bytes_sent},
            {"bytes_received", c.bytes_received},
            {"bulk_ops", c.bulk_ops},
            {"bulk_bytes", c.bulk_bytes},
            {"timeouts", c.timeouts},
            {"canceled", c.canceled},
            {"errors", c.errors},
            {"in_flight", c.in_flight},
            {"busy_refused", c.busy_refused},
            {"busy_retries", c.busy_retries},
            {"held", c.held}};
}

bool is_gauge(std::string_view name) {
    return name == "in_flight" || name == "held";
}

na::OpCounts na_counts_of(const core::Engine& core, const na::Context* extra) {
    na::OpCounts o = core.na_counts();
    if (extra) o.merge(extra->op_counts());
    return o;
}

/// The na layer's completions: per operation type, ok / failed / canceled and bytes.
Json na_json(const na::OpCounts& o) {
    Json j = Json::object();
    for (std::size_t i = 0; i < na::OpCounts::kTypes; ++i) {
        const auto t = static_cast<na::OpType>(i);
        if (t == na::OpType::user) continue;  // the upper layers' own callbacks, not the network
        j[std::string(na::op_type_name(t))] = {{"ok", o.ok[i]},
                                               {"failed", o.failed[i]},
                                               {"canceled", o.canceled[i]},
                                               {"bytes", o.bytes[i]}};
    }
    return j;
}

/// The transport's link events (connections made, accepted, failed, lost; back-pressure).
Json links_json(const na::LinkCounts& l) {
    Json j = Json::object();
    for (std::size_t i = 0; i < na::LinkCounts::kEvents; ++i)
        j[std::string(na::link_event_name(static_cast<na::LinkEvent>(i)))] = l.events[i];
    return j;
}

Json counters_object(const core::Counters& c) {
    Json j = Json::object();
    for (const auto& [name, v] : counter_list(c))
        j[name] = v;
    return j;
}

/// A label value in the text format: backslash, double quote and line feed escaped.
std::string label(std::string_view v) {
    std::string out;
    out.reserve(v.size());
    for (char ch : v) {
        if (ch == '\\')
            out += "\\\\";
        else if (ch == '"')
            out += "\\\"";
        else if (ch == '\n')
            out += "\\n";
        else
            out += ch;
    }
    return out;
}

double seconds(uint64_t ns) {
    return double(ns) * 1e-9;
}

/// Prometheus' text format (version 0.0.4): each metric family's # HELP and # TYPE once,
/// then its samples.
class Exposition {
  public:
    void family(std::string_view name, std::string_view type, std::string_view help) {
        fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name,
                       type);
    }
    void sample(std::string_view name, std::string_view labels, uint64_t v) {
        fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, labels, v);
    }
    void sample(std::string_view name, std::string_view labels, double v) {
        fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, labels, v);
    }
    /// The samples of a summary: its quantiles (in seconds), `_sum` and `_count`.
    void summary(const std::string& name, const std::string& labels, const core::Latency& h) {
        for (double q : kQuantiles)
            sample(name, fmt::format("{},quantile=\"{}\"", labels, q), seconds(h.quantile(q)));
        sample(name + "_sum", labels, seconds(h.sum()));
        sample(name + "_count", labels, h.count());
    }
    std::string take() { return std::move(out_); }

  private:
    std::string out_;
};

}  // namespace

namespace detail {

/// The engine's counters, less the request of the introspection call that asks for them.
core::Counters counters_but(const core::Engine& core, const core::Request* asking) {
    core::Counters c = core.counters();
    if (asking && asking->valid() && c.held > 0) --c.held;
    return c;
}

std::string stats_json_of(const core::Engine& core, int indent, const na::Context* extra,
                          const core::Request* asking) {
    Json procs = Json::array();
    for (const core::ProcStats& p : core.proc_stats()) {
        procs.push_back({{"name", p.name},
                         {"id", p.id},
                         {"provider", p.provider},
                         {"client", side_json(p.client)},
                         {"server", side_json(p.server)},
                         {"queue_ns", latency_json(p.queue)}});
    }
    Json doc = {{"address", core.self_string()},
                {"version", std::string(version().string)},
                {"contexts", core.context_count()},
                {"stats", core.options().stats},
                {"counters", counters_object(counters_but(core, asking))},
                {"transfers", transfers_json(core.transfer_stats())},
                {"na", na_json(na_counts_of(core, extra))},
                {"links", links_json(core.transport().link_counts())},
                {"procedures", std::move(procs)}};
    // Names and addresses that are not UTF-8 are replaced, not thrown on.
    return doc.dump(indent, ' ', false, Json::error_handler_t::replace);
}

std::string stats_prometheus_of(const core::Engine& core, const na::Context* extra,
                                const core::Request* asking) {
    const std::string engine = label(core.self_string());
    const auto procs = core.proc_stats();
    Exposition x;
    const core::Counters c = counters_but(core, asking);
    const std::string el = fmt::format("engine=\"{}\"", engine);
    for (const auto& [name, v] : counter_list(c)) {
        const bool gauge = is_gauge(name);
        const std::string metric = fmt::format("talaria_{}{}", name, gauge ? "" : "_total");
        x.family(
            metric, gauge ? "gauge" : "counter",
            fmt::format("The engine's {} (core::Counters{}).", name, gauge ? ", a snapshot" : ""));
        x.sample(metric, el, v);
    }

    // Per procedure: the same family for every procedure, so each family is written whole.
    auto labels = [&](const core::ProcStats& p) {
        return fmt::format("engine=\"{}\",procedure=\"{}\",provider=\"{}\"", engine,
                           label(p.name.empty() ? fmt::format("{:#010x}", p.id) : p.name),
                           p.provider);
    };
    for (const char* side : {"client", "server"}) {
        const bool client = side[0] == 'c';
        auto of = [&](const core::ProcStats& p) -> const core::ProcSideStats& {
            return client ? p.client : p.server;
        };
        const std::string calls = fmt::format("talaria_rpc_{}_calls_total", side);
        x.family(calls, "counter",
                 client ? "Calls made, by procedure." : "Requests handed to the procedure.");
        for (const auto& p : procs)
            x.sample(calls, labels(p), of(p).calls);
        const std::string done = fmt::format("talaria_rpc_{}_completed_total", side);
        x.family(done, "counter",
                 client ? "Calls completed, by outcome (ok or the error code)."
                        : "Requests answered, by status (ok or the error code).");
        for (const auto& p : procs) {
            const std::string l = labels(p);
            x.sample(done, l + ",status=\"ok\"", of(p).ok);
            for (std::size_t i = 0; i < core::kErrcCount; ++i)
                if (of(p).errors[i] != 0)
                    x.sample(done,
                             fmt::format("{},status=\"{}\"", l, errc_name(static_cast<Errc>(i))),
                             of(p).errors[i]);
        }
        const std::string bytes = fmt::format("talaria_rpc_{}_bytes_total", side);
        x.family(bytes, "counter", "Payload bytes (arguments and results), by direction.");
        for (const auto& p : procs) {
            const std::string l = labels(p);
            x.sample(bytes, l + ",direction=\"out\"", of(p).bytes_out);
            x.sample(bytes, l + ",direction=\"in\"", of(p).bytes_in);
        }
        const std::string lat = fmt::format("talaria_rpc_{}_latency_seconds", side);
        x.family(lat, "summary",
                 client ? "Round trip of calls, from forward to completion."
                        : "Handler time, from the handler's start to its answer.");
        for (const auto& p : procs)
            x.summary(lat, labels(p), of(p).latency);
    }
    const na::OpCounts na_ops = na_counts_of(core, extra);
    x.family("talaria_na_ops_total", "counter",
             "Operations the network layer completed, by type and outcome.");
    for (std::size_t i = 0; i < na::OpCounts::kTypes; ++i) {
        const auto t = static_cast<na::OpType>(i);
        if (t == na::OpType::user) continue;
        const std::string l = fmt::format("{},op=\"{}\"", el, na::op_type_name(t));
        x.sample("talaria_na_ops_total", l + ",status=\"ok\"", na_ops.ok[i]);
        x.sample("talaria_na_ops_total", l + ",status=\"failed\"", na_ops.failed[i]);
        x.sample("talaria_na_ops_total", l + ",status=\"canceled\"", na_ops.canceled[i]);
    }
    x.family("talaria_na_bytes_total", "counter",
             "Bytes the network layer received (receives) or moved (put, get).");
    for (std::size_t i = 0; i < na::OpCounts::kTypes; ++i) {
        const auto t = static_cast<na::OpType>(i);
        if (t == na::OpType::user) continue;
        x.sample("talaria_na_bytes_total", fmt::format("{},op=\"{}\"", el, na::op_type_name(t)),
                 na_ops.bytes[i]);
    }
    const na::LinkCounts links = core.transport().link_counts();
    x.family("talaria_na_link_events_total", "counter",
             "What the transport's links did: connected, accepted, connect_failed, lost, and "
             "backpressure (a send found its link full).");
    for (std::size_t i = 0; i < na::LinkCounts::kEvents; ++i)
        x.sample(
            "talaria_na_link_events_total",
            fmt::format("{},event=\"{}\"", el, na::link_event_name(static_cast<na::LinkEvent>(i))),
            links.events[i]);
    const auto transfers = core.transfer_stats();
    const char* dirs[] = {"pull", "push"};
    x.family("talaria_transfers_total", "counter",
             "Bulk transfers through the API, by direction and outcome.");
    for (std::size_t i = 0; i < 2; ++i) {
        const std::string l = fmt::format("{},direction=\"{}\"", el, dirs[i]);
        x.sample("talaria_transfers_total", l + ",status=\"ok\"", transfers[i].ok);
        x.sample("talaria_transfers_total", l + ",status=\"failed\"", transfers[i].failed);
    }
    x.family("talaria_transfer_bytes_total", "counter",
             "Bytes of the bulk transfers that succeeded.");
    for (std::size_t i = 0; i < 2; ++i)
        x.sample("talaria_transfer_bytes_total", fmt::format("{},direction=\"{}\"", el, dirs[i]),
                 transfers[i].bytes);
    x.family("talaria_transfer_latency_seconds", "summary",
             "Time of a bulk transfer, from its start to its completion.");
    for (std::size_t i = 0; i < 2; ++i)
        x.summary("talaria_transfer_latency_seconds",
                  fmt::format("{},direction=\"{}\"", el, dirs[i]), transfers[i].latency);
    const std::string queue = "talaria_rpc_server_queue_seconds";
    x.family(queue, "summary",
             "Wait of requests between their arrival and their handler's start on an executor.");
    for (const auto& p : procs)
        x.summary(queue, labels(p), p.queue);
    return x.take();
}

std::string health_json_text(std::string_view status, std::string_view address, uint64_t uptime_ms,
                             unsigned contexts) {
    Json doc = {{"status", status},
                {"address", address},
                {"version", std::string(version().string)},
                {"uptime_ms", uptime_ms},
                {"contexts", contexts}};
    return doc.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string calls_in_flight_json_of(const core::Engine& core, const core::Request* asking) {
    Json contexts = Json::array();
    auto held = core.requests_held();
    if (asking && asking->valid()) {
        const uint8_t own = asking->context().id();
        if (own < held.size() && held[own] > 0) --held[own];
    }
    for (std::size_t i = 0; i < held.size(); ++i)
        contexts.push_back({{"id", i}, {"requests_held", held[i]}});
    Json peers = Json::array();
    for (const auto& p : core.calls_in_flight())
        peers.push_back({{"peer", p.peer},
                         {"context", p.context},
                         {"in_flight", p.in_flight},
                         {"queued", p.queued}});
    Json doc = {{"address", core.self_string()},
                {"contexts", std::move(contexts)},
                {"peers", std::move(peers)}};
    return doc.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace detail

std::vector<core::ProcStats> Engine::stats() const {
    return core().proc_stats();
}

std::string Engine::calls_in_flight_json() const {
    return detail::calls_in_flight_json_of(core());
}

}  // namespace talaria
