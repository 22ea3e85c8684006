// The fiber loop (fiber_loop.h).
//
// A wait arms its socket in the loop's epoll once (EPOLLONESHOT) and a
// timer for its deadline; whichever comes first wakes the fiber, and the
// other is recognised as stale later (the socket's fiber no longer waits on
// it; the timer's wait number is old).
#include "tests/bench/fiber_loop.h"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

// ThreadSanitizer follows a stack switch only when told of it: each fiber
// is a TSan fiber, and every swapcontext says where it goes.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define DTRUN_TSAN_FIBERS 1
#endif

namespace dtrun::bench {
namespace {

thread_local FiberLoop* t_loop = nullptr;

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::abort();
}

}  // namespace

FiberLoop::FiberLoop(size_t stack_bytes) : stack_bytes_(stack_bytes) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) Die("epoll_create1");
  hooks_.poll = &FiberLoop::PollHook;
  hooks_.sleep = &FiberLoop::SleepHook;
}

FiberLoop::~FiberLoop() {
  for (auto& f : fibers_) {
    if (f->stack) munmap(f->stack, stack_bytes_ + 4096);
  }
  if (epfd_ >= 0) close(epfd_);
}

void FiberLoop::Spawn(std::function<void()> body) {
  auto f = std::make_unique<Fiber>();
  f->body = std::move(body);
  f->stack = static_cast<char*>(
      mmap(nullptr, stack_bytes_ + 4096, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0));
  if (f->stack == MAP_FAILED) Die("mmap of a fiber's stack");
  // The page below the stack: an overflow faults rather than corrupting
  // the next fiber's.
  if (mprotect(f->stack, 4096, PROT_NONE) != 0) Die("mprotect");
  if (getcontext(&f->ctx) != 0) Die("getcontext");
  f->ctx.uc_stack.ss_sp = f->stack + 4096;
  f->ctx.uc_stack.ss_size = stack_bytes_;
  f->ctx.uc_link = &loop_ctx_;
  const auto p = reinterpret_cast<uintptr_t>(f.get());
  makecontext(&f->ctx, reinterpret_cast<void (*)()>(&FiberLoop::Start), 2,
              static_cast<unsigned>(p & 0xffffffffu),
              static_cast<unsigned>(static_cast<uint64_t>(p) >> 32));
#ifdef DTRUN_TSAN_FIBERS
  f->tsan = __tsan_create_fiber(0);
#endif
  ready_.push_back(f.get());
  fibers_.push_back(std::move(f));
  ++alive_;
}

void FiberLoop::Start(unsigned lo, unsigned hi) {
  auto* f = reinterpret_cast<Fiber*>(static_cast<uintptr_t>(
      (static_cast<uint64_t>(hi) << 32) | static_cast<uint64_t>(lo)));
  f->body();
  f->body = nullptr;  // what it captured goes now, on this thread
  f->done = true;
#ifdef DTRUN_TSAN_FIBERS
  __tsan_switch_to_fiber(t_loop->loop_tsan_, 0);
#endif
  // Returning resumes uc_link: the loop.
}

bool FiberLoop::PollHook(int fd, short events, Deadline deadline) {
  return t_loop->WaitFd(fd, events, deadline);
}

void FiberLoop::SleepHook(Deadline until) { t_loop->Sleep(until); }

bool FiberLoop::WaitFd(int fd, short events, Deadline deadline) {
  if (deadline <= std::chrono::steady_clock::now()) {
    pollfd p{fd, events, 0};
    return ::poll(&p, 1, 0) != 0;
  }
  Fiber* f = current_;
  if (static_cast<size_t>(fd) >= by_fd_.size()) by_fd_.resize(fd + 1024);
  by_fd_[fd] = f;
  epoll_event ev{};
  ev.events = EPOLLONESHOT | ((events & POLLIN) ? EPOLLIN : 0u) |
              ((events & POLLOUT) ? EPOLLOUT : 0u);
  ev.data.fd = fd;
  if (epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) != 0) {
    if (errno != ENOENT || epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      return true;  // let the next call on the socket report it
  }
  f->fd = fd;
  timers_.push(Timer{deadline, ++f->gen, f});
  Park();
  return f->ready;
}

void FiberLoop::Sleep(Deadline until) {
  Fiber* f = current_;
  f->fd = -1;
  timers_.push(Timer{until, ++f->gen, f});
  Park();
}

void FiberLoop::Park() {
  Fiber* f = current_;
  f->waiting = true;
#ifdef DTRUN_TSAN_FIBERS
  __tsan_switch_to_fiber(loop_tsan_, 0);
#endif
  if (swapcontext(&f->ctx, &loop_ctx_) != 0) Die("swapcontext");
}

void FiberLoop::Wake(Fiber* f, bool ready) {
  f->waiting = false;
  f->ready = ready;
  ready_.push_back(f);
}

void FiberLoop::RunReady() {
  while (!ready_.empty()) {
    Fiber* f = ready_.front();
    ready_.pop_front();
    current_ = f;
#ifdef DTRUN_TSAN_FIBERS
    __tsan_switch_to_fiber(f->tsan, 0);
#endif
    if (swapcontext(&loop_ctx_, &f->ctx) != 0) Die("swapcontext");
    current_ = nullptr;
    if (f->done && f->stack) {
#ifdef DTRUN_TSAN_FIBERS
      __tsan_destroy_fiber(f->tsan);
#endif
      munmap(f->stack, stack_bytes_ + 4096);
      f->stack = nullptr;
      --alive_;
    }
  }
}

int FiberLoop::MillisToNextTimer() const {
  if (timers_.empty()) return 100;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  timers_.top().at - std::chrono::steady_clock::now())
                  .count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left + 1, 100));
}

void FiberLoop::Run() {
  t_loop = this;
#ifdef DTRUN_TSAN_FIBERS
  loop_tsan_ = __tsan_get_current_fiber();
#endif
  sockets::SetWaitHooks(&hooks_);
  std::vector<epoll_event> events(4096);
  while (alive_ > 0) {
    RunReady();
    if (alive_ == 0) break;
    int n = epoll_wait(epfd_, events.data(), static_cast<int>(events.size()),
                       ready_.empty() ? MillisToNextTimer() : 0);
    if (n < 0 && errno != EINTR) Die("epoll_wait");
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      Fiber* f = static_cast<size_t>(fd) < by_fd_.size() ? by_fd_[fd] : nullptr;
      if (f && f->waiting && f->fd == fd) Wake(f, true);
    }
    const auto now = std::chrono::steady_clock::now();
    while (!timers_.empty() && timers_.top().at <= now) {
      Timer t = timers_.top();
      timers_.pop();
      if (t.gen == t.fiber->gen && t.fiber->waiting) Wake(t.fiber, false);
    }
  }
  sockets::SetWaitHooks(nullptr);
  t_loop = nullptr;
}

}  // namespace dtrun::bench
