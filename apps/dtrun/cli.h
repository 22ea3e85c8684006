#pragma once

#include <string>

#include "apps/dtrun/launch_config.h"

namespace dtrun::agent {

// Outcome of parsing the command line.
struct CliResult {
  int exit_code = -1;   // >= 0: exit now with it (help printed, or usage error)
  LaunchConfig config;  // valid when exit_code < 0
};

// Parses torchrun's flags (dash and underscore spellings, PET_* environment
// fallbacks) into a validated LaunchConfig, with SLURM_* filling flags not
// given. Usage errors are printed to stderr naming the flag, with exit code
// 2; --help, --version and --print-completion print and exit 0. Reads the
// environment and $PATH; starts nothing. Call once, from main's thread.
CliResult ParseCommandLine(int argc, const char* const* argv);

// "<program> <version> (git <commit>)", the first line of --version.
std::string VersionText(const std::string& program);

}  // namespace dtrun::agent
