#include "apps/dtrun/beat_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "apps/dtrun/run_layout.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

TEST(BeatLineTest, StepComputeAndTotalFromTheFirstLine) {
  BeatLine b = ParseBeatLine("170 0.012500 1000\n");
  EXPECT_EQ(b.step, 170);
  EXPECT_DOUBLE_EQ(b.compute_s, 0.0125);
  EXPECT_EQ(b.total_steps, 1000);
  b = ParseBeatLine("170\n");
  EXPECT_EQ(b.step, 170);
  EXPECT_EQ(b.compute_s, -1);
  EXPECT_EQ(b.total_steps, 0);
  // A shorter beat written over a longer one: the old tail is ignored.
  b = ParseBeatLine("99\n0.5 1000\n");
  EXPECT_EQ(b.step, 99);
  EXPECT_EQ(b.compute_s, -1);
  EXPECT_EQ(ParseBeatLine("  7 0.25\n").step, 7);
  EXPECT_DOUBLE_EQ(ParseBeatLine("  7 0.25\n").compute_s, 0.25);
}

TEST(BeatLineTest, DoneAndGarbageAreNeverAWrongStep) {
  EXPECT_EQ(ParseBeatLine("done\n").step, kBeatDone);
  EXPECT_EQ(ParseBeatLine("").step, -1);
  EXPECT_EQ(ParseBeatLine("beat").step, -1);
  EXPECT_EQ(ParseBeatLine("-5 0.1").step, -1);
  BeatLine b = ParseBeatLine("170 x 9\n");
  EXPECT_EQ(b.step, 170);
  EXPECT_EQ(b.compute_s, -1);
  EXPECT_EQ(b.total_steps, 0);
  EXPECT_EQ(ParseBeatLine("170 -0.5\n").compute_s, -1);
  EXPECT_EQ(ParseBeatLine("170 0.5 -3\n").total_steps, 0);
}

// The writer workers use (rendezvous/heartbeat.h) and the one reader agree,
// and a beat is read once however often the reader looks.
TEST(BeatReaderTest, ReadsEachNewBeatOnceFromTheWritersFile) {
  auto dir = os::MakeTempDir("beat-reader-");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(os::MakeDirs(layout::RankDir(*dir, 1)).ok());
  BeatReader reader;
  reader.Reset(*dir, 2);
  EXPECT_TRUE(reader.ReadNew().empty());
  setenv(rendezvous::Heartbeat::kEnv, layout::BeatFile(*dir, 1).c_str(), 1);
  {
    rendezvous::Heartbeat beat;
    beat.Beat(12, 0.5, 100);
  }
  unsetenv(rendezvous::Heartbeat::kEnv);
  EXPECT_EQ(reader.ReadNew(), std::vector<int>{1});
  EXPECT_EQ(reader.last(1).line.step, 12);
  EXPECT_DOUBLE_EQ(reader.last(1).line.compute_s, 0.5);
  EXPECT_EQ(reader.last(1).line.total_steps, 100);
  EXPECT_GT(reader.last(1).unix_s(), 0);
  EXPECT_TRUE(reader.ReadNew().empty());
  EXPECT_FALSE(reader.last(0).seen());
  EXPECT_FALSE(reader.last(7).seen());  // no such rank: no beat
  os::RemoveTree(*dir);
}

}  // namespace
}  // namespace dtrun::agent
