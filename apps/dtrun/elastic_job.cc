// A node of a multi-node job. Rounds: join, take this round's workers' store
// (hosted by group rank 0, announced through the rendezvous store), run the
// local group, follow the round until RoundPolicy says rejoin or exit. The
// rendezvous store itself is hosted by node 0 (static) or by the endpoint's
// host (c10d), which lingers at the end until every node read the result.
#include "apps/dtrun/elastic_job.h"

#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "apps/dtrun/endpoint.h"
#include "apps/dtrun/error_report.h"
#include "apps/dtrun/events.h"
#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/interactive_protocol.h"
#include "apps/dtrun/job_status.h"
#include "apps/dtrun/metrics.h"
#include "apps/dtrun/rdzv_backend.h"
#include "apps/dtrun/worker_store.h"
#include "rendezvous/util/describe.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"
#include "rendezvous/store_server.h"
#include "rendezvous/store_keys.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

}  // namespace

ElasticJob::ElasticJob(const LaunchConfig& config, WorkerGroup* workers,
                       const Clock* clock)
    : config_(config),
      clock_(clock),
      signals_(config.handled_signals),
      node_watch_(config_, clock),
      group_(config, workers, clock, &signals_, /*elastic=*/true) {
  group_.set_observer(&node_watch_);
}

ElasticJob::~ElasticJob() {
  rdzv_.reset();
  node_watch_.set_store(nullptr);
  node_watch_.set_stores(nullptr, nullptr, nullptr);
  backend_.reset();  // before the servers it may talk to
}

Status ElasticJob::SetUpWorkerStore() {
  // Each round gets a store of its own, hosted by group rank 0: a fresh key
  // space for every attempt, whatever prefix the workers' torch uses.
  const std::string key =
      rendezvous::keys::WorkerStore(config_.rdzv_id, assignment_.round);
  node_watch_.set_stores(backend_->hosted(), nullptr, nullptr);
  worker_proxy_.reset();
  worker_store_.reset();
  const bool proxied =
      UsesStoreProxy(config_.store_proxy, assignment_.world_size);
  auto addr = assignment_.group_rank == 0 ? HostRoundStore(key, proxied)
                                          : backend_->store()->Get(key);
  if (!addr.ok()) return addr.status();
  std::string host;
  uint16_t port = 0;
  if (!SplitEndpoint(*addr, 0, &host, &port) || port == 0) {
    return Status::Invalid("round " + std::to_string(assignment_.round) +
                           ": the workers' store address '" + *addr +
                           "' is not host:port");
  }
  group_.attempt().master_addr = host;
  group_.attempt().master_port = port;
  if (assignment_.group_rank != 0 && proxied) {
    worker_proxy_ = StartWorkerProxy(host, port);
    if (worker_proxy_) {
      group_.attempt().master_addr = "127.0.0.1";
      group_.attempt().master_port = worker_proxy_->port();
    }
  }
  node_watch_.set_worker_store(group_.attempt().master_addr,
                               group_.attempt().master_port);
  return Status::Ok();
}

Result<std::string> ElasticJob::HostRoundStore(const std::string& key,
                                               bool proxied) {
  // Every worker of every node connects here at once; proxied, the others'
  // workers come as one connection a node.
  auto server = HostWorkerStore(
      proxied ? assignment_.group_world_size - 1 + config_.nproc_per_node
              : assignment_.world_size,
      &said_accept_queue_);
  if (!server.ok()) return server.status();
  worker_store_ = std::move(*server);
  std::string host = config_.local_addr.empty() ? backend_->LocalAddress()
                                                : config_.local_addr;
  std::string addr = host + ":" + std::to_string(worker_store_->port());
  Status s = backend_->store()->Set(key, addr);
  // The interactive console follows the session from round to round here.
  if (s.ok() && config_.interactive) {
    s = backend_->store()->Set(
        interactive_protocol::CurrentRoundKey(config_.rdzv_id),
        interactive_protocol::CurrentRoundValue(assignment_.round,
                                                assignment_.world_size, addr));
  }
  if (!s.ok()) return s;
  return addr;
}

rendezvous::RendezvousOptions ElasticJob::RendezvousOptionsOf(
    const std::string& run_id) const {
  const RdzvConfig& rc = config_.rdzv_conf;
  rendezvous::RendezvousOptions ro;
  ro.run_id = run_id;
  ro.node_id = rendezvous::MakeNodeId();
  bool is_static = config_.rdzv_backend == RdzvBackend::kStatic;
  ro.node_rank = is_static ? config_.node_rank : -1;
  ro.preferred_rank =
      !is_static && config_.node_rank_given ? config_.node_rank : -1;
  ro.min_nodes = config_.min_nodes;
  ro.max_nodes = config_.max_nodes;
  ro.nproc_per_node = config_.nproc_per_node;
  ro.max_restarts = config_.max_restarts;
  ro.join_timeout = rc.join_timeout;
  ro.last_call_timeout = rc.last_call_timeout;
  ro.keep_alive_interval = rc.keep_alive_interval;
  ro.keep_alive_max_attempt = rc.keep_alive_max_attempt;
  return ro;
}

void ElasticJob::NotifyStoreReady() {
  if (!on_store_ready) return;
  std::string host;
  uint16_t port = 0;
  SplitEndpoint(backend_->address(), 0, &host, &port);
  on_store_ready(host, port, group_.run_dir());
}

// The servers, then the store (a failure named, exit 2 for a usage error,
// 3 for a store that is not there), then the run folder: 0 to go on, else
// the exit code.
int ElasticJob::Start() {
  auto log = Logger("dtrun.rdzv");
  for (const std::string& item : config_.rdzv_conf.ignored) {
    for (const auto& [key, why] : IgnoredRdzvKeys()) {
      if (item.compare(0, key.size() + 1, key + "=") == 0) {
        log->warn("--rdzv-conf: dtrun ignores {}: {}", item, why);
      }
    }
  }
  // The health port answers through the rendezvous (alive, not ready).
  Status s = group_.StartServers();
  if (!s.ok()) {
    log->error("{}", s.message());
    return kExitUsage;
  }
  auto backend = ConnectBackend(config_, clock_, [this] {
    return group_.Interrupted()
               ? "stopped by " + SignalName(group_.stop_signal())
               : std::string();
  });
  s = backend.status();
  if (!s.ok() && s.code() == Status::Code::kCanceled) {
    log->warn("{}; no worker was started", s.message());
    return ExitBySignal(group_.stop_signal());
  }
  if (!s.ok()) {
    log->error("{}", s.message());
    return s.code() == Status::Code::kInvalid ? kExitUsage : kExitRendezvous;
  }
  backend_ = std::move(*backend);
  node_watch_.set_store(backend_->store());
  node_watch_.set_stores(backend_->hosted(), nullptr, nullptr);
  s = group_.Prepare(config_.rdzv_id);
  if (!s.ok()) {
    log->error("{}", s.message());
    return kExitUsage;
  }
  return 0;
}

int ElasticJob::Run() {
  auto log = Logger("dtrun.rdzv");
  if (int rc = Start(); rc != 0) return rc;
  NotifyStoreReady();
  const StoreLocation where = backend_->location();
  Registration registered(
      RegistryDir(config_.environment),
      RegistryEntry{getpid(), config_.rdzv_id, group_.run_dir(), where.address,
                    where.settings, true, os::UnixNow()});
  rendezvous::RendezvousOptions ro = RendezvousOptionsOf(config_.rdzv_id);
  ro.open_watch = [this] { return backend_->OpenWatch(); };
  rdzv_ =
      std::make_unique<rendezvous::Rendezvous>(backend_->store(), ro, *clock_);
  log->info(
      "node {} joining rendezvous '{}' at {} ({}..{} nodes); logs in {}{}",
      ro.node_id, ro.run_id, backend_->address(), ro.min_nodes, ro.max_nodes,
      group_.run_dir(), config_.python_note);
  int rc = JoinRounds();
  group_.Finish(rc == kExitSuccess);
  return rc;
}

// Runs `op`, a rendezvous call, again while the store cannot answer it
// (StoreTrouble), up to the join timeout or a stop signal, saying when that
// starts and ends. Otherwise once.
template <typename Op>
auto ElasticJob::UntilStoreAnswers(Op op) -> decltype(op()) {
  auto result = op();
  const TimePoint until = clock_->Now() + config_.rdzv_conf.join_timeout;
  while (!result.ok() && StoreTrouble(result.status()) &&
         !group_.Interrupted() && clock_->Now() < until) {
    NoteStore(result.status());
    // An etcd request waits out its own deadline; a c10d connect to a
    // host that is gone may fail at once.
    if (!backend_->waits_out_failures())
      std::this_thread::sleep_for(milliseconds(200));
    result = op();
  }
  NoteStore(result.status());
  return result;
}

bool ElasticJob::StoreTrouble(const Status& status) const {
  return (backend_->replicated() || fenced_) &&
         backend_->TroubleOf(status) != RendezvousBackend::Trouble::kNone;
}

// Joins rounds until the job ends: each round sets up its workers' store,
// then follows the round (FollowRound) until it ends or a new one starts.
int ElasticJob::JoinRounds() {
  auto log = Logger("dtrun.rdzv");
  bool kept = false;
  for (;;) {
    RecordRdzv("next_rendezvous", "INIT", "joining the next round");
    auto joined = UntilStoreAnswers([this] {
      return rdzv_->Join([this] { return group_.Interrupted(); });
    });
    if (!joined.ok()) {
      RecordRdzv("next_rendezvous", "FAILED", joined.status().message());
      if (joined.status().code() == Status::Code::kCanceled) {
        log->warn("stopped by {} while waiting for the rendezvous",
                  SignalName(group_.stop_signal()));
      } else {
        log->error("{}", joined.status().message());
      }
      if (kept) group_.StopAndWait();
      return JoinFailedExitCode(joined.status(), rdzv_->end_reason(),
                                group_.stop_signal());
    }
    TakeRound(*joined);
    Status s = SetUpWorkerStore();
    node_watch_.set_stores(backend_->hosted(), worker_store_.get(),
                           worker_proxy_.get());
    if (!s.ok()) {
      log->error("round {}: cannot set up the workers' store: {}",
                 assignment_.round, s.message());
      if (kept) group_.StopAndWait();
      return kExitRendezvous;
    }
    log->info(
        "round {}: group rank {} of {}, ranks {}..{} of {}; workers' store "
        "{}:{}{}",
        assignment_.round, assignment_.group_rank, assignment_.group_world_size,
        assignment_.base_rank,
        assignment_.base_rank + config_.nproc_per_node - 1,
        assignment_.world_size, group_.attempt().master_addr,
        group_.attempt().master_port,
        worker_proxy_ ? " (this node's proxy to it)" : "");
    RoundEnd end = FollowRound(kept);
    kept = end.kept;
    if (!end.rejoin) {
      RecordRdzv(
          "shutdown", end.exit_code == kExitSuccess ? "SUCCEEDED" : "FAILED",
          "the job ended with exit code " + std::to_string(end.exit_code));
      Linger();
      return end.exit_code;
    }
  }
}

// This node's place in the round it joined.
void ElasticJob::TakeRound(const rendezvous::Assignment& assignment) {
  assignment_ = assignment;
  joined_ = true;
  fenced_ = false;
  node_watch_.TakeRound(assignment_);
  group_.set_assignment(assignment_);
  group_.set_hang_share(nullptr);
  if (assignment_.group_world_size > 1) {
    group_.set_hang_share([this](const std::string& mine) {
      return node_watch_.ShareHang(mine);
    });
  }
  RecordRdzv("next_rendezvous", "RUNNING",
             "round " + std::to_string(assignment_.round) +
                 " complete: group rank " +
                 std::to_string(assignment_.group_rank) + " of " +
                 std::to_string(assignment_.group_world_size));
}

// A SET a second per node (three on group rank 0): the store's load from
// status stays flat however long the job runs. A failed SET only leaves the
// previous record; the job does not depend on it.
void ElasticJob::RecordRdzv(const std::string& name,
                            const std::string& node_state,
                            const std::string& message) {
  if (config_.event_log_handler == "null") return;
  RdzvRecord r;
  r.name = name;
  r.run_id = config_.rdzv_id;
  r.message = message;
  r.hostname = os::HostName();
  r.pid = getpid();
  r.node_state = node_state;
  r.master_endpoint = backend_->address();
  r.rank = joined_ ? assignment_.group_rank : -1;
  if (node_state == "FAILED") r.error_trace = message;
  WriteEvent(config_.event_log_handler, RdzvEventJson(r));
}

void ElasticJob::Linger() {
  // Other nodes may not have read the end of the job yet; the node hosting
  // the rendezvous store keeps it up until they have (at most 10 s).
  rdzv_->AckEnd(assignment_);
  // In a store that outlives the job (etcd) its keys would stay: group
  // rank 0 removes them once every node has read the end, so the run id
  // may be used again.
  const bool cleans =
      backend_->keys_outlive_job() && joined_ && assignment_.group_rank == 0;
  if (!backend_->hosted() && !cleans) return;
  auto until = clock_->Now() + std::chrono::seconds(10);
  while (!rdzv_->AllEnded(assignment_) && clock_->Now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (cleans) backend_->RemoveJobKeys(config_.rdzv_id);
}

// etcd's trouble, said once when it starts and once when it ends: a lost
// quorum stops new rounds, not the workers. A c10d store's errors are
// RoundPolicy's to judge; once it fenced this node, only the store's
// return is said here.
void ElasticJob::NoteStore(const Status& status) {
  using Trouble = RendezvousBackend::Trouble;
  if (!backend_->replicated() && !fenced_) return;
  const Trouble trouble =
      status.ok() ? Trouble::kNone : backend_->TroubleOf(status);
  if (trouble == Trouble::kNone) {
    if (store_lost_since_) {
      Logger("dtrun.rdzv")
          ->info(
              "{} after {:.1f} s", backend_->Describe(Trouble::kNone),
              std::chrono::duration<double>(clock_->Now() - *store_lost_since_)
                  .count());
    }
    store_lost_since_.reset();
    return;
  }
  if (store_lost_since_) return;
  store_lost_since_ = clock_->Now();
  if (!backend_->replicated()) return;  // RoundPolicy judges a c10d store
  // No quorum is every node's trouble: the workers run on. A node that
  // reaches no member, or that the store refuses, is cut off: RoundPolicy
  // fences it after the silent limit.
  const bool running = group_.outcome() == GroupOutcome::kRunning;
  std::string workers;
  if (running && trouble == Trouble::kNoQuorum) {
    workers = " (the workers keep running)";
  } else if (running) {
    workers = " (the workers are stopped if it lasts " +
              rendezvous::DescribeSeconds(config_.rdzv_conf.silent_limit()) +
              ": the other nodes go on without this one)";
  }
  Logger("dtrun.rdzv")
      ->error("{}: {}; no new round can start until it is back{}",
              backend_->Describe(trouble), status.message(), workers);
}

void ElasticJob::WaitTurn(const RoundPolicy& policy, TimePoint* next_check) {
  auto wait =
      std::chrono::duration_cast<milliseconds>(*next_check - clock_->Now());
  if (policy.done_marked() && group_.outcome() == GroupOutcome::kSucceeded &&
      wait.count() > 0) {
    // Nothing runs here: wait in the store, which wakes every node the
    // moment the last one finishes (no polling traffic at thousands of nodes).
    auto over = rdzv_->AwaitRoundOver(assignment_, wait);
    if (over.ok() && *over) *next_check = clock_->Now();
    wait = milliseconds(0);
  }
  group_.PollOnce(static_cast<int>(std::max<int64_t>(0, wait.count())));
}

// Runs the local group of one round, until the job is over or the node
// must join the next round.
ElasticJob::RoundEnd ElasticJob::FollowRound(bool kept) {
  RoundPolicy policy(config_.rdzv_conf.silent_limit(), clock_->Now(),
                     backend_->replicated());
  if (!kept || !group_.ContinueRound(assignment_.round)) {
    if (kept) {  // a worker ended meanwhile: the others stop first
      group_.StopForNewRound();
      while (group_.alive() > 0) group_.PollOnce(100);
    }
    group_.StartRound(assignment_.round);
  }
  // Check the round at least twice a second (more often with a faster
  // keep-alive), and ten times a second while the store pushes the round's
  // changes: a check then reads nothing from the store, and a node whose
  // connection closed is acted on within 0.1 s.
  const auto tick =
      std::min(milliseconds(500), config_.rdzv_conf.keep_alive_interval);
  auto next_check = clock_->Now();
  for (;;) {
    WaitTurn(policy, &next_check);
    RoundStep step = policy.OnLocal(group_.outcome(), group_.stop_signal());
    if (auto end = Carry(step, &policy, &next_check)) return *end;
    if (clock_->Now() < next_check) continue;
    next_check =
        clock_->Now() +
        (rdzv_->pushed(assignment_) ? std::min(tick, milliseconds(100)) : tick);
    auto event = rdzv_->Check(assignment_);
    node_watch_.set_store_answers(event.ok());
    NoteStore(event.status());
    const bool no_quorum = backend_->TroubleOf(event.status()) ==
                           RendezvousBackend::Trouble::kNoQuorum;
    step = policy.OnCheck(event, group_.outcome(), clock_->Now(), no_quorum);
    if (auto end = Carry(step, &policy, &next_check)) return *end;
  }
}

// This node's workers failed: tells the rendezvous. True when the job goes
// on (restarts left); then a new round starts.
bool ElasticJob::ReportFailure() {
  // etcd without quorum: the next round waits for it, rather than the job
  // ending here.
  auto failures = UntilStoreAnswers([this] {
    return group_.gave_up()
               ? rdzv_->ReportFailure(assignment_, group_.why_gave_up(), true)
               : rdzv_->ReportFailure(assignment_, "local group failed");
  });
  bool goes_on =
      failures.ok() && rdzv_->end_reason() == rendezvous::EndReason::kNone;
  if (goes_on) {
    Logger("dtrun.rdzv")
        ->warn("round {} failed here; {} of {} restart(s) used",
               assignment_.round, *failures, config_.max_restarts);
  }
  RecordRdzv("report_failure", "FAILED",
             "round " + std::to_string(assignment_.round) +
                 ": the workers failed here");
  return goes_on;
}

// The others run a round without this node by now: its workers stop (they
// would wait on peers that are gone, or write a history the others gave
// up; lib's checkpoint epochs refuse that), and it joins again as a new
// node once the store answers, within the join timeout.
ElasticJob::RoundEnd ElasticJob::Fence(const std::string& why) {
  const TimePoint started = clock_->Now();
  Logger("dtrun.rdzv")->error("round {}: {}", assignment_.round, why);
  fenced_ = true;
  if (!store_lost_since_) store_lost_since_ = started;
  group_.StopForNewRound();
  while (group_.alive() > 0) group_.PollOnce(100);
  Logger("dtrun.rdzv")
      ->warn(
          "round {}: fenced: workers stopped {:.2f} s after the store was "
          "given up",
          assignment_.round,
          std::chrono::duration<double>(clock_->Now() - started).count());
  RecordRdzv("fence", "FAILED", why);
  return RoundEnd{true, 0};
}

// The round is over elsewhere: the workers stop, or under
// --restart=in-place stay for the next round when they can (a rejoin now,
// with them running).
std::optional<ElasticJob::RoundEnd> ElasticJob::StopForNewRound(
    const std::string& why) {
  auto log = Logger("dtrun.rdzv");
  if (group_.KeepForNewRound()) {
    log->warn(
        "round {}: the round is over elsewhere; keeping the local workers in "
        "place to rejoin",
        assignment_.round);
    return RoundEnd{true, 0, true};
  }
  log->warn("round {}: {}", assignment_.round, why);
  group_.StopForNewRound();
  return std::nullopt;
}

std::optional<ElasticJob::RoundEnd> ElasticJob::Carry(const RoundStep& step,
                                                      RoundPolicy* policy,
                                                      TimePoint* next_check) {
  auto log = Logger("dtrun.rdzv");
  switch (step.kind) {
    case RoundStep::Kind::kWait:
      return std::nullopt;
    case RoundStep::Kind::kMarkDone:
      policy->OnMarkedDone(rdzv_->MarkDone(assignment_).ok());
      // maybe the last node: check the barrier now
      *next_check = clock_->Now();
      log->info("round {}: workers here succeeded; waiting for the other nodes",
                assignment_.round);
      return std::nullopt;
    case RoundStep::Kind::kReportFailure:
      return Carry(policy->OnFailureReported(ReportFailure()), policy,
                   next_check);
    case RoundStep::Kind::kStopWorkers:
      return StopForNewRound(step.why);
    case RoundStep::Kind::kFence:
      return Fence(step.why);
    case RoundStep::Kind::kRejoin:
      return RoundEnd{true, 0};
    case RoundStep::Kind::kExitWithSummary:
      return RoundEnd{false, group_.ReportFailure()};
    case RoundStep::Kind::kExit:
      break;
  }
  // A job closed because restarts made no progress is not to be requeued,
  // on every node.
  if (step.exit_code == kExitFailedElsewhere &&
      rdzv_->end_reason() == rendezvous::EndReason::kNoProgress) {
    log->error("{}: {}", step.why, rdzv_->closed_reason());
    return RoundEnd{false, kExitNoProgress};
  }
  if (step.exit_code == kExitSuccess) {
    log->info("{}", step.why);
  } else if (!step.why.empty()) {
    bool closed = step.exit_code == kExitFailedElsewhere;
    log->error("{}{}", step.why, closed ? ": " + rdzv_->closed_reason() : "");
  }
  if (step.stop_workers) group_.StopAndWait();
  return RoundEnd{false, step.exit_code};
}

}  // namespace dtrun::agent
