#pragma once

// Why a worker died, in words a person paged at night can act on: the
// kernel's log records (/dev/kmsg) read for the OOM killer's kill of a pid
// and NVIDIA's Xid lines, a memory cgroup's OOM counter and limit, a fatal
// signal's meaning and where its core went. Pure: text in, text out; the
// reading is KernelWitness's (kernel_witness.h).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrun::agent {

// One /dev/kmsg record: "PRI,SEQ,USEC,FLAGS[,...];TEXT\n[ KEY=VALUE\n]...".
struct KmsgRecord {
  uint64_t seq = 0;
  double uptime_s = 0;  // when the kernel logged it, seconds since boot
  std::string text;     // the message, without its key/value lines
};
// nullopt for anything that is not such a record.
std::optional<KmsgRecord> ParseKmsgRecord(std::string_view raw);

// What the OOM killer said of one pid: its "Killed process PID (COMM)
// total-vm:...kB, anon-rss:...kB" line and, when logged, the memory cgroup
// of its "oom-kill:...,task_memcg=/path,...,pid=PID" line.
struct OomKill {
  int pid = 0;
  std::string process;       // COMM
  int64_t total_vm_kb = -1;  // -1: not in the line
  int64_t anon_rss_kb = -1;
  std::string memcg;          // "" when not logged (a system-wide OOM)
  bool cgroup_limit = false;  // "Memory cgroup out of memory", not the host's
};
std::optional<OomKill> FindOomKill(const std::vector<KmsgRecord>& records,
                                   int pid);

// NVIDIA's driver reporting a GPU error: "NVRM: Xid (PCI:0000:3b:00): 79,
// pid=..., ...".
struct XidRecord {
  int code = 0;
  std::string text;  // the record as the kernel logged it
};
std::vector<XidRecord> FindXids(const std::vector<KmsgRecord>& records);
// What the common Xids mean and what to do ("" for others).
std::string XidMeaning(int code);
// "NVRM: Xid (...): 79, ... (Xid 79: the GPU has fallen off the bus; ...)".
std::string DescribeXid(const XidRecord& x);

// A memory cgroup's files, as the kernel spells them: the "oom_kill N" line
// of v2's memory.events and v1's memory.oom_control; -1 when absent.
int64_t ParseOomKillCount(const std::string& text);
// The memory cgroup's folder under `root` (/sys/fs/cgroup) for a
// /proc/<pid>/cgroup text: v1's "N:...memory...:/path" (root/memory/path)
// or else v2's "0::/path" (root/path); "" when neither.
std::string MemoryCgroupDir(const std::string& proc_cgroup,
                            const std::string& root);
// A limit file's bytes (v2's memory.max, v1's memory.limit_in_bytes); -1
// for "max", none, or v1's "no limit" (a page-rounded 2^63).
int64_t ParseMemoryLimit(const std::string& text);

// What the OOM kill of a worker is said as, from what could be read:
// How every OOM kill's account starts.
inline constexpr char kOomKilledBy[] = "killed by the kernel's OOM killer";
// "killed by the kernel's OOM killer (memory cgroup /jobs/a: limit 300 MB;
// anon-rss 299 MB at the kill; peak RSS 280 MB as dtrun saw it)". `kmsg` may
// be null (the counter alone told), `limit_bytes` and `peak_rss_mb` < 0
// when unknown.
std::string DescribeOomKill(const OomKill* kmsg, const std::string& memcg,
                            int64_t limit_bytes, double peak_rss_mb);

// SIGSEGV: "invalid memory access (a segmentation fault: a bad pointer, a
// stack overflow, a crash in native code)"; "" for signals without one.
std::string SignalMeaning(int signo);

// Where a fatal signal's core went: `core_dumped` from the wait status,
// `pattern` /proc/sys/kernel/core_pattern, `core_limit` the workers'
// RLIMIT_CORE (-1: unlimited), `found` the core file that exists, if any.
std::string DescribeCore(bool core_dumped, const std::string& pattern,
                         int64_t core_limit, const std::string& found);

}  // namespace dtrun::agent
