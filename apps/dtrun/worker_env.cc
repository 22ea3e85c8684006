// The environment contract torchrun gives each worker (RANK, WORLD_SIZE,
// TORCHELASTIC_*; torchrun-compat.md section 4) as a pure function, plus the
// installer of the torch 2.x shim, the one part here that writes files.
#include "apps/dtrun/worker_env.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "apps/dtrun/run_layout.h"
#include "dtrun_torch_shim_files.h"
#include "rendezvous/util/environment.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

// PYTHONPATH split at colons, for an exact membership test: a substring test
// would take "/run/python2" for "/run/python".
std::vector<std::string> PathEntries(const std::string& path) {
  std::vector<std::string> out;
  for (size_t start = 0;;) {
    size_t colon = path.find(':', start);
    out.push_back(path.substr(start, colon - start));
    if (colon == std::string::npos) return out;
    start = colon + 1;
  }
}

std::string Get(const EnvMap& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

}  // namespace

std::string ErrorFilePath(const AttemptEnv& attempt, int local_rank) {
  return layout::ErrorFile(attempt.error_file_dir, local_rank);
}

namespace {

// --virtual-local-rank: each worker's GPU becomes its device 0, so code that
// picks cuda:LOCAL_RANK (torch.compile caches, one-GPU scripts) needs no
// edit. The local rank's entry of CUDA_VISIBLE_DEVICES when it is set.
std::string VirtualDevice(const EnvMap& base, int local_rank) {
  std::string visible = Get(base, "CUDA_VISIBLE_DEVICES");
  if (visible.empty()) return std::to_string(local_rank);
  std::vector<std::string> list;
  for (size_t start = 0;;) {
    size_t comma = visible.find(',', start);
    list.push_back(visible.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return list[static_cast<size_t>(local_rank) % list.size()];
}

// What dtrun sets for torch's sake unless the user did: one OpenMP thread
// per worker, NCCL's async error handling.
void SetTorchDefaults(const EnvMap& base, const WorkerPlace& p, EnvMap* env) {
  // torchrun's guard against oversubscription: N workers each starting one
  // OpenMP thread per core would thrash. A value the user set is kept.
  if (p.local_world_size > 1 && !base.count("OMP_NUM_THREADS"))
    (*env)["OMP_NUM_THREADS"] = "1";
  // Async error handling makes a NCCL collective with a dead peer abort the
  // worker instead of blocking forever, which is what lets a restart happen.
  // torch >= 2.2 reads TORCH_NCCL_ASYNC_ERROR_HANDLING and warns that the
  // old name NCCL_ASYNC_ERROR_HANDLING is deprecated whenever it is set, as
  // torchrun >= 2.2 sets only the new one. Older torch reads only the old
  // name: the Python shim and lib's NCCL group copy the new name's value to
  // it there (a user's own old name passes through untouched).
  constexpr const char* kAsyncErrors = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
  if (!base.count(kAsyncErrors)) (*env)[kAsyncErrors] = "1";
}

}  // namespace

WorkerPlace PlaceOf(int local_rank, int nproc, int base_rank, int group_rank,
                    int group_world_size, int world_size) {
  WorkerPlace place;
  place.local_rank = local_rank;
  place.rank = place.role_rank = base_rank + local_rank;
  place.group_rank = group_rank;
  place.local_world_size = nproc;
  place.world_size = place.role_world_size = world_size;
  place.group_world_size = group_world_size;
  return place;
}

EnvMap WorkerEnv(const EnvMap& base, const AttemptEnv& a,
                 const WorkerPlace& p) {
  // Workers inherit the agent's whole environment, as under torchrun; the
  // variables below then override it, so a RANK or WORLD_SIZE left over from
  // an outer launcher cannot leak into the job.
  EnvMap env = base;
  auto set = [&env](const char* key, const std::string& value) {
    env[key] = value;
  };
  auto num = [&set](const char* key, int value) {
    set(key, std::to_string(value));
  };
  num("LOCAL_RANK", p.local_rank);
  num("RANK", p.rank);
  num("GROUP_RANK", p.group_rank);
  num("ROLE_RANK", p.role_rank);
  set("ROLE_NAME", a.role);
  num("LOCAL_WORLD_SIZE", p.local_world_size);
  num("WORLD_SIZE", p.world_size);
  num("GROUP_WORLD_SIZE", p.group_world_size);
  num("ROLE_WORLD_SIZE", p.role_world_size);
  set("MASTER_ADDR", a.master_addr);
  num("MASTER_PORT", a.master_port);
  num("TORCHELASTIC_RESTART_COUNT", a.restart_count);
  num("TORCHELASTIC_MAX_RESTARTS", a.max_restarts);
  set("TORCHELASTIC_RUN_ID", a.run_id);
  // Always "True" (Python's spelling of the bool): in every mode the store at
  // MASTER_ADDR:MASTER_PORT is hosted by a dtrun agent, so an env:// worker
  // must connect as a client rather than try to bind that port itself.
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_ERROR_FILE", ErrorFilePath(a, p.local_rank));
  SetTorchDefaults(base, p, &env);
  if (!a.signals_to_handle.empty())
    set("TORCHELASTIC_SIGNALS_TO_HANDLE", a.signals_to_handle);
  if (a.virtual_local_rank) {
    set("LOCAL_RANK", "0");
    set("CUDA_VISIBLE_DEVICES", VirtualDevice(base, p.local_rank));
  }
  return env;
}

EnvMap StandbyEnv(const EnvMap& base, int local_world_size) {
  EnvMap env = base;
  WorkerPlace place;
  place.local_world_size = local_world_size;
  SetTorchDefaults(base, place, &env);
  return env;
}

std::vector<std::string> ToEnvStrings(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

bool WantsTorchShim(const EnvMap& env) {
  if (Get(env, kTorchShimSwitch) == "0") return false;
  // DTRUN_TORCH_SHIM_DIR alone is not enough: it is inherited, and a user who
  // then replaced PYTHONPATH has lost the shim. Only the folder actually on
  // the path means a shim (the console's, or an outer dtrun's) is in place.
  std::string dir = Get(env, kTorchShimDir);
  if (dir.empty()) return true;
  for (const auto& entry : PathEntries(Get(env, "PYTHONPATH"))) {
    if (entry == dir) return false;
  }
  return true;
}

EnvMap WithTorchShim(const EnvMap& env, const std::string& dir) {
  EnvMap out = env;
  std::string old = Get(env, "PYTHONPATH");
  // First on the path, because Python imports only the first sitecustomize
  // it finds; the shim itself then runs the one it shadows.
  out["PYTHONPATH"] = old.empty() ? dir : dir + ":" + old;
  out[kTorchShimDir] = dir;
  return out;
}

Status InstallTorchShim(const std::string& dir, EnvMap* env) {
  if (!WantsTorchShim(*env)) return Status::Ok();
  // The folder outlives one attempt (it is per run), so EEXIST is normal.
  // Errors suggest DTRUN_TORCH_SHIM=0: the shim only matters to torch builds
  // without libuv, and the user may not need it at all.
  if (Status s = os::MakeDirs(dir); !s.ok()) {
    return Status::Io("cannot create the torch shim's folder '" + dir + "' (" +
                      s.message() + "); set " + std::string(kTorchShimSwitch) +
                      "=0 to run without it");
  }
  for (const auto& file : kTorchShimFiles) {
    // The embedded files carry their source paths; only the base name
    // matters inside the folder. Rewritten every time (trunc), so a copy
    // left by another dtrun version is never used.
    std::string name = file.path;
    std::string path = dir + "/" + name.substr(name.rfind('/') + 1);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << file.text;
    if (!out.flush()) {
      return Status::Io("cannot write the torch shim '" + path + "'; set " +
                        kTorchShimSwitch + "=0 to run without it");
    }
  }
  *env = WithTorchShim(*env, dir);
  return Status::Ok();
}

}  // namespace dtrun::agent
