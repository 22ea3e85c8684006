#pragma once

// [checkpoint] mode = "memory", the training side: this rank's checkpoint
// copies in its node's shared memory (rendezvous/util/memory_checkpoint.h),
// written by the saver's thread and read back when a restarted group
// resumes. dtrun, which named the segments, persists and removes them.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/checkpoint.h"
#include "rendezvous/util/memory_checkpoint.h"
#include "rendezvous/util/status.h"

namespace dtrun::train {

class NodeCopies {
 public:
  // The copies of a worker whose launcher keeps them (dtrun sets
  // DTRUN_CHECKPOINT_SHM); null under any other. `dir`: the checkpoint
  // folder, made absolute here, as the segments name it.
  static std::unique_ptr<NodeCopies> FromEnv(int local_rank,
                                             const std::string& dir);

  // Writes this rank's `files` of `step` into its next slot (see
  // MemorySlots::Write). Thread-compatible: the saver's thread alone.
  Status Write(int64_t step, int64_t world_size, int64_t rank,
               const std::vector<memory_checkpoint::FileToWrite>& files,
               const std::function<void()>& halfway);

  // Reads the node's segments anew; each one no reader takes is kept in
  // unusable() ("path: why").
  void Scan();
  // The newest step >= `at_least` for which the scanned copies hold every
  // file `names(step)` lists, each in a copy saved on `world_size` ranks
  // (-1: on any number); -1 when none.
  int64_t Newest(const std::function<std::vector<std::string>(int64_t)>& names,
                 int64_t at_least, int64_t world_size) const;
  // The verified payload of file `name` of `step`, or why it does not load
  // (gone, rewritten since the scan, checksum mismatch, truncated);
  // kAsCopied: its blocks are left for the restore to verify.
  Result<PayloadView> Read(int64_t step, const std::string& name,
                           VerifyWhen when = VerifyWhen::kNow) const;
  // Marks the copy that holds `name` of `step` as one no reader may take
  // (its blocks did not verify as it was loaded), so that no restart,
  // and no persisting, reads it again; waits for other readers of it.
  void SetAside(int64_t step, const std::string& name);

  const std::vector<std::string>& unusable() const { return unusable_; }
  // "/dev/shm/<prefix>-*", for messages.
  std::string where() const;
  const std::string& dir() const { return dir_; }

 private:
  NodeCopies(std::string prefix, int local_rank, std::string dir);
  // The scanned copy of `step` of this folder that holds `name`, or null.
  const memory_checkpoint::MemoryCopy* Holder(int64_t step,
                                              const std::string& name,
                                              int64_t world_size) const;

  std::string prefix_;
  std::string dir_;
  memory_checkpoint::MemorySlots slots_;
  std::vector<memory_checkpoint::MemoryCopy> scanned_;
  std::vector<std::string> unusable_;
};

}  // namespace dtrun::train
