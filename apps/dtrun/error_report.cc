#include "apps/dtrun/error_report.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace dtrun::agent {
namespace {

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

std::string Block(const WorkerFailure& f, size_t index, const std::string& host) {
  std::ostringstream o;
  o << "[" << index << "]:\n"
    << "  time      : " << LocalTime(f.timestamp) << "\n"
    << "  host      : " << host << "\n"
    << "  rank      : " << f.rank << " (local_rank: " << f.local_rank << ")\n";
  if (f.signal) {
    o << "  exitcode  : -" << f.signal << " (" << SignalName(f.signal) << ", pid: " << f.pid << ")\n";
  } else {
    o << "  exitcode  : " << f.exit_code << " (pid: " << f.pid << ")\n";
  }
  o << "  error_file: " << (f.error_file.empty() ? "<N/A>" : f.error_file) << "\n";
  std::string trace;
  if (!f.traceback.empty()) {
    bool has_message = f.message.empty() || f.traceback.find(f.message) != std::string::npos;
    trace = has_message ? f.traceback : f.traceback + "\n" + f.message;
    while (!trace.empty() && trace.back() == '\n') trace.pop_back();
  } else if (!f.message.empty()) {
    trace = f.message;
  } else if (f.signal) {
    trace = "Signal " + std::to_string(f.signal) + " (" + SignalName(f.signal) +
            ") received by PID " + std::to_string(f.pid);
  } else {
    trace = "no error file was written; the worker's stderr (see above, or the log "
            "folder) says why it exited";
  }
  o << "  traceback : " << Indent(trace, "              ") << "\n";
  return o.str();
}

}  // namespace

void ReadErrorFile(const std::string& path, WorkerFailure* f) {
  std::ifstream in(path);
  if (!in) return;
  f->error_file = path;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) {
    f->message = "error file is not torchrun's JSON format: " + text.str().substr(0, 200);
    return;
  }
  const auto& m = j["message"];
  const nlohmann::json* ts = j.contains("timestamp") ? &j["timestamp"] : nullptr;
  if (m.is_string()) {
    f->message = m.get<std::string>();
  } else if (m.is_object()) {
    if (m.contains("message") && m["message"].is_string()) f->message = m["message"];
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
}

size_t RootCause(const std::vector<WorkerFailure>& failures) {
  size_t best = 0;
  for (size_t i = 1; i < failures.size(); ++i) {
    if (failures[i].timestamp < failures[best].timestamp) best = i;
  }
  return best;
}

int ExitCodeFor(const WorkerFailure& f) {
  if (f.signal) return 128 + f.signal;
  return f.exit_code == 0 ? 1 : f.exit_code;
}

std::string SignalName(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

std::string FormatFailureSummary(const std::string& entrypoint, const std::string& host,
                                 const std::vector<WorkerFailure>& failures, int attempts,
                                 const std::string& log_dir) {
  const std::string rule(60, '='), thin(60, '-');
  size_t root = RootCause(failures);
  std::ostringstream o;
  o << rule << "\n" << entrypoint << " FAILED\n" << thin << "\nFailures:\n";
  size_t index = 1;
  for (size_t i = 0; i < failures.size(); ++i) {
    if (i != root) o << Block(failures[i], index++, host);
  }
  if (failures.size() == 1) o << "  <NO_OTHER_FAILURES>\n";
  o << thin << "\nRoot Cause (first observed failure):\n" << Block(failures[root], 0, host);
  o << thin << "\nattempts  : " << attempts << " (--max-restarts=" << attempts - 1 << ")\n";
  if (!log_dir.empty()) o << "logs      : " << log_dir << "\n";
  o << "exit code : " << ExitCodeFor(failures[root]) << " (the root cause's)\n" << rule << "\n";
  return o.str();
}

std::string RootCauseJson(const WorkerFailure& f) {
  nlohmann::json j;
  if (!f.error_file.empty()) {
    std::ifstream in(f.error_file);
    j = nlohmann::json::parse(in, nullptr, false);
  }
  if (j.is_discarded() || !j.is_object()) {
    j = {{"message", {{"message", f.message.empty() ? "<NONE>" : f.message},
                      {"extraInfo", {{"timestamp", std::to_string(static_cast<int64_t>(f.timestamp))}}}}}};
  }
  if (j["message"].is_string()) {
    j["message"] = {{"message", j["message"]}};
  }
  j["message"]["errorCode"] = ExitCodeFor(f);
  return j.dump();
}

}  // namespace dtrun::agent
