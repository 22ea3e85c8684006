#pragma once

// How a run ended, as torchrun counts it (its agent's metrics
// run.success.no_retries, run.success.with_retries, run.failed.no_retries,
// run.failed.with_retries), for the event log and for node_exporter's
// textfile collector (--metrics-textfile): a file of Prometheus's text
// format that the collector serves with the node's own metrics.

#include <string>

#include "rendezvous/util/status.h"

namespace dtrun::agent {

struct RunOutcome {
  std::string run_id;
  bool succeeded = false;
  int restarts = 0;  // restarts the run used (0: no retries)
  double start = 0;  // unix seconds
  double end = 0;
};

// The "dtrun.run" event: source AGENT, the outcome in the metadata
// ("success" or "failure", "no_retries" or "with_retries", restarts,
// duration).
std::string RunOutcomeEventJson(const RunOutcome& o);

// The textfile's text: dtrun_runs_total{outcome, retries} counters (this
// node's runs that wrote to this file, `previous` being its text before,
// "" for none: its counts carry on, and lines of it that do not parse are
// dropped), and gauges of the last run (success, restarts, start, end).
// Pure.
std::string OutcomeTextfile(const RunOutcome& o, const std::string& previous);

// Reads `path` (when it exists), adds `o`, and writes it back whole (a
// temporary name in the same folder, then a rename: the collector never
// reads half a file). Two dtruns ending at the same moment may lose one
// count (the last rename wins); a textfile per job avoids that.
Status WriteOutcomeTextfile(const std::string& path, const RunOutcome& o);

}  // namespace dtrun::agent
