// A recovery's breakdown from the moments the local group saw: pure.
#include "apps/dtrun/recovery.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

TEST(RecoveryTest, TheResumeRecord) {
  auto r = ParseResumeRecord("150 memory 1000.25 1000.5\n");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->step, 150);
  EXPECT_EQ(r->source, "memory");
  EXPECT_DOUBLE_EQ(r->init_unix, 1000.25);
  EXPECT_DOUBLE_EQ(r->load_unix, 1000.5);
  EXPECT_FALSE(ParseResumeRecord("150 memory 1000.25 1000.5"));  // not whole
  EXPECT_FALSE(
      ParseResumeRecord("150 memory 1000.5 1000.25\n"));  // load < init
  EXPECT_FALSE(ParseResumeRecord("x memory 1 2\n"));
  EXPECT_FALSE(ParseResumeRecord(""));
}

RecoveryTimes Times() {
  RecoveryTimes t;
  t.failed = 100.0;
  t.decided = 100.002;
  t.spawn_begin = 100.012;
  t.spawn_end = 100.043;
  t.resumed[0] = {150, "memory", 100.2, 100.35};
  t.resumed[1] = {150, "memory", 100.253, 100.433};
  t.first_step[0] = 100.8;
  t.first_step[1] = 100.823;
  return t;
}

TEST(RecoveryTest, EachPhaseEndsWithItsLastRank) {
  auto b = Breakdown(Times(), 2);
  ASSERT_TRUE(b);
  EXPECT_NEAR(b->total, 0.823, 1e-9);
  EXPECT_NEAR(b->detect, 0.002, 1e-9);
  EXPECT_NEAR(b->regroup, 0.010, 1e-9);
  EXPECT_NEAR(b->start, 0.031, 1e-9);
  EXPECT_NEAR(b->init, 0.21, 1e-9);
  EXPECT_NEAR(b->load, 0.18, 1e-9);
  EXPECT_NEAR(b->first_step, 0.39, 1e-9);
  // The phases add up to the whole.
  EXPECT_NEAR(
      b->detect + b->regroup + b->start + b->init + b->load + b->first_step,
      b->total, 1e-9);
  EXPECT_EQ(RecoveryLine(*b),
            "recovered in 0.82 s: detect 0.002, regroup 0.010, start 0.031, "
            "init 0.21, load 0.18, first step 0.39 (from step 150, memory)");
}

// A beat file's mtime comes from the kernel's coarse clock and may read a
// little before the load the worker timed just before: no negative phase.
TEST(RecoveryTest, CoarseClocksMakeNoNegativePhase) {
  RecoveryTimes t = Times();
  t.first_step[0] = 100.430;
  t.first_step[1] = 100.431;  // before the last load (100.433)
  auto b = Breakdown(t, 2);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->first_step, 0);
  EXPECT_NEAR(b->total, 0.433, 1e-9);
  EXPECT_NEAR(
      b->detect + b->regroup + b->start + b->init + b->load + b->first_step,
      b->total, 1e-12);
}

TEST(RecoveryTest, NothingUntilEveryRankTookAStepAfterItsResume) {
  RecoveryTimes t = Times();
  t.first_step.erase(1);
  EXPECT_FALSE(Breakdown(t, 2));
  t = Times();
  t.resumed.erase(0);
  EXPECT_FALSE(Breakdown(t, 2));
  EXPECT_FALSE(Breakdown(RecoveryTimes{}, 1));
}

}  // namespace
}  // namespace dtrun::agent
