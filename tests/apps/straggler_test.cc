// Straggler scores from beats' compute times: pure, values in.
#include "apps/dtrun/straggler.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

// `steps` beats of each rank: rank r computes times[r] a step, with +-5%
// of alternating jitter.
void Feed(StragglerScorer* s, const std::vector<double>& times, int steps,
          int from = 4) {
  for (int step = from; step < from + steps; ++step) {
    for (size_t r = 0; r < times.size(); ++r) {
      double jitter = (step % 2 ? 1.05 : 0.95);
      s->OnBeat(static_cast<int>(r), step, times[r] * jitter);
    }
  }
}

TEST(StragglerTest, ARankHalfAgainAsSlowIsNamed) {
  StragglerScorer s;
  Feed(&s, {0.010, 0.015, 0.010}, 20);
  auto straggler = s.Straggler();
  ASSERT_TRUE(straggler);
  EXPECT_EQ(straggler->rank, 1);
  EXPECT_NEAR(straggler->score, 0.667, 0.05);
  EXPECT_NEAR(straggler->typical_s, 0.015, 0.001);
}

TEST(StragglerTest, EvenRanksAndSmallDifferencesAreNot) {
  StragglerScorer s;
  Feed(&s, {0.010, 0.011, 0.0105, 0.012}, 40);  // within 25%
  EXPECT_FALSE(s.Straggler());
  for (const RankScore& r : s.Scores()) EXPECT_GT(r.score, 0.8);
}

TEST(StragglerTest, NoScoreUntilEveryRankHasEnoughSteps) {
  StragglerScorer s(20, 5);
  Feed(&s, {0.010, 0.030}, 4);
  EXPECT_FALSE(s.Straggler());
  s.OnBeat(0, 8, 0.010);
  EXPECT_FALSE(s.Straggler());  // rank 1 has 4
  s.OnBeat(1, 8, 0.030);
  EXPECT_TRUE(s.Straggler());
}

TEST(StragglerTest, WarmUpStepsAreNotScored) {
  StragglerScorer s(20, 2);
  s.OnBeat(0, 1, 0.500);  // steps 1-3: everyone is slow at first
  s.OnBeat(0, 3, 0.500);
  s.OnBeat(1, 2, 0.010);
  s.OnBeat(0, 4, 0.010);
  s.OnBeat(0, 5, 0.010);
  s.OnBeat(1, 4, 0.010);
  s.OnBeat(1, 5, 0.010);
  EXPECT_FALSE(s.Straggler());
}

TEST(StragglerTest, CheckNamesOnlyARankFlaggedOverConfirmOfItsSteps) {
  StragglerScorer s(20, 2, 0.75, 0, 3, 0);
  Feed(&s, {0.010, 0.020}, 2, 1);
  EXPECT_FALSE(s.Check(0));  // flagged at step 2
  EXPECT_FALSE(s.Check(0));  // read again with no new step: still step 2
  EXPECT_FALSE(s.Check(0));
  Feed(&s, {0.010, 0.020}, 2, 3);
  EXPECT_FALSE(s.Check(0));  // step 4: two steps of the streak
  Feed(&s, {0.010, 0.020}, 1, 5);
  auto named = s.Check(0);  // step 5: three
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 1);
  Feed(&s, {0.020, 0.010}, 20, 6);  // now rank 0 is the slow one
  EXPECT_FALSE(s.Check(0));         // a new streak starts
}

// Forty steps of a small model last a second or two: a spell of noise
// that long names nobody; the same streak past 5 s does.
TEST(StragglerTest, AStreakMustLastItsStepsAndFiveSeconds) {
  StragglerScorer s(20, 2, 0.75, 0, 40);
  Feed(&s, {0.010, 0.020}, 2, 1);
  EXPECT_FALSE(s.Check(100.0));  // flagged at step 2, at 100 s
  Feed(&s, {0.010, 0.020}, 60, 3);
  EXPECT_FALSE(s.Check(101.5));  // step 62: 60 steps, but 1.5 s
  Feed(&s, {0.010, 0.020}, 1, 63);
  EXPECT_FALSE(s.Check(104.9));
  Feed(&s, {0.010, 0.020}, 1, 64);
  auto named = s.Check(105.0);  // 5 s
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 1);
  // Five seconds of a streak only 10 steps long: not yet.
  StragglerScorer slow_steps(20, 2, 0.75, 0, 40);
  Feed(&slow_steps, {1.0, 2.0}, 2, 1);
  EXPECT_FALSE(slow_steps.Check(0.0));
  Feed(&slow_steps, {1.0, 2.0}, 10, 3);
  EXPECT_FALSE(slow_steps.Check(20.0));
}

// A score that flickers over the threshold, but not back to kRelease,
// does not start the streak again; back to even does.
TEST(StragglerTest, AFlickerOverTheThresholdKeepsTheStreak) {
  StragglerScorer s(4, 2, 0.75, 0, 6, 0);
  Feed(&s, {0.010, 0.020}, 4, 1);
  EXPECT_FALSE(s.Check(0));         // flagged at step 4 (score 0.5)
  Feed(&s, {0.010, 0.0125}, 4, 5);  // 0.8: over 0.75, under 0.85
  EXPECT_FALSE(s.Check(0));         // step 8: not named while not under
  Feed(&s, {0.010, 0.020}, 2, 9);
  auto named = s.Check(0);  // step 10: 6 steps since step 4
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 1);
  StragglerScorer even(4, 2, 0.75, 0, 6, 0);
  Feed(&even, {0.010, 0.020}, 4, 1);
  EXPECT_FALSE(even.Check(0));
  Feed(&even, {0.010, 0.0105}, 4, 5);  // 0.95: as fast as rank 0
  EXPECT_FALSE(even.Check(0));
  Feed(&even, {0.010, 0.020}, 4, 9);  // a whole window slow again
  EXPECT_FALSE(even.Check(0));  // step 12: a new streak, not 8 steps of one
}

TEST(StragglerTest, ABreakInTheStreakStartsItOver) {
  StragglerScorer s(4, 2, 0.75, 0, 6, 0);
  Feed(&s, {0.010, 0.020}, 4, 1);
  EXPECT_FALSE(s.Check(0));        // flagged at step 4
  Feed(&s, {0.010, 0.010}, 4, 5);  // evens out: nobody
  EXPECT_FALSE(s.Check(0));
  Feed(&s, {0.010, 0.020}, 4, 9);  // slow again from step 9
  EXPECT_FALSE(s.Check(0));        // step 12: a new streak
  Feed(&s, {0.010, 0.020}, 3, 13);
  EXPECT_FALSE(s.Check(0));  // step 15: 3 steps into it
  Feed(&s, {0.010, 0.020}, 3, 16);
  EXPECT_TRUE(s.Check(0));  // step 18: 6
}

// The host's noise: rank 1 shares its core with another program and waits
// for it a third of each step. Its wall-clock compute looks 1.5 times as
// long; the wait taken off, it is as fast as rank 0.
TEST(StragglerTest, TimeWaitingForACoreIsNotCompute) {
  StragglerScorer s(20, 8, 0.75, 0, 0, 0);
  double wait1 = 0.5;
  for (int step = 1; step <= 30; ++step) {
    s.OnBeat(0, step, 0.010, 0.1);
    wait1 += 0.005;
    s.OnBeat(1, step, 0.015, wait1);
  }
  EXPECT_FALSE(s.Check(0));
  for (const RankScore& r : s.Scores()) EXPECT_NEAR(r.score, 1.0, 0.01);
  // A rank slow without waiting (a slower device) is still named.
  StragglerScorer slow(20, 8, 0.75, 0, 0, 0);
  for (int step = 1; step <= 30; ++step) {
    slow.OnBeat(0, step, 0.010, 0.1);
    slow.OnBeat(1, step, 0.015, 0.2);
  }
  auto named = slow.Check(0);
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 1);
}

// Beats read every few steps: the wait since the last one read is shared
// over the steps it spans.
TEST(StragglerTest, AWaitOverSeveralStepsIsSharedOut) {
  StragglerScorer s(20, 1, 0.75, 0, 0);
  s.OnBeat(0, 1, 0.010, 1.0);
  s.OnBeat(0, 5, 0.030, 1.08);  // 0.08 s over 4 steps: 0.02 a step
  auto scores = s.Scores();
  ASSERT_EQ(scores.size(), 1u);
  EXPECT_NEAR(scores[0].typical_s, 0.010, 1e-9);
  s.OnBeat(0, 6, 0.010, 0.5);  // a counter that went back: no wait
  EXPECT_NEAR(s.Scores()[0].typical_s, 0.010, 1e-9);
}

TEST(StragglerTest, SchedstatText) {
  EXPECT_DOUBLE_EQ(ParseSchedstatWait("393492 92211000 3\n"), 0.092211);
  EXPECT_EQ(ParseSchedstatWait(""), -1);
  EXPECT_EQ(ParseSchedstatWait("12\n"), -1);
}

TEST(StragglerTest, AStepIsCountedOnceAndBeatsWithoutTimesAreIgnored) {
  StragglerScorer s(20, 2, 0.75, 0);
  s.OnBeat(0, 1, 0.010);
  s.OnBeat(0, 1, 9.0);  // the same beat read again
  s.OnBeat(0, 2, -1);   // a beat without a compute time
  s.OnBeat(0, 3, 0.010);
  s.OnBeat(1, 1, 0.010);
  s.OnBeat(1, 2, 0.010);
  auto scores = s.Scores();
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_DOUBLE_EQ(scores[0].typical_s, 0.010);
  EXPECT_DOUBLE_EQ(scores[0].score, 1.0);
}

TEST(StragglerTest, TheWindowForgetsOldSteps) {
  StragglerScorer s(10, 5);
  Feed(&s, {0.010, 0.030}, 30);  // rank 1 was slow...
  for (int step = 34; step <= 48; ++step) {
    s.OnBeat(0, step, 0.010);
    s.OnBeat(1, step, 0.010);  // ...and is not any more
  }
  EXPECT_FALSE(s.Straggler());
}

TEST(StragglerTest, MediansOfSeveralNodesScoreTogether) {
  auto scores = ScoreTypical({{0, 0.010}, {1, 0.010}, {2, 0.020}, {3, -1}});
  EXPECT_EQ(scores[2].score, -1);  // rank 3 has too few steps: nobody yet
  scores = ScoreTypical({{0, 0.010}, {1, 0.010}, {2, 0.020}});
  EXPECT_DOUBLE_EQ(scores[2].score, 0.5);
  EXPECT_DOUBLE_EQ(scores[0].score, 1.0);
}

}  // namespace
}  // namespace dtrun::agent
