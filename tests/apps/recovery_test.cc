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

// The pace: a whole step is one after the last seen; a resume's beats time
// nothing; where the job stood is its slowest rank's last step, when the
// last rank at that step beat it.
TEST(StepPaceTest, WholeStepsTimeTheRunAndTheSlowestRankSaysWhereItStood) {
  StepPace pace;
  EXPECT_FALSE(pace.Reached(2));
  EXPECT_EQ(pace.StepSeconds(), 0);
  for (int64_t step = 0; step < 5; ++step) {
    pace.OnBeat(0, step, 100.0 + step * 0.5);
    pace.OnBeat(1, step, 100.1 + step * 0.5);
  }
  pace.OnBeat(0, 5, 102.5);  // rank 0 one step ahead
  EXPECT_DOUBLE_EQ(pace.StepSeconds(), 0.5);
  auto reached = pace.Reached(2);
  ASSERT_TRUE(reached);
  EXPECT_EQ(reached->first, 4);
  EXPECT_DOUBLE_EQ(reached->second, 102.1);
  EXPECT_FALSE(pace.Reached(3));
  pace.Restart();
  pace.OnBeat(0, 3, 200.0);   // resumed from step 3: no duration
  pace.OnBeat(0, -2, 201.0);  // "done": ignored
  EXPECT_DOUBLE_EQ(pace.StepSeconds(), 0.5);
  EXPECT_FALSE(pace.Reached(2));
}

// The time lost: when the step after the one reached completes again (its
// last rank), minus when it would have undisturbed; unknown until then.
TEST(RecoveryTest, TimeLostOnceEveryRankIsBackPastWhereTheJobStood) {
  RecoveryTimes t = Times();
  t.reached_step = 152;
  t.reached_at = 99.9;
  t.step_s = 0.5;
  auto b = Breakdown(t, 2);
  ASSERT_TRUE(b);
  EXPECT_LT(b->lost, 0);
  EXPECT_EQ(RecoveryLine(*b).find("time lost"), std::string::npos);
  t.back[0] = {153, 102.0};
  EXPECT_LT(Breakdown(t, 2)->lost, 0);
  t.back[1] = {153, 102.3};
  b = Breakdown(t, 2);
  EXPECT_NEAR(b->lost, 102.3 - (99.9 + 0.5), 1e-9);
  EXPECT_EQ(b->back_step, 153);
  EXPECT_NE(RecoveryLine(*b).find("; time lost 1.90 s (back at step 153)"),
            std::string::npos)
      << RecoveryLine(*b);
  // In place, a replacement takes a survivor's newer state and comes back
  // at a later step: it is late against that step's undisturbed time.
  t.back[1] = {155, 103.2};
  b = Breakdown(t, 2);
  EXPECT_NEAR(b->lost, 103.2 - (99.9 + 3 * 0.5), 1e-9);
  EXPECT_EQ(b->back_step, 155);
}

}  // namespace
}  // namespace dtrun::agent
