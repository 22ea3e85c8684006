#include "lib/models/data.h"

#include <gtest/gtest.h>

#include <set>

namespace dtrun::train {
namespace {

TEST(StepIndicesTest, RanksSplitAnEpochWithoutOverlap) {
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 5;
       ++step) {  // 100 rows / (2 ranks x 10) = 5 steps
    for (int rank = 0; rank < 2; ++rank) {
      for (int64_t i : StepIndices(100, 10, 2, rank, step, 7)) {
        EXPECT_TRUE(seen.insert(i).second)
            << "row " << i << " twice in one epoch";
      }
    }
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(StepIndicesTest, SameArgumentsSameRowsAndEpochsReshuffle) {
  EXPECT_EQ(StepIndices(100, 10, 2, 1, 3, 7), StepIndices(100, 10, 2, 1, 3, 7));
  EXPECT_NE(StepIndices(100, 10, 2, 0, 0, 7),
            StepIndices(100, 10, 2, 0, 5, 7));  // next epoch
  EXPECT_NE(StepIndices(100, 10, 2, 0, 0, 7),
            StepIndices(100, 10, 2, 0, 0, 8));  // other seed
}

TEST(StepIndicesTest, DropLastOrPad) {
  // 25 rows, 2 ranks x 5: drop_last gives 2 steps per epoch, padding 3.
  std::set<int64_t> dropped, padded;
  for (int64_t step = 0; step < 2; ++step) {
    for (int r = 0; r < 2; ++r) {
      for (int64_t i : StepIndices(25, 5, 2, r, step, 1, true))
        dropped.insert(i);
    }
  }
  for (int64_t step = 0; step < 3; ++step) {
    for (int r = 0; r < 2; ++r) {
      for (int64_t i : StepIndices(25, 5, 2, r, step, 1, false))
        padded.insert(i);
    }
  }
  EXPECT_EQ(dropped.size(), 20u);
  EXPECT_EQ(padded.size(), 25u);  // every row, some twice
  // Padded epochs have 3 steps, so step 3 starts the next, reshuffled epoch.
  EXPECT_NE(StepIndices(25, 5, 2, 0, 3, 1, false),
            StepIndices(25, 5, 2, 0, 0, 1, false));
}

TEST(DataTest, SplitHoldsOutEveryKthRow) {
  Dataset all = MakeSynthetic(100, 3, 4, 1);
  Dataset train, test;
  SplitTrainTest(all, 0.2, &train, &test);
  EXPECT_EQ(test.rows(), 20u);
  EXPECT_EQ(train.rows(), 80u);
  EXPECT_EQ(train.x.size(), 80u * 3);
}

// The synthetic set's classes take turns (class i % classes in row i): with
// 100 classes and every 4th row held out, a split by row number alone held
// out only classes 3, 7, ..., 99. Every class is on both sides.
TEST(DataTest, EveryClassIsInBothSplits) {
  for (int classes : {2, 4, 10, 100, 1000}) {
    Dataset all = MakeSynthetic(classes * 8, 3, classes, 1);
    Dataset train, test;
    SplitTrainTest(all, 0.25, &train, &test);
    std::set<int64_t> in_train(train.y.begin(), train.y.end());
    std::set<int64_t> in_test(test.y.begin(), test.y.end());
    EXPECT_EQ(in_train.size(), static_cast<size_t>(classes)) << classes;
    EXPECT_EQ(in_test.size(), static_cast<size_t>(classes)) << classes;
    EXPECT_EQ(test.rows(), all.rows() / 4) << classes;
  }
}

TEST(DataTest, MissingDigitsFileIsAClearError) {
  auto d = LoadDigits("/nonexistent/digits.csv.gz");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("python3-sklearn"), std::string::npos);
}

}  // namespace
}  // namespace dtrun::train
