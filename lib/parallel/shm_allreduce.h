#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rendezvous/util/status.h"

namespace dtrun::train {

// Sum-all-reduce of float32 buffers among processes on one host, through a
// POSIX shared-memory segment: each rank owns a region of `floats` floats
// that the others can read. Allreduce(offset, n) sums elements
// [offset, offset + n) of every region: each rank adds up its 1/N chunk of
// them (in rank order, so every rank gets the same bits), then copies the
// other ranks' chunks, leaving the sum in its own region. Three barriers per
// call (futex based: a brief spin, then sleep). Loopback TCP (gloo) moves
// the same bytes through the kernel several times; this copies each once.
//
// Collective setup: rank 0 Create()s the segment, the others Open() it by
// name once it exists; rank 0 unlinks the name when all have opened (the
// memory goes when the last process unmaps it, also after a crash).
// Thread rules: one thread per process calls Allreduce(); region() may be
// written by another thread between calls for the parts not being reduced.
class ShmAllreduce {
 public:
  static Result<std::unique_ptr<ShmAllreduce>> Create(const std::string& name,
                                                      int world, size_t floats);
  static Result<std::unique_ptr<ShmAllreduce>> Open(const std::string& name,
                                                    int rank, int world,
                                                    size_t floats);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // Removes the name (rank 0, once every rank has opened the segment).
  void Unlink();
  // A barrier also ends (Unavailable) once `abandoned` says the group is
  // given up (lib/parallel/in_place.h's GroupBroken): a peer that left it
  // alive would never come.
  void set_abandoned(bool (*abandoned)()) { abandoned_ = abandoned; }

  float* region() { return Region(rank_); }
  int rank() const { return rank_; }
  int world() const { return world_; }

  // Blocks until every rank has called it for the same range; Status::Timeout
  // naming the ranks missing when `timeout` passes first. Each sum is divided
  // by `divisor` in the same pass (DDP's mean: the world size), with the
  // bits of the sum's division by it afterwards.
  Status Allreduce(size_t offset, size_t n, std::chrono::milliseconds timeout,
                   float divisor = 1.0f);
  // FSDP's two collectives, with the same rules. AllGather: every rank's
  // region()[0, n) lands in `out` (n * world floats, in rank order).
  // ReduceScatter: `out` (n floats) gets the sum, in rank order, of
  // elements [rank * n, rank * n + n) of every rank's region (n * world
  // floats each): the same bits as Allreduce's sum, and as a local sum of
  // an all-to-all's chunks.
  Status AllGather(size_t n, float* out, std::chrono::milliseconds timeout);
  Status ReduceScatter(size_t n, float* out, std::chrono::milliseconds timeout);

  struct Control;

 private:
  ShmAllreduce(std::string name, int rank, int world, size_t floats, void* base,
               size_t bytes);
  float* Region(int r);
  Status Barrier(std::chrono::steady_clock::time_point deadline);
  Status PeersAlive(uint32_t gen) const;

  std::string name_;
  int rank_, world_;
  size_t floats_;
  void* base_;
  size_t bytes_;
  bool (*abandoned_)() = nullptr;
};

// Runs jobs on a ShmAllreduce from a thread of its own, one at a time in
// the order they were launched, so that the caller goes on computing while
// a collective runs (DDP's buckets, FSDP's gathers and reduce-scatters).
// Every rank must launch the same collectives in the same order: the
// barriers inside pair up by order. Queued jobs still run before the thread
// exits, so no future is left broken.
class ShmQueue {
 public:
  explicit ShmQueue(std::unique_ptr<ShmAllreduce> shm);
  ~ShmQueue();
  ShmQueue(const ShmQueue&) = delete;
  ShmQueue& operator=(const ShmQueue&) = delete;

  ShmAllreduce& shm() { return *shm_; }
  std::future<Status> Launch(std::function<Status(ShmAllreduce&)> job);
  // Runs `job` on the calling thread once every job launched before it has
  // run: for a collective the caller would wait for at once, which saves
  // the hand-off to the thread and back.
  Status RunHere(const std::function<Status(ShmAllreduce&)>& job);

 private:
  struct Job {
    std::function<Status(ShmAllreduce&)> run;
    std::promise<Status> done;
  };
  void Loop();

  std::unique_ptr<ShmAllreduce> shm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> todo_;
  bool busy_ = false;  // the thread is running a job
  std::condition_variable idle_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace dtrun::train
