#include "lib/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>

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
  EXPECT_EQ(loaded->payload.bytes(), "thirty");
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
    return l.payload.bytes() == "two" ? Status::Invalid("its shard is missing")
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
  EXPECT_EQ(shard->bytes(), "s");
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
  EXPECT_EQ(ckpt.LoadLatest()->payload.bytes(), "good");
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
  EXPECT_EQ(loaded->payload.bytes(), "last good");
  EXPECT_EQ(ckpt.Steps(),
            std::vector<int64_t>{5});  // the temp file does not count
}

// The frame: XXH3 per 4 MiB block by default, SHA-256 where asked for;
// both load, from a mapping (large files) or a read (small ones).
class FrameTest : public CheckpointTest {
 protected:
  // 10 MiB in three pieces whose edges fall inside blocks.
  static Payload ThreePieces(std::string* joined) {
    *joined = std::string(3 << 20, 'a') + std::string(5 << 20, 'b') +
              std::string(2 << 20, 'c');
    for (size_t i = 0; i < joined->size(); i += 4093) (*joined)[i] = char(i);
    Payload p;
    p.pieces = {std::string_view(*joined).substr(0, 3 << 20),
                std::string_view(*joined).substr(3 << 20, 5 << 20),
                std::string_view(*joined).substr(8 << 20)};
    return p;
  }
  std::string File(const std::string& header, const std::string& payload) {
    const std::string path = dir_ + "/f.dtck";
    std::ofstream(path, std::ios::binary) << header << payload;
    return path;
  }
};

TEST_F(FrameTest, PiecesHashAsTheirJoinInEitherChecksum) {
  std::string joined;
  const Payload pieces = ThreePieces(&joined);
  for (Checksum c : {Checksum::kXxh3, Checksum::kSha256}) {
    const std::string header = CheckpointHeader(pieces, c);
    EXPECT_EQ(header, CheckpointHeader(Payload(joined), c));
    EXPECT_EQ(header.substr(0, 8),
              c == Checksum::kXxh3 ? "DTCKPT2\n" : "DTCKPT1\n");
    auto read = ReadCheckpointFile(File(header, joined));
    ASSERT_TRUE(read.ok()) << read.status().message();
    EXPECT_TRUE(read->bytes() == joined);
  }
  ASSERT_TRUE(WriteCheckpointFile(dir_ + "/w.dtck", pieces).ok());
  auto written = ReadCheckpointFile(dir_ + "/w.dtck");
  ASSERT_TRUE(written.ok()) << written.status().message();
  EXPECT_TRUE(written->bytes() == joined);
}

// A damaged byte anywhere is found and placed: in a block (which one is
// named), in the table of block hashes, or a file cut short.
TEST_F(FrameTest, DamageIsFoundAndPlaced) {
  std::string joined;
  const std::string header = CheckpointHeader(ThreePieces(&joined));
  auto why = [this](const std::string& h, const std::string& p) {
    auto r = ReadCheckpointFile(File(h, p));
    return r.ok() ? std::string("loaded") : r.status().message();
  };
  std::string flipped = joined;
  flipped[(5 << 20) + 7] ^= 1;
  EXPECT_EQ(why(header, flipped),
            "checksum mismatch in payload bytes 4194304-8388608");
  std::string table = header;
  table[8 + 16 + 8] ^= 1;  // the second block's hash
  EXPECT_EQ(why(table, joined), "checksum mismatch in the header");
  EXPECT_NE(why(header, joined.substr(0, 9 << 20))
                .find("truncated: 9437184 of "
                      "10485760"),
            std::string::npos);
  EXPECT_NE(why(header.substr(0, 20), "").find("bad header"),
            std::string::npos);
  EXPECT_NE(why("DTCKPT9\n", joined).find("not a dtrun checkpoint"),
            std::string::npos);
}

// Verified as copied: the header is checked at once, the blocks as the
// copies are made (copies that cross blocks, and one from outside the
// payload, made last); a damaged block is named, and the copy from
// outside is then not made.
TEST_F(FrameTest, APayloadIsVerifiedAsItIsCopied) {
  std::string joined;
  const std::string header = CheckpointHeader(ThreePieces(&joined));
  auto verify = [&header](const std::string& payload) {
    auto framed = std::make_shared<std::string>(header + payload);
    return VerifyCheckpointBytes(framed->data(), framed->size(), framed,
                                 VerifyWhen::kAsCopied);
  };
  const std::string outside = "from elsewhere";
  auto copy_out = [&outside](const PayloadView& view, std::string* a,
                             std::string* b, std::string* c) {
    *a = std::string(6 << 20, '\0');  // blocks 0 and 1
    *b = std::string(100, '\0');      // the last, short block's end
    *c = std::string(outside.size(), '\0');
    return CopyVerifying(view, {{a->data(), view.data + (1 << 20), a->size()},
                                {b->data(), view.data + view.size - 100, 100},
                                {c->data(), outside.data(), c->size()}});
  };
  auto good = verify(joined);
  ASSERT_TRUE(good.ok()) << good.status().message();
  ASSERT_NE(good->pending, nullptr);
  std::string a, b, c;
  ASSERT_TRUE(copy_out(*good, &a, &b, &c).ok());
  EXPECT_TRUE(a == joined.substr(1 << 20, 6 << 20));
  EXPECT_TRUE(b == joined.substr(joined.size() - 100));
  EXPECT_EQ(c, outside);

  std::string flipped = joined;
  flipped[(9 << 20) + 7] ^= 1;  // the last block
  auto bad = verify(flipped);
  ASSERT_TRUE(bad.ok()) << "the blocks are not read before the copy";
  Status s = copy_out(*bad, &a, &b, &c);
  EXPECT_EQ(s.message(), "checksum mismatch in payload bytes 8388608-10485760");
  EXPECT_EQ(c, std::string(outside.size(), '\0'));
  EXPECT_FALSE(CopyVerifying(*bad, {}).ok());  // verifies all, copies none

  std::string table = header;
  table[8 + 16 + 8] ^= 1;  // the header's own hash still checked at once
  auto framed = std::make_shared<std::string>(table + joined);
  EXPECT_EQ(VerifyCheckpointBytes(framed->data(), framed->size(), framed,
                                  VerifyWhen::kAsCopied)
                .status()
                .message(),
            "checksum mismatch in the header");
  EXPECT_NE(
      verify(joined.substr(0, 9 << 20)).status().message().find("truncated"),
      std::string::npos);
}

}  // namespace
}  // namespace dtrun::train
