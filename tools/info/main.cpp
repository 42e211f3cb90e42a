// talaria-info: the transports built into Talaria, and the libfabric providers and UCX transports
// this machine has, with what each supports (like fi_info and ucx_info, in one table each).
//
//   talaria-info                 all sections as text
//   talaria-info --json          the same as one JSON object
//   talaria-info -s libfabric    one section (transports, libfabric, ucx)
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "info.hpp"
#include "talaria/config.hpp"
#include "talaria/version.hpp"

namespace {

using talaria::info::Section;

/// Columns side by side, each as wide as its widest cell. Rows may differ in their columns (the
/// header is the union, in first-seen order); missing cells print "-".
void print_table(const Section& s) {
    std::printf("\n%s\n", s.title.c_str());
    std::vector<std::string> cols;
    for (const auto& r : s.rows)
        for (const auto& [c, v] : r.cells)
            if (std::find(cols.begin(), cols.end(), c) == cols.end()) cols.push_back(c);
    auto cell = [](const talaria::info::Row& r, const std::string& c) -> std::string {
        for (const auto& [k, v] : r.cells)
            if (k == c) return v;
        return "-";
    };
    std::vector<std::size_t> width;
    for (const auto& c : cols) {
        std::size_t w = c.size();
        for (const auto& r : s.rows)
            w = std::max(w, cell(r, c).size());
        width.push_back(w);
    }
    if (!s.rows.empty()) {
        std::string line = " ";
        for (std::size_t i = 0; i < cols.size(); ++i)
            line += fmt::format(" {:<{}}", cols[i], width[i]);
        line.erase(line.find_last_not_of(' ') + 1);
        std::printf("%s\n", line.c_str());
        for (const auto& r : s.rows) {
            line = " ";
            for (std::size_t i = 0; i < cols.size(); ++i)
                line += fmt::format(" {:<{}}", cell(r, cols[i]), width[i]);
            // Trailing blanks of the last column are noise.
            line.erase(line.find_last_not_of(' ') + 1);
            std::printf("%s\n", line.c_str());
        }
    }
    for (const auto& n : s.notes)
        std::printf("  note: %s\n", n.c_str());
}

nlohmann::ordered_json to_json(const Section& s) {
    nlohmann::ordered_json j;
    j["title"] = s.title;
    j["rows"] = nlohmann::ordered_json::array();
    for (const auto& r : s.rows) {
        nlohmann::ordered_json o;
        for (const auto& [c, v] : r.cells)
            o[c] = v;
        j["rows"].push_back(std::move(o));
    }
    j["notes"] = s.notes;
    return j;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "talaria-info: transports built into Talaria, and the libfabric providers and "
        "UCX transports this machine has"};
    app.set_version_flag("--version",
                         std::string("talaria-info ") + std::string(talaria::version().string));
    bool json = false;
    std::vector<std::string> only;
    app.add_flag("--json", json, "Print one JSON object instead of tables");
    app.add_option("--section,-s", only, "Only these sections: transports, libfabric, ucx")
        ->check(CLI::IsMember({"transports", "libfabric", "ucx"}));
    CLI11_PARSE(app, argc, argv);

    auto wanted = [&](const char* key) {
        return only.empty() || std::find(only.begin(), only.end(), key) != only.end();
    };
    std::vector<Section> sections;
    if (wanted("transports")) sections.push_back(talaria::info::transports_section());
    if (wanted("libfabric")) sections.push_back(talaria::info::libfabric_section());
    if (wanted("ucx")) sections.push_back(talaria::info::ucx_section());

    if (json) {
        nlohmann::ordered_json j;
        j["talaria_version"] = TALARIA_VERSION;
        for (const auto& s : sections)
            j[s.key] = to_json(s);
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("Talaria %s\n", TALARIA_VERSION);
    for (const auto& s : sections)
        print_table(s);
    return 0;
}
