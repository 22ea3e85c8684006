// The rendezvous store's backends: c10d (hosted here or elsewhere, spoken
// to over TCPStore's wire) and etcd (its v3 HTTP gateway).
#include "apps/dtrun/rdzv_backend.h"

#include <algorithm>
#include <utility>

#include "apps/dtrun/endpoint.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/round_state.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_keys.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;
using Trouble = RendezvousBackend::Trouble;

// Every dtrun key on etcd is under this prefix (store_keys.h's names after
// it), so one cluster serves dtrun beside anything else.
constexpr char kEtcdPrefix[] = "/dtrun/";

// A TCP store: hosted by this node (server_) or not; the client is this
// node's connection to it either way.
class C10dBackend : public RendezvousBackend {
 public:
  Status Host(uint16_t port, bool must);
  Status Connect(const LaunchConfig& config, const std::string& host,
                 uint16_t port, const Clock* clock,
                 const std::function<std::string()>& stopped);

  rendezvous::Store* store() override { return client_.get(); }
  std::string LocalAddress() override { return client_->LocalAddress(); }
  Result<std::unique_ptr<rendezvous::KeyWatch>> OpenWatch() override {
    return rendezvous::ConnectWatch(watch_opts_);
  }
  Trouble TroubleOf(const Status& status) const override {
    return status.code() == Status::Code::kUnavailable ||
                   status.code() == Status::Code::kTimeout
               ? Trouble::kUnreachable
               : Trouble::kNone;
  }
  bool replicated() const override { return false; }
  bool waits_out_failures() const override { return false; }
  std::string Describe(Trouble trouble) const override {
    return trouble == Trouble::kNone
               ? "the rendezvous store answers again"
               : "the rendezvous store does not answer this node";
  }
  rendezvous::StoreServer* hosted() override { return server_.get(); }

 private:
  // Declared first: destroyed after the client that may talk to it.
  std::unique_ptr<rendezvous::StoreServer> server_;
  std::unique_ptr<rendezvous::TcpStoreClient> client_;
  rendezvous::StoreClientOptions watch_opts_;  // Check's push connection
};

// This node hosts the rendezvous store on `port` (static node 0, or the c10d
// endpoint's host). With `must`, a port already in use is an error; else
// another agent of this host already hosts it, and this one joins it.
Status C10dBackend::Host(uint16_t port, bool must) {
  rendezvous::StoreServerOptions opts;
  opts.port = port;
  os::RaiseFileLimit();  // two connections per node
  auto server = rendezvous::StoreServer::Start(opts);
  if (!server.ok()) {
    if (must) return server.status();
    // Inferred hosting (c10d): another agent of this host got there first.
    Logger("dtrun.rdzv")
        ->info("rendezvous store port {} is taken here; joining it as a client",
               port);
    return Status::Ok();
  }
  server_ = std::move(*server);
  server_->RunInBackground();
  Logger("dtrun.rdzv")
      ->info("hosting the rendezvous store on port {}", server_->port());
  return Status::Ok();
}

// Connects within `limit`, in steps of at most a second, so that a signal
// stops the wait at once (a store that is not up yet would otherwise hold
// dtrun for the whole join timeout, deaf to Ctrl-C and SIGTERM). A name
// that does not resolve yet (a Kubernetes headless service's records
// appear some seconds after the pods) is said once, not failed on.
Result<std::unique_ptr<rendezvous::TcpStoreClient>> ConnectUntil(
    rendezvous::StoreClientOptions opts, milliseconds limit, const Clock* clock,
    const std::function<std::string()>& stopped) {
  auto deadline = clock->Now() + limit;
  bool said = false;
  for (;;) {
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - clock->Now());
    opts.connect_timeout =
        std::max(milliseconds(1), std::min(left, milliseconds(1000)));
    auto client = rendezvous::TcpStoreClient::Connect(opts);
    if (client.ok() || left <= milliseconds(1000)) return client;
    const std::string& why = client.status().message();
    if (!said && why.find("cannot resolve host") != std::string::npos) {
      said = true;
      Logger("dtrun.rdzv")
          ->warn(
              "the rendezvous endpoint {} does not resolve yet ({}); "
              "retrying until the join timeout ({} s left)",
              opts.host, why.substr(why.find("cannot resolve host")),
              left.count() / 1000);
    }
    std::string stop = stopped();
    if (!stop.empty())
      return Status::Canceled(stop +
                              " while connecting to the rendezvous store");
  }
}

Status C10dBackend::Connect(const LaunchConfig& config, const std::string& host,
                            uint16_t port, const Clock* clock,
                            const std::function<std::string()>& stopped) {
  const RdzvConfig& rc = config.rdzv_conf;
  rendezvous::StoreClientOptions copts;
  copts.host = host;
  copts.port = port;
  // Store operations are bounded by half the time a node may stay silent
  // (at least 1 s), so a node cut off from the store is fenced soon after
  // the others declare it dead: the silent limit, two operations' deadlines
  // and a check interval (apps/dtrun/README.md, "Partitions");
  // read_timeout overrides.
  copts.timeout = rc.read_timeout.value_or(
      std::max(rc.silent_limit() / 2, milliseconds(1000)));
  auto client = ConnectUntil(copts, rc.join_timeout, clock, stopped);
  if (!client.ok() && client.status().code() == Status::Code::kCanceled)
    return client.status();
  if (!client.ok()) {
    return Status::Unavailable(
        "cannot reach the rendezvous endpoint " + host + ":" +
        std::to_string(port) + " within the join timeout (" +
        std::to_string(rc.join_timeout.count() / 1000) +
        " s; --rdzv-conf join_timeout=SECONDS): " + client.status().message());
  }
  client_ = std::move(*client);
  address_ = client_->address();
  // Check's push mode opens one more connection per node to the same store,
  // in the 1.13 dialect that has WATCH_KEY. Short deadlines: a store that
  // does not answer a watch leaves Check reading, as before.
  watch_opts_ = copts;
  watch_opts_.dialect = rendezvous::Dialect::kTorch113;
  watch_opts_.timeout = std::min(copts.timeout, milliseconds(5000));
  watch_opts_.connect_timeout = watch_opts_.timeout;
  return Status::Ok();
}

Result<std::unique_ptr<RendezvousBackend>> ConnectC10d(
    const LaunchConfig& config, const Clock* clock,
    const std::function<std::string()>& stopped) {
  const bool is_static = config.rdzv_backend == RdzvBackend::kStatic;
  const Endpoint& endpoint = config.rdzv_endpoint;
  if (!is_static && endpoint.empty()) {
    return Status::Invalid(
        "--rdzv-backend=c10d needs --rdzv-endpoint=HOST[:PORT]");
  }
  // Static: node 0's --master-addr:--master-port unless an endpoint names
  // the store; c10d: the endpoint, port 29400 by default.
  const uint16_t default_port =
      is_static ? config.master_port.value_or(29500) : 29400;
  const std::string host =
      endpoint.empty() ? config.master_addr : endpoint.host;
  const uint16_t port = endpoint.PortOr(default_port);
  const RdzvConfig& rc = config.rdzv_conf;
  bool explicit_host = !is_static && rc.is_host.has_value();
  bool hosting =
      is_static ? config.node_rank == 0 : rc.is_host.value_or(IsThisHost(host));
  auto backend = std::make_unique<C10dBackend>();
  if (hosting) {
    Status s = backend->Host(port, is_static || explicit_host);
    if (!s.ok()) return s;
  }
  Status s = backend->Connect(config, host, port, clock, stopped);
  if (!s.ok()) return s;
  return std::unique_ptr<RendezvousBackend>(std::move(backend));
}

// The rendezvous store on etcd: no node hosts it, so there is nothing to
// bind and no host to infer; each node speaks to the members it is given
// (one that answers is enough) under the key prefix /dtrun/.
class EtcdBackend : public RendezvousBackend {
 public:
  EtcdBackend(std::unique_ptr<rendezvous::EtcdClient> client,
              std::chrono::milliseconds timeout, std::string address,
              std::map<std::string, std::string> settings)
      : etcd_(client.get()),
        store_(std::move(client), kEtcdPrefix, timeout),
        settings_(std::move(settings)) {
    address_ = std::move(address);
  }

  rendezvous::Store* store() override { return &store_; }
  StoreLocation location() const override { return {address_, settings_}; }
  std::string LocalAddress() override { return etcd_->LocalAddress(); }
  Result<std::unique_ptr<rendezvous::KeyWatch>> OpenWatch() override {
    return Result<std::unique_ptr<rendezvous::KeyWatch>>(store_.OpenWatch());
  }
  Trouble TroubleOf(const Status&) const override {
    switch (etcd_->trouble()) {
      case rendezvous::EtcdTrouble::kNone:
        return Trouble::kNone;
      case rendezvous::EtcdTrouble::kUnreachable:
        return Trouble::kUnreachable;
      case rendezvous::EtcdTrouble::kNoQuorum:
        return Trouble::kNoQuorum;
      case rendezvous::EtcdTrouble::kRefused:
        return Trouble::kRefused;
    }
    return Trouble::kNone;
  }
  bool replicated() const override { return true; }
  bool waits_out_failures() const override { return true; }
  std::string Describe(Trouble trouble) const override {
    switch (trouble) {
      case Trouble::kNone:
        return "etcd answers again (via " + etcd_->endpoint() + ")";
      case Trouble::kRefused:
        return "etcd refuses this node";
      case Trouble::kNoQuorum:
        return "etcd has lost quorum";
      case Trouble::kUnreachable:
        break;
    }
    return "no etcd member answers this node";
  }
  bool keys_outlive_job() const override { return true; }
  void RemoveJobKeys(const std::string& run) override;

 private:
  void RemoveRunId(const std::string& run);
  rendezvous::EtcdClient* etcd_;  // inside store_
  rendezvous::EtcdStore store_;
  std::map<std::string, std::string> settings_;  // StoreLocation's
};

// No key of the job outlives it, so the run id may be used again; the
// pointer to the last run goes too when it is this one.
void EtcdBackend::RemoveJobKeys(const std::string& run) {
  auto last = store_.MultiGet({rendezvous::keys::kLastRun});  // no wait
  if (last.ok() && (*last)[0] == run)
    (void)store_.DeleteKey(rendezvous::keys::kLastRun);
  for (const std::string& prefix : rendezvous::keys::JobPrefixes(run)) {
    auto n = store_.DeletePrefix(prefix);
    if (!n.ok()) {
      Logger("dtrun.rdzv")
          ->warn("cannot remove the job's keys {}* from etcd: {}", prefix,
                 n.status().message());
    }
  }
  RemoveRunId(run);
}

// The job's entry in the store's list of run ids (Rendezvous::NoteRunId),
// and the list itself once empty; a few tries against jobs doing the same.
void EtcdBackend::RemoveRunId(const std::string& run) {
  auto list = store_.MultiGet({rendezvous::keys::kRunIds});
  if (!list.ok()) return;
  std::string seen = (*list)[0];
  for (int i = 0; i < 5 && !seen.empty(); ++i) {
    std::string next = rendezvous::RunIdsWithout(seen, run);
    if (next.empty()) {
      (void)store_.DeleteKey(rendezvous::keys::kRunIds);
      return;
    }
    if (next == seen) return;
    auto now = store_.CompareSet(rendezvous::keys::kRunIds, seen, next);
    if (!now.ok() || *now == next) return;
    seen = *now;
  }
}

// The --rdzv-conf keys that secure etcd (cacert, cert, key, user,
// password_file), as StoreLocation keeps them: the files' paths, never the
// password.
std::map<std::string, std::string> EtcdSettingsOf(const RdzvConfig& rc) {
  std::map<std::string, std::string> settings;
  for (const auto& [key, value] :
       {std::pair<const char*, std::string>{"cacert", rc.cacert},
        {"cert", rc.cert},
        {"key", rc.key},
        {"user", rc.user},
        {"password_file", rc.password_file}}) {
    if (!value.empty()) settings[key] = value;
  }
  return settings;
}

// Those settings into the client's options, the password read from its
// file now; a file that cannot be read is Invalid, naming the key.
Status SecureEtcd(const std::map<std::string, std::string>& settings,
                  rendezvous::EtcdOptions* eo) {
  auto get = [&settings](const char* key) {
    auto it = settings.find(key);
    return it == settings.end() ? std::string() : it->second;
  };
  eo->cacert = get("cacert");
  eo->cert = get("cert");
  eo->key = get("key");
  eo->user = get("user");
  const std::string file = get("password_file");
  if (file.empty()) return Status::Ok();
  auto password = os::ReadFile(file);
  if (!password.ok()) {
    return Status::Invalid("--rdzv-conf password_file=" + file + ": " +
                           password.status().message());
  }
  eo->password = password->substr(0, password->find('\n'));
  return Status::Ok();
}

// The etcd client's options from the flags.
Status EtcdOptionsOf(const LaunchConfig& config, rendezvous::EtcdOptions* eo) {
  const RdzvConfig& rc = config.rdzv_conf;
  eo->endpoints = config.etcd_endpoints;
  eo->tls = rc.protocol == "https";
  if (Status s = SecureEtcd(EtcdSettingsOf(rc), eo); !s.ok()) return s;
  // As for the TCP store: an operation may take as long as a node may stay
  // silent (read_timeout overrides); connecting, the join timeout.
  eo->timeout =
      rc.read_timeout.value_or(std::max(rc.silent_limit(), milliseconds(1000)));
  return Status::Ok();
}

// A member answers its status to anyone; whether this node may use the
// keys is another question, asked at start rather than at the first write.
Status CheckEtcdKeys(rendezvous::EtcdClient& client, const std::string& list,
                     const std::string& user) {
  auto probe = client.Call(
      "/v3/kv/range",
      {{"key", rendezvous::Base64Encode(kEtcdPrefix)}, {"limit", 1}});
  if (probe.ok() || client.trouble() != rendezvous::EtcdTrouble::kRefused)
    return Status::Ok();
  return Status::Invalid(
      "etcd at " + list + " refuses this node its keys (" +
      probe.status().message() + "): " +
      (user.empty() ? "it has authentication on; give --rdzv-conf "
                      "user=NAME,password_file=FILE"
                    : "give user '" + user +
                          "' read and write on /dtrun/ (etcdctl role "
                          "grant-permission --prefix ROLE readwrite /dtrun/)"));
}

Result<std::unique_ptr<RendezvousBackend>> ConnectEtcd(
    const LaunchConfig& config) {
  const RdzvConfig& rc = config.rdzv_conf;
  rendezvous::EtcdOptions eo;
  Status made = EtcdOptionsOf(config, &eo);
  if (!made.ok()) return made;
  std::string list;
  for (const std::string& e : eo.endpoints)
    list += (list.empty() ? "" : ",") + e;
  // etcd is a service that runs before the job: one not answering at start
  // is a wrong endpoint or certificate far more often than a slow start, so
  // the node says so within 10 s (or the join timeout) instead of waiting.
  rendezvous::EtcdOptions first = eo;
  first.timeout = std::min(rc.join_timeout, milliseconds(10000));
  auto client = rendezvous::EtcdClient::Connect(first);
  if (!client.ok()) {
    std::string msg =
        "cannot reach etcd at " + list + ": " + client.status().message();
    return client.status().code() == Status::Code::kInvalid
               ? Status::Invalid(msg)
               : Status::Unavailable(msg);
  }
  Status allowed = CheckEtcdKeys(**client, list, rc.user);
  if (!allowed.ok()) return allowed;
  (*client)->set_timeout(eo.timeout);
  return std::unique_ptr<RendezvousBackend>(std::make_unique<EtcdBackend>(
      std::move(*client), eo.timeout, rc.protocol + "://" + list,
      EtcdSettingsOf(rc)));
}

// `dtrun --status` of a job on etcd: the members and settings the job's
// registry entry (or the command line) gives.
Result<std::unique_ptr<rendezvous::Store>> OpenEtcdAt(
    const StoreLocation& where, milliseconds timeout) {
  rendezvous::EtcdOptions eo;
  const std::string& a = where.address;
  eo.tls = a.rfind("https://", 0) == 0;
  const std::string members = a.substr(a.find("://") + 3);
  for (size_t at = 0; at <= members.size();) {
    size_t comma = std::min(members.find(',', at), members.size());
    if (comma > at) eo.endpoints.push_back(members.substr(at, comma - at));
    at = comma + 1;
  }
  if (Status s = SecureEtcd(where.settings, &eo); !s.ok()) return s;
  eo.timeout = timeout;
  auto client = rendezvous::EtcdClient::Connect(eo);
  if (!client.ok()) return client.status();
  return std::unique_ptr<rendezvous::Store>(
      std::make_unique<rendezvous::EtcdStore>(std::move(*client), kEtcdPrefix,
                                              timeout));
}

}  // namespace

Result<std::unique_ptr<rendezvous::Store>> OpenStoreAt(
    const StoreLocation& where, milliseconds timeout) {
  const std::string& a = where.address;
  if (a.rfind("http://", 0) == 0 || a.rfind("https://", 0) == 0)
    return OpenEtcdAt(where, timeout);
  auto endpoint = ParseEndpoint(a);
  if (!endpoint || endpoint->empty() || !endpoint->port) {
    return Status::Invalid("'" + a +
                           "' is not a store's host:port or an etcd "
                           "cluster's http(s)://host:port,...");
  }
  rendezvous::StoreClientOptions o;
  o.host = endpoint->host;
  o.port = *endpoint->port;
  o.timeout = timeout;
  o.connect_timeout = std::chrono::seconds(5);
  auto client = rendezvous::TcpStoreClient::Connect(o);
  if (!client.ok()) return client.status();
  return std::unique_ptr<rendezvous::Store>(std::move(*client));
}

Result<std::unique_ptr<RendezvousBackend>> ConnectBackend(
    const LaunchConfig& config, const Clock* clock,
    const std::function<std::string()>& stopped) {
  if (config.rdzv_backend == RdzvBackend::kEtcd) return ConnectEtcd(config);
  return ConnectC10d(config, clock, stopped);
}

}  // namespace dtrun::agent
