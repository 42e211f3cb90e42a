// Logging: spec parsing, per-subsystem levels, lazy argument evaluation, and the environment
// variables (TALARIA_LOG, TALARIA_LOG_FILE), which are read once before main() and are
// therefore tested in a re-executed child (threadsafe death-test style).
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "talaria/util/log.hpp"

namespace talaria::log {
namespace {

constexpr int kSubsysCount = static_cast<int>(Subsys::count);

// Every test starts from the default (warn everywhere) and leaves it that way.
class Log : public ::testing::Test {
  protected:
    void SetUp() override { reset(); }
    void TearDown() override { reset(); }
    static void reset() {
        for (int i = 0; i < kSubsysCount; ++i)
            set_level(static_cast<Subsys>(i), Level::warn);
    }
};

TEST_F(Log, NamesAreDistinctAndKnown) {
    std::set<std::string_view> subsys;
    for (int i = 0; i < kSubsysCount; ++i) {
        auto n = subsys_name(static_cast<Subsys>(i));
        EXPECT_NE(n, "?") << "subsystem " << i << " has no name";
        EXPECT_TRUE(subsys.insert(n).second) << n;
    }
    EXPECT_EQ(subsys_name(Subsys::tcp), "tcp");
    EXPECT_EQ(subsys_name(Subsys::count), "?");
    const std::array<std::string_view, 6> levels = {"off",  "error", "warn",
                                                    "info", "debug", "trace"};
    for (std::size_t i = 0; i < levels.size(); ++i)
        EXPECT_EQ(level_name(static_cast<Level>(i)), levels[i]);
    EXPECT_EQ(level_name(static_cast<Level>(99)), "?");
}

TEST_F(Log, DefaultIsWarn) {
    for (int i = 0; i < kSubsysCount; ++i) {
        auto s = static_cast<Subsys>(i);
        EXPECT_TRUE(enabled(s, Level::error));
        EXPECT_TRUE(enabled(s, Level::warn));
        EXPECT_FALSE(enabled(s, Level::info));
    }
}

TEST_F(Log, ConfigureSpec) {
    ASSERT_TRUE(configure("warn,na=debug,tcp=trace"));
    EXPECT_TRUE(enabled(Subsys::na, Level::debug));
    EXPECT_FALSE(enabled(Subsys::na, Level::trace));
    EXPECT_TRUE(enabled(Subsys::tcp, Level::trace));
    EXPECT_TRUE(enabled(Subsys::sm, Level::warn));
    EXPECT_FALSE(enabled(Subsys::sm, Level::info));
    EXPECT_FALSE(enabled(Subsys::util, Level::info));

    // A bare level applies to all subsystems; later items override earlier ones.
    ASSERT_TRUE(configure("tcp=trace,error"));
    EXPECT_FALSE(enabled(Subsys::tcp, Level::warn));
    EXPECT_TRUE(enabled(Subsys::tcp, Level::error));

    ASSERT_TRUE(configure("off"));
    for (int i = 0; i < kSubsysCount; ++i)
        EXPECT_FALSE(enabled(static_cast<Subsys>(i), Level::error));

    // Empty items and an empty spec change nothing.
    ASSERT_TRUE(configure(""));
    ASSERT_TRUE(configure(",,sm=info,"));
    EXPECT_TRUE(enabled(Subsys::sm, Level::info));
    EXPECT_FALSE(enabled(Subsys::sm, Level::debug));
    EXPECT_FALSE(enabled(Subsys::na, Level::error));
}

TEST_F(Log, EverySubsystemNameConfigures) {
    for (int i = 0; i < kSubsysCount; ++i) {
        auto s = static_cast<Subsys>(i);
        std::string spec = "off," + std::string(subsys_name(s)) + "=trace";
        ASSERT_TRUE(configure(spec)) << spec;
        for (int j = 0; j < kSubsysCount; ++j)
            EXPECT_EQ(enabled(static_cast<Subsys>(j), Level::trace), i == j) << spec;
    }
}

TEST_F(Log, BadSpecsAreRejectedAndApplyNothing) {
    ASSERT_TRUE(configure("error,na=info"));
    for (const char* bad :
         {"loud", "na=loud", "bogus=debug", "=debug", "na=", "na==debug", "warn;na=debug",
          "trace,bogus=debug", "na=debug,tcp", "NA=debug", "Warn", "na=debug,tcp=7"}) {
        EXPECT_FALSE(configure(bad)) << "accepted '" << bad << "'";
        // Nothing of the bad spec was applied, not even its valid prefix.
        EXPECT_TRUE(enabled(Subsys::na, Level::info)) << bad;
        EXPECT_FALSE(enabled(Subsys::na, Level::debug)) << bad;
        EXPECT_TRUE(enabled(Subsys::tcp, Level::error)) << bad;
        EXPECT_FALSE(enabled(Subsys::tcp, Level::warn)) << bad;
    }
}

TEST_F(Log, SetLevel) {
    set_level(Subsys::bulk, Level::trace);
    EXPECT_TRUE(enabled(Subsys::bulk, Level::trace));
    EXPECT_FALSE(enabled(Subsys::core, Level::info));
    set_level(Subsys::bulk, Level::off);
    EXPECT_FALSE(enabled(Subsys::bulk, Level::error));
}

TEST_F(Log, DisabledStatementsDoNotEvaluateArguments) {
    int calls = 0;
    auto costly = [&calls] {
        ++calls;
        return 1;
    };
    set_level(Subsys::util, Level::warn);
    TALARIA_LOG(util, debug, "not shown {}", costly());
    TALARIA_LOG(util, trace, "not shown {} {}", costly(), costly());
    TALARIA_LOG(tcp, info, "not shown {}", costly());
    EXPECT_EQ(calls, 0);

    set_level(Subsys::util, Level::off);
    TALARIA_LOG(util, error, "not shown {}", costly());
    EXPECT_EQ(calls, 0);

    set_level(Subsys::util, Level::debug);
    TALARIA_LOG(util, debug, "log_test: enabled statement evaluates {}", costly());
    EXPECT_EQ(calls, 1);
}

// --- environment, in a re-executed child --------------------------------------------------

std::string temp_path(const char* stem) {
    return ::testing::TempDir() + stem + std::to_string(::getpid()) + ".log";
}

// One line of log output: "<UTC time> <pid> <level> <subsys> <file>:<line>: <message>".
// (Parsed by hand: std::regex trips GCC 12's -Wmaybe-uninitialized under the sanitizers.)
struct Line {
    long pid = 0;
    std::string level, subsys, file, message;
    int line = 0;
};

bool all_digits(std::string_view s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

std::optional<Line> parse_line(std::string_view l) {
    auto next = [&l]() -> std::string_view {
        auto sp = l.find(' ');
        if (sp == std::string_view::npos) return {};
        auto tok = l.substr(0, sp);
        l.remove_prefix(sp + 1);
        return tok;
    };
    Line out;
    // "2026-11-29T02:51:59.123456Z": UTC, to the microsecond.
    auto ts = next();
    auto dot = ts.find('.');
    auto digits_at = [&ts](std::size_t at, std::size_t n) {
        return ts.size() >= at + n && all_digits(ts.substr(at, n));
    };
    if (ts.size() != 27 || dot != 19 || !digits_at(0, 4) || ts[4] != '-' || !digits_at(5, 2) ||
        ts[7] != '-' || !digits_at(8, 2) || ts[10] != 'T' || !digits_at(11, 2) || ts[13] != ':' ||
        !digits_at(14, 2) || ts[16] != ':' || !digits_at(17, 2) || !digits_at(20, 6) ||
        ts[26] != 'Z')
        return std::nullopt;
    auto pid = next();
    if (!all_digits(pid)) return std::nullopt;
    out.pid = std::stol(std::string(pid));
    out.level = next();
    out.subsys = next();
    auto where = next();  // "file.cpp:123:"
    if (out.level.empty() || out.subsys.empty() || where.size() < 3 || where.back() != ':')
        return std::nullopt;
    where.remove_suffix(1);
    auto colon = where.rfind(':');
    if (colon == std::string_view::npos || !all_digits(where.substr(colon + 1)))
        return std::nullopt;
    out.file = where.substr(0, colon);
    out.line = std::stoi(std::string(where.substr(colon + 1)));
    out.message = l;
    return out;
}

std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);)
        lines.push_back(l);
    return lines;
}

class LogDeathTest : public ::testing::Test {
  protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    void TearDown() override {
        ::unsetenv("TALARIA_LOG");
        ::unsetenv("TALARIA_LOG_FILE");
    }
};

TEST_F(LogDeathTest, LogFileAndSpecFromEnvironment) {
    const std::string path = temp_path("talaria_log_env_");
    std::remove(path.c_str());
    ASSERT_EQ(::setenv("TALARIA_LOG_FILE", path.c_str(), 1), 0);
    ASSERT_EQ(::setenv("TALARIA_LOG", "error,tcp=debug", 1), 0);
    EXPECT_EXIT(
        {
            if (!enabled(Subsys::tcp, Level::debug) || enabled(Subsys::tcp, Level::trace) ||
                enabled(Subsys::na, Level::warn))
                std::_Exit(3);
            TALARIA_LOG(tcp, debug, "hello {} {}", 42, "world");
            TALARIA_LOG(na, warn, "suppressed");
            TALARIA_LOG(na, error, "second line");
            std::_Exit(0);
        },
        ::testing::ExitedWithCode(0), "");
    auto lines = read_lines(path);
    std::remove(path.c_str());
    ASSERT_EQ(lines.size(), 2u);
    auto a = parse_line(lines[0]);
    ASSERT_TRUE(a) << "malformed: " << lines[0];
    EXPECT_NE(a->pid, long(::getpid())) << "written by the child";
    EXPECT_EQ(a->level, "debug");
    EXPECT_EQ(a->subsys, "tcp");
    EXPECT_EQ(a->file, "log_test.cpp") << "the file name is shown without its directory";
    EXPECT_GT(a->line, 0);
    EXPECT_EQ(a->message, "hello 42 world");
    auto b = parse_line(lines[1]);
    ASSERT_TRUE(b) << "malformed: " << lines[1];
    EXPECT_EQ(b->pid, a->pid);
    EXPECT_EQ(b->level, "error");
    EXPECT_EQ(b->subsys, "na");
    EXPECT_GT(b->line, a->line);
    EXPECT_EQ(b->message, "second line");
}

TEST_F(LogDeathTest, BadEnvironmentSpecIsReportedAndIgnored) {
    ASSERT_EQ(::setenv("TALARIA_LOG", "na=loud", 1), 0);
    EXPECT_EXIT(
        {
            // Still the default: warn everywhere.
            bool dflt = enabled(Subsys::na, Level::warn) && !enabled(Subsys::na, Level::info);
            std::_Exit(dflt ? 0 : 3);
        },
        ::testing::ExitedWithCode(0), "ignoring bad TALARIA_LOG='na=loud'");
}

TEST_F(LogDeathTest, ConcurrentWritersProduceWholeLines) {
    const std::string path = temp_path("talaria_log_mt_");
    std::remove(path.c_str());
    ASSERT_EQ(::setenv("TALARIA_LOG_FILE", path.c_str(), 1), 0);
    ::unsetenv("TALARIA_LOG");  // the default (warn) applies, whatever the caller's environment
    constexpr int kThreads = 4;
    constexpr int kLines = 200;
    EXPECT_EXIT(
        {
            std::vector<std::thread> ts;
            for (int t = 0; t < kThreads; ++t)
                ts.emplace_back([t] {
                    for (int i = 0; i < kLines; ++i)
                        TALARIA_LOG(perf, warn, "thread {} line {} {}", t, i,
                                    std::string(100, char('a' + t)));
                });
            for (auto& th : ts)
                th.join();
            std::exit(0);  // not _Exit: under TSan, a reported race turns into exit code 66
        },
        ::testing::ExitedWithCode(0), "");
    auto lines = read_lines(path);
    std::remove(path.c_str());
    ASSERT_EQ(lines.size(), std::size_t(kThreads * kLines));
    std::array<int, kThreads> next{};
    for (const auto& l : lines) {
        auto p = parse_line(l);
        ASSERT_TRUE(p) << "torn line: " << l;
        EXPECT_EQ(p->level, "warn");
        EXPECT_EQ(p->subsys, "perf");
        // "thread <t> line <i> <100 letters>"
        int t = -1, i = -1;
        char text[128] = {};
        ASSERT_EQ(std::sscanf(p->message.c_str(), "thread %d line %d %127s", &t, &i, text), 3)
            << "torn line: " << l;
        ASSERT_GE(t, 0);
        ASSERT_LT(t, kThreads);
        EXPECT_EQ(i, next[t]++) << "lines of one thread out of order";
        EXPECT_EQ(std::string(text), std::string(100, char('a' + t))) << "torn line: " << l;
    }
}

}  // namespace
}  // namespace talaria::log

namespace talaria::log {
namespace {

// Issue 12: a sink replaces the writer (every enabled message, with its fields); an empty one
// restores the default; a sink that throws loses its message, not the program.
TEST(LogSink, ReplacesTheWriterUntilReset) {
    std::vector<std::string> got;
    std::vector<Subsys> subsys;
    set_sink([&](const Record& r) {
        got.emplace_back(r.message);
        subsys.push_back(r.subsys);
        EXPECT_EQ(r.level, Level::warn);
        EXPECT_EQ(r.file, "log_test.cpp");
        EXPECT_GT(r.line, 0);
        EXPECT_GT(r.unix_ns, int64_t(1'600'000'000) * 1'000'000'000);
    });
    TALARIA_LOG(rpc, warn, "to the sink {}", 1);
    TALARIA_LOG(rpc, debug, "not enabled {}", 2);
    set_sink({});
    TALARIA_LOG(rpc, warn, "to stderr again");
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], "to the sink 1");
    EXPECT_EQ(subsys[0], Subsys::rpc);
    set_sink([](const Record&) { throw std::runtime_error("sink failed"); });
    TALARIA_LOG(core, warn, "lost, not fatal");
    set_sink({});
    EXPECT_EQ(subsys_name(Subsys::rpc), "rpc");
}

}  // namespace
}  // namespace talaria::log
