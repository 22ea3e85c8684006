// Live status: the sampler (pure), the JSON and table formats (pure), the
// host's job registry and `dtrun --status` (files, /proc, the store).
#include "apps/dtrun/job_status.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "apps/dtrun/endpoint.h"
#include "apps/dtrun/hang_monitor.h"
#include "apps/dtrun/rdzv_backend.h"
#include "apps/dtrun/run_layout.h"
#include "rendezvous/store_client.h"
#include "rendezvous/util/os_util.h"
#include "rendezvous/store_keys.h"

namespace dtrun::agent {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "12.3" for a value, "-" for none (negative).
std::string Cell(double v, const char* format) {
  if (v < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// A straggler score, marked when it is under nvidia-resiliency-ext's 0.75.
std::string Score(double score) {
  if (score < 0) return "-";
  return Cell(score, "%.2f") + (score < 0.75 ? " STRAGGLER" : "");
}

std::string Pad(std::string text, size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

// A folder without its trailing slashes, for comparing paths as given.
std::string Folder(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

// Step time comes from the steps done between two observations (a second
// apart), not from single beats: a beat per step of 10 ms would need the
// agent to read every one of them.
std::vector<WorkerStatus> StatusSampler::Sample(
    const std::vector<WorkerObservation>& seen, double now_unix) {
  std::vector<WorkerStatus> out;
  for (const WorkerObservation& w : seen) {
    WorkerStatus s;
    s.seen = w;
    if (w.beat_unix > 0) s.beat_age_s = std::max(0.0, now_unix - w.beat_unix);
    History& h = history_[w.local_rank];
    if (h.pid == w.pid && h.seen_unix > 0) {
      double wall = now_unix - h.seen_unix;
      if (wall > 0) s.cpu_pct = 100 * (w.cpu_seconds - h.cpu_seconds) / wall;
      if (w.step > h.step && h.step >= 0 && w.beat_unix > h.beat_unix) {
        h.step_times.push_back((w.beat_unix - h.beat_unix) /
                               static_cast<double>(w.step - h.step));
        if (h.step_times.size() > window_)
          h.step_times.erase(h.step_times.begin());
      }
    } else {
      h = History{};  // a new worker in this slot
    }
    if (w.step > h.step || h.step < 0) {
      h.step = w.step;
      h.beat_unix = w.beat_unix;
    }
    h.pid = w.pid;
    h.cpu_seconds = w.cpu_seconds;
    h.seen_unix = now_unix;
    if (!h.step_times.empty()) s.step_time_last_s = h.step_times.back();
    s.step_time_median_s = Median(h.step_times);
    out.push_back(s);
  }
  return out;
}

// Field names are the interface of `dtrun --status --json`: keep them. A
// value that is not known yet is -1 (a step before the first beat, a step
// time before two observations with steps between them).
nlohmann::json NodeStatusJson(const NodeFacts& f,
                              const std::vector<WorkerStatus>& workers,
                              double now_unix) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const WorkerStatus& w : workers) {
    ranks.push_back({{"rank", w.seen.rank},
                     {"local_rank", w.seen.local_rank},
                     {"pid", w.seen.pid},
                     {"state", w.seen.state},
                     {"step", w.seen.step},
                     {"total_steps", w.seen.total_steps},
                     {"beat_age_s", w.beat_age_s},
                     {"step_time_last_s", w.step_time_last_s},
                     {"step_time_median_s", w.step_time_median_s},
                     {"rss_mb", w.seen.rss_mb},
                     {"cpu_pct", w.cpu_pct},
                     {"cpu_seconds", w.seen.cpu_seconds}});
  }
  return {{"run_id", f.run_id},
          {"host", f.host},
          {"group_rank", f.group_rank},
          {"group_world_size", f.group_world_size},
          {"attempt", f.attempt},
          {"restarts", f.attempt},
          {"max_restarts", f.max_restarts},
          {"started_unix", f.started_unix},
          {"updated_unix", now_unix},
          {"ranks", ranks}};
}

namespace {

using ScoresByRank = std::map<int, const RankScore*>;

ScoresByRank ByRank(const std::vector<RankScore>& scores) {
  ScoresByRank by_rank;
  for (const RankScore& s : scores) by_rank[s.rank] = &s;
  return by_rank;
}

// Looked up by rank, in one map for the whole job: the job view scores
// every node's ranks with every rank's scores, which would otherwise cost
// ranks x ranks (4,096 ranks: 386 ms a pass, now 10 ms).
void ApplyScores(const ScoresByRank& by_rank, nlohmann::json* node) {
  for (nlohmann::json& r : (*node)["ranks"]) {
    auto it = by_rank.find(r.value("rank", -1));
    r["compute_typical_s"] = it == by_rank.end() ? -1.0 : it->second->typical_s;
    r["straggler_score"] = it == by_rank.end() ? -1.0 : it->second->score;
  }
}

}  // namespace

void AddScores(const std::vector<RankScore>& scores, nlohmann::json* node) {
  ApplyScores(ByRank(scores), node);
}

// Typical times come from each node's own window; the fastest of the whole
// job sets every rank's score, so a slow node shows against the others.
void ScoreJob(std::vector<nlohmann::json>* nodes) {
  std::map<int, double> typical;
  for (const nlohmann::json& n : *nodes) {
    auto ranks = n.find("ranks");  // not value(): that copies every rank
    if (ranks == n.end() || !ranks->is_array()) continue;
    for (const nlohmann::json& r : *ranks)
      typical[r.value("rank", 0)] = r.value("compute_typical_s", -1.0);
  }
  const std::vector<RankScore> scores = ScoreTypical(typical);
  const ScoresByRank by_rank = ByRank(scores);
  for (nlohmann::json& n : *nodes) ApplyScores(by_rank, &n);
}

// Reads the records leniently (value() with defaults): a node of another
// dtrun version may lack a field, and the table should still print.
std::string FormatJobStatus(const std::vector<nlohmann::json>& nodes) {
  std::string out;
  for (const nlohmann::json& n : nodes) {
    out += "node " + std::to_string(n.value("group_rank", 0)) + " of " +
           std::to_string(n.value("group_world_size", 1)) + " on " +
           n.value("host", std::string("?")) + ": attempt " +
           std::to_string(n.value("attempt", 0)) + ", " +
           std::to_string(n.value("restarts", 0)) + " restart(s)\n";
    out +=
        "  rank  pid      state                  step      beat  "
        "step(last/median)  rss_mb  cpu%  score\n";
    for (const nlohmann::json& r : n.value("ranks", nlohmann::json::array())) {
      out += "  " + Pad(std::to_string(r.value("rank", 0)), 6) +
             Pad(std::to_string(r.value("pid", 0)), 9) +
             Pad(r.value("state", std::string()), 23) +
             Pad(r.value("step", int64_t{-1}) < 0
                     ? "-"
                     : std::to_string(r.value("step", int64_t{-1})),
                 10) +
             Pad(Cell(r.value("beat_age_s", -1.0), "%.1fs"), 6) +
             Pad(Cell(r.value("step_time_last_s", -1.0), "%.4f") + "/" +
                     Cell(r.value("step_time_median_s", -1.0), "%.4f"),
                 19) +
             Pad(Cell(r.value("rss_mb", -1.0), "%.0f"), 8) +
             Pad(Cell(r.value("cpu_pct", -1.0), "%.0f"), 6) +
             Score(r.value("straggler_score", -1.0)) + "\n";
    }
  }
  return out;
}

void ObserveBeat(const Beat& beat, WorkerObservation* w) {
  if (!beat.seen()) return;
  if (beat.line.step >= 0) w->step = beat.line.step;
  w->total_steps = beat.line.total_steps;
  w->beat_unix = beat.unix_s();
}

// /proc/<pid>/stat's fields 14 and 15 (utime, stime, in clock ticks) come
// after the command name, which may hold spaces: counted from its ')'.
void ObserveProcess(int pid, WorkerObservation* w) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::string stat = os::ReadFileOrEmpty(proc + "/stat");
  size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    std::istringstream in(stat.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::atof(field.c_str());
      if (i == 15) stime = std::atof(field.c_str());
    }
    w->cpu_seconds =
        (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  std::istringstream statm(os::ReadFileOrEmpty(proc + "/statm"));
  double size = 0, resident = 0;
  if (statm >> size >> resident)
    w->rss_mb =
        resident * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// Per user, so that one user's jobs are not listed (or removed) by another;
// the runtime folder is the systemd session's, /tmp the fallback.
std::string RegistryDir(const std::map<std::string, std::string>& env) {
  auto runtime = env.find("XDG_RUNTIME_DIR");
  if (runtime != env.end() && !runtime->second.empty())
    return runtime->second + "/dtrun";
  return "/tmp/dtrun-" + std::to_string(getuid());
}

nlohmann::json RegistryJson(const RegistryEntry& e) {
  return {{"pid", e.pid},
          {"run_id", e.run_id},
          {"run_dir", e.run_dir},
          {"store", e.store},
          {"elastic", e.elastic},
          {"started_unix", e.started_unix},
          {"store_settings", e.store_settings}};
}

// Lenient: a file being written, or left by another version, is skipped
// rather than failing the whole listing.
std::vector<RegistryEntry> ReadRegistry(const std::string& dir) {
  std::vector<RegistryEntry> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* f = readdir(d)) {
    std::string name = f->d_name;
    if (name.size() < 6 || name.substr(name.size() - 5) != ".json") continue;
    auto j = nlohmann::json::parse(os::ReadFileOrEmpty(dir + "/" + name),
                                   nullptr, false);
    if (!j.is_object()) continue;
    RegistryEntry e;
    e.pid = j.value("pid", 0);
    // A job whose dtrun is gone (killed with -9) left its file behind.
    if (e.pid <= 0 || (kill(e.pid, 0) != 0 && errno == ESRCH)) continue;
    e.run_id = j.value("run_id", std::string());
    e.run_dir = j.value("run_dir", std::string());
    e.store = j.value("store", std::string());
    auto settings = j.find("store_settings");
    if (settings != j.end() && settings->is_object()) {
      for (const auto& [key, value] : settings->items())
        if (value.is_string()) e.store_settings[key] = value.get<std::string>();
    }
    e.elastic = j.value("elastic", false);
    e.started_unix = j.value("started_unix", 0.0);
    out.push_back(e);
  }
  closedir(d);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return out;
}

// One line per job: what a user needs to pick the RUN for --status.
std::string FormatJobList(const std::vector<RegistryEntry>& jobs,
                          double now_unix) {
  if (jobs.empty()) return "no dtrun job runs on this host\n";
  std::string out =
      "pid      run id                  running  store"
      "                  log folder\n";
  for (const RegistryEntry& e : jobs) {
    out += Pad(std::to_string(e.pid), 9) + Pad(e.run_id, 24) +
           Pad(Cell(now_unix - e.started_unix, "%.0fs"), 9) +
           Pad(e.store.empty() ? "-" : e.store, 23) + e.run_dir + "\n";
  }
  return out;
}

// Written whole (a temporary name, then a rename), so a concurrent
// `dtrun --status` never reads half an entry.
Registration::Registration(const std::string& dir, const RegistryEntry& e) {
  if (!os::MakeDirs(dir).ok()) return;  // status is best effort
  path_ = dir + "/" + std::to_string(e.pid) + ".json";
  std::string tmp = path_ + ".tmp";
  if (os::WriteFile(tmp, RegistryJson(e).dump()).ok())
    std::rename(tmp.c_str(), path_.c_str());
}

Registration::~Registration() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

namespace {

// The job `target` names among this host's: its run id, its run folder or
// the log folder above it, or its store's address.
const RegistryEntry* Match(const std::vector<RegistryEntry>& jobs,
                           const std::string& target) {
  const std::string folder = Folder(target);
  for (const RegistryEntry& e : jobs) {
    std::string parent = e.run_dir.substr(0, e.run_dir.rfind('/'));
    if (e.run_id == target || e.run_dir == folder || parent == folder ||
        (!e.store.empty() && e.store == target))
      return &e;
  }
  return nullptr;
}

// A job's rendezvous store (a TCP store, or etcd), and its run id:
// `run_id`, or the run that published its status there last when empty.
struct JobStore {
  std::unique_ptr<rendezvous::Store> client;
  std::string run_id;
  int nodes = 0;
};
Result<JobStore> OpenJobStore(const StoreLocation& where, std::string run_id,
                              std::chrono::milliseconds timeout) {
  auto client = OpenStoreAt(where, timeout);
  if (!client.ok()) return client.status();
  JobStore job{std::move(*client), std::move(run_id)};
  if (job.run_id.empty()) {
    auto last = job.client->Get(rendezvous::keys::kLastRun);
    if (!last.ok()) {
      return Status::Invalid("no dtrun job published its status at " +
                             where.address);
    }
    job.run_id = *last;
  }
  auto nodes = job.client->Get(rendezvous::keys::StatusNodes(job.run_id));
  if (!nodes.ok()) return nodes.status();
  job.nodes = std::atoi(nodes->c_str());
  return job;
}

// Every node's record, from the store at `address` (several nodes).
Result<std::vector<nlohmann::json>> NodesFromStore(const StoreLocation& where,
                                                   std::string run_id) {
  auto job = OpenJobStore(where, std::move(run_id), std::chrono::seconds(5));
  if (!job.ok()) return job.status();
  std::vector<std::string> keys;
  for (int g = 0; g < job->nodes; ++g)
    keys.push_back(rendezvous::keys::NodeStatus(job->run_id, g));
  auto records = job->client->MultiGet(keys);
  if (!records.ok()) return records.status();
  std::vector<nlohmann::json> out;
  for (const std::string& r : *records) {
    auto j = nlohmann::json::parse(r, nullptr, false);
    if (j.is_object()) out.push_back(j);
  }
  return out;
}

// One node's answer from its run folder: the request file, then the answer
// the agent writes within a second or two (more while stacks are taken).
Result<std::vector<std::string>> StacksFromFolder(const std::string& dir) {
  const std::string id = std::to_string(getpid()) + "_" + os::RandomHex(6);
  const std::string request = layout::StackRequest(dir);
  Status s = os::WriteFile(request + ".tmp", id + "\n");
  if (!s.ok()) return s;
  std::rename((request + ".tmp").c_str(), request.c_str());
  const std::string answer = layout::StackAnswer(dir, id);
  for (int i = 0; i < 300; ++i) {  // 30 s
    std::string text = os::ReadFileOrEmpty(answer);
    if (!text.empty()) {
      ::unlink(answer.c_str());
      return std::vector<std::string>{text};
    }
    usleep(100 * 1000);
  }
  ::unlink(request.c_str());
  return Status::Timeout("the job's agent did not answer within 30 s");
}

// Every node's answer through the store: one more request on the counter,
// then a WAIT for as many answers as the job has nodes.
Result<std::vector<std::string>> StacksFromStore(const StoreLocation& where,
                                                 std::string run_id) {
  auto job = OpenJobStore(where, std::move(run_id), std::chrono::seconds(30));
  if (!job.ok()) return job.status();
  auto n = job->client->Add(rendezvous::keys::StackRequest(job->run_id), 1);
  if (!n.ok()) return n.status();
  std::vector<std::string> keys;
  for (int g = 0; g < job->nodes; ++g)
    keys.push_back(rendezvous::keys::StackAnswer(job->run_id, *n, g));
  Status s = job->client->Wait(keys, std::chrono::seconds(30));
  if (!s.ok()) return s;
  return job->client->MultiGet(keys);
}

// One node's record, from its run folder.
Result<std::vector<nlohmann::json>> NodesFromFolder(const std::string& dir) {
  auto j = nlohmann::json::parse(os::ReadFileOrEmpty(layout::StatusFile(dir)),
                                 nullptr, false);
  if (!j.is_object())
    return Status::Unavailable(layout::StatusFile(dir) +
                               " holds no status yet");
  return std::vector<nlohmann::json>{j};
}

// The job as a table, or as {"nodes": [...]} for machines.
int PrintJob(const std::vector<nlohmann::json>& nodes, bool json) {
  if (json) {
    std::printf("%s\n", nlohmann::json{{"nodes", nodes}}.dump(2).c_str());
  } else {
    std::fputs(FormatJobStatus(nodes).c_str(), stdout);
  }
  return 0;
}

// Where a query for `target` goes: a job of this host to its rendezvous
// store (several nodes: a TCP store or etcd) or its run folder (one), a
// host:port or an etcd cluster's http(s):// address that matches no job
// here to that store (another host's job).
template <typename T, typename FromStore, typename FromFolder>
Result<T> Ask(const std::string& target,
              const std::map<std::string, std::string>& env,
              FromStore from_store, FromFolder from_folder) {
  std::vector<RegistryEntry> jobs = ReadRegistry(RegistryDir(env));
  const RegistryEntry* job = Match(jobs, target);
  if (job && job->elastic)
    return from_store(StoreLocation{job->store, job->store_settings},
                      job->run_id);
  if (job) return from_folder(job->run_dir);
  if (target.find(':') != std::string::npos)
    return from_store(StoreLocation{target, {}}, "");
  return Status::Invalid("no dtrun job on this host matches '" + target + "'");
}

// A query that found no answer: what went wrong and what to give; exit 2.
int Refuse(const char* flag, const Status& why) {
  std::fprintf(stderr,
               "dtrun %s: %s; give a run id, a log folder, a store's "
               "host:port or an etcd cluster's http(s)://host:port,... "
               "(dtrun --status lists this host's jobs)\n",
               flag, why.message().c_str());
  return 2;
}

// Every rank's stack under a header naming it and its host, in rank order.
int PrintStacks(const std::vector<std::string>& answers) {
  std::map<int, std::pair<std::string, std::string>> by_rank;  // host, text
  for (const std::string& a : answers) {
    auto j = nlohmann::json::parse(a, nullptr, false);
    if (!j.is_object()) continue;
    std::string host = j.value("host", std::string("?"));
    const nlohmann::json stacks = j.value("stacks", nlohmann::json::object());
    for (const auto& [rank, text] : stacks.items()) {
      if (text.is_string())
        by_rank[std::atoi(rank.c_str())] = {host, text.get<std::string>()};
    }
  }
  for (const auto& [rank, where] : by_rank) {
    std::printf("=== rank %d on %s ===\n%s\n", rank, where.first.c_str(),
                where.second.c_str());
  }
  return 0;
}

}  // namespace

int RunStacksCommand(const std::string& target,
                     const std::map<std::string, std::string>& env) {
  auto answers = Ask<std::vector<std::string>>(target, env, StacksFromStore,
                                               StacksFromFolder);
  if (!answers.ok()) return Refuse("--stacks", answers.status());
  return PrintStacks(*answers);
}

// A job of this host is read where it keeps its status: a single node's
// folder, or the rendezvous store every node of an elastic job publishes
// to. A host:port that matches no job here is another host's store.
int RunStatusCommand(const std::string& target, bool json,
                     const std::map<std::string, std::string>& env) {
  if (target.empty()) {
    std::vector<RegistryEntry> jobs = ReadRegistry(RegistryDir(env));
    if (!json) {
      std::fputs(FormatJobList(jobs, os::UnixNow()).c_str(), stdout);
      return 0;
    }
    nlohmann::json list = nlohmann::json::array();
    for (const RegistryEntry& e : jobs) list.push_back(RegistryJson(e));
    std::printf("%s\n", nlohmann::json{{"jobs", list}}.dump(2).c_str());
    return 0;
  }
  auto nodes = Ask<std::vector<nlohmann::json>>(target, env, NodesFromStore,
                                                NodesFromFolder);
  if (!nodes.ok()) return Refuse("--status", nodes.status());
  ScoreJob(&*nodes);
  return PrintJob(*nodes, json);
}

}  // namespace dtrun::agent
