#pragma once

#include <optional>
#include <string>

#include "apps/dtrun/launch_config.h"

namespace dtrun::agent {

// A question asked instead of a job, for main to answer: `dtrun --status
// [RUN] [--json]` or `dtrun --stacks RUN` (job_status.h runs them).
struct Query {
  enum class Kind { kNone, kStatus, kStacks };
  Kind kind = Kind::kNone;
  std::string target;  // run id, log folder or store host:port; "" for all
  bool json = false;   // --status --json
};

// Outcome of parsing the command line.
struct CliResult {
  // Set: exit now with it (help printed, or a usage error).
  std::optional<int> exit_code;
  Query query;          // else: a query, not a job...
  LaunchConfig config;  // ...else the job (its environment either way)
};

// Parses torchrun's flags (dash and underscore spellings, PET_* environment
// fallbacks) into a validated LaunchConfig, with SLURM_* filling flags not
// given. Usage errors are printed to stderr naming the flag, with exit code
// 2; --help, --version and --print-completion print and exit 0; --status
// and --stacks come back as a Query. Reads the environment and $PATH;
// starts nothing. Call once, from main's thread.
CliResult ParseCommandLine(int argc, const char* const* argv);

// "<program> <version> (git <commit>)", the first line of --version.
std::string VersionText(const std::string& program);

}  // namespace dtrun::agent
