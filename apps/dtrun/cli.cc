// The command line: torchrun's flags on CLI11, in both spellings and with
// PET_* fallbacks, SLURM's defaults, then LaunchConfig's checks. Usage errors
// end here with exit code 2 (argparse's, so scripts written for torchrun see
// the same code); nothing has started yet.
#include "apps/dtrun/cli.h"

#include "apps/dtrun/argv_rules.h"
#include "apps/dtrun/cli_flags.h"
#include "apps/dtrun/completion.h"
#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/cpu_quota.h"
#include "apps/dtrun/devices.h"
#include "apps/dtrun/slurm_env.h"
#include "rendezvous/util/environment.h"
#include "rendezvous/util/os_util.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "dtrun_version.h"

namespace dtrun::agent {
namespace {

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

// The value of `name` in the environment dtrun started with, "" if unset.
std::string EnvOf(const LaunchConfig& c, const char* name) {
  auto v = c.environment.find(name);
  return v == c.environment.end() ? std::string() : v->second;
}

// Variables of torch's elastic agent that switch features on: torch's file
// timer, dtrun's own error file (a scheduler's: it gets the root cause),
// the health check port, the D-state limit.
std::string ApplyTorchelasticEnv(LaunchConfig* c) {
  c->file_timer = EnvOf(*c, "TORCHELASTIC_ENABLE_FILE_TIMER") == "1";
  if (!EnvOf(*c, "TORCHELASTIC_TIMER_FILE").empty())
    c->timer_file = EnvOf(*c, "TORCHELASTIC_TIMER_FILE");
  c->error_file = EnvOf(*c, "TORCHELASTIC_ERROR_FILE");
  std::string health = EnvOf(*c, "TORCHELASTIC_HEALTH_CHECK_PORT");
  if (!health.empty()) {
    char* end = nullptr;
    long port = std::strtol(health.c_str(), &end, 10);
    if (*end || port < 0 || port > 65535) {
      return "TORCHELASTIC_HEALTH_CHECK_PORT: '" + health +
             "' is not a port (0-65535)";
    }
    c->health_check_port = static_cast<int>(port);
  }
  std::string d_state = EnvOf(*c, "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT");
  if (!d_state.empty()) {
    char* end = nullptr;
    double seconds = std::strtod(d_state.c_str(), &end);
    if (*end || seconds < 0) {
      return "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: '" + d_state +
             "' is not a number of seconds";
    }
    c->uninterruptible_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  return "";
}

// The newer torchrun flags and the variables that stand in for them: the
// flag, then PET_*, then torchrun's own variable, then the default.
std::string ApplyTorchrunExtras(const RawFlags& raw, LaunchConfig* c) {
  std::string signals = raw.signals_to_handle;
  if (signals.empty()) signals = EnvOf(*c, "TORCHELASTIC_SIGNALS_TO_HANDLE");
  if (!signals.empty()) c->signals_to_handle = signals;
  auto handled = ParseSignalList(c->signals_to_handle);
  if (!handled.ok()) return handled.status().message();
  c->handled_signals = *handled;
  if (c->log_line_prefix_template.empty()) {
    c->log_line_prefix_template =
        EnvOf(*c, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  }
  // A path alone ("./events.jsonl") is a file handler too.
  const std::string& e = c->event_log_handler;
  if (e.rfind("file:", 0) != 0 && e.find('/') != std::string::npos)
    c->event_log_handler = "file:" + e;
  c->duplicate_stdout_filters = ParseCommaList(raw.duplicate_stdout_filters);
  c->duplicate_stderr_filters = ParseCommaList(raw.duplicate_stderr_filters);
  if (!raw.logs_specs.empty()) {
    return "--logs-specs: '" + raw.logs_specs +
           "' names a torchrun.logs_specs Python plugin, which dtrun cannot "
           "load; drop the flag (dtrun's log layout is torchrun's default)";
  }
  // One GPU per worker from the list: a shorter list would share GPUs.
  std::string visible = EnvOf(*c, "CUDA_VISIBLE_DEVICES");
  int listed = visible.empty() ? 0 : 1;
  for (char ch : visible) listed += ch == ',';
  if (c->virtual_local_rank && listed > 0 && listed < c->nproc_per_node) {
    return "--virtual-local-rank: CUDA_VISIBLE_DEVICES='" + visible +
           "' lists fewer GPUs than --nproc-per-node=" +
           std::to_string(c->nproc_per_node);
  }
  return ApplyTorchelasticEnv(c);
}

// --nnodes and --nproc-per-node. Under SLURM, "cpu"/"gpu"/"auto" count the
// job's share of the node: the machine's own counts would overcommit a node
// shared with other jobs.
std::string ApplySizes(const RawFlags& raw, const std::optional<SlurmJob>& job,
                       LaunchConfig* c) {
  if (!ParseNnodes(raw.nnodes, &c->min_nodes, &c->max_nodes)) {
    return "--nnodes: '" + raw.nnodes +
           "' is not N or MIN:MAX with 0 < MIN <= MAX";
  }
  // Elsewhere what this process may use: a container's CPU limit, a CPU
  // set (a Kubernetes pod limited to 4 CPUs on a 128-core node gets 4).
  int cpus = job && job->cpus_on_node > 0 ? job->cpus_on_node : UsableCpus();
  // Devices are counted only for a named count: a number needs no look at
  // /dev and /sys (dtrun's start-up is on the critical path of big jobs).
  DeviceCounts devices;
  devices.cpu = cpus;
  if (raw.nproc.find_first_not_of("0123456789") != std::string::npos) {
    int gpus = job && job->gpus_on_node > 0 ? job->gpus_on_node
                                            : CountGpus(c->environment);
    devices = CountDevices(cpus, gpus);
  }
  auto nproc = ParseNprocPerNode(raw.nproc, devices);
  if (!nproc.ok()) return nproc.status().message();
  c->nproc_per_node = *nproc;
  return "";
}

// The --rdzv-conf keys that must agree with each other on etcd.
std::string CheckEtcdConf(const RdzvConfig& rc) {
  if (rc.is_host) {
    // Nothing to host: the etcd cluster is the rendezvous store.
    return "--rdzv-conf: is_host is for --rdzv-backend=c10d; with etcd-v2 no "
           "node hosts the rendezvous store (drop it)";
  }
  if (rc.protocol == "http" && (!rc.cacert.empty() || !rc.cert.empty())) {
    return "--rdzv-conf: cacert, cert and key need protocol=https";
  }
  if (rc.user.empty() != rc.password_file.empty()) {
    return "--rdzv-conf: user and password_file go together (etcd's user "
           "and a file holding its password)";
  }
  return "";
}

// The members of "[scheme://]host[:port],..." into `members` ("host:port",
// port 2379 by default), and the scheme they agree on ("" when none names
// one); or what is wrong.
std::string ParseEtcdMembers(const std::string& text, std::string* scheme,
                             std::vector<std::string>* members) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    start = comma + 1;
    for (const char* s : {"http://", "https://"}) {
      if (item.rfind(s, 0) != 0) continue;
      std::string mine(s, std::strlen(s) - 3);
      if (!scheme->empty() && *scheme != mine) {
        return "--rdzv-endpoint: '" + text +
               "' mixes http:// and https:// members";
      }
      *scheme = mine;
      item = item.substr(std::strlen(s));
    }
    if (!item.empty() && item.back() == '/') item.pop_back();
    std::string host;
    uint16_t port = 0;
    if (item.empty() || !SplitEndpoint(item, 2379, &host, &port) || port == 0) {
      return "--rdzv-endpoint: '" + item +
             "' is not an etcd member's host[:port] (in '" + text + "')";
    }
    members->push_back(host + ":" + std::to_string(port));
  }
  return "";
}

// etcd's members from --rdzv-endpoint: "[scheme://]host[:port],..."; the
// scheme, when given, must agree with --rdzv-conf protocol. torchrun's etcd
// backend reads `timeout` as the join timeout.
std::string ApplyEtcdEndpoints(const std::string& text, LaunchConfig* c) {
  RdzvConfig& rc = c->rdzv_conf;
  if (rc.timeout && !rc.join_timeout_given) rc.join_timeout = *rc.timeout;
  auto& ignored = rc.ignored;
  ignored.erase(std::remove_if(ignored.begin(), ignored.end(),
                               [](const std::string& item) {
                                 return item.rfind("timeout=", 0) == 0;
                               }),
                ignored.end());
  if (text.empty()) {
    return "--rdzv-backend=etcd-v2 needs --rdzv-endpoint=HOST[:PORT],... "
           "(the etcd members, port 2379 by default)";
  }
  std::string scheme;
  if (std::string bad = ParseEtcdMembers(text, &scheme, &c->etcd_endpoints);
      !bad.empty())
    return bad;
  if (!scheme.empty()) {
    if (rc.protocol_given && rc.protocol != scheme) {
      return "--rdzv-endpoint: " + scheme +
             ":// members but --rdzv-conf "
             "protocol=" +
             rc.protocol;
    }
    rc.protocol = scheme;
  }
  if (std::string bad = CheckEtcdConf(rc); !bad.empty()) return bad;
  // The first member names the endpoint in messages and the registry.
  c->rdzv_endpoint = *ParseEndpoint(c->etcd_endpoints[0]);
  return "";
}

// --rdzv-backend, --rdzv-endpoint, --rdzv-conf and --master-port, each
// parsed once into its type.
std::string ApplyRendezvous(const RawFlags& raw, LaunchConfig* c) {
  auto rdzv_conf = ParseRdzvConf(raw.rdzv_conf);
  if (!rdzv_conf.ok()) return rdzv_conf.status().message();
  c->rdzv_conf = *rdzv_conf;
  auto backend = ParseRdzvBackend(raw.rdzv_backend);
  if (!backend.ok()) return backend.status().message();
  c->rdzv_backend = *backend;
  if (c->rdzv_backend == RdzvBackend::kEtcd)
    return ApplyEtcdEndpoints(raw.rdzv_endpoint, c);
  if (c->rdzv_conf.etcd_keys_given()) {
    return std::string(
               "--rdzv-conf: protocol, cacert, cert, key, user and "
               "password_file are for "
               "--rdzv-backend=etcd-v2, not ") +
           RdzvBackendName(c->rdzv_backend);
  }
  auto endpoint = ParseEndpoint(raw.rdzv_endpoint);
  if (!endpoint) {
    return "--rdzv-endpoint: '" + raw.rdzv_endpoint +
           "' is not host[:port] (a port is 0-65535; IPv6 in brackets)";
  }
  c->rdzv_endpoint = *endpoint;
  if (raw.master_port > 65535 || raw.master_port < -1) {
    return "--master-port: " + std::to_string(raw.master_port) +
           " is not a port (0-65535)";
  }
  if (raw.master_port >= 0)
    c->master_port = static_cast<uint16_t>(raw.master_port);
  return "";
}

// Seconds as a double, as torchrun takes them: fractions are useful in
// tests and for fast hang detection. Stored as milliseconds.
std::string ApplyTimeouts(const RawFlags& raw, LaunchConfig* c) {
  if (raw.term_timeout_s < 0) return "--term-timeout must be >= 0 seconds";
  if (raw.hang_timeout_s < 0)
    return "--hang-timeout must be >= 0 seconds (0: off)";
  if (raw.hang_first_beat_s < 0)
    return "--hang-first-beat must be >= 0 seconds";
  auto ms = [](double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  };
  c->term_timeout = ms(raw.term_timeout_s);
  c->hang_timeout = ms(raw.hang_timeout_s);
  c->hang_first_beat = ms(raw.hang_first_beat_s);
  return "";
}

// Applies the raw flags to the config; returns a message naming the bad flag.
std::string ApplyRaw(const RawFlags& raw, const std::optional<SlurmJob>& job,
                     LaunchConfig* c) {
  for (const std::string& error :
       {ApplySizes(raw, job, c), ApplyRendezvous(raw, c),
        ApplyTimeouts(raw, c)}) {
    if (!error.empty()) return error;
  }
  if (!ParseStreamSpec(raw.redirects, &c->redirects)) {
    return "--redirects: '" + raw.redirects +
           "' is not 0-3 or LOCAL_RANK:0-3,...";
  }
  if (!ParseStreamSpec(raw.tee, &c->tee)) {
    return "--tee: '" + raw.tee + "' is not 0-3 or LOCAL_RANK:0-3,...";
  }
  auto proxy = ParseStoreProxyMode(raw.store_proxy);
  if (!proxy.ok()) return proxy.status().message();
  c->store_proxy = *proxy;
  auto restart = ParseRestartMode(raw.restart);
  if (!restart.ok()) return restart.status().message();
  c->restart = *restart;
  std::string error = ApplyTorchrunExtras(raw, c);
  if (!error.empty()) return error;
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
  if (name == "--start-method") return {"spawn", "fork", "forkserver"};
  if (name == "--numa-binding")
    return {"node", "socket", "exclusive", "core-complex"};
  if (name == "--event-log-handler") return {"null", "console"};
  if (name == "--store-proxy") return {"auto", "on", "off"};
  if (name == "--log-level")
    return {"trace", "debug", "info", "warn", "error", "off"};
  if (name == "--redirects" || name == "--tee") return {"0", "1", "2", "3"};
  if (name == "--print-completion") return {"bash", "zsh", "tcsh"};
  return {};
}

// dtrun's own flags, which torchrun lacks: argv_rules.h prefers torchrun's
// flags when a prefix matches both.
bool IsDtrunOnly(const std::string& name) {
  static const char* kOwn[] = {"--interactive",
                               "--no-console",
                               "--no_console",
                               "--gpu-ids",
                               "--gpu_ids",
                               "--python",
                               "--term-timeout",
                               "--term_timeout",
                               "--hang-timeout",
                               "--hang_timeout",
                               "--hang-first-beat",
                               "--hang_first_beat",
                               "--log-level",
                               "--version",
                               "--label-ranks",
                               "--no-progress",
                               "--max-restarts-without-progress",
                               "--max_restarts_without_progress",
                               "--status",
                               "--json",
                               "--stacks",
                               "--metrics-port",
                               "--metrics_port",
                               "--standby-import",
                               "--standby_import",
                               "--standby",
                               "--store-proxy",
                               "--store_proxy",
                               "--restart"};
  for (const char* own : kOwn) {
    if (name == own) return true;
  }
  return false;
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
    // switches expect 0 values
    spec.takes_value = opt->get_expected_max() != 0;
    spec.optional_value = opt->get_expected_min() == 0 && spec.takes_value;
    spec.help = opt->get_description();
    spec.choices = Choices(
        opt->get_lnames().empty() ? "" : "--" + opt->get_lnames().front());
    spec.torchrun = !IsDtrunOnly(spec.names.back());
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace

std::string VersionText(const std::string& program) {
  return program + " " DTRUN_VERSION " (git " DTRUN_GIT_COMMIT ")";
}

namespace {

// --print-completion SHELL: the script on stdout; returns the exit code.
int PrintCompletion(const std::string& shell, CLI::App& app) {
  std::string script = CompletionScript(shell, FlagSpecs(app));
  if (script.empty()) {
    std::fprintf(stderr,
                 "dtrun: --print-completion: unknown shell '%s'; use bash, "
                 "zsh or tcsh\n",
                 shell.c_str());
    return kExitUsage;
  }
  std::fputs(script.c_str(), stdout);
  return kExitSuccess;
}

// A usage error on stderr, as every bad flag or value is reported.
int UsageError(const std::string& message) {
  std::fprintf(stderr, "dtrun: %s\nRun with --help for more information.\n",
               message.c_str());
  return kExitUsage;
}

// After CLI11 read the flags: SLURM's values, then the raw flags parsed
// into their types, then Validate(). A message naming what is wrong, or "".
std::string Complete(CLI::App& app, RawFlags raw, LaunchConfig* c) {
  std::string error;
  // SLURM first: it supplies raw values (node count, port) that ApplyRaw then
  // parses and checks like typed ones.
  std::optional<SlurmJob> job = ReadSlurmJob(c->environment, &error);
  if (job) ApplySlurm(app, *job, &raw, c);
  c->node_rank_given = Given(app, "--node-rank") || (job && job->node_id >= 0);
  if (Given(app, "--python")) c->python_origin = PythonOrigin::kFlag;
  if (error.empty()) error = ApplyRaw(raw, job, c);
  if (error.empty()) {
    Status s = Validate(c);
    if (!s.ok()) error = s.message();
  }
  return error;
}

// The flags that ask something and exit instead of running a job: a
// completion script, the jobs' status, a job's stacks.
struct Queries {
  std::string completion_shell;
  std::string status_target;
  bool json = false;
  std::string stacks_target;
};

void AddQueryFlags(CLI::App& app, Queries* q) {
  app.set_version_flag("--version", VersionText("dtrun"),
                       "print dtrun's version and git commit");
  app.add_option("--print-completion,--print_completion", q->completion_shell,
                 "print the bash, zsh or tcsh completion script and exit")
      ->type_name("SHELL");
  app.add_option("--status", q->status_target,
                 "show the jobs running on this host, or one job (run id, "
                 "log folder or store host:port) across its nodes, and exit")
      ->expected(0, 1)
      ->type_name("[RUN]");
  app.add_flag("--json", q->json, "with --status: JSON for machines");
  app.add_option("--stacks", q->stacks_target,
                 "print every rank's stack of a running job (run id, log "
                 "folder or store host:port), which goes on, and exit")
      ->type_name("RUN");
}

// The query given, if any, into `query` (the completion script is printed
// here): an exit code, or -1 to go on. Before the program checks: none of
// them needs a program.
std::optional<int> TakeQuery(CLI::App& app, const Queries& q, Query* query) {
  if (!q.completion_shell.empty())
    return PrintCompletion(q.completion_shell, app);
  if (app.get_option("--status")->count() > 0) {
    *query = Query{Query::Kind::kStatus, q.status_target, q.json};
    return std::nullopt;
  }
  if (!q.stacks_target.empty()) {
    *query = Query{Query::Kind::kStacks, q.stacks_target, false};
    return std::nullopt;
  }
  // A flag of a query that was not asked is refused, not ignored.
  if (q.json) return UsageError("--json: only with --status");
  return std::nullopt;
}

}  // namespace

CliResult ParseCommandLine(int argc, const char* const* argv) {
  CliResult result;
  LaunchConfig& c = result.config;
  // The environment is read here once; everything below takes it from the
  // config. The default interpreter is set before parsing so an explicit
  // --python still wins (python_choice.h says the order).
  c.environment = ProcessEnvironment();
  PythonChoice python = DefaultPython(c.environment, os::SelfExecutable());
  c.python = python.python;
  c.python_origin = python.origin;
  // The package's hand-over is for this dtrun, not for the workers' own.
  c.environment.erase(kCallerPython);
  CLI::App app{
      "dtrun: launch one worker per slot with torchrun's environment, "
      "host the store, restart failed groups."};
  app.formatter(std::make_shared<UsageFormatter>());
  RawFlags raw;
  Queries queries;
  AddFlags(app, c, raw);
  AddQueryFlags(app, &queries);
  // argparse's rules first (argv_rules.h); CLI11 then sees only the flags.
  SplitArgv split = SplitAtProgram(
      std::vector<std::string>(argv + std::min(argc, 1), argv + argc),
      FlagSpecs(app));
  if (!split.error.empty()) {
    result.exit_code = UsageError(split.error);
    return result;
  }
  std::vector<const char*> flag_argv = {argc > 0 ? argv[0] : "dtrun"};
  for (const std::string& f : split.flags) flag_argv.push_back(f.c_str());
  try {
    app.parse(static_cast<int>(flag_argv.size()), flag_argv.data());
  } catch (const CLI::ParseError& e) {
    // app.exit prints --help/--version (rc 0) or the error; every usage error
    // becomes 2 whatever CLI11's own code for it is.
    result.exit_code = app.exit(e) == 0 ? kExitSuccess : kExitUsage;
    return result;
  }
  result.exit_code = TakeQuery(app, queries, &result.query);
  if (result.exit_code || result.query.kind != Query::Kind::kNone)
    return result;
  c.entrypoint = split.entrypoint;
  std::string error = Complete(app, raw, &c);
  if (!error.empty()) result.exit_code = UsageError(error);
  return result;
}

}  // namespace dtrun::agent
