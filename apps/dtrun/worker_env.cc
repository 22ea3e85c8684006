#include "apps/dtrun/worker_env.h"

namespace dtrun::agent {

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

}  // namespace dtrun::agent
