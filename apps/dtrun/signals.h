#pragma once

#include <vector>

namespace dtrun::agent {

// The stop signals dtrun forwards to its workers (torchrun's default set).
const std::vector<int>& StopSignals();
// Every other signal whose default action would end dtrun and that a
// process can catch when another process sends it (SIGUSR1, SIGALRM, ...):
// dtrun takes them all, so none ends it without a teardown and a summary.
const std::vector<int>& OtherTerminatingSignals();

// What dtrun does with a signal it received, given --signals-to-handle.
enum class SignalUse {
  kChildren,  // SIGCHLD: reap the workers that exited
  kStop,      // stop the job, forwarding the signal to the workers
  kForward,   // listed and not a stop signal: forward it, the job goes on
  kStopTerm,  // not listed: stop the job, the workers get SIGTERM
};
SignalUse UseOf(int signo, const std::vector<int>& handled);
// Signals read while no worker runs (a rendezvous, a store connect): the
// last that stops the job among `read`, 0 when none does; a forwarded one
// has nowhere to go then, which the log says.
int StopSignalAmong(const std::vector<int>& read,
                    const std::vector<int>& handled);

// Blocks SIGCHLD, the stop signals, the other terminating signals and
// `extra` in the calling thread (call it before any other thread starts, so
// all inherit the mask) and delivers them through a file descriptor the
// agent's poll loop watches. Not thread-safe.
class SignalFd {
 public:
  explicit SignalFd(const std::vector<int>& extra = {});
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
