// talaria-info --attach ADDRESS: ask a running engine (one that called enable_introspection())
// for its statistics, health, configuration, calls in flight or Prometheus text, and print
// them as a table, as JSON, or again every N seconds like top.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "info.hpp"
#include "na/base/url.hpp"
#include "talaria/talaria.hpp"

namespace talaria::info {

namespace {

using Json = nlohmann::json;

/// An address to open this side's engine with, on the transport of `target`: the loopback
/// when the target is on this host's loopback, else any address (the engine does not listen).
Result<std::string> client_url(const std::string& target) {
    auto url = na::parse_url(target);
    if (!url)
        return Error(Errc::address_invalid,
                     fmt::format("'{}' is not an address (scheme://...: tcp://HOST:PORT, sm://..., "
                                 "ofi+tcp://HOST:PORT, ucx+tcp://HOST:PORT)",
                                 target));
    const std::string scheme(url->scheme);
    const std::string_view rest = url->rest;
    if (scheme == "inproc")
        return Error(Errc::not_supported,
                     "inproc:// engines live inside one process: another cannot attach to them");
    if (scheme == "sm" || scheme.rfind("ofi+shm", 0) == 0 || scheme.rfind("ucx+sm", 0) == 0)
        return scheme + "://";
    if (!rest.empty() && rest[0] == '[')
        return fmt::format("{}://[{}]:0", scheme, rest.rfind("[::1]", 0) == 0 ? "::1" : "::");
    return fmt::format("{}://{}:0", scheme, rest.rfind("127.", 0) == 0 ? "127.0.0.1" : "0.0.0.0");
}

std::string procedure_of(const std::string& what) {
    if (what == "stats") return std::string(Engine::kStatsProcedure);
    if (what == "health") return std::string(Engine::kHealthProcedure);
    if (what == "config") return std::string(Engine::kConfigProcedure);
    if (what == "in-flight") return std::string(Engine::kInFlightProcedure);
    return std::string(Engine::kPrometheusProcedure);
}

std::string micros(const Json& ns) {
    const double us = ns.get<double>() / 1000.0;
    return us < 10     ? fmt::format("{:.2f}", us)
           : us < 1000 ? fmt::format("{:.1f}", us)
                       : fmt::format("{:.0f}", us);
}

std::string megabytes(const Json& b) {
    return fmt::format("{:.2f}", b.get<double>() / 1e6);
}

/// The statistics as tables: the engine's counters, then a row per procedure and side.
void print_stats(const std::string& text, const std::string& at) {
    Json j = Json::parse(text);
    std::printf("%s: Talaria %s, %u contexts, statistics %s\n", at.c_str(),
                j["version"].get<std::string>().c_str(), j["contexts"].get<unsigned>(),
                j["stats"].get<bool>() ? "on" : "off");
    Section c{"counters", "Engine counters", {}, {}};
    Row cr;
    for (const auto& [k, v] : j["counters"].items())
        cr.add(k, v.dump());
    c.rows.push_back(std::move(cr));
    print_table(c);
    if (j.contains("links")) {  // an engine built before link counts sends none
        Section k{"links", "Transport links", {}, {}};
        Row kr;
        for (const auto& [e, v] : j["links"].items())
            kr.add(e, v.dump());
        k.rows.push_back(std::move(kr));
        print_table(k);
    }
    Section p{"procedures", "Procedures (latency in microseconds)", {}, {}};
    for (const auto& proc : j["procedures"]) {
        for (const char* side : {"client", "server"}) {
            const Json& s = proc[side];
            if (s["calls"].get<uint64_t>() == 0) continue;
            Row r;
            r.add("procedure", proc["name"].get<std::string>());
            r.add("provider", proc["provider"].dump());
            r.add("side", side);
            r.add("calls", s["calls"].dump());
            r.add("ok", s["ok"].dump());
            r.add("failed", s["failed"].dump());
            std::string errors;
            for (const auto& [k, v] : s["errors"].items())
                errors += fmt::format("{}{}={}", errors.empty() ? "" : ",", k, v.dump());
            r.add("errors", errors.empty() ? "-" : errors);
            r.add("MB out", megabytes(s["bytes_out"]));
            r.add("MB in", megabytes(s["bytes_in"]));
            const Json& l = s["latency_ns"];
            for (const char* q : {"p50", "p90", "p99", "p999", "max"})
                r.add(q, l["count"].get<uint64_t>() ? micros(l[q]) : "-");
            p.rows.push_back(std::move(r));
        }
        const Json& q = proc["queue_ns"];
        if (q["count"].get<uint64_t>() != 0) {
            Row r;
            r.add("procedure", proc["name"].get<std::string>());
            r.add("provider", proc["provider"].dump());
            r.add("side", "queue");
            r.add("calls", q["count"].dump());
            for (const char* k : {"p50", "p90", "p99", "p999", "max"})
                r.add(k, micros(q[k]));
            p.rows.push_back(std::move(r));
        }
    }
    if (p.rows.empty()) p.notes.push_back("no procedure called or served yet");
    print_table(p);
    Section b{"transfers", "Bulk transfers (latency in microseconds)", {}, {}};
    for (const auto& [dir, t] : j["transfers"].items()) {
        if (t["transfers"].get<uint64_t>() == 0) continue;
        Row r;
        r.add("direction", dir);
        r.add("transfers", t["transfers"].dump());
        r.add("failed", t["failed"].dump());
        r.add("MB", megabytes(t["bytes"]));
        for (const char* q : {"p50", "p90", "p99", "p999", "max"})
            r.add(q, micros(t["latency_ns"][q]));
        b.rows.push_back(std::move(r));
    }
    if (!b.rows.empty()) print_table(b);
}

void print_in_flight(const std::string& text) {
    Json j = Json::parse(text);
    Section c{"contexts", "Requests held by handlers, per context", {}, {}};
    for (const auto& x : j["contexts"]) {
        Row r;
        r.add("context", x["id"].dump());
        r.add("requests held", x["requests_held"].dump());
        c.rows.push_back(std::move(r));
    }
    print_table(c);
    Section p{"peers", "Calls in flight, per peer and context", {}, {}};
    for (const auto& x : j["peers"]) {
        Row r;
        r.add("peer", x["peer"].get<std::string>());
        r.add("context", x["context"].dump());
        r.add("in flight", x["in_flight"].dump());
        r.add("waiting for a credit", x["queued"].dump());
        p.rows.push_back(std::move(r));
    }
    if (p.rows.empty()) p.notes.push_back("no call in flight");
    print_table(p);
}

}  // namespace

int attach(const AttachOptions& o) {
    auto fail = [&](const std::string& why) {
        std::fprintf(stderr, "talaria-info: --attach %s: %s\n", o.address.c_str(), why.c_str());
        return 1;
    };
    EngineConfig cfg;
    if (!o.config.empty()) {
        std::ifstream in(o.config);
        if (!in) return fail(fmt::format("--client-config {}: cannot read it", o.config));
        std::stringstream text;
        text << in.rdbuf();
        auto c = EngineConfig::parse(text.str());
        if (!c) return fail(fmt::format("--client-config {}: {}", o.config, c.error().describe()));
        cfg = std::move(*c);
    }
    auto url = !o.from.empty()        ? Result<std::string>(o.from)
               : !cfg.address.empty() ? Result<std::string>(cfg.address)
                                      : client_url(o.address);
    if (!url) return fail(url.error().describe());
    auto engine = Engine::open(*url, false, cfg.options);
    if (!engine)
        return fail(
            fmt::format("opening this side's engine at {}: {}", *url, engine.error().describe()));
    auto ep = engine->try_lookup(o.address);
    if (!ep) return fail(ep.error().describe());
    const std::string procedure = procedure_of(o.what);
    auto ask = engine->remote<std::string()>(procedure).on(*ep).timeout(o.timeout);
    const bool tty = ::isatty(STDOUT_FILENO) != 0;
    for (unsigned n = 0;; ++n) {
        auto r = ask().try_get();
        if (!r) {
            std::string why = r.error().describe();
            if (r.code() == Errc::not_found)
                why += fmt::format(
                    " (the engine does not answer {}: its program enables it with "
                    "Engine::enable_introspection())",
                    procedure);
            if (r.code() == Errc::access_denied)
                why += o.config.empty()
                           ? " (the engine asks for a shared secret: give talaria-info one with "
                             "--client-config FILE, an engine config holding the service's "
                             "\"na\": {\"auth\": {\"key_id\": ..., \"secret_file\": ...}})"
                           : fmt::format(
                                 " (check na.auth in --client-config {} against the "
                                 "service's)",
                                 o.config);
            return fail(why);
        }
        if (o.watch > 0 && tty && !o.json) std::printf("\x1b[H\x1b[2J");  // clear, like top
        if (o.json || o.what == "prometheus") {
            std::printf("%s%s", r->c_str(), !r->empty() && r->back() == '\n' ? "" : "\n");
        } else if (o.what == "stats") {
            print_stats(*r, o.address);
        } else if (o.what == "in-flight") {
            print_in_flight(*r);
        } else {
            std::printf("%s\n", Json::parse(*r).dump(2).c_str());
        }
        std::fflush(stdout);
        if (o.watch <= 0 || (o.count != 0 && n + 1 >= o.count)) return 0;
        std::this_thread::sleep_for(std::chrono::duration<double>(o.watch));
    }
}

}  // namespace talaria::info
