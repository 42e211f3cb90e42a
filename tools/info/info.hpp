// talaria-info: what this build of Talaria and this machine offer. Each section is a table of
// rows (one per transport, provider or device), printed as text or as JSON.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace talaria::info {

/// One row: ordered (column, value) pairs.
struct Row {
    std::vector<std::pair<std::string, std::string>> cells;
    void add(std::string column, std::string value) {
        cells.emplace_back(std::move(column), std::move(value));
    }
};

/// One section: a title, an explanation of the columns, rows, and notes (e.g. "not built").
struct Section {
    std::string key;    ///< JSON key: "transports", "libfabric", "ucx"
    std::string title;  ///< printed heading
    std::vector<Row> rows;
    std::vector<std::string> notes;
    /// Printed as one line per row ("  [status] check: detail", then "remedy: ..."), whole,
    /// instead of a table with cut cells (--doctor).
    bool as_lines = false;
};

/// The transports built into this library, each opened here once to show whether it works.
Section transports_section();
/// libfabric's providers with reliable datagram endpoints, as fi_getinfo reports them.
Section libfabric_section();
/// UCX's transports (UCT resources) and their capabilities, as ucx_info -d reports them.
Section ucx_section();

/// Every environment variable and configuration key Talaria reads (-c).
Section variables_section();
/// --doctor [ADDRESS]: checks with a status (ok, warn, fail), a detail and a remedy.
Section doctor_section(const std::string& address);

/// Print a section as a table: columns side by side, each as wide as its widest cell; a cell
/// over 60 characters wraps within its column, unless `wide`.
void print_table(const Section& s, bool wide = false);

/// --attach ADDRESS (attach.cpp).
struct AttachOptions {
    std::string address;         ///< the engine to ask
    std::string what = "stats";  ///< stats, health, config, in-flight, prometheus
    std::string from;            ///< this side's engine address ("": derived from `address`)
    std::string config;          ///< an EngineConfig JSON file for this side's engine (auth)
    bool json = false;           ///< the answer as it came (JSON; one line per refresh)
    double watch = 0;            ///< ask again every this many seconds (0: once)
    unsigned count = 0;          ///< with watch: stop after this many (0: never)
    std::chrono::milliseconds timeout{5000};
};
/// Ask, print; the exit status (1 with the reason on stderr when the engine cannot be asked).
int attach(const AttachOptions& o);

}  // namespace talaria::info
