// The command line: torchrun's flags on CLI11, in both spellings and with
// PET_* fallbacks, SLURM's defaults, then LaunchConfig's checks. Usage errors
// end here with exit code 2 (argparse's, so scripts written for torchrun see
// the same code); nothing has started yet.
#include "apps/dtrun/cli.h"

#include "apps/dtrun/completion.h"
#include "apps/dtrun/slurm_env.h"
#include "rendezvous/environment.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "dtrun_version.h"

namespace dtrun::agent {
namespace {

// Raw text of the flags whose values need more than CLI11's conversions.
struct RawFlags {
  std::string nproc = "1", nnodes = "1:1", redirects = "0", tee = "0",
              rdzv_conf;
  std::string local_ranks_filter;
  double term_timeout_s = 30;
  double hang_timeout_s = 0, hang_first_beat_s = 0;
  int master_port = -1;
};

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

// Precedence as in torchrun: the command line, then PET_<NAME>, then the
// default (CLI11's envname is only read when the flag is absent).
template <typename T>
CLI::Option* Flag(CLI::App& app, const std::string& dashed, T& target,
                  const std::string& help, const std::string& group,
                  const std::string& shortname = "") {
  std::string names =
      (shortname.empty() ? "" : shortname + ",") + BothSpellings(dashed);
  return app.add_option(names, target, help)
      ->envname(PetName(dashed))
      ->group(group);
}

CLI::Option* Switch(CLI::App& app, const std::string& dashed, bool& target,
                    const std::string& help, const std::string& group,
                    const std::string& shortname = "") {
  std::string names =
      (shortname.empty() ? "" : shortname + ",") + BothSpellings(dashed);
  return app.add_flag(names, target, help)
      ->envname(PetName(dashed))
      ->group(group);
}

void AddWorkerFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw,
                    std::string& ignored) {
  const std::string workers = "Workers";
  Flag(app, "--nproc-per-node", raw.nproc,
       "workers on this node: N, cpu, gpu or auto (default 1)", workers);
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
       "python interpreter for .py/-m entrypoints (default: $PYTHON_EXEC or "
       "python3)",
       workers);
  Flag(app, "--role", c.role, "worker role name (ROLE_NAME)", workers)
      ->capture_default_str();
  // torchrun's fork/spawn/forkserver choose how Python makes workers; dtrun
  // always fork+execs a fresh process, so the value is accepted and unused.
  Flag(app, "--start-method", ignored,
       "accepted for torchrun compatibility; workers are always new processes",
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
  Flag(app, "--rdzv-backend", c.rdzv_backend, "static or c10d", rdzv)
      ->capture_default_str();
  Flag(app, "--rdzv-endpoint", c.rdzv_endpoint,
       "host[:port] of the rendezvous store", rdzv);
  Flag(app, "--rdzv-id", c.rdzv_id, "job id (TORCHELASTIC_RUN_ID)", rdzv)
      ->capture_default_str();
  Flag(app, "--rdzv-conf", raw.rdzv_conf, "rendezvous settings k=v,k=v", rdzv);
  Flag(app, "--local-addr", c.local_addr, "address this node advertises", rdzv);
}

void AddFailureFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw) {
  const std::string fail = "Failures and signals";
  Flag(app, "--max-restarts", c.max_restarts,
       "restarts of the worker group before failing", fail)
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
      ->group(fail);
  Flag(app, "--hang-timeout", raw.hang_timeout_s,
       "a worker that beat and then is silent this many seconds is hung: "
       "stacks are captured, the group stops and restarts (default 0: off)",
       fail);
  Flag(app, "--hang-first-beat", raw.hang_first_beat_s,
       "with --hang-timeout: seconds a worker may take to its first beat "
       "(default max(60, 10 x --hang-timeout))",
       fail);
}

void AddLoggingFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw) {
  const std::string logs = "Logging";
  Flag(app, "--log-dir", c.log_dir,
       "folder for per-attempt worker logs and error files", logs);
  Flag(app, "--redirects", raw.redirects,
       "streams to files only: 0 none, 1 out, 2 err, 3 both, or lr:v,...", logs,
       "-r");
  Flag(app, "--tee", raw.tee,
       "streams to files and console: same values as --redirects", logs, "-t");
  Flag(app, "--local-ranks-filter", raw.local_ranks_filter,
       "console shows only these local ranks, e.g. 0,1", logs);
  // dtrun's own flag, so no PET_ fallback; DTRUN_LOG_LEVEL is read where the
  // logger is set up.
  app.add_option(
         "--log-level", c.log_level,
         "trace|debug|info|warn|error|off (default: $DTRUN_LOG_LEVEL or info)")
      ->group(logs);
}

// Every flag, in --help's groups.
void AddFlags(CLI::App& app, LaunchConfig& c, RawFlags& raw,
              std::string& ignored) {
  AddWorkerFlags(app, c, raw, ignored);
  AddRendezvousFlags(app, c, raw);
  AddFailureFlags(app, c, raw);
  AddLoggingFlags(app, c, raw);
}

// Whether the user gave `dashed` on the command line or through PET_*. Either
// way it is the user's choice, which SLURM's defaults must not override.
bool Given(CLI::App& app, const std::string& dashed) {
  return app.get_option(dashed)->count() > 0 ||
         std::getenv(PetName(dashed).c_str());
}

// Under SLURM, fills what the user left out from the job's environment:
// node count, node rank, the store host (SLURM_NODEID 0's host), a port
// derived from the job id, and the run id.
void ApplySlurm(CLI::App& app, const SlurmJob& job, RawFlags* raw,
                LaunchConfig* c) {
  if (!Given(app, "--nnodes") && job.nnodes > 0)
    raw->nnodes = std::to_string(job.nnodes);
  if (!Given(app, "--node-rank") && job.node_id >= 0)
    c->node_rank = job.node_id;
  if (!Given(app, "--master-addr") && !job.master_addr().empty())
    c->master_addr = job.master_addr();
  // An --rdzv-endpoint chooses the store itself: one given without a port
  // keeps torchrun's default port rather than a derived one.
  if (!Given(app, "--master-port") && !Given(app, "--rdzv-endpoint"))
    raw->master_port = job.master_port();
  if (!Given(app, "--rdzv-id")) c->rdzv_id = job.job_id;
  // An interactive session under srun: the console runs on node 0 (srun
  // gives stdin to task 0); the other nodes only host their workers.
  if (c->interactive && job.node_id > 0) c->no_console = true;
}

// "0,1" -> local ranks; returns a message naming the flag when malformed.
std::string ParseLocalRanksFilter(const std::string& text,
                                  std::vector<int>* out) {
  if (text.empty()) return "";
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    long r = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end) {
      return "--local-ranks-filter: '" + text + "' is not a list like 0,1";
    }
    out->push_back(static_cast<int>(r));
    start = comma + 1;
  }
  return "";
}

// Applies the raw flags to the config; returns a message naming the bad flag.
std::string ApplyRaw(const RawFlags& raw, const std::optional<SlurmJob>& job,
                     LaunchConfig* c) {
  if (!ParseNnodes(raw.nnodes, &c->min_nodes, &c->max_nodes)) {
    return "--nnodes: '" + raw.nnodes +
           "' is not N or MIN:MAX with 0 < MIN <= MAX";
  }
  // Under SLURM, "cpu"/"gpu"/"auto" count the job's share of the node: the
  // machine's own counts would overcommit a node shared with other jobs.
  int cpus = job && job->cpus_on_node > 0
                 ? job->cpus_on_node
                 : static_cast<int>(std::thread::hardware_concurrency());
  int gpus = job && job->gpus_on_node > 0 ? job->gpus_on_node : CountGpus();
  auto nproc = ParseNprocPerNode(raw.nproc, cpus, gpus);
  if (!nproc.ok()) return nproc.status().message();
  c->nproc_per_node = *nproc;
  if (!ParseStreamSpec(raw.redirects, &c->redirects)) {
    return "--redirects: '" + raw.redirects +
           "' is not 0-3 or LOCAL_RANK:0-3,...";
  }
  if (!ParseStreamSpec(raw.tee, &c->tee)) {
    return "--tee: '" + raw.tee + "' is not 0-3 or LOCAL_RANK:0-3,...";
  }
  auto rdzv_conf = ParseRdzvConf(raw.rdzv_conf);
  if (!rdzv_conf.ok()) return rdzv_conf.status().message();
  c->rdzv_conf = *rdzv_conf;
  if (raw.master_port > 65535 || raw.master_port < -1) {
    return "--master-port: " + std::to_string(raw.master_port) +
           " is not a port (0-65535)";
  }
  if (raw.master_port >= 0)
    c->master_port = static_cast<uint16_t>(raw.master_port);
  // Seconds as a double, as torchrun takes them: fractions are useful in
  // tests and for fast hang detection. Stored as milliseconds.
  if (raw.term_timeout_s < 0) return "--term-timeout must be >= 0 seconds";
  c->term_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(raw.term_timeout_s * 1000));
  if (raw.hang_timeout_s < 0)
    return "--hang-timeout must be >= 0 seconds (0: off)";
  if (raw.hang_first_beat_s < 0)
    return "--hang-first-beat must be >= 0 seconds";
  c->hang_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(raw.hang_timeout_s * 1000));
  c->hang_first_beat = std::chrono::milliseconds(
      static_cast<int64_t>(raw.hang_first_beat_s * 1000));
  return ParseLocalRanksFilter(raw.local_ranks_filter, &c->local_ranks_filter);
}

// One usage block (CLI11's own line would add "Usage: <argv[0]> [OPTIONS]").
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: dtrun [flags] PROGRAM|SCRIPT.py [ARGS...]\n"
           "   or: dtrun [flags] -m MODULE [ARGS...]\n"
           "   or: dtrun --interactive [flags]\n";
  }
};

// Values the shell completions offer for a flag (others complete file names).
// Kept next to the flags rather than in completion.cc, so a new flag with
// fixed values is one edit in one file.
std::vector<std::string> Choices(const std::string& name) {
  if (name == "--nproc-per-node")
    return {"1", "2", "4", "8", "cpu", "gpu", "auto"};
  if (name == "--rdzv-backend") return {"static", "c10d"};
  if (name == "--log-level")
    return {"trace", "debug", "info", "warn", "error", "off"};
  if (name == "--redirects" || name == "--tee") return {"0", "1", "2", "3"};
  if (name == "--print-completion") return {"bash", "zsh"};
  return {};
}

// The completion table, read back from the parser itself so it lists exactly
// the spellings ParseCommandLine accepts; the positional has no name and is
// skipped.
std::vector<FlagSpec> FlagSpecs(const CLI::App& app) {
  std::vector<FlagSpec> specs;
  for (const CLI::Option* opt : app.get_options()) {
    FlagSpec spec;
    for (const auto& s : opt->get_snames()) spec.names.push_back("-" + s);
    for (const auto& l : opt->get_lnames()) spec.names.push_back("--" + l);
    if (spec.names.empty()) continue;
    spec.takes_value =
        opt->get_expected_max() != 0;  // switches expect 0 values
    spec.help = opt->get_description();
    spec.choices = Choices(
        opt->get_lnames().empty() ? "" : "--" + opt->get_lnames().front());
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace

std::string VersionText(const std::string& program) {
  return program + " " DTRUN_VERSION " (git " DTRUN_GIT_COMMIT ")";
}

CliResult ParseCommandLine(int argc, const char* const* argv) {
  CliResult result;
  LaunchConfig& c = result.config;
  // torchrun's PYTHON_EXEC sets the default interpreter; set before parsing
  // so an explicit --python still wins.
  if (const char* exec = std::getenv("PYTHON_EXEC")) c.python = exec;
  CLI::App app{
      "dtrun: launch one worker per slot with torchrun's environment, "
      "host the store, restart failed groups."};
  app.formatter(std::make_shared<UsageFormatter>());
  app.prefix_command();  // everything after the entrypoint belongs to it
  RawFlags raw;
  std::string ignored, completion_shell;
  AddFlags(app, c, raw, ignored);
  app.set_version_flag("--version", VersionText("dtrun"),
                       "print dtrun's version and git commit");
  app.add_option("--print-completion", completion_shell,
                 "print the bash or zsh completion script and exit")
      ->type_name("SHELL");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints --help/--version (rc 0) or the error; every usage error
    // becomes 2 whatever CLI11's own code for it is.
    int rc = app.exit(e);
    result.exit_code = rc == 0 ? 0 : 2;
    return result;
  }
  // Handled before the program checks: printing a completion needs none.
  if (!completion_shell.empty()) {
    std::string script = CompletionScript(completion_shell, FlagSpecs(app));
    if (script.empty()) {
      std::fprintf(
          stderr,
          "dtrun: --print-completion: unknown shell '%s'; use bash or zsh\n",
          completion_shell.c_str());
    }
    std::fputs(script.c_str(), stdout);
    result.exit_code = script.empty() ? 2 : 0;
    return result;
  }
  c.entrypoint = app.remaining();
  std::string error;
  // SLURM first: it supplies raw values (node count, port) that ApplyRaw then
  // parses and checks like typed ones.
  std::optional<SlurmJob> job = ReadSlurmJob(ProcessEnvironment(), &error);
  if (job) ApplySlurm(app, *job, &raw, &c);
  if (error.empty()) error = ApplyRaw(raw, job, &c);
  if (error.empty()) {
    Status s = Validate(&c);
    if (!s.ok()) error = s.message();
  }
  if (!error.empty()) {
    std::fprintf(stderr, "dtrun: %s\nRun with --help for more information.\n",
                 error.c_str());
    result.exit_code = 2;
  }
  return result;
}

}  // namespace dtrun::agent
