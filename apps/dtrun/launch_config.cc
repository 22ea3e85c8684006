// From parsed flags to a runnable LaunchConfig: value parsers for torchrun's
// flag syntaxes, the checks of flag combinations, and the resolution of the
// worker's command. Every mistake is caught here, before anything starts,
// with a message naming the flag. Pure but for $PATH lookups and /dev.
#include "apps/dtrun/launch_config.h"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "apps/dtrun/endpoint.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {

const char* RdzvBackendName(RdzvBackend backend) {
  switch (backend) {
    case RdzvBackend::kC10d:
      return "c10d";
    case RdzvBackend::kEtcd:
      return "etcd-v2";
    case RdzvBackend::kStatic:
      break;
  }
  return "static";
}

Result<RdzvBackend> ParseRdzvBackend(const std::string& name) {
  if (name == "static") return RdzvBackend::kStatic;
  if (name == "c10d") return RdzvBackend::kC10d;
  // torchrun's two etcd backends (v2 API, and its c10d-like one) are one
  // here, on etcd's v3 API.
  if (name == "etcd" || name == "etcd-v2") return RdzvBackend::kEtcd;
  return Status::Invalid("--rdzv-backend: unknown backend '" + name +
                         "'; use static, c10d, etcd-v2 or etcd");
}
Result<StoreProxyMode> ParseStoreProxyMode(const std::string& name) {
  if (name == "auto") return StoreProxyMode::kAuto;
  if (name == "on") return StoreProxyMode::kOn;
  if (name == "off") return StoreProxyMode::kOff;
  return Status::Invalid("--store-proxy: invalid choice '" + name +
                         "' (choose from auto, on, off)");
}
Result<RestartMode> ParseRestartMode(const std::string& name) {
  if (name == "group") return RestartMode::kGroup;
  if (name == "in-place") return RestartMode::kInPlace;
  return Status::Invalid("--restart: invalid choice '" + name +
                         "' (choose from group, in-place)");
}

namespace {

// strtol with the end and range checks atoi lacks: "2x" or "" as a flag value
// is a typo to report, not a 2 or a 0 to run with.
bool ParseInt(const std::string& text, int* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || v < INT32_MIN || v > INT32_MAX) return false;
  *out = static_cast<int>(v);
  return true;
}

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  return out;
}

// Finds `program` the way execvp would; empty when not found. Resolved once
// here so a typo is one clear error at launch, not an exec failure in every
// worker of every attempt. As in execvp, a name with a slash is not searched
// and an empty PATH entry means the current folder.
std::string LookUp(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return access(program.c_str(), X_OK) == 0 ? program : "";
  }
  return os::FindInPath(program);
}

}  // namespace

bool ParseStreamSpec(const std::string& text, StreamSpec* spec) {
  // torchrun's values: 0 none, 1 stdout, 2 stderr, 3 both; either one value
  // for every local rank or "local_rank:value" pairs.
  *spec = StreamSpec();
  int v = 0;
  if (ParseInt(text, &v)) {
    spec->all = v;
    return v >= 0 && v <= 3;
  }
  for (const auto& item : Split(text, ',')) {
    auto parts = Split(item, ':');
    int rank = 0;
    if (parts.size() != 2 || !ParseInt(parts[0], &rank) ||
        !ParseInt(parts[1], &v) || rank < 0 || v < 0 || v > 3) {
      return false;
    }
    spec->per_rank[rank] = v;
  }
  return !spec->per_rank.empty();
}

bool ParseNnodes(const std::string& text, int* min_nodes, int* max_nodes) {
  // "N" is "N:N": a fixed size, like torchrun's parse_min_max_nnodes.
  auto parts = Split(text, ':');
  if (parts.size() == 1 && ParseInt(parts[0], min_nodes)) {
    *max_nodes = *min_nodes;
  } else if (parts.size() != 2 || !ParseInt(parts[0], min_nodes) ||
             !ParseInt(parts[1], max_nodes)) {
    return false;
  }
  return *min_nodes > 0 && *min_nodes <= *max_nodes;
}

Result<std::vector<int>> ParseSignalList(const std::string& text) {
  static const std::pair<const char*, int> kNames[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},       {"QUIT", SIGQUIT},
      {"ABRT", SIGABRT}, {"USR1", SIGUSR1},     {"USR2", SIGUSR2},
      {"ALRM", SIGALRM}, {"TERM", SIGTERM},     {"XCPU", SIGXCPU},
      {"XFSZ", SIGXFSZ}, {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF},
      {"PWR", SIGPWR},   {"IO", SIGIO},         {"WINCH", SIGWINCH},
      {"CONT", SIGCONT}, {"TSTP", SIGTSTP},     {"URG", SIGURG},
  };
  std::vector<int> out;
  for (std::string word : Split(text, ',')) {
    while (!word.empty() && word.front() == ' ') word.erase(0, 1);
    while (!word.empty() && word.back() == ' ') word.pop_back();
    if (word.empty()) continue;
    std::string bare = word.rfind("SIG", 0) == 0 ? word.substr(3) : word;
    int signo = 0;
    for (const auto& [name, number] : kNames) {
      if (bare == name) signo = number;
    }
    if (signo == 0 && ParseInt(word, &signo) && (signo < 1 || signo > 64))
      signo = 0;
    if (signo == SIGKILL || signo == SIGSTOP) signo = 0;
    if (signo == 0) {
      return Status::Invalid(
          "--signals-to-handle: '" + word +
          "' is not a signal dtrun can handle; use names like "
          "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2");
    }
    out.push_back(signo);
  }
  return out;
}

std::vector<std::string> ParseCommaList(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::string item;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      item += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      item += ',';
      ++i;
    } else {
      out.push_back(item);
      item.clear();
    }
  }
  out.push_back(item);
  return out;
}

namespace {

// --interactive runs dtrun's own Python workers: checks what cannot go
// with it and fills the entrypoint and streams the session needs.
Status ApplyInteractive(LaunchConfig* c) {
  if (!c->entrypoint.empty()) {
    return Status::Invalid(
        "--interactive starts its own Python workers; drop the program '" +
        c->entrypoint[0] + "' (or drop --interactive)");
  }
  if (c->uses_rendezvous() && c->min_nodes != c->max_nodes) {
    // The console numbers ranks once; an elastic world would renumber them.
    return Status::Invalid(
        "--interactive needs a fixed number of nodes: give --nnodes=N, "
        "not a range");
  }
  if (c->no_python) {
    return Status::Invalid(
        "--interactive workers are Python: drop --no-python");
  }
  if (c->rdzv_backend == RdzvBackend::kEtcd) {
    // The console follows the session through the rendezvous TCP store.
    return Status::Invalid(
        "--interactive runs on the static or c10d backend, not etcd-v2: use "
        "--rdzv-backend=c10d");
  }
  // Debian's interpreter (the one with torch) unless told otherwise, or
  // dtrun was started from an environment's Python.
  if (c->python_origin == PythonOrigin::kPath &&
      access("/usr/bin/python3", X_OK) == 0) {
    c->python = "/usr/bin/python3";
  }
  c->module = true;
  c->entrypoint = {"dtrun.worker"};
  // Worker output travels to the console as cell results; the streams
  // themselves go to the log folder. Restarts are the session's business.
  c->redirects = StreamSpec{3, {}};
  c->tee = StreamSpec{};
  c->max_restarts = std::max(c->max_restarts, kRestartsWithoutLimit);
  return Status::Ok();
}

// Flags that only make sense with --interactive.
Status CheckInteractiveOnly(const LaunchConfig& c) {
  if (c.no_console && !c.interactive) {
    return Status::Invalid("--no-console goes with --interactive");
  }
  if (!c.gpu_ids.empty() && !c.interactive) {
    return Status::Invalid(
        "--gpu-ids goes with --interactive (for a program, set "
        "CUDA_VISIBLE_DEVICES)");
  }
  return Status::Ok();
}

// Flags that cannot go together, and numbers out of range.
Status CheckCombinations(const LaunchConfig& c) {
  if (c.module && c.no_python) {
    return Status::Invalid(
        "-m/--module and --no-python cannot be used together");
  }
  if (c.max_restarts < 0) return Status::Invalid("--max-restarts must be >= 0");
  // A node with a rank outside the job would wait in the rendezvous until its
  // timeout; say so now instead.
  if (c.node_rank < 0 || c.node_rank >= c.max_nodes) {
    return Status::Invalid("--node-rank " + std::to_string(c.node_rank) +
                           " is outside 0.." + std::to_string(c.max_nodes - 1) +
                           " for --nnodes");
  }
  if (c.term_timeout.count() < 0) {
    return Status::Invalid("--term-timeout must be >= 0");
  }
  for (int r : c.local_ranks_filter) {
    if (r < 0 || r >= c.nproc_per_node) {
      return Status::Invalid("--local-ranks-filter: local rank " +
                             std::to_string(r) +
                             " does not exist with --nproc-per-node=" +
                             std::to_string(c.nproc_per_node));
    }
  }
  return Status::Ok();
}

// Flags whose values come from a fixed set, checked as torchrun checks them
// (argparse choices) or where torchrun would fail later, or worse, go on.
Status CheckChoices(const LaunchConfig& c) {
  const std::string& m = c.start_method;
  if (m != "spawn" && m != "fork" && m != "forkserver") {
    return Status::Invalid("--start-method: invalid choice '" + m +
                           "' (choose from spawn, fork, forkserver)");
  }
  const std::string& n = c.numa_binding;
  if (!n.empty() && n != "node" && n != "socket" && n != "exclusive" &&
      n != "core-complex") {
    return Status::Invalid("--numa-binding: invalid choice '" + n +
                           "' (choose from node, socket, exclusive, "
                           "core-complex)");
  }
  const std::string& e = c.event_log_handler;
  bool file = (e.rfind("file:", 0) == 0 && e.size() > 5) ||
              e.find('/') != std::string::npos;
  if (e != "null" && e != "console" && !file) {
    return Status::Invalid("--event-log-handler: unknown handler '" + e +
                           "'; use null, console or file:PATH (a path with a "
                           "'/' works too)");
  }
  return Status::Ok();
}

// c10d at HOST:0 (torchtitan's and torchx's launch, torchrun's own
// --standalone): one node hosts the store on a free port of HOST. Several
// nodes could not find a port chosen on one of them.
Status ApplyFreePortEndpoint(LaunchConfig* c) {
  if (c->standalone || c->rdzv_backend != RdzvBackend::kC10d)
    return Status::Ok();
  const Endpoint& e = c->rdzv_endpoint;
  if (e.empty() || e.port != 0) return Status::Ok();
  if (c->multi_node()) {
    return Status::Invalid(
        "--rdzv-endpoint=" + e.text +
        ": port 0 (a free port) works for one node only; with --nnodes=" +
        std::to_string(c->min_nodes) + ":" + std::to_string(c->max_nodes) +
        " give the port every node connects to");
  }
  c->free_port_store = true;
  c->master_addr = e.host;
  c->master_port = 0;
  return Status::Ok();
}

// The worker runs through --python: the interpreter, unbuffered, with the
// script at `path` or the module.
Status PythonArgv(const std::string& path, LaunchConfig* c) {
  const std::string& program = c->entrypoint[0];
  std::string interpreter = LookUp(c->python);
  if (interpreter.empty()) {
    return Status::Invalid(
        "--python: cannot find '" + c->python +
        "' in PATH; install it or pass --python /path/to/python3");
  }
  if (!c->module && access(path.c_str(), R_OK) != 0) {
    return Status::Invalid("training script '" + program +
                           "' not found or not readable");
  }
  // -u as torchrun passes it: unbuffered output reaches the log mux line by
  // line, and a worker that crashes does not take its last lines with it.
  c->worker_argv = {interpreter, "-u"};
  c->python_worker = true;
  c->python_note =
      PythonNote(interpreter, c->python_origin, os::FindInPath("python3"));
  if (c->module) c->worker_argv.push_back("-m");
  c->worker_argv.push_back(c->module ? program : path);
  c->worker_argv.insert(c->worker_argv.end(), c->entrypoint.begin() + 1,
                        c->entrypoint.end());
  return Status::Ok();
}

// The command each worker runs: the program from $PATH, or the --python
// interpreter with a script or module.
Status ResolveWorkerArgv(LaunchConfig* c) {
  const std::string& program = c->entrypoint[0];
  // The first word that is not a known flag becomes the program, so a
  // misspelt flag lands here; running it would only fail as "not found".
  if (program.size() > 1 && program[0] == '-') {
    return Status::Invalid("unknown flag '" + program + "' (see dtrun --help)");
  }
  // torchrun runs every entrypoint with Python unless --no-python. dtrun
  // does the same, except for a native executable (an ELF file), which runs
  // directly: `dtrun ./train_cfg` and `dtrun train.py` both just work, and
  // `dtrun launcher_script` still goes through Python as under torchrun.
  bool python = c->module || c->run_path;
  std::string path = program;
  if (!python) {
    // A file here (torchrun's reading), else a program on $PATH.
    if (program.find('/') == std::string::npos &&
        access(program.c_str(), F_OK) != 0)
      path = LookUp(program);
    if (c->no_python) {
      path = LookUp(program);
      if (path.empty()) {
        return Status::Invalid("training program '" + program +
                               "' not found or not executable (looked in "
                               "$PATH); give a path to it");
      }
    } else if (path.empty() || access(path.c_str(), R_OK) != 0) {
      return Status::Invalid(
          "training program or script '" + program +
          "' not found (looked here and in $PATH); give a path to it");
    } else {
      python = !os::IsNativeExecutable(path);
    }
  }
  if (python) return PythonArgv(path, c);
  c->worker_argv = {path};
  c->worker_argv.insert(c->worker_argv.end(), c->entrypoint.begin() + 1,
                        c->entrypoint.end());
  return Status::Ok();
}

// --standby-import: dotted module names, for a Python entrypoint only;
// --standby alone: torch and torch.distributed for Python, the program
// itself otherwise.
Status CheckStandby(LaunchConfig* c) {
  if (c->standby && c->python_worker && c->standby_import.empty())
    c->standby_import = "torch,torch.distributed";
  if (c->standby_import.empty()) return Status::Ok();
  if (!c->python_worker) {
    return Status::Invalid(
        "--standby-import: the workers do not run Python ('" +
        c->worker_argv[0] +
        "' runs directly); drop the flag, or use --standby for a program "
        "built on dtrun's lib, or run a .py script or -m module");
  }
  std::string item;
  std::istringstream in(c->standby_import);
  while (std::getline(in, item, ',')) {
    bool ok = !item.empty() && item.front() != '.' && item.back() != '.' &&
              item.find("..") == std::string::npos &&
              !std::isdigit(static_cast<unsigned char>(item[0]));
    for (char ch : item) {
      ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' ||
                  ch == '.');
    }
    if (!ok) {
      return Status::Invalid("--standby-import: '" + item +
                             "' is not a module name (give names such as "
                             "torch,numpy,mypackage.model, comma-separated)");
    }
    c->standby_modules.push_back(item);
  }
  return Status::Ok();
}

}  // namespace

Status Validate(LaunchConfig* c) {
  // Interactive first: it fills the entrypoint that the later checks need.
  Status s = CheckInteractiveOnly(*c);
  if (s.ok() && c->interactive) s = ApplyInteractive(c);
  if (!s.ok()) return s;
  if (c->entrypoint.empty()) {
    return Status::Invalid(
        "no training program given: dtrun [flags] PROGRAM [ARGS...] "
        "(or dtrun --interactive)");
  }
  s = CheckCombinations(*c);
  if (s.ok()) s = CheckChoices(*c);
  if (s.ok()) s = ApplyFreePortEndpoint(c);
  if (s.ok()) s = ResolveWorkerArgv(c);
  return s.ok() ? CheckStandby(c) : s;
}

}  // namespace dtrun::agent
