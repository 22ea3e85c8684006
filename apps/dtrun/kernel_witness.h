#pragma once

// What the kernel saw of a worker's death, read when one dies: the kernel
// log (/dev/kmsg, from this dtrun's start on: the OOM killer's records,
// NVIDIA's Xid lines) and the OOM counter of the worker's memory cgroup
// (v2 memory.events, v1 memory.oom_control), with the texts of
// death_cause.h. A shell that only reads: it never signals anything. Owned
// by PosixWorkerGroup, which annotates each exit it reaps; its thread only.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/death_cause.h"

namespace dtrun::agent {

class KernelWitness {
 public:
  // Opens /dev/kmsg at its end; one that cannot be read (no permission, a
  // container without it) is said in what WhyDied returns.
  KernelWitness();
  ~KernelWitness();
  KernelWitness(const KernelWitness&) = delete;
  KernelWitness& operator=(const KernelWitness&) = delete;

  // Worker `pid` started: its memory cgroup and that cgroup's OOM count.
  void Watch(int pid);
  // What the kernel and the signal say of `e` beyond its exit code: for
  // SIGKILL whether the OOM killer did it (or what could not be checked),
  // for SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGFPE the signal's meaning and
  // where its core went. "" when there is nothing to add. *oom says whether
  // it was an OOM kill. Reads files; waits at most 100 ms for the kernel's
  // record of a kill, and only when the cgroup counted one. Forgets `pid`.
  std::string WhyDied(const WorkerExit& e, double peak_rss_mb, bool* oom);
  // The Xid lines the kernel logged since the last call, described.
  std::vector<std::string> GpuErrors();

 private:
  struct Cgroup {
    std::string dir;         // under /sys/fs/cgroup; "" when none found
    int64_t oom_kills = -1;  // its counter at the worker's start
  };
  void ReadNew();
  std::string WhyKilled(int pid, double peak_rss_mb, bool* oom);
  std::string WhyFatal(const WorkerExit& e) const;
  static int64_t OomKills(const std::string& dir);

  int fd_ = -1;
  std::string kmsg_error_;           // why /dev/kmsg cannot be read
  std::vector<KmsgRecord> records_;  // since the start, the oldest dropped
  size_t xids_read_ = 0;             // records_ GpuErrors has looked at
  std::map<int, Cgroup> cgroups_;    // pid -> its cgroup at its start
};

}  // namespace dtrun::agent
