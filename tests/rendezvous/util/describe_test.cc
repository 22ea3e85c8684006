#include "rendezvous/util/describe.h"

#include <gtest/gtest.h>

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

TEST(DescribeTest, KeysListsEveryKeyUpToFour) {
  EXPECT_EQ(DescribeKeys({}), "[]");
  EXPECT_EQ(DescribeKeys({"a"}), "[a]");
  EXPECT_EQ(DescribeKeys({"a", "b", "c", "d"}), "[a, b, c, d]");
}

TEST(DescribeTest, KeysCountsWhatFollowsTheThirdOfFiveOrMore) {
  EXPECT_EQ(DescribeKeys({"a", "b", "c", "d", "e"}), "[a, b, c, ... 2 more]");
  std::vector<std::string> many(48, "k");
  EXPECT_EQ(DescribeKeys(many), "[k, k, k, ... 45 more]");
}

TEST(DescribeTest, SecondsHaveTwoDecimals) {
  EXPECT_EQ(DescribeSeconds(milliseconds(1500)), "1.50s");
  EXPECT_EQ(DescribeSeconds(milliseconds(0)), "0.00s");
  EXPECT_EQ(DescribeSeconds(std::chrono::microseconds(4999)), "0.00s");
  EXPECT_EQ(DescribeSeconds(std::chrono::seconds(600)), "600.00s");
}

}  // namespace
}  // namespace dtrun::rendezvous
