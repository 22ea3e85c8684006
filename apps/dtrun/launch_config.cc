#include "apps/dtrun/launch_config.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

namespace dtrun::agent {
namespace {

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
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Finds `program` the way execvp would; empty when not found.
std::string LookUp(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return access(program.c_str(), X_OK) == 0 ? program : "";
  }
  const char* path = std::getenv("PATH");
  for (const auto& dir : Split(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

bool ParseStreamSpec(const std::string& text, StreamSpec* spec) {
  *spec = StreamSpec();
  int v = 0;
  if (ParseInt(text, &v)) {
    spec->all = v;
    return v >= 0 && v <= 3;
  }
  for (const auto& item : Split(text, ',')) {
    auto parts = Split(item, ':');
    int rank = 0;
    if (parts.size() != 2 || !ParseInt(parts[0], &rank) || !ParseInt(parts[1], &v) ||
        rank < 0 || v < 0 || v > 3) {
      return false;
    }
    spec->per_rank[rank] = v;
  }
  return !spec->per_rank.empty();
}

bool ParseNnodes(const std::string& text, int* min_nodes, int* max_nodes) {
  auto parts = Split(text, ':');
  if (parts.size() == 1 && ParseInt(parts[0], min_nodes)) {
    *max_nodes = *min_nodes;
  } else if (parts.size() != 2 || !ParseInt(parts[0], min_nodes) ||
             !ParseInt(parts[1], max_nodes)) {
    return false;
  }
  return *min_nodes > 0 && *min_nodes <= *max_nodes;
}

bool ParseRdzvConf(const std::string& text, std::map<std::string, std::string>* conf) {
  conf->clear();
  if (text.empty()) return true;
  for (const auto& item : Split(text, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    (*conf)[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return true;
}

Result<int> ParseNprocPerNode(const std::string& text, int cpu_count, int gpu_count) {
  int n = 0;
  if (text == "cpu") return cpu_count;
  if (text == "gpu") {
    if (gpu_count == 0) {
      return Status::Invalid("--nproc-per-node=gpu: no GPU found on this host "
                             "(check CUDA_VISIBLE_DEVICES), or use a number or 'cpu'");
    }
    return gpu_count;
  }
  if (text == "auto") return gpu_count > 0 ? gpu_count : cpu_count;
  if (!ParseInt(text, &n) || n < 1) {
    return Status::Invalid("--nproc-per-node: '" + text +
                           "' is not a positive integer, 'cpu', 'gpu' or 'auto'");
  }
  return n;
}

int CountGpus() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  int devices = 0;
  if (DIR* dir = opendir("/dev")) {
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      int index = 0;
      if (name.rfind("nvidia", 0) == 0 && ParseInt(name.substr(6), &index)) ++devices;
    }
    closedir(dir);
  }
  if (!visible) return devices;
  int listed = 0;
  for (const auto& item : Split(visible, ',')) {
    if (!item.empty() && item != "-1") ++listed;
  }
  return std::min(listed, devices);
}

Status Validate(LaunchConfig* c) {
  if (c->no_console && !c->interactive) {
    return Status::Invalid("--no-console goes with --interactive");
  }
  if (!c->gpu_ids.empty() && !c->interactive) {
    return Status::Invalid("--gpu-ids goes with --interactive (for a program, set CUDA_VISIBLE_DEVICES)");
  }
  if (c->interactive) {
    if (!c->entrypoint.empty()) {
      return Status::Invalid("--interactive starts its own Python workers; drop the program '" +
                             c->entrypoint[0] + "' (or drop --interactive)");
    }
    if (c->uses_rendezvous() && c->min_nodes != c->max_nodes) {
      // The console numbers ranks once; an elastic world would renumber them.
      return Status::Invalid("--interactive needs a fixed number of nodes: give --nnodes=N, "
                             "not a range");
    }
    if (c->no_python) return Status::Invalid("--interactive workers are Python: drop --no-python");
    // Debian's interpreter (the one with torch) unless told otherwise.
    if (c->python == "python3" && access("/usr/bin/python3", X_OK) == 0) c->python = "/usr/bin/python3";
    c->module = true;
    c->entrypoint = {"dtrun.worker"};
    // Worker output travels to the console as cell results; the streams
    // themselves go to the log folder. Restarts are the session's business.
    c->redirects = StreamSpec{3, {}};
    c->tee = StreamSpec{};
    c->max_restarts = std::max(c->max_restarts, 1000000);
  }
  if (c->entrypoint.empty()) {
    return Status::Invalid("no training program given: dtrun [flags] PROGRAM [ARGS...] "
                           "(or dtrun --interactive)");
  }
  if (c->module && c->no_python) {
    return Status::Invalid("-m/--module and --no-python cannot be used together");
  }
  if (c->max_restarts < 0) return Status::Invalid("--max-restarts must be >= 0");
  if (c->node_rank < 0 || c->node_rank >= c->max_nodes) {
    return Status::Invalid("--node-rank " + std::to_string(c->node_rank) +
                           " is outside 0.." + std::to_string(c->max_nodes - 1) +
                           " for --nnodes");
  }
  if (c->term_timeout.count() < 0) return Status::Invalid("--term-timeout must be >= 0");
  for (int r : c->local_ranks_filter) {
    if (r < 0 || r >= c->nproc_per_node) {
      return Status::Invalid("--local-ranks-filter: local rank " + std::to_string(r) +
                             " does not exist with --nproc-per-node=" +
                             std::to_string(c->nproc_per_node));
    }
  }
  const std::string& program = c->entrypoint[0];
  if (program.size() > 1 && program[0] == '-') {
    return Status::Invalid("unknown flag '" + program + "' (see dtrun --help)");
  }
  bool python = c->module || c->run_path || (!c->no_python && EndsWith(program, ".py"));
  if (python) {
    std::string interpreter = LookUp(c->python);
    if (interpreter.empty()) {
      return Status::Invalid("--python: cannot find '" + c->python +
                             "' in PATH; install it or pass --python /path/to/python3");
    }
    if (!c->module && access(program.c_str(), R_OK) != 0) {
      return Status::Invalid("training script '" + program + "' not found or not readable");
    }
    c->worker_argv = {interpreter, "-u"};
    c->python_worker = true;
    if (c->module) c->worker_argv.push_back("-m");
  } else {
    std::string path = LookUp(program);
    if (path.empty()) {
      return Status::Invalid("training program '" + program +
                             "' not found or not executable (looked in $PATH); give a path, "
                             "or a .py script");
    }
    c->worker_argv = {path};
    c->worker_argv.insert(c->worker_argv.end(), c->entrypoint.begin() + 1, c->entrypoint.end());
    return Status::Ok();
  }
  c->worker_argv.insert(c->worker_argv.end(), c->entrypoint.begin(), c->entrypoint.end());
  return Status::Ok();
}

}  // namespace dtrun::agent
