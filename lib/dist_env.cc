// torchrun's worker environment read into typed values, each one checked
// with a message that names the variable, and torch's error-file format
// written by hand (no JSON library in lib for one line).
#include "lib/dist_env.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>

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

namespace {

// A JSON string literal: quotes, backslashes and control characters
// escaped, the rest (UTF-8 included) as it is.
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

// torch's record, so that dtrun and torchrun read it alike: the message
// with its type, and the time that decides which rank failed first.
bool WriteWorkerErrorFile(const std::string& path, const std::string& type,
                          const std::string& message) {
  if (path.empty()) return false;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const std::string json =
      "{\"message\": {\"message\": " + JsonString(type + ": " + message) +
      ", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": \"" +
      std::to_string(static_cast<long long>(std::time(nullptr))) + "\"}}}\n";
  const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace dtrun::train
