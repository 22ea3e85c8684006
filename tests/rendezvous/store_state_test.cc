#include "rendezvous/store_state.h"

#include <gtest/gtest.h>

#include <map>

namespace dtrun::rendezvous {
namespace {

// Collects what StoreState sends, per connection.
class FakeSink : public ReplySink {
 public:
  std::string* Out(ConnId conn) override { return &sent[conn]; }
  std::string Take(ConnId conn) {
    std::string out = sent[conn];
    sent[conn].clear();
    return out;
  }
  std::map<ConnId, std::string> sent;
};

std::string I64Bytes(int64_t v) {
  std::string out;
  PutI64(&out, v);
  return out;
}
std::string BytesOf(std::string_view v) {
  std::string out;
  PutBytes(&out, v);
  return out;
}
const std::string kStop(1, '\0');

class StoreStateTest : public ::testing::Test {
 protected:
  Status Do(ConnId conn, Op op, std::vector<std::string> keys,
            std::vector<std::string> values = {}, int64_t number = 0) {
    Request req;
    req.op = op;
    req.keys = std::move(keys);
    req.values = std::move(values);
    req.number = number;
    return state_.Apply(conn, req, &sink_);
  }
  StoreState state_;
  FakeSink sink_;
};

TEST_F(StoreStateTest, SetThenGetReturnsValue) {
  ASSERT_TRUE(Do(1, Op::kSet, {"/k"}, {"v"}).ok());
  EXPECT_EQ(sink_.Take(1), "");
  ASSERT_TRUE(Do(1, Op::kGet, {"/k"}).ok());
  EXPECT_EQ(sink_.Take(1), BytesOf("v"));
}

TEST_F(StoreStateTest, GetOfMissingKeyReturnsEmpty) {
  ASSERT_TRUE(Do(1, Op::kGet, {"/none"}).ok());
  EXPECT_EQ(sink_.Take(1), BytesOf(""));
}

TEST_F(StoreStateTest, AddKeepsDecimalText) {
  Do(1, Op::kAdd, {"/c"}, {}, 5);
  EXPECT_EQ(sink_.Take(1), I64Bytes(5));
  Do(1, Op::kAdd, {"/c"}, {}, -2);
  EXPECT_EQ(sink_.Take(1), I64Bytes(3));
  Do(1, Op::kGet, {"/c"});
  EXPECT_EQ(sink_.Take(1), BytesOf("3"));
}

TEST_F(StoreStateTest, AddToNonNumberFailsTheConnection) {
  Do(1, Op::kSet, {"/c"}, {"abc"});
  Status s = Do(1, Op::kAdd, {"/c"}, {}, 1);
  EXPECT_EQ(s.code(), Status::Code::kInvalid);
  EXPECT_NE(s.message().find("/c"), std::string::npos);
}

TEST_F(StoreStateTest, AddCountsOnFromTheLeadingNumberAsTorchDoes) {
  // torch 2.6's server: ' 7' -> 8, '7abc' -> 8, '0x10' -> 1.
  const std::pair<const char*, int64_t> cases[] = {
      {" 7", 8}, {"7abc", 8}, {"0x10", 1}};
  for (const auto& [old_value, sum] : cases) {
    Do(1, Op::kSet, {"/c"}, {old_value});
    ASSERT_TRUE(Do(1, Op::kAdd, {"/c"}, {}, 1).ok()) << old_value;
    EXPECT_EQ(sink_.Take(1), I64Bytes(sum)) << old_value;
    Do(1, Op::kGet, {"/c"});
    EXPECT_EQ(sink_.Take(1), BytesOf(std::to_string(sum))) << old_value;
  }
}

TEST_F(StoreStateTest, AddToValueBeyondSixtyFourBitsFailsTheConnection) {
  Do(1, Op::kSet, {"/c"}, {"99999999999999999999"});
  EXPECT_EQ(Do(1, Op::kAdd, {"/c"}, {}, 1).code(), Status::Code::kInvalid);
}

TEST_F(StoreStateTest, AddThatOverflowsFailsTheConnection) {
  Do(1, Op::kAdd, {"/c"}, {}, INT64_MAX);
  EXPECT_EQ(Do(1, Op::kAdd, {"/c"}, {}, 1).code(), Status::Code::kInvalid);
  Do(1, Op::kGet, {"/c"});
  EXPECT_EQ(sink_.Take(1),
            I64Bytes(INT64_MAX) + BytesOf(std::to_string(INT64_MAX)));
}

TEST_F(StoreStateTest, CompareSetFollowsC10dInAllFourCases) {
  Do(1, Op::kCompareSet, {"/a"}, {"", "x"});  // missing, expected empty: create
  EXPECT_EQ(sink_.Take(1), BytesOf("x"));
  Do(1, Op::kCompareSet, {"/b"}, {"e", "x"});  // missing, expected non-empty
  EXPECT_EQ(sink_.Take(1), BytesOf("e"));
  EXPECT_EQ(state_.NumKeys(), 1u);
  Do(1, Op::kCompareSet, {"/a"}, {"x", "y"});  // equal: swap
  EXPECT_EQ(sink_.Take(1), BytesOf("y"));
  Do(1, Op::kCompareSet, {"/a"}, {"zz", "q"});  // different: current
  EXPECT_EQ(sink_.Take(1), BytesOf("y"));
}

TEST_F(StoreStateTest, WaitRepliesAtOnceWhenKeysExist) {
  Do(1, Op::kSet, {"/a"}, {"1"});
  Do(2, Op::kWait, {"/a"});
  EXPECT_EQ(sink_.Take(2), kStop);
}

TEST_F(StoreStateTest, WaitOnTwoKeysReleasesAfterBoth) {
  Do(2, Op::kWait, {"/a", "/b"});
  EXPECT_EQ(sink_.Take(2), "");
  Do(1, Op::kSet, {"/a"}, {"1"});
  EXPECT_EQ(sink_.Take(2), "");
  Do(1, Op::kAdd, {"/b"}, {}, 1);
  EXPECT_EQ(sink_.Take(2), kStop);
  EXPECT_EQ(state_.NumWaiters(), 0u);
}

// A connection that bound a key with kOnCloseKey ADDs 1 to it when it
// closes, waking who waits on it; the binding itself stores nothing, a
// later one replaces it, an empty one unbinds, and only the closing
// connection's own binding fires.
TEST_F(StoreStateTest, AClosingConnectionAddsToTheKeyItBound) {
  Do(1, Op::kSet, {std::string("/") + kOnCloseKey}, {"/old"});
  Do(1, Op::kSet, {kOnCloseKey}, {"/gone/1"});
  Do(2, Op::kSet, {kOnCloseKey}, {"/gone/2"});
  Do(3, Op::kSet, {kOnCloseKey}, {"/gone/3"});
  Do(3, Op::kSet, {kOnCloseKey}, {""});
  EXPECT_EQ(state_.NumKeys(), 0u);
  Do(4, Op::kWait, {"/gone/1"});
  state_.Disconnect(1, &sink_);
  EXPECT_EQ(sink_.Take(4), kStop);
  state_.Disconnect(3, &sink_);
  Do(4, Op::kGet, {"/gone/1"});
  EXPECT_EQ(sink_.Take(4), BytesOf("1"));
  Do(4, Op::kCheck, {"/old"});
  Do(4, Op::kCheck, {"/gone/2"});
  Do(4, Op::kCheck, {"/gone/3"});
  EXPECT_EQ(sink_.Take(4), std::string(3, char(kCheckNotReady)));
}

TEST_F(StoreStateTest, CompareSetCreatingKeyWakesWaiters) {
  Do(2, Op::kWait, {"/a"});
  Do(1, Op::kCompareSet, {"/a"}, {"", "v"});
  EXPECT_EQ(sink_.Take(2), kStop);
}

TEST_F(StoreStateTest, DisconnectForgetsWaiters) {
  Do(2, Op::kWait, {"/a", "/b"});
  state_.Disconnect(2, &sink_);
  EXPECT_EQ(state_.NumWaiters(), 0u);
  Do(1, Op::kSet, {"/a"}, {"1"});
  Do(1, Op::kSet, {"/b"}, {"1"});
  EXPECT_EQ(sink_.Take(2), "");
}

// Found by the fuzzer: the empty string is a valid key.
TEST_F(StoreStateTest, CancelingAWaitOnTheEmptyKeyForgetsIt) {
  Do(2, Op::kWait, {""});
  Do(2, Op::kCancelWait, {});
  sink_.Take(2);
  Do(1, Op::kSet, {""}, {"1"});
  EXPECT_EQ(sink_.Take(2), "");
  EXPECT_EQ(state_.NumWaiters(), 0u);
}

TEST_F(StoreStateTest, CancelWaitRepliesCanceledEvenWithoutWaits) {
  Do(2, Op::kCancelWait, {});
  EXPECT_EQ(sink_.Take(2), std::string(1, '\x01'));
  Do(2, Op::kWait, {"/a"});
  Do(2, Op::kCancelWait, {});
  EXPECT_EQ(sink_.Take(2), std::string(1, '\x01'));
  Do(1, Op::kSet, {"/a"}, {"1"});
  EXPECT_EQ(sink_.Take(2), "");
}

TEST_F(StoreStateTest, CheckIsReadyOnlyWhenAllKeysExist) {
  Do(1, Op::kSet, {"/a"}, {"1"});
  Do(1, Op::kCheck, {"/a", "/b"});
  EXPECT_EQ(sink_.Take(1), std::string(1, '\x01'));
  Do(1, Op::kSet, {"/b"}, {"1"});
  Do(1, Op::kCheck, {"/a", "/b"});
  EXPECT_EQ(sink_.Take(1), kStop);
}

TEST_F(StoreStateTest, DeleteKeyReportsWhetherItExisted) {
  Do(1, Op::kSet, {"/a"}, {"1"});
  Do(1, Op::kDeleteKey, {"/a"});
  EXPECT_EQ(sink_.Take(1), I64Bytes(1));
  Do(1, Op::kDeleteKey, {"/a"});
  EXPECT_EQ(sink_.Take(1), I64Bytes(0));
  Do(1, Op::kGetNumKeys, {});
  EXPECT_EQ(sink_.Take(1), I64Bytes(0));
}

TEST_F(StoreStateTest, WatchKeyNotifiesCreateUpdateDelete) {
  Do(9, Op::kWatchKey, {"/w"});
  EXPECT_EQ(sink_.Take(9), std::string(1, '\x03'));
  Do(1, Op::kSet, {"/w"}, {"1"});
  Do(1, Op::kSet, {"/w"}, {"2"});
  Do(1, Op::kDeleteKey, {"/w"});
  std::string expected = std::string(1, '\x01') + BytesOf("/w") + BytesOf("") +
                         BytesOf("1") + std::string(1, '\x00') + BytesOf("/w") +
                         BytesOf("1") + BytesOf("2") + std::string(1, '\x02') +
                         BytesOf("/w") + BytesOf("2") + BytesOf("");
  EXPECT_EQ(sink_.Take(9), expected);
}

TEST_F(StoreStateTest, AppendCreatesThenExtends) {
  Do(1, Op::kAppend, {"/a"}, {"x"});
  Do(1, Op::kAppend, {"/a"}, {"y"});
  Do(1, Op::kGet, {"/a"});
  EXPECT_EQ(sink_.Take(1), BytesOf("xy"));
}

TEST_F(StoreStateTest, MultiSetAndMultiGetKeepOrder) {
  Do(1, Op::kMultiSet, {"/a", "/b"}, {"1", "2"});
  Do(1, Op::kMultiGet, {"/b", "/a", "/c"});
  EXPECT_EQ(sink_.Take(1), BytesOf("2") + BytesOf("1") + BytesOf(""));
}

TEST_F(StoreStateTest, QueuePushWakesOneWaiterAndPopIsFifo) {
  Do(2, Op::kWait, {"q"});
  Do(3, Op::kWait, {"q"});
  Do(1, Op::kQueuePush, {"q"}, {"first"});
  EXPECT_EQ(sink_.Take(2), kStop);
  EXPECT_EQ(sink_.Take(3), "");
  Do(1, Op::kQueuePush, {"q"}, {"second"});
  Do(1, Op::kQueueLen, {"q"});
  EXPECT_EQ(sink_.Take(1), I64Bytes(2));
  Do(2, Op::kQueuePop, {"q"});
  EXPECT_EQ(sink_.Take(2), I64Bytes(2) + BytesOf("first"));
  Do(2, Op::kQueuePop, {"q"});
  Do(2, Op::kQueuePop, {"q"});
  EXPECT_EQ(sink_.Take(2), I64Bytes(1) + BytesOf("second") + I64Bytes(0));
}

TEST_F(StoreStateTest, BarrierReleasesEveryoneAtWorldSize) {
  Do(1, Op::kBarrier, {"/b"}, {}, 3);
  Do(2, Op::kBarrier, {"/b"}, {}, 3);
  EXPECT_EQ(sink_.Take(1) + sink_.Take(2), "");
  Do(3, Op::kBarrier, {"/b"}, {}, 3);
  EXPECT_EQ(sink_.Take(1), kStop);
  EXPECT_EQ(sink_.Take(2), kStop);
  EXPECT_EQ(sink_.Take(3), kStop);
}

TEST_F(StoreStateTest, ListKeysNamesEveryKey) {
  Do(1, Op::kSet, {"/a"}, {"1"});
  Do(1, Op::kListKeys, {});
  EXPECT_EQ(sink_.Take(1), I64Bytes(1) + BytesOf("/a"));
}

TEST_F(StoreStateTest, ValidateChecksMagicAndPingEchoes) {
  Request v;
  v.op = Op::kValidate;
  v.word = 0x12345678;
  EXPECT_FALSE(state_.Apply(1, v, &sink_).ok());
  v.word = kValidateMagic;
  EXPECT_TRUE(state_.Apply(1, v, &sink_).ok());
  Request ping;
  ping.op = Op::kPing;
  ping.word = 4242;
  state_.Apply(1, ping, &sink_);
  std::string expected;
  PutU32(&expected, 4242);
  EXPECT_EQ(sink_.Take(1), expected);
}

TEST_F(StoreStateTest, ClearEmptiesKeysButKeepsWaiters) {
  Do(1, Op::kSet, {"/a"}, {"1"});
  Do(2, Op::kWait, {"/b"});
  state_.Clear();
  EXPECT_EQ(state_.NumKeys(), 0u);
  Do(1, Op::kSet, {"/b"}, {"1"});
  EXPECT_EQ(sink_.Take(2), kStop);
}

// ParseCounter follows std::stoll, as torch's server does for ADD.
int64_t Parsed(std::string_view text) {
  int64_t v = -999;
  EXPECT_TRUE(ParseCounter(text, &v)) << "'" << text << "'";
  return v;
}

TEST(ParseCounterTest, AcceptsSignedDecimal) {
  EXPECT_EQ(Parsed("-12"), -12);
  EXPECT_EQ(Parsed("+3"), 3);
  EXPECT_EQ(Parsed("0"), 0);
  EXPECT_EQ(Parsed("-9223372036854775808"), INT64_MIN);
  EXPECT_EQ(Parsed("9223372036854775807"), INT64_MAX);
}

TEST(ParseCounterTest, SkipsLeadingBlanksAsStollDoes) {
  EXPECT_EQ(Parsed(" 7"), 7);
  EXPECT_EQ(Parsed("\t\n\v\f\r -4"), -4);
}

TEST(ParseCounterTest, IgnoresTrailingTextAsStollDoes) {
  EXPECT_EQ(Parsed("7abc"), 7);
  EXPECT_EQ(Parsed("0x10"), 0);
  EXPECT_EQ(Parsed("12 34"), 12);
  EXPECT_EQ(Parsed("5.9"), 5);
  EXPECT_EQ(Parsed(std::string_view("8\0"
                                    "9",
                                    3)),
            8);
}

TEST(ParseCounterTest, RejectsTextWithoutLeadingDigits) {
  using namespace std::string_view_literals;
  int64_t v = 42;
  for (std::string_view text : {""sv, " "sv, "abc"sv, "x7"sv, "+"sv, "-"sv,
                                "+-5"sv, "-+5"sv, "- 5"sv, "++5"sv,
                                "\0"
                                "5"sv}) {
    EXPECT_FALSE(ParseCounter(text, &v)) << "'" << text << "'";
  }
  EXPECT_EQ(v, 42);  // untouched on failure
}

TEST(ParseCounterTest, RejectsNumbersBeyondSixtyFourBits) {
  int64_t v = 0;
  EXPECT_FALSE(ParseCounter("99999999999999999999", &v));
  EXPECT_FALSE(ParseCounter("9223372036854775808", &v));
  EXPECT_FALSE(ParseCounter("-9223372036854775809", &v));
  EXPECT_FALSE(ParseCounter("  +99999999999999999999abc", &v));
}

}  // namespace
}  // namespace dtrun::rendezvous
