// talaria-info: the transports built into Talaria, and the libfabric providers and UCX transports
// this machine has, with what each supports (like fi_info and ucx_info, in one table each).
//
//   talaria-info                 all sections as text
//   talaria-info --json          the same as one JSON object
//   talaria-info -s libfabric    one section (transports, libfabric, ucx)
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "info.hpp"
#include "talaria/config.hpp"
#include "talaria/mercury/mercury_config.h"
#include "talaria/util/log.hpp"
#include "talaria/version.hpp"

namespace talaria::info {

/// Rows may differ in their columns (the header is the union, in first-seen order); missing
/// cells print "-".
void print_table(const Section& s, bool wide) {
    std::printf("\n%s\n", s.title.c_str());
    if (s.as_lines) {
        for (const auto& r : s.rows) {
            std::string check, status, detail, remedy;
            for (const auto& [k, v] : r.cells) {
                if (k == "check") check = v;
                if (k == "status") status = v;
                if (k == "detail") detail = v;
                if (k == "remedy") remedy = v;
            }
            std::printf("  %-6s %s: %s\n", ("[" + status + "]").c_str(), check.c_str(),
                        detail.c_str());
            if (!remedy.empty() && remedy != "-")
                std::printf("         remedy: %s\n", remedy.c_str());
        }
        for (const auto& n : s.notes)
            std::printf("  note: %s\n", n.c_str());
        return;
    }
    std::vector<std::string> cols;
    for (const auto& r : s.rows)
        for (const auto& [c, v] : r.cells)
            if (std::find(cols.begin(), cols.end(), c) == cols.end()) cols.push_back(c);
    // A cell longer than kCellMax characters wraps onto more lines of its row, at spaces where
    // it can (--wide: never); nothing is cut.
    const std::size_t cell_max = wide ? std::string::npos : 60;
    auto cell = [](const talaria::info::Row& r, const std::string& c) -> std::string {
        for (const auto& [k, v] : r.cells)
            if (k == c) return v;
        return "-";
    };
    auto wrap = [cell_max](const std::string& v) {
        std::vector<std::string> lines;
        std::string_view rest = v;
        while (rest.size() > cell_max) {
            std::size_t cut = rest.rfind(' ', cell_max);
            if (cut == std::string_view::npos || cut < cell_max / 2) cut = cell_max;
            lines.emplace_back(rest.substr(0, cut));
            rest.remove_prefix(cut);
            while (!rest.empty() && rest.front() == ' ')
                rest.remove_prefix(1);
        }
        lines.emplace_back(rest);
        return lines;
    };
    std::vector<std::size_t> width;
    for (const auto& c : cols) {
        std::size_t w = c.size();
        for (const auto& r : s.rows)
            for (const auto& l : wrap(cell(r, c)))
                w = std::max(w, l.size());
        width.push_back(w);
    }
    if (!s.rows.empty()) {
        std::string line = " ";
        for (std::size_t i = 0; i < cols.size(); ++i)
            line += fmt::format(" {:<{}}", cols[i], width[i]);
        line.erase(line.find_last_not_of(' ') + 1);
        std::printf("%s\n", line.c_str());
        for (const auto& r : s.rows) {
            std::vector<std::vector<std::string>> parts;
            std::size_t height = 1;
            for (const auto& c : cols) {
                parts.push_back(wrap(cell(r, c)));
                height = std::max(height, parts.back().size());
            }
            for (std::size_t k = 0; k < height; ++k) {
                line = " ";
                for (std::size_t i = 0; i < cols.size(); ++i)
                    line +=
                        fmt::format(" {:<{}}", k < parts[i].size() ? parts[i][k] : "", width[i]);
                // Trailing blanks of the last column are noise.
                line.erase(line.find_last_not_of(' ') + 1);
                std::printf("%s\n", line.c_str());
            }
        }
    }
    for (const auto& n : s.notes)
        std::printf("  note: %s\n", n.c_str());
}

}  // namespace talaria::info

namespace {

using talaria::info::Section;

/// A cell as a JSON value: "yes"/"no" (and "true"/"false") as booleans, "-" (nothing) as null, a
/// decimal integer as a number, anything else (4K, unlimited, an address, an error) as the whole
/// string.
nlohmann::ordered_json typed(const std::string& v) {
    if (v == "yes" || v == "true") return true;
    if (v == "no" || v == "false") return false;
    if (v == "-") return nullptr;
    if (!v.empty() && v.size() <= 18 && v.find_first_not_of("0123456789") == std::string::npos)
        return std::stoull(v);
    return v;
}

/// A column's name as a JSON key: "max msg" -> "max_msg" (keys a program reads as fields).
std::string json_key(std::string c) {
    std::replace(c.begin(), c.end(), ' ', '_');
    return c;
}

nlohmann::ordered_json to_json(const Section& s) {
    nlohmann::ordered_json j;
    j["title"] = s.title;
    j["rows"] = nlohmann::ordered_json::array();
    for (const auto& r : s.rows) {
        nlohmann::ordered_json o;
        for (const auto& [c, v] : r.cells)
            o[json_key(c)] = typed(v);
        j["rows"].push_back(std::move(o));
    }
    j["notes"] = s.notes;
    return j;
}

/// A --doctor check that failed (the exit status says so).
bool failed_check(const std::vector<Section>& sections) {
    for (const auto& s : sections)
        for (const auto& r : s.rows)
            for (const auto& [k, v] : r.cells)
                if (s.key == "doctor" && k == "status" && v == "fail") return true;
    return false;
}

}  // namespace

int main(int argc, char** argv) {
#if TALARIA_HAVE_UCX
    // UCX writes its own diagnostics on stdout, from the moment libucs loads (before main) at
    // UCX_LOG_LEVEL=debug, unless UCX_LOG_FILE names another stream. Run again with it set to
    // stderr (UCX takes the name), so that stdout carries the tables or the JSON alone. Not
    // where the user named a log file.
    if (!std::getenv("UCX_LOG_FILE")) {
        // TALARIA_INFO_UCX_LOG_FILE tells -c that the variable is ours, not the user's.
        std::vector<std::string> env{"UCX_LOG_FILE=stderr", "TALARIA_INFO_UCX_LOG_FILE=1"};
        // Probing every transport makes UCX complain about devices it cannot use (the table's
        // error column says it): not printed here, unless the user asked (UCX_LOG_LEVEL).
        if (!std::getenv("UCX_LOG_LEVEL")) env.emplace_back("UCX_LOG_LEVEL=fatal");
        for (char** e = environ; *e; ++e)
            env.emplace_back(*e);
        std::vector<char*> envp;
        for (auto& e : env)
            envp.push_back(e.data());
        envp.push_back(nullptr);
        ::execve("/proc/self/exe", argv, envp.data());  // returns only if it failed: go on
    }
#endif
    CLI::App app{
        "talaria-info: transports built into Talaria, and the libfabric providers and "
        "UCX transports this machine has"};
    // The Mercury C API's version: that of the Mercury interface libmercury.so.2 provides.
    app.set_version_flag("--version", fmt::format("talaria-info {}, Mercury C API {}.{}.{}",
                                                  talaria::version().string, HG_VERSION_MAJOR,
                                                  HG_VERSION_MINOR, HG_VERSION_PATCH));
    bool json = false;
    bool wide = false;
    std::vector<std::string> only;
    app.add_flag("--json", json, "Print one JSON object instead of tables");
    app.add_flag("--wide", wide,
                 "Print each table cell on one line, however long (else long "
                 "cells wrap within their column)");
    app.add_option("--section,-s", only, "Only these sections: transports, libfabric, ucx")
        ->check(CLI::IsMember({"transports", "libfabric", "ucx"}));
    talaria::info::AttachOptions at;
    long timeout_ms = 5000;
    app.add_option("--attach", at.address,
                   "Ask the running engine at ADDRESS (one that called "
                   "Engine::enable_introspection()) instead of describing this machine");
    app.add_option("--what", at.what, "With --attach: what to ask for")
        ->check(CLI::IsMember({"stats", "health", "config", "in-flight", "prometheus"}))
        ->default_str("stats");
    app.add_option("--watch", at.watch,
                   "With --attach: ask again every this many seconds, like top (JSON: one line "
                   "each)");
    app.add_option("--count", at.count, "With --watch: stop after this many (0: never)");
    app.add_option("--from", at.from,
                   "With --attach: the address this side opens its engine with (default: the "
                   "target's transport, on the loopback if the target is)");
    std::string doctor_address;
    auto* doctor = app.add_option("--doctor", doctor_address,
                                  "Check what commonly breaks (ptrace scope, /dev/shm, locked "
                                  "memory, libfabric and its tuning, UCX) and, given a "
                                  "tcp/ofi+tcp/ucx+tcp ADDRESS, whether its port answers, or "
                                  "given sm://NAME, whether a live engine answers there; exit 1 "
                                  "on a failed check")
                       ->expected(0, 1);
    bool variables = false;
    app.add_flag("-c,--variables", variables,
                 "List every environment variable and configuration key Talaria reads, with its "
                 "default and meaning (like ucx_info -c)");
    app.add_option("--client-config", at.config,
                   "With --attach: open this side's engine with this EngineConfig JSON file "
                   "(e.g. its na.auth: key_id and secret_file of a service that asks for a "
                   "shared secret; its address, unless --from)");
    app.add_option("--timeout-ms", timeout_ms, "With --attach: how long to wait for an answer")
        ->check(CLI::Range(1L, 3600000L));
    CLI11_PARSE(app, argc, argv);
    if (!at.address.empty()) {
        at.json = json;
        at.timeout = std::chrono::milliseconds(timeout_ms);
        return talaria::info::attach(at);
    }

    auto wanted = [&](const char* key) {
        return only.empty() || std::find(only.begin(), only.end(), key) != only.end();
    };
    // What the probes print (UCX's and libfabric's own diagnostics where their loggers are not
    // hooked yet: a section alone, UCX_LOG_LEVEL=info) goes to stderr, not into the tables or
    // the JSON: stdout is ours until the sections are built.
    // Probes open each transport once: what a transport warns about there (tuning advice, a
    // provider missing) is in the tables; the user's TALARIA_LOG still has its say.
    if (!std::getenv("TALARIA_LOG")) talaria::log::configure("error");
    std::fflush(stdout);
    const int out = ::dup(STDOUT_FILENO);
    if (out >= 0) ::dup2(STDERR_FILENO, STDOUT_FILENO);
    std::vector<Section> sections;
    if (doctor->count() > 0) {
        sections.push_back(talaria::info::doctor_section(doctor_address));
    } else if (variables) {
        sections.push_back(talaria::info::variables_section());
    } else {
        if (wanted("transports")) sections.push_back(talaria::info::transports_section());
        if (wanted("libfabric")) sections.push_back(talaria::info::libfabric_section());
        if (wanted("ucx")) sections.push_back(talaria::info::ucx_section());
    }
    std::fflush(stdout);
    if (out >= 0) {
        ::dup2(out, STDOUT_FILENO);
        ::close(out);
    }

    if (json) {
        nlohmann::ordered_json j;
        j["talaria_version"] = TALARIA_VERSION;
        for (const auto& s : sections)
            j[s.key] = to_json(s);
        std::printf("%s\n", j.dump(2).c_str());
        return failed_check(sections) ? 1 : 0;
    }
    std::printf("Talaria %s\n", TALARIA_VERSION);
    for (const auto& s : sections)
        talaria::info::print_table(s, wide);
    return failed_check(sections) ? 1 : 0;
}
