#pragma once

// [checkpoint] mode = "async": the training loop hands a checkpoint's write
// (already copied out of the live state) to a thread of its own and goes
// on. At most one write is in flight: the next checkpoint waits for it,
// and says how long it waited. Not thread-safe: one owner (the loop).

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "rendezvous/util/status.h"

namespace dtrun::train {

class AsyncSave {
 public:
  AsyncSave() = default;
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  // Waits for the write in flight: a checkpoint is never abandoned.
  ~AsyncSave();

  // A write that ended.
  struct Finished {
    int64_t step = -1;    // -1: there was none
    Status status;        // the write's
    double write_s = 0;   // how long the write took
    double waited_s = 0;  // how long Wait() blocked for it
  };
  // Waits for the write in flight, if any, and returns how it ended.
  Finished Wait();
  // Starts `write` (the checkpoint of `step`) on a new thread.
  // REQUIRES: none in flight (Wait() first).
  void Start(int64_t step, std::function<Status()> write);
  // Whether a write was started and not yet waited for.
  bool in_flight() const { return thread_.joinable(); }
  // Whether that write is still running.
  bool running() const { return in_flight() && !done_.load(); }

 private:
  std::thread thread_;
  std::atomic<bool> done_{false};
  int64_t step_ = -1;
  Status status_;       // set by the thread before done_
  double write_s_ = 0;  // likewise
};

}  // namespace dtrun::train
