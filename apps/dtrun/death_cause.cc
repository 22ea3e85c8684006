// A worker's death in words: see death_cause.h.
#include "apps/dtrun/death_cause.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace dtrun::agent {
namespace {

// The number after `key` in `text` ("total-vm:" -> 324052), -1 if absent.
int64_t NumberAfter(const std::string& text, const std::string& key) {
  size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::strtoll(text.c_str() + at + key.size(), nullptr, 10);
}

// The value of `key=` in a comma-separated "k=v,k=v" line, "" if absent.
std::string Field(const std::string& text, const std::string& key) {
  size_t at = text.find("," + key + "=");
  if (at == std::string::npos) {
    at = text.find(":" + key + "=");
    if (at == std::string::npos) return "";
  }
  at += key.size() + 2;
  return text.substr(at, text.find(',', at) - at);
}

std::string Mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f MB", bytes / (1 << 20));
  return buf;
}

}  // namespace

std::optional<KmsgRecord> ParseKmsgRecord(std::string_view raw) {
  size_t semi = raw.find(';');
  if (semi == std::string_view::npos) return std::nullopt;
  std::string head(raw.substr(0, semi));
  KmsgRecord r;
  unsigned long long seq = 0, usec = 0;
  int pri = 0;
  if (std::sscanf(head.c_str(), "%d,%llu,%llu", &pri, &seq, &usec) != 3)
    return std::nullopt;
  r.seq = seq;
  r.uptime_s = static_cast<double>(usec) / 1e6;
  std::string_view text = raw.substr(semi + 1);
  r.text = std::string(text.substr(0, text.find('\n')));
  return r;
}

std::optional<OomKill> FindOomKill(const std::vector<KmsgRecord>& records,
                                   int pid) {
  const std::string killed = "Killed process " + std::to_string(pid) + " (";
  const std::string pid_field = ",pid=" + std::to_string(pid) + ",";
  std::optional<OomKill> out;
  std::string memcg;
  for (const KmsgRecord& r : records) {
    // The summary line comes before the kill line, in one OOM event.
    if (r.text.rfind("oom-kill:", 0) == 0 &&
        (r.text + ",").find(pid_field) != std::string::npos) {
      memcg = Field(r.text, "task_memcg");
    }
    size_t at = r.text.find(killed);
    if (at == std::string::npos) continue;
    OomKill k;
    k.pid = pid;
    size_t name = at + killed.size();
    k.process = r.text.substr(name, r.text.find(')', name) - name);
    k.total_vm_kb = NumberAfter(r.text, "total-vm:");
    k.anon_rss_kb = NumberAfter(r.text, "anon-rss:");
    k.cgroup_limit = r.text.find("Memory cgroup out of memory") == 0;
    k.memcg = memcg;
    out = k;
  }
  return out;
}

std::vector<XidRecord> FindXids(const std::vector<KmsgRecord>& records) {
  std::vector<XidRecord> out;
  for (const KmsgRecord& r : records) {
    size_t at = r.text.find("NVRM: Xid (");
    if (at == std::string::npos) continue;
    size_t colon = r.text.find("): ", at);
    if (colon == std::string::npos) continue;
    XidRecord x;
    x.code = std::atoi(r.text.c_str() + colon + 3);
    x.text = r.text.substr(at);
    out.push_back(x);
  }
  return out;
}

std::string XidMeaning(int code) {
  // NVIDIA's Xid catalogue, the ones training jobs meet most, with the
  // action its guidance gives.
  switch (code) {
    case 13:
      return "graphics engine exception: usually the program (an "
             "out-of-range access in a kernel); rerun it under "
             "compute-sanitizer";
    case 31:
      return "GPU memory page fault: usually the program (an illegal "
             "address), else the driver";
    case 43:
      return "the GPU stopped the program's work (a fault of the "
             "program's); the GPU itself is fine";
    case 48:
      return "double-bit ECC error: uncorrectable memory error; drain the "
             "node and reset the GPU";
    case 63:
      return "ECC page retirement or row remapping recorded; reset the GPU "
             "when convenient";
    case 64:
      return "ECC page retirement or row remapping failed; the GPU needs "
             "service";
    case 74:
      return "NVLink error; check the links, reset the GPU, else service it";
    case 79:
      return "the GPU has fallen off the bus; drain the node and have it "
             "serviced";
    case 94:
      return "contained ECC error: the affected program was stopped, the GPU "
             "goes on";
    case 95:
      return "uncontained ECC error: every program on the GPU is affected; "
             "reset the GPU";
  }
  return "";
}

std::string DescribeXid(const XidRecord& x) {
  std::string meaning = XidMeaning(x.code);
  if (meaning.empty()) return x.text;
  return x.text + " (Xid " + std::to_string(x.code) + ": " + meaning + ")";
}

int64_t ParseOomKillCount(const std::string& text) {
  std::istringstream in(text);
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return -1;
}

std::string MemoryCgroupDir(const std::string& proc_cgroup,
                            const std::string& root) {
  std::istringstream in(proc_cgroup);
  std::string line, unified;
  while (std::getline(in, line)) {
    size_t a = line.find(':');
    size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (path == "/") path.clear();
    if (controllers.empty()) unified = root + path;
    std::istringstream names(controllers);
    std::string name;
    while (std::getline(names, name, ',')) {
      if (name == "memory") return root + "/memory" + path;
    }
  }
  return unified;
}

int64_t ParseMemoryLimit(const std::string& text) {
  if (text.empty() || text.rfind("max", 0) == 0) return -1;
  long long v = std::strtoll(text.c_str(), nullptr, 10);
  // v1 spells "no limit" as 2^63 rounded down to a page.
  if (v <= 0 || v >= (1LL << 62)) return -1;
  return v;
}

std::string DescribeOomKill(const OomKill* kmsg, const std::string& memcg,
                            int64_t limit_bytes, double peak_rss_mb) {
  std::vector<std::string> parts;
  std::string where = kmsg && !kmsg->memcg.empty() ? kmsg->memcg : memcg;
  if (!where.empty() || limit_bytes > 0) {
    std::string cg = "memory cgroup " + (where.empty() ? "?" : where);
    if (limit_bytes > 0)
      cg += ": limit " + Mb(static_cast<double>(limit_bytes));
    parts.push_back(cg);
  } else if (kmsg && !kmsg->cgroup_limit) {
    parts.push_back("the host ran out of memory");
  }
  if (kmsg && kmsg->anon_rss_kb >= 0)
    parts.push_back("anon-rss " + Mb(kmsg->anon_rss_kb * 1024.0) +
                    " at the kill");
  if (peak_rss_mb > 0)
    parts.push_back("peak RSS " + Mb(peak_rss_mb * (1 << 20)) +
                    " as dtrun saw it");
  std::string out = kOomKilledBy;
  for (size_t i = 0; i < parts.size(); ++i)
    out += (i == 0 ? " (" : "; ") + parts[i];
  return parts.empty() ? out : out + ")";
}

std::string SignalMeaning(int signo) {
  switch (signo) {
    case SIGSEGV:
      return "invalid memory access (a segmentation fault: a bad pointer or "
             "a stack overflow in native code)";
    case SIGBUS:
      return "bus error (a memory-mapped file shrunk under it, /dev/shm "
             "full, or a misaligned access)";
    case SIGILL:
      return "illegal instruction (code built for a newer CPU than this "
             "one, or a corrupted binary)";
    case SIGABRT:
      return "aborted (a failed assertion, an uncaught C++ exception, or "
             "glibc's heap checks)";
    case SIGFPE:
      return "arithmetic error (an integer division by zero)";
  }
  return "";
}

std::string DescribeCore(bool core_dumped, const std::string& pattern,
                         int64_t core_limit, const std::string& found) {
  if (!core_dumped) {
    if (core_limit == 0)
      return "no core dumped (ulimit -c is 0: run `ulimit -c unlimited` "
             "before dtrun to keep one)";
    return "no core dumped";
  }
  if (!pattern.empty() && pattern[0] == '|') {
    std::string program = pattern.substr(1, pattern.find(' ') - 1);
    std::string out = "core piped to " + program;
    if (program.find("systemd-coredump") != std::string::npos)
      out += " (coredumpctl list shows it)";
    return out;
  }
  if (!found.empty()) return "core dumped to " + found;
  return "core dumped as core_pattern '" + pattern +
         "' says (relative to the worker's folder)";
}

}  // namespace dtrun::agent
