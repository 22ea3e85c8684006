// The round's rules as pure functions: replies and time go in as values.
#include "rendezvous/round_state.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

TimePoint At(int64_t ms) { return TimePoint(milliseconds(ms)); }

// A node is gone when every connection it bound has closed: not before
// any closed, not while a reconnect's bind is ahead of the closes.
// The first binding is implied (it came with the join); each rebinding
// after a reconnect is counted.
TEST(GoneOfTest, EveryBoundConnectionClosed) {
  EXPECT_FALSE(GoneOf("", ""));
  EXPECT_TRUE(GoneOf("1", ""));
  EXPECT_FALSE(GoneOf("1", "1"));  // reconnected
  EXPECT_TRUE(GoneOf("2", "1"));
  EXPECT_FALSE(GoneOf("", "1"));
  EXPECT_FALSE(GoneOf("x", ""));
}

TEST(JoinRecordTest, RoundTripsAndRefusesOtherText) {
  JoinRecord r;
  r.hint = 3;
  r.preferred = -1;
  r.nproc = 8;
  r.max_restarts = 2;
  r.node_id = "host_12_ab";
  JoinRecord back;
  ASSERT_TRUE(JoinRecord::Parse(r.Text(), &back));
  EXPECT_EQ(back.hint, 3);
  EXPECT_EQ(back.preferred, -1);
  EXPECT_EQ(back.nproc, 8);
  EXPECT_EQ(back.max_restarts, 2);
  EXPECT_EQ(back.node_id, "host_12_ab");
  EXPECT_EQ(back.Settings(), "--nproc-per-node=8 --max-restarts=2");
  for (const char* text : {"", "-1 host_a", "1 2 3 x y", "a b c d e"})
    EXPECT_FALSE(JoinRecord::Parse(text, &back)) << text;
}

TEST(EndReasonTest, NamesRoundTrip) {
  for (EndReason r :
       {EndReason::kNone, EndReason::kSucceeded, EndReason::kWorkersFailed,
        EndReason::kConfigMismatch, EndReason::kDuplicateNodeRank,
        EndReason::kForeignState}) {
    EndReason parsed = EndReason::kNone;
    ASSERT_TRUE(ParseEndReason(EndReasonName(r), &parsed)) << EndReasonName(r);
    EXPECT_EQ(parsed, r);
  }
  EndReason untouched = EndReason::kSucceeded;
  EXPECT_FALSE(ParseEndReason("workers failed", &untouched));
  EXPECT_EQ(untouched, EndReason::kSucceeded);
}

TEST(StateDocTest, SerializeParsesBackWithItsText) {
  StateDoc d;
  d.round = 3;
  d.failures = 2;
  d.Close(EndReason::kWorkersFailed, "workers failed on node x");
  const std::string text = d.Serialize();
  StateDoc back;
  ASSERT_TRUE(StateDoc::Parse(text, &back));
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.failures, 2);
  EXPECT_EQ(back.closed, "workers failed on node x");
  EXPECT_EQ(back.end, EndReason::kWorkersFailed);
  EXPECT_EQ(back.raw, text);  // compare-and-set compares exactly this
}

TEST(StateDocTest, ForeignTextIsRefused) {
  StateDoc d;
  for (const char* text : {"someone else's", "[1,2]", "{\"round\":1}",
                           "{\"round\":\"x\",\"failures\":0,\"closed\":\"\"}"})
    EXPECT_FALSE(StateDoc::Parse(text, &d)) << text;
}

// Nobody writes the state until something must change: missing, it is
// round 0, open.
TEST(StateDocTest, AMissingStateIsRoundZeroOpen) {
  StateDoc d;
  d.round = 5;
  ASSERT_TRUE(StateDoc::Parse("", &d));
  EXPECT_EQ(d.round, 0);
  EXPECT_EQ(d.failures, 0);
  EXPECT_TRUE(d.closed.empty());
  EXPECT_EQ(d.raw, "");
}

TEST(StateDocTest, AnOpenDocHasNoEndWhateverItSays) {
  StateDoc d;
  ASSERT_TRUE(StateDoc::Parse(
      R"({"round":1,"failures":0,"closed":"","end":"workers_failed"})", &d));
  EXPECT_EQ(d.end, EndReason::kNone);
}

TEST(StateDocTest, AnUnknownEndFallsBackToTheMessage) {
  StateDoc d;
  ASSERT_TRUE(StateDoc::Parse(
      R"({"round":1,"failures":0,"closed":"ok","end":"from_the_future"})", &d));
  EXPECT_EQ(d.end, EndReason::kSucceeded);
}

TEST(StateDocTest, ClosingWithoutAReasonIsABug) {
  StateDoc d;
  EXPECT_DEATH(d.Close(EndReason::kNone, "x"), "closing with no reason");
}

TEST(RoundKeysTest, EveryKeyIsUnderTheRun) {
  RoundKeys keys("job7");
  EXPECT_EQ(keys.Job("state"), "rdzv/job7/state");
  EXPECT_EQ(keys.Round(2, "final"), "rdzv/job7/round/2/final");
  EXPECT_EQ(keys.Round(2, "hb", 5), "rdzv/job7/round/2/hb/5");
}

TEST(RecordTest, NodeRecordSplitsBack) {
  int64_t hint = 0;
  std::string id;
  SplitRecord(NodeRecord(-1, "host_1_ab"), &hint, &id);
  EXPECT_EQ(hint, -1);
  EXPECT_EQ(id, "host_1_ab");
  SplitRecord("garbage", &hint, &id);
  EXPECT_EQ(hint, -1);
  EXPECT_EQ(id, "");
}

// The rank table as the closer writes it, slot by slot.
std::vector<int> Ranks(const RankTable& t) {
  std::vector<int> out;
  for (const auto& e : t.by_slot) out.push_back(e.rank);
  return out;
}

TEST(OrderRanksTest, JoinOrderWithoutHints) {
  auto t = OrderRanks({"-1 a", "-1 b", "-1 c"}, {"-1", "-1", "-1"});
  EXPECT_EQ(Ranks(t), (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(t.by_preference);
  // A ring: each rank watches the next, the last watches rank 0.
  EXPECT_EQ(t.by_slot[0].next_node, "b");
  EXPECT_EQ(t.by_slot[2].next_node, "a");
}

TEST(OrderRanksTest, PreviousRanksStayAndNewcomersFollowInJoinOrder) {
  // Slot 1 is a newcomer, slots 2 and 3 held ranks 1 and 0 last round.
  auto t = OrderRanks({"-1 new", "1 b", "0 a", "-1 newer"},
                      {"-1", "-1", "-1", "-1"});
  EXPECT_EQ(Ranks(t), (std::vector<int>{2, 1, 0, 3}));
  EXPECT_EQ(t.by_slot[2].next_node, "b");  // rank 0 watches rank 1
  EXPECT_EQ(t.by_slot[3].next_node, "a");  // the last watches rank 0
}

TEST(OrderRanksTest, DistinctPreferencesDecide) {
  auto t = OrderRanks({"-1 a", "-1 b", "-1 c"}, {"2", "0", "1"});
  EXPECT_TRUE(t.by_preference);
  EXPECT_EQ(Ranks(t), (std::vector<int>{2, 0, 1}));
}

TEST(OrderRanksTest, PreferencesThatClashOrAreMissingDoNot) {
  auto clash = OrderRanks({"-1 a", "-1 b"}, {"1", "1"});
  EXPECT_FALSE(clash.by_preference);
  EXPECT_EQ(Ranks(clash), (std::vector<int>{0, 1}));
  auto partial = OrderRanks({"-1 a", "-1 b"}, {"1", ""});
  EXPECT_FALSE(partial.by_preference);
  EXPECT_EQ(Ranks(partial), (std::vector<int>{0, 1}));
}

TEST(OrderRanksTest, OneNodeWatchesNobody) {
  auto t = OrderRanks({"-1 a"}, {"-1"});
  EXPECT_EQ(t.by_slot[0].rank, 0);
  EXPECT_EQ(t.by_slot[0].next_node, "");
  EXPECT_EQ(RankRecord(t.by_slot[0]), "0  0");
}

// 130 nodes: three packs (64, 64, 2), each slot's record found in its own.
TEST(OrderRanksTest, RecordsTravelSixtyFourToAKey) {
  std::vector<std::string> nodes, prefs;
  for (int i = 0; i < 130; ++i) {
    nodes.push_back("-1 n" + std::to_string(i));
    prefs.push_back("-1");
  }
  const RankTable t = OrderRanks(nodes, prefs);
  const std::vector<std::string> packs = PackRankRecords(t);
  ASSERT_EQ(packs.size(), 3u);
  for (int64_t slot : {1, 2, 64, 65, 128, 129, 130}) {
    EXPECT_EQ(RecordInPack(packs[RankPackOf(slot)], slot),
              RankRecord(t.by_slot[slot - 1]))
        << "slot " << slot;
  }
  EXPECT_EQ(RankPackOf(64), 0);
  EXPECT_EQ(RankPackOf(65), 1);
  EXPECT_EQ(RecordInPack(packs[2], 131), "");  // not in the round
  EXPECT_EQ(RecordInPack("", 1), "");          // not written yet
}

TEST(PlaceInRoundTest, OpenAbandonedLeftOutAndAssigned) {
  StateDoc doc;
  doc.round = 4;
  doc.failures = 1;
  Assignment a;
  EXPECT_EQ(PlaceInRound(doc, 1, "", "", 8, &a), Placement::kOpen);
  EXPECT_EQ(PlaceInRound(doc, 1, "-", "", 8, &a), Placement::kOpen);
  EXPECT_EQ(PlaceInRound(doc, 3, "2", "", 8, &a), Placement::kLeftOut);
  ASSERT_EQ(PlaceInRound(doc, 2, "2", "1 host_a", 8, &a), Placement::kAssigned);
  EXPECT_EQ(a.round, 4);
  EXPECT_EQ(a.failures, 1);
  EXPECT_EQ(a.group_rank, 1);
  EXPECT_EQ(a.group_world_size, 2);
  EXPECT_EQ(a.base_rank, 8);
  EXPECT_EQ(a.world_size, 16);
  EXPECT_EQ(a.next_node, "host_a");
  ASSERT_EQ(PlaceInRound(doc, 2, "2", "1 host_a 7", 8, &a),
            Placement::kAssigned);
  EXPECT_EQ(a.next_node, "host_a");
  EXPECT_EQ(a.next_slot, 7);
}

TEST(LastCallTest, TheLastSlotClosesAtOnceOthersAfterTheDeadline) {
  LastCall full{4, 4};
  EXPECT_TRUE(full.MayClose(0));
  LastCall early{2, 4};
  EXPECT_FALSE(early.MayClose(1000));  // no deadline known yet
  early.deadline_ms = 1500;
  EXPECT_FALSE(early.MayClose(1499));
  EXPECT_TRUE(early.MayClose(1500));
  early.close_tried = true;  // once is enough: the closing key decides
  EXPECT_FALSE(early.MayClose(2000));
}

TEST(LastCallTest, WaitsEndWithTheDeadlineAndTheJoinTimeout) {
  LastCall lc{2, 4};
  const milliseconds poll(500), plenty(60000);
  EXPECT_EQ(lc.WaitStep(poll, 1000, true, plenty), poll);
  lc.deadline_ms = 1120;
  EXPECT_EQ(lc.WaitStep(poll, 1000, true, plenty), milliseconds(120));
  // Past the deadline: 1 ms, never 0 (a wait of 0 would be a busy loop).
  EXPECT_EQ(lc.WaitStep(poll, 1200, true, plenty), milliseconds(1));
  // Not in the round (queued for the next one): the deadline is not ours.
  EXPECT_EQ(lc.WaitStep(poll, 1000, false, plenty), poll);
  EXPECT_EQ(lc.WaitStep(poll, 1000, false, milliseconds(30)), milliseconds(30));
  EXPECT_EQ(lc.WaitStep(poll, 1000, false, milliseconds(0)), milliseconds(1));
}

TEST(HeartbeatWatchTest, DeadOnlyAfterTheLimitWithoutChange) {
  HeartbeatWatch w;
  const milliseconds limit(150);
  EXPECT_FALSE(w.Observe(0, "1", At(0), limit));
  EXPECT_FALSE(w.Observe(0, "1", At(150), limit));  // not past the limit
  auto dead = w.Observe(0, "1", At(151), limit);
  ASSERT_TRUE(dead);
  EXPECT_EQ(*dead, milliseconds(151));
}

TEST(HeartbeatWatchTest, AChangeOrANewRoundRestartsTheTimer) {
  HeartbeatWatch w;
  const milliseconds limit(150);
  EXPECT_FALSE(w.Observe(0, "1", At(0), limit));
  EXPECT_FALSE(w.Observe(0, "2", At(140), limit));  // beat: from 140
  EXPECT_FALSE(w.Observe(0, "2", At(290), limit));
  EXPECT_TRUE(w.Observe(0, "2", At(291), limit));
  EXPECT_FALSE(w.Observe(1, "2", At(300), limit));  // new round: from 300
  EXPECT_FALSE(w.Observe(1, "2", At(450), limit));
  w.Reset();
  EXPECT_FALSE(w.Observe(1, "2", At(1000), limit));  // forgotten: from 1000
  EXPECT_EQ(w.count(), "2");
}

TEST(BeatTimerTest, DueEveryIntervalOrWhenForced) {
  BeatTimer t;
  const milliseconds interval(5000);
  EXPECT_TRUE(t.Due(At(10000), interval, false));
  EXPECT_FALSE(t.Due(At(14999), interval, false));
  EXPECT_TRUE(t.Due(At(15000), interval, false));
  EXPECT_TRUE(t.Due(At(15001), interval, true));
  EXPECT_FALSE(t.Due(At(20000), interval, false));  // from the forced one
}

// A joiner nothing wakes reads at wait 10, then 20 waits later, 40, ...
// never more than 120 apart.
TEST(SafetyNetTest, ReadsLessOftenAsTheWaitGoesOn) {
  SafetyNet net;
  std::vector<int> reads;
  for (int step = 1; step <= 600; ++step)
    if (net.Due(step)) reads.push_back(step);
  EXPECT_EQ(reads, (std::vector<int>{10, 30, 70, 150, 270, 390, 510}));
}

// The store's list of recent run ids: one entry per id, the newest last,
// bounded; the others' since a time.
TEST(RunIdsTest, RegistersOnceKeepsTheNewestAndNamesTheOthers) {
  std::string list = RunIdsWith("", "a", 1000);
  EXPECT_EQ(list, "a@1000");
  list = RunIdsWith(list, "b", 2000);
  list = RunIdsWith(list, "a", 3000);  // again: moved, not repeated
  EXPECT_EQ(list, "b@2000 a@3000");
  EXPECT_EQ(OtherRunIds(list, "a", 0),
            (std::vector<std::pair<std::string, int64_t>>{{"b", 2000}}));
  EXPECT_TRUE(OtherRunIds(list, "a", 2001).empty());  // too old to matter
  EXPECT_EQ(RunIdsWith("x@1 y@2 z@3", "w", 4, 2), "z@3 w@4");
  EXPECT_EQ(RunIdsWith("garbage @5 q@7", "w", 9), "q@7 w@9");
  EXPECT_EQ(RunIdsWithout("b@2000 a@3000", "b"), "a@3000");
  EXPECT_EQ(RunIdsWithout("a@3000", "a"), "");
}

}  // namespace
}  // namespace dtrun::rendezvous
