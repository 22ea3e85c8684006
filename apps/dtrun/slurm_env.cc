// SLURM_* variables -> the launch facts dtrun would otherwise need as flags,
// with Slurm's compressed host list expanded here so no scontrol (or Slurm
// client at all) is needed on the node. Pure; cli.cc applies the result.
#include "apps/dtrun/slurm_env.h"

#include <cstdlib>

namespace dtrun::agent {
namespace {

int IntOf(const EnvMap& env, const char* key) {
  auto it = env.find(key);
  if (it == env.end()) return 0;
  // SLURM_CPUS_ON_NODE may read "2(x3)" in some versions: take the leading
  // number.
  return std::atoi(it->second.c_str());
}

// Splits at commas outside brackets: "n[1,3],m2" holds commas of both kinds.
// Slurm never nests brackets, so depth 2 is bad syntax rather than a feature.
std::vector<std::string> TopLevelItems(const std::string& list, bool* ok) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) *ok = false;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) *ok = false;
  out.push_back(cur);
  return out;
}

bool ExpandRange(const std::string& prefix, const std::string& ranges,
                 const std::string& suffix, std::vector<std::string>* hosts) {
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    std::string part = ranges.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = part.find('-');
    std::string lo = part.substr(0, dash),
                hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    if (lo.empty() || hi.empty() ||
        lo.find_first_not_of("0123456789") != std::string::npos ||
        hi.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    // A reversed range is a typo; a huge one ("n[0-999999999]") would only
    // exhaust memory, and no allocation spans more than 100000 nodes.
    long a = std::atol(lo.c_str()), b = std::atol(hi.c_str());
    if (b < a || b - a > 100000) return false;
    for (long i = a; i <= b; ++i) {
      // Slurm keeps the low bound's width: n[07-10] names n07..n10, and
      // those are the names the nodes resolve by.
      std::string num = std::to_string(i);
      if (num.size() < lo.size())
        num = std::string(lo.size() - num.size(), '0') + num;
      hosts->push_back(prefix + num + suffix);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

}  // namespace

bool ExpandNodelist(const std::string& list, std::vector<std::string>* hosts) {
  bool ok = true;
  hosts->clear();
  for (const auto& item : TopLevelItems(list, &ok)) {
    if (!ok || item.empty()) return false;
    size_t open = item.find('[');
    if (open == std::string::npos) {
      hosts->push_back(item);
      continue;
    }
    size_t close = item.find(']', open);
    if (close == std::string::npos) return false;
    if (!ExpandRange(item.substr(0, open),
                     item.substr(open + 1, close - open - 1),
                     item.substr(close + 1), hosts)) {
      return false;
    }
  }
  return !hosts->empty();
}

int SlurmJob::master_port() const {
  // Every node computes the same port without talking to the others, and two
  // jobs sharing a node get different ones (torchrun's fixed 29500 collides:
  // pytorch#73320). 20000-39999 stays clear of privileged ports.
  return 20000 +
         static_cast<int>(std::strtoul(job_id.c_str(), nullptr, 10) % 20000);
}

std::optional<SlurmJob> ReadSlurmJob(const EnvMap& env, std::string* error) {
  auto id = env.find("SLURM_JOB_ID");
  if (id == env.end() || id->second.empty() ||
      env.count("DTRUN_IGNORE_SLURM")) {
    return std::nullopt;
  }
  // SLURM_NNODES is the step's node count (srun); SLURM_JOB_NUM_NODES the
  // allocation's, which is all a batch script without srun has.
  SlurmJob job;
  job.job_id = id->second;
  job.nnodes = IntOf(env, "SLURM_NNODES");
  if (job.nnodes == 0) job.nnodes = IntOf(env, "SLURM_JOB_NUM_NODES");
  // Only a job step (srun) sets SLURM_NODEID; without it node_id stays -1 and
  // --node-rank keeps its own default.
  if (env.count("SLURM_NODEID")) job.node_id = IntOf(env, "SLURM_NODEID");
  job.gpus_on_node = IntOf(env, "SLURM_GPUS_ON_NODE");
  job.cpus_on_node = IntOf(env, "SLURM_CPUS_ON_NODE");
  // SLURM_NODELIST is the older name of the same list, still set by Slurm.
  // A list that cannot be expanded is an error, not a silent fallback: the
  // store would otherwise be looked for on the wrong host.
  auto list = env.find("SLURM_JOB_NODELIST");
  if (list == env.end()) list = env.find("SLURM_NODELIST");
  if (list != env.end() && !ExpandNodelist(list->second, &job.hosts)) {
    *error =
        "SLURM_JOB_NODELIST '" + list->second +
        "' is not a node list dtrun understands; pass --master-addr (or set "
        "DTRUN_IGNORE_SLURM=1)";
    return std::nullopt;
  }
  return job;
}

}  // namespace dtrun::agent
