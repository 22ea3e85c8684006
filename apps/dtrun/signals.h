#pragma once

#include <vector>

namespace dtrun::agent {

// The stop signals dtrun forwards to its workers (torchrun's default set).
const std::vector<int>& StopSignals();

// Blocks SIGCHLD and the stop signals in the calling thread (call it before
// any other thread starts, so all inherit the mask) and delivers them
// through a file descriptor the agent's poll loop watches. Not thread-safe.
class SignalFd {
 public:
  SignalFd();
  ~SignalFd();
  SignalFd(const SignalFd&) = delete;
  SignalFd& operator=(const SignalFd&) = delete;

  // Poll it for POLLIN; -1 when signalfd failed (then no signal arrives).
  int fd() const { return fd_; }
  // Signals pending now (non-blocking; empty when none), in arrival order.
  // Pending standard signals do not queue, so SIGCHLD may stand for many
  // exits: reap every child that has exited.
  std::vector<int> Read();

 private:
  int fd_ = -1;
};

}  // namespace dtrun::agent
