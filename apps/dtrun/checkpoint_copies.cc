#include "apps/dtrun/checkpoint_copies.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

#include "rendezvous/util/log.h"
#include "rendezvous/util/memory_checkpoint.h"

namespace dtrun::agent {

namespace mc = memory_checkpoint;

namespace {

// The persisting runs while the next group starts and loads the same
// copies: on a node with as many cores as workers it took their CPU and
// disk (a DDP restart from memory came back 0.9 s later than one from
// disk). This thread alone is made the last to run (nice 19) and the last
// to write (best-effort I/O, lowest level): the copies stay in memory
// meanwhile, so nothing waits for it but the disk copy itself.
void YieldToWorkers() {
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19);
  constexpr int kWhoProcess = 1, kClassBestEffort = 2, kClassShift = 13;
  (void)::syscall(SYS_ioprio_set, kWhoProcess, tid,
                  (kClassBestEffort << kClassShift) | 7);
}

}  // namespace

CheckpointCopies::CheckpointCopies() : prefix_(mc::PrefixOf(::getpid())) {}

CheckpointCopies::~CheckpointCopies() { Join(); }

void CheckpointCopies::Join() {
  if (persist_.joinable()) persist_.join();
}

void CheckpointCopies::PersistOrphans() {
  for (const std::string& line : mc::PersistOrphanedCopies())
    Logger("dtrun.agent")->warn("checkpoint copies in memory: {}", line);
}

void CheckpointCopies::AddEnv(EnvMap* env) const {
  (*env)[mc::kPrefixEnv] = prefix_;
}

// Nothing is logged when there are no copies (every job not in memory
// mode): the scan of /dev/shm is all it costs. Never blocks the agent: a
// persisting still running already covers these copies (every trigger
// comes after the group stopped, before the next one wrote anything), so
// a second trigger meanwhile (a failure, then the restart) is dropped.
void CheckpointCopies::PersistInBackground(const std::string& why) {
  if (running_.load()) return;
  Join();
  running_.store(true);
  persist_ = std::thread([this, prefix = prefix_, why] {
    YieldToWorkers();
    const auto start = std::chrono::steady_clock::now();
    mc::PersistReport report = mc::PersistMemoryCopies(prefix);
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    auto log = Logger("dtrun.agent");
    for (const std::string& path : report.written) {
      log->info("{}: persisted the checkpoint copy in memory to {}", why, path);
    }
    for (const std::string& note : report.notes)
      log->warn("{}: checkpoint copy in memory: {}", why, note);
    if (report.failed) failure_ = report.notes.front();
    failed_.store(report.failed);
    if (!report.written.empty())
      log->info("{}: {} file(s) persisted in {:.0f} ms", why,
                report.written.size(), ms);
    running_.store(false);
  });
}

// After the last attempt: any persisting (started when that attempt failed
// or was stopped by a signal) ends first, so a job that ends on SIGTERM
// leaves its newest copies on disk before their segments go.
void CheckpointCopies::Finish() {
  Join();
  if (failed_.load()) {
    Logger("dtrun.agent")
        ->error(
            "checkpoint copies in memory kept in /dev/shm ({}-*): they could "
            "not be persisted ({}); the next dtrun on this node persists "
            "them before its workers start, once the folder takes them",
            prefix_, failure_);
    mc::MarkKept(::getpid());
    return;
  }
  int removed = mc::RemoveMemoryCopies(prefix_);
  if (removed > 0) {
    Logger("dtrun.agent")
        ->info("removed {} checkpoint copies from shared memory", removed);
  }
}

}  // namespace dtrun::agent
