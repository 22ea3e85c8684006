// The job's watcher on a node of a multi-node job (elastic_watch.h): what
// the local group sees, to and from the rendezvous store.
#include "apps/dtrun/elastic_watch.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <thread>

#include "apps/dtrun/in_place.h"
#include "apps/dtrun/job.h"
#include "apps/dtrun/interactive_protocol.h"
#include "apps/dtrun/job_status.h"
#include "apps/dtrun/metrics.h"
#include "rendezvous/store_keys.h"
#include "rendezvous/store_proxy.h"
#include "rendezvous/store_server.h"
#include "rendezvous/util/log.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

// How long a node that declared a hang waits for the other nodes' ranks: a
// node answers on its next status tick (1 s), and its Python workers' stacks
// take up to 3 s to come.
constexpr milliseconds kShareWait{6000};

}  // namespace

ElasticWatch::ElasticWatch(const LaunchConfig& config, const Clock* clock)
    : config_(config), clock_(clock) {}

void ElasticWatch::set_stores(rendezvous::StoreServer* rendezvous,
                              rendezvous::StoreServer* workers,
                              rendezvous::StoreProxy* proxy) {
  rendezvous_server_ = rendezvous;
  worker_server_ = workers;
  proxy_ = proxy;
}

void ElasticWatch::TakeRound(const rendezvous::Assignment& assignment) {
  assignment_ = assignment;
  joined_ = true;
  store_answers_ = true;
}

void ElasticWatch::set_worker_store(const std::string& host, uint16_t port) {
  worker_host_ = host;
  worker_port_ = port;
  worker_link_.reset();
}

rendezvous::TcpStoreClient* ElasticWatch::WorkerLink() {
  if (!worker_link_ && worker_port_ != 0) {
    rendezvous::StoreClientOptions opts;
    opts.host = worker_host_;
    opts.port = worker_port_;
    opts.timeout = std::chrono::seconds(5);
    opts.connect_timeout = std::chrono::seconds(5);
    auto client = rendezvous::TcpStoreClient::Connect(opts);
    if (client.ok()) worker_link_ = std::move(*client);
  }
  return worker_link_.get();
}

int ElasticWatch::ClaimReplacement(int current) {
  return in_place::Claim(WorkerLink(), current,
                         "node " + std::to_string(assignment_.group_rank));
}

bool ElasticWatch::OnReplacing(int restart_count, int rank) {
  return in_place::Announce(WorkerLink(), restart_count, rank);
}

void ElasticWatch::OnReplaced(int restart_count) {
  in_place::Release(WorkerLink(), restart_count);
}

void ElasticWatch::OnWorkerCrash(const WorkerCrash& crash) {
  if (!store_) return;
  // Beside the session's round key, on the store the console attaches to.
  Status s = PublishCrash(
      store_, interactive_protocol::NodesCrashPrefix(config_.rdzv_id), crash,
      ++crashes_);
  if (!s.ok())
    Logger("dtrun.agent")
        ->warn("cannot publish the crash for the console: {}", s.message());
}

// A SET a second per node (three on group rank 0): the store's load from
// status stays flat however long the job runs. A failed SET only leaves the
// previous record; the job does not depend on it.
void ElasticWatch::OnStatus(const std::string& json) {
  if (!publishing()) return;
  const std::string& run = config_.rdzv_id;
  Status s = store_->Set(
      rendezvous::keys::NodeStatus(run, assignment_.group_rank), json);
  if (s.ok() && assignment_.group_rank == 0) {
    s = store_->Set(rendezvous::keys::StatusNodes(run),
                    std::to_string(assignment_.group_world_size));
    if (s.ok()) s = store_->Set(rendezvous::keys::kLastRun, run);
  }
  if (!s.ok())
    Logger("dtrun.rdzv")->debug("status not published: {}", s.message());
}

// `dtrun --stacks` through the store: a request is the counter moving on;
// this node answers it under its group rank. Requests made before this
// node first looked are not answered.
bool ElasticWatch::StacksWanted() {
  if (!publishing()) return false;
  auto n = store_->Add(rendezvous::keys::StackRequest(config_.rdzv_id), 0);
  if (!n.ok()) return false;
  if (stacks_served_ < 0 || *n <= stacks_served_) {
    stacks_served_ = *n;
    return false;
  }
  stacks_asked_ = *n;
  return true;
}

// The answer goes under every request since the last one answered, each
// keyed by this node's group rank, so `dtrun --stacks` and a node weighing a
// hang each find it under the request they made.
void ElasticWatch::AnswerStacks(const std::string& json) {
  Status s = Status::Ok();
  // Requests that came while this node was busy are answered alike: two
  // nodes that declare the same hang at once each wait for the other's.
  for (int64_t r = stacks_served_ + 1; r <= stacks_asked_ && s.ok(); ++r) {
    s = store_->Set(rendezvous::keys::StackAnswer(config_.rdzv_id, r,
                                                  assignment_.group_rank),
                    json);
  }
  stacks_served_ = std::max(stacks_served_, stacks_asked_);
  if (!s.ok())
    Logger("dtrun.rdzv")->debug("stacks not answered: {}", s.message());
}

// While this node shares a hang of its own it answers the others' requests
// with its own ranks: two nodes that declare the same hang at once each
// wait for the other's answer.
Status ElasticWatch::AnswerStackRequests(const std::string& json) {
  auto n = store_->Add(rendezvous::keys::StackRequest(config_.rdzv_id), 0);
  if (!n.ok()) return n.status();
  if (stacks_served_ >= 0 && *n > stacks_served_) {
    stacks_asked_ = *n;
    AnswerStacks(json);
  }
  stacks_served_ = std::max(stacks_served_, *n);
  return Status::Ok();
}

// One MultiGet a second on one node: the store's load from the job-wide
// view does not grow with the number of nodes that look. Until every node
// of the round has published, the node shows its own ranks.
std::vector<nlohmann::json> ElasticWatch::JobView() {
  if (!publishing() || assignment_.group_rank != 0) return {};
  std::vector<std::string> keys;
  for (int g = 0; g < assignment_.group_world_size; ++g)
    keys.push_back(rendezvous::keys::NodeStatus(config_.rdzv_id, g));
  auto there = store_->Check(keys);
  if (!there.ok() || !*there) return {};
  auto records = store_->MultiGet(keys);
  if (!records.ok()) return {};
  std::vector<nlohmann::json> nodes;
  for (const std::string& text : *records) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object()) nodes.push_back(std::move(j));
  }
  ScoreJob(&nodes);
  return nodes;
}

// The rendezvous store lives on the node that bound its port; the
// workers' store on the round's group rank 0. Each is counted where it is.
std::string ElasticWatch::StoreMetrics() {
  std::vector<StoreSample> stores;
  if (rendezvous_server_)
    stores.push_back(SampleStore("rendezvous", rendezvous_server_));
  if (worker_server_) stores.push_back(SampleStore("workers", worker_server_));
  std::string text = StoreMetricsText(stores, joined_ ? assignment_.round : -1,
                                      config_.rdzv_id);
  if (proxy_) {
    const rendezvous::StoreProxy::Counts c = proxy_->GetCounts();
    text += ProxyMetricsText(
        {c.workers, c.frames_up, c.upstream_writes, c.upstream_lost},
        config_.rdzv_id);
  }
  return text;
}

// The same request as `dtrun --stacks`: every node answers it within a
// second or so (its status tick), or at once when it is sharing a hang of
// its own. Nodes that do not answer in time are left out of the weighing.
std::vector<std::string> ElasticWatch::ShareHang(const std::string& mine) {
  const std::string& run = config_.rdzv_id;
  const int me = assignment_.group_rank;
  auto n = store_->Add(rendezvous::keys::StackRequest(run), 1);
  if (!n.ok() ||
      !store_->Set(rendezvous::keys::StackAnswer(run, *n, me), mine).ok())
    return {};
  if (stacks_served_ == *n - 1) stacks_served_ = *n;  // this node's own
  std::map<int, std::string> answers;
  const TimePoint until = clock_->Now() + kShareWait;
  while (static_cast<int>(answers.size()) + 1 < assignment_.group_world_size &&
         clock_->Now() < until) {
    (void)AnswerStackRequests(mine);
    for (int g = 0; g < assignment_.group_world_size; ++g) {
      if (g == me || answers.count(g)) continue;
      const std::string key = rendezvous::keys::StackAnswer(run, *n, g);
      auto there = store_->Check({key});
      if (!there.ok() || !*there) continue;
      auto text = store_->Get(key);
      if (text.ok()) answers[g] = *text;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  if (static_cast<int>(answers.size()) + 1 < assignment_.group_world_size) {
    Logger("dtrun.agent")
        ->warn("hang: {} of {} other node(s) answered within {} s",
               answers.size(), assignment_.group_world_size - 1,
               std::chrono::duration_cast<std::chrono::seconds>(kShareWait)
                   .count());
  }
  std::vector<std::string> out;
  for (auto& [g, text] : answers) out.push_back(std::move(text));
  return out;
}

}  // namespace dtrun::agent
