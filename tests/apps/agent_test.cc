#include "apps/dtrun/agent.h"

#include <gtest/gtest.h>

#include <csignal>

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using Kind = Action::Kind;

class AgentTest : public ::testing::Test {
 protected:
  AgentTest() : agent_(AgentOptions{3, 1, milliseconds(500)}) {}

  void StartRunning() {
    auto a = agent_.Start(now_);
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].kind, Kind::kStartGroup);
    agent_.OnGroupStarted();
  }
  std::vector<Action> Exit(int local_rank, int code, int signal = 0) {
    WorkerExit e;
    e.local_rank = local_rank;
    e.pid = 100 + local_rank;
    e.exit_code = code;
    e.signal = signal;
    return agent_.OnWorkerExit(e, now_);
  }

  Agent agent_;
  TimePoint now_{};
};

TEST_F(AgentTest, AGroupThatGaveUpIsNotRestartedWithRestartsLeft) {
  StartRunning();
  Exit(1, 7);
  agent_.GiveUp();  // no progress: --max-restarts-without-progress
  Exit(0, 0, SIGTERM);
  auto a = Exit(2, 0, SIGTERM);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_TRUE(a[0].failed);
  EXPECT_TRUE(agent_.gave_up());
  EXPECT_EQ(agent_.restart_count(), 0);  // one restart was left
}

TEST_F(AgentTest, StartsAttemptZero) {
  auto a = agent_.Start(now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].restart_count, 0);
  EXPECT_EQ(agent_.phase(), Phase::kRunning);
}

TEST_F(AgentTest, FinishesCleanWhenEveryWorkerSucceeds) {
  StartRunning();
  EXPECT_TRUE(Exit(0, 0).empty());
  EXPECT_TRUE(Exit(2, 0).empty());
  auto a = Exit(1, 0);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_FALSE(a[0].failed);
  EXPECT_EQ(a[0].signo, 0);
}

TEST_F(AgentTest, FailureTerminatesTheOthers) {
  StartRunning();
  auto a = Exit(1, 7);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
  EXPECT_EQ(a[0].signo, SIGTERM);
  EXPECT_EQ(agent_.phase(), Phase::kStopping);
  EXPECT_EQ(agent_.deadline(), now_ + milliseconds(500));
}

TEST_F(AgentTest, KillsSurvivorsOnlyAfterTheGracePeriod) {
  StartRunning();
  Exit(1, 7);
  EXPECT_TRUE(agent_.OnTick(now_ + milliseconds(499)).empty());
  auto a = agent_.OnTick(now_ + milliseconds(500));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].signo, SIGKILL);
  // Next: the bounded wait for workers that outlive SIGKILL.
  EXPECT_EQ(agent_.deadline(), now_ + milliseconds(500) + milliseconds(10000));
  EXPECT_TRUE(agent_.OnTick(now_ + milliseconds(900)).empty());
}

TEST_F(AgentTest, HangStopsTheGroupAndRestartsLikeAFailure) {
  StartRunning();
  auto a = agent_.OnHang(SIGABRT, now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
  EXPECT_EQ(a[0].signo, SIGABRT);
  EXPECT_TRUE(agent_.hung());
  EXPECT_TRUE(agent_.OnHang(SIGABRT, now_).empty());  // once per attempt
  Exit(0, 0, SIGABRT);
  Exit(1, 0, SIGABRT);
  a = Exit(2, 0, SIGABRT);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kStartGroup);
  EXPECT_EQ(a[0].restart_count, 1);
  agent_.OnGroupStarted();
  EXPECT_FALSE(agent_.hung());
}

TEST_F(AgentTest, HangOnTheLastAttemptFinishesFailed) {
  Agent agent(AgentOptions{1, 0, milliseconds(500)});
  agent.Start(now_);
  agent.OnGroupStarted();
  agent.OnHang(SIGTERM, now_);
  auto a = agent.OnWorkerExit(WorkerExit{0, 100, 0, SIGTERM}, now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_TRUE(a[0].failed);
}

TEST_F(AgentTest, WorkersThatOutliveSigkillAreAbandonedAfterTheBoundedWait) {
  StartRunning();
  agent_.OnHang(SIGTERM, now_);
  auto kill = agent_.OnTick(now_ + milliseconds(500));
  ASSERT_EQ(kill.size(), 1u);
  EXPECT_EQ(kill[0].signo, SIGKILL);
  Exit(0, 0, SIGKILL);  // two stay in uninterruptible sleep
  EXPECT_TRUE(agent_.OnTick(now_ + milliseconds(10499)).empty());
  auto a = agent_.OnTick(now_ + milliseconds(10500));
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, Kind::kAbandonGroup);
  EXPECT_EQ(a[1].kind, Kind::kStartGroup);
  EXPECT_EQ(agent_.alive(), 0);
}

TEST_F(AgentTest, RestartsWithRaisedCountOnceTheGroupIsDown) {
  StartRunning();
  Exit(1, 7);
  EXPECT_TRUE(Exit(0, 0, SIGTERM).empty());
  auto a = Exit(2, 0, SIGTERM);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kStartGroup);
  EXPECT_EQ(a[0].restart_count, 1);
  EXPECT_EQ(agent_.failures().size(), 1u);  // the SIGTERMed ones are not causes
  EXPECT_EQ(agent_.failures()[0].exit_code, 7);
}

TEST_F(AgentTest, FailsAfterTheLastRestart) {
  StartRunning();
  for (int attempt = 0; attempt < 2; ++attempt) {
    Exit(0, 0, SIGKILL);
    Exit(1, 0, SIGTERM);
    auto a = Exit(2, 0, SIGTERM);
    ASSERT_EQ(a.size(), 1u);
    if (attempt == 0) {
      EXPECT_EQ(a[0].kind, Kind::kStartGroup);
      agent_.OnGroupStarted();
    } else {
      EXPECT_EQ(a[0].kind, Kind::kFinish);
      EXPECT_TRUE(a[0].failed);
      EXPECT_EQ(a[0].restart_count, 1);
    }
  }
  EXPECT_EQ(agent_.failures()[0].signal, SIGKILL);
}

TEST_F(AgentTest, SucceedsAfterOneRestart) {
  StartRunning();
  Exit(0, 3);
  Exit(1, 0, SIGTERM);
  Exit(2, 0, SIGTERM);
  agent_.OnGroupStarted();
  Exit(0, 0);
  Exit(1, 0);
  auto a = Exit(2, 0);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_FALSE(a[0].failed);
  EXPECT_EQ(agent_.restart_count(), 1);
}

TEST_F(AgentTest, StopSignalIsForwardedAndReportedAfterTheGroupIsDown) {
  StartRunning();
  auto a = agent_.OnSignal(SIGINT, now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
  EXPECT_EQ(a[0].signo, SIGINT);
  Exit(0, 0, SIGINT);
  Exit(1, 1);  // a failure while shutting down does not restart
  a = Exit(2, 0, SIGINT);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_EQ(a[0].signo, SIGINT);
}

TEST_F(AgentTest, SecondStopSignalKillsAtOnce) {
  StartRunning();
  agent_.OnSignal(SIGTERM, now_);
  auto a = agent_.OnSignal(SIGTERM, now_ + milliseconds(1));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].signo, SIGKILL);
}

TEST_F(AgentTest, SignalDuringFailureStopTurnsIntoShutdown) {
  StartRunning();
  Exit(1, 7);
  agent_.OnSignal(SIGTERM, now_);
  Exit(0, 0, SIGTERM);
  auto a = Exit(2, 0, SIGTERM);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_EQ(a[0].signo, SIGTERM);
}

TEST_F(AgentTest, NoRestartsMeansFailAtOnce) {
  Agent agent(AgentOptions{1, 0, milliseconds(10)});
  agent.Start(now_);
  agent.OnGroupStarted();
  WorkerExit e;
  e.exit_code = 5;
  auto a = agent.OnWorkerExit(e, now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_TRUE(a[0].failed);
}

TEST_F(AgentTest, AnUnhealthyGroupIsKilledAndNotRestarted) {
  StartRunning();  // one restart left
  auto a = agent_.OnUnhealthy(now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
  EXPECT_EQ(a[0].signo, SIGKILL);
  Exit(0, 0, SIGKILL);
  Exit(1, 0, SIGKILL);
  a = Exit(2, 0, SIGKILL);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kFinish);
  EXPECT_TRUE(a[0].failed);
  EXPECT_TRUE(agent_.unhealthy());
  EXPECT_EQ(agent_.restart_count(), 0);
}

TEST_F(AgentTest, AnUnhealthyGroupThatOutlivesSigkillIsAbandoned) {
  StartRunning();
  agent_.OnUnhealthy(now_);
  ASSERT_TRUE(agent_.deadline().has_value());
  auto a = agent_.OnTick(*agent_.deadline());
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, Kind::kAbandonGroup);
  EXPECT_EQ(a[1].kind, Kind::kFinish);
  EXPECT_TRUE(a[1].failed);
}

// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT decided on states seen over
// time: a worker that leaves D state starts its clock over.
// --restart=in-place: the failed worker alone starts again while the
// others run on, once at a time, within --max-restarts.
class AgentInPlaceTest : public ::testing::Test {
 protected:
  AgentInPlaceTest() : agent_(Options()) {
    agent_.Start(now_);
    agent_.OnGroupStarted();
  }
  static AgentOptions Options() {
    AgentOptions o{3, 2, milliseconds(500)};
    o.in_place = true;
    return o;
  }
  std::vector<Action> Fail(int local_rank, bool replaceable = true) {
    WorkerExit e;
    e.local_rank = local_rank;
    e.pid = 100 + local_rank;
    e.signal = SIGKILL;
    return agent_.OnWorkerExit(e, now_, replaceable);
  }

  Agent agent_;
  TimePoint now_{};
};

TEST_F(AgentInPlaceTest, AFailedWorkerIsReplacedAloneAndCountsAsARestart) {
  auto a = Fail(1);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kReplaceWorker);
  EXPECT_EQ(a[0].local_rank, 1);
  EXPECT_EQ(a[0].restart_count, 1);
  EXPECT_EQ(agent_.phase(), Phase::kRunning);
  EXPECT_EQ(agent_.alive(), 3);
  EXPECT_TRUE(agent_.failures().empty());  // not the attempt's failure
  EXPECT_TRUE(agent_.replacing());
}

TEST_F(AgentInPlaceTest, AFailureDuringAReplacementStopsTheGroup) {
  Fail(1);
  auto a = Fail(2);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
  EXPECT_EQ(agent_.phase(), Phase::kStopping);
}

TEST_F(AgentInPlaceTest, TheNextFailureIsReplacedOnceTheReplacementIsBack) {
  Fail(1);
  agent_.OnBeat(1);
  auto a = Fail(0);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kReplaceWorker);
  EXPECT_EQ(a[0].restart_count, 2);
  agent_.OnBeat(1);  // not the replacement's beat
  EXPECT_TRUE(agent_.replacing());
  agent_.OnBeat(0);
  // --max-restarts=2 is spent: the group stops, and no restart is left.
  a = Fail(2);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
}

// The death came after the survivors' last collective: they end (exit 0)
// while the replacement waits for a group that never forms.
TEST_F(AgentInPlaceTest, ASurvivorEndingDuringAReplacementRestartsTheGroup) {
  Fail(1);
  WorkerExit done;
  done.local_rank = 0;
  done.pid = 100;
  auto a = agent_.OnWorkerExit(done, now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
  ASSERT_EQ(agent_.failures().size(), 1u);
  EXPECT_EQ(agent_.failures()[0].local_rank, 1);  // the death, not the end
  done.local_rank = 2;
  EXPECT_TRUE(agent_.OnWorkerExit(done, now_).empty());
  WorkerExit stopped;
  stopped.local_rank = 1;
  stopped.signal = SIGTERM;
  a = agent_.OnWorkerExit(stopped, now_);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kStartGroup);
}

TEST_F(AgentInPlaceTest, WorkersThatCannotReFormRestartTheGroup) {
  auto a = Fail(1, /*replaceable=*/false);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
}

// On many nodes the rendezvous counts group restarts (max_restarts 0
// here) and a node's replacements count against in_place_limit; the job
// numbers each replacement's attempt (claimed in the workers' store).
TEST(AgentInPlaceNodesTest, ReplacementsRunAsTheClaimedAttemptWithinTheLimit) {
  AgentOptions o{2, 0, milliseconds(500)};
  o.in_place = true;
  o.in_place_limit = 1;
  Agent agent(o);
  agent.StartRound(3, TimePoint{});
  agent.OnGroupStarted();
  WorkerExit e;
  e.local_rank = 1;
  e.pid = 101;
  e.signal = SIGKILL;
  ASSERT_TRUE(agent.CouldReplace());
  auto a = agent.OnWorkerExit(e, TimePoint{}, true, /*attempt=*/5);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kReplaceWorker);
  EXPECT_EQ(a[0].restart_count, 5);
  EXPECT_FALSE(agent.CouldReplace());  // under way
  agent.OnBeat(1);
  EXPECT_FALSE(agent.CouldReplace());  // the limit is spent
  e.pid = 102;
  a = agent.OnWorkerExit(e, TimePoint{}, true, 6);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSignalGroup);
}

TEST(AgentDStateTest, AWorkerInDStateForTheWholeTimeoutMakesTheGroupUnhealthy) {
  AgentOptions o{2, 3, milliseconds(500)};
  o.uninterruptible_timeout = milliseconds(5000);
  Agent agent(o);
  TimePoint t{};
  agent.Start(t);
  agent.OnGroupStarted();
  EXPECT_TRUE(agent.OnDState({1}, t).empty());
  EXPECT_TRUE(agent.OnDState({}, t + milliseconds(3000)).empty());  // woke
  EXPECT_TRUE(agent.OnDState({1}, t + milliseconds(4000)).empty());
  EXPECT_TRUE(agent.OnDState({1}, t + milliseconds(8000)).empty());
  auto a = agent.OnDState({1}, t + milliseconds(9000));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].signo, SIGKILL);
  EXPECT_TRUE(agent.unhealthy());
  EXPECT_EQ(agent.stuck().local_rank, 1);
  EXPECT_EQ(agent.stuck().since, t + milliseconds(4000));
}

TEST(AgentDStateTest, NotWatchedWithoutATimeout) {
  Agent agent(AgentOptions{1, 0, milliseconds(500)});
  agent.Start(TimePoint{});
  agent.OnGroupStarted();
  EXPECT_TRUE(agent.OnDState({0}, TimePoint{}).empty());
  EXPECT_TRUE(agent.OnDState({0}, TimePoint{} + std::chrono::hours(1)).empty());
}

// --max-restarts-without-progress=2: the first attempt sets the mark; two
// restarts in a row that beat nothing past it give up, and say why.
TEST(AgentProgressTest, RestartsWithoutProgressGiveUp) {
  AgentOptions o{1, 9, milliseconds(500)};
  o.max_restarts_without_progress = 2;
  Agent agent(o);
  TimePoint t{};
  agent.Start(t);
  agent.OnGroupStarted();
  agent.OnAttemptFailing(40);
  WorkerExit e{0, 100, 1, 0};
  agent.OnWorkerExit(e, t);  // -> restart 1
  agent.OnGroupStarted();
  agent.OnAttemptFailing(40);
  EXPECT_FALSE(agent.gave_up());
  agent.OnWorkerExit(e, t);  // -> restart 2
  agent.OnGroupStarted();
  agent.OnAttemptFailing(45);  // progress: the count starts over
  EXPECT_FALSE(agent.gave_up());
  agent.OnWorkerExit(e, t);
  agent.OnGroupStarted();
  agent.OnAttemptFailing(45);
  EXPECT_FALSE(agent.gave_up());
  agent.OnWorkerExit(e, t);
  agent.OnGroupStarted();
  agent.OnAttemptFailing(45);
  EXPECT_TRUE(agent.gave_up());
  EXPECT_NE(agent.why_gave_up().find("beat no step past step 45"),
            std::string::npos)
      << agent.why_gave_up();
}

}  // namespace
}  // namespace dtrun::agent
