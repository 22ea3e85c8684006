#pragma once

// torchrun's flags (and dtrun's own) declared on CLI11: both spellings
// (--nproc-per-node, --nproc_per_node), the PET_* environment fallbacks,
// help text and groups. What needs more than CLI11's conversions is kept
// raw (RawFlags) for cli.cc to check and apply.

#include <string>

#include <CLI/CLI.hpp>

#include "apps/dtrun/launch_config.h"

namespace dtrun::agent {

// Raw text of the flags whose values need more than CLI11's conversions.
struct RawFlags {
  std::string nproc = "1", nnodes = "1:1", redirects = "0", tee = "0",
              rdzv_conf, rdzv_backend = "static", rdzv_endpoint,
              store_proxy = "auto", restart = "group";
  std::string local_ranks_filter;
  std::string signals_to_handle, duplicate_stdout_filters,
      duplicate_stderr_filters, logs_specs;
  double term_timeout_s = 30;
  double hang_timeout_s = 0, hang_first_beat_s = 0;
  int master_port = -1;
};

// Declares every job flag on `app`, into `c` and `raw`.
void AddFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw);

// Whether the user gave `dashed` on the command line or through PET_*. Either
// way it is the user's choice, which SLURM's defaults must not override.
bool Given(CLI::App& app, const std::string& dashed);

}  // namespace dtrun::agent
