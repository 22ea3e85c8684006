// The local group: the Agent (pure) says what to do with this node's workers,
// the WorkerGroup does it. Everything here runs on the job's thread, woken by
// poll(2) on the signalfd (SIGCHLD and stop signals), the workers' pipes and
// torch's timer pipe, with the Agent's next deadline as the timeout.
#include "apps/dtrun/local_group.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "apps/dtrun/events.h"
#include "apps/dtrun/outcome_metrics.h"
#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/failure_report.h"
#include "apps/dtrun/in_place.h"
#include "apps/dtrun/numa_binding.h"
#include "apps/dtrun/run_layout.h"
#include "apps/dtrun/standby.h"
#include "rendezvous/util/check.h"
#include "rendezvous/util/console.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

AgentOptions AgentOptionsOf(const LaunchConfig& c, bool elastic) {
  // With rendezvous, restarts are counted by the rendezvous, the same on
  // every node; the local agent only reports that its group failed.
  AgentOptions o{c.nproc_per_node, elastic ? 0 : c.max_restarts,
                 c.term_timeout};
  o.uninterruptible_timeout = c.uninterruptible_timeout;
  o.max_restarts_without_progress = c.max_restarts_without_progress;
  // On many nodes, each node's replacements count against its
  // --max-restarts.
  o.in_place = c.restart == RestartMode::kInPlace;
  if (elastic) o.in_place_limit = c.max_restarts;
  return o;
}

}  // namespace

LocalGroup::LocalGroup(const LaunchConfig& config, WorkerGroup* workers,
                       const Clock* clock, SignalFd* signals, bool elastic)
    : config_(config),
      workers_(workers),
      clock_(clock),
      signals_(signals),
      elastic_(elastic),
      agent_(AgentOptionsOf(config, elastic)),
      hang_(config_, clock, workers),
      timer_(config_, clock),
      watch_(config_, clock) {
  assignment_.world_size = config.nproc_per_node;
}

GroupView LocalGroup::View() const {
  return GroupView{pids_,    exit_time_,   beats_,        assignment_,
                   attempt_, attempt_dir_, agent_.phase()};
}

Status LocalGroup::Prepare(const std::string& run_id) {
  attempt_.run_id = run_id;
  attempt_.role = config_.role;
  attempt_.max_restarts = config_.max_restarts;
  attempt_.signals_to_handle = config_.signals_to_handle;
  attempt_.virtual_local_rank = config_.virtual_local_rank;
  base_env_ = config_.environment;
  // A Python worker that dies of SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT
  // prints its Python stack first, as a user's PYTHONFAULTHANDLER would.
  if (config_.python_worker && !base_env_.count("PYTHONFAULTHANDLER"))
    base_env_["PYTHONFAULTHANDLER"] = "1";
  copies_.PersistOrphans();
  copies_.AddEnv(&base_env_);
  in_place::AddEnv(config_, &base_env_);
  if (config_.nproc_per_node > 1 && !base_env_.count("OMP_NUM_THREADS")) {
    Logger("dtrun.agent")
        ->warn(
            "setting OMP_NUM_THREADS=1 for each worker to avoid "
            "overloading the host; set it yourself to tune");
  }
  auto dir =
      layout::MakeRunDir(config_.log_dir, run_id + "_" + os::RandomHex(8));
  if (!dir.ok()) return dir.status();
  run_dir_ = *dir;
  run_dir_is_temp_ = config_.log_dir.empty();
  if (!config_.numa_binding.empty()) {
    auto visible = base_env_.find("CUDA_VISIBLE_DEVICES");
    auto plan = PlanCpus(config_.numa_binding,
                         visible == base_env_.end() ? "" : visible->second,
                         config_.nproc_per_node);
    if (!plan.ok()) return plan.status();
    cpu_plan_ = *plan;
  }
  if (Status served = StartServers(); !served.ok()) return served;
  watch_.Prepare(run_dir_);
  // Python workers get the torch shim (worker_env.h); then any standby.
  Status s = config_.python_worker
                 ? InstallTorchShim(layout::ShimDir(run_dir_), &base_env_)
                 : Status::Ok();
  if (s.ok() && (config_.standby || !config_.standby_modules.empty()))
    workers_->UseStandby(StartStandby(config_, base_env_, run_dir_));
  return s;
}

// The entry points below turn an event into the Agent's call with the time
// of now, and carry out what it answers (Apply). None of them blocks.
void LocalGroup::Start() { Apply(agent_.Start(clock_->Now())); }

void LocalGroup::StartRound(int round) {
  outcome_ = Outcome::kRunning;
  Apply(agent_.StartRound(round, clock_->Now()));
}

void LocalGroup::StopForNewRound() {
  watch_.OnRoundOver(View(), clock_->UnixSeconds());
  Apply(agent_.StopForNewRound(clock_->Now()));
}

// The one blocking entry: SIGTERM, then the Agent's own escalation (SIGKILL
// after --term-timeout) runs in PollOnce until every worker is reaped.
void LocalGroup::StopAndWait() {
  if (agent_.alive() == 0) return;
  Apply(agent_.OnSignal(SIGTERM, clock_->Now()));
  while (agent_.alive() > 0) PollOnce(100);
}

// How long poll(2) may sleep: the caller's limit, cut to the soonest of
// the Agent's deadline (escalation, restart delay), the hang monitor's next
// check, the timer pipe's next expiry and the D-state check. Nothing else
// can change without a file descriptor waking the poll.
int LocalGroup::PollTimeout(int timeout_ms) const {
  int timeout = timeout_ms;
  auto sooner = [&timeout](int ms) {
    if (ms >= 0) timeout = timeout < 0 ? ms : std::min(timeout, ms);
  };
  auto by = [&](TimePoint t) {
    auto left = std::chrono::duration_cast<milliseconds>(t - clock_->Now());
    // +1: poll rounds down, and waking a hair early would spin.
    sooner(static_cast<int>(std::max<int64_t>(0, left.count()) + 1));
  };
  const bool running = agent_.phase() == Phase::kRunning;
  if (auto deadline = agent_.deadline()) by(*deadline);
  sooner(hang_.NextCheckMs(running));
  sooner(timer_.NextMs());
  if (config_.uninterruptible_timeout.count() > 0 && running)
    sooner(static_cast<int>(kDStateCheck.count()));
  sooner(watch_.NextMs(agent_.phase()));
  if (running) by(next_beat_read_);
  if (keep_check_at_) by(*keep_check_at_);
  return timeout;
}

// One turn of the loop: wait on the signalfd, the timer pipe and every
// worker's output pipe, forward output, then handle signals (SIGCHLD reaps
// exits) and the time-driven checks.
void LocalGroup::PollOnce(int timeout_ms) {
  if (!deferred_signals_.empty()) {
    std::vector<int> deferred;
    deferred.swap(deferred_signals_);
    for (int signo : deferred) OnSignal(signo);
  }
  std::vector<pollfd> fds;
  if (signals_) fds.push_back({signals_->fd(), POLLIN, 0});
  if (timer_.fd() >= 0) fds.push_back({timer_.fd(), POLLIN, 0});
  for (int fd : workers_->output_fds()) fds.push_back({fd, POLLIN, 0});
  if (poll(fds.data(), fds.size(), PollTimeout(timeout_ms)) < 0)
    return;  // EINTR: look again
  bool signalled = false;
  for (const pollfd& p : fds) {
    if (!p.revents) continue;
    if (signals_ && p.fd == signals_->fd()) {
      signalled = true;
    } else if (p.fd == timer_.fd()) {
      timer_.OnReadable();
    } else {
      workers_->OnReadable(p.fd);
    }
  }
  // Output first, then exits: a worker's last lines print before its death.
  if (signalled) {
    for (int signo : signals_->Read()) OnSignal(signo);
  }
  OnTick();
}

// What a signal does is decided by signals.cc (UseOf) from the job's
// --signals-to-handle; this only carries it out.
void LocalGroup::OnSignal(int signo) {
  auto log = Logger("dtrun.agent");
  switch (UseOf(signo, config_.handled_signals)) {
    case SignalUse::kChildren:
      OnChildExits();
      return;
    case SignalUse::kForward:
      // SLURM's --signal=USR1@T warns of the end of the allocation: the
      // workers save a checkpoint while the job goes on.
      log->warn("received {}; forwarding it to {} worker(s)", SignalName(signo),
                pids_.size());
      for (const auto& [local_rank, pid] : pids_) workers_->Signal(pid, signo);
      return;
    case SignalUse::kStop:
      OnStopSignal(signo);
      return;
    case SignalUse::kStopTerm:
      log->warn(
          "received {}, which --signals-to-handle does not list; stopping "
          "the workers with SIGTERM",
          SignalName(signo));
      Apply(agent_.OnSignal(signo, clock_->Now(), SIGTERM));
      return;
  }
}

void LocalGroup::OnStopSignal(int signo) {
  Logger("dtrun.agent")
      ->warn("received {}; stopping workers", SignalName(signo));
  Apply(agent_.OnSignal(signo, clock_->Now()));
}

// Reaps every exited worker. A failure while the group runs is logged and
// published for an interactive console before the Agent hears of it, so the
// crash record is in the store by the time the group is stopped.
void LocalGroup::OnChildExits() {
  for (const WorkerExit& e : workers_->Reap()) {
    if (abandoned_.erase(e.pid)) continue;  // counted as gone already
    exit_time_[e.pid] = clock_->UnixSeconds();
    hang_.OnExit(e.local_rank);
    const bool first_failure = e.failed() && agent_.phase() == Phase::kRunning;
    // What the kernel said counts only for deaths dtrun did not cause.
    if (e.failed() && agent_.phase() == Phase::kRunning && !e.cause.empty())
      cause_[e.pid] = e.cause;
    if (e.oom && agent_.phase() == Phase::kRunning) watch_.OnOomKill();
    if (first_failure) {
      watch_.OnWorkerFailed(View(), exit_time_[e.pid]);
      std::string how = e.signal ? SignalName(e.signal)
                                 : "exit code " + std::to_string(e.exit_code);
      Logger("dtrun.agent")
          ->warn("worker local_rank {} (pid {}) failed: {}{}", e.local_rank,
                 e.pid, how, e.cause.empty() ? "" : ": " + e.cause);
      NoteGpuErrors();
      PublishCrash(e, how);
      CheckProgress();
    }
    const int attempt = first_failure ? ReplacementAttempt(e) : -1;
    Apply(agent_.OnWorkerExit(e, clock_->Now(), attempt >= 0, attempt));
    if (first_failure) watch_.OnRestartDecided();
  }
}

// The time-driven checks, each skipped once an earlier one ended the
// attempt: the Agent's deadlines, hung workers (--hang-timeout), workers
// stuck in D state, and torch's FileTimer requests.
void LocalGroup::OnTick() {
  if (agent_.phase() == Phase::kRunning && clock_->Now() >= next_beat_read_)
    ReadBeats();
  if (watch_.OnTick(View()))
    AnswerStackRequests(agent_.phase() == Phase::kRunning);
  if (outcome_ != Outcome::kRunning) return;
  Apply(agent_.OnTick(clock_->Now()));
  if (outcome_ != Outcome::kRunning) return;
  int signo = hang_.Check(agent_.phase() == Phase::kRunning, pids_,
                          assignment_.base_rank);
  if (signo) {
    watch_.OnHang(attempt_.restart_count);
    CheckProgress();
    Apply(agent_.OnHang(signo, clock_->Now()));
  }
  if (outcome_ == Outcome::kRunning) CheckUninterruptible();
  if (outcome_ == Outcome::kRunning) CheckKeptWorkers();
  if (outcome_ == Outcome::kRunning)
    timer_.Check(pids_, PythonWorkers(config_));
}

// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: the Agent decides from the
// workers' /proc states, read every kDStateCheck; the report names the
// worker and the kernel function it sleeps in.
void LocalGroup::CheckUninterruptible() {
  if (config_.uninterruptible_timeout.count() <= 0 ||
      agent_.phase() != Phase::kRunning)
    return;
  TimePoint now = clock_->Now();
  if (now < next_d_check_) return;
  next_d_check_ = now + kDStateCheck;
  std::vector<int> in_d;
  for (const auto& [local_rank, pid] : pids_) {
    if (!exit_time_.count(pid) && os::ProcessState(pid) == 'D')
      in_d.push_back(local_rank);
  }
  std::vector<Action> actions = agent_.OnDState(in_d, now);
  if (actions.empty()) return;
  const int lr = agent_.stuck().local_rank;
  const int pid = pids_[lr];
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                     now - agent_.stuck().since)
                     .count();
  d_report_ = StuckReport(lr, assignment_.base_rank + lr, pid, seconds,
                          os::ProcessWaitChannel(pid));
  Logger("dtrun.agent")->error("{}", d_report_);
  Apply(actions);
}

// For the waits outside the poll loop (rendezvous, store connect): drains
// the signalfd and says whether a stop signal came. A forwarded signal has
// no worker to go to then, which the log says.
bool LocalGroup::Interrupted() {
  if (signals_) {
    std::vector<int> read;
    read.swap(deferred_signals_);
    for (int signo : signals_->Read()) read.push_back(signo);
    if (int stop = StopSignalAmong(read, config_.handled_signals))
      stop_signal_ = stop;
  }
  return stop_signal_ != 0;
}

// Carries out the Agent's actions in order, on the real workers.
void LocalGroup::Apply(const std::vector<Action>& actions) {
  for (const Action& a : actions) {
    // A hung group's report waits until its stack dumps are in (the
    // signal that makes them is the first action).
    if (a.kind != Action::Kind::kSignalGroup && agent_.hung()) hang_.Report();
    switch (a.kind) {
      case Action::Kind::kAbandonGroup:
        AbandonSurvivors();
        break;
      case Action::Kind::kStartGroup:
        StartWorkers(a.restart_count);
        break;
      case Action::Kind::kReplaceWorker:
        ReplaceWorker(a.local_rank, a.restart_count);
        break;
      case Action::Kind::kSignalGroup:
        for (const auto& [local_rank, pid] : pids_)
          workers_->Stop(pid, a.signo);
        break;
      case Action::Kind::kFinish:
        OnFinished(a);
        break;
      case Action::Kind::kGroupStopped:
        outcome_ = Outcome::kStopped;
        watch_.OnAttemptEnded(View(), "new round");
        copies_.PersistInBackground("the group stopped for a new round");
        break;
    }
  }
}

// The attempt is over: how, for the job (which may restart it, or join a
// new round when elastic) and for the log.
void LocalGroup::OnFinished(const Action& finish) {
  watch_.OnFinished();
  stop_signal_ = finish.signo;
  outcome_ = finish.signo    ? Outcome::kSignaled
             : finish.failed ? Outcome::kFailed
                             : Outcome::kSucceeded;
  watch_.OnAttemptEnded(View(), finish.signo
                                    ? "stopped by " + SignalName(finish.signo)
                                    : AttemptCause());
  // Whatever comes next (a restart, a new round, the end), the newest
  // copies in memory reach the disk: this node may not live to the next.
  if (finish.signo || finish.failed) {
    copies_.PersistInBackground(
        finish.signo
            ? "stopped by " + SignalName(finish.signo)
            : "attempt " + std::to_string(attempt_.restart_count) + " failed");
  }
  if (elastic_) return;  // the rendezvous decides what happens next
  auto log = Logger("dtrun.agent");
  if (finish.signo) {
    log->warn("workers stopped after {}; exit code {}",
              SignalName(finish.signo), ExitBySignal(finish.signo));
  } else if (!finish.failed) {
    log->info("all {} worker(s) succeeded", config_.nproc_per_node);
  }
}

// Where one stream (stream_bit 1: stdout, 2: stderr) of one worker of the
// current attempt goes (output_route.h).
OutputRoute LocalGroup::Route(int local_rank, int stream_bit) const {
  StreamPlace place{local_rank, assignment_.base_rank + local_rank, stream_bit,
                    attempt_dir_, hang_.enabled() || config_.file_timer};
  return RouteOf(config_, place);
}

// Everything the WorkerGroup needs to start local rank `lr`: argv, the
// environment (torchrun's variables, the hang beat file, the timer pipe),
// its two output routes and its CPUs (--numa-binding).
WorkerSpec LocalGroup::SpecFor(int lr, const std::string& attempt_dir) {
  (void)os::MakeDirs(layout::RankDir(attempt_dir, lr));
  // A stale error file would name the wrong failure.
  ::unlink(ErrorFilePath(attempt_, lr).c_str());
  EnvMap env =
      WorkerEnv(base_env_, attempt_,
                PlaceOf(lr, config_.nproc_per_node, assignment_.base_rank,
                        assignment_.group_rank, assignment_.group_world_size,
                        assignment_.world_size));
  hang_.AddEnv(lr, attempt_dir, &env);
  timer_.AddEnv(&env);
  WorkerSpec spec;
  spec.local_rank = lr;
  spec.argv = config_.worker_argv;
  spec.env = ToEnvStrings(env);
  spec.out = Route(lr, 1);
  spec.err = Route(lr, 2);
  if (static_cast<size_t>(lr) < cpu_plan_.size())
    spec.cpus = cpu_plan_[static_cast<size_t>(lr)];
  return spec;
}

// Starts attempt `restart_count` in its own folder. A worker that cannot be
// spawned does not stop the others: its exit (127) fails the attempt like
// any other failure, with the spawn error as its message.
void LocalGroup::StartWorkers(int restart_count) {
  auto log = Logger("dtrun.agent");
  watch_.OnSpawning(restart_count);
  observer_->OnAttemptStarting(restart_count);
  if (restart_count > 0 && !elastic_) {
    log->warn("restarting the worker group: attempt {} of {}",
              restart_count + 1, config_.max_restarts + 1);
  }
  if (restart_count > 0 && !elastic_)
    watch_.OnAttemptEnded(View(), AttemptCause());
  // The last attempt's workers are gone: their newest copies in memory go
  // to disk while the new ones start (and may resume from those copies).
  if (restart_count > 0)
    copies_.PersistInBackground("before attempt " +
                                std::to_string(restart_count));
  attempt_.restart_count = restart_count;
  // A round of its own store (many nodes) names its segments after its
  // port: the last round's go as well.
  if (staged_port_ != attempt_.master_port)
    in_place::RemoveStaged(config_, staged_port_);
  staged_port_ = attempt_.master_port;
  in_place::RemoveStaged(config_, attempt_.master_port);
  const double started = clock_->UnixSeconds();
  attempt_dir_ = layout::AttemptDir(run_dir_, restart_count);
  attempt_.error_file_dir = attempt_dir_;
  timer_.Open(run_dir_);
  pids_.clear();
  spawn_error_.clear();
  cause_.clear();
  gpu_errors_.clear();
  (void)workers_->KernelErrors();  // an earlier attempt's
  AwaitWarmStandby(workers_, signals_, clock_, config_.handled_signals,
                   &deferred_signals_);
  std::string pid_list;
  int warm = 0;
  for (int lr = 0; lr < config_.nproc_per_node; ++lr) {
    const int pid = SpawnRank(lr);
    warm += workers_->spawned_warm() ? 1 : 0;
    if (pid) pid_list += (pid_list.empty() ? "" : ",") + std::to_string(pid);
  }
  agent_.OnGroupStarted();
  hang_.Reset(config_.nproc_per_node, attempt_dir_, restart_count);
  beats_.Reset(attempt_dir_, config_.nproc_per_node);
  watch_.OnSpawned(started);
  log->info("attempt {}: started {} worker(s), pids {}{}", restart_count,
            config_.nproc_per_node, pid_list,
            warm ? " (" + std::to_string(warm) + " from the standby)" : "");
}

// A worker that cannot be spawned is reported as that rank's failure when
// its exit (127) is reaped; 0 then.
int LocalGroup::SpawnRank(int lr) {
  Result<int> pid = workers_->Spawn(SpecFor(lr, attempt_dir_));
  if (!pid.ok()) {
    spawn_error_[lr] = pid.status().message();
    Logger("dtrun.agent")
        ->error("local_rank {}: {}", lr, pid.status().message());
    return 0;
  }
  pids_[lr] = *pid;
  return *pid;
}

// The Agent gave up waiting for workers that outlived SIGKILL: their later
// exits are ignored, so a new attempt is not confused by them.
void LocalGroup::AbandonSurvivors() {
  for (const auto& [local_rank, pid] : pids_) {
    if (exit_time_.count(pid)) continue;
    abandoned_[pid] = true;
    Logger("dtrun.agent")
        ->error(
            "worker local_rank {} (pid {}) is still alive long after SIGKILL "
            "(uninterruptible sleep?); going on without it",
            local_rank, pid);
  }
}

void LocalGroup::PublishCrash(const WorkerExit& e, const std::string& how) {
  if (!observer_->wants_crashes()) return;
  WorkerCrash crash;
  crash.attempt = attempt_.restart_count;
  crash.rank = assignment_.base_rank + e.local_rank;
  crash.how = how;
  crash.host = os::HostName();
  crash.addr = config_.local_addr;
  crash.stderr_file = Route(e.local_rank, 2).file;
  if (!crash.stderr_file.empty()) {
    workers_->ReadPending(
        milliseconds(200));  // its last words may still be in the pipe
    crash.stderr_tail = os::ReadTail(crash.stderr_file, 8);
  }
  observer_->OnWorkerCrash(crash);
}

// The one reader of the beat files: each new beat to the hang watch and
// the watchers (stragglers, recovery, status).
void LocalGroup::ReadBeats() {
  // Often enough to see most steps of a fast loop from its first: a stat
  // per worker 100 times a second, some microseconds of dtrun's time.
  next_beat_read_ = clock_->Now() + kBeatReadEvery;
  std::vector<int> fresh = beats_.ReadNew();
  for (int lr : fresh) {
    hang_.OnBeat(lr, beats_.last(lr));
    const bool replacing = agent_.replacing();
    agent_.OnBeat(lr);  // a replacement back in step
    if (replacing && !agent_.replacing())
      observer_->OnReplaced(agent_.restart_count());
  }
  if (!fresh.empty()) watch_.OnBeats(View(), fresh);
}

void LocalGroup::AnswerStackRequests(bool running) {
  // The run folder's requests wait for running workers; the job's are
  // answered at once, since another node may be weighing a hang with them.
  const std::optional<std::string> id =
      running ? watch_.TakeStackRequest() : std::nullopt;
  const bool job = observer_->StacksWanted();
  if (!id && !job) return;
  const std::string stacks = StacksJson();
  if (id) watch_.AnswerStackRequest(*id, stacks);
  if (job) observer_->AnswerStacks(stacks);
}

std::string LocalGroup::StacksJson() {
  std::map<int, int> live;
  for (const auto& [local_rank, pid] : pids_) {
    if (!exit_time_.count(pid)) live[local_rank] = pid;
  }
  return hang_.StacksAnswer(live, assignment_.base_rank, watch_.Observe(View()),
                            watch_.started_at());
}

// --max-restarts-without-progress, when an attempt fails: the highest step
// beaten so far (a "done" beat is past every step) goes to the Agent.
void LocalGroup::CheckProgress() {
  if (config_.max_restarts_without_progress <= 0) return;
  ReadBeats();  // the last beats before the failure count
  agent_.OnAttemptFailing(beats_.HighestStep());
  if (agent_.gave_up())
    Logger("dtrun.agent")->error("{}", agent_.why_gave_up());
}

void LocalGroup::Finish(bool succeeded) {
  watch_.Finish();
  copies_.Finish();  // persisted when the last attempt failed, then removed
  in_place::RemoveStaged(config_, staged_port_);
  in_place::RemoveStaged(config_, attempt_.master_port);
  // Workers are gone, but a grandchild holding a pipe open must not keep
  // dtrun alive: forward what is there for up to a second, then close.
  workers_->Drain(milliseconds(1000));
  // Said when it happened, and again here, where a person reads last.
  for (const std::string& e : workers_->LogErrors())
    WriteAll(2, "dtrun: a worker log file was cut short: " + e + "\n");
  watch_.RecordEnd(View(), agent_.failures(), succeeded);
  // A temporary folder goes, unless it holds the filtered copies asked for.
  bool keep = !config_.duplicate_stdout_filters.empty() ||
              !config_.duplicate_stderr_filters.empty();
  if (succeeded && run_dir_is_temp_ && !keep) os::RemoveTree(run_dir_);
}

// The facts of the attempt that ended last (failure_report.h).
FailedAttempt LocalGroup::Facts() const {
  FailedAttempt a;
  a.base_rank = assignment_.base_rank;
  a.pids = pids_;
  a.hung = agent_.hung();
  if (a.hung) a.hung_ranks = hang_.Failures();
  if (agent_.unhealthy()) {
    a.stuck_local_rank = agent_.stuck().local_rank;
    a.stuck_report = d_report_;
  }
  a.exits = agent_.failures();
  a.exit_time = exit_time_;
  a.cause = cause_;
  a.spawn_error = spawn_error_;
  a.now = clock_->UnixSeconds();
  a.gave_up = agent_.gave_up();
  a.why_gave_up = agent_.why_gave_up();
  return a;
}

// The failure summary of a failed attempt, with every failed rank's error
// file; --error-file gets the root cause's, whose exit code is returned.
int LocalGroup::ReportFailure() {
  const std::vector<WorkerFailure> failures =
      FailuresOf(Facts(), [this](WorkerFailure* f) {
        ReadErrorFile(ErrorFilePath(attempt_, f->local_rank), f);
        timer_.Describe(attempt_dir_, f);
      });
  DTRUN_CHECK(!failures.empty()) << "a failed attempt with no failed worker";
  NoteGpuErrors();
  const std::string& program = config_.entrypoint[0];
  WriteAll(2, FormatFailureSummary(program.substr(program.rfind('/') + 1),
                                   os::HostName(), failures,
                                   agent_.restart_count() + 1, run_dir_,
                                   config_.max_restarts, gpu_errors_));
  return ExitCodeOfSummary(failures[RootCause(failures)], config_.error_file,
                           agent_.gave_up(), agent_.why_gave_up());
}

// The kernel's GPU errors since the last look, logged and kept for the
// attempt's summary.
void LocalGroup::NoteGpuErrors() {
  for (std::string& x : workers_->KernelErrors()) {
    Logger("dtrun.agent")->error("the kernel logged a GPU error: {}", x);
    gpu_errors_.push_back(std::move(x));
  }
}

}  // namespace dtrun::agent
