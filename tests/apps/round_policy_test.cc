#include "apps/dtrun/round_policy.h"

#include <gtest/gtest.h>

#include <csignal>

#include "apps/dtrun/exit_code.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using Kind = RoundStep::Kind;
using rendezvous::RoundEvent;

class RoundPolicyTest : public ::testing::Test {
 protected:
  RoundStep Check(Result<RoundEvent> event,
                  GroupOutcome outcome = GroupOutcome::kRunning) {
    return policy_.OnCheck(event, outcome, now_);
  }
  static Result<RoundEvent> Unreachable() {
    return Status::Unavailable("connection refused");
  }

  TimePoint now_{std::chrono::seconds(50)};
  RoundPolicy policy_{milliseconds(15000), now_};
};

TEST_F(RoundPolicyTest, RunningWorkersMeanWaiting) {
  EXPECT_EQ(policy_.OnLocal(GroupOutcome::kRunning, 0), Kind::kWait);
}

TEST_F(RoundPolicyTest, AStopSignalExitsWithItsCode) {
  RoundStep s = policy_.OnLocal(GroupOutcome::kSignaled, SIGTERM);
  EXPECT_EQ(s, Kind::kExit);
  EXPECT_EQ(s.exit_code, 128 + SIGTERM);
  EXPECT_FALSE(s.stop_workers);  // they are gone already
}

TEST_F(RoundPolicyTest, AGroupStoppedForANewRoundRejoins) {
  EXPECT_EQ(policy_.OnLocal(GroupOutcome::kStopped, 0), Kind::kRejoin);
}

TEST_F(RoundPolicyTest, ALocalFailureIsReportedThenRejoinsWhileRestartsLast) {
  EXPECT_EQ(policy_.OnLocal(GroupOutcome::kFailed, 0), Kind::kReportFailure);
  EXPECT_EQ(policy_.OnFailureReported(true), Kind::kRejoin);
}

TEST_F(RoundPolicyTest, ALocalFailureThatClosesTheJobExitsWithTheSummary) {
  EXPECT_EQ(policy_.OnFailureReported(false), Kind::kExitWithSummary);
}

TEST_F(RoundPolicyTest, SuccessIsMarkedOnceThenWaitsForTheOthers) {
  EXPECT_EQ(policy_.OnLocal(GroupOutcome::kSucceeded, 0), Kind::kMarkDone);
  policy_.OnMarkedDone(true);
  EXPECT_EQ(policy_.OnLocal(GroupOutcome::kSucceeded, 0), Kind::kWait);
}

TEST_F(RoundPolicyTest, AnUnwrittenDoneMarkIsTriedAgain) {
  policy_.OnMarkedDone(false);
  EXPECT_EQ(policy_.OnLocal(GroupOutcome::kSucceeded, 0), Kind::kMarkDone);
}

TEST_F(RoundPolicyTest, NothingNewMeansWaiting) {
  EXPECT_EQ(Check(RoundEvent::kNone), Kind::kWait);
}

TEST_F(RoundPolicyTest, EveryNodeDoneEndsTheJobWhenThisOneSucceeded) {
  EXPECT_EQ(Check(RoundEvent::kAllDone, GroupOutcome::kRunning), Kind::kWait);
  RoundStep s = Check(RoundEvent::kAllDone, GroupOutcome::kSucceeded);
  EXPECT_EQ(s, Kind::kExit);
  EXPECT_EQ(s.exit_code, kExitSuccess);
}

TEST_F(RoundPolicyTest, ANewRoundStopsRunningWorkersOnce) {
  EXPECT_EQ(Check(RoundEvent::kRestart), Kind::kStopWorkers);
  EXPECT_EQ(Check(RoundEvent::kRestart), Kind::kWait);
}

TEST_F(RoundPolicyTest, ANewRoundAfterLocalSuccessRejoinsAtOnce) {
  EXPECT_EQ(Check(RoundEvent::kRestart, GroupOutcome::kSucceeded),
            Kind::kRejoin);
}

TEST_F(RoundPolicyTest, AJobClosedElsewhereStopsWorkersAndExitsOne) {
  RoundStep s = Check(RoundEvent::kClosed);
  EXPECT_EQ(s, Kind::kExit);
  EXPECT_EQ(s.exit_code, kExitFailedElsewhere);
  EXPECT_TRUE(s.stop_workers);
}

TEST_F(RoundPolicyTest,
       AnUnreachableStoreIsToleratedForTheSilentLimitThenFences) {
  now_ += milliseconds(15000);
  EXPECT_EQ(Check(Unreachable()), Kind::kWait);
  now_ += milliseconds(1);
  RoundStep s = Check(Unreachable());
  EXPECT_EQ(s, Kind::kFence);
  EXPECT_NE(s.why.find("cut off from the rendezvous store for 15.0 s"),
            std::string::npos)
      << s.why;
  EXPECT_NE(s.why.find("rejoins as a new one"), std::string::npos) << s.why;
  EXPECT_NE(s.why.find(": connection refused"), std::string::npos) << s.why;
}

TEST(RoundPolicyEtcd, NoQuorumKeepsTheWorkersRunningButNoMemberReachedFences) {
  TimePoint now{std::chrono::seconds(50)};
  RoundPolicy policy(milliseconds(2000), now, /*replicated=*/true);
  Result<RoundEvent> lost = Status::Unavailable("no leader");
  now += milliseconds(60000);
  EXPECT_EQ(policy.OnCheck(lost, GroupOutcome::kRunning, now, true),
            Kind::kWait);
  EXPECT_EQ(policy.OnCheck(lost, GroupOutcome::kRunning, now, false),
            Kind::kFence);
}

TEST_F(RoundPolicyTest, AReachedStoreRestartsTheSilentLimit) {
  now_ += milliseconds(14000);
  EXPECT_EQ(Check(RoundEvent::kNone), Kind::kWait);
  now_ += milliseconds(14000);
  EXPECT_EQ(Check(Unreachable()), Kind::kWait);
}

TEST(JoinFailedExitCodeTest, EachFailureHasItsCode) {
  using rendezvous::EndReason;
  EXPECT_EQ(
      JoinFailedExitCode(Status::Canceled("signal"), EndReason::kNone, SIGINT),
      128 + SIGINT);
  EXPECT_EQ(JoinFailedExitCode(Status::Invalid("closed"),
                               EndReason::kWorkersFailed, 0),
            kExitFailedElsewhere);
  EXPECT_EQ(
      JoinFailedExitCode(Status::Invalid("x"), EndReason::kConfigMismatch, 0),
      kExitUsage);
  EXPECT_EQ(JoinFailedExitCode(Status::Invalid("x"),
                               EndReason::kDuplicateNodeRank, 0),
            kExitUsage);
  EXPECT_EQ(
      JoinFailedExitCode(Status::Invalid("x"), EndReason::kForeignState, 0),
      kExitUsage);
  EXPECT_EQ(JoinFailedExitCode(Status::Timeout("join"), EndReason::kNone, 0),
            kExitRendezvous);
  EXPECT_EQ(
      JoinFailedExitCode(Status::Unavailable("lost"), EndReason::kNone, 0),
      kExitRendezvous);
}

}  // namespace
}  // namespace dtrun::agent
