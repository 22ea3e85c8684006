// A thread per write, not a pool: checkpoints are seconds to minutes apart,
// so starting a thread costs nothing beside them, and a thread that exists
// only while a write runs holds no state between checkpoints.
#include "lib/checkpointing/async_save.h"

#include <chrono>

#include "rendezvous/util/check.h"

namespace dtrun::train {

AsyncSave::~AsyncSave() { Wait(); }

AsyncSave::Finished AsyncSave::Wait() {
  if (!thread_.joinable()) return {};
  const auto start = std::chrono::steady_clock::now();
  thread_.join();
  Finished f;
  f.step = step_;
  f.status = status_;
  f.write_s = write_s_;
  f.waited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  step_ = -1;
  return f;
}

void AsyncSave::Start(int64_t step, std::function<Status()> write) {
  DTRUN_CHECK(!thread_.joinable()) << "a checkpoint write is in flight";
  step_ = step;
  done_ = false;
  // The thread writes status_ and write_s_ before done_; the owner reads
  // them only after join(), which orders both.
  thread_ = std::thread([this, write = std::move(write)] {
    const auto start = std::chrono::steady_clock::now();
    Status s = write();
    write_s_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    status_ = std::move(s);
    done_ = true;
  });
}

}  // namespace dtrun::train
