// One node with its own store: the simplest job. Restarts are the Agent's
// (--max-restarts); each attempt gets an empty key space in the same store,
// so workers keep MASTER_PORT across restarts as torchrun's do.
#include "apps/dtrun/single_node_job.h"

#include <unistd.h>

#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/in_place.h"
#include "apps/dtrun/interactive_protocol.h"
#include "apps/dtrun/job_status.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"
#include "apps/dtrun/metrics.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"
#include "rendezvous/store_state.h"

namespace dtrun::agent {

SingleNodeJob::SingleNodeJob(const LaunchConfig& config, WorkerGroup* workers,
                             const Clock* clock)
    : config_(config),
      signals_(config.handled_signals),
      group_(config, workers, clock, &signals_, /*elastic=*/false) {
  group_.set_observer(this);
}

SingleNodeJob::~SingleNodeJob() {
  console_link_.reset();  // before the server it talks to
  if (store_) store_->Stop();
}

Status SingleNodeJob::StartStore() {
  rendezvous::StoreServerOptions opts;
  opts.host = config_.master_addr;
  // --standalone always takes a free port, as torchrun does.
  opts.port = config_.standalone ? 0 : config_.master_port.value_or(0);
  auto server = rendezvous::StoreServer::Start(opts);
  if (!server.ok()) return server.status();
  store_ = std::move(*server);
  store_->RunInBackground();
  group_.attempt().master_addr = config_.master_addr;
  group_.attempt().master_port = store_->port();
  return Status::Ok();
}

int SingleNodeJob::Run() {
  auto log = Logger("dtrun.agent");
  Status s = StartStore();
  if (!s.ok()) {
    log->error("{}", s.message());
    return kExitRendezvous;
  }
  s = group_.Prepare(config_.standalone ? os::RandomHex(12) : config_.rdzv_id);
  if (!s.ok()) {
    log->error("{}", s.message());
    return kExitUsage;
  }
  const AttemptEnv& a = group_.attempt();
  log->info("store at {}:{}; run id {}; {} worker(s) of {}{}; logs in {}",
            a.master_addr, a.master_port, a.run_id, config_.nproc_per_node,
            config_.entrypoint[0], config_.python_note, group_.run_dir());
  if (on_store_ready)
    on_store_ready(a.master_addr, a.master_port, group_.run_dir());
  // `dtrun --status` finds the job here while it runs.
  Registration registered(
      RegistryDir(config_.environment),
      RegistryEntry{getpid(),
                    a.run_id,
                    group_.run_dir(),
                    a.master_addr + ":" + std::to_string(a.master_port),
                    {},
                    false,
                    os::UnixNow()});
  group_.Start();
  while (group_.outcome() == GroupOutcome::kRunning) group_.PollOnce(-1);
  int rc = kExitSuccess;
  if (group_.outcome() == GroupOutcome::kSignaled)
    rc = ExitBySignal(group_.stop_signal());
  if (group_.outcome() == GroupOutcome::kFailed) rc = group_.ReportFailure();
  group_.Finish(rc == kExitSuccess);
  return rc;
}

std::string SingleNodeJob::StoreMetrics() {
  if (!store_) return "";
  return StoreMetricsText({SampleStore("workers", store_.get())}, -1,
                          group_.attempt().run_id);
}

void SingleNodeJob::OnAttemptStarting(int restart_count) {
  if (restart_count == 0) return;
  // A fresh key space: torch >= 2.x workers use no per-attempt prefix, so
  // keys of the failed attempt (e.g. a stale NCCL unique id) must not
  // survive. (With rendezvous, each round has a new store instead.)
  store_->WithState([](rendezvous::StoreState& state) { state.Clear(); });
  if (last_crash_) PublishLastCrash();  // ... but the console still needs this
}

// Kept for the interactive console, which reads the latest crash and the
// count from the store to stop a crash loop.
void SingleNodeJob::OnWorkerCrash(const WorkerCrash& crash) {
  last_crash_ = crash;
  ++crashes_;
  PublishLastCrash();
}

rendezvous::TcpStoreClient* SingleNodeJob::Link() {
  if (!console_link_) {
    rendezvous::StoreClientOptions opts;
    opts.host = group_.attempt().master_addr;
    opts.port = static_cast<uint16_t>(group_.attempt().master_port);
    opts.timeout = std::chrono::seconds(5);
    auto client = rendezvous::TcpStoreClient::Connect(opts);
    if (!client.ok()) return nullptr;
    console_link_ = std::move(*client);
  }
  return console_link_.get();
}

// Through a client connection, so that the survivors' waits on the key
// wake as they would for a worker's write.
bool SingleNodeJob::OnReplacing(int restart_count, int rank) {
  return in_place::Announce(Link(), restart_count, rank);
}

// A failure is logged and the job goes on.
void SingleNodeJob::PublishLastCrash() {
  rendezvous::TcpStoreClient* link = Link();
  if (!link) return;
  Status s = PublishCrash(link, interactive_protocol::kLocalCrashPrefix,
                          *last_crash_, crashes_);
  if (!s.ok())
    Logger("dtrun.agent")
        ->warn("cannot publish the crash for the console: {}", s.message());
}

}  // namespace dtrun::agent
