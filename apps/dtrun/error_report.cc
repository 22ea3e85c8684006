// torchrun's error reporting (torchrun-compat.md section 6): reading the
// workers' @record error files, picking the root cause, printing the
// ChildFailedError summary and the root cause's JSON. Pure but for reading
// the error files; the agent decides when to print.
#include "apps/dtrun/error_report.h"

#include <signal.h>
#include <sys/stat.h>
#include <string.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/dtrun/exit_code.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

// torchrun's "time" field: local time with an underscore, so the value is
// one word for grep and awk.
std::string LocalTime(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string Indent(const std::string& text, const std::string& pad) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    out += (first ? "" : "\n" + pad) + line;
    first = false;
  }
  return out;
}

std::string Block(const WorkerFailure& f, size_t index,
                  const std::string& host) {
  std::ostringstream o;
  o << "[" << index << "]:\n"
    << "  time      : " << LocalTime(f.timestamp) << "\n"
    << "  host      : " << host << "\n"
    << "  rank      : " << f.rank << " (local_rank: " << f.local_rank << ")\n";
  // "-N" as torchrun prints it (Popen's negative return code), with the
  // signal's name added: "-9" alone sends users to a table.
  if (f.signal) {
    o << "  exitcode  : -" << f.signal << " (" << SignalName(f.signal)
      << ", pid: " << f.pid << ")\n";
  } else {
    o << "  exitcode  : " << f.exit_code << " (pid: " << f.pid << ")\n";
  }
  // dtrun's own line: what the kernel said, where it said more than -9.
  if (!f.cause.empty()) o << "  cause     : " << f.cause << "\n";
  o << "  error_file: " << (f.error_file.empty() ? "<N/A>" : f.error_file)
    << "\n";
  std::string trace;
  if (!f.traceback.empty()) {
    // Python's formatted traceback already ends with "Type: text"; append the
    // message only when it is not in there, so it is never shown twice.
    bool has_message =
        f.message.empty() || f.traceback.find(f.message) != std::string::npos;
    trace = has_message ? f.traceback : f.traceback + "\n" + f.message;
    while (!trace.empty() && trace.back() == '\n') trace.pop_back();
  } else if (!f.message.empty()) {
    trace = f.message;
  } else if (f.signal) {
    trace = "Signal " + std::to_string(f.signal) + " (" + SignalName(f.signal) +
            ") received by PID " + std::to_string(f.pid);
    // torchrun says "To enable traceback see: <url>" here; without an error
    // file the useful pointer is the worker's stderr, which dtrun has kept.
  } else {
    trace =
        "no error file was written; the worker's stderr (see above, or the log "
        "folder) says why it exited";
  }
  o << "  traceback : " << Indent(trace, "              ") << "\n";
  return o.str();
}

}  // namespace

// torch writes whole seconds ("1764180000"), so two ranks that fail in the
// same second tie, and the first detected (often the one that failed
// second, its peer's exit seen as a closed connection) would be named.
// The file's modification time, when it falls in that second, says which
// file came first.
namespace {
void RefineWholeSecond(const std::string& path, double* timestamp) {
  struct stat st;
  if (*timestamp <= 0 ||
      *timestamp != static_cast<double>(static_cast<int64_t>(*timestamp)) ||
      ::stat(path.c_str(), &st) != 0 || st.st_mtim.tv_sec != *timestamp) {
    return;
  }
  *timestamp += static_cast<double>(st.st_mtim.tv_nsec) * 1e-9;
}
}  // namespace

void ReadErrorFile(const std::string& path, WorkerFailure* f) {
  // No file is the normal case for workers without @record: error_file stays
  // empty and the summary says <N/A>, as torchrun's does.
  auto text = os::ReadFile(path);
  if (!text.ok()) return;
  f->error_file = path;
  nlohmann::json j =
      nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  // A worker killed while writing leaves half a file; show its start rather
  // than pretend there was none.
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) {
    f->message =
        "error file is not torchrun's JSON format: " + text->substr(0, 200);
    return;
  }
  // Two layouts exist: {"message": {"message", "extraInfo": {py_callstack,
  // timestamp}}} from @record, and {"message": "text", "timestamp": T} that
  // torch's readers also accept. The timestamp is a decimal string in
  // torch's files; a number is accepted too.
  const auto& m = j["message"];
  const nlohmann::json* ts =
      j.contains("timestamp") ? &j["timestamp"] : nullptr;
  if (m.is_string()) {
    f->message = m.get<std::string>();
  } else if (m.is_object()) {
    if (m.contains("message") && m["message"].is_string())
      f->message = m["message"];
    if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
      const auto& extra = m["extraInfo"];
      if (extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
        f->traceback = extra["py_callstack"];
      }
      if (extra.contains("timestamp")) ts = &extra["timestamp"];
    }
  }
  if (ts && ts->is_string()) {
    f->timestamp = std::atof(ts->get<std::string>().c_str());
  } else if (ts && ts->is_number()) {
    f->timestamp = ts->get<double>();
  }
  RefineWholeSecond(path, &f->timestamp);
}

size_t RootCause(const std::vector<WorkerFailure>& failures) {
  // Strictly earlier wins, so on a tie the failure seen first (failures come
  // in detection order) stays the root cause.
  size_t best = 0;
  for (size_t i = 1; i < failures.size(); ++i) {
    if (failures[i].timestamp < failures[best].timestamp) best = i;
  }
  return best;
}

int ExitCodeFor(const WorkerFailure& f) {
  // Unlike torchrun, which exits 1 for every failure, dtrun passes the root
  // cause's code on (128 + signal, the shell's convention), so a script or
  // scheduler can tell an OOM kill from a Python exception.
  if (f.signal) return ExitBySignal(f.signal);
  // A worker that failed without a code of its own (torchrun says 1).
  return f.exit_code == 0 ? 1 : f.exit_code;
}

std::string SignalName(int signo) {
  // sigabbrev_np (glibc 2.32) is thread-safe and gives the short name, where
  // strsignal gives a translated description; real-time signals have none.
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev
                : "signal " + std::to_string(signo);
}

std::string FormatFailureSummary(const std::string& entrypoint,
                                 const std::string& host,
                                 const std::vector<WorkerFailure>& failures,
                                 int attempts, const std::string& log_dir,
                                 int max_restarts,
                                 const std::vector<std::string>& gpu_errors) {
  const std::string rule(60, '='), thin(60, '-');
  size_t root = RootCause(failures);
  std::ostringstream o;
  o << rule << "\n" << entrypoint << " FAILED\n" << thin << "\nFailures:\n";
  // torchrun's layout: the other failures numbered from 1, the root cause as
  // [0] in its own section; the attempts, logs and exit code lines are dtrun's.
  size_t index = 1;
  for (size_t i = 0; i < failures.size(); ++i) {
    if (i != root) o << Block(failures[i], index++, host);
  }
  if (failures.size() == 1) o << "  <NO_OTHER_FAILURES>\n";
  o << thin << "\nRoot Cause (first observed failure):\n"
    << Block(failures[root], 0, host);
  for (const std::string& x : gpu_errors) o << "gpu error : " << x << "\n";
  o << thin << "\nattempts  : " << attempts
    << " (--max-restarts=" << (max_restarts < 0 ? attempts - 1 : max_restarts)
    << ")\n";
  if (!log_dir.empty()) o << "logs      : " << log_dir << "\n";
  o << "exit code : " << ExitCodeFor(failures[root]) << " (the root cause's)\n"
    << rule << "\n";
  return o.str();
}

std::string RootCauseJson(const WorkerFailure& f) {
  // The worker's JSON is copied as written, fields dtrun does not know
  // included; errorCode goes inside "message", so a plain-string message is
  // first turned into an object. No file: torchrun's "<NONE>" placeholder.
  nlohmann::json j;
  if (!f.error_file.empty()) {
    std::ifstream in(f.error_file);
    j = nlohmann::json::parse(in, nullptr, false);
  }
  if (j.is_discarded() || !j.is_object()) {
    j = {{"message",
          {{"message", f.message.empty() ? "<NONE>" : f.message},
           {"extraInfo",
            {{"timestamp",
              std::to_string(static_cast<int64_t>(f.timestamp))}}}}}};
  }
  if (j["message"].is_string()) {
    j["message"] = {{"message", j["message"]}};
  }
  j["message"]["errorCode"] = ExitCodeFor(f);
  return j.dump();
}

}  // namespace dtrun::agent
