#pragma once

// dtrun's exit codes, mirrored by README's table ("Exit codes"). Every return
// from a job and from main() is one of these, a worker's own exit code (the
// root cause of a failure, as torchrun reports it), or ExitBySignal().

namespace dtrun::agent {

enum ExitCode : int {
  // Every worker succeeded.
  kExitSuccess = 0,
  // Several nodes: the job failed on another node.
  kExitFailedElsewhere = 1,
  // A bad flag, config value or environment: the message names it.
  kExitUsage = 2,
  // The store could not start or was lost; the join failed.
  kExitRendezvous = 3,
  // Interactive: the session's folder, console or launcher could not be set
  // up.
  kExitSetup = 4,
  // --max-restarts-without-progress: restarts in a row made no progress;
  // a scheduler should not requeue the job (nvidia-resiliency-ext's code).
  kExitNoProgress = 93,
  // The last attempt hung (no heartbeat within --hang-timeout).
  kExitHung = 124,
};

// Stopped by signal `signo` (dtrun itself, or the root-cause worker).
constexpr int ExitBySignal(int signo) { return 128 + signo; }

}  // namespace dtrun::agent
