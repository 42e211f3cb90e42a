// Runs a function with this process's stdout and stderr redirected to files, and returns what
// was written to each: for tests that check where a library's messages go.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace talaria::na::test {

struct Output {
    std::string out;  ///< written to stdout
    std::string err;  ///< written to stderr
};

template <class F>
Output capture_output(F&& fn) {
    std::fflush(stdout);
    std::fflush(stderr);
    char out_path[] = "/tmp/talaria-stdout-XXXXXX";
    char err_path[] = "/tmp/talaria-stderr-XXXXXX";
    int out_fd = ::mkstemp(out_path);
    int err_fd = ::mkstemp(err_path);
    if (out_fd < 0 || err_fd < 0) std::abort();
    int saved_out = ::dup(1);
    int saved_err = ::dup(2);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    std::forward<F>(fn)();
    std::fflush(stdout);
    std::fflush(stderr);
    ::dup2(saved_out, 1);
    ::dup2(saved_err, 2);
    ::close(saved_out);
    ::close(saved_err);
    auto slurp = [](int fd, const char* path) {
        std::string text;
        char buf[4096];
        ::lseek(fd, 0, SEEK_SET);
        for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
            text.append(buf, std::size_t(n));
        ::close(fd);
        ::unlink(path);
        return text;
    };
    Output o;
    o.out = slurp(out_fd, out_path);
    o.err = slurp(err_fd, err_path);
    return o;
}

}  // namespace talaria::na::test
