#include "apps/dtrun/hang_monitor.h"

#include <gtest/gtest.h>

#include "apps/dtrun/hang_report.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class HangMonitorTest : public ::testing::Test {
 protected:
  HangMonitorTest() : monitor_(HangOptions{seconds(2), seconds(10)}) {
    monitor_.Reset(2, t0_);
  }
  HangMonitor monitor_;
  TimePoint t0_{};
};

TEST_F(HangMonitorTest, NothingIsHungBeforeTheFirstBeatAllowance) {
  EXPECT_TRUE(monitor_.Hung(t0_ + seconds(9)).empty());
  EXPECT_EQ(monitor_.Hung(t0_ + seconds(10)), (std::vector<int>{0, 1}));
  EXPECT_EQ(monitor_.deadline(), t0_ + seconds(10));
}

TEST_F(HangMonitorTest, ABeatenWorkerIsHungOnceSilentForTheTimeout) {
  monitor_.OnBeat(0, t0_ + seconds(1), 5);
  monitor_.OnBeat(1, t0_ + seconds(1), 5);
  monitor_.OnBeat(1, t0_ + seconds(2), 6);
  EXPECT_EQ(monitor_.deadline(), t0_ + seconds(3));
  EXPECT_TRUE(monitor_.Hung(t0_ + milliseconds(2999)).empty());
  EXPECT_EQ(monitor_.Hung(t0_ + seconds(3)), (std::vector<int>{0}));
  auto snap = monitor_.Snapshot(t0_ + seconds(3));
  EXPECT_TRUE(snap[0].hung);
  EXPECT_DOUBLE_EQ(snap[0].silent_s, 2.0);
  EXPECT_EQ(snap[0].step, 5);
  EXPECT_FALSE(snap[1].hung);
  EXPECT_EQ(snap[1].step, 6);
}

TEST_F(HangMonitorTest, AStaleBeatNeverMovesTimeBackAndResetForgetsBeats) {
  monitor_.OnBeat(0, t0_ + seconds(5), 1);
  monitor_.OnBeat(0, t0_ + seconds(4), -1);
  EXPECT_EQ(monitor_.beats()[0].last, t0_ + seconds(5));
  EXPECT_EQ(monitor_.beats()[0].step, 1);
  monitor_.Reset(2, t0_ + seconds(6));
  EXPECT_FALSE(monitor_.beats()[0].beaten);
  monitor_.OnBeat(7, t0_, 1);  // not a worker: ignored
}

TEST_F(HangMonitorTest, AWorkerThatExitedIsNeverHung) {
  monitor_.OnBeat(0, t0_ + seconds(1), 5);
  monitor_.OnBeat(1, t0_ + seconds(1), 5);
  monitor_.OnExit(0);
  EXPECT_EQ(monitor_.Hung(t0_ + seconds(100)), (std::vector<int>{1}));
  auto snap = monitor_.Snapshot(t0_ + seconds(100));
  EXPECT_TRUE(snap[0].exited);
  EXPECT_FALSE(snap[0].hung);
  EXPECT_EQ(HangRootCause(snap), 1u);
  monitor_.OnBeat(1, t0_ + seconds(2), kBeatDone);  // past its loop
  EXPECT_TRUE(monitor_.Hung(t0_ + seconds(100)).empty());
}

TEST_F(HangMonitorTest, OffWithoutATimeout) {
  HangMonitor off(HangOptions{});
  off.Reset(2, t0_);
  EXPECT_FALSE(off.deadline().has_value());
  EXPECT_TRUE(off.Hung(t0_ + seconds(100000)).empty());
}

TEST(HangRootCauseTest, LowestStepThenLongestSilenceThenNeverBeaten) {
  std::vector<RankSilence> ranks = {{0, true, 2.0, 3, true},
                                    {1, true, 2.5, 2, true}};
  EXPECT_EQ(HangRootCause(ranks), 1u);
  ranks[1].step = 3;
  EXPECT_EQ(HangRootCause(ranks), 1u);  // same step: silent longer
  ranks[0].silent_s = 3.0;
  EXPECT_EQ(HangRootCause(ranks), 0u);
  ranks.push_back({2, false, 1.0, -1, false});
  EXPECT_EQ(HangRootCause(ranks), 2u);
}

TEST(HangRootCauseTest, RanksAtALaterStepAreWaitingNotHung) {
  std::vector<RankSilence> ranks = {{0, true, 3.0, 3, true},
                                    {1, true, 3.1, 2, true},
                                    {2, true, 3.0, 2, true}};
  EXPECT_EQ(MarkWaiting(&ranks), 1u);
  EXPECT_FALSE(ranks[0].hung);
  EXPECT_TRUE(ranks[1].hung);
  EXPECT_TRUE(ranks[2].hung);  // same step: hung as well
}

// Beats after the collective: every rank last beat the same step, at
// nearly the same time. The stacks decide: the rank outside the collective
// is the one the others wait for, whatever the order of their silences.
TEST(HangRootCauseTest, SameStepTheRankOutsideTheCollectiveIsTheCause) {
  std::vector<RankSilence> ranks = {{0, true, 3.02, 19, true},
                                    {1, true, 3.01, 19, true},
                                    {2, true, 3.00, 19, true}};
  EXPECT_EQ(HangRootCause(ranks), 0u);  // no stacks yet: silent longest
  ranks[0].in_collective = true;
  ranks[1].in_collective = true;
  EXPECT_EQ(HangRootCause(ranks), 2u);
  EXPECT_EQ(MarkWaiting(&ranks), 2u);
  EXPECT_FALSE(ranks[0].hung);
  EXPECT_FALSE(ranks[1].hung);
  EXPECT_TRUE(ranks[2].hung);
}

TEST(HangRootCauseTest, StacksDecideOnlyWhenTheBeatsDoNot) {
  // Rank 0 was silent 5 s longer: it stopped first, even in a collective.
  std::vector<RankSilence> ranks = {{0, true, 8.0, 19, true, false, true},
                                    {1, true, 3.0, 19, true}};
  EXPECT_EQ(HangRootCause(ranks), 0u);
  // A lower step decides before any stack.
  ranks = {{0, true, 3.0, 18, true, false, true}, {1, true, 3.0, 19, true}};
  EXPECT_EQ(HangRootCause(ranks), 0u);
  // Everyone in a collective (a network fault): the longest silence.
  ranks = {{0, true, 3.0, 19, true, false, true},
           {1, true, 3.5, 19, true, false, true}};
  EXPECT_EQ(HangRootCause(ranks), 1u);
  // Two outside: the one silent longer of them.
  ranks = {{0, true, 3.4, 19, true, false, true},
           {1, true, 3.1, 19, true},
           {2, true, 3.2, 19, true}};
  EXPECT_EQ(HangRootCause(ranks), 2u);
}

const char* kDump =
    "[rank1]: step 2\n"
    "Fatal Python error: Aborted\n\n"
    "Thread 0x00007f0000000001 (most recent call first):\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n\n"
    "Current thread 0x00007f0000000002 (most recent call first):\n"
    "  File \"/tmp/w.py\", line 9 in wedged\n"
    "  File \"/tmp/w.py\", line 14 in main\n"
    "  File \"/tmp/w.py\", line 17 in <module>\n\n"
    "Extension modules: torch._C (total: 1)\n";

TEST(HangReportTest, ExtractsThePythonDumpAndItsCurrentThreadFrames) {
  std::string dump = ExtractFaulthandlerDump(kDump);
  EXPECT_EQ(dump.rfind("Fatal Python error: Aborted", 0), 0u);
  auto frames = FirstFrames(dump, 2);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0], "File \"/tmp/w.py\", line 9 in wedged");
  EXPECT_EQ(ExtractFaulthandlerDump("no dump here"), "");
}

TEST(HangReportTest, NativeFramesOfTheFirstThread) {
  const char* eu =
      "PID 42 - process\nTID 42:\n#0  0x00007f nanosleep\n#1  0x00007f Wedged\n"
      "TID 43:\n#0  0x00007f epoll_wait\n";
  auto frames = FirstFrames(eu, 5);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[1], "#1  0x00007f Wedged");
}

// gdb's frames of a thread blocked in a std::future: the summary starts at
// the last runtime frame above the program's own code.
TEST(HangReportTest, NativeFramesSkipTheRuntimesFramesAtTheTop) {
  const char* gdb =
      "Thread 1 (Thread 0x7f (LWP 7) \"train_cfg\"):\n"
      "#0  syscall () at ../sysdeps/unix/sysv/linux/x86_64/syscall.S:38\n"
      "#1  0x00007f in std::__atomic_futex_unsigned_base::_M_futex_wait_until"
      "(unsigned int*) () from /lib/x86_64-linux-gnu/libstdc++.so.6\n"
      "#2  0x00007f in std::__atomic_futex_unsigned<2147483648u>::_M_load "
      "(this=<optimized out>) at /usr/include/c++/12/bits/atomic_futex.h:109\n"
      "#3  std::__basic_future<void>::_M_get_result (this=0x1) at "
      "/usr/include/c++/12/future:720\n"
      "#4  dtrun::train::Ddp::SyncGradients (this=0x2) at "
      "../lib/parallel/ddp.cc:200\n"
      "#5  0x00007f in dtrun::train::Trainer::Run (this=0x3) at "
      "../lib/trainer.cc:487\n"
      "#6  0x00007f in main (argc=2) at ../examples/train_cfg.cc:90\n"
      "Thread 2 (Thread 0x7e (LWP 8) \"comm\"):\n"
      "#0  0x00007f in __libc_pause () at "
      "../sysdeps/unix/sysv/linux/pause.c:29\n";
  auto frames = FirstFrames(gdb, 3);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].rfind("#3  std::__basic_future", 0), 0u) << frames[0];
  EXPECT_EQ(frames[1].rfind("#4  dtrun::train::Ddp::SyncGradients", 0), 0u);
  EXPECT_EQ(frames[2].rfind("#5  0x00007f in dtrun::train::Trainer::Run", 0),
            0u);
  // A thread that is all runtime keeps its frames as they are.
  auto idle = FirstFrames(
      "TID 9:\n#0  0x00007f epoll_wait\n#1  0x00007f "
      "__GI_poll\n",
      5);
  ASSERT_EQ(idle.size(), 2u);
  EXPECT_EQ(idle[0], "#0  0x00007f epoll_wait");
}

TEST(HangReportTest, APythonRankInsideTorchDistributedWaits) {
  // torch 1.13: the blocking call is the innermost frame.
  const char* in_all_reduce =
      "Fatal Python error: Aborted\n\n"
      "Current thread 0x00007f0000000002 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/"
      "distributed_c10d.py\", line 1536 in all_reduce\n"
      "  File \"/tmp/w.py\", line 20 in train\n";
  EXPECT_TRUE(StackWaits(in_all_reduce));
  // torch 2.x wraps it in c10d_logger; and a store wait.
  EXPECT_TRUE(
      StackWaits("Current thread 0x1 (most recent call first):\n"
                 "  File \"/usr/lib/python3/dist-packages/torch/distributed/"
                 "c10d_logger.py\", line 81 in wrapper\n"
                 "  File \"/tmp/w.py\", line 20 in train\n"));
  // Asleep in its own code: not waiting, even under the elastic @record
  // wrapper further down.
  EXPECT_FALSE(StackWaits(
      "Current thread 0x1 (most recent call first):\n"
      "  File \"/tmp/w.py\", line 12 in diverged\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/elastic/"
      "multiprocessing/errors/__init__.py\", line 346 in wrapper\n"));
  EXPECT_FALSE(StackWaits(kDump));
  EXPECT_FALSE(StackWaits(""));
}

TEST(HangReportTest, ANativeRankInGlooOrTheStoreWaits) {
  EXPECT_TRUE(
      StackWaits("TID 7:\n#0  0x00007f __futex_abstimed_wait_common\n"
                 "#1  0x00007f std::condition_variable::wait\n"
                 "#2  0x00007f gloo::transport::tcp::UnboundBuffer::waitRecv\n"
                 "#3  0x00007f c10d::ProcessGroupGloo::AsyncWork::wait\n"
                 "#4  0x00007f main\n"));
  EXPECT_TRUE(
      StackWaits("TID 7:\n#0  0x00007f poll\n"
                 "#1  0x00007f dtrun::rendezvous::TcpStoreClient::Wait\n"
                 "#2  0x00007f main\n"));
  EXPECT_FALSE(
      StackWaits("TID 7:\n#0  0x00007f nanosleep\n#1  0x00007f Wedged\n"
                 "#2  0x00007f main\n"));
}

TEST(HangReportTest, ReportPutsTheRootCauseFirstAndNamesStackFiles) {
  RankStack r0{0, 100, {0, true, 2.0, 3, true}, "", "", "no stack tool", ""};
  RankStack r1{1,  101, {1, true, 2.4, 2, true}, kDump, "/logs/1/stack.txt",
               "", ""};
  std::string text = FormatHangReport({r0, r1}, 2.0, 0, 3);
  size_t root = text.find("Root cause");
  ASSERT_NE(root, std::string::npos);
  EXPECT_LT(root, text.find("rank 1 "));
  EXPECT_LT(text.find("rank 1 "), text.find("rank 0 "));
  EXPECT_NE(text.find("hung: no heartbeat for 2.40 s, last step 2"),
            std::string::npos);
  EXPECT_NE(text.find("in wedged"), std::string::npos);
  EXPECT_NE(text.find("whole stack: /logs/1/stack.txt"), std::string::npos);
  EXPECT_NE(text.find("no stack: no stack tool"), std::string::npos);
}

// Two nodes' ranks all last beat step 4: the sleeper is on the other node,
// and only its stack (in user code) tells it from the waiting ones.
TEST(HangReportTest, AnotherNodesSleeperIsTheRootCauseAcrossNodes) {
  const std::string waits =
      "Current thread 0x1 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/"
      "distributed_c10d.py\", line 1 in all_reduce\n"
      "  File \"w.py\", line 9 in main\n";
  const std::string sleeps =
      "Current thread 0x2 (most recent call first):\n"
      "  File \"w.py\", line 3 in diverged\n"
      "  File \"w.py\", line 9 in main\n";
  RankStack theirs_waiting{2, 300, {0, true, 3.1, 4, true}, waits, "", "", ""};
  RankStack theirs_sleeping{3,  301, {1, true, 3.2, 4, true}, sleeps, "",
                            "", ""};
  // Measured 0.5 s before this node weighs it: the silences grow by that.
  std::string answer =
      StackAnswerJson("hostB", {theirs_waiting, theirs_sleeping}, 1000.0);
  std::vector<RankStack> got = RanksOfStackAnswer(answer, 1000.5, 3.0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].rank, 3);
  EXPECT_EQ(got[1].host, "hostB");
  EXPECT_EQ(got[1].pid, 301);
  EXPECT_EQ(got[1].silence.local_rank, 1);
  EXPECT_EQ(got[1].silence.step, 4);
  EXPECT_DOUBLE_EQ(got[1].silence.silent_s, 3.7);
  EXPECT_TRUE(got[1].silence.hung);  // past the 3 s of this node
  EXPECT_TRUE(got[0].silence.in_collective);
  EXPECT_FALSE(got[1].silence.in_collective);

  RankStack mine0{0,  100, {0, true, 3.6, 4, true, false, true}, waits, "",
                  "", ""};
  RankStack mine1{1,  101, {1, true, 3.8, 4, true, false, true}, waits, "",
                  "", ""};
  std::vector<RankStack> all{mine0, mine1, got[0], got[1]};
  std::string text = FormatHangReport(all, 3.0, 0, 2);
  EXPECT_NE(
      text.find("Root cause (stopped first / lowest step): rank 3 (local_rank: "
                "1, pid: 301, host: hostB)"),
      std::string::npos)
      << text;
}

TEST(HangReportTest, AnAnswerThatIsNotOneGivesNoRanks) {
  EXPECT_TRUE(RanksOfStackAnswer("", 0, 1).empty());
  EXPECT_TRUE(RanksOfStackAnswer("{\"host\": \"h\"}", 0, 1).empty());
  EXPECT_TRUE(RanksOfStackAnswer("[1, 2]", 0, 1).empty());
  // A rank with a key that is not a number is left out, the rest kept.
  std::vector<RankStack> got = RanksOfStackAnswer(
      R"({"host": "h", "stacks": {}, "ranks": {"x": {}, "5": {"step": 2}}})", 0,
      1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rank, 5);
  EXPECT_EQ(got[0].silence.step, 2);
}

}  // namespace
}  // namespace dtrun::agent
