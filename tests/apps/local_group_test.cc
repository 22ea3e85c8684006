#include "apps/dtrun/local_group.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <ctime>
#include <utility>

#include "rendezvous/util/os_util.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_worker_group.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using testing::FakeWorkerGroup;

std::string EnvOf(const WorkerSpec& spec, const std::string& key) {
  for (const std::string& kv : spec.env) {
    if (kv.compare(0, key.size() + 1, key + "=") == 0)
      return kv.substr(key.size() + 1);
  }
  return "<unset>";
}

// What the group tells its observer, and a job's `--stacks` request when
// `stacks_asked`.
struct RecordingObserver : GroupObserver {
  void OnAttemptStarting(int restart_count) override {
    starts.push_back(restart_count);
  }
  bool wants_crashes() const override { return crashes_wanted; }
  void OnWorkerCrash(const WorkerCrash& crash) override {
    crashes.push_back(crash);
  }
  bool StacksWanted() override { return std::exchange(stacks_asked, false); }
  void AnswerStacks(const std::string& json) override {
    answers.push_back(json);
  }
  std::vector<int> starts;
  bool crashes_wanted = false;
  std::vector<WorkerCrash> crashes;
  bool stacks_asked = false;
  std::vector<std::string> answers;
};

// A LocalGroup of 3 workers over the fake, in a run folder of its own.
class LocalGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = *os::MakeTempDir("local-group-test-");
    config_.nproc_per_node = 3;
    config_.max_restarts = 1;
    config_.term_timeout = milliseconds(500);
    config_.log_dir = dir_;
    config_.entrypoint = {"/bin/train"};
    config_.worker_argv = {"/bin/train", "--lr=1"};
  }
  void TearDown() override { os::RemoveTree(dir_); }

  LocalGroup& Make(bool elastic = false) {
    group_ = std::make_unique<LocalGroup>(config_, &workers_, &clock_, nullptr,
                                          elastic);
    EXPECT_TRUE(group_->Prepare("job7").ok());
    group_->attempt().master_addr = "127.0.0.1";
    group_->attempt().master_port = 29511;
    return *group_;
  }
  // Every worker of the latest attempt exits with `code`.
  void AllExit(int code) {
    for (int pid : workers_.PidsFrom(workers_.spawned.size() - 3))
      workers_.Exit(pid, code);
    group_->OnChildExits();
  }
  int SignalsOf(int signo) const {
    int n = 0;
    for (const auto& s : workers_.signals) n += s.signo == signo;
    return n;
  }

  std::string dir_;
  LaunchConfig config_;
  FakeWorkerGroup workers_;
  testing::FakeClock clock_;
  std::unique_ptr<LocalGroup> group_;
};

TEST_F(LocalGroupTest, StartsOneWorkerPerSlotWithTorchrunsEnvironment) {
  Make().Start();
  ASSERT_EQ(workers_.spawned.size(), 3u);
  const WorkerSpec& w = workers_.spawned[2];
  EXPECT_EQ(w.argv, config_.worker_argv);
  EXPECT_EQ(EnvOf(w, "RANK"), "2");
  EXPECT_EQ(EnvOf(w, "LOCAL_RANK"), "2");
  EXPECT_EQ(EnvOf(w, "WORLD_SIZE"), "3");
  EXPECT_EQ(EnvOf(w, "MASTER_PORT"), "29511");
  EXPECT_EQ(EnvOf(w, "TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(w.out.prefix, "");  // torchrun's console: the worker's own bytes
  EXPECT_EQ(w.out.console_fd, 1);
  EXPECT_EQ(w.err.console_fd, 2);
  EXPECT_TRUE(w.out.file.empty());
  EXPECT_EQ(group_->outcome(), GroupOutcome::kRunning);
}

TEST_F(LocalGroupTest, SucceedsWhenEveryWorkerExitsZero) {
  Make().Start();
  AllExit(0);
  EXPECT_EQ(group_->outcome(), GroupOutcome::kSucceeded);
  EXPECT_TRUE(workers_.signals.empty());
}

TEST_F(LocalGroupTest, AFailureStopsTheOthersAndRestartsTheGroup) {
  RecordingObserver seen;
  Make().set_observer(&seen);
  group_->Start();
  workers_.Exit(FakeWorkerGroup::kFirstPid + 1, 7);
  group_->OnChildExits();
  EXPECT_EQ(SignalsOf(SIGTERM), 3);
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  ASSERT_EQ(workers_.spawned.size(), 6u);
  EXPECT_EQ(EnvOf(workers_.spawned[3], "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(seen.starts, (std::vector<int>{0, 1}));
  EXPECT_EQ(group_->outcome(), GroupOutcome::kRunning);
}

TEST_F(LocalGroupTest, FailsWithTheRootCausesCodeOnceRestartsAreUsedUp) {
  config_.max_restarts = 0;
  Make().Start();
  workers_.Exit(FakeWorkerGroup::kFirstPid, 7);
  group_->OnChildExits();
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kFailed);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(group_->ReportFailure(), 7);
  std::string summary = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(summary.find("exit code : 7"), std::string::npos) << summary;
}

// The times a failure carries are read from the group's clock, so a test on
// simulated time sees its own: the summary's "time" is the fake clock's
// moment of the exit, hours away from the machine's.
TEST_F(LocalGroupTest, AFailuresTimeIsTheGroupsClocks) {
  config_.max_restarts = 0;
  Make().Start();
  clock_.Advance(std::chrono::hours(30));
  const time_t at = static_cast<time_t>(clock_.UnixSeconds());
  workers_.Exit(FakeWorkerGroup::kFirstPid, 7);
  group_->OnChildExits();
  clock_.Advance(std::chrono::seconds(5));
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  tm local{};
  localtime_r(&at, &local);
  char want[64];
  std::strftime(want, sizeof(want), "time      : %Y-%m-%d_%H:%M:%S", &local);
  ::testing::internal::CaptureStderr();
  group_->ReportFailure();
  const std::string summary = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(summary.find(want), std::string::npos) << want << "\n" << summary;
}

// Each attempt's rank 1 beats `step`, then fails; the others are stopped.
void FailAttemptAfterBeat(LocalGroup* group, FakeWorkerGroup* workers,
                          int attempt, int64_t step) {
  std::string dir = group->run_dir() + "/attempt_" + std::to_string(attempt);
  ASSERT_TRUE(
      os::WriteFile(dir + "/1/heartbeat", std::to_string(step) + "\n").ok());
  workers->Exit(FakeWorkerGroup::kFirstPid + 3 * attempt + 1, 7);
  group->OnChildExits();
  workers->KillAll(SIGTERM);
  group->OnChildExits();
}

TEST_F(LocalGroupTest, RestartsWithoutProgressStopTheJobWithExit93) {
  config_.max_restarts = 10;
  config_.max_restarts_without_progress = 2;
  Make().Start();
  EXPECT_NE(EnvOf(workers_.spawned[0], "DTRUN_HEARTBEAT_FILE"), "");
  FailAttemptAfterBeat(group_.get(), &workers_, 0, 5);  // progress: 5
  FailAttemptAfterBeat(group_.get(), &workers_, 1, 8);  // progress: 8
  FailAttemptAfterBeat(group_.get(), &workers_, 2, 8);  // none: 1 of 2
  ASSERT_EQ(group_->outcome(), GroupOutcome::kRunning);
  FailAttemptAfterBeat(group_.get(), &workers_, 3, 6);  // none: 2 of 2
  ASSERT_EQ(group_->outcome(), GroupOutcome::kFailed);
  EXPECT_EQ(workers_.spawned.size(), 12u);  // 4 attempts of 3, not 11
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(group_->ReportFailure(), kExitNoProgress);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("2 restart(s) in a row beat no step past step 8"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("exit code : 7"), std::string::npos) << err;
}

TEST_F(LocalGroupTest, WithoutBeatsNoRestartIsProgress) {
  config_.max_restarts = 10;
  config_.max_restarts_without_progress = 1;
  Make().Start();
  workers_.Exit(FakeWorkerGroup::kFirstPid, 1);  // attempt 0: no beat
  group_->OnChildExits();
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  ASSERT_EQ(group_->outcome(), GroupOutcome::kRunning);  // not a restart
  workers_.Exit(FakeWorkerGroup::kFirstPid + 3, 1);      // attempt 1: none
  group_->OnChildExits();
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kFailed);
  EXPECT_TRUE(group_->gave_up());
}

TEST_F(LocalGroupTest, AWorkerThatCannotStartIsReportedWithTheReason) {
  config_.max_restarts = 0;
  workers_.fail_exec = {1};
  Make().Start();
  group_->OnChildExits();  // its 127
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  ASSERT_EQ(group_->outcome(), GroupOutcome::kFailed);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(group_->ReportFailure(), 127);
  std::string summary = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(summary.find("cannot execute '/bin/train'"), std::string::npos)
      << summary;
}

TEST_F(LocalGroupTest, AStopSignalEscalatesToSigkillAfterTheGrace) {
  Make().Start();
  group_->OnStopSignal(SIGTERM);
  EXPECT_EQ(SignalsOf(SIGTERM), 3);
  clock_.Advance(milliseconds(499));
  group_->OnTick();
  EXPECT_EQ(SignalsOf(SIGKILL), 0);
  clock_.Advance(milliseconds(2));
  group_->OnTick();
  EXPECT_EQ(SignalsOf(SIGKILL), 3);
  workers_.KillAll(SIGKILL);
  group_->OnChildExits();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kSignaled);
  EXPECT_EQ(group_->stop_signal(), SIGTERM);
}

TEST_F(LocalGroupTest, WorkersThatOutliveSigkillAreAbandoned) {
  Make().Start();
  group_->OnStopSignal(SIGINT);
  clock_.Advance(milliseconds(501));
  group_->OnTick();  // SIGKILL; nobody exits (uninterruptible sleep)
  EXPECT_EQ(group_->outcome(), GroupOutcome::kRunning);
  clock_.Advance(milliseconds(10001));
  group_->OnTick();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kSignaled);
  workers_.KillAll(SIGKILL);  // late exits are ignored
  group_->OnChildExits();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kSignaled);
}

TEST_F(LocalGroupTest, ElasticGroupsReportFailuresWithoutRestarting) {
  config_.max_restarts = 5;
  Make(/*elastic=*/true).StartRound(4);
  EXPECT_EQ(EnvOf(workers_.spawned[0], "TORCHELASTIC_RESTART_COUNT"), "4");
  workers_.Exit(FakeWorkerGroup::kFirstPid + 2, 1);
  group_->OnChildExits();
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kFailed);
  EXPECT_EQ(workers_.spawned.size(), 3u);
}

TEST_F(LocalGroupTest, StoppingForANewRoundIsNotAFailure) {
  Make(/*elastic=*/true).StartRound(0);
  group_->StopForNewRound();
  EXPECT_EQ(SignalsOf(SIGTERM), 3);
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kStopped);
  group_->StartRound(1);
  EXPECT_EQ(group_->outcome(), GroupOutcome::kRunning);
  EXPECT_EQ(workers_.spawned.size(), 6u);
}

TEST_F(LocalGroupTest, TeedLinesArePrefixedAsTorchrunPrefixesThem) {
  config_.role = "trainer";
  config_.tee = StreamSpec{1, {}};
  Make(/*elastic=*/true);
  rendezvous::Assignment a;
  a.base_rank = 6;
  a.world_size = 9;
  group_->set_assignment(a);
  group_->StartRound(0);
  const WorkerSpec& w = workers_.spawned[2];
  EXPECT_EQ(w.out.prefix, "[trainer2]:");
  EXPECT_EQ(w.err.prefix, "");  // stderr is not tee'd
  EXPECT_EQ(w.out.file, group_->run_dir() + "/attempt_0/2/stdout.log");
}

TEST_F(LocalGroupTest, TheTemplateNamesTheGlobalRankHostAndPid) {
  config_.tee = StreamSpec{3, {}};
  config_.log_line_prefix_template =
      "${hostname}|${role_name}|${rank}|${local_rank}|${pid}|${other}: ";
  Make(/*elastic=*/true);
  rendezvous::Assignment a;
  a.base_rank = 3;
  a.world_size = 6;
  group_->set_assignment(a);
  group_->StartRound(0);
  EXPECT_EQ(workers_.spawned[1].err.prefix,
            os::HostName() + "|default|4|1|${pid}|${other}: ");
}

TEST_F(LocalGroupTest, LabelRanksPrefixesEveryLineWithTheGlobalRank) {
  config_.label_ranks = true;
  Make().Start();
  EXPECT_EQ(workers_.spawned[2].out.prefix, "[rank2]:");
  EXPECT_EQ(workers_.spawned[2].err.prefix, "[rank2]:");
}

TEST_F(LocalGroupTest, DuplicateFiltersNameAFileOfTheAttempt) {
  config_.duplicate_stderr_filters = {"NaN"};
  Make().Start();
  const WorkerSpec& w = workers_.spawned[0];
  EXPECT_EQ(w.err.filters, std::vector<std::string>{"NaN"});
  EXPECT_EQ(w.err.filtered_file,
            group_->run_dir() + "/attempt_0/filtered_stderr.log");
  EXPECT_TRUE(w.out.filtered_file.empty());
}

TEST_F(LocalGroupTest, ListedSignalsAreForwardedAndTheJobGoesOn) {
  config_.handled_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1};
  config_.signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1";
  Make().Start();
  EXPECT_EQ(EnvOf(workers_.spawned[0], "TORCHELASTIC_SIGNALS_TO_HANDLE"),
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1");
  group_->OnSignal(SIGUSR1);
  EXPECT_EQ(SignalsOf(SIGUSR1), 3);
  EXPECT_EQ(SignalsOf(SIGTERM), 0);
  EXPECT_EQ(group_->outcome(), GroupOutcome::kRunning);
  AllExit(0);
  EXPECT_EQ(group_->outcome(), GroupOutcome::kSucceeded);
}

TEST_F(LocalGroupTest, AnUnlistedSignalStopsTheJobWithSigterm) {
  config_.handled_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  Make().Start();
  group_->OnSignal(SIGUSR2);
  EXPECT_EQ(SignalsOf(SIGUSR2), 0);
  EXPECT_EQ(SignalsOf(SIGTERM), 3);
  workers_.KillAll(SIGTERM);
  group_->OnChildExits();
  EXPECT_EQ(group_->outcome(), GroupOutcome::kSignaled);
  EXPECT_EQ(group_->stop_signal(), SIGUSR2);
}

TEST_F(LocalGroupTest, VirtualLocalRankGivesEachWorkerOneGpu) {
  config_.virtual_local_rank = true;
  config_.environment["CUDA_VISIBLE_DEVICES"] = "4,5,7";
  Make().Start();
  const WorkerSpec& w = workers_.spawned[2];
  EXPECT_EQ(EnvOf(w, "LOCAL_RANK"), "0");
  EXPECT_EQ(EnvOf(w, "RANK"), "2");
  EXPECT_EQ(EnvOf(w, "CUDA_VISIBLE_DEVICES"), "7");
}

TEST_F(LocalGroupTest, RedirectedStreamsGoToTheAttemptsFolder) {
  config_.redirects = StreamSpec{2, {}};
  Make().Start();
  const WorkerSpec& w = workers_.spawned[1];
  EXPECT_EQ(w.err.console_fd, -1);
  EXPECT_EQ(w.out.console_fd, 1);
  EXPECT_EQ(w.err.file, group_->run_dir() + "/attempt_0/1/stderr.log");
  EXPECT_TRUE(w.out.file.empty());
}

TEST_F(LocalGroupTest, ACrashIsPublishedWithItsLastStderrLines) {
  config_.redirects = StreamSpec{3, {}};
  RecordingObserver seen;
  seen.crashes_wanted = true;
  Make().set_observer(&seen);
  group_->Start();
  std::string log = group_->run_dir() + "/attempt_0/2/stderr.log";
  ASSERT_TRUE(
      os::WriteFile(log, "one\ntwo\nModuleNotFoundError: torch\n").ok());
  workers_.Exit(FakeWorkerGroup::kFirstPid + 2, 1);
  group_->OnChildExits();
  ASSERT_EQ(seen.crashes.size(), 1u);
  EXPECT_EQ(seen.crashes[0].rank, 2);
  EXPECT_EQ(seen.crashes[0].attempt, 0);
  EXPECT_EQ(seen.crashes[0].stderr_file, log);
  EXPECT_EQ(seen.crashes[0].stderr_tail,
            "one\ntwo\nModuleNotFoundError: torch\n");
  EXPECT_EQ(workers_.read_pending_calls, 1);  // its last words were read first
}

// A job that does not want crashes costs the group no read of the pipes.
TEST_F(LocalGroupTest, ACrashNobodyWantsIsNotRead) {
  RecordingObserver seen;
  Make().set_observer(&seen);
  group_->Start();
  workers_.Exit(FakeWorkerGroup::kFirstPid + 2, 1);
  group_->OnChildExits();
  EXPECT_TRUE(seen.crashes.empty());
  EXPECT_EQ(workers_.read_pending_calls, 0);
}

// `dtrun --stacks` asked twice at once, in the run folder and through the
// job's store: the group takes the stacks once (one tool run per worker)
// and both requests get that answer; the watchers only carried them.
TEST_F(LocalGroupTest, OneCaptureAnswersEveryStackRequest) {
  RecordingObserver seen;
  Make().set_observer(&seen);
  group_->Start();
  const std::string request = group_->run_dir() + "/stacks.request";
  ASSERT_TRUE(os::WriteFile(request, "q7\n").ok());
  seen.stacks_asked = true;
  clock_.Advance(std::chrono::seconds(2));
  group_->OnTick();
  ASSERT_EQ(seen.answers.size(), 1u);
  EXPECT_NE(seen.answers[0].find("\"stacks\""), std::string::npos);
  EXPECT_EQ(os::ReadFileOrEmpty(group_->run_dir() + "/stacks.q7.json"),
            seen.answers[0]);
  EXPECT_EQ(access(request.c_str(), F_OK), -1);  // taken
  // A stack tool per worker at most (none where no tool is installed).
  const size_t one_capture = workers_.tools_run.size();
  EXPECT_LE(one_capture, 3u);
  clock_.Advance(std::chrono::seconds(2));
  group_->OnTick();  // nothing asked since: no capture
  EXPECT_EQ(workers_.tools_run.size(), one_capture);
  EXPECT_EQ(seen.answers.size(), 1u);
}

TEST_F(LocalGroupTest, FinishDrainsOutputAndKeepsALogDir) {
  Make().Start();
  AllExit(0);
  group_->Finish(true);
  EXPECT_EQ(workers_.drain_calls, 1);
  EXPECT_EQ(access(group_->run_dir().c_str(), F_OK), 0);
}

TEST_F(LocalGroupTest, ATemporaryRunFolderGoesOnlyWhenTheJobSucceeded) {
  config_.log_dir.clear();
  setenv("TMPDIR", dir_.c_str(), 1);
  Make().Start();
  std::string run_dir = group_->run_dir();
  EXPECT_EQ(run_dir.rfind(dir_ + "/dtrun-job7_", 0), 0u) << run_dir;
  group_->Finish(false);
  EXPECT_EQ(access(run_dir.c_str(), F_OK), 0);
  group_->Finish(true);
  EXPECT_NE(access(run_dir.c_str(), F_OK), 0);
  unsetenv("TMPDIR");
}

}  // namespace
}  // namespace dtrun::agent
