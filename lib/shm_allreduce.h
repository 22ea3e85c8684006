#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

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

  float* region() { return Region(rank_); }
  int rank() const { return rank_; }
  int world() const { return world_; }

  // Blocks until every rank has called it for the same range; Status::Timeout
  // naming the ranks missing when `timeout` passes first.
  Status Allreduce(size_t offset, size_t n, std::chrono::milliseconds timeout);

  struct Control;

 private:
  ShmAllreduce(std::string name, int rank, int world, size_t floats, void* base,
               size_t bytes);
  float* Region(int r);
  Status Barrier(std::chrono::steady_clock::time_point deadline);

  std::string name_;
  int rank_, world_;
  size_t floats_;
  void* base_;
  size_t bytes_;
};

}  // namespace dtrun::train
