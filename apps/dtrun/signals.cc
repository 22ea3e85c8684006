// Signal plumbing for the agent: SIGCHLD and the stop signals arrive as
// readable data on a signalfd instead of through handlers, so the poll loop
// in local_group.cc sees worker exits, worker output and Ctrl-C in one place
// and no code runs in async-signal context. Shell: touches process state.
#include "apps/dtrun/signals.h"

#include "apps/dtrun/error_report.h"
#include "rendezvous/util/log.h"

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

const std::vector<int>& OtherTerminatingSignals() {
  // Not the synchronous ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
  // SIGSYS, SIGABRT): blocked, a real fault would still kill, and a kill(2)
  // of one is a crash report, not a request.
  static const std::vector<int> kSignals = [] {
    std::vector<int> s = {SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF,
                          SIGXCPU, SIGXFSZ, SIGIO,   SIGPWR,    SIGSTKFLT};
    for (int rt = SIGRTMIN; rt <= SIGRTMAX; ++rt) s.push_back(rt);
    return s;
  }();
  return kSignals;
}

SignalUse UseOf(int signo, const std::vector<int>& handled) {
  if (signo == SIGCHLD) return SignalUse::kChildren;
  for (int s : StopSignals()) {
    if (s == signo) return SignalUse::kStop;
  }
  for (int s : handled) {
    if (s == signo) return SignalUse::kForward;
  }
  return SignalUse::kStopTerm;
}

SignalFd::SignalFd(const std::vector<int>& extra) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : StopSignals()) sigaddset(&set, s);
  for (int s : OtherTerminatingSignals()) sigaddset(&set, s);
  for (int s : extra) sigaddset(&set, s);
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

int StopSignalAmong(const std::vector<int>& read,
                    const std::vector<int>& handled) {
  int stop = 0;
  for (int signo : read) {
    SignalUse use = UseOf(signo, handled);
    if (use == SignalUse::kForward) {
      Logger("dtrun.agent")
          ->warn("received {} while no worker runs; nothing to forward it to",
                 SignalName(signo));
    } else if (use != SignalUse::kChildren) {
      stop = signo;
    }
  }
  return stop;
}

}  // namespace dtrun::agent
