#pragma once

// A WorkerGroup that starts no process: it records what it was asked to
// spawn and signal, and the test decides when and how each worker exits.
// Single-threaded, like the code under test.

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "apps/dtrun/worker_group.h"

namespace dtrun::testing {

class FakeWorkerGroup : public agent::WorkerGroup {
 public:
  struct SentSignal {
    int pid;
    int signo;
  };

  Result<int> Spawn(const agent::WorkerSpec& spec) override {
    int pid = next_pid_++;
    spawned.push_back(spec);
    if (fail_exec.count(spec.local_rank)) {
      // As fork/exec does: the child exists and exits 127.
      Exit(pid, 127);
      local_rank_of_[pid] = spec.local_rank;
      return Status::Io("cannot execute '" + spec.argv[0] +
                        "': No such file or directory");
    }
    local_rank_of_[pid] = spec.local_rank;
    return pid;
  }
  void Signal(int pid, int signo) override { signals.push_back({pid, signo}); }
  std::vector<agent::WorkerExit> Reap() override {
    std::vector<agent::WorkerExit> out;
    for (auto& e : pending_) {
      auto it = local_rank_of_.find(e.pid);
      if (it == local_rank_of_.end()) continue;
      e.local_rank = it->second;
      local_rank_of_.erase(it);
      out.push_back(e);
    }
    pending_.clear();
    return out;
  }
  std::vector<int> output_fds() const override { return {}; }
  void OnReadable(int) override {}
  void ReadPending(std::chrono::milliseconds) override { ++read_pending_calls; }
  void Drain(std::chrono::milliseconds) override { ++drain_calls; }
  void RunTools(const std::vector<agent::ToolRun>& tools,
                std::chrono::milliseconds) override {
    tools_run.insert(tools_run.end(), tools.begin(), tools.end());
  }

  // Makes `pid` exit with `code` (or be killed by `signal`) at the next Reap.
  void Exit(int pid, int code, int signal = 0) {
    agent::WorkerExit e;
    e.pid = pid;
    e.exit_code = code;
    e.signal = signal;
    pending_.push_back(e);
  }
  // Every live worker exits the way a signal `signo` ends it.
  void KillAll(int signo) {
    for (const auto& [pid, lr] : local_rank_of_) Exit(pid, 0, signo);
  }
  int live() const { return static_cast<int>(local_rank_of_.size()); }
  // The pids of the spawns from index `from` on.
  std::vector<int> PidsFrom(size_t from) const {
    std::vector<int> out;
    for (size_t i = from; i < spawned.size(); ++i)
      out.push_back(kFirstPid + static_cast<int>(i));
    return out;
  }

  static constexpr int kFirstPid = 1000;
  std::vector<agent::WorkerSpec> spawned;
  std::vector<SentSignal> signals;
  std::vector<agent::ToolRun> tools_run;
  std::set<int> fail_exec;  // local ranks whose exec fails
  int read_pending_calls = 0;
  int drain_calls = 0;

 private:
  int next_pid_ = kFirstPid;
  std::map<int, int> local_rank_of_;  // live pid -> local rank
  std::vector<agent::WorkerExit> pending_;
};

}  // namespace dtrun::testing
