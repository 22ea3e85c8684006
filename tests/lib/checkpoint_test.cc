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
