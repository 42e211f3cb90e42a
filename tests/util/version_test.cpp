#include "talaria/version.hpp"

#include "talaria/config.hpp"

#include <gtest/gtest.h>

#include <string>

// The library's version is the headers' (one build), the number orders as the string says,
// and the string is MAJOR.MINOR.PATCH of the same parts.
TEST(Version, LibraryAgreesWithTheHeaders) {
    const talaria::Version v = talaria::version();
    EXPECT_EQ(v.major, TALARIA_VERSION_MAJOR);
    EXPECT_EQ(v.minor, TALARIA_VERSION_MINOR);
    EXPECT_EQ(v.patch, TALARIA_VERSION_PATCH);
    EXPECT_EQ(v.string, TALARIA_VERSION_STRING);
    EXPECT_EQ(v.string, TALARIA_VERSION);  // config.hpp's, the same
    EXPECT_EQ(v.number(), TALARIA_VERSION_NUMBER);
    EXPECT_EQ(std::string(v.string), std::to_string(v.major) + "." + std::to_string(v.minor) + "." +
                                         std::to_string(v.patch));
    static_assert(talaria::Version{1, 2, 3, "1.2.3"}.number() == 10203);
    static_assert(talaria::Version{0, 10, 0, "0.10.0"}.number() >
                  talaria::Version{0, 9, 99, "0.9.99"}.number());
}
