#include "rendezvous/util/check.h"

#include <gtest/gtest.h>

namespace dtrun {
namespace {

int Evaluations(int* count, bool result) {
  ++*count;
  return result;
}

TEST(CheckDeathTest, FailedCheckAbortsNamingConditionAndContext) {
  int slot = 7;
  EXPECT_DEATH(
      DTRUN_CHECK(slot < 3) << "slot " << slot << " past max_nodes",
      "check_test.cc:[0-9]+: check failed: slot < 3: slot 7 past max_nodes");
}

TEST(CheckDeathTest, FailedCheckWithoutContextStillAborts) {
  EXPECT_DEATH(DTRUN_CHECK(1 + 1 == 3), "check failed: 1 \\+ 1 == 3");
}

TEST(CheckTest, PassingCheckEvaluatesConditionOnceAndContextNever) {
  int count = 0, context = 0;
  DTRUN_CHECK(Evaluations(&count, true)) << Evaluations(&context, true);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(context, 0);
}

TEST(CheckTest, CheckIsOneStatementUnderIfElse) {
  int branch = 0;
  if (branch == 0)
    DTRUN_CHECK(true) << "taken";
  else
    branch = 2;
  EXPECT_EQ(branch, 0);
}

}  // namespace
}  // namespace dtrun
