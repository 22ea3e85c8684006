#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/store.h"
#include "rendezvous/wire.h"

namespace dtrun::rendezvous {

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  // Default timeout of every operation, and of Get/Wait(keys). Default 300 s
  // (c10d's).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // How long Connect keeps retrying a refused or unreachable address, with
  // exponential backoff (50 ms doubling to 1 s, +-25% jitter). Default 60 s.
  // Reconnecting after a lost connection is bounded by `timeout` instead.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(60);
  // kTorch2 (VALIDATE + PING, CANCEL_WAIT on wait timeout) for dtrun's own
  // server; kTorch113 to talk to a PyTorch 1.13 server.
  Dialect dialect = Dialect::kTorch2;
  // Prepend "/" to every key as c10d's TCPStore client does, so keys look
  // the same to PyTorch's clients and ours. Default true.
  bool c10d_key_prefix = true;
};

// Store client over TCP, speaking c10d's TCPStore protocol. Blocking calls
// with deadlines; every error names the address, the operation, the key and
// the time waited. Thread-safe: calls are serialized by a mutex (one request
// in flight per connection, as in c10d).
class TcpStoreClient : public Store, public KeyWatch {
 public:
  // Connects (retrying until connect_timeout) and, for kTorch2, validates.
  static Result<std::unique_ptr<TcpStoreClient>> Connect(
      const StoreClientOptions& opts);
  ~TcpStoreClient() override;

  Status Set(const std::string& key, std::string_view value) override;
  Result<std::string> Get(const std::string& key) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;
  Result<std::string> CompareSet(const std::string& key,
                                 std::string_view expected,
                                 std::string_view desired) override;
  Result<bool> Check(const std::vector<std::string>& keys) override;
  // On timeout the server-side registration is canceled (kTorch2) or the
  // connection replaced (kTorch113), so a late reply never desynchronizes
  // the next request (the 1.13 client's latent bug).
  Status Wait(const std::vector<std::string>& keys,
              std::chrono::milliseconds timeout) override;
  Result<bool> DeleteKey(const std::string& key) override;
  Result<int64_t> NumKeys() override;
  std::chrono::milliseconds timeout() const override { return opts_.timeout; }
  // Through kOnCloseKey (store_state.h), re-sent on every reconnect; the
  // first binding of `closes` is not counted in `binds`, each rebinding
  // after a reconnect is (GoneOf).
  Status BindOnClose(const std::string& closes,
                     const std::string& binds) override;
  // One COMPARE_SET of kEnlistKey (store_state.h) where the store knows it
  // (dtstore, dtrun's store); on one that does not (torch's), the default's
  // two requests, from then on without asking.
  Result<Enlisted> Enlist(const Enlistment& e) override;
  // kTorch2: one MULTI_GET / MULTI_SET request (a missing key reads as
  // empty: unlike c10d's client, MultiGet does not wait for the keys); key
  // by key where a MULTI_GET of a missing key drops the connection
  // (torch's own server).
  Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys) override;
  Status MultiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) override;

  using Store::Wait;

  // kTorch2 only: APPEND, and the server-side counting barrier.
  Status Append(const std::string& key, std::string_view value);
  Status Barrier(const std::string& key, int64_t world_size,
                 std::chrono::milliseconds timeout);

  // kTorch113 only: c10d 1.13's watchKey. Registers `key` and returns once
  // the store has acknowledged it; from then on the store pushes every change
  // of the key on this connection, which is then good for more WatchKey
  // calls and TakeChanges only. dtstore answers it on any connection that
  // opens in the 1.13 dialect; torch 2.x servers have no such request.
  Status WatchKey(const std::string& key) override;
  // Appends the changes pushed since the last call, in the order the store
  // made them, without blocking. Unavailable once the connection is lost:
  // a watch is never silently re-registered on a new connection.
  Status TakeChanges(std::vector<KeyChange>* changes) override;
  // Blocks up to `timeout` until at least one change is waiting for
  // TakeChanges; false when none came in time. A watcher with nothing else
  // to do waits here instead of polling.
  Result<bool> AwaitChange(std::chrono::milliseconds timeout);

  // "host:port" for messages.
  std::string address() const;
  // The numeric address of this end of the connection (the address the
  // store's host reaches us by), or "" when not connected.
  std::string LocalAddress();

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  explicit TcpStoreClient(const StoreClientOptions& opts) : opts_(opts) {}

  Status Open();  // REQUIRES: mu_
  bool ConnectOnce(Deadline deadline, std::string* last_error);  // ditto
  Status Handshake(Deadline deadline);
  std::string K(const std::string& key) const;
  Status SendRequest(const Request& req, const std::string& what,
                     Deadline deadline);
  Status SendBytes(const std::string& bytes, const std::string& what,
                   Deadline deadline);
  Status ReadExact(size_t n, std::string* out, const std::string& what,
                   Deadline deadline, Deadline started);
  Status ReadBytes(std::string* out, const std::string& what, Deadline deadline,
                   Deadline started);
  // One wait for readability and one recv into rbuf_.
  Status ReceiveSome(const std::string& what, Deadline deadline,
                     Deadline started);
  // Moves the complete pushed frames at the head of rbuf_ (acknowledgements
  // and changes) to acks_ and changes_. REQUIRES: mu_.
  Status ParsePushed(const std::string& what);
  // Reads the pushed bytes there are (after waiting up to `timeout` for
  // some) and parses them into changes_. REQUIRES: mu_.
  Status ReadPushed(std::chrono::milliseconds timeout);
  // Sends `req` and reads its reply: none (reply_size 0), reply_size bytes,
  // or kLengthPrefixed bytes. REQUIRES: mu_.
  static constexpr int kLengthPrefixed = -1;
  Status Call(const Request& req, const std::string& what, int reply_size,
              std::string* reply);
  Status WaitLocked(const std::vector<std::string>& keys, Op op, int64_t number,
                    std::chrono::milliseconds timeout);
  Deadline OpDeadline() const {
    return std::chrono::steady_clock::now() + opts_.timeout;
  }
  Status Fail(Status s);  // closes the socket: the stream is out of sync

  StoreClientOptions opts_;
  std::mutex mu_;
  int fd_ = -1;
  bool connected_once_ = false;
  // BindOnClose's keys, bound again on each new connection.
  std::string on_close_, on_bind_;
  // mu_ held; `again`: a rebinding after a reconnect, counted in on_bind_.
  Status Bind(bool again);
  bool enlist_known_ = true;  // false once the store answered it as torch's
  // Whether the store answers a MULTI_GET of a missing key (torch's own
  // server drops the connection instead).
  std::atomic<bool> multi_get_missing_{true};
  std::string rbuf_;  // received, not yet consumed
  // Watch connections: acknowledgements not yet matched to a WatchKey, and
  // changes not yet taken.
  int acks_ = 0;
  std::vector<KeyChange> changes_;
};

// A TcpStoreClient::Connect for Rendezvous's open_watch (give `opts` the
// kTorch113 dialect).
Result<std::unique_ptr<KeyWatch>> ConnectWatch(const StoreClientOptions& opts);

}  // namespace dtrun::rendezvous
