// Signal plumbing for the agent: SIGCHLD and the stop signals arrive as
// readable data on a signalfd instead of through handlers, so the poll loop
// in local_group.cc sees worker exits, worker output and Ctrl-C in one place
// and no code runs in async-signal context. Shell: touches process state.
#include "apps/dtrun/signals.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

namespace dtrun::agent {

// torchrun (1.13 and 2.x) turns these four into a shutdown that forwards the
// same signal to every worker; dtrun mirrors that set so a scheduler's SIGTERM
// or a terminal's SIGHUP reaches the training processes the same way.
const std::vector<int>& StopSignals() {
  static const std::vector<int> kSignals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  return kSignals;
}

SignalFd::SignalFd() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : StopSignals()) sigaddset(&set, s);
  // A signalfd only reports signals that are blocked: an unblocked one would
  // still take its default action (SIGTERM kills the agent before it could
  // forward anything). Blocking must happen before the store thread starts,
  // since a thread that leaves them unblocked would receive them instead.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent
  // Non-blocking so Read() can drain everything poll() announced; CLOEXEC so
  // workers do not inherit it (they get an empty mask back before exec).
  fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

SignalFd::~SignalFd() {
  if (fd_ >= 0) close(fd_);
}

std::vector<int> SignalFd::Read() {
  std::vector<int> out;
  // Standard signals do not queue: several children exiting between two
  // reads give one SIGCHLD, so callers must reap every exited pid on it.
  signalfd_siginfo info;
  while (read(fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    out.push_back(static_cast<int>(info.ssi_signo));
  }
  return out;
}

}  // namespace dtrun::agent
