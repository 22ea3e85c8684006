// libFuzzer target for the launcher's small parsers of outside bytes: an
// HTTP request's head (the metrics and health server), a worker's beat
// line and /proc's schedstat text (the straggler scores). Each must accept
// any bytes without crashing, reading past its input, or growing without
// bound, and answer within its contract.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "apps/dtrun/http_request.h"
#include "apps/dtrun/straggler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  using dtrun::agent::HttpRequest;
  HttpRequest r = dtrun::agent::ParseHttpRequest(bytes);
  if (r.state == HttpRequest::State::kComplete) {
    if (r.path.empty() || r.path[0] != '/' || r.method.empty()) std::abort();
    if (r.path.size() > dtrun::agent::kMaxRequestHead) std::abort();
  }
  if (dtrun::agent::ParseBeatCompute(bytes) < -1) std::abort();
  if (dtrun::agent::ParseBeatTotal(bytes) < 0) std::abort();
  if (dtrun::agent::ParseSchedstatWait(bytes) < -1) std::abort();
  return 0;
}
