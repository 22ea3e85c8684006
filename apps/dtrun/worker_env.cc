#include "apps/dtrun/worker_env.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "dtrun_torch_shim_files.h"
#include "rendezvous/environment.h"

namespace dtrun::agent {
namespace {

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
  return attempt.error_file_dir + "/" + std::to_string(local_rank) + "/error.json";
}

EnvMap WorkerEnv(const EnvMap& base, const AttemptEnv& a, const WorkerPlace& p) {
  EnvMap env = base;
  auto set = [&env](const char* key, const std::string& value) { env[key] = value; };
  auto num = [&set](const char* key, int value) { set(key, std::to_string(value)); };
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
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_ERROR_FILE", ErrorFilePath(a, p.local_rank));
  if (p.local_world_size > 1 && !base.count("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", "1");
  for (const char* key : {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}) {
    if (!base.count(key)) set(key, "1");
  }
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
  out["PYTHONPATH"] = old.empty() ? dir : dir + ":" + old;
  out[kTorchShimDir] = dir;
  return out;
}

Status InstallTorchShim(const std::string& dir, EnvMap* env) {
  if (!WantsTorchShim(*env)) return Status::Ok();
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::Io("cannot create the torch shim's folder '" + dir + "': " +
                      std::strerror(errno) + "; set " + kTorchShimSwitch + "=0 to run without it");
  }
  for (const auto& file : kTorchShimFiles) {
    std::string name = file.path;
    std::string path = dir + "/" + name.substr(name.rfind('/') + 1);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << file.text;
    if (!out.flush()) {
      return Status::Io("cannot write the torch shim '" + path + "'; set " + kTorchShimSwitch +
                        "=0 to run without it");
    }
  }
  *env = WithTorchShim(*env, dir);
  return Status::Ok();
}

Status InstallTorchShimInProcess(const std::string& dir) {
  EnvMap env = ProcessEnvironment();
  if (!WantsTorchShim(env)) return Status::Ok();
  Status s = InstallTorchShim(dir, &env);
  if (!s.ok()) return s;
  setenv("PYTHONPATH", env["PYTHONPATH"].c_str(), 1);
  setenv(kTorchShimDir, dir.c_str(), 1);
  return Status::Ok();
}

}  // namespace dtrun::agent
