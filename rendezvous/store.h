#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::rendezvous {

// A c10d-style key-value store: values are bytes, ADD keeps a decimal
// string, WAIT returns once every key exists. Implementations are
// thread-safe; calls on one object are serialized.
class Store {
 public:
  virtual ~Store() = default;

  virtual Status Set(const std::string& key, std::string_view value) = 0;
  // Waits up to timeout() for `key` to exist, then returns its value.
  virtual Result<std::string> Get(const std::string& key) = 0;
  // Adds `delta` to the counter at `key` (missing = 0); returns the new value.
  virtual Result<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if its value is `expected` (or if it is missing
  // and `expected` is empty). Returns the value the key holds afterwards
  // (c10d quirk: `expected` when missing and `expected` is non-empty).
  virtual Result<std::string> CompareSet(const std::string& key,
                                         std::string_view expected,
                                         std::string_view desired) = 0;
  // True iff every key exists. Never blocks on the keys.
  virtual Result<bool> Check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists; Status::Timeout after `timeout`.
  virtual Status Wait(const std::vector<std::string>& keys,
                      std::chrono::milliseconds timeout) = 0;
  // True if the key existed.
  virtual Result<bool> DeleteKey(const std::string& key) = 0;
  virtual Result<int64_t> NumKeys() = 0;
  // Values of several keys in one round trip where the store can; a key that
  // does not exist reads as empty bytes (it is not waited for). The default
  // asks key by key (Check, then Get).
  virtual Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys);
  // Sets several keys in one round trip where the store can.
  virtual Status MultiSet(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values);
  // A joiner's entry in a round, in one request where the store can
  // (dtstore's and dtrun's store; etcd: one transaction): takes the next
  // slot of the counter `counter` (as Add(counter, 1)), stores `record`
  // where Enlisted finds it by slot, and says how the store will tell that
  // this client is gone: with `closes` set, binds its connection as
  // BindOnClose(closes + slot, rebinds + slot) does (c10d); with `alive`
  // set, puts alive + id under its lease of `alive_ttl` as LeaseKey does
  // (etcd).
  struct Enlistment {
    std::string counter;
    std::string records;  // prefix of the records' keys
    std::string id;       // unique among the round's joiners (the node id)
    std::string record;
    std::string closes, rebinds;  // prefixes; "" binds nothing
    std::string alive;            // prefix; "" puts nothing
    std::chrono::milliseconds alive_ttl{0};
  };
  struct Enlisted {
    int64_t slot = 0;
    // The store tells when this client is gone, as asked: its connection
    // is bound (closes) or its key is under its lease (alive).
    bool bound = false;
  };
  // The default: Add, then Set of `records` + slot (two requests, and the
  // binding, if any, is left to BindOnClose).
  virtual Result<Enlisted> Enlist(const Enlistment& e);
  // The records of slots 1..count, in slot order ("" for one not there).
  // With `wait` > 0, first waits that long for the default's records,
  // which land a request after their slot.
  virtual Result<std::vector<std::string>> ReadEnlisted(
      const std::string& records, int64_t count,
      std::chrono::milliseconds wait);
  // Default timeout of Get and of Wait(keys).
  virtual std::chrono::milliseconds timeout() const = 0;
  // Asks the store to ADD 1 to `closes` when this client's connection
  // closes (its process died, or the connection broke); the client ADDs 1
  // to `binds` each time it binds a connection (now, and again after any
  // reconnect), so the client is gone once closes >= binds. "" and "":
  // unbind (the client leaves on purpose). Stores that cannot (etcd,
  // in-process ones) say so with Status::Invalid; the rendezvous then
  // relies on heartbeats alone.
  virtual Status BindOnClose(const std::string& closes,
                             const std::string& binds) {
    (void)closes;
    (void)binds;
    return Status::Invalid("this store cannot tell when a client is gone");
  }
  // For a store that sees no connection close (etcd): keeps `key` (value
  // "1") only while this client lives, under a lease of `ttl` that the
  // client renews on a thread of its own for as long as StillAlive() was
  // called within `ttl`. When the client dies, stops, is cut off or stops
  // calling StillAlive, the store deletes the key about `ttl` later. ""
  // detaches the last key (it stays, valued "left": the client leaves on
  // purpose). Stores that cannot: Status::Invalid.
  virtual Status LeaseKey(const std::string& key,
                          std::chrono::milliseconds ttl) {
    (void)key;
    (void)ttl;
    return Status::Invalid("this store has no leases");
  }
  // The caller's loop is alive (see LeaseKey).
  virtual void StillAlive() {}
  // Whether LeaseKey can work here.
  virtual bool has_leases() const { return false; }

  Status Wait(const std::vector<std::string>& keys) {
    return Wait(keys, timeout());
  }
};

// A change of a key the client watches, as the store pushed it.
struct KeyChange {
  enum class Kind : uint8_t { kUpdated = 0, kCreated = 1, kDeleted = 2 };
  Kind kind = Kind::kUpdated;
  std::string key;
  std::string value;  // the new value; empty when deleted
};

// A stream on which a store pushes the changes of the keys registered on
// it: the c10d 1.13 dialect's WATCH_KEY connection (TcpStoreClient), or an
// etcd watch (EtcdStore::OpenWatch).
class KeyWatch {
 public:
  virtual ~KeyWatch() = default;
  // Registers `key`; returns once the store will push every later change.
  virtual Status WatchKey(const std::string& key) = 0;
  // Registers each of `keys`, in one request where the store can.
  virtual Status WatchKeys(const std::vector<std::string>& keys) {
    for (const auto& key : keys) {
      Status s = WatchKey(key);
      if (!s.ok()) return s;
    }
    return Status::Ok();
  }
  // Appends the changes pushed since the last call, in the order the store
  // made them, without blocking. Unavailable once the stream is lost and
  // cannot be resumed where it stood.
  virtual Status TakeChanges(std::vector<KeyChange>* changes) = 0;
};

}  // namespace dtrun::rendezvous
