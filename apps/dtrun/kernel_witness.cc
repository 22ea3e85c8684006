// Reading the kernel's account of a death: see kernel_witness.h.
#include "apps/dtrun/kernel_witness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

constexpr char kCgroupRoot[] = "/sys/fs/cgroup";
// A burst larger than this between two reads is cut: the kernel's ring
// holds a few thousand records, and a death needs the last ones.
constexpr int kMaxRecordsPerRead = 20000;
// Records kept for the lookups of deaths to come: a kill's record is read
// at its death, so only the last ones matter.
constexpr size_t kKeepRecords = 20000;

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

KernelWitness::KernelWitness() {
  fd_ = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    kmsg_error_ = std::string("/dev/kmsg: ") + std::strerror(errno);
    return;
  }
  // Only what is logged from now on: older kills are other processes'.
  ::lseek(fd_, 0, SEEK_END);
}

KernelWitness::~KernelWitness() {
  if (fd_ >= 0) ::close(fd_);
}

void KernelWitness::Watch(int pid) {
  Cgroup c;
  c.dir = MemoryCgroupDir(
      os::ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/cgroup"),
      kCgroupRoot);
  c.oom_kills = c.dir.empty() ? -1 : OomKills(c.dir);
  cgroups_[pid] = c;
}

int64_t KernelWitness::OomKills(const std::string& dir) {
  int64_t n = ParseOomKillCount(os::ReadFileOrEmpty(dir + "/memory.events"));
  if (n < 0)
    n = ParseOomKillCount(os::ReadFileOrEmpty(dir + "/memory.oom_control"));
  return n;
}

void KernelWitness::ReadNew() {
  if (fd_ < 0) return;
  char buf[8192];
  for (int i = 0; i < kMaxRecordsPerRead; ++i) {
    ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n < 0 && errno == EPIPE) continue;  // overwritten: the next one
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EAGAIN: nothing new
    auto r = ParseKmsgRecord(std::string_view(buf, static_cast<size_t>(n)));
    if (r) records_.push_back(std::move(*r));
  }
  if (records_.size() > 2 * kKeepRecords) {
    size_t drop = records_.size() - kKeepRecords;
    records_.erase(records_.begin(), records_.begin() + drop);
    xids_read_ = xids_read_ > drop ? xids_read_ - drop : 0;
  }
}

std::string KernelWitness::WhyDied(const WorkerExit& e, double peak_rss_mb,
                                   bool* oom) {
  *oom = false;
  std::string why;
  if (e.signal == SIGKILL) why = WhyKilled(e.pid, peak_rss_mb, oom);
  if (e.signal && e.signal != SIGKILL) why = WhyFatal(e);
  cgroups_.erase(e.pid);
  return why;
}

std::string KernelWitness::WhyKilled(int pid, double peak_rss_mb, bool* oom) {
  Cgroup c = cgroups_.count(pid) ? cgroups_[pid] : Cgroup{};
  int64_t now = c.dir.empty() ? -1 : OomKills(c.dir);
  bool counted = c.oom_kills >= 0 && now > c.oom_kills;
  // The OOM killer logs its kill right after sending it, so the victim can
  // be reaped a moment before the line is there: worth a short wait when
  // the cgroup counted a kill, never for the workers dtrun itself killed.
  ReadNew();
  std::optional<OomKill> kill = FindOomKill(records_, pid);
  for (int i = 0; i < 10 && fd_ >= 0 && counted && !kill; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ReadNew();
    kill = FindOomKill(records_, pid);
  }
  // The log names the pid. The counter of a cgroup the worker shares counts
  // any of its processes, but with the worker SIGKILLed at that moment it
  // is the likely one; and the log shows another pid namespace's numbers
  // (a container), so the counter alone is enough.
  *oom = kill.has_value() || counted;
  std::string memcg = c.dir.rfind(kCgroupRoot, 0) == 0
                          ? c.dir.substr(sizeof(kCgroupRoot) - 1)
                          : c.dir;
  if (memcg.rfind("/memory/", 0) == 0) memcg = memcg.substr(7);
  if (*oom) {
    int64_t limit =
        ParseMemoryLimit(Trim(os::ReadFileOrEmpty(c.dir + "/memory.max")));
    if (limit < 0)
      limit = ParseMemoryLimit(
          Trim(os::ReadFileOrEmpty(c.dir + "/memory.limit_in_bytes")));
    if (c.dir.empty()) limit = -1;
    return DescribeOomKill(kill ? &*kill : nullptr, memcg.empty() ? "/" : memcg,
                           limit, peak_rss_mb);
  }
  std::string counter =
      c.oom_kills < 0 ? "no memory cgroup OOM counter could be read" : "";
  if (fd_ < 0 && !counter.empty())
    return "could not check for the kernel's OOM killer (" + kmsg_error_ +
           "; " + counter + ")";
  if (fd_ < 0)
    return "not the kernel's OOM killer, by its memory cgroup's counter (" +
           kmsg_error_ + ")";
  return "not the kernel's OOM killer (its log names no kill of this pid): "
         "a scheduler, a person or a tool sent it";
}

std::string KernelWitness::WhyFatal(const WorkerExit& e) const {
  std::string meaning = SignalMeaning(e.signal);
  if (meaning.empty()) return "";
  rlimit core{};
  int64_t limit = -1;
  if (getrlimit(RLIMIT_CORE, &core) == 0 && core.rlim_cur != RLIM_INFINITY)
    limit = static_cast<int64_t>(core.rlim_cur);
  std::string pattern =
      Trim(os::ReadFileOrEmpty("/proc/sys/kernel/core_pattern"));
  std::string found;
  std::string plain = pattern;
  for (size_t at; (at = plain.find("%p")) != std::string::npos;)
    plain.replace(at, 2, std::to_string(e.pid));
  if (e.core_dumped && !plain.empty() && plain[0] != '|' &&
      plain.find('%') == std::string::npos) {
    // The plain patterns: "core", with core_uses_pid "core.PID", and PIDs.
    for (const std::string& name :
         {plain + "." + std::to_string(e.pid), plain}) {
      if (access(name.c_str(), F_OK) == 0) {
        found = name;
        break;
      }
    }
  }
  return meaning + "; " + DescribeCore(e.core_dumped, pattern, limit, found);
}

std::vector<std::string> KernelWitness::GpuErrors() {
  ReadNew();
  std::vector<KmsgRecord> fresh(records_.begin() + xids_read_, records_.end());
  xids_read_ = records_.size();
  std::vector<std::string> out;
  for (const XidRecord& x : FindXids(fresh)) out.push_back(DescribeXid(x));
  return out;
}

}  // namespace dtrun::agent
