// The launcher's hang shell: reads heartbeat files, captures stacks, prints
// the hang report. Decisions (who is hung, the root cause) are HangMonitor's.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "apps/dtrun/launcher.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/log.h"

namespace dtrun::agent {
namespace {

constexpr int kCheckEveryMs = 50;
constexpr size_t kReportFrames = 4;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

// Starts `argv` with stdout and stderr to `out_path`; returns its pid or -1.
int SpawnTo(const std::vector<std::string>& argv, const std::string& out_path) {
  int fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

// Waits for `pids` until `deadline`; kills the rest. Never reaps others.
void WaitAll(std::vector<int> pids, std::chrono::steady_clock::time_point deadline) {
  while (!pids.empty()) {
    for (size_t i = 0; i < pids.size();) {
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) != 0) {
        pids.erase(pids.begin() + i);
      } else {
        ++i;
      }
    }
    if (pids.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (int pid : pids) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      return;
    }
    usleep(10000);
  }
}

}  // namespace

void Launcher::AddHangEnv(int local_rank, const std::string& attempt_dir, EnvMap* env) {
  if (!config_.hang_timeout.count()) return;
  std::string path = attempt_dir + "/" + std::to_string(local_rank) + "/heartbeat";
  ::unlink(path.c_str());
  (*env)[rdzv::Heartbeat::kEnv] = path;
  // Python workers print every thread's stack on SIGABRT (see DeclareHang).
  if (!env->count("PYTHONFAULTHANDLER")) (*env)["PYTHONFAULTHANDLER"] = "1";
}

void Launcher::AddWatchEnv(int local_rank, const std::string& attempt_dir, EnvMap* env) {
  AddHangEnv(local_rank, attempt_dir, env);
  if (timer_fd_ < 0) return;
  (*env)["TORCHELASTIC_TIMER_FILE"] = timer_path_;
  if (!env->count("PYTHONFAULTHANDLER")) (*env)["PYTHONFAULTHANDLER"] = "1";
}

int Launcher::NextHangCheckMs() const {
  if (!config_.hang_timeout.count() || agent_.phase() != Phase::kRunning) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_hang_check_ - clock_->Now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

void Launcher::CheckHeartbeats() {
  TimePoint now = clock_->Now();
  if (NextHangCheckMs() != 0) return;
  next_hang_check_ = now + std::chrono::milliseconds(kCheckEveryMs);
  auto real_now = std::chrono::system_clock::now().time_since_epoch();
  for (const auto& [local_rank, pid] : pids_) {
    std::string path = attempt_dir_ + "/" + std::to_string(local_rank) + "/heartbeat";
    struct stat st {};
    // An empty file was only opened (or is being rewritten): not a beat yet.
    if (stat(path.c_str(), &st) != 0 || st.st_size == 0) continue;
    int64_t mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    auto it = beat_mtime_ns_.find(local_rank);
    if (it != beat_mtime_ns_.end() && it->second == mtime_ns) continue;
    beat_mtime_ns_[local_rank] = mtime_ns;
    auto age = real_now - std::chrono::nanoseconds(mtime_ns);
    TimePoint when = now - std::max<std::chrono::nanoseconds::rep>(0, age.count()) *
                               std::chrono::nanoseconds(1);
    hang_.OnBeat(local_rank, std::min(when, now), ParseBeatStep(ReadFile(path)));
  }
  if (!hang_.Hung(now).empty()) DeclareHang(now);
}

bool Launcher::PythonWorkers() const {
  const std::string& program = config_.worker_argv.empty() ? "" : config_.worker_argv[0];
  return program.substr(program.rfind('/') + 1).find("python") != std::string::npos;
}

void Launcher::DeclareHang(TimePoint now) {
  auto log = Logger("dtrun.agent");
  hang_stacks_.clear();
  std::vector<RankSilence> silences = hang_.Snapshot(now);
  MarkWaiting(&silences);
  for (const RankSilence& s : silences) {
    RankStack r;
    r.silence = s;
    r.rank = assignment_.base_rank + s.local_rank;
    r.pid = pids_.count(s.local_rank) ? pids_[s.local_rank] : 0;
    if (s.hung) {
      log->error("worker local_rank {} (pid {}) is hung: no heartbeat for {:.2f} s{}",
                 s.local_rank, r.pid, s.silent_s,
                 s.step >= 0 ? ", last step " + std::to_string(s.step) : "");
    }
    hang_stacks_.push_back(r);
  }
  hang_reported_ = false;
  if (PythonWorkers()) {
    log->warn("capturing every worker's Python stack (SIGABRT to the fault handler), then stopping the group");
    Apply(agent_.OnHang(SIGABRT, now));
    return;
  }
  CaptureNativeStacks();
  Apply(agent_.OnHang(SIGTERM, clock_->Now()));
}

void Launcher::CaptureNativeStacks() {
  std::string tool = FindInPath("eu-stack");
  std::string gdb = tool.empty() ? FindInPath("gdb") : "";
  std::vector<int> tools;
  for (RankStack& r : hang_stacks_) {
    if (!r.pid || r.silence.exited) continue;
    if (tool.empty() && gdb.empty()) {
      r.why_no_stack = "neither eu-stack (Debian: elfutils) nor gdb is installed";
      continue;
    }
    std::string file = attempt_dir_ + "/" + std::to_string(r.silence.local_rank) + "/stack.txt";
    std::vector<std::string> argv =
        tool.empty() ? std::vector<std::string>{gdb, "-p", std::to_string(r.pid), "-batch", "-nx",
                                                "-ex", "thread apply all bt"}
                     : std::vector<std::string>{tool, "-p", std::to_string(r.pid)};
    int pid = SpawnTo(argv, file);
    if (pid > 0) tools.push_back(pid);
    r.stack_file = file;
  }
  WaitAll(tools, std::chrono::steady_clock::now() + std::chrono::seconds(20));
  for (RankStack& r : hang_stacks_) {
    if (!r.stack_file.empty()) r.stack = ReadFile(r.stack_file);
  }
}

void Launcher::ReadPendingOutput() {
  // A dying worker's last lines (its stack) are in the pipes already.
  for (int round = 0; round < 50; ++round) {
    std::vector<pollfd> fds;
    for (int fd : mux_.fds()) fds.push_back({fd, POLLIN, 0});
    if (fds.empty() || poll(fds.data(), fds.size(), 10) <= 0) return;
    for (const auto& p : fds) {
      if (p.revents) mux_.OnReadable(p.fd);
    }
  }
}

void Launcher::ReportHang() {
  if (hang_reported_ || hang_stacks_.empty()) return;
  hang_reported_ = true;
  ReadPendingOutput();
  for (RankStack& r : hang_stacks_) {
    std::string dir = attempt_dir_ + "/" + std::to_string(r.silence.local_rank);
    if (!PythonWorkers() || r.silence.exited) continue;
    r.stack = ExtractFaulthandlerDump(ReadFile(dir + "/stderr.log"));
    if (r.stack.empty()) {
      r.why_no_stack = "the worker printed no Python fault-handler dump (not Python, or it "
                       "replaced the SIGABRT handler)";
      continue;
    }
    r.stack_file = dir + "/stack.txt";
    std::ofstream(r.stack_file) << r.stack;
  }
  double timeout_s = std::chrono::duration<double>(config_.hang_timeout).count();
  WriteAll(2, FormatHangReport(hang_stacks_, timeout_s, attempt_.restart_count, kReportFrames));
}

void Launcher::AbandonSurvivors() {
  for (const auto& [local_rank, pid] : pids_) {
    if (exit_time_.count(pid)) continue;
    abandoned_[pid] = true;
    Logger("dtrun.agent")->error(
        "worker local_rank {} (pid {}) is still alive long after SIGKILL (uninterruptible "
        "sleep?); going on without it",
        local_rank, pid);
  }
}

std::vector<WorkerFailure> Launcher::HangFailures() const {
  std::vector<RankSilence> silences;
  double longest = 0;
  for (const RankStack& r : hang_stacks_) {
    silences.push_back(r.silence);
    longest = std::max(longest, r.silence.silent_s);
  }
  size_t root = HangRootCause(silences);
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::vector<WorkerFailure> out;
  for (size_t i = 0; i < hang_stacks_.size(); ++i) {
    const RankStack& r = hang_stacks_[i];
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
