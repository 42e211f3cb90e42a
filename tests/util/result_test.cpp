// Result, Error, Errc, errno_error and the TALARIA_TRY / TALARIA_CHECK macros.
#include <cerrno>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "talaria/util/result.hpp"

namespace talaria {
namespace {

constexpr int kLastCode = static_cast<int>(talaria::kLastErrc);

TEST(Errc, EveryCodeHasADistinctName) {
    std::set<std::string_view> seen;
    for (int i = 0; i <= kLastCode; ++i) {
        auto name = errc_name(static_cast<Errc>(i));
        EXPECT_FALSE(name.empty()) << "code " << i;
        EXPECT_NE(name, "unknown") << "code " << i << " has no name: update errc_name()";
        EXPECT_TRUE(seen.insert(name).second) << "code " << i << " reuses name " << name;
        for (char c : name)
            EXPECT_TRUE((c >= 'a' && c <= 'z') || c == '_') << "name " << name;
    }
    EXPECT_EQ(seen.size(), std::size_t(kLastCode + 1));
    EXPECT_EQ(errc_name(Errc::ok), "ok");
    EXPECT_EQ(errc_name(Errc::access_denied), "access_denied");
    // Values outside the enum (e.g. decoded from a corrupt wire) do not crash.
    EXPECT_EQ(errc_name(static_cast<Errc>(kLastCode + 1)), "unknown");
    EXPECT_EQ(errc_name(static_cast<Errc>(255)), "unknown");
}

TEST(Error, DescribeWithAndWithoutMessage) {
    Error bare(Errc::timeout);
    EXPECT_EQ(bare.code(), Errc::timeout);
    EXPECT_TRUE(bare.message().empty());
    EXPECT_EQ(bare.describe(), "timeout");
    EXPECT_TRUE(bare == Errc::timeout);
    EXPECT_FALSE(bare == Errc::again);

    Error full(Errc::unreachable, "connect to 127.0.0.1:9: refused");
    EXPECT_EQ(full.describe(), "unreachable: connect to 127.0.0.1:9: refused");
    EXPECT_EQ(full.message(), "connect to 127.0.0.1:9: refused");

    Error dflt;
    EXPECT_EQ(dflt.code(), Errc::internal);
}

TEST(ErrnoError, MapsErrnoToCodes) {
    struct Case {
        int err;
        Errc code;
    };
    const Case cases[] = {
        {EAGAIN, Errc::again},
        {EWOULDBLOCK, Errc::again},
        {ETIMEDOUT, Errc::timeout},
        {ECANCELED, Errc::canceled},
        {EPIPE, Errc::disconnected},
        {ECONNRESET, Errc::disconnected},
        {ENOTCONN, Errc::disconnected},
        {ECONNABORTED, Errc::disconnected},
        {ESHUTDOWN, Errc::disconnected},
        {ECONNREFUSED, Errc::unreachable},
        {EHOSTUNREACH, Errc::unreachable},
        {ENETUNREACH, Errc::unreachable},
        {ESRCH, Errc::unreachable},
        {ENOENT, Errc::unreachable},
        {EINVAL, Errc::invalid_argument},
        {EFAULT, Errc::out_of_range},
        {EPERM, Errc::permission_denied},
        {EACCES, Errc::permission_denied},
        {ENOMEM, Errc::no_memory},
        {ENOBUFS, Errc::no_memory},
        {EADDRINUSE, Errc::address_in_use},
        {EADDRNOTAVAIL, Errc::address_invalid},
        {EMSGSIZE, Errc::message_too_large},
        {EBUSY, Errc::busy},
        {EEXIST, Errc::already_exists},
        {ENOSYS, Errc::not_supported},
        {EOPNOTSUPP, Errc::not_supported},
        {EIO, Errc::io_error},
        {EBADF, Errc::io_error},
        {12345, Errc::io_error},
    };
    for (const auto& c : cases) {
        Error e = errno_error("bind", c.err);
        EXPECT_EQ(e.code(), c.code) << "errno " << c.err << " mapped to " << errc_name(e.code());
        // The message names the call, the errno text and the number.
        EXPECT_EQ(e.message().rfind("bind: ", 0), 0u) << e.message();
        EXPECT_NE(e.message().find("(errno " + std::to_string(c.err) + ")"), std::string::npos)
            << e.message();
    }
    EXPECT_NE(errno_error("open", ENOENT).message().find("No such file"), std::string::npos);
}

TEST(Result, ValueAndError) {
    Result<int> v = 42;
    ASSERT_TRUE(v);
    EXPECT_TRUE(v.has_value());
    EXPECT_EQ(*v, 42);
    EXPECT_EQ(v.value(), 42);
    EXPECT_EQ(v.code(), Errc::ok);

    Result<int> e = Errc::again;
    EXPECT_FALSE(e);
    EXPECT_EQ(e.code(), Errc::again);
    EXPECT_EQ(e.error().code(), Errc::again);

    Result<int> em = Error(Errc::busy, "in use");
    EXPECT_EQ(em.code(), Errc::busy);
    EXPECT_EQ(em.error().message(), "in use");
    Error moved = std::move(em).error();
    EXPECT_EQ(moved.describe(), "busy: in use");
}

TEST(Result, ConvertingConstructorAndMoveOnly) {
    Result<std::string> s = "hello";  // const char* -> std::string
    ASSERT_TRUE(s);
    EXPECT_EQ(s->size(), 5u);

    Result<std::unique_ptr<int>> p = std::make_unique<int>(7);
    ASSERT_TRUE(p);
    std::unique_ptr<int> out = std::move(p).value();
    ASSERT_TRUE(out);
    EXPECT_EQ(*out, 7);
}

TEST(Result, OkWithoutValueIsNotSuccess) {
    // Errc::ok carries no value: a Result<T> built from it must not claim success with
    // code() == ok (callers would then read a value that is not there).
    Result<int> r = Errc::ok;
    EXPECT_FALSE(r);
    EXPECT_NE(r.code(), Errc::ok);
    Result<int> r2 = Error(Errc::ok, "oops");
    EXPECT_FALSE(r2);
    EXPECT_NE(r2.code(), Errc::ok);
}

TEST(Result, Void) {
    Result<void> a;
    EXPECT_TRUE(a);
    EXPECT_EQ(a.code(), Errc::ok);
    Result<void> b = ok();
    EXPECT_TRUE(b);
    Result<void> c = Errc::ok;
    EXPECT_TRUE(c);
    Result<void> d = Errc::timeout;
    EXPECT_FALSE(d);
    EXPECT_EQ(d.code(), Errc::timeout);
    Result<void> e = Error(Errc::shutdown, "closing");
    EXPECT_FALSE(e);
    EXPECT_EQ(e.code(), Errc::shutdown);
    EXPECT_EQ(e.error().message(), "closing");
    // An Error holding ok is success, consistent with code().
    Result<void> f = Error(Errc::ok);
    EXPECT_EQ(bool(f), f.code() == Errc::ok);
}

// --- TALARIA_TRY / TALARIA_CHECK -------------------------------------------------------------

Result<int> parse_positive(int x) {
    if (x <= 0) return Error(Errc::invalid_argument, "not positive");
    return x;
}

int g_after_try = 0;

Result<int> doubled(int x) {
    TALARIA_TRY(v, parse_positive(x));
    ++g_after_try;
    return v * 2;
}

Result<void> check_positive(int x) {
    TALARIA_TRY(v, parse_positive(x));
    (void)v;
    return ok();
}

int g_after_check = 0;

Result<void> check_twice(int a, int b) {
    TALARIA_CHECK(check_positive(a));
    TALARIA_CHECK(check_positive(b));
    ++g_after_check;
    return ok();
}

Result<std::unique_ptr<int>> make_boxed(int x) {
    TALARIA_TRY(v, parse_positive(x));
    return std::make_unique<int>(v);
}

Result<int> unbox(int x) {
    TALARIA_TRY(p, make_boxed(x));  // move-only value
    TALARIA_TRY(q, make_boxed(x + 1));
    return *p + *q;
}

TEST(Macros, TryPropagatesErrorAndBindsValue) {
    g_after_try = 0;
    auto good = doubled(21);
    ASSERT_TRUE(good);
    EXPECT_EQ(*good, 42);
    EXPECT_EQ(g_after_try, 1);

    auto bad = doubled(-1);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.code(), Errc::invalid_argument);
    EXPECT_EQ(bad.error().message(), "not positive");
    EXPECT_EQ(g_after_try, 1) << "code after a failed TALARIA_TRY ran";

    auto u = unbox(3);
    ASSERT_TRUE(u);
    EXPECT_EQ(*u, 7);
    EXPECT_EQ(unbox(0).code(), Errc::invalid_argument);
}

TEST(Macros, CheckPropagatesError) {
    g_after_check = 0;
    EXPECT_TRUE(check_twice(1, 2));
    EXPECT_EQ(g_after_check, 1);
    auto r = check_twice(1, -2);
    EXPECT_EQ(r.code(), Errc::invalid_argument);
    EXPECT_EQ(r.error().message(), "not positive");
    EXPECT_EQ(check_twice(-1, 2).code(), Errc::invalid_argument);
    EXPECT_EQ(g_after_check, 1) << "code after a failed TALARIA_CHECK ran";
}

}  // namespace
}  // namespace talaria
