#include "apps/dtrun/file_timer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace dtrun::agent {

std::optional<TimerRequest> ParseTimerRequest(const std::string& line, std::string* error) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  bool ok = j.is_object() && j.contains("pid") && j["pid"].is_number_integer() &&
            j.contains("scope_id") && j["scope_id"].is_string() &&
            j.contains("expiration_time") && j["expiration_time"].is_number() &&
            j.contains("signal") && j["signal"].is_number_integer();
  if (!ok) {
    *error = "not a FileTimerRequest (pid, scope_id, expiration_time, signal): " + line.substr(0, 200);
    return std::nullopt;
  }
  TimerRequest r;
  r.pid = j["pid"].get<int>();
  r.scope_id = j["scope_id"].get<std::string>();
  r.expiration_time = j["expiration_time"].get<double>();
  r.signal = j["signal"].get<int>();
  return r;
}

void FileTimers::Register(const TimerRequest& request) {
  auto key = std::make_pair(request.pid, request.scope_id);
  if (request.expiration_time < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = request;
  }
}

std::vector<ExpiredTimer> FileTimers::Reap(double now) {
  std::map<int, std::vector<const TimerRequest*>> expired;
  for (const auto& [key, t] : timers_) {
    if (t.expiration_time <= now) expired[key.first].push_back(&t);
  }
  std::vector<ExpiredTimer> out;
  for (auto& [pid, list] : expired) {
    std::sort(list.begin(), list.end(), [](const TimerRequest* a, const TimerRequest* b) {
      return a->expiration_time < b->expiration_time;
    });
    ExpiredTimer e{pid, list[0]->scope_id, 0, list[0]->expiration_time};
    for (const TimerRequest* t : list) {
      if (t->signal > 0) {
        e.scope_id = t->scope_id;
        e.signal = t->signal;
        e.expiration_time = t->expiration_time;
        break;
      }
    }
    out.push_back(e);
  }
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = expired.count(it->first.first) ? timers_.erase(it) : std::next(it);
  }
  return out;
}

std::optional<double> FileTimers::next_expiry() const {
  std::optional<double> first;
  for (const auto& [key, t] : timers_) {
    if (!first || t.expiration_time < *first) first = t.expiration_time;
  }
  return first;
}

}  // namespace dtrun::agent
