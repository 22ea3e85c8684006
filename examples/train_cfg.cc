// train_cfg CONFIG.toml [--set section.key=value ...]
// A config-driven DDP/FSDP trainer on dtrun's library. Run it under
// dtrun (or torchrun): dtrun --nproc-per-node=2 train_cfg
// examples/configs/digits_ddp.toml Exit codes: 0 done, 2 bad config or flag, 1
// training error.
#include <cstdio>
#include <map>
#include <set>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <toml++/toml.h>

#include "lib/process_group.h"
#include "lib/trainer.h"

namespace {

using dtrun::train::TrainConfig;

// Known keys: section -> keys. Anything else is a typo worth an error.
const std::map<std::string, std::set<std::string>> kKeys = {
    {"model", {"type", "hidden", "dropout"}},
    {"data",
     {"source", "path", "samples", "features", "classes", "test_fraction"}},
    {"strategy",
     {"type", "backend", "device", "bucket_cap_mb", "min_unit_params",
      "reshard_after_forward", "prefetch", "param_dtype", "reduce_dtype",
      "cpu_offload", "shared_memory"}},
    {"optimizer", {"type", "lr", "momentum", "weight_decay"}},
    {"schedule", {"type", "warmup_steps"}},
    {"train",
     {"batch_size", "steps", "accumulate", "eval_every", "log_every", "seed",
      "stop_after_step", "drop_last"}},
    {"checkpoint", {"dir", "every", "keep", "format", "mode", "persist_every"}},
    {"fault",
     {"kill_rank", "kill_at_step", "kill_in", "hang_rank", "hang_at_step",
      "slow_rank", "slow_factor", "save_delay_ms"}},
    {"metrics", {"path"}},
};

std::string Check(const toml::table& t) {
  for (const auto& [section, node] : t) {
    std::string s(section.str());
    auto known = kKeys.find(s);
    if (known == kKeys.end()) return "unknown section [" + s + "]";
    if (!node.is_table()) return "'" + s + "' must be a [section]";
    for (const auto& [key, value] : *node.as_table()) {
      if (!known->second.count(std::string(key.str()))) {
        return "unknown key '" + s + "." + std::string(key.str()) + "'";
      }
    }
  }
  return "";
}

// --set section.key=value: the value is read as TOML (numbers, booleans,
// arrays, quoted strings), else taken as a bare string.
std::string ApplySet(toml::table& t, const std::string& arg) {
  auto eq = arg.find('='), dot = arg.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    return "--set '" + arg + "': use section.key=value";
  }
  std::string section = arg.substr(0, dot),
              key = arg.substr(dot + 1, eq - dot - 1);
  std::string value = arg.substr(eq + 1);
  if (!t.contains(section)) t.insert(section, toml::table{});
  toml::table* sec = t[section].as_table();
  if (!sec) return "--set '" + arg + "': '" + section + "' is not a section";
  try {
    toml::table parsed = toml::parse("v = " + value);
    sec->insert_or_assign(key, *parsed.get("v"));
  } catch (const toml::parse_error&) {
    sec->insert_or_assign(key, value);
  }
  return "";
}

template <typename T>
void Read(const toml::table& t, const char* section, const char* key, T* out) {
  auto node = t[section][key];
  if (!node) return;
  // Booleans and strings exactly; numbers may convert (3 -> 3.0) where
  // lossless.
  std::optional<T> v;
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string>) {
    v = node.template value_exact<T>();
  } else {
    v = node.template value<T>();
  }
  if (v) {
    *out = *v;
    return;
  }
  const char* want = std::is_same_v<T, bool>          ? "true or false"
                     : std::is_same_v<T, std::string> ? "a quoted string"
                     : std::is_floating_point_v<T>    ? "a number"
                                                      : "an integer";
  throw std::invalid_argument(std::string(section) + "." + key + " must be " +
                              want);
}

// A choice (strategy.type = "fsdp") into its enum; a name that is not one
// throws, naming the key and the choices.
template <typename E>
void ReadChoice(const toml::table& t, const char* section, const char* key,
                E* out) {
  if (!t[section][key]) return;  // the default stands
  std::string name;
  Read(t, section, key, &name);
  std::string bad =
      dtrun::train::ParseChoice(std::string(section) + "." + key, name, out);
  if (!bad.empty()) throw std::invalid_argument(bad);
}

TrainConfig ToConfig(const toml::table& t) {
  TrainConfig c;
  ReadChoice(t, "model", "type", &c.model);
  if (auto* arr = t["model"]["hidden"].as_array()) {
    c.hidden.clear();
    for (const auto& n : *arr)
      c.hidden.push_back(static_cast<int>(n.value_or<int64_t>(0)));
  }
  Read(t, "model", "dropout", &c.dropout);
  ReadChoice(t, "data", "source", &c.data);
  Read(t, "data", "path", &c.digits_path);
  Read(t, "data", "samples", &c.synthetic_samples);
  Read(t, "data", "features", &c.synthetic_features);
  Read(t, "data", "classes", &c.synthetic_classes);
  Read(t, "data", "test_fraction", &c.test_fraction);
  ReadChoice(t, "strategy", "type", &c.strategy);
  Read(t, "strategy", "backend", &c.backend);
  Read(t, "strategy", "device", &c.device);
  Read(t, "strategy", "bucket_cap_mb", &c.bucket_cap_mb);
  Read(t, "strategy", "min_unit_params", &c.min_unit_params);
  Read(t, "strategy", "reshard_after_forward", &c.reshard_after_forward);
  Read(t, "strategy", "prefetch", &c.prefetch);
  Read(t, "strategy", "param_dtype", &c.param_dtype);
  Read(t, "strategy", "reduce_dtype", &c.reduce_dtype);
  Read(t, "strategy", "cpu_offload", &c.cpu_offload);
  Read(t, "strategy", "shared_memory", &c.shared_memory);
  ReadChoice(t, "optimizer", "type", &c.optimizer);
  Read(t, "optimizer", "lr", &c.lr);
  Read(t, "optimizer", "momentum", &c.momentum);
  Read(t, "optimizer", "weight_decay", &c.weight_decay);
  ReadChoice(t, "schedule", "type", &c.schedule);
  Read(t, "schedule", "warmup_steps", &c.warmup_steps);
  Read(t, "train", "batch_size", &c.batch_size);
  Read(t, "train", "steps", &c.steps);
  Read(t, "train", "accumulate", &c.accumulate);
  Read(t, "train", "drop_last", &c.drop_last);
  Read(t, "train", "eval_every", &c.eval_every);
  Read(t, "train", "log_every", &c.log_every);
  int64_t seed = static_cast<int64_t>(c.seed);
  Read(t, "train", "seed", &seed);
  c.seed = static_cast<uint64_t>(seed);
  Read(t, "train", "stop_after_step", &c.stop_after_step);
  Read(t, "checkpoint", "dir", &c.checkpoint_dir);
  Read(t, "checkpoint", "every", &c.checkpoint_every);
  Read(t, "checkpoint", "keep", &c.keep_checkpoints);
  ReadChoice(t, "checkpoint", "format", &c.checkpoint_format);
  ReadChoice(t, "checkpoint", "mode", &c.checkpoint_mode);
  Read(t, "checkpoint", "persist_every", &c.persist_every);
  // Only memory mode persists some checkpoints and not others.
  if (t["checkpoint"]["persist_every"] &&
      c.checkpoint_mode != dtrun::train::CheckpointMode::kMemory) {
    throw std::invalid_argument(
        "checkpoint.persist_every applies to checkpoint.mode = \"memory\" "
        "(every other mode writes each checkpoint to disk): drop it or set "
        "the mode");
  }
  Read(t, "fault", "kill_rank", &c.kill_rank);
  Read(t, "fault", "kill_at_step", &c.kill_at_step);
  ReadChoice(t, "fault", "kill_in", &c.kill_in);
  Read(t, "fault", "hang_rank", &c.hang_rank);
  Read(t, "fault", "hang_at_step", &c.hang_at_step);
  Read(t, "fault", "slow_rank", &c.slow_rank);
  Read(t, "fault", "slow_factor", &c.slow_factor);
  Read(t, "fault", "save_delay_ms", &c.save_delay_ms);
  Read(t, "metrics", "path", &c.metrics_path);
  return c;
}

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "train_cfg: %s\nusage: train_cfg CONFIG.toml [--set "
               "section.key=value ...]\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("no config file given");
  toml::table table;
  try {
    table = toml::parse_file(argv[1]);
  } catch (const toml::parse_error& e) {
    std::string where = e.source().begin
                            ? " line " + std::to_string(e.source().begin.line)
                            : "";
    return Usage(std::string(argv[1]) + where + ": " +
                 std::string(e.description()));
  }
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg != "--set" || i + 1 >= argc)
      return Usage("unexpected argument '" + arg + "'");
    std::string err = ApplySet(table, argv[++i]);
    if (!err.empty()) return Usage(err);
  }
  std::string err = Check(table);
  if (!err.empty()) return Usage(std::string(argv[1]) + ": " + err);
  TrainConfig config;
  try {
    config = ToConfig(table);
  } catch (const std::invalid_argument& e) {
    return Usage(std::string(argv[1]) + ": " + e.what());
  }
  if (std::string bad = dtrun::train::ValidateConfig(config); !bad.empty()) {
    return Usage(std::string(argv[1]) + ": " + bad);
  }
  try {
    return dtrun::train::Train(config);
  } catch (const std::exception& e) {
    // Train() wrote the launcher's error file (TORCHELASTIC_ERROR_FILE)
    std::fprintf(stderr, "train_cfg: %s\n", e.what());
    return 1;
  }
}
