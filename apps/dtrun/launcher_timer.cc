// The launcher's shell for torch's file-timer watchdog
// (TORCHELASTIC_ENABLE_FILE_TIMER=1): the named pipe FileTimerClient writes
// to, and the kill of a worker whose timer expired. Bookkeeping is FileTimers'.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "apps/dtrun/launcher.h"
#include "rendezvous/log.h"

namespace dtrun::agent {
namespace {

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

bool Launcher::KeepsStderr() const { return config_.hang_timeout.count() > 0 || config_.file_timer; }

void Launcher::OpenTimerPipe() {
  if (!config_.file_timer || timer_fd_ >= 0) return;
  timer_path_ = config_.timer_file.empty() ? run_dir_ + "/watchdog_timer" : config_.timer_file;
  ::unlink(timer_path_.c_str());  // as torch's server does
  if (mkfifo(timer_path_.c_str(), 0666) != 0) {
    Logger("dtrun.agent")->error("TORCHELASTIC_ENABLE_FILE_TIMER: cannot create the pipe '{}': {}; "
                                 "set TORCHELASTIC_TIMER_FILE to a writable path",
                                 timer_path_, std::strerror(errno));
    return;
  }
  // Read-write, so the pipe never reads as closed between clients.
  timer_fd_ = open(timer_path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  Logger("dtrun.agent")->info("serving torch's file timer at {}", timer_path_);
}

void Launcher::ReadTimerPipe() {
  char buf[4096];
  ssize_t n;
  while ((n = read(timer_fd_, buf, sizeof(buf))) > 0) {
    timer_lines_.Feed(std::string_view(buf, static_cast<size_t>(n)), [this](std::string_view line) {
      std::string error;
      auto request = ParseTimerRequest(std::string(line), &error);
      if (request) {
        timers_.Register(*request);
      } else {
        Logger("dtrun.agent")->warn("file timer: {}", error);
      }
    });
  }
}

int Launcher::NextTimerMs() const {
  auto next = timers_.next_expiry();
  if (!next) return -1;
  return static_cast<int>(std::max(0.0, (*next - WallNow()) * 1000) + 1);
}

void Launcher::CheckTimers() {
  if (timer_fd_ < 0) return;
  double now = WallNow();
  auto log = Logger("dtrun.agent");
  for (const ExpiredTimer& e : timers_.Reap(now)) {
    if (e.signal <= 0) {
      log->info("file timer of pid {} expired with no signal: not reaping it (as torch)", e.pid);
      continue;
    }
    bool ours = false;
    for (const auto& [lr, pid] : pids_) ours = ours || pid == e.pid;
    timer_expired_[e.pid] = e.scope_id;
    // A Python worker of ours dumps its stack on SIGABRT (PYTHONFAULTHANDLER)
    // and dies of it; anything else gets the signal its client asked for.
    int signo = ours && PythonWorkers() ? SIGABRT : e.signal;
    kill(e.pid, signo);
    log->error("file timer '{}' of pid {} expired at {:.3f}, killed at {:.3f} with {}{}", e.scope_id,
               e.pid, e.expiration_time, WallNow(), SignalName(signo),
               signo != e.signal ? " (for its stack; the client asked for " + SignalName(e.signal) + ")"
                                 : "");
  }
}

void Launcher::DescribeTimerExpiry(WorkerFailure* f) {
  auto it = timer_expired_.find(f->pid);
  if (it == timer_expired_.end()) return;
  std::string dir = attempt_dir_ + "/" + std::to_string(f->local_rank);
  std::ifstream in(dir + "/stderr.log");
  std::stringstream text;
  text << in.rdbuf();
  RankStack r;
  r.stack = ExtractFaulthandlerDump(text.str());
  std::string head = "torch file timer '" + it->second + "' expired: the worker was killed";
  if (!r.stack.empty()) {
    std::ofstream(dir + "/stack.txt") << r.stack;
    for (const std::string& frame : FirstFrames(r.stack, 4)) head += "\n  " + frame;
    head += "\nwhole stack: " + dir + "/stack.txt";
  }
  f->message = head;
  f->exit_code = kHangExitCode;
  f->signal = 0;
}

}  // namespace dtrun::agent
