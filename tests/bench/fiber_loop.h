#pragma once

// Many blocking clients on one thread: each runs on a stack of its own (a
// fiber, ucontext), and where it would block in the kernel (the store
// clients' sockets::PollFor and SleepUntil) it parks in this loop's epoll
// instead, and the loop runs the others meanwhile. So the rendezvous
// simulator runs dtrun's real rendezvous and store clients, unchanged, for
// 16,384 agents on a thread or two rather than a thread each (whose
// switching, not the store, bounded the old simulator on 2 cores).
//
// A fiber never moves between threads, so the clients' own mutexes are
// locked and unlocked on one thread. Not thread-safe: Spawn before Run, on
// the thread that runs it.

#include <sys/epoll.h>
#include <ucontext.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <queue>
#include <vector>

#include "rendezvous/util/socket_util.h"

namespace dtrun::bench {

class FiberLoop {
 public:
  using Deadline = sockets::Deadline;

  // `stack_bytes` per fiber, reserved (MAP_NORESERVE) and touched only as
  // deep as a fiber goes; a guard page below each.
  explicit FiberLoop(size_t stack_bytes = 256 * 1024);
  ~FiberLoop();
  FiberLoop(const FiberLoop&) = delete;
  FiberLoop& operator=(const FiberLoop&) = delete;

  void Spawn(std::function<void()> body);
  // Runs every fiber to its end, with this loop's hooks installed on the
  // calling thread (sockets::SetWaitHooks).
  void Run();

 private:
  struct Fiber {
    ucontext_t ctx{};
    char* stack = nullptr;
    std::function<void()> body;
    bool done = false;
    bool waiting = false, ready = false;
    int fd = -1;           // the socket it waits for, -1 asleep
    uint64_t gen = 0;      // its wait's number: older timers are stale
    void* tsan = nullptr;  // ThreadSanitizer's fiber, in a TSan build
  };
  struct Timer {
    Deadline at;
    uint64_t gen;
    Fiber* fiber;
    bool operator>(const Timer& o) const { return at > o.at; }
  };

  static void Start(unsigned lo, unsigned hi);
  static bool PollHook(int fd, short events, Deadline deadline);
  static void SleepHook(Deadline until);
  bool WaitFd(int fd, short events, Deadline deadline);
  void Sleep(Deadline until);
  void Park();  // back to the loop until woken
  void Wake(Fiber* f, bool ready);
  void RunReady();
  int MillisToNextTimer() const;

  size_t stack_bytes_;
  int epfd_ = -1;
  ucontext_t loop_ctx_{};
  Fiber* current_ = nullptr;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::deque<Fiber*> ready_;
  std::vector<Fiber*> by_fd_;  // the fiber waiting on each descriptor
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  size_t alive_ = 0;
  void* loop_tsan_ = nullptr;  // the loop's own, in a TSan build
  sockets::WaitHooks hooks_;
};

}  // namespace dtrun::bench
