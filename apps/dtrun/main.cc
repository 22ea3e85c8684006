// dtrun: a drop-in for torchrun. Composition root only: parse the command
// line, answer a query (--status, --stacks) or pick the job, build the real
// objects, run, return the exit code.
#include <cstdio>
#include <memory>

#include "apps/dtrun/cli.h"
#include "apps/dtrun/clock.h"
#include "apps/dtrun/elastic_job.h"
#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/interactive.h"
#include "apps/dtrun/job_status.h"
#include "apps/dtrun/posix_worker_group.h"
#include "apps/dtrun/single_node_job.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/name_lookup.h"

namespace {

using namespace dtrun::agent;

// Builds and runs the job. Everything here is made inside the call, not in
// main: with --interactive this runs in the process the console forked, and
// the job starts threads (the store's) that must not exist before a fork.
// `workers` and `clock` are declared first so they outlive the job that
// points at them.
int RunJob(const LaunchConfig& config, Job::StoreReady ready) {
  PosixWorkerGroup workers;
  SteadyClock clock;
  std::unique_ptr<Job> job;
  // Several nodes or c10d need rendezvous rounds; one node with the static
  // backend runs its own store and counts restarts locally.
  if (config.uses_rendezvous()) {
    job = std::make_unique<ElasticJob>(config, &workers, &clock);
  } else {
    job = std::make_unique<SingleNodeJob>(config, &workers, &clock);
  }
  job->on_store_ready = std::move(ready);
  return job->Run();
}

}  // namespace

int main(int argc, char** argv) {
  // Before any lookup and any thread (name_lookup.h).
  dtrun::os::UseBuiltinNameLookup();
  CliResult cli = ParseCommandLine(argc, argv);
  if (cli.exit_code) return *cli.exit_code;
  const Query& q = cli.query;
  if (q.kind == Query::Kind::kStatus)
    return RunStatusCommand(q.target, q.json, cli.config.environment);
  if (q.kind == Query::Kind::kStacks)
    return RunStacksCommand(q.target, cli.config.environment);
  // After parsing, so usage errors print before any logger exists; an empty
  // --log-level falls back to DTRUN_LOG_LEVEL, then info.
  if (!dtrun::SetLogLevel(cli.config.log_level)) {
    std::fprintf(
        stderr,
        "dtrun: --log-level: unknown level '%s'; use trace, debug, info, "
        "warn, error or off\n",
        cli.config.log_level.c_str());
    return kExitUsage;
  }
  // The session forks: the child runs RunJob, this process becomes the
  // Python console.
  if (cli.config.interactive) return RunInteractive(cli.config, RunJob);
  return RunJob(cli.config, nullptr);
}
