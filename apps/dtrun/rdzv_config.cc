// --rdzv-conf parsing: one typed setter per key torchrun documents, a list of
// torchrun keys accepted with a warning, and an error for anything else. Pure;
// called once from cli.cc, before any node joins anything.
#include "apps/dtrun/rdzv_config.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <map>

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

Status Bad(const std::string& key, const std::string& value,
           const std::string& want) {
  return Status::Invalid("--rdzv-conf: " + key + "='" + value + "' is not " +
                         want);
}

// Seconds as torchrun writes them ("60", "0.5"): finite and >= 0 (> 0 when
// `positive`).
Status ParseSeconds(const std::string& key, const std::string& value,
                    bool positive, milliseconds* out) {
  // The 1e9 s cap keeps every product the rendezvous forms (interval x
  // attempts, below) inside int64 milliseconds. Zero is refused where it
  // would mean a busy loop (keep-alive) or a round that can never gather.
  char* end = nullptr;
  double s = std::strtod(value.c_str(), &end);
  if (value.empty() || *end || !std::isfinite(s) || s < 0 ||
      (positive && s == 0) || s > 1e9) {
    return Bad(
        key, value,
        positive ? "a number of seconds > 0" : "a number of seconds >= 0");
  }
  *out = milliseconds(static_cast<int64_t>(std::llround(s * 1000)));
  return Status::Ok();
}

Status ParseAttempts(const std::string& key, const std::string& value,
                     int* out) {
  char* end = nullptr;
  // At most 10^6 so that silent_limit() (10^12 ms x 10^6) cannot overflow.
  long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end || n < 1 || n > 1000000)
    return Bad(key, value, "a whole number >= 1");
  *out = static_cast<int>(n);
  return Status::Ok();
}

// Python's truthy spellings that torchrun's is_host accepts.
Status ParseBool(const std::string& key, const std::string& value,
                 std::optional<bool>* out) {
  static const std::map<std::string, bool> kWords = {
      {"1", true},   {"true", true}, {"True", true},   {"yes", true},
      {"on", true},  {"0", false},   {"false", false}, {"False", false},
      {"no", false}, {"off", false}};
  auto it = kWords.find(value);
  if (it == kWords.end())
    return Bad(key, value, "true or false (1/0, yes/no, on/off)");
  *out = it->second;
  return Status::Ok();
}

// A PEM file's path: it must be readable now, not at the first TLS
// handshake minutes later on some node.
Status ReadableFile(const std::string& key, const std::string& value,
                    std::string* out) {
  if (value.empty() || access(value.c_str(), R_OK) != 0) {
    return Status::Invalid(
        "--rdzv-conf: " + key + "='" + value + "' is not a readable file (" +
        (value.empty() ? "empty" : std::strerror(errno)) + ")");
  }
  *out = value;
  return Status::Ok();
}

// Seconds (> 0) into a setting that has no value until given.
Status ParseOptionalSeconds(const std::string& key, const std::string& value,
                            std::optional<milliseconds>* out) {
  milliseconds t{};
  Status s = ParseSeconds(key, value, true, &t);
  if (s.ok()) *out = t;
  return s;
}

// One table entry per key, so a key has exactly one parser and the error for
// an unknown key can list every known one.
using Setter = std::function<Status(const std::string& value, RdzvConfig* c)>;

// The etcd backend's keys: TLS and authentication.
std::map<std::string, Setter> EtcdSetters() {
  return {
      {"protocol",
       [](const std::string& v, RdzvConfig* c) {
         if (v != "http" && v != "https")
           return Bad("protocol", v, "http or https");
         c->protocol = v;
         c->protocol_given = true;
         return Status::Ok();
       }},
      {"cacert",
       [](const std::string& v, RdzvConfig* c) {
         return ReadableFile("cacert", v, &c->cacert);
       }},
      {"cert", [](const std::string& v,
                  RdzvConfig* c) { return ReadableFile("cert", v, &c->cert); }},
      {"key", [](const std::string& v,
                 RdzvConfig* c) { return ReadableFile("key", v, &c->key); }},
      {"user",
       [](const std::string& v, RdzvConfig* c) {
         if (v.empty()) return Bad("user", v, "an etcd user name");
         c->user = v;
         return Status::Ok();
       }},
      {"password_file",
       [](const std::string& v, RdzvConfig* c) {
         return ReadableFile("password_file", v, &c->password_file);
       }},
  };
}

const std::map<std::string, Setter>& Setters() {
  static const std::map<std::string, Setter> kSetters = [] {
    std::map<std::string, Setter> common = {
        {"join_timeout",
         [](const std::string& v, RdzvConfig* c) {
           c->join_timeout_given = true;
           return ParseSeconds("join_timeout", v, true, &c->join_timeout);
         }},
        {"timeout",
         [](const std::string& v, RdzvConfig* c) {
           return ParseOptionalSeconds("timeout", v, &c->timeout);
         }},
        {"last_call_timeout",
         [](const std::string& v, RdzvConfig* c) {
           return ParseSeconds("last_call_timeout", v, false,
                               &c->last_call_timeout);
         }},
        {"keep_alive_interval",
         [](const std::string& v, RdzvConfig* c) {
           return ParseSeconds("keep_alive_interval", v, true,
                               &c->keep_alive_interval);
         }},
        {"keep_alive_max_attempt",
         [](const std::string& v, RdzvConfig* c) {
           return ParseAttempts("keep_alive_max_attempt", v,
                                &c->keep_alive_max_attempt);
         }},
        {"read_timeout",
         [](const std::string& v, RdzvConfig* c) {
           return ParseOptionalSeconds("read_timeout", v, &c->read_timeout);
         }},
        {"is_host",
         [](const std::string& v, RdzvConfig* c) {
           return ParseBool("is_host", v, &c->is_host);
         }},
    };
    common.merge(EtcdSetters());
    return common;
  }();
  return kSetters;
}

std::string KnownKeys() {
  std::string out;
  for (const auto& [key, setter] : Setters())
    out += (out.empty() ? "" : ", ") + key;
  for (const auto& [key, why] : IgnoredRdzvKeys())
    if (!Setters().count(key)) out += ", " + key;
  return out;
}

Status ApplyItem(const std::string& item, RdzvConfig* c) {
  // Split at the first '=': the value may hold more. An empty item (",,")
  // lands here too and is refused rather than skipped.
  auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0) {
    return Status::Invalid("--rdzv-conf: '" + item +
                           "' is not key=value; give key=value,key=value");
  }
  std::string key = item.substr(0, eq), value = item.substr(eq + 1);
  auto setter = Setters().find(key);
  // `timeout` is read (etcd's join timeout) and, for the other backends,
  // also ignored with a warning.
  if (key == "timeout") c->ignored.push_back(item);
  if (setter != Setters().end()) return setter->second(value, c);
  for (const auto& [ignored, why] : IgnoredRdzvKeys()) {
    if (key != ignored) continue;
    c->ignored.push_back(item);
    return Status::Ok();
  }
  // torchrun silently ignores keys it never reads, so "join_timout=900" runs
  // with the default; dtrun refuses it, since the misspelling is the bug.
  return Status::Invalid("--rdzv-conf: unknown key '" + key + "' (value '" +
                         value + "'); dtrun knows " + KnownKeys());
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& IgnoredRdzvKeys() {
  // Accepted so that torchrun command lines keep working; ElasticJob logs
  // each with its reason when the job starts.
  static const std::vector<std::pair<std::string, std::string>> kIgnored = {
      {"close_timeout",
       "the end of a job is one record every node reads at once"},
      {"heartbeat_timeout",
       "a node is dead after keep_alive_interval x keep_alive_max_attempt"},
      {"store_type", "the rendezvous store is always TCP"},
      {"use_libuv", "dtrun's store serves both of torch's client protocols"},
      {"timeout",
       "the static and c10d backends' store timeout: use read_timeout "
       "(with etcd-v2 it is the join timeout)"},
      {"rank", "use --node-rank"},
  };
  return kIgnored;
}

Result<RdzvConfig> ParseRdzvConf(const std::string& text) {
  RdzvConfig config;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    Status s = ApplyItem(text.substr(start, comma - start), &config);
    if (!s.ok()) return s;
    start = comma + 1;
  }
  return config;
}

}  // namespace dtrun::agent
