#pragma once

// This node's checkpoint copies in shared memory (the training library's
// [checkpoint] mode = "memory"; the format is
// rendezvous/util/memory_checkpoint.h). dtrun names them for its workers,
// persists the newest to disk when the group stops after a failure, and
// removes them when the job ends, however it ends, unless that persisting
// failed (a full disk, a read-only or failing folder): then they stay, and
// so does a killed dtrun's; the next dtrun on the node persists such
// copies before its workers start and removes each once it is on disk.
// Not thread-safe: the job's thread calls it; the persisting runs on a
// thread of its own.

#include <atomic>
#include <string>
#include <thread>

#include "apps/dtrun/worker_env.h"

namespace dtrun::agent {

class CheckpointCopies {
 public:
  CheckpointCopies();  // the copies of this process
  ~CheckpointCopies();
  CheckpointCopies(const CheckpointCopies&) = delete;
  CheckpointCopies& operator=(const CheckpointCopies&) = delete;

  // Persists, then removes, the copies of dtrun processes that are gone
  // (kept where persisting fails again), and says so.
  void PersistOrphans();
  // Names this node's segments for a worker (DTRUN_CHECKPOINT_SHM).
  void AddEnv(EnvMap* env) const;
  // Writes the newest copies that are not on disk yet to their folders, on
  // a thread; nothing when one is still at it. The next group may start
  // meanwhile: it reads the same segments, and writes its first copies
  // into the other slot of each rank. `why` goes in the log.
  void PersistInBackground(const std::string& why);
  // Waits for the persisting, then removes every segment, unless the last
  // persisting failed: then they stay, and the log says where and why.
  void Finish();
  const std::string& prefix() const { return prefix_; }

 private:
  void Join();
  std::string prefix_;
  std::atomic<bool> running_{false};
  std::atomic<bool> failed_{false};  // the last persisting's
  std::string failure_;              // its first note, set before failed_
  std::thread persist_;
};

}  // namespace dtrun::agent
