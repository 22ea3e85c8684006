// torch's FileTimerServer rules (file_based_local_timer.py) as a pure core:
// parse one request line, keep a deadline per (pid, scope), say who expired.
// timer_pipe.cc is the shell that owns the named pipe and sends the signals.
#include "apps/dtrun/file_timer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace dtrun::agent {

std::optional<TimerRequest> ParseTimerRequest(const std::string& line,
                                              std::string* error) {
  // Any process that can open the pipe can write to it, so a malformed line
  // is an error to log, never an exception that would stop the agent. Only
  // the four fields the server acts on are required ("version" is not).
  nlohmann::json j =
      nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  bool ok = j.is_object() && j.contains("pid") &&
            j["pid"].is_number_integer() && j.contains("scope_id") &&
            j["scope_id"].is_string() && j.contains("expiration_time") &&
            j["expiration_time"].is_number() && j.contains("signal") &&
            j["signal"].is_number_integer();
  // The echo is cut at 200 bytes: the line is worker-controlled and may be
  // long binary noise that would flood the agent's log.
  if (!ok) {
    *error =
        "not a FileTimerRequest (pid, scope_id, expiration_time, signal): " +
        line.substr(0, 200);
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
  // Keyed by (pid, scope) as torch's dict is: acquiring a scope again moves
  // its deadline instead of adding a second timer, and a negative expiration
  // (the client's release) removes it.
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
  // Per worker, torch sorts its expired timers by expiration and sends the
  // signal of the first with signal > 0; with none it reaps nothing but still
  // reports (and clears) them, so a worker is never signalled twice for one
  // expiry.
  std::vector<ExpiredTimer> out;
  for (auto& [pid, list] : expired) {
    std::sort(list.begin(), list.end(),
              [](const TimerRequest* a, const TimerRequest* b) {
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
  // Every timer of a reaped worker goes, not just the expired ones: the
  // worker is being killed, and torch's clear_timers drops the whole pid.
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = expired.count(it->first.first) ? timers_.erase(it) : std::next(it);
  }
  return out;
}

std::optional<double> FileTimers::next_expiry() const {
  // A linear scan: a worker holds a handful of scopes at most, and the
  // result only sizes the poll timeout of the loop.
  std::optional<double> first;
  for (const auto& [key, t] : timers_) {
    if (!first || t.expiration_time < *first) first = t.expiration_time;
  }
  return first;
}

}  // namespace dtrun::agent
