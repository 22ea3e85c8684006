#include "apps/dtrun/signals.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

namespace dtrun::agent {

const std::vector<int>& StopSignals() {
  static const std::vector<int> kSignals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  return kSignals;
}

SignalFd::SignalFd() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : StopSignals()) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent
  fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

SignalFd::~SignalFd() {
  if (fd_ >= 0) close(fd_);
}

std::vector<int> SignalFd::Read() {
  std::vector<int> out;
  signalfd_siginfo info;
  while (read(fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    out.push_back(static_cast<int>(info.ssi_signo));
  }
  return out;
}

}  // namespace dtrun::agent
