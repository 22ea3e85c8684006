#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rendezvous/util/status.h"
#include "rendezvous/wire.h"

namespace dtrun::rendezvous {

using ConnId = uint64_t;

// Where StoreState writes reply bytes: to the requesting connection, or to
// others (a released WAIT, a WATCH_KEY notification). Replies are appended
// straight into the connection's output buffer, so a large value is copied
// once.
class ReplySink {
 public:
  virtual ~ReplySink() = default;
  // The output buffer of `conn` to append to, or null when it is gone.
  virtual std::string* Out(ConnId conn) = 0;
  // Sends `bytes` to `conn` after everything Out(conn) holds so far. A sink
  // may keep the reference instead of copying (a large GET reply goes out
  // from the stored value itself); the default copies. Out(conn) must be
  // asked again afterwards to append more.
  virtual void OutShared(ConnId conn,
                         std::shared_ptr<const std::string> bytes) {
    if (std::string* out = Out(conn)) out->append(*bytes);
  }
};

// A stored value: immutable bytes, shared with the replies that send them,
// so a SET while a reply is in flight swaps the pointer, not those bytes.
class StoredValue {
 public:
  StoredValue() : bytes_(Empty()) {}
  StoredValue& operator=(std::string bytes) {
    bytes_ = std::make_shared<const std::string>(std::move(bytes));
    return *this;
  }
  operator std::string_view() const {
    return *bytes_;
  }  // NOLINT: reads as bytes
  bool operator==(std::string_view other) const { return *bytes_ == other; }
  size_t size() const { return bytes_->size(); }
  const std::shared_ptr<const std::string>& shared() const { return bytes_; }

 private:
  static const std::shared_ptr<const std::string>& Empty();
  std::shared_ptr<const std::string> bytes_;
};

// The store's server logic: key map, queues, waiters and watchers. Pure: no
// I/O, no clock, no threads; the server's event loop owns it and is the only
// caller. Semantics follow c10d (libuv backend where versions differ: GET of
// a missing key returns empty bytes, COMPARE_SET wakes waiters).
class StoreState {
 public:
  // Applies one decoded request from `conn` and sends its replies through
  // `sink`. Returns non-ok when the request is invalid (ADD to a value with
  // no leading decimal integer, or one that overflows; a VALIDATE with the
  // wrong magic); the caller then closes `conn` and calls Disconnect.
  Status Apply(ConnId conn, const Request& req, ReplySink* sink);

  // Forgets every WAIT, BARRIER and WATCH_KEY registration of `conn`, and
  // does its on-close ADD (kOnCloseKey), whose wakes go through `sink`.
  void Disconnect(ConnId conn, ReplySink* sink);

  // Removes every key and queue (a fresh key space for a new attempt).
  // Waiters stay registered and are released as keys appear again.
  void Clear();

  size_t NumKeys() const { return data_.size(); }
  size_t NumWaiters() const { return waiters_.size(); }

 private:
  struct Waiter {
    ConnId conn;
    size_t missing;                 // registrations not yet released
    std::vector<std::string> keys;  // the keys it is registered on
  };
  struct BarrierWaiter {
    ConnId conn;
    int64_t world_size;
  };

  void Set(const std::string& key, std::string value, ReplySink* sink);
  Status Add(const std::string& key, int64_t delta, int64_t* result,
             ReplySink* sink);
  bool Exists(const std::string& key) const;
  void Wait(ConnId conn, const std::vector<std::string>& keys, ReplySink* sink);
  void CancelWaits(ConnId conn);
  // A key came into existence or changed: release waiters (all of them, or
  // one for a queue push) and barriers counting on it.
  void Wake(const std::string& key, bool only_one, ReplySink* sink);
  // Drops waiter `id` from every index except key_waiters_[*except_key]
  // (when not null), which the caller is iterating.
  void Forget(uint64_t id, const std::string* except_key);
  void ReleaseBarriers(const std::string& key, ReplySink* sink);
  void Notify(const std::string& key, uint8_t type, std::string_view old_value,
              std::string_view new_value, ReplySink* sink);
  void QueuePop(ConnId conn, const std::string& key, ReplySink* sink);
  Status Enlist(ConnId conn, const std::string& counter,
                const std::string& payload, ReplySink* sink, std::string* out);

  std::string discard_;  // replies to a connection that is gone
  std::unordered_map<std::string, StoredValue> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  uint64_t next_waiter_ = 1;
  std::unordered_map<uint64_t, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<uint64_t>> key_waiters_;
  std::unordered_map<ConnId, std::vector<uint64_t>> conn_waiters_;
  std::unordered_map<std::string, std::vector<BarrierWaiter>> barriers_;
  std::unordered_map<std::string, std::vector<ConnId>> watchers_;
  std::unordered_map<ConnId, std::string> on_close_;  // kOnCloseKey's
};

// A SET of this key is not stored: it binds its value, a key, to the
// connection that sent it, and when that connection closes the store ADDs
// 1 to that key (waking its waiters and watchers). An empty value unbinds;
// a later SET replaces the binding. dtrun's rendezvous binds each node's
// "gone" key of the round on its store connection, so that a node whose
// dtrun dies (the kernel closes its sockets) is known at once rather than
// after its missed heartbeats. No torch client sets it.
constexpr char kOnCloseKey[] = "dtrun/.on_close";
// kOnCloseKey, or it after c10d's "/".
bool IsOnCloseKey(std::string_view key);
// A COMPARE_SET of this key is a rendezvous joiner's entry in one request
// (Store::Enlist): `expected` names a counter, `desired` is "<records
// prefix>\n<closes prefix>\n<record>". The store ADDs 1 to the counter,
// sets <records prefix><slot> to the record, binds the connection to
// <closes prefix><slot> as kOnCloseKey does (unless that prefix is empty)
// and replies the slot in decimal. Nothing is stored under this key. A
// store without it (torch's) answers `expected` without setting anything,
// which no decimal slot can be: the client then takes two requests.
constexpr char kEnlistKey[] = "dtrun/.enlist";
bool IsEnlistKey(std::string_view key);

// Parses a stored counter the way ADD does, which is torch's std::stoll:
// leading blanks, an optional sign, decimal digits; text after the digits
// is ignored. False (and *value untouched) when there are no digits or the
// number does not fit in 64 bits.
bool ParseCounter(std::string_view text, int64_t* value);

}  // namespace dtrun::rendezvous
