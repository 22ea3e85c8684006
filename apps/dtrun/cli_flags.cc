// The job flags' declarations (cli_flags.h).
#include "apps/dtrun/cli_flags.h"

#include <cctype>
#include <cstdlib>
#include <thread>

#include "apps/dtrun/completion.h"
#include "apps/dtrun/cpu_quota.h"

namespace dtrun::agent {
namespace {

// "--nproc-per-node,--nproc_per_node" for a dashed flag name. Old torchrun
// documents the underscores, new the dashes; scripts in the wild use both.
std::string BothSpellings(const std::string& dashed) {
  std::string under = dashed;
  for (size_t i = 2; i < under.size(); ++i) {
    if (under[i] == '-') under[i] = '_';
  }
  return under == dashed ? dashed : dashed + "," + under;
}

// torchrun reads any option from PET_<DEST> when it is not on the command line.
std::string PetName(const std::string& dashed) {
  std::string name = "PET_";
  for (size_t i = 2; i < dashed.size(); ++i) {
    name += dashed[i] == '-' ? '_' : static_cast<char>(std::toupper(dashed[i]));
  }
  return name;
}

// A flag that takes a value, in both spellings; repeated, the last value
// wins, as with argparse.
template <typename T>
CLI::Option* Option(CLI::App& app, const std::string& dashed, T& target,
                    const std::string& help, const std::string& group,
                    const std::string& shortname = "") {
  std::string names =
      (shortname.empty() ? "" : shortname + ",") + BothSpellings(dashed);
  return app.add_option(names, target, help)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->group(group);
}

// Precedence as in torchrun: the command line, then PET_<NAME>, then the
// default (CLI11's envname is only read when the flag is absent).
template <typename T>
CLI::Option* Flag(CLI::App& app, const std::string& dashed, T& target,
                  const std::string& help, const std::string& group,
                  const std::string& shortname = "") {
  return Option(app, dashed, target, help, group, shortname)
      ->envname(PetName(dashed));
}

CLI::Option* Switch(CLI::App& app, const std::string& dashed, bool& target,
                    const std::string& help, const std::string& group,
                    const std::string& shortname = "") {
  std::string names =
      (shortname.empty() ? "" : shortname + ",") + BothSpellings(dashed);
  return app.add_flag(names, target, help)
      ->envname(PetName(dashed))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->group(group);
}

// --standby-import and --standby (apps/dtrun/standby.h).
void AddStandbyFlags(CLI::App& app, LaunchConfig& c,
                     const std::string& workers) {
  Flag(app, "--standby-import", c.standby_import,
       "Python workers: keep a standby process that has imported these "
       "modules (comma-separated, e.g. torch,numpy) and fork restarted "
       "workers from it, skipping their imports",
       workers);
  Switch(app, "--standby", c.standby,
         "keep a standby of the worker program and fork restarted workers from "
         "it: a native program built on dtrun's lib skips its start (libtorch "
         "loaded once); Python workers: as "
         "--standby-import=torch,torch.distributed",
         workers);
}

void AddWorkerFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw) {
  const std::string workers = "Workers";
  Flag(app, "--nproc-per-node", raw.nproc,
       "workers on this node: N, cpu, gpu, xpu, hpu, npu or auto (default 1)",
       workers);
  Switch(app, "--module", c.module,
         "run the entrypoint as a Python module (python -m)", workers, "-m");
  Switch(app, "--no-python", c.no_python,
         "run the entrypoint directly, never through python", workers);
  Switch(app, "--run-path", c.run_path, "run the entrypoint file with python",
         workers);
  Switch(app, "--interactive", c.interactive,
         "start Python workers with torch.distributed set up and a console "
         "that runs code on chosen ranks (no PROGRAM)",
         workers);
  Switch(app, "--no-console", c.no_console,
         "with --interactive: no console; print the session's store address "
         "(for the Jupyter extension or a console elsewhere)",
         workers);
  Flag(app, "--gpu-ids", c.gpu_ids,
       "with --interactive: GPU of each local rank, e.g. 0,2 (indices into "
       "CUDA_VISIBLE_DEVICES when set)",
       workers);
  Flag(app, "--python", c.python,
       "python interpreter for .py/-m entrypoints (default: $PYTHON_EXEC, "
       "the Python that ran `python -m dtrun`, the python3 of the venv or "
       "conda environment dtrun is installed in, else python3 from PATH)",
       workers);
  AddStandbyFlags(app, c, workers);
  Flag(app, "--role", c.role, "worker role name (ROLE_NAME)", workers)
      ->capture_default_str();
  // torchrun's fork/spawn/forkserver choose how Python makes workers; dtrun
  // always fork+execs a fresh process, so the value is checked and unused.
  Flag(app, "--start-method", c.start_method,
       "spawn, fork or forkserver: checked for torchrun compatibility; "
       "workers are always new processes",
       workers);
  Switch(app, "--virtual-local-rank", c.virtual_local_rank,
         "every worker sees LOCAL_RANK=0 and only its own GPU in "
         "CUDA_VISIBLE_DEVICES",
         workers);
  // torchrun gives --numa-binding no PET_ fallback.
  Option(app, "--numa-binding", c.numa_binding,
         "bind each worker's CPUs near its GPU (or spread over NUMA nodes on "
         "a CPU job): node, socket, exclusive or core-complex",
         workers);
}

void AddRendezvousFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw) {
  const std::string rdzv = "Rendezvous";
  Flag(app, "--nnodes", raw.nnodes,
       "number of nodes: N or MIN:MAX (default 1:1)", rdzv);
  Flag(app, "--node-rank", c.node_rank,
       "rank of this node for static rendezvous", rdzv)
      ->capture_default_str();
  Flag(app, "--master-addr", c.master_addr,
       "address of the node that hosts the store", rdzv)
      ->capture_default_str();
  // Read as an int with -1 for "not given": a single node then picks a free
  // port (two jobs on one host must not collide on 29500, pytorch#73320),
  // which an explicit 29500 must not do.
  Flag(app, "--master-port", raw.master_port,
       "store port (default: a free port on a single node, else 29500)", rdzv);
  Switch(app, "--standalone", c.standalone,
         "single-node job on free ports, with a fresh run id", rdzv);
  Flag(app, "--rdzv-backend", raw.rdzv_backend,
       "static, c10d, or etcd-v2 (alias etcd): rounds on an etcd cluster", rdzv)
      ->capture_default_str();
  Flag(app, "--rdzv-endpoint", raw.rdzv_endpoint,
       "host[:port] of the rendezvous store; etcd: one or more members, "
       "h1:2379,h2:2379",
       rdzv);
  Flag(app, "--rdzv-id", c.rdzv_id, "job id (TORCHELASTIC_RUN_ID)", rdzv)
      ->capture_default_str();
  Flag(app, "--rdzv-conf", raw.rdzv_conf, "rendezvous settings k=v,k=v", rdzv);
  Flag(app, "--local-addr", c.local_addr, "address this node advertises", rdzv);
  Flag(app, "--store-proxy", raw.store_proxy,
       "auto, on or off: on a node other than group rank 0, the workers "
       "reach the workers' store through one connection this node's dtrun "
       "holds (auto: for jobs of more than 2048 workers)",
       rdzv)
      ->capture_default_str();
}

void AddFailureFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw) {
  const std::string fail = "Failures and signals";
  Flag(app, "--max-restarts", c.max_restarts,
       "restarts of the worker group before failing", fail)
      ->capture_default_str();
  Flag(app, "--restart", raw.restart,
       "what a worker's failure restarts: group (every worker, as torchrun) "
       "or in-place (the failed worker alone; the others keep running and "
       "re-form their group around it, when they all can: lib's trainer "
       "on gloo with DDP; else the group). One node",
       fail)
      ->capture_default_str();
  Flag(app, "--monitor-interval", c.monitor_interval_s,
       "accepted for compatibility: dtrun sees worker exits at once", fail);
  // Newer torchrun calls this grace --shutdown-timeout, with the environment
  // fallback TORCH_ELASTIC_SHUTDOWN_TIMEOUT instead of a PET_ name.
  app.add_option(
         "--term-timeout,--term_timeout,--shutdown-timeout,--shutdown_timeout",
         raw.term_timeout_s,
         "seconds between SIGTERM and SIGKILL when stopping workers (default "
         "30)")
      ->envname("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->group(fail);
  Flag(app, "--signals-to-handle", raw.signals_to_handle,
       "signals dtrun handles (default SIGTERM,SIGINT,SIGHUP,SIGQUIT, which "
       "stop the job; else $TORCHELASTIC_SIGNALS_TO_HANDLE); others listed, "
       "e.g. SIGUSR1,SIGUSR2, are forwarded to every worker and the job "
       "goes on",
       fail);
  Flag(app, "--hang-timeout", raw.hang_timeout_s,
       "a worker that beat and then is silent this many seconds is hung: "
       "stacks are captured, the group stops and restarts (default 0: off)",
       fail);
  Flag(app, "--hang-first-beat", raw.hang_first_beat_s,
       "with --hang-timeout: seconds a worker may take to its first beat "
       "(default max(60, 10 x --hang-timeout))",
       fail);
  Flag(app, "--metrics-port", c.metrics_port,
       "serve Prometheus metrics of this node's workers on this port "
       "(GET /metrics; 0: a free one, logged)",
       fail)
      ->check(CLI::Range(0, 65535));
  Flag(app, "--max-restarts-without-progress", c.max_restarts_without_progress,
       "stop with exit code 93 (do not requeue) after this many restarts in "
       "a row whose workers beat no step past the highest before (default "
       "0: off)",
       fail)
      ->check(CLI::NonNegativeNumber);
}

// Where the workers' output goes: files, the console, filtered copies.
void AddOutputFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw,
                    const std::string& logs) {
  Flag(app, "--log-dir", c.log_dir,
       "folder for per-attempt worker logs and error files", logs);
  Flag(app, "--redirects", raw.redirects,
       "streams to files only: 0 none, 1 out, 2 err, 3 both, or lr:v,...", logs,
       "-r");
  Flag(app, "--tee", raw.tee,
       "streams to files and console: same values as --redirects", logs, "-t");
  Flag(app, "--local-ranks-filter", raw.local_ranks_filter,
       "console shows only these local ranks, e.g. 0,1", logs);
  Flag(app, "--log-line-prefix-template", c.log_line_prefix_template,
       "prefix of tee'd console lines, with ${role_name} ${local_rank} "
       "${rank} ${hostname} ${pid} (default: "
       "$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else "
       "[${role_name}${local_rank}]:)",
       logs);
  Flag(app, "--duplicate-stdout-filters", raw.duplicate_stdout_filters,
       "stdout lines holding any of these comma-separated words (,, is a "
       "comma) also go to attempt_<n>/filtered_stdout.log in the run folder",
       logs);
  Flag(app, "--duplicate-stderr-filters", raw.duplicate_stderr_filters,
       "the same for stderr, into filtered_stderr.log", logs);
}

// What dtrun itself reports, and how: the outcome file, events, the
// console's labels and progress line, its own log level. Listed after the
// output flags in --help's Logging group.
void AddLoggingFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw) {
  const std::string logs = "Logging";
  AddOutputFlags(app, c, raw, logs);
  Flag(app, "--metrics-textfile", c.metrics_textfile,
       "at exit, write the run's outcome (torchrun's success/failure with "
       "and without retries, counted over this node's runs) to PATH in "
       "Prometheus's text format, for node_exporter's textfile collector",
       logs);
  Flag(app, "--event-log-handler", c.event_log_handler,
       "where the agent's events go: null (default), console (stderr) or "
       "file:PATH (JSON lines in torch's event schema)",
       logs);
  // torchrun loads a Python plugin by this name; dtrun has only the default.
  Option(app, "--logs-specs", raw.logs_specs,
         "accepted when absent: dtrun has only the default log layout (a "
         "torchrun.logs_specs plugin name exits 2)",
         logs);
  app.add_flag("--label-ranks", c.label_ranks,
               "dtrun's labelled view: every console line of a worker starts "
               "with [rankN]: (its global rank), tee'd or not")
      ->group(logs);
  app.add_flag_callback(
         "--no-progress", [&c] { c.progress = false; },
         "no progress line at the bottom of the terminal (it is shown only "
         "when stdout is one)")
      ->group(logs);
  // dtrun's own flag, so no PET_ fallback; DTRUN_LOG_LEVEL is read where the
  // logger is set up.
  app.add_option(
         "--log-level", c.log_level,
         "trace|debug|info|warn|error|off (default: $DTRUN_LOG_LEVEL or info)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->group(logs);
}

}  // namespace

// Every flag, in --help's groups.
void AddFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw) {
  AddWorkerFlags(app, c, raw);
  AddRendezvousFlags(app, c, raw);
  AddFailureFlags(app, c, raw);
  AddLoggingFlags(app, c, raw);
}

bool Given(CLI::App& app, const std::string& dashed) {
  return app.get_option(dashed)->count() > 0 ||
         std::getenv(PetName(dashed).c_str());
}

}  // namespace dtrun::agent
