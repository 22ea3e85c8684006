// train_cfg's TOML: toml++ parses, this reads each section into the
// TrainConfig with the type and the choices checked, so that a typo names
// its key and line (exit 2) instead of training with a default.
#include "examples/train_cfg_config.h"

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

// toml++ 3.3's parser asserts (in builds without NDEBUG) on some malformed
// keys ("[\n[c", found by tests/fuzz/parsers_fuzz.cc) that it otherwise
// reports as parse errors, as release builds do: a config is user input,
// so its assertions are off in every build and such bytes exit 2.
#define TOML_ASSERT(expr) static_cast<void>(0)
#include <toml++/toml.h>

namespace dtrun::examples {
namespace {

using dtrun::train::TrainConfig;

// toml++ 3.3 (Debian bookworm's) reaches __builtin_unreachable() when it
// classifies some characters beyond ASCII (U+0361 after a bare key, U+FEFF
// after a quoted one: found by tests/fuzz/parsers_fuzz.cc), and in a
// malformed config only its parser knows which bytes are in a string or a
// comment. So a config is ASCII: anything else is refused, naming the
// line; in a quoted string \uXXXX writes any character. "" when fine.
std::string NonAscii(const std::string& text) {
  int line = 1;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\n') ++line;
    if (c >= 0x80) {
      return "line " + std::to_string(line) +
             ": a character beyond ASCII; configs are ASCII (in a quoted "
             "string write it as \\uXXXX): the TOML parser, toml++ 3.3, "
             "mis-reads some";
    }
  }
  return "";
}

// Known keys: section -> keys. Anything else is a typo worth an error.
const std::map<std::string, std::set<std::string>> kKeys = {
    {"model",
     {"type", "hidden", "dropout", "init_from", "n_layer", "n_head", "n_embd",
      "block_size", "bias"}},
    {"data",
     {"source", "path", "samples", "features", "classes", "test_fraction"}},
    {"strategy",
     {"type", "backend", "device", "bucket_cap_mb", "min_unit_params",
      "reshard_after_forward", "prefetch", "param_dtype", "reduce_dtype",
      "cpu_offload", "shared_memory", "unit_types"}},
    {"optimizer",
     {"type", "lr", "momentum", "weight_decay", "max_grad_norm", "beta1",
      "beta2", "decay"}},
    {"schedule", {"type", "warmup_steps", "min_lr", "decay_steps"}},
    {"train",
     {"batch_size", "steps", "accumulate", "eval_every", "log_every", "seed",
      "stop_after_step", "drop_last", "precision", "eval_iters", "init_scale",
      "growth_interval"}},
    {"checkpoint",
     {"dir", "every", "keep", "format", "mode", "persist_every", "checksum",
      "payload"}},
    {"fault",
     {"kill_rank", "kill_at_step", "kill_in", "hang_rank", "hang_at_step",
      "slow_rank", "slow_factor", "save_delay_ms", "damage_copy_at_step"}},
    {"metrics", {"path"}},
    {"sample", {"prompt", "temperature", "top_k", "from"}},
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
    const std::string line = "v = " + value;
    if (!NonAscii(line).empty())
      throw std::invalid_argument("not TOML");  // a bare string, as below
    toml::table parsed = toml::parse(line);
    const toml::node* v = parsed.get("v");
    if (!v) throw std::invalid_argument("not one value");
    sec->insert_or_assign(key, *v);
  } catch (const std::exception&) {  // toml::parse_error among them
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

// An array of strings (strategy.unit_types = ["Block"]).
void ReadStrings(const toml::table& t, const char* section, const char* key,
                 std::vector<std::string>* out) {
  auto node = t[section][key];
  if (!node) return;
  const std::string where = std::string(section) + "." + key;
  const toml::array* arr = node.as_array();
  if (!arr) throw std::invalid_argument(where + " must be an array of strings");
  out->clear();
  for (const auto& v : *arr) {
    auto str = v.value_exact<std::string>();
    if (!str || str->empty())
      throw std::invalid_argument(where + " must hold non-empty strings");
    out->push_back(*str);
  }
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

// [model], [data] and [strategy]: what is trained, on what, and how the
// ranks share it.
void ReadModelAndStrategy(const toml::table& t, TrainConfig* cfg) {
  TrainConfig& c = *cfg;
  ReadChoice(t, "model", "type", &c.model);
  if (auto* arr = t["model"]["hidden"].as_array()) {
    c.hidden.clear();
    for (const auto& n : *arr)
      c.hidden.push_back(static_cast<int>(n.value_or<int64_t>(0)));
  }
  Read(t, "model", "dropout", &c.dropout);
  Read(t, "model", "n_layer", &c.n_layer);
  Read(t, "model", "n_head", &c.n_head);
  Read(t, "model", "n_embd", &c.n_embd);
  Read(t, "model", "block_size", &c.block_size);
  Read(t, "model", "bias", &c.bias);
  ReadChoice(t, "data", "source", &c.data);
  Read(t, "data", "path",
       c.data == dtrun::train::DataSource::kText ? &c.text_path
                                                 : &c.digits_path);
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
  ReadStrings(t, "strategy", "unit_types", &c.unit_types);
}

// [optimizer], [schedule] and [train]: the loop.
void ReadLoop(const toml::table& t, TrainConfig* cfg) {
  TrainConfig& c = *cfg;
  ReadChoice(t, "optimizer", "type", &c.optimizer);
  Read(t, "optimizer", "lr", &c.lr);
  Read(t, "optimizer", "momentum", &c.momentum);
  Read(t, "optimizer", "weight_decay", &c.weight_decay);
  Read(t, "optimizer", "max_grad_norm", &c.max_grad_norm);
  Read(t, "optimizer", "beta1", &c.beta1);
  Read(t, "optimizer", "beta2", &c.beta2);
  Read(t, "optimizer", "decay", &c.decay);
  Read(t, "train", "precision", &c.precision);
  Read(t, "train", "init_scale", &c.init_scale);
  Read(t, "train", "growth_interval", &c.growth_interval);
  // Only fp16 scales its loss.
  if ((t["train"]["init_scale"] || t["train"]["growth_interval"]) &&
      c.precision != "fp16") {
    throw std::invalid_argument(
        "train.init_scale and train.growth_interval set fp16's loss scale: "
        "drop them or set train.precision = \"fp16\"");
  }
  Read(t, "model", "init_from", &c.init_from);
  ReadChoice(t, "schedule", "type", &c.schedule);
  Read(t, "schedule", "warmup_steps", &c.warmup_steps);
  Read(t, "schedule", "min_lr", &c.min_lr);
  Read(t, "schedule", "decay_steps", &c.decay_steps);
  Read(t, "train", "batch_size", &c.batch_size);
  Read(t, "train", "steps", &c.steps);
  Read(t, "train", "accumulate", &c.accumulate);
  Read(t, "train", "drop_last", &c.drop_last);
  Read(t, "train", "eval_every", &c.eval_every);
  Read(t, "train", "log_every", &c.log_every);
  Read(t, "train", "eval_iters", &c.eval_iters);
  Read(t, "sample", "prompt", &c.sample_prompt);
  Read(t, "sample", "temperature", &c.sample_temperature);
  Read(t, "sample", "top_k", &c.sample_top_k);
  Read(t, "sample", "from", &c.sample_from);
  // TOML integers are signed: a seed is read as one and kept as its bits.
  int64_t seed = static_cast<int64_t>(c.seed);
  Read(t, "train", "seed", &seed);
  c.seed = static_cast<uint64_t>(seed);
  Read(t, "train", "stop_after_step", &c.stop_after_step);
}

// [checkpoint], [fault] and [metrics]: what survives the run and what is
// done to it.
void ReadCheckpoint(const toml::table& t, TrainConfig* cfg) {
  TrainConfig& c = *cfg;
  Read(t, "checkpoint", "dir", &c.checkpoint_dir);
  Read(t, "checkpoint", "every", &c.checkpoint_every);
  Read(t, "checkpoint", "keep", &c.keep_checkpoints);
  ReadChoice(t, "checkpoint", "format", &c.checkpoint_format);
  ReadChoice(t, "checkpoint", "mode", &c.checkpoint_mode);
  ReadChoice(t, "checkpoint", "checksum", &c.checksum);
  ReadChoice(t, "checkpoint", "payload", &c.payload_format);
  Read(t, "checkpoint", "persist_every", &c.persist_every);
  // Only memory mode persists some checkpoints and not others.
  if (t["checkpoint"]["persist_every"] &&
      c.checkpoint_mode != dtrun::train::CheckpointMode::kMemory) {
    throw std::invalid_argument(
        "checkpoint.persist_every applies to checkpoint.mode = \"memory\" "
        "(every other mode writes each checkpoint to disk): drop it or set "
        "the mode");
  }
  Read(t, "metrics", "path", &c.metrics_path);
}

dtrun::train::Faults ToFaults(const toml::table& t) {
  dtrun::train::Faults f;
  Read(t, "fault", "kill_rank", &f.kill_rank);
  Read(t, "fault", "kill_at_step", &f.kill_at_step);
  ReadChoice(t, "fault", "kill_in", &f.kill_in);
  Read(t, "fault", "hang_rank", &f.hang_rank);
  Read(t, "fault", "hang_at_step", &f.hang_at_step);
  Read(t, "fault", "slow_rank", &f.slow_rank);
  Read(t, "fault", "slow_factor", &f.slow_factor);
  Read(t, "fault", "save_delay_ms", &f.save_delay_ms);
  Read(t, "fault", "damage_copy_at_step", &f.damage_copy_at_step);
  return f;
}

TrainConfig ToConfig(const toml::table& t) {
  TrainConfig c;
  ReadModelAndStrategy(t, &c);
  ReadLoop(t, &c);
  ReadCheckpoint(t, &c);
  return c;
}

}  // namespace

std::string ReadTrainConfig(const std::string& text, const std::string& source,
                            const std::vector<std::string>& sets,
                            TrainConfig* out, dtrun::train::Faults* faults) {
  if (std::string bad = NonAscii(text); !bad.empty()) return source + " " + bad;
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::string where = e.source().begin
                            ? " line " + std::to_string(e.source().begin.line)
                            : "";
    return source + where + ": " + std::string(e.description());
  }
  for (const std::string& set : sets) {
    std::string err = ApplySet(table, set);
    if (!err.empty()) return err;
  }
  std::string err = Check(table);
  if (!err.empty()) return source + ": " + err;
  dtrun::train::Faults f;
  try {
    *out = ToConfig(table);
    f = ToFaults(table);
  } catch (const std::invalid_argument& e) {
    return source + ": " + e.what();
  }
  if (std::string bad = dtrun::train::ValidateConfig(*out); !bad.empty())
    return source + ": " + bad;
  if (std::string bad = dtrun::train::ValidateFaults(*out, f); !bad.empty())
    return source + ": " + bad;
  if (faults) *faults = f;
  return "";
}

}  // namespace dtrun::examples
