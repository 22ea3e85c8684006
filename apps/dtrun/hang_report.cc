// Text of the --hang-timeout report: finding the stack in a worker's stderr,
// picking its first frames, and laying out the per-rank blocks. Pure: the
// shell that captures stacks and prints the report is hang_watch.cc.
#include "apps/dtrun/hang_report.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

namespace dtrun::agent {
namespace {

std::string Trim(const std::string& line) {
  size_t a = line.find_first_not_of(" \t");
  size_t b = line.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : line.substr(a, b - a + 1);
}

// Frame lines of the two stack sources dtrun reads: Python's fault handler
// ('File "x.py", line 3 in f') and eu-stack or gdb ("#0  0x... in f").
bool IsFrame(const std::string& trimmed) {
  return trimmed.rfind("File \"", 0) == 0 ||
         (trimmed.size() > 1 && trimmed[0] == '#' && trimmed[1] >= '0' &&
          trimmed[1] <= '9');
}

// Two decimals: silences are measured by a 50 ms check, so more digits would
// only be noise in the report.
std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

// "hung" vs "waiting" tells the reader which rank to look at: ranks at a
// later step are merely blocked in a collective on the root cause.
std::string State(const RankSilence& s) {
  if (s.exited) return "exited before the hang was declared";
  std::string out = s.hung ? "hung" : "waiting";
  out += s.beaten ? ": no heartbeat for " : ": no heartbeat yet, after ";
  out += Seconds(s.silent_s);
  if (s.step >= 0) out += ", last step " + std::to_string(s.step);
  return out;
}

// The function a native frame line names: gdb writes "#1  0x00.. in f (..)
// at x.cc:3" (no address for an inlined frame), eu-stack "#1  0x00.. f".
std::string NativeFunction(const std::string& frame) {
  std::istringstream in(frame);
  std::string word;
  in >> word;  // "#1"
  while (in >> word && (word.rfind("0x", 0) == 0 || word == "in")) {
  }
  return word.substr(0, word.find('('));
}

// Frames of the C and C++ runtimes (a system call, a futex or condition
// wait, a std::future): where every blocked thread ends up, so they tell
// nothing about which code is stuck.
bool IsRuntimeFrame(const std::string& frame) {
  for (const char* place : {"../sysdeps/", "./nptl/", "/usr/include/c++/",
                            "libstdc++.so", "libc.so", "libpthread"}) {
    if (frame.find(place) != std::string::npos) return true;
  }
  std::string f = NativeFunction(frame);
  for (const char* prefix : {"__", "std::", "pthread_"}) {
    if (f.rfind(prefix, 0) == 0) return true;
  }
  for (const char* call :
       {"syscall", "pause", "nanosleep", "clock_nanosleep", "poll",
        "epoll_wait", "select", "read", "recv", "futex_wait", "sched_yield"}) {
    if (f == call) return true;
  }
  return false;
}

// A native stack's frames from the last runtime frame above the first frame
// of the program's own code (all of them when every frame is the runtime's).
std::vector<std::string> SkipRuntime(std::vector<std::string> frames) {
  size_t own = 0;
  while (own < frames.size() && frames[own][0] == '#' &&
         IsRuntimeFrame(frames[own])) {
    ++own;
  }
  if (own == frames.size() || own < 2) return frames;
  frames.erase(frames.begin(), frames.begin() + (own - 1));
  return frames;
}

}  // namespace

std::string ExtractFaulthandlerDump(const std::string& text) {
  // The last dump, not the first: stderr.log is the whole attempt's stderr,
  // and the dump caused by dtrun's SIGABRT is the last thing a worker writes.
  size_t at = text.rfind("Fatal Python error:");
  return at == std::string::npos ? "" : text.substr(at);
}

std::vector<std::string> FirstFrames(const std::string& stack, size_t n) {
  // A Python dump lists every thread; the "Current thread" block is the one
  // that took the signal. Native dumps have no such marker and start with
  // their first thread.
  size_t from = stack.find("Current thread");
  std::istringstream in(from == std::string::npos ? stack : stack.substr(from));
  std::vector<std::string> out;
  std::string line;
  bool seen = false;
  // Native stacks: read the whole first thread, then skip the runtime's
  // frames at its top; Python's are the user's code from the first frame.
  const size_t want = from == std::string::npos ? SIZE_MAX : n;
  while (out.size() < want && std::getline(in, line)) {
    std::string t = Trim(line);
    if (IsFrame(t)) {
      out.push_back(t);
      seen = true;
      // Blank lines and the fault handler's "..." (a stack cut at 100 frames)
      // stay inside a thread; any other line ("Thread 0x...", "TID 7:") starts
      // the next one.
    } else if (seen && !t.empty() && t[0] != '.') {
      break;  // the first thread ended
    }
  }
  if (from == std::string::npos) out = SkipRuntime(std::move(out));
  if (out.size() > n) out.resize(n);
  return out;
}

bool StackWaits(const std::string& stack) {
  std::vector<std::string> frames = FirstFrames(stack, 4);
  if (frames.empty()) return false;
  if (frames[0].rfind("File \"", 0) == 0) {
    // Python, most recent call first: the call that blocks is the first.
    // Only that one: torch.distributed frames further down (the elastic
    // @record wrapper around main) say nothing about where the rank is.
    return frames[0].find("/torch/distributed/") != std::string::npos;
  }
  for (const std::string& f : frames) {
    if (IsRuntimeFrame(f)) continue;
    // dtrun's own DDP waits for its buckets' all-reduces in SyncGradients.
    for (const char* place :
         {"c10d::", "gloo::", "nccl", "ProcessGroup", "TCPStore",
          "TcpStoreClient::", "ShmAllReduce", "SyncGradients"}) {
      if (f.find(place) != std::string::npos) return true;
    }
  }
  return false;
}

std::string HangTraceback(const RankStack& r, size_t frames) {
  std::string out = State(r.silence);
  for (const std::string& f : FirstFrames(r.stack, frames)) out += "\n  " + f;
  if (!r.stack_file.empty()) out += "\nwhole stack: " + r.stack_file;
  if (!r.why_no_stack.empty()) out += "\nno stack: " + r.why_no_stack;
  return out;
}

std::string FormatHangReport(const std::vector<RankStack>& ranks,
                             double timeout_s, int attempt, size_t frames) {
  std::vector<RankSilence> silences;
  for (const RankStack& r : ranks) silences.push_back(r.silence);
  size_t root = HangRootCause(silences);
  // 60-column rules like torchrun's failure summary, which follows this
  // report when the group is given up.
  const std::string rule(60, '='), thin(60, '-');
  std::ostringstream o;
  o << rule << "\nHANG on attempt " << attempt
    << ": no heartbeat within --hang-timeout=" << Seconds(timeout_s) << "\n"
    << thin << "\n";
  auto block = [&](const RankStack& r, const char* label) {
    o << label << "rank " << r.rank << " (local_rank: " << r.silence.local_rank
      << ", pid: " << r.pid;
    if (!r.host.empty()) o << ", host: " << r.host;
    o << ")\n  ";
    std::string text = HangTraceback(r, frames);
    // Continuation lines are indented so each rank reads as one block.
    for (char c : text) o << c << (c == '\n' ? "  " : "");
    o << "\n";
  };
  // The root cause goes first: with many ranks, the others mostly repeat
  // "waiting" and the one that matters would scroll away.
  block(ranks[root], "Root cause (stopped first / lowest step): ");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i != root) block(ranks[i], "");
  }
  o << rule << "\n";
  return o.str();
}

// Stacks are keyed by global rank, as `dtrun --stacks` prints them; the
// silences beside them let a node that declared a hang weigh every rank of
// the job, not only its own.
std::string StackAnswerJson(const std::string& host,
                            const std::vector<RankStack>& ranks,
                            double now_unix) {
  nlohmann::json stacks = nlohmann::json::object();
  nlohmann::json facts = nlohmann::json::object();
  for (const RankStack& r : ranks) {
    const std::string key = std::to_string(r.rank);
    stacks[key] = r.stack;
    facts[key] = {{"local_rank", r.silence.local_rank},
                  {"pid", r.pid},
                  {"step", r.silence.step},
                  {"beaten", r.silence.beaten},
                  {"silent_s", r.silence.silent_s},
                  {"exited", r.silence.exited},
                  {"at", now_unix}};
  }
  // A stack may hold bytes that are not UTF-8 (a native frame's argument):
  // replaced, not thrown on.
  return nlohmann::json{{"host", host}, {"stacks", stacks}, {"ranks", facts}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<RankStack> RanksOfStackAnswer(const std::string& json,
                                          double now_unix, double timeout_s) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_object() || !j.contains("ranks") || !j["ranks"].is_object())
    return {};
  std::vector<RankStack> out;
  for (const auto& [key, f] : j["ranks"].items()) {
    RankStack r;
    try {
      r.rank = std::stoi(key);
      r.pid = f.value("pid", 0);
      r.host = j.value("host", std::string("?"));
      r.stack = j["stacks"].value(key, std::string());
      RankSilence& s = r.silence;
      s.local_rank = f.value("local_rank", 0);
      s.step = f.value("step", int64_t{-1});
      s.beaten = f.value("beaten", false);
      s.exited = f.value("exited", false);
      // The answering node measured the silence at `at`; it has grown since.
      s.silent_s = f.value("silent_s", 0.0) +
                   std::max(0.0, now_unix - f.value("at", now_unix));
    } catch (const std::exception&) {
      continue;  // not a rank this version wrote: left out
    }
    r.silence.hung = !r.silence.exited && r.silence.silent_s > timeout_s;
    r.silence.in_collective = StackWaits(r.stack);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace dtrun::agent
