#pragma once

#include <string>

#include "apps/dtrun/job.h"
#include "apps/dtrun/launch_config.h"

namespace dtrun::agent {

// `dtrun --interactive`: writes the session's Python package (embedded in
// the binary) to a session folder, then
//  - with a console: forks; the child, in a process group of its own (so the
//    terminal's Ctrl-C reaches only the console), runs the launcher with the
//    workers and logs to <session>/dtrun.log; the parent becomes the Python
//    console once the store listens, and stops the launcher when it leaves;
//  - with --no-console: runs the launcher here and prints one line
//    "dtrun-interactive: host H port P world N dir D" once the store listens.
// `config` has been through Validate(); `run_job` runs the session's job
// (main() picks which). Returns dtrun's exit code (the console's, in
// console mode).
using RunJobFn =
    std::function<int(const LaunchConfig& config, Job::StoreReady ready)>;
int RunInteractive(const LaunchConfig& config, const RunJobFn& run_job);

// --gpu-ids: "" if `ids` (comma-separated) names `nproc` or more distinct
// GPUs below `visible`, else what is wrong with it.
std::string CheckGpuIds(const std::string& ids, int nproc, int visible,
                        bool through_cuda_visible_devices = false);

}  // namespace dtrun::agent
