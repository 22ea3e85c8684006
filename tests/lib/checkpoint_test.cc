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
    std::fstream f(ckpt.LoadLatest()->path, std::ios::in | std::ios::out | std::ios::binary);
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
  EXPECT_EQ(ckpt.Steps(), std::vector<int64_t>{5});  // the temp file does not count
}

}  // namespace
}  // namespace dtrun::train
