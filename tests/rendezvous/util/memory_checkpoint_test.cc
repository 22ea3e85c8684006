// The shared-memory checkpoint copies' layout and the checkpoint file names
// (rendezvous/util/memory_checkpoint.h, checkpoint_files.h), without torch:
// the launcher's side of the format, on real /dev/shm segments.
#include "rendezvous/util/memory_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "rendezvous/util/checkpoint_files.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::memory_checkpoint {
namespace {

namespace cf = checkpoint_files;

TEST(CheckpointFilesTest, NamesSortAsStepsAndParseBack) {
  EXPECT_EQ(cf::StepName(50), "ckpt_000000000050.dtck");
  EXPECT_EQ(cf::ShardName(50, 3), "ckpt_000000000050.shard_3.dtck");
  EXPECT_LT(cf::StepName(9), cf::StepName(10));
  EXPECT_EQ(cf::StepOfName(cf::StepName(1234)), 1234);
  EXPECT_EQ(cf::StepOfName("ckpt_000000000050.dtck.tmp.77"), -1);
  EXPECT_EQ(cf::StepOfName("ckpt_000000000050.dtck.abandoned"), -1);
  EXPECT_EQ(cf::StepOfName(cf::kEpochsName), -1);
  EXPECT_EQ(cf::StepOfName(cf::ShardName(50, 1)), -1);
  int64_t step = 0, rank = 0;
  ASSERT_TRUE(cf::ShardOfName(cf::ShardName(50, 3), &step, &rank));
  EXPECT_EQ(step, 50);
  EXPECT_EQ(rank, 3);
  EXPECT_FALSE(cf::ShardOfName(cf::StepName(50), &step, &rank));
  EXPECT_FALSE(cf::ShardOfName(cf::ShardName(50, 3) + ".tmp.1", &step, &rank));
  EXPECT_TRUE(cf::IsCheckpointName(cf::ShardName(7, 0)));
  EXPECT_FALSE(cf::IsCheckpointName("../ckpt_000000000007.dtck"));
  EXPECT_FALSE(cf::IsCheckpointName("notes.txt"));
}

class MemoryCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = os::MakeTempDir("dtrun-mc-test-");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
    prefix_ = "dtrun-test" + std::to_string(getpid()) + "-ckpt";
  }
  void TearDown() override {
    RemoveMemoryCopies(prefix_);
    os::RemoveTree(dir_);
  }
  Status Write(MemorySlots& slots, int64_t step, const std::string& body) {
    step_ = "step " + body;
    return slots.Write(step, 1, 0, dir_,
                       {{cf::StepName(step), "HEAD", {step_}, 0}});
  }
  std::string dir_, prefix_, step_;
};

TEST_F(MemoryCheckpointTest, SlotsAlternateAndTheNewestComesFirst) {
  MemorySlots slots(prefix_, 0);
  ASSERT_TRUE(Write(slots, 10, "ten").ok());
  ASSERT_TRUE(Write(slots, 20, "twenty").ok());
  ASSERT_TRUE(Write(slots, 30, "thirty").ok());  // over step 10's slot
  std::vector<std::string> unusable;
  std::vector<MemoryCopy> copies = ScanMemoryCopies(prefix_, &unusable);
  EXPECT_TRUE(unusable.empty());
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].step, 30);
  EXPECT_EQ(copies[1].step, 20);
  EXPECT_EQ(copies[0].dir, dir_);
  const MemoryFile* f = copies[0].Find(cf::StepName(30));
  ASSERT_NE(f, nullptr);
  auto mapped = MapMemoryFile(copies[0], *f);
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(std::string(mapped->data, mapped->size),
            "HEADstep thirty");  // byte for byte as on disk
  EXPECT_EQ(copies[0].Find(cf::StepName(20)), nullptr);
}

TEST_F(MemoryCheckpointTest, PersistWritesTheFileUnderItsNameOnce) {
  MemorySlots slots(prefix_, 0);
  ASSERT_TRUE(Write(slots, 40, "forty").ok());
  PersistReport report = PersistMemoryCopies(prefix_);
  ASSERT_EQ(report.written.size(), 1u);
  EXPECT_EQ(report.written[0], dir_ + "/" + cf::StepName(40));
  std::ifstream in(report.written[0]);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "HEADstep forty");
  EXPECT_TRUE(PersistMemoryCopies(prefix_).written.empty());  // there now
  // A folder already past the copies keeps what it has.
  ASSERT_TRUE(os::WriteFile(dir_ + "/" + cf::StepName(50), "newer").ok());
  ASSERT_TRUE(Write(slots, 45, "forty-five").ok());
  EXPECT_TRUE(
      PersistMemoryCopies(prefix_, /*only_newer=*/true).written.empty());
}

TEST_F(MemoryCheckpointTest, AWriterThatDiedHalfwayLeavesThePreviousCopy) {
  MemorySlots slots(prefix_, 0);
  ASSERT_TRUE(Write(slots, 10, "ten").ok());
  pid_t child = fork();
  if (child == 0) {
    MemorySlots again(prefix_, 0);
    std::string big(1 << 20, 'x');
    (void)again.Write(20, 1, 0, dir_, {{cf::StepName(20), "HEAD", {big}, 0}},
                      [] { _exit(9); });
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 9);
  std::vector<std::string> unusable;
  std::vector<MemoryCopy> copies = ScanMemoryCopies(prefix_, &unusable);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].step, 10);
  ASSERT_EQ(unusable.size(), 1u);
}

TEST_F(MemoryCheckpointTest, ASegmentOfAnotherLayoutIsNotTaken) {
  std::ofstream(std::string(kShmDir) + "/" + prefix_ + "-0-a")
      << std::string(9000, 'z');
  std::vector<std::string> unusable;
  EXPECT_TRUE(ScanMemoryCopies(prefix_, &unusable).empty());
  ASSERT_EQ(unusable.size(), 1u);
  EXPECT_NE(unusable[0].find("not a checkpoint copy"), std::string::npos)
      << unusable[0];
}

}  // namespace
}  // namespace dtrun::memory_checkpoint
