// <talaria/talaria.hpp> is self-sufficient: this file includes nothing else from the library.
#include <talaria/talaria.hpp>

#include <gtest/gtest.h>

namespace {

TEST(ApiHeader, IncludesEverythingUsersNeed) {
    talaria::Exception e(talaria::Errc::timeout, "late");
    EXPECT_EQ(e.code(), talaria::Errc::timeout);
    EXPECT_EQ(e.error().message(), "late");
    EXPECT_NE(std::string(e.what()).find("late"), std::string::npos);

    auto f = talaria::Future<int>::ready_with(7);
    EXPECT_TRUE(f.ready());
    EXPECT_EQ(f.get(), 7);

    auto task = []() -> talaria::Task<int> { co_return 5; };
    EXPECT_EQ(talaria::sync_wait(task()), 5);

    static_assert(talaria::read_only == talaria::na::Access::read_only);
    static_assert(talaria::core::rpc_id("sum") != 0);
}

}  // namespace
