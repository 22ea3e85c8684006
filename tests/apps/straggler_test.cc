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

TEST(StragglerTest, CheckNamesOnlyARankFlaggedSeveralTimesInARow) {
  StragglerScorer s(20, 2, 0.75, 0, 3);
  Feed(&s, {0.010, 0.020}, 2, 1);
  EXPECT_FALSE(s.Check());  // flagged once
  EXPECT_FALSE(s.Check());  // twice
  auto named = s.Check();   // three times: named
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 1);
  Feed(&s, {0.020, 0.010}, 20, 3);  // now rank 0 is the slow one
  EXPECT_FALSE(s.Check());          // a new streak starts
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

TEST(StragglerTest, TheBeatTextCarriesTheComputeTime) {
  EXPECT_DOUBLE_EQ(ParseBeatCompute("170 0.012500\n"), 0.0125);
  EXPECT_EQ(ParseBeatCompute("170\n"), -1);
  EXPECT_EQ(ParseBeatCompute("170\n0.5 1\n"), -1);  // a longer old beat
  EXPECT_EQ(ParseBeatCompute("done\n"), -1);
  EXPECT_EQ(ParseBeatCompute("170 x\n"), -1);
}

}  // namespace
}  // namespace dtrun::agent
