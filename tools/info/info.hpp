// talaria-info: what this build of Talaria and this machine offer. Each section is a table of
// rows (one per transport, provider or device), printed as text or as JSON.
#pragma once

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
};

/// The transports built into this library, each opened here once to show whether it works.
Section transports_section();
/// libfabric's providers with reliable datagram endpoints, as fi_getinfo reports them.
Section libfabric_section();
/// UCX's transports (UCT resources) and their capabilities, as ucx_info -d reports them.
Section ucx_section();

}  // namespace talaria::info
