#pragma once

// This node's checkpoint copies in shared memory (the training library's
// [checkpoint] mode = "memory"; the format is
// rendezvous/util/memory_checkpoint.h). dtrun names them for its workers,
// persists the newest to disk when the group stops after a failure, and
// removes them when the job ends, however it ends; a dtrun that was killed
// first leaves them to the next dtrun on the node, which removes them.
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

  // Removes the copies of dtrun processes that are gone, and says so.
  void RemoveOrphans();
  // Names this node's segments for a worker (DTRUN_CHECKPOINT_SHM).
  void AddEnv(EnvMap* env) const;
  // Writes the newest copies that are not on disk yet to their folders, on
  // a thread; nothing when one is still at it. The next group may start
  // meanwhile: it reads the same segments, and writes its first copies
  // into the other slot of each rank. `why` goes in the log.
  void PersistInBackground(const std::string& why);
  // Waits for the persisting, then removes every segment.
  void Finish();
  const std::string& prefix() const { return prefix_; }

 private:
  void Join();
  std::string prefix_;
  std::atomic<bool> running_{false};
  std::thread persist_;
};

}  // namespace dtrun::agent
