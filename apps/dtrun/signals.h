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

  int fd() const { return fd_; }
  // Signals pending now (non-blocking); SIGCHLD may stand for many exits.
  std::vector<int> Read();

 private:
  int fd_ = -1;
};

}  // namespace dtrun::agent
