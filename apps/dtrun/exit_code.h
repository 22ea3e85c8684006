#pragma once

// dtrun's exit codes, mirrored by README's table. Every return from a job
// and from main() is one of these, a worker's own exit code (the root cause
// of a failure, as torchrun reports it), or ExitBySignal().

namespace dtrun::agent {

enum ExitCode : int {
  kExitSuccess = 0,          // every worker succeeded
  kExitFailedElsewhere = 1,  // several nodes: the job failed on another node
  kExitUsage =
      2,  // bad flag, config value or environment: the message names it
  kExitRendezvous =
      3,           // the store could not start or was lost; the join failed
  kExitSetup = 4,  // interactive: the session's folder, console or launcher
                   // could not be set up
  kExitHung =
      124,  // the last attempt hung (no heartbeat within --hang-timeout)
};

// Stopped by signal `signo` (dtrun itself, or the root-cause worker).
constexpr int ExitBySignal(int signo) { return 128 + signo; }

}  // namespace dtrun::agent
