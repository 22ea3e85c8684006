#pragma once

// A running job's live status: what each node's agent knows of its workers
// (state, pid, step, beat age, step time, RSS, CPU), published every second
// to its run folder (status.json) and, with several nodes, to the
// rendezvous store; the registry of the jobs running on this host; and
// `dtrun --status`, which reads both. apps/dtrun/README.md, "Live status",
// describes what a user sees.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/dtrun/beat_file.h"
#include "apps/dtrun/straggler.h"
#include "rendezvous/util/clock.h"
#include "rendezvous/util/status.h"

namespace dtrun::agent {

// What the agent observed of one worker at one moment. Plain data; the
// shell (ReadProcess, ReadBeat) fills it from /proc and the beat file.
struct WorkerObservation {
  int local_rank = 0;
  int rank = 0;
  int pid = 0;
  std::string state;        // "running", "exited 0", "failed (exit code 1)"
  int64_t step = -1;        // the beat file's step; -1 without one
  int64_t total_steps = 0;  // the steps of the whole run, if the beat says
  double beat_unix = 0;     // when it was written (unix seconds); 0: never
  double cpu_seconds = 0;   // user + system time so far
  double rss_mb = 0;
};

// One worker's line of the status.
struct WorkerStatus {
  WorkerObservation seen;
  double beat_age_s = -1;          // seconds since the last beat; -1: none yet
  double step_time_last_s = -1;    // over the last interval with steps
  double step_time_median_s = -1;  // over the recent intervals
  double cpu_pct = 0;              // since the previous observation
};

// Turns observations into statuses: step times from the steps between two
// observations, CPU from the CPU seconds. Pure: time comes in as a value.
// Keeps the last `window` intervals per rank.
class StatusSampler {
 public:
  explicit StatusSampler(size_t window = 32) : window_(window) {}
  std::vector<WorkerStatus> Sample(const std::vector<WorkerObservation>& seen,
                                   double now_unix);
  // A new attempt: its workers are new processes with new step counts.
  void Reset() { history_.clear(); }

 private:
  struct History {
    int pid = 0;
    int64_t step = -1;
    double beat_unix = 0;
    double cpu_seconds = 0;
    double seen_unix = 0;
    std::vector<double> step_times;  // seconds per step, oldest first
  };
  size_t window_;
  std::map<int, History> history_;  // by local rank
};

// What fills an observation: the last beat's step and time (when there is
// one), and the process' CPU seconds and resident memory (/proc).
void ObserveBeat(const Beat& beat, WorkerObservation* w);
void ObserveProcess(int pid, WorkerObservation* w);

// A node's status as JSON: who it is, the attempt, and its workers.
struct NodeFacts {
  std::string run_id;
  std::string host;
  int group_rank = 0;
  int group_world_size = 1;
  int attempt = 0;  // restart count (elastic: the round)
  int max_restarts = 0;
  double started_unix = 0;
};
nlohmann::json NodeStatusJson(const NodeFacts& facts,
                              const std::vector<WorkerStatus>& workers,
                              double now_unix);

// Each rank's compute median and straggler score into a node's record
// ("compute_typical_s", "straggler_score"; -1 when not known). Pure.
void AddScores(const std::vector<RankScore>& scores, nlohmann::json* node);
// Scores every rank of a job from its nodes' records (the medians they
// carry) and writes them back: the job-wide view `--status` shows.
void ScoreJob(std::vector<nlohmann::json>* nodes);

// The table `dtrun --status RUN` prints for a job: one line per worker of
// every node in `nodes` (NodeStatusJson records). Pure.
std::string FormatJobStatus(const std::vector<nlohmann::json>& nodes);

// The registry of jobs running on this host: one JSON file per dtrun
// process, <dir>/<pid>.json, removed when it ends. The folder is
// $XDG_RUNTIME_DIR/dtrun when set, else /tmp/dtrun-<uid>.
std::string RegistryDir(const std::map<std::string, std::string>& env);
// This process's entry: run id, run folder, store address, start time.
struct RegistryEntry {
  int pid = 0;
  std::string run_id;
  std::string run_dir;
  std::string store;  // where its status is published: "host:port", or an
                      // etcd cluster's "http(s)://host:port,..."
  std::map<std::string, std::string> store_settings;  // etcd's TLS and auth
  bool elastic = false;
  double started_unix = 0;
};
nlohmann::json RegistryJson(const RegistryEntry& entry);
// Entries of live processes (a file whose process is gone is skipped).
std::vector<RegistryEntry> ReadRegistry(const std::string& dir);
// The table `dtrun --status` prints: the jobs on this host. Pure.
std::string FormatJobList(const std::vector<RegistryEntry>& jobs,
                          double now_unix);

// Writes this process's registry entry and removes it when destroyed.
class Registration {
 public:
  Registration(const std::string& dir, const RegistryEntry& entry);
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

 private:
  std::string path_;
};

// `dtrun --stacks` on one node: the request file it leaves in the run
// folder (its id inside); the agent answers with stacks.<id>.json
// (run_layout.h's StackRequest and StackAnswer).
// With several nodes: the request counter, and each node's answer to
// request n (rendezvous/store_keys.h).

// `dtrun --stacks RUN`: every rank's stack of a running job (run id, log
// folder or store host:port), the job going on. Returns the exit code.
int RunStacksCommand(const std::string& target,
                     const std::map<std::string, std::string>& env);

// `dtrun --status [RUN] [--json]`: the jobs on this host, or one job (its
// run id, its log folder, or the "host:port" of its rendezvous store)
// across all its nodes. Returns the exit code: 0, or 2 with a message when
// RUN matches no job.
int RunStatusCommand(const std::string& target, bool json,
                     const std::map<std::string, std::string>& env);

}  // namespace dtrun::agent
