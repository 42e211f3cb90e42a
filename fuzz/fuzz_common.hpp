// Shared by the fuzz targets that drive every transport's decoders.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "talaria/na/na.hpp"
#include "talaria/util/log.hpp"

namespace talaria::fuzz {

/// Report a broken invariant of `t` and abort, so libFuzzer keeps the input.
[[noreturn]] inline void fail(const char* target, const na::Transport& t, const char* what,
                              std::string_view detail = {}) {
    std::fprintf(stderr, "%s: %.*s transport: %s%s%.*s\n", target, int(t.name().size()),
                 t.name().data(), what, detail.empty() ? "" : ": ", int(detail.size()),
                 detail.data());
    std::abort();
}

/// Every built transport, opened once per process; ones that fail to open are skipped (said).
inline std::vector<std::unique_ptr<na::Transport>>& transports(const char* target) {
    static auto* ts = [target] {
        // Bad input is the normal case here: keep the expected warnings out of the way unless
        // the user asked for logging.
        if (!std::getenv("TALARIA_LOG")) log::configure("error");
        auto* v = new std::vector<std::unique_ptr<na::Transport>>;
        for (const char* url : {"inproc://fuzz", "sm://", "tcp://127.0.0.1:0"}) {
            auto t = na::open(url);
            if (t)
                v->push_back(std::move(*t));
            else
                std::fprintf(stderr, "%s: skipping %s: %s\n", target, url,
                             t.error().describe().c_str());
        }
        return v;
    }();
    return *ts;
}

}  // namespace talaria::fuzz
