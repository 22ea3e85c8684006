#pragma once

// checkpoint.mode = "async" and "memory" (checkpointer.h): the loop copies
// the state (HostStaging) and a thread (AsyncSave) writes it; in memory mode
// first to the node's shared-memory copies (NodeCopies), and to disk every
// persist_every-th checkpoint. Only checkpointer.cc makes one.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "lib/checkpointing/async_save.h"
#include "lib/checkpointing/checkpointer.h"
#include "lib/checkpointing/host_staging.h"
#include "lib/checkpointing/node_copies.h"
#include "rendezvous/store_client.h"

namespace dtrun::train {

class BackgroundCheckpointer : public Checkpointer {
 public:
  explicit BackgroundCheckpointer(const CheckpointContext& ctx);

  void Save(int64_t done, const StepActions& actions) override;
  void Wait(int64_t due) override;
  void Settle() override;
  void Fence() override { staging_.Fence(); }
  void Reserve() override;

 private:
  // What the saver's thread writes.
  struct SaveJob {
    int64_t step = 0;
    bool persist = true;      // to disk too (memory mode: not every time)
    bool kill = false;        // fault.kill_in = "write"
    bool whole = false;       // this rank writes a step's file
    std::string durable_key;  // the attempt's, when the job was made
    StepFile file;
    std::optional<TensorMap> shard;
    std::function<TensorMap()> encode;
    HostStaging::Ready ready;  // the copies' arrival in host memory
  };
  // The payloads of one job, encoded and checksummed once for both the
  // memory copy and the disk.
  struct Encoded {
    Payload shard_payload, step_payload;
    std::string shard_header, step_header;
  };

  int64_t ResumeFromCopies() override;
  // The files rank `rank_` needs of `step` to resume from memory.
  std::vector<std::string> MemoryFilesOf(int64_t step) const;
  // Reads them and has the strategy check them; *file gets the step's.
  Status LoadFromMemory(int64_t step, StepFile* file);
  // Whether every rank's copy of `step` loaded (`loaded`) and is of one
  // history; says why not. Collective.
  bool AllLoaded(int64_t step, const StepFile& file, Status loaded);
  // Restores `file` (agreed on every rank) and lets go of it; false on
  // every rank when a rank's copy did not verify as it was copied.
  bool RestoredFromCopy(int64_t step, StepFile* file);
  // This rank writes the step's file: rank 0 (the folder's), and in memory
  // mode each node's first rank, so every node can resume from its own copy.
  bool Whole() const;
  // Starts `job` on the saver's thread; Wait() before the next.
  void StartSave(SaveJob job);
  // The saver's thread: memory copies (mode = "memory"), then the disk.
  Status WriteSave(SaveJob& job);
  Status WriteCopies(const SaveJob& job, const Encoded& e,
                     const std::function<void()>& halfway);
  Status WaitForShards(const std::vector<std::string>& keys);
  Status WriteToDisk(const SaveJob& job, const Encoded& e,
                     const std::function<void()>& halfway);

  HostStaging staging_;                 // the copies the saver writes
  std::unique_ptr<NodeCopies> copies_;  // mode = "memory" under dtrun
  // the store connection of the saver's thread (made at the first shard)
  std::unique_ptr<rendezvous::TcpStoreClient> save_store_;
  // memory mode: why the last background write's copy did not reach the
  // disk (it is in memory); written by the saver's thread, read by the
  // loop after it joined
  std::string unpersisted_;
  // Settle(): rank 0's saver stops waiting for the other shards.
  std::atomic<bool> abandon_{false};
  AsyncSave saver_;  // last, so that it is joined first
};

}  // namespace dtrun::train
