// The Launcher's multi-node half: rendezvous rounds, the per-round worker
// store, heartbeats and the exit barrier.
#include <ifaddrs.h>
#include <signal.h>
#include <netdb.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "apps/dtrun/error_report.h"
#include "apps/dtrun/launcher.h"
#include "rendezvous/log.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

// "host[:port]" or "[v6]:port" -> host, port.
bool SplitEndpoint(const std::string& text, uint16_t default_port, std::string* host,
                   uint16_t* port) {
  std::string rest = text;
  *port = default_port;
  if (!rest.empty() && rest[0] == '[') {
    auto close = rest.find(']');
    if (close == std::string::npos) return false;
    *host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (rest.empty()) return true;
    if (rest[0] != ':') return false;
    rest = rest.substr(1);
  } else {
    auto colon = rest.rfind(':');
    if (colon == std::string::npos) {
      *host = rest;
      return !host->empty();
    }
    *host = rest.substr(0, colon);
    rest = rest.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(rest.c_str(), &end, 10);
  if (rest.empty() || *end || p < 0 || p > 65535) return false;
  *port = static_cast<uint16_t>(p);
  return !host->empty();
}

// Whether `host` names this machine: loopback, one of its interface
// addresses, or its host name (torchrun's is_host inference).
bool IsThisHost(const std::string& host) {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  if (host == "localhost" || host == name) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  ifaddrs* ifs = nullptr;
  getifaddrs(&ifs);
  bool local = false;
  for (addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    char a[NI_MAXHOST];
    getnameinfo(ai->ai_addr, ai->ai_addrlen, a, sizeof(a), nullptr, 0, NI_NUMERICHOST);
    std::string addr = a;
    if (addr == "::1" || addr.rfind("127.", 0) == 0) local = true;
    for (ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
      if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
      char b[NI_MAXHOST];
      socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (getnameinfo(i->ifa_addr, len, b, sizeof(b), nullptr, 0, NI_NUMERICHOST) == 0 && addr == b) {
        local = true;
      }
    }
  }
  if (ifs) freeifaddrs(ifs);
  freeaddrinfo(res);
  return local;
}

milliseconds ConfSeconds(const LaunchConfig& c, const std::string& key, milliseconds fallback) {
  auto it = c.rdzv_conf.find(key);
  if (it == c.rdzv_conf.end()) return fallback;
  return milliseconds(static_cast<int64_t>(std::atof(it->second.c_str()) * 1000));
}

// How long a node may stay silent before the others declare it dead:
// keep_alive_interval x keep_alive_max_attempt (5 s x 3 by default).
milliseconds SilentLimit(const LaunchConfig& c) {
  auto it = c.rdzv_conf.find("keep_alive_max_attempt");
  int attempts = it == c.rdzv_conf.end() ? 3 : std::max(1, std::atoi(it->second.c_str()));
  return ConfSeconds(c, "keep_alive_interval", milliseconds(5000)) * attempts;
}

}  // namespace

Status Launcher::ConnectRendezvous() {
  auto log = Logger("dtrun.rdzv");
  std::string host;
  uint16_t port = 0;
  bool is_static = config_.rdzv_backend == "static";
  bool hosting = false, explicit_host = false;
  if (is_static) {
    host = config_.master_addr;
    port = config_.master_port.value_or(29500);
    if (!config_.rdzv_endpoint.empty() &&
        !SplitEndpoint(config_.rdzv_endpoint, port, &host, &port)) {
      return Status::Invalid("--rdzv-endpoint: '" + config_.rdzv_endpoint + "' is not host[:port]");
    }
    hosting = config_.node_rank == 0;
  } else {
    if (config_.rdzv_endpoint.empty()) {
      return Status::Invalid("--rdzv-backend=c10d needs --rdzv-endpoint=HOST[:PORT]");
    }
    if (!SplitEndpoint(config_.rdzv_endpoint, 29400, &host, &port)) {
      return Status::Invalid("--rdzv-endpoint: '" + config_.rdzv_endpoint + "' is not host[:port]");
    }
    auto it = config_.rdzv_conf.find("is_host");
    explicit_host = it != config_.rdzv_conf.end();
    hosting = explicit_host ? (it->second == "1" || it->second == "true" || it->second == "True")
                            : IsThisHost(host);
  }
  if (hosting) {
    rdzv::StoreServerOptions opts;
    opts.port = port;
    auto server = rdzv::StoreServer::Start(opts);
    if (server.ok()) {
      rdzv_store_ = std::move(*server);
      rdzv_store_->RunInBackground();
      log->info("hosting the rendezvous store on port {}", rdzv_store_->port());
    } else if (is_static || explicit_host) {
      return server.status();
    } else {
      log->info("rendezvous store port {} is taken here; joining it as a client", port);
    }
  }
  rdzv::StoreClientOptions copts;
  copts.host = host;
  copts.port = port;
  // Store operations are bounded by the time a node may stay silent, so a
  // node cut off from the store notices (and answers signals) as soon as the
  // others declare it dead; read_timeout overrides.
  copts.timeout =
      ConfSeconds(config_, "read_timeout", std::max(SilentLimit(config_), milliseconds(1000)));
  copts.connect_timeout = ConfSeconds(config_, "join_timeout", milliseconds(600000));
  auto client = rdzv::TcpStoreClient::Connect(copts);
  if (!client.ok()) {
    return Status::Unavailable("cannot reach the rendezvous endpoint " + host + ":" +
                               std::to_string(port) + ": " + client.status().message());
  }
  rdzv_client_ = std::move(*client);
  return Status::Ok();
}

Status Launcher::SetUpWorkerStore() {
  // Each round gets a store of its own, hosted by group rank 0: a fresh key
  // space for every attempt, whatever prefix the workers' torch uses.
  std::string key = "rdzv/" + attempt_.run_id + "/round/" + std::to_string(assignment_.round) +
                    "/master";
  std::string addr;
  if (assignment_.group_rank == 0) {
    worker_store_.reset();
    rdzv::StoreServerOptions opts;
    auto server = rdzv::StoreServer::Start(opts);
    if (!server.ok()) return server.status();
    worker_store_ = std::move(*server);
    worker_store_->RunInBackground();
    std::string host = config_.local_addr.empty() ? rdzv_client_->LocalAddress() : config_.local_addr;
    addr = host + ":" + std::to_string(worker_store_->port());
    Status s = rdzv_client_->Set(key, addr);
    if (!s.ok()) return s;
    if (config_.interactive) {
      // The interactive console follows the session from round to round here.
      s = rdzv_client_->Set("dtrun/i/" + attempt_.run_id + "/current",
                            std::to_string(assignment_.round) + " " +
                                std::to_string(assignment_.world_size) + " " + addr);
      if (!s.ok()) return s;
    }
  } else {
    worker_store_.reset();
    auto got = rdzv_client_->Get(key);
    if (!got.ok()) return got.status();
    addr = *got;
  }
  auto colon = addr.rfind(':');
  attempt_.master_addr = addr.substr(0, colon);
  attempt_.master_port = std::atoi(addr.c_str() + colon + 1);
  return Status::Ok();
}

bool Launcher::Interrupted() {
  for (int signo : signals_.Read()) {
    if (signo != SIGCHLD) stop_signal_ = signo;
  }
  return stop_signal_ != 0;
}

int Launcher::JoinFailed(const Status& status) {
  auto log = Logger("dtrun.rdzv");
  switch (status.code()) {
    case Status::Code::kCanceled:
      log->warn("stopped by {} while waiting for the rendezvous", SignalName(stop_signal_));
      return 128 + stop_signal_;
    case Status::Code::kInvalid:
      log->error("{}", status.message());
      return rdzv_->closed_reason().find("workers failed") == 0 ? 1 : 2;
    default:
      log->error("{}", status.message());
      return 3;
  }
}

int Launcher::RunMultiNode() {
  auto log = Logger("dtrun.rdzv");
  Status s = ConnectRendezvous();
  if (!s.ok()) {
    log->error("{}", s.message());
    return s.code() == Status::Code::kInvalid ? 2 : 3;
  }
  s = MakeRunDir();
  if (!s.ok()) {
    log->error("{}", s.message());
    return 2;
  }
  if (on_store_ready) {
    const std::string endpoint = rdzv_client_->address();
    auto colon = endpoint.rfind(':');
    std::string host = endpoint.substr(0, colon);
    if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
    on_store_ready(host, std::atoi(endpoint.c_str() + colon + 1), run_dir_);
  }
  rdzv::RendezvousOptions ro;
  ro.run_id = attempt_.run_id;
  ro.node_id = rdzv::MakeNodeId();
  ro.node_rank = config_.rdzv_backend == "static" ? config_.node_rank : -1;
  ro.min_nodes = config_.min_nodes;
  ro.max_nodes = config_.max_nodes;
  ro.nproc_per_node = config_.nproc_per_node;
  ro.max_restarts = config_.max_restarts;
  ro.join_timeout = ConfSeconds(config_, "join_timeout", ro.join_timeout);
  ro.last_call_timeout = ConfSeconds(config_, "last_call_timeout", ro.last_call_timeout);
  ro.keep_alive_interval = ConfSeconds(config_, "keep_alive_interval", ro.keep_alive_interval);
  if (config_.rdzv_conf.count("keep_alive_max_attempt")) {
    ro.keep_alive_max_attempt = std::atoi(config_.rdzv_conf.at("keep_alive_max_attempt").c_str());
  }
  rdzv_ = std::make_unique<rdzv::Rendezvous>(rdzv_client_.get(), ro);
  log->info("node {} joining rendezvous '{}' at {} ({}..{} nodes); logs in {}", ro.node_id,
            ro.run_id, rdzv_client_->address(), ro.min_nodes, ro.max_nodes, run_dir_);
  for (;;) {
    auto joined = rdzv_->Join([this] { return Interrupted(); });
    if (!joined.ok()) return JoinFailed(joined.status());
    assignment_ = *joined;
    s = SetUpWorkerStore();
    if (!s.ok()) {
      log->error("round {}: cannot set up the workers' store: {}", assignment_.round, s.message());
      return 3;
    }
    log->info("round {}: group rank {} of {}, ranks {}..{} of {}; workers' store {}:{}",
              assignment_.round, assignment_.group_rank, assignment_.group_world_size,
              assignment_.base_rank, assignment_.base_rank + config_.nproc_per_node - 1,
              assignment_.world_size, attempt_.master_addr, attempt_.master_port);
    int rc = FollowRound();
    if (rc >= 0) {
      Linger();
      return rc;
    }
  }
}

void Launcher::StopGroupAndWait() {
  if (agent_.alive() == 0) return;
  Apply(agent_.OnSignal(SIGTERM, clock_->Now()));
  while (agent_.alive() > 0) PollOnce(100);
}

void Launcher::Linger() {
  // Other nodes may not have read the end of the job yet; the node hosting
  // the rendezvous store keeps it up until they have (at most 10 s).
  rdzv_->AckEnd(assignment_);
  if (!rdzv_store_) return;
  auto until = clock_->Now() + std::chrono::seconds(10);
  while (!rdzv_->AllEnded(assignment_) && clock_->Now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
}

// Runs the local group of one round. Returns the exit code when the job is
// over, or -1 to join the next round.
int Launcher::FollowRound() {
  auto log = Logger("dtrun.rdzv");
  outcome_ = Outcome::kRunning;
  Apply(agent_.StartRound(assignment_.round, clock_->Now()));
  // Check the round at least twice a second (more often with a faster keep-alive).
  auto tick = std::min(milliseconds(500),
                       ConfSeconds(config_, "keep_alive_interval", milliseconds(500)));
  auto next_check = clock_->Now();
  bool done_marked = false, stopping = false;
  auto last_ok = clock_->Now();
  auto silent_limit = SilentLimit(config_);
  for (;;) {
    auto wait = std::chrono::duration_cast<milliseconds>(next_check - clock_->Now());
    if (done_marked && outcome_ == Outcome::kSucceeded && wait.count() > 0) {
      // Nothing runs here: wait in the store, which wakes every node the
      // moment the last one finishes (no polling traffic at thousands of nodes).
      auto over = rdzv_->AwaitRoundOver(assignment_, wait);
      if (over.ok() && *over) next_check = clock_->Now();
      wait = milliseconds(0);
    }
    PollOnce(static_cast<int>(std::max<int64_t>(0, wait.count())));
    switch (outcome_) {
      case Outcome::kSignaled:
        return 128 + stop_signal_;
      case Outcome::kStopped:
        return -1;
      case Outcome::kFailed: {
        std::string why = "local group failed";
        auto failures = rdzv_->ReportFailure(assignment_, why);
        if (failures.ok() && rdzv_->closed_reason().empty()) {
          log->warn("round {} failed here; {} of {} restart(s) used", assignment_.round, *failures,
                    config_.max_restarts);
          return -1;
        }
        return ReportFailure();
      }
      case Outcome::kSucceeded:
        if (!done_marked) {
          done_marked = rdzv_->MarkDone(assignment_).ok();
          next_check = clock_->Now();  // maybe the last node: check the barrier now
          log->info("round {}: workers here succeeded; waiting for the other nodes",
                    assignment_.round);
        }
        break;
      case Outcome::kRunning:
        break;
    }
    if (clock_->Now() < next_check) continue;
    next_check = clock_->Now() + tick;
    auto event = rdzv_->Check(assignment_);
    if (!event.ok()) {
      // The rendezvous store is unreachable (its host may be gone, or our
      // link). Give it as long as a node may stay silent, then give up.
      if (clock_->Now() - last_ok > silent_limit) {
        log->error("rendezvous store unreachable for {:.1f} s: {}",
                   std::chrono::duration<double>(clock_->Now() - last_ok).count(),
                   event.status().message());
        StopGroupAndWait();
        return 3;
      }
      continue;
    }
    last_ok = clock_->Now();
    switch (*event) {
      case rdzv::RoundEvent::kNone:
        break;
      case rdzv::RoundEvent::kAllDone:
        if (outcome_ == Outcome::kSucceeded) {
          log->info("all nodes succeeded");
          return 0;
        }
        break;
      case rdzv::RoundEvent::kRestart:
        if (outcome_ == Outcome::kSucceeded) return -1;
        if (!stopping) {
          log->warn("round {} is over elsewhere; stopping local workers to rejoin", assignment_.round);
          Apply(agent_.StopForNewRound(clock_->Now()));
          stopping = true;
        }
        break;
      case rdzv::RoundEvent::kClosed:
        log->error("the job failed: {}", rdzv_->closed_reason());
        StopGroupAndWait();
        return 1;
    }
  }
}

}  // namespace dtrun::agent
