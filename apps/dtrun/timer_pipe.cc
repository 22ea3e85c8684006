// torch's FileTimerServer speaks JSON lines over a named pipe; serving it here
// lets unmodified torch code (FileTimerClient, expires()) run under dtrun.
#include "apps/dtrun/timer_pipe.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "apps/dtrun/hang_report.h"
#include "apps/dtrun/run_layout.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {

TimerPipe::~TimerPipe() {
  if (fd_ >= 0) close(fd_);
}

void TimerPipe::Open(const std::string& run_dir) {
  if (!config_.file_timer || fd_ >= 0) return;
  path_ = config_.timer_file.empty() ? run_dir + "/watchdog_timer"
                                     : config_.timer_file;
  ::unlink(path_.c_str());  // as torch's server does
  if (mkfifo(path_.c_str(), 0666) != 0) {
    Logger("dtrun.agent")
        ->error(
            "TORCHELASTIC_ENABLE_FILE_TIMER: cannot create the pipe '{}': {}; "
            "set TORCHELASTIC_TIMER_FILE to a writable path",
            path_, std::strerror(errno));
    return;
  }
  // Read-write, so the pipe never reads as closed between clients (a
  // read-only end would see EOF each time the last writer goes away).
  fd_ = open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  Logger("dtrun.agent")->info("serving torch's file timer at {}", path_);
}

void TimerPipe::AddEnv(EnvMap* env) const {
  if (fd_ < 0) return;
  (*env)["TORCHELASTIC_TIMER_FILE"] = path_;
  if (!env->count("PYTHONFAULTHANDLER")) (*env)["PYTHONFAULTHANDLER"] = "1";
}

void TimerPipe::OnReadable() {
  char buf[4096];
  ssize_t n;
  while ((n = read(fd_, buf, sizeof(buf))) > 0) {
    // Requests are JSON lines; several clients' lines arrive whole because
    // each is one write below PIPE_BUF.
    lines_.Feed(std::string_view(buf, static_cast<size_t>(n)),
                [this](std::string_view line) {
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

int TimerPipe::NextMs() const {
  // Expiry times are the clients' wall clock (time.time()), so this is too.
  auto next = timers_.next_expiry();
  if (!next) return -1;
  return static_cast<int>(
      std::max(0.0, (*next - clock_->UnixSeconds()) * 1000) + 1);
}

void TimerPipe::Check(const std::map<int, int>& pids, bool python) {
  if (fd_ < 0) return;
  auto log = Logger("dtrun.agent");
  for (const ExpiredTimer& e : timers_.Reap(clock_->UnixSeconds())) {
    if (e.signal <= 0) {
      log->info(
          "file timer of pid {} expired with no signal: not reaping it (as "
          "torch)",
          e.pid);
      continue;
    }
    bool ours = std::any_of(pids.begin(), pids.end(),
                            [&](auto& p) { return p.second == e.pid; });
    expired_[e.pid] = e.scope_id;
    // A Python worker of ours dumps its stack on SIGABRT (PYTHONFAULTHANDLER)
    // and dies of it; anything else gets the signal its client asked for.
    int signo = ours && python ? SIGABRT : e.signal;
    kill(e.pid, signo);
    log->error(
        "file timer '{}' of pid {} expired at {:.3f}, killed at {:.3f} with "
        "{}{}",
        e.scope_id, e.pid, e.expiration_time, clock_->UnixSeconds(),
        SignalName(signo),
        signo != e.signal ? " (for its stack; the client asked for " +
                                SignalName(e.signal) + ")"
                          : "");
  }
}

void TimerPipe::Describe(const std::string& attempt_dir,
                         WorkerFailure* f) const {
  auto it = expired_.find(f->pid);
  if (it == expired_.end()) return;
  const std::string stack_file = layout::StackFile(attempt_dir, f->local_rank);
  std::string stack = ExtractFaulthandlerDump(
      os::ReadFileOrEmpty(layout::OutputLog(attempt_dir, f->local_rank, 2)));
  std::string head =
      "torch file timer '" + it->second + "' expired: the worker was killed";
  if (!stack.empty()) {
    (void)os::WriteFile(stack_file, stack);
    for (const std::string& frame : FirstFrames(stack, 4))
      head += "\n  " + frame;
    head += "\nwhole stack: " + stack_file;
  }
  f->message = head;
  f->exit_code = kHangExitCode;
  f->signal = 0;
}

}  // namespace dtrun::agent
