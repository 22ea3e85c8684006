#pragma once

// A client of etcd's v3 API through its JSON gateway (HTTP/1.1 POSTs of
// JSON bodies to /v3/..., binary keys and values in base64), over plain TCP
// or TLS with client certificates. Why the gateway and not gRPC: every etcd
// 3.x member serves it on its client port, it needs nothing beyond asio and
// OpenSSL (both already linked statically into dtrun), and a round's few
// small requests gain nothing from HTTP/2 (rendezvous/README.md, "Rendezvous
// on etcd").
//
// Several members may be named: a request that finds its member down, cut
// off, or without a leader is sent to the next one, until its deadline. A
// member that is down is therefore invisible to the caller; only when no
// member can commit (quorum lost) does a request fail, and the error says
// which members answered what.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd_framing.h"
#include "rendezvous/store.h"
#include "rendezvous/util/status.h"

namespace dtrun::rendezvous {

struct EtcdOptions {
  // "host:port" of each member to try, in order (at least one).
  std::vector<std::string> endpoints;
  // TLS: https to every member, verifying it against `cacert` (PEM file;
  // empty: the system's roots), and presenting `cert` + `key` when given.
  bool tls = false;
  std::string cacert, cert, key;
  // etcd's authentication (`etcdctl auth enable`): this user's token, got
  // with `password` at the first request and again when etcd says it
  // expired, goes with every request and watch. Empty: none.
  std::string user, password;
  // Bound on one request, failovers included.
  std::chrono::milliseconds timeout{10000};
  // Bound on one connection attempt to one member.
  std::chrono::milliseconds connect_timeout{1000};
};

// Why a request failed, as far as the client could tell.
enum class EtcdTrouble {
  kNone,
  kUnreachable,  // no member accepted a connection
  kNoQuorum,     // members answered, but none could commit (no leader)
  kRefused,      // a member refused us (TLS, auth, bad request)
};

// Thread-safe: one request at a time per client (a mutex), like the TCP
// store client; each EtcdWatch stream has a connection of its own.
class EtcdConnection;

class EtcdClient {
 public:
  // Checks the options (files readable, endpoints "host:port") and reaches
  // one member within `timeout`; the error names every endpoint tried and
  // what each said.
  static Result<std::unique_ptr<EtcdClient>> Connect(EtcdOptions options);
  ~EtcdClient();

  // POSTs `body` to `path` ("/v3/kv/range") and returns the reply's JSON.
  // Fails over across members until options.timeout.
  Result<nlohmann::json> Call(const std::string& path,
                              const nlohmann::json& body);
  // The member answering now, "host:port".
  std::string endpoint() const;
  // This host's address on the connection to the member (for peers to
  // reach this node), "" before any.
  std::string LocalAddress() const;
  // Why the last failed request failed (kNone after a success).
  EtcdTrouble trouble() const;
  const EtcdOptions& options() const { return options_; }
  // Changes the bound on one request (options.timeout).
  void set_timeout(std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    options_.timeout = timeout;
  }

  // A connection to a member, on this client's I/O context (watches use
  // one each).
  std::unique_ptr<EtcdConnection> NewConnection(const std::string& host,
                                                uint16_t port);

 private:
  struct Tries;
  using TimePoint = std::chrono::steady_clock::time_point;

  explicit EtcdClient(EtcdOptions options);
  Status Init();
  // Call's failover over the members, under mu_; *unauthenticated: the
  // answer was etcd refusing the auth token.
  Result<nlohmann::json> CallLocked(const std::string& path,
                                    const std::string& text,
                                    bool* unauthenticated);
  Status Authenticate();
  std::string Token() const;
  std::optional<Result<nlohmann::json>> Try(size_t at, const std::string& path,
                                            const std::string& text,
                                            TimePoint until, Tries* tries);
  std::optional<Result<nlohmann::json>> Judge(size_t at,
                                              const std::string& path,
                                              int status,
                                              const std::string& reply,
                                              Tries* tries);
  Status Failed(const std::string& path, const Tries& tries);

  EtcdOptions options_;
  struct Tls;
  std::unique_ptr<Tls> tls_;
  struct Io;
  std::unique_ptr<Io> io_;  // before conn_: outlives it
  mutable std::mutex mu_;
  std::unique_ptr<EtcdConnection> conn_;  // to endpoints[current_]
  size_t current_ = 0;
  std::string local_address_;
  EtcdTrouble trouble_ = EtcdTrouble::kNone;
  mutable std::mutex token_mu_;  // watches read the token from their thread
  std::string token_;            // etcd's, for options_.user
};

// Pushed changes of keys through etcd watches (Rendezvous's push mode): one
// stream for every key watched. A stream whose member goes away is opened
// again on another member, each key from the revision after the last one it
// reported, so no change is lost; a member that stops answering without
// closing the stream is not noticed here (Rendezvous reads before it
// declares a node dead).
class EtcdWatch : public KeyWatch {
 public:
  // Keys are given and reported without `prefix` (the store's). `client`
  // must outlive the watch.
  EtcdWatch(EtcdClient* client, std::string prefix);
  ~EtcdWatch() override;
  // Reopens the stream with `key` added (the others resume where they
  // stood).
  Status WatchKey(const std::string& key) override;
  // All on one stream, opened once.
  Status WatchKeys(const std::vector<std::string>& keys) override;
  Status TakeChanges(std::vector<KeyChange>* changes) override;
  // Blocks up to `timeout` until a change arrives (TakeChanges then returns
  // it); false when none came in time.
  Result<bool> AwaitChange(std::chrono::milliseconds timeout);

 private:
  struct Stream;
  using Key = etcd_framing::WatchedKey;  // with the prefix
  Status Open();
  Status OpenOn(const std::string& endpoint);
  bool Drain(std::vector<KeyChange>* changes);

  EtcdClient* client_;
  std::string prefix_;
  std::vector<Key> keys_;
  std::unique_ptr<Stream> stream_;
  std::vector<KeyChange> buffered_;  // arrived while AwaitChange waited
};

// The key one past every key starting with `prefix` (etcd's range_end).
std::string PrefixEnd(const std::string& prefix);

}  // namespace dtrun::rendezvous
