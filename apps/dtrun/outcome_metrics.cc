#include "apps/dtrun/outcome_metrics.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

const char* Outcome(const RunOutcome& o) {
  return o.succeeded ? "success" : "failure";
}
const char* Retries(const RunOutcome& o) {
  return o.restarts > 0 ? "with_retries" : "no_retries";
}

// Label values are ours (a run id is not): escaped as the format asks.
std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// dtrun_runs_total{outcome="...",retries="..."} N lines of `text`.
std::map<std::string, uint64_t> PreviousCounts(const std::string& text) {
  std::map<std::string, uint64_t> counts;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("dtrun_runs_total{", 0) != 0) continue;
    const size_t close = line.find("} ");
    if (close == std::string::npos) continue;
    uint64_t n = 0;
    if (std::sscanf(line.c_str() + close + 2, "%" SCNu64, &n) != 1) continue;
    counts[line.substr(0, close + 1)] = n;
  }
  return counts;
}

}  // namespace

std::string RunOutcomeEventJson(const RunOutcome& o) {
  nlohmann::json md = {{"run_id", o.run_id},
                       {"outcome", Outcome(o)},
                       {"retries", Retries(o)},
                       {"restarts", o.restarts},
                       {"duration", o.end - o.start}};
  nlohmann::json j = {{"name", "dtrun.run"},
                      {"source", "AGENT"},
                      {"timestamp", static_cast<int64_t>(o.end)},
                      {"metadata", md}};
  return j.dump();
}

// Every series of dtrun_runs_total is written from the first run on, at 0
// where nothing was counted yet: a rate() or increase() over a series that
// appears later misses its first increment.
std::string OutcomeTextfile(const RunOutcome& o, const std::string& previous) {
  std::map<std::string, uint64_t> counts = PreviousCounts(previous);
  for (const char* outcome : {"success", "failure"}) {
    for (const char* retries : {"no_retries", "with_retries"}) {
      const std::string key = std::string("dtrun_runs_total{outcome=\"") +
                              outcome + "\",retries=\"" + retries + "\"}";
      counts[key] += 0;  // every series present from the first run
    }
  }
  counts[std::string("dtrun_runs_total{outcome=\"") + Outcome(o) +
         "\",retries=\"" + Retries(o) + "\"}"] += 1;
  std::ostringstream out;
  out << "# HELP dtrun_runs_total dtrun runs on this node that ended, by "
         "outcome and whether they restarted (torchrun's run.success / "
         "run.failed, no_retries / with_retries).\n"
         "# TYPE dtrun_runs_total counter\n";
  for (const auto& [series, n] : counts) out << series << " " << n << "\n";
  const std::string run = "{run_id=\"" + LabelValue(o.run_id) + "\"}";
  char buf[64];
  out << "# HELP dtrun_last_run_success Whether the last run succeeded.\n"
         "# TYPE dtrun_last_run_success gauge\n"
      << "dtrun_last_run_success" << run << " " << (o.succeeded ? 1 : 0) << "\n"
      << "# HELP dtrun_last_run_restarts Restarts the last run used.\n"
         "# TYPE dtrun_last_run_restarts gauge\n"
      << "dtrun_last_run_restarts" << run << " " << o.restarts << "\n";
  std::snprintf(buf, sizeof(buf), "%.3f", o.start);
  out << "# HELP dtrun_last_run_start_timestamp_seconds When the last run "
         "started.\n"
         "# TYPE dtrun_last_run_start_timestamp_seconds gauge\n"
      << "dtrun_last_run_start_timestamp_seconds" << run << " " << buf << "\n";
  std::snprintf(buf, sizeof(buf), "%.3f", o.end);
  out << "# HELP dtrun_last_run_end_timestamp_seconds When the last run "
         "ended.\n"
         "# TYPE dtrun_last_run_end_timestamp_seconds gauge\n"
      << "dtrun_last_run_end_timestamp_seconds" << run << " " << buf << "\n";
  return out.str();
}

Status WriteOutcomeTextfile(const std::string& path, const RunOutcome& o) {
  Result<std::string> previous = os::ReadFile(path);
  const std::string text =
      OutcomeTextfile(o, previous.ok() ? *previous : std::string());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Status s = os::WriteFile(tmp, text);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Status::Io("--metrics-textfile: renaming " + tmp + " to " + path +
                   " failed");
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

}  // namespace dtrun::agent
