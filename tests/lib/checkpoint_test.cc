#include "lib/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>

namespace dtrun::train {
namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dtrun_ckpt_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(CheckpointTest, WritesKeepsLastKAndLoadsNewest) {
  CheckpointDir ckpt(dir_, 2);
  ASSERT_TRUE(ckpt.Write(10, "ten").ok());
  ASSERT_TRUE(ckpt.Write(20, "twenty").ok());
  ASSERT_TRUE(ckpt.Write(30, "thirty").ok());
  EXPECT_EQ(ckpt.Steps(), (std::vector<int64_t>{30, 20}));
  auto loaded = ckpt.LoadLatest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 30);
  EXPECT_EQ(loaded->payload, "thirty");
}

TEST_F(CheckpointTest, CorruptNewestFallsBackToPrevious) {
  CheckpointDir ckpt(dir_, 3);
  ckpt.Write(1, "good");
  ckpt.Write(2, "also good");
  {
    std::fstream f(ckpt.LoadLatest()->path,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('X');  // flip the last payload byte
  }
  std::vector<std::string> skipped;
  auto loaded = ckpt.LoadLatest(&skipped);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("checksum mismatch"), std::string::npos);
}

TEST_F(CheckpointTest, AcceptCallbackSkipsToAnOlderCheckpoint) {
  CheckpointDir ckpt(dir_, 3);
  ckpt.Write(1, "one");
  ckpt.Write(2, "two");
  std::vector<std::string> skipped;
  auto loaded = ckpt.LoadLatest(&skipped, [](const CheckpointDir::Loaded& l) {
    return l.payload == "two" ? Status::Invalid("its shard is missing")
                              : Status::Ok();
  });
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("its shard is missing"), std::string::npos);
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

TEST_F(CheckpointTest, ShardsOfDroppedAndUnfinishedStepsAreDeleted) {
  CheckpointDir ckpt(dir_, 1);
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(WriteCheckpointFile(ckpt.ShardPath(10, r), "s").ok());
  ASSERT_TRUE(ckpt.Write(10, "manifest 10").ok());
  // Step 15's shards were written, but its manifest never was (a crash).
  ASSERT_TRUE(WriteCheckpointFile(ckpt.ShardPath(15, 0), "s").ok());
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(WriteCheckpointFile(ckpt.ShardPath(20, r), "s").ok());
  EXPECT_TRUE(Exists(ckpt.ShardPath(10, 1)));
  ASSERT_TRUE(ckpt.Write(20, "manifest 20").ok());
  EXPECT_EQ(ckpt.Steps(), (std::vector<int64_t>{20}));
  EXPECT_FALSE(Exists(ckpt.ShardPath(10, 0)));
  EXPECT_FALSE(Exists(ckpt.ShardPath(10, 1)));
  EXPECT_FALSE(Exists(ckpt.ShardPath(15, 0)));
  EXPECT_TRUE(Exists(ckpt.ShardPath(20, 1)));
  auto shard = ReadCheckpointFile(ckpt.ShardPath(20, 1));
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(*shard, "s");
  EXPECT_FALSE(ReadCheckpointFile(ckpt.ShardPath(99, 0)).ok());
}

TEST(Epochs, AFileIsAbandonedOnlyByALaterEpochResumedBeforeIt) {
  // Epoch 1 started from scratch, epoch 2 resumed from 100 (a node was cut
  // off at 120), epoch 3 from 150.
  std::vector<EpochRecord> epochs{{1, 0}, {2, 100}, {3, 150}};
  EXPECT_EQ(AbandonedBy(epochs, 1, 100), "");  // the point epoch 2 took
  EXPECT_EQ(AbandonedBy(epochs, 1, 120),
            "written in epoch 1, but epoch 2 resumed from step 100: a history "
            "given up (a node cut off from the job wrote it)");
  EXPECT_EQ(AbandonedBy(epochs, 2, 150), "");
  EXPECT_NE(AbandonedBy(epochs, 2, 160), "");
  EXPECT_EQ(AbandonedBy(epochs, 3, 10000), "");  // the newest epoch's own
  EXPECT_NE(AbandonedBy(epochs, 0, 120), "");    // a file without an epoch
  EXPECT_EQ(AbandonedBy({}, 0, 120), "");
}

TEST(Epochs, FormatAndParseRoundTripAndBadLinesAreNamed) {
  std::vector<EpochRecord> epochs{{1, 0}, {2, 100}};
  auto parsed = ParseEpochs(FormatEpochs(epochs));
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[1].epoch, 2);
  EXPECT_EQ((*parsed)[1].resumed_from, 100);
  auto bad = ParseEpochs("1 0\n2 x\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "epochs line 2 '2 x' is not two or three numbers");
  auto three = ParseEpochs("1 0 7\n");
  ASSERT_TRUE(three.ok());
  EXPECT_EQ((*three)[0].world_size, 7);
  EXPECT_FALSE(ParseEpochs("1 0 7 8\n").ok());
  EXPECT_FALSE(ParseEpochs("-1 0\n").ok());
}

TEST_F(CheckpointTest, EpochsAreRecordedDurablyAndCountUp) {
  CheckpointDir ckpt(dir_, 2);
  EXPECT_TRUE(ckpt.Epochs().empty());
  auto first = ckpt.BeginEpoch(0);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(*first, 1);
  auto second = CheckpointDir(dir_, 2).BeginEpoch(50);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, 2);
  auto epochs = ckpt.Epochs();
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_EQ(epochs[1].resumed_from, 50);
  // The records are not a checkpoint of any step.
  EXPECT_TRUE(ckpt.Steps().empty());
  for (size_t i = 0; i < CheckpointDir::kKeptEpochs + 5; ++i)
    ASSERT_TRUE(ckpt.BeginEpoch(60).ok());
  epochs = ckpt.Epochs();
  EXPECT_EQ(epochs.size(), CheckpointDir::kKeptEpochs);
  EXPECT_EQ(epochs.back().epoch,
            static_cast<int64_t>(CheckpointDir::kKeptEpochs) + 7);
}

TEST_F(CheckpointTest, AWriteSetsLaterStepsAsideInsteadOfDroppingItself) {
  // keep 1: step 120 of a given-up history must not push out the 60 just
  // written in its place.
  CheckpointDir ckpt(dir_, 1);
  ASSERT_TRUE(ckpt.Write(120, "stale").ok());
  ASSERT_TRUE(ckpt.Write(60, "good").ok());
  EXPECT_EQ(ckpt.Steps(), (std::vector<int64_t>{60}));
  EXPECT_EQ(ckpt.LoadLatest()->payload, "good");
  std::ifstream aside(dir_ + "/" + CheckpointDir::StepName(120) + ".abandoned");
  EXPECT_TRUE(aside.good());
}

TEST_F(CheckpointTest, NothingLoadsFromAnEmptyFolder) {
  CheckpointDir ckpt(dir_ + "/none", 1);
  EXPECT_FALSE(ckpt.LoadLatest().has_value());
}

// A writer killed with SIGKILL in the middle of a large checkpoint: the
// previous checkpoint is still the one that loads.
TEST_F(CheckpointTest, WriteKilledHalfwayNeverLoads) {
  CheckpointDir ckpt(dir_, 2);
  ASSERT_TRUE(ckpt.Write(5, "last good").ok());
  pid_t pid = fork();
  if (pid == 0) {
    CheckpointDir writer(dir_, 2);
    writer.on_chunk = [](size_t written) {
      if (written > (8u << 20)) raise(SIGKILL);  // halfway through 32 MiB
    };
    writer.Write(6, std::string(32u << 20, 'p'));
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  auto loaded = ckpt.LoadLatest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 5);
  EXPECT_EQ(loaded->payload, "last good");
  EXPECT_EQ(ckpt.Steps(),
            std::vector<int64_t>{5});  // the temp file does not count
}

}  // namespace
}  // namespace dtrun::train
