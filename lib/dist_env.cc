#include "lib/dist_env.h"

#include <cstdlib>

namespace dtrun::train {
namespace {

// Parses env[key] as an int in [lo, hi]; uses `fallback` when absent and
// optional.
Status ReadInt(const std::map<std::string, std::string>& env, const char* key,
               bool required, int fallback, int lo, int hi, int* out) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) {
    if (required) {
      return Status::Invalid(
          std::string(key) +
          " is not set: start this program with dtrun (or torchrun), "
          "which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
    }
    *out = fallback;
    return Status::Ok();
  }
  char* end = nullptr;
  long v = std::strtol(it->second.c_str(), &end, 10);
  if (*end != '\0' || v < lo || v > hi) {
    return Status::Invalid(std::string(key) + "='" + it->second +
                           "' is not an integer in " + std::to_string(lo) +
                           ".." + std::to_string(hi));
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

}  // namespace

Result<DistEnv> ReadDistEnv(const std::map<std::string, std::string>& env) {
  DistEnv d;
  // WORLD_SIZE first: RANK's range depends on it.
  Status s = ReadInt(env, "WORLD_SIZE", true, 1, 1, 1 << 24, &d.world_size);
  if (s.ok()) s = ReadInt(env, "RANK", true, 0, 0, d.world_size - 1, &d.rank);
  if (s.ok())
    s = ReadInt(env, "LOCAL_RANK", false, 0, 0, 1 << 24, &d.local_rank);
  if (s.ok())
    s = ReadInt(env, "LOCAL_WORLD_SIZE", false, 1, 1, 1 << 24,
                &d.local_world_size);
  if (s.ok())
    s = ReadInt(env, "MASTER_PORT", true, 0, 1, 65535, &d.master_port);
  if (s.ok()) {
    s = ReadInt(env, "TORCHELASTIC_RESTART_COUNT", false, 0, 0, 1 << 30,
                &d.restart_count);
  }
  if (!s.ok()) return s;
  auto addr = env.find("MASTER_ADDR");
  if (addr == env.end() || addr->second.empty()) {
    return Status::Invalid(
        "MASTER_ADDR is not set: start this program with dtrun (or torchrun)");
  }
  d.master_addr = addr->second;
  auto id = env.find("TORCHELASTIC_RUN_ID");
  d.run_id = id == env.end() ? "none" : id->second;  // torchrun's default
  return d;
}

}  // namespace dtrun::train
