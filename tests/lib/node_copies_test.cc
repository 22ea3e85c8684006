// Checkpoint copies in shared memory: the segments' format and locking
// (rendezvous/util/memory_checkpoint.h) and the training side's reads
// (lib/checkpointing/node_copies.h), on real /dev/shm segments, with real
// processes for a writer killed in the middle and a dtrun that is gone.
#include "lib/checkpointing/node_copies.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "lib/checkpoint.h"
#include "rendezvous/util/memory_checkpoint.h"

namespace dtrun::train {
namespace {

namespace mc = memory_checkpoint;

class NodeCopiesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dtrun_copies_XXXXXX";
    dir_ = mkdtemp(tmpl);
    // A prefix no dtrun uses: this test's pid, spelled apart.
    prefix_ = "dtrun-test" + std::to_string(getpid()) + "-ckpt";
    setenv(mc::kPrefixEnv, prefix_.c_str(), 1);
  }
  void TearDown() override {
    mc::RemoveMemoryCopies(prefix_);
    unsetenv(mc::kPrefixEnv);
    std::system(("rm -rf " + dir_).c_str());
  }
  // Writes local rank `lr`'s copy of `step`: a step's file and a shard.
  Status WriteCopy(NodeCopies& copies, int64_t step, const std::string& body,
                   const std::function<void()>& halfway = nullptr) {
    step_payload_ = "step " + body;
    shard_payload_ = std::string(1 << 20, 'x') + body;
    step_header_ = CheckpointHeader(step_payload_);
    shard_header_ = CheckpointHeader(shard_payload_);
    return copies.Write(
        step, 2, 0,
        {{CheckpointDir::ShardName(step, 0),
          shard_header_,
          {shard_payload_},
          0},
         {CheckpointDir::StepName(step), step_header_, {step_payload_}, 2}},
        halfway);
  }
  std::vector<std::string> Names(int64_t step) {
    return {CheckpointDir::StepName(step), CheckpointDir::ShardName(step, 0)};
  }
  std::string Segment(char slot) {
    return std::string(mc::kShmDir) + "/" + prefix_ + "-0-" + slot;
  }

  std::string dir_, prefix_;
  std::string step_payload_, shard_payload_, step_header_, shard_header_;
};

TEST_F(NodeCopiesTest, NoneWithoutTheLaunchersPrefix) {
  unsetenv(mc::kPrefixEnv);
  EXPECT_EQ(NodeCopies::FromEnv(0, dir_), nullptr);
}

TEST_F(NodeCopiesTest, AlternatesSlotsAndReadsTheNewestBack) {
  auto copies = NodeCopies::FromEnv(0, dir_);
  ASSERT_NE(copies, nullptr);
  ASSERT_TRUE(WriteCopy(*copies, 10, "ten").ok());
  ASSERT_TRUE(WriteCopy(*copies, 20, "twenty").ok());
  ASSERT_TRUE(WriteCopy(*copies, 30, "thirty").ok());  // over step 10's slot
  copies->Scan();
  EXPECT_TRUE(copies->unusable().empty());
  auto names = [this](int64_t s) { return Names(s); };
  EXPECT_EQ(copies->Newest(names, 1, 2), 30);
  EXPECT_EQ(copies->Newest(names, 31, 2), -1);  // the folder holds newer
  EXPECT_EQ(copies->Newest(names, 1, 4), -1);   // saved on another world
  auto step = copies->Read(30, CheckpointDir::StepName(30));
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_EQ(step->bytes(), "step thirty");
  EXPECT_FALSE(copies->Read(10, CheckpointDir::StepName(10)).ok());  // gone
  EXPECT_TRUE(copies->Read(20, CheckpointDir::ShardName(20, 0)).ok());
}

TEST_F(NodeCopiesTest, ACorruptCopyIsRefused) {
  auto copies = NodeCopies::FromEnv(0, dir_);
  ASSERT_TRUE(WriteCopy(*copies, 10, "ten").ok());
  {
    std::fstream f(Segment('a'), std::ios::in | std::ios::out);
    f.seekp(4096 * 3);  // inside the shard's payload
    f.put('!');
  }
  copies->Scan();
  auto shard = copies->Read(10, CheckpointDir::ShardName(10, 0));
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find("checksum mismatch"),
            std::string::npos)
      << shard.status().message();
  EXPECT_TRUE(copies->Read(10, CheckpointDir::StepName(10)).ok());
}

// A copy a restart found damaged as it loaded it is set aside: no scan
// takes it (nor dtrun's persisting), the other slot's copy is the newest,
// and the rank's next copy is written into the slot set aside.
TEST_F(NodeCopiesTest, ACopySetAsideIsNotReadAgain) {
  auto copies = NodeCopies::FromEnv(0, dir_);
  ASSERT_TRUE(WriteCopy(*copies, 10, "ten").ok());
  ASSERT_TRUE(WriteCopy(*copies, 20, "twenty").ok());
  copies->Scan();
  auto pending =
      copies->Read(20, CheckpointDir::StepName(20), VerifyWhen::kAsCopied);
  ASSERT_TRUE(pending.ok()) << pending.status().message();
  EXPECT_NE(pending->pending, nullptr);
  pending = Status::Invalid("let go");  // the reader's lock goes with it
  copies->SetAside(20, CheckpointDir::StepName(20));
  copies->Scan();
  ASSERT_EQ(copies->unusable().size(), 1u);
  EXPECT_NE(copies->unusable()[0].find("set aside"), std::string::npos)
      << copies->unusable()[0];
  auto names = [this](int64_t s) { return Names(s); };
  EXPECT_EQ(copies->Newest(names, 1, 2), 10);
  const auto persisted = mc::PersistMemoryCopies(prefix_).written;
  ASSERT_FALSE(persisted.empty());
  for (const auto& path : persisted)  // step 10's, none of step 20
    EXPECT_NE(path.find("000000000010"), std::string::npos) << path;
  ASSERT_TRUE(WriteCopy(*copies, 30, "thirty").ok());
  copies->Scan();
  EXPECT_TRUE(copies->unusable().empty());
  EXPECT_EQ(copies->Newest(names, 1, 2), 30);
  EXPECT_TRUE(copies->Read(10, CheckpointDir::StepName(10)).ok());
}

// A writer SIGKILLed halfway through leaves its slot marked incomplete:
// the scan names it and the other slot's copy is the newest.
TEST_F(NodeCopiesTest, AWriterKilledHalfwayLeavesThePreviousCopy) {
  auto copies = NodeCopies::FromEnv(0, dir_);
  ASSERT_TRUE(WriteCopy(*copies, 10, "ten").ok());
  pid_t child = fork();
  if (child == 0) {
    WriteCopy(*copies, 20, "twenty", [] { raise(SIGKILL); });
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  copies->Scan();
  ASSERT_EQ(copies->unusable().size(), 1u);
  EXPECT_NE(copies->unusable()[0].find("incomplete"), std::string::npos)
      << copies->unusable()[0];
  EXPECT_EQ(copies->Newest([this](int64_t s) { return Names(s); }, 1, 2), 10);
  // and the next write takes the incomplete slot, not the good one
  ASSERT_TRUE(WriteCopy(*copies, 30, "thirty").ok());
  copies->Scan();
  EXPECT_TRUE(copies->unusable().empty());
  EXPECT_TRUE(copies->Read(10, CheckpointDir::StepName(10)).ok());
}

// dtrun's side: the newest step's files reach the folder, shards first; a
// step's file whose shards are not all there is left out and said.
TEST_F(NodeCopiesTest, PersistWritesTheNewestStepWhole) {
  auto copies = NodeCopies::FromEnv(0, dir_);
  ASSERT_TRUE(WriteCopy(*copies, 10, "ten").ok());
  ASSERT_TRUE(WriteCopy(*copies, 20, "twenty").ok());
  mc::PersistReport report = mc::PersistMemoryCopies(prefix_);
  ASSERT_EQ(report.written.size(), 1u);  // shard 1 of 2 is on no node here
  EXPECT_EQ(report.written[0], dir_ + "/" + CheckpointDir::ShardName(20, 0));
  ASSERT_EQ(report.notes.size(), 1u);
  EXPECT_NE(report.notes[0].find("its shard 1 is not on disk"),
            std::string::npos)
      << report.notes[0];
  ASSERT_TRUE(WriteCheckpointFile(dir_ + "/" + CheckpointDir::ShardName(20, 1),
                                  "other node's")
                  .ok());
  report = mc::PersistMemoryCopies(prefix_);
  ASSERT_EQ(report.written.size(), 1u);
  EXPECT_EQ(report.written[0], dir_ + "/" + CheckpointDir::StepName(20));
  auto on_disk = ReadCheckpointFile(report.written[0]);
  ASSERT_TRUE(on_disk.ok());
  EXPECT_EQ(on_disk->bytes(), "step twenty");
  EXPECT_TRUE(mc::PersistMemoryCopies(prefix_).written.empty());  // all there
}

// A job whose checkpoints so far lived only in memory never made its
// folder: the persist before a restart makes it, parents included.
TEST_F(NodeCopiesTest, PersistMakesAFolderNothingWroteToYet) {
  const std::string dir = dir_ + "/not/made/yet";
  auto copies = NodeCopies::FromEnv(0, dir);
  ASSERT_NE(copies, nullptr);
  ASSERT_TRUE(WriteCopy(*copies, 10, "ten").ok());
  mc::PersistReport report = mc::PersistMemoryCopies(prefix_);
  ASSERT_EQ(report.written.size(), 1u)
      << (report.notes.empty() ? "" : report.notes[0]);
  EXPECT_EQ(report.written[0], dir + "/" + CheckpointDir::ShardName(10, 0));
  // A folder that cannot be made is named, and nothing is written.
  const std::string blocked = dir_ + "/a_file/ckpt";
  ASSERT_TRUE(WriteCheckpointFile(dir_ + "/a_file", "x").ok());
  mc::RemoveMemoryCopies(prefix_);
  auto other = NodeCopies::FromEnv(0, blocked);
  ASSERT_TRUE(WriteCopy(*other, 20, "twenty").ok());
  report = mc::PersistMemoryCopies(prefix_);
  EXPECT_TRUE(report.written.empty());
  ASSERT_EQ(report.notes.size(), 1u);
  EXPECT_EQ(report.notes[0].rfind(blocked + ": ", 0), 0u) << report.notes[0];
}

TEST_F(NodeCopiesTest, RemovesTheCopiesOfADtrunThatIsGone) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a pid no process has now
  const std::string gone = mc::PrefixOf(child);
  mc::MemorySlots slots(gone, 0);
  mc::MemorySlots mine(mc::PrefixOf(getpid()), 0);
  ASSERT_TRUE(slots.Write(1, 1, 0, "/tmp", {}).ok());
  ASSERT_TRUE(mine.Write(1, 1, 0, "/tmp", {}).ok());
  std::vector<std::string> removed = mc::RemoveOrphanedCopies();
  EXPECT_NE(std::find(removed.begin(), removed.end(),
                      std::string(mc::kShmDir) + "/" + gone + "-0-a"),
            removed.end());
  EXPECT_EQ(mc::ScanMemoryCopies(gone).size(), 0u);
  EXPECT_EQ(mc::ScanMemoryCopies(mc::PrefixOf(getpid())).size(), 1u);
  EXPECT_EQ(mc::RemoveMemoryCopies(mc::PrefixOf(getpid())), 1);
}

TEST_F(NodeCopiesTest, MalformedSegmentsAreNotTaken) {
  std::ofstream(Segment('a')) << std::string(9000, 'z');
  std::vector<std::string> unusable;
  EXPECT_TRUE(mc::ScanMemoryCopies(prefix_, &unusable).empty());
  ASSERT_EQ(unusable.size(), 1u);
  EXPECT_NE(unusable[0].find("not a checkpoint copy"), std::string::npos);
}

}  // namespace
}  // namespace dtrun::train
