// From parsed flags to a runnable LaunchConfig: value parsers for torchrun's
// flag syntaxes, the checks of flag combinations, and the resolution of the
// worker's command. Every mistake is caught here, before anything starts,
// with a message naming the flag. Pure but for $PATH lookups and /dev.
#include "apps/dtrun/launch_config.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "rendezvous/os_util.h"

namespace dtrun::agent {
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

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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

Result<int> ParseNprocPerNode(const std::string& text, int cpu_count,
                              int gpu_count) {
  // torchrun's words: "gpu" fails without a GPU (torchrun: "Cuda is not
  // available"), "auto" falls back to one worker per CPU.
  int n = 0;
  if (text == "cpu") return cpu_count;
  if (text == "gpu") {
    if (gpu_count == 0) {
      return Status::Invalid(
          "--nproc-per-node=gpu: no GPU found on this host "
          "(check CUDA_VISIBLE_DEVICES), or use a number or 'cpu'");
    }
    return gpu_count;
  }
  if (text == "auto") return gpu_count > 0 ? gpu_count : cpu_count;
  if (!ParseInt(text, &n) || n < 1) {
    return Status::Invalid(
        "--nproc-per-node: '" + text +
        "' is not a positive integer, 'cpu', 'gpu' or 'auto'");
  }
  return n;
}

int CountGpus() {
  // Counting /dev/nvidiaN nodes needs no CUDA library: dtrun links none and
  // must start in milliseconds on machines without drivers. The numeric
  // suffix test skips nvidiactl, nvidia-uvm and nvidia-modeset.
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  int devices = 0;
  if (DIR* dir = opendir("/dev")) {
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      int index = 0;
      if (name.rfind("nvidia", 0) == 0 && ParseInt(name.substr(6), &index))
        ++devices;
    }
    closedir(dir);
  }
  if (!visible) return devices;
  // CUDA_VISIBLE_DEVICES entries (indices or GPU-UUIDs) are counted, not
  // matched: it can only narrow what exists. "-1", the usual "hide every
  // GPU", and an empty value count as none.
  int listed = 0;
  for (const auto& item : Split(visible, ',')) {
    if (!item.empty() && item != "-1") ++listed;
  }
  return std::min(listed, devices);
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
  // Debian's interpreter (the one with torch) unless told otherwise.
  if (c->python == "python3" && access("/usr/bin/python3", X_OK) == 0) {
    c->python = "/usr/bin/python3";
  }
  c->module = true;
  c->entrypoint = {"dtrun.worker"};
  // Worker output travels to the console as cell results; the streams
  // themselves go to the log folder. Restarts are the session's business.
  c->redirects = StreamSpec{3, {}};
  c->tee = StreamSpec{};
  c->max_restarts = std::max(c->max_restarts, 1000000);
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

// The command each worker runs: the program from $PATH, or the --python
// interpreter with a script or module.
Status ResolveWorkerArgv(LaunchConfig* c) {
  const std::string& program = c->entrypoint[0];
  // The first word that is not a known flag becomes the program, so a
  // misspelt flag lands here; running it would only fail as "not found".
  if (program.size() > 1 && program[0] == '-') {
    return Status::Invalid("unknown flag '" + program + "' (see dtrun --help)");
  }
  // torchrun runs every entrypoint with Python unless --no-python; dtrun runs
  // an executable directly and only .py files (or -m, --run-path) with
  // Python, so `dtrun ./train_cfg` and `dtrun train.py` both just work.
  bool python =
      c->module || c->run_path || (!c->no_python && EndsWith(program, ".py"));
  if (!python) {
    std::string path = LookUp(program);
    if (path.empty()) {
      return Status::Invalid(
          "training program '" + program +
          "' not found or not executable (looked in $PATH); give a path, "
          "or a .py script");
    }
    c->worker_argv = {path};
    c->worker_argv.insert(c->worker_argv.end(), c->entrypoint.begin() + 1,
                          c->entrypoint.end());
    return Status::Ok();
  }
  std::string interpreter = LookUp(c->python);
  if (interpreter.empty()) {
    return Status::Invalid(
        "--python: cannot find '" + c->python +
        "' in PATH; install it or pass --python /path/to/python3");
  }
  if (!c->module && access(program.c_str(), R_OK) != 0) {
    return Status::Invalid("training script '" + program +
                           "' not found or not readable");
  }
  // -u as torchrun passes it: unbuffered output reaches the log mux line by
  // line, and a worker that crashes does not take its last lines with it.
  c->worker_argv = {interpreter, "-u"};
  c->python_worker = true;
  if (c->module) c->worker_argv.push_back("-m");
  c->worker_argv.insert(c->worker_argv.end(), c->entrypoint.begin(),
                        c->entrypoint.end());
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
  return s.ok() ? ResolveWorkerArgv(c) : s;
}

}  // namespace dtrun::agent
