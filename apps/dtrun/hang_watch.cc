// Heartbeats are files, not store keys: a beat is one pwrite by the worker
// and one stat by dtrun, so a hung collective cannot also hang its own
// detection, and thousands of steps a second cost the store nothing.
#include "apps/dtrun/hang_watch.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "apps/dtrun/log_mux.h"
#include "apps/dtrun/run_layout.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

constexpr int kCheckEveryMs = 50;
constexpr size_t kReportFrames = 4;
constexpr milliseconds kToolLimit{20000};

HangOptions HangOptionsOf(const LaunchConfig& c) {
  // Start-up (imports, the first collective) gets longer than a step: by
  // default 10 timeouts, at least a minute.
  milliseconds first = c.hang_first_beat;
  if (first.count() == 0)
    first = std::max(milliseconds(60000), 10 * c.hang_timeout);
  return HangOptions{c.hang_timeout, first};
}

// The command that prints every thread's native stack of `pid`, or none.
std::vector<std::string> StackTool(int pid) {
  static const std::string eu_stack = os::FindInPath("eu-stack");
  static const std::string gdb = eu_stack.empty() ? os::FindInPath("gdb") : "";
  if (!eu_stack.empty()) return {eu_stack, "-p", std::to_string(pid)};
  if (!gdb.empty()) {
    // gdb lists the newest thread first; the summary shows the first
    // thread's frames, and the main thread (eu-stack's first) is the one
    // that tells where a hung worker stopped.
    return {gdb,
            "-p",
            std::to_string(pid),
            "-batch",
            "-nx",
            "-ex",
            "thread apply all -ascending bt"};
  }
  return {};
}

// The signal dtrun's stack handler answers: a real-time one, which no
// library uses by default.
int StackSignal() { return SIGRTMIN + 3; }

// Reads what a worker's handler printed after `from`, once it is whole
// (the dump is written in pieces, with no end marker: the handler runs no
// Python code): it holds the thread that took the signal, and it has not
// grown for two polls in a row. On a loaded host one quiet poll was seen
// to cut a dump before its current thread. Within `limit`.
std::string ReadDump(const std::string& path, size_t from, milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  std::string last;
  int quiet = 0;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(50));
    std::string text = os::ReadFileOrEmpty(path);
    std::string dump = text.size() > from ? text.substr(from) : "";
    quiet = !dump.empty() && dump == last ? quiet + 1 : 0;
    const bool has_current =
        dump.find("Current thread") != std::string::npos ||
        dump.find("Stack (most recent call first)") != std::string::npos;
    if (quiet >= 2 && has_current) return dump;
    last = dump;
  }
  return last;
}

}  // namespace

bool PythonWorkers(const LaunchConfig& config) {
  const std::string& program =
      config.worker_argv.empty() ? "" : config.worker_argv[0];
  return program.substr(program.rfind('/') + 1).find("python") !=
         std::string::npos;
}

HangWatch::HangWatch(const LaunchConfig& config, const Clock* clock,
                     WorkerGroup* workers)
    : config_(config),
      clock_(clock),
      workers_(workers),
      monitor_(HangOptionsOf(config)) {}

void HangWatch::AddEnv(int local_rank, const std::string& attempt_dir,
                       EnvMap* env) const {
  std::string path = layout::BeatFile(attempt_dir, local_rank);
  ::unlink(path.c_str());  // a beat of the last attempt must not count
  (*env)[rendezvous::Heartbeat::kEnv] = path;
  std::string stacks = layout::LiveStackFile(attempt_dir, local_rank);
  ::unlink(stacks.c_str());
  (*env)["DTRUN_STACK_FILE"] = stacks;
  (*env)["DTRUN_STACK_SIGNAL"] = std::to_string(StackSignal());
  if (enabled() && !env->count("PYTHONFAULTHANDLER"))
    (*env)["PYTHONFAULTHANDLER"] = "1";
}

void HangWatch::Reset(int nproc, const std::string& attempt_dir,
                      int restart_count) {
  attempt_dir_ = attempt_dir;
  restart_count_ = restart_count;
  monitor_.Reset(nproc, clock_->Now());
  next_check_ = clock_->Now();
}

// Milliseconds until the next look at the beat files, -1 when there is
// nothing to watch (no --hang-timeout, or no worker running).
int HangWatch::NextCheckMs(bool running) const {
  if (!enabled() || !running) return -1;
  auto left =
      std::chrono::duration_cast<milliseconds>(next_check_ - clock_->Now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

void HangWatch::OnBeat(int local_rank, const Beat& beat) {
  // A beat is a rewrite of the file: its mtime is when it happened, on the
  // wall clock, mapped to the steady clock here.
  const TimePoint now = clock_->Now();
  const nanoseconds wall_now = std::chrono::milliseconds(clock_->UnixMillis());
  auto age = std::max<nanoseconds::rep>(
      0, (wall_now - nanoseconds(beat.mtime_ns)).count());
  TimePoint when = std::min(now - nanoseconds(age), now);
  monitor_.OnBeat(local_rank, when, beat.line.step);
}

int HangWatch::Check(bool running, const std::map<int, int>& pids,
                     int base_rank) {
  TimePoint now = clock_->Now();
  if (NextCheckMs(running) != 0) return 0;
  next_check_ = now + milliseconds(kCheckEveryMs);
  if (monitor_.Hung(now).empty()) return 0;
  Snapshot(now, pids, base_rank);
  reported_ = false;
  if (share_) ShareWithNodes(base_rank);
  if (PythonWorkers(config_)) {
    Logger("dtrun.agent")
        ->warn(
            "capturing every worker's Python stack (SIGABRT to the fault "
            "handler), then stopping the group");
    return SIGABRT;
  }
  CaptureNativeStacks();
  return SIGTERM;
}

void HangWatch::Snapshot(TimePoint now, const std::map<int, int>& pids,
                         int base_rank) {
  auto log = Logger("dtrun.agent");
  stacks_.clear();
  std::vector<RankSilence> silences = monitor_.Snapshot(now);
  MarkWaiting(&silences);
  for (const RankSilence& s : silences) {
    RankStack r;
    r.silence = s;
    r.rank = base_rank + s.local_rank;
    auto pid = pids.find(s.local_rank);
    r.pid = pid == pids.end() ? 0 : pid->second;
    if (s.hung) {
      log->error(
          "worker local_rank {} (pid {}) is hung: no heartbeat for {:.2f} s{}",
          s.local_rank, r.pid, s.silent_s,
          s.step >= 0 ? ", last step " + std::to_string(s.step) : "");
    }
    stacks_.push_back(r);
  }
}

// The workers of other nodes are still where they were: stopping ours
// first would turn their collectives into connection errors. So the stacks
// are taken live (the job going on, as for `dtrun --stacks`), shared, and
// only then is anything stopped.
void HangWatch::ShareWithNodes(int base_rank) {
  std::map<int, int> live;
  for (const RankStack& r : stacks_) {
    if (!r.silence.exited && r.pid) live[r.silence.local_rank] = r.pid;
  }
  std::map<int, std::string> taken = LiveStacks(live, base_rank);
  for (RankStack& r : stacks_) {
    auto it = taken.find(r.rank);
    if (it == taken.end() || it->second.empty()) continue;
    r.stack = it->second;
    r.stack_file = layout::StackFile(attempt_dir_, r.silence.local_rank);
    (void)os::WriteFile(r.stack_file, r.stack);
  }
  const double now = clock_->UnixSeconds();
  const double timeout_s =
      std::chrono::duration<double>(config_.hang_timeout).count();
  size_t nodes = 1;
  for (const std::string& answer :
       share_(StackAnswerJson(os::HostName(), stacks_, now))) {
    std::vector<RankStack> theirs = RanksOfStackAnswer(answer, now, timeout_s);
    nodes += !theirs.empty();
    for (RankStack& r : theirs) stacks_.push_back(std::move(r));
  }
  ClassifyStacks();
  std::vector<RankSilence> silences;
  for (const RankStack& r : stacks_) silences.push_back(r.silence);
  const RankStack& root = stacks_[HangRootCause(silences)];
  Logger("dtrun.agent")
      ->error("hang root cause, weighing {} ranks on {} node(s): rank {} on {}",
              stacks_.size(), nodes, root.rank,
              root.host.empty() ? "this node" : root.host);
}

// Native stacks (eu-stack, else gdb) of the silent workers, all at once
// with a time limit, each into its rank's stack.txt; for a worker that is
// not Python, or whose Python is stuck below the interpreter.
void HangWatch::CaptureNativeStacks() {
  std::vector<ToolRun> tools;
  for (RankStack& r : stacks_) {
    // Another node's, or one taken live already (ShareWithNodes).
    if (!r.host.empty() || !r.stack.empty()) continue;
    if (!r.pid || r.silence.exited) continue;
    std::vector<std::string> argv = StackTool(r.pid);
    if (argv.empty()) {
      r.why_no_stack =
          "neither eu-stack (Debian: elfutils) nor gdb is installed";
      continue;
    }
    r.stack_file = layout::StackFile(attempt_dir_, r.silence.local_rank);
    tools.push_back(ToolRun{argv, r.stack_file});
  }
  workers_->RunTools(tools, kToolLimit);
  for (RankStack& r : stacks_) {
    if (!r.stack_file.empty()) r.stack = os::ReadFileOrEmpty(r.stack_file);
  }
}

// The hang report, once per hang, after the stacks are in: Python workers'
// fault-handler dumps are cut out of their stderr logs (the SIGABRT that
// made them is the Agent's first action), native ones were captured before.
void HangWatch::Report() {
  if (reported_ || stacks_.empty()) return;
  reported_ = true;
  // A dying worker's last lines (its stack) are in the pipes already.
  workers_->ReadPending(milliseconds(500));
  for (RankStack& r : stacks_) {
    const int lr = r.silence.local_rank;
    if (!PythonWorkers(config_) || r.silence.exited || !r.host.empty())
      continue;
    // A stack taken live (ShareWithNodes) is where the rank was when the
    // hang was declared; by the time of the SIGABRT a rank may already have
    // failed on a peer that another node stopped, and its last dump shows
    // that instead.
    if (!FirstFrames(r.stack, 1).empty()) continue;
    r.stack = ExtractFaulthandlerDump(
        os::ReadFileOrEmpty(layout::OutputLog(attempt_dir_, lr, 2)));
    if (r.stack.empty()) {
      r.why_no_stack =
          "the worker printed no Python fault-handler dump (not Python, or it "
          "replaced the SIGABRT handler)";
      continue;
    }
    r.stack_file = layout::StackFile(attempt_dir_, lr);
    (void)os::WriteFile(r.stack_file, r.stack);
  }
  ClassifyStacks();
  double timeout_s =
      std::chrono::duration<double>(config_.hang_timeout).count();
  WriteAll(2,
           FormatHangReport(stacks_, timeout_s, restart_count_, kReportFrames));
}

// With the stacks in, a rank waiting in a collective is waiting, whatever
// its beats said, and the root cause is chosen again (HangRootCause).
void HangWatch::ClassifyStacks() {
  std::vector<RankSilence> silences;
  for (RankStack& r : stacks_) {
    r.silence.in_collective = StackWaits(r.stack);
    silences.push_back(r.silence);
  }
  MarkWaiting(&silences);
  for (size_t i = 0; i < stacks_.size(); ++i)
    stacks_[i].silence.hung = silences[i].hung;
}

std::string HangWatch::StacksAnswer(const std::map<int, int>& live,
                                    int base_rank,
                                    const std::vector<WorkerObservation>& seen,
                                    double started_at) {
  std::map<int, std::string> stacks = LiveStacks(live, base_rank);
  const double now = clock_->UnixSeconds();
  std::vector<RankStack> ranks;
  for (const WorkerObservation& w : seen) {
    RankStack r;
    r.rank = w.rank;
    r.pid = w.pid;
    r.silence.local_rank = w.local_rank;
    r.silence.step = w.step;
    r.silence.beaten = w.beat_unix > 0;
    r.silence.silent_s = w.beat_unix > 0 ? now - w.beat_unix : now - started_at;
    r.silence.exited = w.state == "exited";
    r.stack = stacks[w.rank];
    ranks.push_back(std::move(r));
  }
  return StackAnswerJson(os::HostName(), ranks, now);
}

std::map<int, std::string> HangWatch::LiveStacks(const std::map<int, int>& pids,
                                                 int base_rank) {
  std::map<int, std::string> out;
  std::map<int, std::pair<std::string, size_t>> python;  // rank -> file, from
  std::vector<ToolRun> tools;
  std::map<int, std::string> tool_files;
  for (const auto& [local_rank, pid] : pids) {
    const int rank = base_rank + local_rank;
    std::string file = layout::LiveStackFile(attempt_dir_, local_rank);
    std::string text = os::ReadFileOrEmpty(file);
    if (text.rfind("dtrun stack handler", 0) == 0 &&
        kill(pid, StackSignal()) == 0) {
      python[rank] = {file, text.size()};
      continue;
    }
    std::vector<std::string> argv = StackTool(pid);
    if (argv.empty()) {
      out[rank] =
          "(no stack: neither eu-stack (Debian: elfutils) nor gdb is "
          "installed)";
      continue;
    }
    tool_files[rank] = layout::NativeStackFile(attempt_dir_, local_rank);
    tools.push_back(ToolRun{argv, tool_files[rank]});
  }
  if (!tools.empty()) workers_->RunTools(tools, kToolLimit);
  for (const auto& [rank, file] : tool_files)
    out[rank] = os::ReadFileOrEmpty(file);
  for (const auto& [rank, where] : python)
    out[rank] = ReadDump(where.first, where.second, milliseconds(3000));
  return out;
}

std::vector<WorkerFailure> HangWatch::Failures() const {
  std::vector<RankSilence> silences;
  double longest = 0;
  for (const RankStack& r : stacks_) {
    silences.push_back(r.silence);
    longest = std::max(longest, r.silence.silent_s);
  }
  size_t root = HangRootCause(silences);
  double now = clock_->UnixSeconds();
  std::vector<WorkerFailure> out;
  for (size_t i = 0; i < stacks_.size(); ++i) {
    const RankStack& r = stacks_[i];
    if (!r.host.empty()) continue;  // another node's: its summary's
    WorkerFailure f;
    f.local_rank = r.silence.local_rank;
    f.rank = r.rank;
    f.pid = r.pid;
    f.exit_code = kHangExitCode;
    // The summary's root cause is the earliest failure: the hang's.
    f.timestamp = now - (i == root ? longest + 0.001 : r.silence.silent_s);
    f.message = HangTraceback(r, kReportFrames);
    out.push_back(f);
  }
  return out;
}

}  // namespace dtrun::agent
