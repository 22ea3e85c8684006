// The shared-memory all-reduce: one POSIX segment, a region per rank, a
// barrier of atomic counters (futex words) in the segment's head; a rank
// that dies ends the others' waits as soon as it is gone (in-place
// recovery waits on that), one that hangs with a timeout naming it.
#include "lib/parallel/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace dtrun::train {
namespace {

constexpr uint64_t kMagic = 0x6474726e73686d31;  // "dtrnshm1"
constexpr int kMaxRanks = 512;
// The control block gets pages of its own, so the regions after it start
// page-aligned.
constexpr size_t kHeaderBytes = 8192;
// How often a waiting rank looks whether the ranks it waits for still live.
constexpr int64_t kLivenessSliceNs = 20000000;

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// Each region is rounded up to whole cache lines: no line is written by two
// ranks, which would bounce it between cores on every store.
size_t RegionBytes(size_t floats) {
  return (floats * sizeof(float) + 63) / 64 * 64;
}

// The kernel sleeps only while *addr still equals `expected`, so a wake-up
// between the caller's load and this call is not lost. Timed, so that the
// caller can check its deadline; spurious returns are fine (it reloads).
void FutexWait(std::atomic<uint32_t>* addr, uint32_t expected, int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000),
              static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected,
          &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT32_MAX,
          nullptr, nullptr, 0);
}

}  // namespace

// Lives at the start of the segment, shared by every rank. The counters sit
// on cache lines of their own: arrivals hammer `count` while the waiters
// poll `generation`.
struct ShmAllreduce::Control {
  uint64_t magic;
  uint32_t world;
  uint64_t floats;
  alignas(
      64) std::atomic<uint32_t> count;  // ranks arrived at the current barrier
  alignas(
      64) std::atomic<uint32_t> generation;  // barriers completed (futex word)
  alignas(64) std::atomic<uint32_t> waiting_in[kMaxRanks];  // rank -> barrier
                                                            // it is in, + 1
  std::atomic<int32_t> pid[kMaxRanks];  // rank -> its process, once mapped
};
static_assert(sizeof(ShmAllreduce::Control) <= kHeaderBytes,
              "control block too large");

Result<std::unique_ptr<ShmAllreduce>> ShmAllreduce::Create(
    const std::string& name, int world, size_t floats) {
  if (world < 1 || world > kMaxRanks)
    return Status::Invalid("shared-memory all-reduce: bad world size");
  const size_t bytes =
      kHeaderBytes + RegionBytes(floats) * static_cast<size_t>(world);
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Io(Errno("shm_open " + name));
  // Reserve the pages now: a /dev/shm too small fails here, not with SIGBUS
  // later.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    errno = err;
    return Status::Io(Errno("reserving " + std::to_string(bytes >> 20) +
                            " MiB in /dev/shm for " + name));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Status::Io(Errno("mmap " + name));
  }
  auto* c = new (base) Control();
  c->world = static_cast<uint32_t>(world);
  c->floats = floats;
  c->count.store(0);
  c->generation.store(0);
  for (auto& w : c->waiting_in) w.store(0);
  for (auto& p : c->pid) p.store(0);
  c->pid[0].store(getpid());
  // The magic goes in last, after a release fence: a rank that opens the
  // segment early sees no magic rather than half-set counters.
  std::atomic_thread_fence(std::memory_order_release);
  c->magic = kMagic;
  return std::unique_ptr<ShmAllreduce>(
      new ShmAllreduce(name, 0, world, floats, base, bytes));
}

Result<std::unique_ptr<ShmAllreduce>> ShmAllreduce::Open(
    const std::string& name, int rank, int world, size_t floats) {
  const size_t bytes =
      kHeaderBytes + RegionBytes(floats) * static_cast<size_t>(world);
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Io(Errno("shm_open " + name));
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Status::Io(Errno("mmap " + name));
  auto* c = static_cast<Control*>(base);
  std::atomic_thread_fence(
      std::memory_order_acquire);  // pairs with Create()'s release
  if (c->magic != kMagic || c->world != static_cast<uint32_t>(world) ||
      c->floats != floats) {
    munmap(base, bytes);
    return Status::Invalid(name + " is not this group's all-reduce segment");
  }
  c->pid[rank].store(getpid());
  return std::unique_ptr<ShmAllreduce>(
      new ShmAllreduce(name, rank, world, floats, base, bytes));
}

ShmAllreduce::ShmAllreduce(std::string name, int rank, int world, size_t floats,
                           void* base, size_t bytes)
    : name_(std::move(name)),
      rank_(rank),
      world_(world),
      floats_(floats),
      base_(base),
      bytes_(bytes) {}

ShmAllreduce::~ShmAllreduce() { munmap(base_, bytes_); }

void ShmAllreduce::Unlink() { shm_unlink(name_.c_str()); }

float* ShmAllreduce::Region(int r) {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + kHeaderBytes +
                                  RegionBytes(floats_) *
                                      static_cast<size_t>(r));
}

// A generation barrier. Each rank notes the generation it arrived in and
// waits for it to move; the last to arrive resets `count` *before* bumping
// `generation`, so a fast rank that is released and enters the next
// barrier at once counts from 0 and is never folded into this one. Waiters
// compare generations, not counts, so none misses a release even though
// the count is already back to 0. waiting_in[] only feeds the timeout
// message (which local ranks never arrived).
Status ShmAllreduce::Barrier(std::chrono::steady_clock::time_point deadline) {
  auto* c = static_cast<Control*>(base_);
  const uint32_t gen = c->generation.load(std::memory_order_acquire);
  c->waiting_in[rank_].store(gen + 1, std::memory_order_relaxed);
  if (c->count.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(world_)) {
    c->count.store(0, std::memory_order_relaxed);
    c->generation.fetch_add(1, std::memory_order_acq_rel);
    FutexWakeAll(&c->generation);
    return Status::Ok();
  }
  for (int spin = 0; c->generation.load(std::memory_order_acquire) == gen;
       ++spin) {
    // Ranks on their own cores usually arrive within microseconds: a short
    // spin beats a futex sleep and wake. Then sleep, in slices of at most
    // 100 ms, to notice the deadline.
    if (spin < 200) {
      std::this_thread::yield();
      continue;
    }
    if (Status gone = PeersAlive(gen); !gone.ok()) return gone;
    // A new group's word (in-place recovery): a peer may have left for it
    // alive, and will not come.
    if (abandoned_ && abandoned_()) {
      return Status::Unavailable("shared-memory all-reduce: rank " +
                                 std::to_string(rank_) +
                                 ": the group is re-forming in place");
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string missing;
      for (int r = 0; r < world_; ++r) {
        if (c->waiting_in[r].load() != gen + 1)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return Status::Timeout("shared-memory all-reduce: rank " +
                             std::to_string(rank_) +
                             " timed out waiting for local rank(s) " + missing);
    }
    int64_t ns = std::min<int64_t>(
        kLivenessSliceNs,
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now)
            .count());
    FutexWait(&c->generation, gen, ns);
  }
  return Status::Ok();
}

// A rank that never arrived at barrier `gen` and whose process is gone
// (reaped: a zombie still counts as alive) will never come: Unavailable,
// naming it, so that the survivors learn of it within a slice, not at
// the timeout.
Status ShmAllreduce::PeersAlive(uint32_t gen) const {
  auto* c = static_cast<const Control*>(base_);
  for (int r = 0; r < world_; ++r) {
    if (c->waiting_in[r].load() == gen + 1) continue;
    const int32_t pid = c->pid[r].load();
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      return Status::Unavailable("shared-memory all-reduce: local rank " +
                                 std::to_string(r) + " (pid " +
                                 std::to_string(pid) + ") died");
    }
  }
  return Status::Ok();
}

Status ShmAllreduce::Allreduce(size_t offset, size_t n,
                               std::chrono::milliseconds timeout,
                               float divisor) {
  if (offset + n > floats_)
    return Status::Invalid("shared-memory all-reduce: range out of bounds");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status s = Barrier(deadline);  // every rank's input is in place
  if (!s.ok()) return s;
  // Reduce-scatter then all-gather through memory: each rank sums 1/N of
  // the range, so the work and the memory traffic are split evenly.
  const size_t chunk = (n + world_ - 1) / world_;
  auto bounds = [&](int r) {
    size_t lo = std::min(n, chunk * static_cast<size_t>(r));
    return std::make_pair(offset + lo, offset + std::min(n, lo + chunk));
  };
  // Reduce this rank's chunk, in rank order, a block at a time (the block
  // is read from every region before this rank's own is overwritten).
  auto [lo, hi] = bounds(rank_);
  constexpr size_t kBlock = 2048;
  float acc[kBlock];
  for (size_t at = lo; at < hi; at += kBlock) {
    const size_t len = std::min(kBlock, hi - at);
    std::memcpy(acc, Region(0) + at, len * sizeof(float));
    for (int r = 1; r < world_; ++r) {
      const float* src = Region(r) + at;
      for (size_t i = 0; i < len; ++i) acc[i] += src[i];
    }
    if (divisor != 1.0f) {
      for (size_t i = 0; i < len; ++i) acc[i] /= divisor;
    }
    std::memcpy(Region(rank_) + at, acc, len * sizeof(float));
  }
  s = Barrier(deadline);  // every chunk is summed
  if (!s.ok()) return s;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    auto [rlo, rhi] = bounds(r);
    std::memcpy(Region(rank_) + rlo, Region(r) + rlo,
                (rhi - rlo) * sizeof(float));
  }
  return Barrier(
      deadline);  // nobody overwrites a region another rank still copies from
}

Status ShmAllreduce::AllGather(size_t n, float* out,
                               std::chrono::milliseconds timeout) {
  if (n > floats_)
    return Status::Invalid("shared-memory all-gather: range out of bounds");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status s = Barrier(deadline);  // every rank's input is in place
  if (!s.ok()) return s;
  for (int r = 0; r < world_; ++r)
    std::memcpy(out + n * static_cast<size_t>(r), Region(r), n * sizeof(float));
  return Barrier(deadline);  // every rank has copied every region
}

// Each element is summed as Allreduce sums it: rank 0's value, then rank
// 1's added, and so on, a block at a time.
Status ShmAllreduce::ReduceScatter(size_t n, float* out,
                                   std::chrono::milliseconds timeout) {
  const size_t total = n * static_cast<size_t>(world_);
  if (total > floats_)
    return Status::Invalid("shared-memory reduce-scatter: range out of bounds");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status s = Barrier(deadline);  // every rank's input is in place
  if (!s.ok()) return s;
  const size_t lo = n * static_cast<size_t>(rank_);
  std::memcpy(out, Region(0) + lo, n * sizeof(float));
  for (int r = 1; r < world_; ++r) {
    const float* src = Region(r) + lo;
    for (size_t i = 0; i < n; ++i) out[i] += src[i];
  }
  return Barrier(deadline);  // nobody still reads a region
}

ShmQueue::ShmQueue(std::unique_ptr<ShmAllreduce> shm)
    : shm_(std::move(shm)), thread_([this] { Loop(); }) {}

ShmQueue::~ShmQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::future<Status> ShmQueue::Launch(std::function<Status(ShmAllreduce&)> job) {
  std::promise<Status> done;
  auto result = done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo_.push_back({std::move(job), std::move(done)});
  }
  cv_.notify_one();
  return result;
}

void ShmQueue::Loop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_ || (!todo_.empty() && !busy_); });
    if (todo_.empty()) return;
    Job job = std::move(todo_.front());
    todo_.pop_front();
    busy_ = true;
    lock.unlock();
    Status s = job.run(*shm_);
    lock.lock();
    busy_ = false;
    idle_.notify_all();
    lock.unlock();
    job.done.set_value(std::move(s));
  }
}

Status ShmQueue::RunHere(const std::function<Status(ShmAllreduce&)>& job) {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return todo_.empty() && !busy_; });
  busy_ = true;  // nothing launched meanwhile runs before this ends
  lock.unlock();
  Status s = job(*shm_);
  lock.lock();
  busy_ = false;
  lock.unlock();
  cv_.notify_one();
  idle_.notify_all();
  return s;
}

}  // namespace dtrun::train
