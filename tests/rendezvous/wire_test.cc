#include "rendezvous/wire.h"

#include <gtest/gtest.h>

namespace dtrun::rendezvous {
namespace {

std::string Hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size();) {
    if (hex[i] == ' ') {
      ++i;
      continue;
    }
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    i += 2;
  }
  return out;
}

DecodeState Decode(const std::string& bytes, Dialect d, Request* req,
                   size_t* consumed, std::string* error = nullptr,
                   WireLimits limits = {}) {
  std::string ignored;
  return DecodeRequest(bytes, d, limits, req, consumed,
                       error ? error : &ignored);
}

// An op the dialect has no opcode for would go out as opcode 0 (SET in
// 1.13): encoding it is a bug in the caller, not a request to send.
TEST(WireDeathTest, EncodingAnOpTheDialectLacksAborts) {
  Request append;
  append.op = Op::kAppend;
  append.keys = {"k"};
  append.values = {"v"};
  std::string out;
  EXPECT_DEATH(EncodeRequest(append, Dialect::kTorch113, &out),
               "APPEND has no opcode in the torch-1.13 dialect");
}

// Bytes captured from PyTorch 1.13.1's client (torchrun-compat.md 1.10).
TEST(WireTest, DecodesCaptured113Set) {
  Request req;
  size_t used = 0;
  std::string bytes = Hex("00 0300000000000000 2f6b31 0200000000000000 7631");
  ASSERT_EQ(Decode(bytes, Dialect::kTorch113, &req, &used), DecodeState::kDone);
  EXPECT_EQ(req.op, Op::kSet);
  EXPECT_EQ(req.keys, std::vector<std::string>{"/k1"});
  EXPECT_EQ(req.values, std::vector<std::string>{"v1"});
  EXPECT_EQ(used, bytes.size());
}

TEST(WireTest, DecodesCaptured113AddWithNegativeDelta) {
  Request req;
  size_t used = 0;
  std::string bytes = Hex("03 0400000000000000 2f636e74 feffffffffffffff");
  ASSERT_EQ(Decode(bytes, Dialect::kTorch113, &req, &used), DecodeState::kDone);
  EXPECT_EQ(req.op, Op::kAdd);
  EXPECT_EQ(req.number, -2);
}

TEST(WireTest, DecodesWaitWithThreeKeys) {
  Request in;
  in.op = Op::kWait;
  in.keys = {"/a", "/bb", "/ccc"};
  std::string bytes;
  EncodeRequest(in, Dialect::kTorch113, &bytes);
  EXPECT_EQ(bytes[0], 5);
  Request out;
  size_t used = 0;
  ASSERT_EQ(Decode(bytes, Dialect::kTorch113, &out, &used), DecodeState::kDone);
  EXPECT_EQ(out.keys, in.keys);
}

TEST(WireTest, ReportsBytesNeededForPartialFrame) {
  std::string bytes = Hex("00 0300000000000000 2f6b31 0200000000000000 7631");
  Request req;
  size_t hint = 0;
  EXPECT_EQ(Decode(bytes.substr(0, 5), Dialect::kTorch113, &req, &hint),
            DecodeState::kNeedMore);
  EXPECT_EQ(hint, 9u);  // opcode + the full u64 key length
  EXPECT_EQ(Decode(bytes.substr(0, 14), Dialect::kTorch113, &req, &hint),
            DecodeState::kNeedMore);
  EXPECT_EQ(hint, 20u);  // ... + key + value length
}

TEST(WireTest, DecodesOnlyTheFirstOfPipelinedRequests) {
  Request set, check;
  set.op = Op::kSet;
  set.keys = {"/k"};
  set.values = {"v"};
  check.op = Op::kCheck;
  check.keys = {"/k"};
  std::string bytes;
  EncodeRequest(set, Dialect::kTorch113, &bytes);
  size_t first = bytes.size();
  EncodeRequest(check, Dialect::kTorch113, &bytes);
  Request out;
  size_t used = 0;
  ASSERT_EQ(Decode(bytes, Dialect::kTorch113, &out, &used), DecodeState::kDone);
  EXPECT_EQ(used, first);
}

TEST(WireTest, RejectsUnknownOpcode) {
  Request req;
  size_t used = 0;
  std::string error;
  EXPECT_EQ(
      Decode(std::string(1, '\x09'), Dialect::kTorch113, &req, &used, &error),
      DecodeState::kMalformed);
  EXPECT_NE(error.find("unknown opcode 9"), std::string::npos);
  EXPECT_EQ(
      Decode(std::string(1, '\x13'), Dialect::kTorch2, &req, &used, &error),
      DecodeState::kMalformed);
}

TEST(WireTest, RejectsValueLengthOverCapBeforeItArrives) {
  WireLimits limits;
  limits.max_value_bytes = 1024;
  std::string bytes = Hex("00 0100000000000000 6b 0104000000000000");
  Request req;
  size_t used = 0;
  std::string error;
  EXPECT_EQ(Decode(bytes, Dialect::kTorch113, &req, &used, &error, limits),
            DecodeState::kMalformed);
  EXPECT_NE(error.find("value length 1025 exceeds the cap of 1024"),
            std::string::npos);
}

TEST(WireTest, RejectsKeyCountOverCap) {
  WireLimits limits;
  limits.max_keys = 2;
  std::string bytes = Hex("05 0300000000000000");
  Request req;
  size_t used = 0;
  std::string error;
  EXPECT_EQ(Decode(bytes, Dialect::kTorch113, &req, &used, &error, limits),
            DecodeState::kMalformed);
  EXPECT_NE(error.find("key count 3"), std::string::npos);
}

TEST(WireTest, DetectsDialectFromFirstBytes) {
  EXPECT_EQ(DetectDialect(Hex("00 ce f7 85 3c")), Dialect::kTorch2);
  EXPECT_EQ(DetectDialect(Hex("00 ce f7")), Dialect::kUnknown);
  EXPECT_EQ(DetectDialect(Hex("00 03 00")), Dialect::kTorch113);
  EXPECT_EQ(DetectDialect(Hex("03")), Dialect::kTorch113);
  EXPECT_EQ(DetectDialect(""), Dialect::kUnknown);
}

// Round trip of every op through encoder and decoder, in each dialect that
// has it.
class WireRoundTripTest
    : public ::testing::TestWithParam<std::tuple<Op, Dialect>> {};

TEST_P(WireRoundTripTest, DecodesWhatItEncodes) {
  auto [op, dialect] = GetParam();
  Request in;
  in.op = op;
  in.keys = {"/key"};
  in.values = {"value"};
  in.number = -7;
  in.word = kValidateMagic;
  if (op == Op::kCompareSet) in.values = {"old", "new"};
  if (op == Op::kCheck || op == Op::kWait || op == Op::kMultiGet)
    in.keys = {"/a", "/b"};
  if (op == Op::kMultiSet) {
    in.keys = {"/a", "/b"};
    in.values = {"1", "2"};
  }
  std::string bytes;
  EncodeRequest(in, dialect, &bytes);
  Request out;
  size_t used = 0;
  ASSERT_EQ(Decode(bytes, dialect, &out, &used), DecodeState::kDone);
  EXPECT_EQ(out.op, op);
  EXPECT_EQ(used, bytes.size());
  // Every proper prefix needs more bytes, never decodes or fails.
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_EQ(Decode(bytes.substr(0, cut), dialect, &out, &used),
              DecodeState::kNeedMore)
        << OpName(op) << " cut at " << cut;
  }
}

std::vector<std::tuple<Op, Dialect>> AllOps() {
  std::vector<std::tuple<Op, Dialect>> out;
  for (Op op : {Op::kSet, Op::kCompareSet, Op::kGet, Op::kAdd, Op::kCheck,
                Op::kWait, Op::kGetNumKeys, Op::kWatchKey, Op::kDeleteKey}) {
    out.emplace_back(op, Dialect::kTorch113);
  }
  for (int i = 0; i <= static_cast<int>(Op::kBarrier); ++i) {
    if (static_cast<Op>(i) != Op::kWatchKey)
      out.emplace_back(static_cast<Op>(i), Dialect::kTorch2);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryOp, WireRoundTripTest,
                         ::testing::ValuesIn(AllOps()), [](const auto& info) {
                           return std::string(OpName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == Dialect::kTorch2
                                       ? "_v2"
                                       : "_v113");
                         });

// A change frame as a 1.13 store pushes it: type, key, old value, new value.
std::string ChangeFrame(uint8_t type, const std::string& key,
                        const std::string& old_value,
                        const std::string& new_value) {
  std::string out;
  PutU8(&out, type);
  for (const std::string* s : {&key, &old_value, &new_value}) {
    PutU64(&out, s->size());
    out += *s;
  }
  return out;
}

// Acknowledgements and changes come mixed on one connection; each frame is
// decoded whole or not at all, byte by byte as well as at once, and the old
// value is dropped.
TEST(WatchFrameTest, AcknowledgementsAndChangesDecodeWholeOrWait) {
  const std::string change =
      ChangeFrame(kWatchUpdated, "rdzv/x/hb/1", "4", "5");
  const std::string stream = std::string(1, char(kWatchRegistered)) + change;
  WatchFrame f;
  size_t used = 0;
  std::string error;
  ASSERT_EQ(DecodeWatchFrame(stream, &f, &used, &error), DecodeState::kDone);
  EXPECT_EQ(f.type, kWatchRegistered);
  EXPECT_EQ(used, 1u);
  for (size_t n = 0; n < change.size(); ++n) {
    EXPECT_EQ(DecodeWatchFrame(std::string_view(change).substr(0, n), &f, &used,
                               &error),
              DecodeState::kNeedMore)
        << n;
  }
  ASSERT_EQ(DecodeWatchFrame(stream.substr(1) + "tail", &f, &used, &error),
            DecodeState::kDone);
  EXPECT_EQ(f.type, kWatchUpdated);
  EXPECT_EQ(f.key, "rdzv/x/hb/1");
  EXPECT_EQ(f.value, "5");
  EXPECT_EQ(used, change.size());
}

TEST(WatchFrameTest, AByteThatIsNoFrameIsNamed) {
  WatchFrame f;
  size_t used = 0;
  std::string error;
  EXPECT_EQ(DecodeWatchFrame("\x07rest", &f, &used, &error),
            DecodeState::kMalformed);
  EXPECT_NE(error.find("byte 7 is neither"), std::string::npos) << error;
}

}  // namespace
}  // namespace dtrun::rendezvous
