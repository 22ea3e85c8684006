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
#include "apps/dtrun/numa_binding.h"
#include "rendezvous/util/check.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/console.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

// How long the agent's loop may go without a pass (it passes at least once
// a second) while the workers run before the health port answers 503: the
// loop is wedged, and a kubelet's liveness probe should say so.
constexpr milliseconds kLoopSilentLimit{30000};

AgentOptions AgentOptionsOf(const LaunchConfig& c, bool elastic) {
  // With rendezvous, restarts are counted by the rendezvous, the same on
  // every node; the local agent only reports that its group failed.
  return AgentOptions{c.nproc_per_node, elastic ? 0 : c.max_restarts,
                      c.term_timeout};
}

}  // namespace

std::string ExpandLinePrefix(const std::string& text,
                             const LinePrefixValues& v) {
  // string.Template.safe_substitute, as torchrun expands it: ${name} only,
  // unknown names left as they are. ${pid} is the worker's, filled in when
  // it has one (PosixWorkerGroup::Spawn).
  std::string out = text;
  auto replace = [&out](const std::string& key, const std::string& value) {
    for (size_t at = out.find(key); at != std::string::npos;
         at = out.find(key, at + value.size())) {
      out.replace(at, key.size(), value);
    }
  };
  replace("${role_name}", v.role);
  replace("${rank}", std::to_string(v.rank));
  replace("${local_rank}", std::to_string(v.local_rank));
  replace("${hostname}", v.hostname);
  return out;
}

LocalGroup::LocalGroup(const LaunchConfig& config, WorkerGroup* workers,
                       const Clock* clock, SignalFd* signals, bool elastic)
    : config_(config),
      workers_(workers),
      clock_(clock),
      signals_(signals),
      elastic_(elastic),
      agent_(AgentOptionsOf(config, elastic)),
      hang_(config_, clock, workers),
      timer_(config_) {
  assignment_.world_size = config.nproc_per_node;
}

Status LocalGroup::Prepare(const std::string& run_id) {
  attempt_.run_id = run_id;
  attempt_.role = config_.role;
  started_at_ = os::UnixNow();
  attempt_.max_restarts = config_.max_restarts;
  attempt_.signals_to_handle = config_.signals_to_handle;
  attempt_.virtual_local_rank = config_.virtual_local_rank;
  base_env_ = config_.environment;
  copies_.PersistOrphans();
  copies_.AddEnv(&base_env_);
  if (config_.nproc_per_node > 1 && !base_env_.count("OMP_NUM_THREADS")) {
    Logger("dtrun.agent")
        ->warn(
            "setting OMP_NUM_THREADS=1 for each worker to avoid "
            "overloading the host; set it yourself to tune");
  }
  std::string name = run_id + "_" + os::RandomHex(8);
  if (config_.log_dir.empty()) {
    auto dir = os::MakeTempDir("dtrun-" + name + "-");
    if (!dir.ok())
      return Status::Io(dir.status().message() + " (or give --log-dir)");
    run_dir_ = *dir;
    run_dir_is_temp_ = true;
  } else {
    run_dir_ = config_.log_dir + "/" + name;
    Status s = os::MakeDirs(run_dir_);
    if (!s.ok()) return Status::Io("--log-dir: " + s.message());
  }
  if (!config_.numa_binding.empty()) {
    Status bound = PlanCpus();
    if (!bound.ok()) return bound;
  }
  if (Status served = StartServers(); !served.ok()) return served;
  // The progress line shares the terminal with the workers' output, never
  // with a session's console or a pipe.
  progress_line_ =
      config_.progress && !config_.interactive && console::EnableStatusLine(1);
  // Python workers get the torch compatibility shim (worker_env.h), once per
  // run.
  if (config_.python_worker)
    return InstallTorchShim(run_dir_ + "/python", &base_env_);
  return Status::Ok();
}

Status LocalGroup::PlanCpus() {
  auto topology = LoadTopology();
  if (!topology.ok()) return topology.status();
  auto visible = base_env_.find("CUDA_VISIBLE_DEVICES");
  std::vector<int> devices = GpuOfLocalRanks(
      visible == base_env_.end() ? "" : visible->second,
      static_cast<int>(topology->gpu_numa.size()), config_.nproc_per_node);
  auto plan = PlanBinding(config_.numa_binding, *topology,
                          config_.nproc_per_node, devices);
  if (!plan.ok()) return plan.status();
  cpu_plan_ = *plan;
  // A topology from HWLOC_XMLFILE / HWLOC_SYNTHETIC may name CPUs this
  // machine (or dtrun's own cpuset, under SLURM or a container) lacks.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  sched_getaffinity(0, sizeof(mine), &mine);
  for (size_t lr = 0; lr < cpu_plan_.size(); ++lr) {
    for (int cpu : cpu_plan_[lr]) {
      if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mine)) continue;
      return Status::Invalid(
          "--numa-binding=" + config_.numa_binding + ": CPU " +
          std::to_string(cpu) + " (planned for local_rank " +
          std::to_string(lr) +
          ") is not one dtrun may run on here; does HWLOC_XMLFILE or "
          "HWLOC_SYNTHETIC describe another machine?");
    }
  }
  auto log = Logger("dtrun.agent");
  for (size_t lr = 0; lr < cpu_plan_.size(); ++lr) {
    log->info("--numa-binding={}: local_rank {} on CPUs {}{}",
              config_.numa_binding, lr, CpuListText(cpu_plan_[lr]),
              devices.empty()
                  ? ""
                  : " (near GPU " + std::to_string(devices[lr]) + ")");
  }
  return Status::Ok();
}

// The entry points below turn an event into the Agent's call with the time
// of now, and carry out what it answers (Apply). None of them blocks.
void LocalGroup::Start() { Apply(agent_.Start(clock_->Now())); }

void LocalGroup::StartRound(int round) {
  outcome_ = Outcome::kRunning;
  Apply(agent_.StartRound(round, clock_->Now()));
}

void LocalGroup::StopForNewRound() {
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
  if (auto deadline = agent_.deadline()) {
    auto left =
        std::chrono::duration_cast<milliseconds>(*deadline - clock_->Now());
    // +1: poll rounds down, and waking a hair early would spin.
    sooner(static_cast<int>(std::max<int64_t>(0, left.count()) + 1));
  }
  sooner(hang_.NextCheckMs(agent_.phase() == Phase::kRunning));
  sooner(timer_.NextMs());
  if (config_.uninterruptible_timeout.count() > 0 &&
      agent_.phase() == Phase::kRunning) {
    sooner(static_cast<int>(kDStateCheck.count()));
  }
  auto until = [this](TimePoint t) {
    auto left = std::chrono::duration_cast<milliseconds>(t - clock_->Now());
    return static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
  };
  if (agent_.phase() != Phase::kIdle && agent_.phase() != Phase::kFinished)
    sooner(until(next_status_));
  if (agent_.phase() == Phase::kRunning) sooner(until(next_beat_read_));
  return timeout;
}

// One turn of the loop: wait on the signalfd, the timer pipe and every
// worker's output pipe, forward output, then handle signals (SIGCHLD reaps
// exits) and the time-driven checks.
void LocalGroup::PollOnce(int timeout_ms) {
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
    exit_time_[e.pid] = os::UnixNow();
    hang_.OnExit(e.local_rank);
    const bool first_failure = e.failed() && agent_.phase() == Phase::kRunning;
    if (first_failure) {
      recovery_ = RecoveryTimes();
      recovery_.failed = exit_time_[e.pid];
      recovering_ = true;
    }
    if (e.failed() && agent_.phase() == Phase::kRunning) {
      std::string how = e.signal ? SignalName(e.signal)
                                 : "exit code " + std::to_string(e.exit_code);
      Logger("dtrun.agent")
          ->warn("worker local_rank {} (pid {}) failed: {}", e.local_rank,
                 e.pid, how);
      PublishCrash(e, how);
      CheckProgress();
    }
    Apply(agent_.OnWorkerExit(e, clock_->Now()));
    if (first_failure) recovery_.decided = os::UnixNow();
  }
}

// The time-driven checks, each skipped once an earlier one ended the
// attempt: the Agent's deadlines, hung workers (--hang-timeout), workers
// stuck in D state, and torch's FileTimer requests.
void LocalGroup::OnTick() {
  if (agent_.phase() == Phase::kRunning && clock_->Now() >= next_beat_read_)
    ReadComputeBeats();
  if (clock_->Now() >= next_status_) PublishStatus();
  if (outcome_ != Outcome::kRunning) return;
  Apply(agent_.OnTick(clock_->Now()));
  if (outcome_ != Outcome::kRunning) return;
  int signo = hang_.Check(agent_.phase() == Phase::kRunning, pids_,
                          assignment_.base_rank);
  if (signo) {
    ++counts_.hangs;
    report_events_.push_back(
        {os::UnixNow(), "hang",
         "attempt " + std::to_string(attempt_.restart_count) + " hung", -1});
    CheckProgress();
    Apply(agent_.OnHang(signo, clock_->Now()));
  }
  if (outcome_ == Outcome::kRunning) CheckUninterruptible();
  if (outcome_ == Outcome::kRunning)
    timer_.Check(pids_, PythonWorkers(config_));
}

// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: a worker in D state cannot
// be killed, so a restart would leave it behind holding its GPU. Reading
// /proc every kDStateCheck, a worker seen in D for the whole timeout makes
// the group unhealthy: stopped, named, and not restarted.
void LocalGroup::CheckUninterruptible() {
  if (config_.uninterruptible_timeout.count() <= 0 ||
      agent_.phase() != Phase::kRunning)
    return;
  TimePoint now = clock_->Now();
  if (now < next_d_check_) return;
  next_d_check_ = now + kDStateCheck;
  for (const auto& [local_rank, pid] : pids_) {
    if (exit_time_.count(pid)) continue;
    if (os::ProcessState(pid) != 'D') {
      d_since_.erase(pid);
      continue;
    }
    auto since = d_since_.emplace(pid, now).first->second;
    if (now - since < config_.uninterruptible_timeout) continue;
    auto seconds =
        std::chrono::duration_cast<std::chrono::seconds>(now - since).count();
    d_report_ = "worker local_rank " + std::to_string(local_rank) + " (rank " +
                std::to_string(assignment_.base_rank + local_rank) + ", pid " +
                std::to_string(pid) +
                ") has been in uninterruptible sleep (D state) for " +
                std::to_string(seconds) + " s, in kernel function '" +
                os::ProcessWaitChannel(pid) +
                "'; the group is unhealthy and is not restarted "
                "(TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT)";
    d_rank_ = local_rank;
    Logger("dtrun.agent")->error("{}", d_report_);
    Apply(agent_.OnUnhealthy(now));
    return;
  }
}

// For the waits outside the poll loop (rendezvous, store connect): drains
// the signalfd and says whether a stop signal came. A forwarded signal has
// no worker to go to then, which the log says.
bool LocalGroup::Interrupted() {
  if (signals_) {
    for (int signo : signals_->Read()) {
      SignalUse use = UseOf(signo, config_.handled_signals);
      if (use == SignalUse::kForward) {
        Logger("dtrun.agent")
            ->warn("received {} while no worker runs; nothing to forward it to",
                   SignalName(signo));
      } else if (use != SignalUse::kChildren) {
        stop_signal_ = signo;
      }
    }
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
      case Action::Kind::kSignalGroup:
        for (const auto& [local_rank, pid] : pids_)
          workers_->Signal(pid, a.signo);
        break;
      case Action::Kind::kFinish:
        OnFinished(a);
        break;
      case Action::Kind::kGroupStopped:
        outcome_ = Outcome::kStopped;
        RecordAttempt("new round");
        copies_.PersistInBackground("the group stopped for a new round");
        break;
    }
  }
}

// The attempt is over: how, for the job (which may restart it, or join a
// new round when elastic) and for the log.
void LocalGroup::OnFinished(const Action& finish) {
  if (health_) health_->SetPhase(HealthPhase::kStarting, kLoopSilentLimit);
  stop_signal_ = finish.signo;
  outcome_ = finish.signo    ? Outcome::kSignaled
             : finish.failed ? Outcome::kFailed
                             : Outcome::kSucceeded;
  RecordAttempt(finish.signo ? "stopped by " + SignalName(finish.signo)
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

// Where one stream (stream_bit 1: stdout, 2: stderr) of one worker goes:
// the console (unless redirected or filtered out by --local-ranks-filter),
// a file under the attempt's folder (redirected or tee'd), a prefix for
// console lines, and the filtered copy (--duplicate-*-filters).
OutputRoute LocalGroup::Route(int local_rank, int stream_bit,
                              const std::string& attempt_dir) const {
  OutputRoute route;
  bool redirected = config_.redirects.For(local_rank) & stream_bit;
  // Watching for hangs or timers, stderr is kept too: a Python worker's
  // stack lands there.
  bool keeps_stderr = hang_.enabled() || config_.file_timer;
  bool teed = (config_.tee.For(local_rank) & stream_bit) ||
              (stream_bit == 2 && keeps_stderr);
  const auto& filter = config_.local_ranks_filter;
  bool shown = filter.empty() || std::find(filter.begin(), filter.end(),
                                           local_rank) != filter.end();
  if (!redirected && shown) route.console_fd = stream_bit == 1 ? 1 : 2;
  // torchrun's console: a worker's own bytes, unprefixed, unless the stream
  // is tee'd (then "[default0]:" or the template); --label-ranks is dtrun's
  // labelled view of every line.
  LinePrefixValues values{config_.role, assignment_.base_rank + local_rank,
                          local_rank, os::HostName()};
  bool user_teed = config_.tee.For(local_rank) & stream_bit;
  if (config_.label_ranks) {
    route.prefix = "[rank" + std::to_string(values.rank) + "]:";
  } else if (user_teed) {
    const std::string& t = config_.log_line_prefix_template;
    route.prefix = ExpandLinePrefix(
        t.empty() ? "[${role_name}${local_rank}]:" : t, values);
  }
  if (redirected || teed) {
    route.file = attempt_dir + "/" + std::to_string(local_rank) +
                 (stream_bit == 1 ? "/stdout.log" : "/stderr.log");
  }
  const auto& filters = stream_bit == 1 ? config_.duplicate_stdout_filters
                                        : config_.duplicate_stderr_filters;
  if (!filters.empty()) {
    route.filters = filters;
    route.filtered_file =
        attempt_dir +
        (stream_bit == 1 ? "/filtered_stdout.log" : "/filtered_stderr.log");
  }
  return route;
}

// Everything the WorkerGroup needs to start local rank `lr`: argv, the
// environment (torchrun's variables, the hang beat file, the timer pipe),
// its two output routes and its CPUs (--numa-binding).
WorkerSpec LocalGroup::SpecFor(int lr, const std::string& attempt_dir) {
  (void)os::MakeDirs(attempt_dir + "/" + std::to_string(lr));
  // A stale error file would name the wrong failure.
  ::unlink(ErrorFilePath(attempt_, lr).c_str());
  const rendezvous::Assignment& a = assignment_;
  WorkerPlace place;
  place.local_rank = lr;
  place.rank = place.role_rank = a.base_rank + lr;
  place.group_rank = a.group_rank;
  place.local_world_size = config_.nproc_per_node;
  place.world_size = place.role_world_size = a.world_size;
  place.group_world_size = a.group_world_size;
  EnvMap env = WorkerEnv(base_env_, attempt_, place);
  hang_.AddEnv(lr, attempt_dir, &env);
  timer_.AddEnv(&env);
  WorkerSpec spec;
  spec.local_rank = lr;
  spec.argv = config_.worker_argv;
  spec.env = ToEnvStrings(env);
  spec.out = Route(lr, 1, attempt_dir);
  spec.err = Route(lr, 2, attempt_dir);
  if (static_cast<size_t>(lr) < cpu_plan_.size())
    spec.cpus = cpu_plan_[static_cast<size_t>(lr)];
  return spec;
}

// Starts attempt `restart_count` in its own folder. A worker that cannot be
// spawned does not stop the others: its exit (127) fails the attempt like
// any other failure, with the spawn error as its message.
void LocalGroup::StartWorkers(int restart_count) {
  auto log = Logger("dtrun.agent");
  recovering_ = recovering_ && restart_count > 0 && recovery_.decided > 0;
  if (recovering_) recovery_.spawn_begin = os::UnixNow();
  if (before_start) before_start(restart_count);
  if (restart_count > 0 && !elastic_) {
    log->warn("restarting the worker group: attempt {} of {}",
              restart_count + 1, config_.max_restarts + 1);
  }
  if (restart_count > 0 && !elastic_) RecordAttempt(AttemptCause());
  // The last attempt's workers are gone: their newest copies in memory go
  // to disk while the new ones start (and may resume from those copies).
  if (restart_count > 0)
    copies_.PersistInBackground("before attempt " +
                                std::to_string(restart_count));
  attempt_.restart_count = restart_count;
  attempt_started_ = os::UnixNow();
  attempt_dir_ = run_dir_ + "/attempt_" + std::to_string(restart_count);
  attempt_.error_file_dir = attempt_dir_;
  timer_.Open(run_dir_);
  pids_.clear();
  spawn_error_.clear();
  std::string pid_list;
  for (int lr = 0; lr < config_.nproc_per_node; ++lr) {
    Result<int> pid = workers_->Spawn(SpecFor(lr, attempt_dir_));
    if (!pid.ok()) {
      // Reported as that rank's failure when its exit (127) is reaped.
      spawn_error_[lr] = pid.status().message();
      log->error("local_rank {}: {}", lr, pid.status().message());
      continue;
    }
    pids_[lr] = *pid;
    pid_list += (pid_list.empty() ? "" : ",") + std::to_string(*pid);
  }
  agent_.OnGroupStarted();
  if (recovering_) recovery_.spawn_end = os::UnixNow();
  hang_.Reset(config_.nproc_per_node, attempt_dir_, restart_count);
  sampler_.Reset();
  next_status_ = clock_->Now();  // the new pids at once
  stragglers_.Reset();
  beat_mtime_ns_.clear();
  straggler_named_ = -1;
  log->info("attempt {}: started {} worker(s), pids {}", restart_count,
            config_.nproc_per_node, pid_list);
  // The health port: ready, and the loop's passes watched from now.
  if (health_) health_->SetPhase(HealthPhase::kRunning, kLoopSilentLimit);
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
  if (!on_worker_crash) return;
  WorkerCrash crash;
  crash.attempt = attempt_.restart_count;
  crash.rank = assignment_.base_rank + e.local_rank;
  crash.how = how;
  crash.host = os::HostName();
  crash.addr = config_.local_addr;
  crash.stderr_file = Route(e.local_rank, 2, attempt_dir_).file;
  if (!crash.stderr_file.empty()) {
    workers_->ReadPending(
        milliseconds(200));  // its last words may still be in the pipe
    crash.stderr_tail = os::ReadTail(crash.stderr_file, 8);
  }
  on_worker_crash(crash);
}

// What /proc and the beat files say of each worker of the attempt.
std::vector<WorkerObservation> LocalGroup::Observe() const {
  std::vector<WorkerObservation> out;
  for (const auto& [local_rank, pid] : pids_) {
    WorkerObservation w;
    w.local_rank = local_rank;
    w.rank = assignment_.base_rank + local_rank;
    w.pid = pid;
    w.state = exit_time_.count(pid) ? "exited" : "running";
    if (agent_.phase() == Phase::kStopping && !exit_time_.count(pid))
      w.state = "stopping";
    ObserveBeat(attempt_dir_ + "/" + std::to_string(local_rank) + "/heartbeat",
                &w);
    if (!exit_time_.count(pid)) ObserveProcess(pid, &w);
    out.push_back(w);
  }
  return out;
}

// Started in Prepare, or before the rendezvous, before any worker: a port
// that cannot be served is a usage error, reported before the job costs
// anything.
Status LocalGroup::StartServers() {
  if (servers_started_) return Status::Ok();
  servers_started_ = true;
  auto log = Logger("dtrun.agent");
  if (config_.metrics_port >= 0) {
    auto m = MetricsServer::Start(
        "", static_cast<uint16_t>(config_.metrics_port), false);
    if (!m.ok())
      return Status::Invalid("--metrics-port: " + m.status().message());
    metrics_ = std::move(*m);
    log->info("Prometheus metrics on port {} (GET /metrics)", metrics_->port());
  }
  if (config_.health_check_port >= 0) {
    auto h = MetricsServer::Start(
        "", static_cast<uint16_t>(config_.health_check_port), true);
    if (!h.ok()) {
      return Status::Invalid("TORCHELASTIC_HEALTH_CHECK_PORT: " +
                             h.status().message());
    }
    health_ = std::move(*h);
    log->info("health check on port {} (/healthz alive, /readyz ready)",
              health_->port());
  }
  return Status::Ok();
}

bool LocalGroup::Healthy(const std::vector<WorkerStatus>& workers) const {
  const double limit =
      config_.hang_timeout.count() > 0
          ? std::chrono::duration<double>(config_.hang_timeout).count()
          : 300.0;
  bool beaten = false;
  for (const WorkerStatus& w : workers) {
    if (w.beat_age_s < 0) continue;
    beaten = true;
    if (w.beat_age_s <= limit) return true;
  }
  return !beaten;
}

// A beat is read only when its file changed (its mtime), so a step is
// scored once however often this runs; the scores need no collective.
void LocalGroup::ReadComputeBeats() {
  // Often enough to see most steps of a fast loop from its first: a stat
  // per worker 100 times a second, some microseconds of dtrun's time.
  next_beat_read_ = clock_->Now() + kBeatReadEvery;
  bool fresh = false;
  for (const auto& [local_rank, pid] : pids_) {
    std::string path =
        attempt_dir_ + "/" + std::to_string(local_rank) + "/heartbeat";
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || st.st_size == 0) continue;
    int64_t mtime =
        int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    auto seen = beat_mtime_ns_.find(local_rank);
    if (seen != beat_mtime_ns_.end() && seen->second == mtime) continue;
    beat_mtime_ns_[local_rank] = mtime;
    std::string text = os::ReadFileOrEmpty(path);
    if (recovering_)
      NoteRecovery(local_rank, ParseBeatStep(text), mtime * 1e-9);
    // The main thread's wait for a core: the host's noise, taken off.
    double waited = ParseSchedstatWait(
        os::ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/schedstat"));
    stragglers_.OnBeat(assignment_.base_rank + local_rank, ParseBeatStep(text),
                       ParseBeatCompute(text), waited);
    fresh = true;
  }
  if (!fresh) return;
  auto straggler = stragglers_.Check();
  if (!straggler || straggler->rank == straggler_named_) return;
  straggler_named_ = straggler->rank;
  ++counts_.stragglers;
  double fastest = straggler->typical_s * straggler->score;
  report_events_.push_back({os::UnixNow(), "straggler",
                            "rank " + std::to_string(straggler->rank) +
                                ", score " +
                                std::to_string(straggler->score).substr(0, 4),
                            straggler->rank});
  Logger("dtrun.agent")
      ->warn(
          "straggler: rank {} computes {:.4f} s a step outside collectives, "
          "the fastest rank {:.4f} s (score {:.2f}, under {:.2f})",
          straggler->rank, straggler->typical_s, fastest, straggler->score,
          stragglers_.threshold());
}

// A new worker's beat while a recovery is under way: its resume record
// (beside its beat file) once written, then its first step past it.
void LocalGroup::NoteRecovery(int local_rank, int64_t step, double beat_unix) {
  if (!recovery_.resumed.count(local_rank)) {
    auto r = ParseResumeRecord(os::ReadFileOrEmpty(
        attempt_dir_ + "/" + std::to_string(local_rank) + "/heartbeat.resume"));
    if (!r) return;
    recovery_.resumed[local_rank] = *r;
  }
  if (step > recovery_.resumed[local_rank].step &&
      !recovery_.first_step.count(local_rank))
    recovery_.first_step[local_rank] = beat_unix;
  auto b = Breakdown(recovery_, config_.nproc_per_node);
  if (!b) return;
  recovering_ = false;
  ReportRecovery(*b);
}

// The log line, the event, the histogram and the run's table.
void LocalGroup::ReportRecovery(const RecoveryBreakdown& b) {
  const std::string line = RecoveryLine(b);
  Logger("dtrun.agent")->info("{}", line);
  report_events_.push_back({os::UnixNow(), "recovery", line, -1});
  counts_.recovery_seconds.push_back(b.total);
  recoveries_.push_back({attempt_.restart_count, b});
  WriteEvent(config_.event_log_handler,
             RecoveryEventJson(b, attempt_.run_id, assignment_.group_rank,
                               attempt_.restart_count, os::UnixNow()));
}

std::string LocalGroup::StacksJson() {
  std::map<int, int> live;
  for (const auto& [local_rank, pid] : pids_) {
    if (!exit_time_.count(pid)) live[local_rank] = pid;
  }
  std::map<int, std::string> stacks =
      hang_.LiveStacks(live, assignment_.base_rank);
  // Each rank's step and silence beside its stack: a node that declared a
  // hang weighs them with its own ranks'.
  const double now = os::UnixNow();
  std::vector<RankStack> ranks;
  for (const WorkerObservation& w : Observe()) {
    RankStack r;
    r.rank = w.rank;
    r.pid = w.pid;
    r.silence.local_rank = w.local_rank;
    r.silence.step = w.step;
    r.silence.beaten = w.beat_unix > 0;
    r.silence.silent_s =
        w.beat_unix > 0 ? now - w.beat_unix : now - started_at_;
    r.silence.exited = w.state == "exited";
    r.stack = stacks[w.rank];
    ranks.push_back(std::move(r));
  }
  return StackAnswerJson(os::HostName(), ranks, now);
}

void LocalGroup::ServeStackRequest() {
  const std::string request = run_dir_ + "/" + kStackRequestFile;
  std::string id = os::ReadFileOrEmpty(request);
  if (id.empty()) return;
  ::unlink(request.c_str());
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (id.find('/') != std::string::npos) return;  // not an id dtrun made
  std::string answer = run_dir_ + "/stacks." + id + ".json";
  if (os::WriteFile(answer + ".tmp", StacksJson()).ok())
    std::rename((answer + ".tmp").c_str(), answer.c_str());
}

// The status is written whole (a temporary file, then a rename), so a
// reader never sees half of it.
void LocalGroup::PublishStatus() {
  next_status_ = clock_->Now() + kStatusEvery;
  if (run_dir_.empty()) return;
  if (agent_.phase() == Phase::kRunning) ServeStackRequest();
  const double now = os::UnixNow();
  NodeFacts facts{attempt_.run_id,
                  os::HostName(),
                  assignment_.group_rank,
                  assignment_.group_world_size,
                  attempt_.restart_count,
                  config_.max_restarts,
                  started_at_};
  std::vector<WorkerStatus> workers = sampler_.Sample(Observe(), now);
  for (const WorkerStatus& w : workers) {
    report_samples_.push_back(
        {now, w.seen.rank, w.seen.step, w.step_time_last_s});
  }
  Thin(&report_samples_, 2000);
  nlohmann::json node = NodeStatusJson(facts, workers, now);
  AddScores(stragglers_.Scores(), &node);
  std::string json = node.dump();
  std::string path = run_dir_ + "/status.json";
  if (os::WriteFile(path + ".tmp", json).ok())
    std::rename((path + ".tmp").c_str(), path.c_str());
  if (on_status) on_status(json);
  Present(node, workers, now);
}

// One node sees only its own ranks; the node that gathers every node's
// record (job_view) shows and serves the job's progress.
void LocalGroup::Present(const nlohmann::json& node,
                         const std::vector<WorkerStatus>& workers, double now) {
  std::vector<nlohmann::json> job =
      job_view ? job_view() : std::vector<nlohmann::json>{};
  const bool whole_job = !job.empty() || assignment_.group_world_size <= 1;
  if (job.empty()) job.push_back(node);
  const JobProgress progress = JobProgressOf(job);
  counts_.restarts = attempt_.restart_count;
  if (metrics_) {
    std::string text = MetricsText(node, counts_);
    if (whole_job) text += JobMetricsText(progress, attempt_.run_id);
    if (store_metrics) text += store_metrics();
    metrics_->Update(std::move(text));
  }
  if (health_) health_->SetHealthy(Healthy(workers));
  if (progress_line_) {
    std::string who =
        whole_job
            ? "dtrun: "
            : "dtrun node " + std::to_string(assignment_.group_rank) + ": ";
    console::SetStatusLine(who + ProgressText(progress, now - started_at_));
  }
}

// --max-restarts-without-progress, when an attempt fails: progress is a
// beat past the highest step any earlier attempt beat (a resumed run redoes
// the steps after its checkpoint, which is no progress by itself). After
// that many restarts in a row without, the Agent gives up.
void LocalGroup::CheckProgress() {
  const int limit = config_.max_restarts_without_progress;
  if (limit <= 0) return;
  const int64_t step = hang_.HighestStep();
  if (step > highest_step_) {
    highest_step_ = step;
    restarts_without_progress_ = 0;
    return;
  }
  if (agent_.restart_count() == 0) return;  // the first attempt is no restart
  if (++restarts_without_progress_ < limit) return;
  no_progress_ = "restarts made no progress: " + std::to_string(limit) +
                 " restart(s) in a row beat no step past " +
                 (highest_step_ < 0 ? std::string("the start (no beat)")
                                    : "step " + std::to_string(highest_step_)) +
                 " (--max-restarts-without-progress=" + std::to_string(limit) +
                 "); not restarting, exit code 93: do not requeue";
  Logger("dtrun.agent")->error("{}", no_progress_);
  agent_.GiveUp();
}

// A worker that wrote its error file and was stopped with the group
// before it exited (a peer that lost its connection to it exited first)
// failed too, and earlier: its file's time decides the root cause.
void LocalGroup::AddStoppedAfterError(std::vector<WorkerFailure>* failures) {
  for (const auto& [local_rank, pid] : pids_) {
    bool listed = false;
    for (const WorkerFailure& f : *failures)
      listed = listed || f.local_rank == local_rank;
    if (listed) continue;
    WorkerFailure f;
    f.local_rank = local_rank;
    f.rank = assignment_.base_rank + local_rank;
    f.pid = pid;
    f.exit_code = 1;
    ReadErrorFile(ErrorFilePath(attempt_, local_rank), &f);
    if (!f.error_file.empty()) failures->push_back(f);
  }
}

// The failure summary of a failed attempt (hung ranks, a D-state worker,
// failed exits with their error files), the root cause's error file for
// --error-file, and the exit code that root cause maps to.
int LocalGroup::ReportFailure() {
  std::vector<WorkerFailure> failures;
  if (agent_.hung()) failures = hang_.Failures();
  if (agent_.unhealthy()) {
    WorkerFailure f;
    f.local_rank = d_rank_;
    f.rank = assignment_.base_rank + d_rank_;
    f.pid = pids_.count(d_rank_) ? pids_[d_rank_] : 0;
    f.exit_code = 1;
    f.timestamp = os::UnixNow();
    f.message = d_report_;
    failures.push_back(f);
  }
  for (const WorkerExit& e : agent_.failures()) {
    WorkerFailure f;
    f.local_rank = e.local_rank;
    f.rank = assignment_.base_rank + e.local_rank;
    f.pid = e.pid;
    f.exit_code = e.exit_code;
    f.signal = e.signal;
    f.timestamp = exit_time_.count(e.pid) ? exit_time_[e.pid] : os::UnixNow();
    ReadErrorFile(ErrorFilePath(attempt_, e.local_rank), &f);
    timer_.Describe(attempt_dir_, &f);
    if (f.message.empty() && spawn_error_.count(e.local_rank))
      f.message = spawn_error_[e.local_rank];
    failures.push_back(f);
  }
  AddStoppedAfterError(&failures);
  DTRUN_CHECK(!failures.empty()) << "a failed attempt with no failed worker";
  const std::string& program = config_.entrypoint[0];
  WriteAll(2, FormatFailureSummary(program.substr(program.rfind('/') + 1),
                                   os::HostName(), failures,
                                   agent_.restart_count() + 1, run_dir_,
                                   config_.max_restarts));
  const WorkerFailure& root = failures[RootCause(failures)];
  if (!config_.error_file.empty())
    (void)os::WriteFile(config_.error_file, RootCauseJson(root));
  if (agent_.gave_up()) {
    WriteAll(2, "dtrun: " + no_progress_ + "\n");
    return kExitNoProgress;
  }
  return ExitCodeFor(root);
}

// Why the attempt that just ended did: its first failure, a hang, an
// unhealthy worker, no progress, or success.
std::string LocalGroup::AttemptCause() const {
  if (agent_.gave_up()) return "no progress: " + no_progress_;
  if (agent_.unhealthy()) return "unhealthy: " + d_report_;
  if (agent_.hung()) return "hung (no heartbeat within --hang-timeout)";
  if (agent_.failures().empty()) return "succeeded";
  const WorkerExit& e = agent_.failures().front();
  return "failed: rank " +
         std::to_string(assignment_.base_rank + e.local_rank) + " " +
         (e.signal ? SignalName(e.signal)
                   : "exit code " + std::to_string(e.exit_code));
}

// --event-log-handler: dtrun's record of the attempt that just ended.
void LocalGroup::RecordAttempt(const std::string& cause) {
  if (attempt_started_ == 0) return;
  report_events_.push_back(
      {os::UnixNow(), "attempt",
       "attempt " + std::to_string(attempt_.restart_count) + " ended: " + cause,
       -1});
  if (config_.event_log_handler == "null") {
    attempt_started_ = 0;
    return;
  }
  AttemptRecord a;
  a.run_id = attempt_.run_id;
  a.hostname = os::HostName();
  a.attempt = attempt_.restart_count;
  a.group_rank = assignment_.group_rank;
  a.nodes = assignment_.group_world_size;
  a.ranks = assignment_.world_size;
  a.start = attempt_started_;
  a.end = os::UnixNow();
  a.cause = cause;
  WriteEvent(config_.event_log_handler, AttemptJson(a));
  attempt_started_ = 0;  // recorded once
}

// report.html in the run folder, whole (a temporary name, then a rename).
void LocalGroup::WriteReport(bool succeeded) {
  if (run_dir_.empty()) return;
  report_events_.push_back({os::UnixNow(), "end",
                            succeeded ? "the job succeeded" : "the job failed",
                            -1});
  std::string path = run_dir_ + "/report.html";
  std::string html =
      RunReportHtml(attempt_.run_id, report_samples_, report_events_);
  if (os::WriteFile(path + ".tmp", html).ok())
    std::rename((path + ".tmp").c_str(), path.c_str());
}

// --event-log-handler: one event per worker and one for the agent, in the
// fields and states torch's elastic events use.
void LocalGroup::RecordEvents(bool succeeded) {
  if (config_.event_log_handler == "null") return;
  ElasticEvent e;
  e.run_id = attempt_.run_id;
  e.role = config_.role;
  e.hostname = os::HostName();
  e.rdzv_backend = RdzvBackendName(
      config_.uses_rendezvous() ? config_.rdzv_backend : RdzvBackend::kStatic);
  const std::string& program = config_.entrypoint[0];
  e.entry_point = program.substr(program.rfind('/') + 1);
  e.group_rank = assignment_.group_rank;
  e.group_world_size = assignment_.group_world_size;
  e.agent_restarts = attempt_.restart_count;
  e.total_run_time = os::UnixNow() - started_at_;
  e.timestamp = os::UnixNow();
  // torch's worker states: the failed ones FAILED, the others of a failed
  // group TERMINATED, all SUCCEEDED otherwise.
  std::map<int, std::string> failed;  // local rank -> how
  for (const WorkerExit& x : agent_.failures()) {
    failed[x.local_rank] = x.signal
                               ? SignalName(x.signal)
                               : "exit code " + std::to_string(x.exit_code);
  }
  for (const auto& [local_rank, pid] : pids_) {
    ElasticEvent w = e;
    w.global_rank = assignment_.base_rank + local_rank;
    w.worker_id = pid;
    auto f = failed.find(local_rank);
    w.state = succeeded           ? "SUCCEEDED"
              : f != failed.end() ? "FAILED"
                                  : "TERMINATED";
    if (f != failed.end()) w.raw_error = f->second;
    WriteEvent(config_.event_log_handler, EventJson(w));
  }
  e.agent = true;
  e.state = succeeded ? "SUCCEEDED" : "FAILED";
  WriteEvent(config_.event_log_handler, EventJson(e));
}

// How the run ended, as torchrun counts runs: an event, and
// --metrics-textfile for node_exporter.
void LocalGroup::RecordOutcome(bool succeeded) {
  RunOutcome o;
  o.run_id = attempt_.run_id;
  o.succeeded = succeeded;
  o.restarts = attempt_.restart_count;
  o.start = started_at_;
  o.end = os::UnixNow();
  if (config_.event_log_handler != "null")
    WriteEvent(config_.event_log_handler, RunOutcomeEventJson(o));
  if (config_.metrics_textfile.empty()) return;
  Status s = WriteOutcomeTextfile(config_.metrics_textfile, o);
  if (!s.ok()) Logger("dtrun.agent")->error("{}", s.message());
}

// The run's recoveries, one row each, at the end (the log lines came one by
// one, mixed with the workers' output).
void LocalGroup::SummarizeRecoveries() const {
  if (recoveries_.empty()) return;
  std::string table =
      "recoveries (seconds from the failure to the next step of every new "
      "worker):\n  attempt   total  detect regroup   start    init    load "
      "first-step  from";
  for (const Recovered& r : recoveries_) {
    const RecoveryBreakdown& b = r.breakdown;
    char row[200];
    std::snprintf(row, sizeof(row),
                  "\n  %7d %7.2f %7.3f %7.3f %7.3f %7.2f %7.2f %10.2f  step "
                  "%lld (%s)",
                  r.attempt, b.total, b.detect, b.regroup, b.start, b.init,
                  b.load, b.first_step, static_cast<long long>(b.step),
                  b.source.c_str());
    table += row;
  }
  Logger("dtrun.agent")->info("{}", table);
}

void LocalGroup::Finish(bool succeeded) {
  if (health_) health_->SetPhase(HealthPhase::kStopping, kLoopSilentLimit);
  SummarizeRecoveries();
  copies_.Finish();  // persisted when the last attempt failed, then removed
  console::DisableStatusLine();
  // Workers are gone, but a grandchild holding a pipe open must not keep
  // dtrun alive: forward what is there for up to a second, then close.
  workers_->Drain(milliseconds(1000));
  RecordEvents(succeeded);
  RecordOutcome(succeeded);
  WriteReport(succeeded);
  // A temporary folder goes, unless it holds the filtered copies asked for.
  bool keep = !config_.duplicate_stdout_filters.empty() ||
              !config_.duplicate_stderr_filters.empty();
  if (succeeded && run_dir_is_temp_ && !keep) os::RemoveTree(run_dir_);
}

}  // namespace dtrun::agent
