// libFuzzer target for the launcher's small parsers of outside bytes: an
// HTTP request's head (the metrics and health server), a worker's beat
// line and /proc's schedstat text (the straggler scores), --rdzv-conf, and
// train_cfg's TOML config with a --set override (the input's first line).
// Each must accept any bytes without crashing, reading past its input, or
// growing without bound, and answer within its contract.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <vector>

#include "apps/dtrun/beat_file.h"
#include "apps/dtrun/http_request.h"
#include "apps/dtrun/rdzv_config.h"
#include "apps/dtrun/straggler.h"
#include "examples/train_cfg_config.h"
#include "lib/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  using dtrun::agent::HttpRequest;
  HttpRequest r = dtrun::agent::ParseHttpRequest(bytes);
  if (r.state == HttpRequest::State::kComplete) {
    if (r.path.empty() || r.path[0] != '/' || r.method.empty()) std::abort();
    if (r.path.size() > dtrun::agent::kMaxRequestHead) std::abort();
  }
  // the beat line: a value or "not given", never a negative step other
  // than "done"
  auto beat = dtrun::agent::ParseBeatLine(bytes);
  if (beat.compute_s < -1 || beat.total_steps < 0) std::abort();
  if (beat.step < -1 && beat.step != dtrun::agent::kBeatDone) std::abort();
  if (dtrun::agent::ParseSchedstatWait(bytes) < -1) std::abort();

  // --rdzv-conf: a config or a message naming what is wrong
  auto conf = dtrun::agent::ParseRdzvConf(bytes);
  if (conf.ok()) {
    if (conf->keep_alive_max_attempt < 1 || conf->join_timeout.count() < 0 ||
        conf->last_call_timeout.count() < 0 ||
        conf->keep_alive_interval.count() <= 0)
      std::abort();
  } else if (conf.status().message().empty()) {
    std::abort();
  }

  // train_cfg: what it accepts passes ValidateConfig; what it refuses says why
  const size_t nl = bytes.find('\n');
  std::vector<std::string> sets;
  if (nl != std::string::npos) sets.push_back(bytes.substr(0, nl));
  dtrun::train::TrainConfig c;
  const std::string err = dtrun::examples::ReadTrainConfig(
      nl == std::string::npos ? bytes : bytes.substr(nl + 1), "fuzz.toml", sets,
      &c);
  if (err.empty() ? !dtrun::train::ValidateConfig(c).empty() : err.size() < 4)
    std::abort();
  return 0;
}
