// The store's semantics, apart from any socket.
//
// Waiters. A WAIT on keys that all exist is answered at once; otherwise one
// Waiter counts the missing keys and is indexed three ways: by id (the
// waiter), by key (who to wake when it appears) and by connection (what to
// forget when the client cancels or goes away). Each arrival of a key wakes
// every waiter on it once, so a waiter on n keys needs n arrivals; the reply
// (one byte) goes out with the arrival that completes it. A queue push
// counts as an arrival for one waiter only, since one item feeds one POP.
//
// Differences from torch that are deliberate (torch's own backends differ
// among themselves; we follow the libuv one):
//   - GET of a missing key replies empty bytes; the client WAITs first, as
//     c10d's does, so only raw clients see it.
//   - COMPARE_SET on a missing key creates it only when `expected` is empty
//     and replies `expected` otherwise (c10d's answer, not an error). A
//     successful COMPARE_SET is a SET: it wakes waiters and notifies
//     watchers, which the rendezvous relies on to WAIT for its state.
//   - ADD parses the old value as std::stoll does (ParseCounter), so a value
//     SET as text counts on from its leading number.
// Replies are appended into the connection's output buffer (ReplySink), and
// a large stored value is shared with the reply instead of copied.

#include "rendezvous/store_state.h"

#include <algorithm>
#include <charconv>

#include "rendezvous/util/check.h"

namespace dtrun::rendezvous {
namespace {

// Appends a one-byte reply; no-op when the connection is gone.
void ReplyU8(ReplySink* sink, ConnId conn, uint8_t v) {
  if (std::string* out = sink->Out(conn)) PutU8(out, v);
}

// Values this large are sent from the stored bytes (no copy per GET); a
// smaller one is cheaper to copy than to queue as a separate buffer.
constexpr size_t kShareBytes = 16 * 1024;

}  // namespace

const std::shared_ptr<const std::string>& StoredValue::Empty() {
  static const auto* empty = new std::shared_ptr<const std::string>(
      std::make_shared<const std::string>());
  return *empty;
}

// std::stoll's rules (strtoll, base 10, "C" locale), as torch's server
// parses the old value of ADD: a value a client wrote with SET (' 7',
// '7abc') counts on from its leading number instead of failing.
bool ParseCounter(std::string_view text, int64_t* value) {
  auto blank = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!text.empty() && blank(text.front())) text.remove_prefix(1);
  // from_chars takes '-' but not '+'; after a '+' only a digit may follow.
  if (!text.empty() && text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && text.front() == '-') return false;
  }
  // Text after the digits is ignored, as strtoll does; no digits or a
  // number out of 64-bit range is an error.
  int64_t parsed = 0;
  auto result = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (result.ec != std::errc()) return false;
  *value = parsed;
  return true;
}

// With or without the "/" that c10d's clients put before every key.
bool IsOnCloseKey(std::string_view key) {
  if (!key.empty() && key[0] == '/') key.remove_prefix(1);
  return key == kOnCloseKey;
}

bool IsEnlistKey(std::string_view key) {
  if (!key.empty() && key[0] == '/') key.remove_prefix(1);
  return key == kEnlistKey;
}

Status StoreState::Apply(ConnId conn, const Request& req, ReplySink* sink) {
  // Replies for a connection that is already gone are built into discard_
  // and dropped, so every case below can write unconditionally.
  std::string* reply = sink->Out(conn);
  std::string& out = reply ? *reply : discard_;
  switch (req.op) {
    case Op::kValidate:
      // Whether VALIDATE came first is the server's business (it knows the
      // connection's dialect); here only the magic is checked.
      if (req.word != kValidateMagic) {
        return Status::Invalid("VALIDATE with wrong magic");
      }
      return Status::Ok();
    case Op::kPing:
      PutU32(&out, req.word);
      break;
    case Op::kSet:
      if (IsOnCloseKey(req.keys[0])) {
        if (req.values[0].empty()) {
          on_close_.erase(conn);
        } else {
          on_close_[conn] = req.values[0];
        }
        return Status::Ok();
      }
      Set(req.keys[0], req.values[0], sink);
      return Status::Ok();
    case Op::kMultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) {
        Set(req.keys[i], req.values[i], sink);
      }
      return Status::Ok();
    case Op::kAppend: {
      auto it = data_.find(req.keys[0]);
      Set(req.keys[0],
          std::string(it == data_.end() ? std::string_view()
                                        : std::string_view(it->second)) +
              req.values[0],
          sink);
      return Status::Ok();
    }
    case Op::kCompareSet: {
      const std::string& key = req.keys[0];
      if (IsEnlistKey(key))
        return Enlist(conn, req.values[0], req.values[1], sink, &out);
      const std::string& expected = req.values[0];
      const std::string& desired = req.values[1];
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (expected.empty()) Set(key, desired, sink);
        PutBytes(&out, expected.empty() ? desired : expected);
      } else if (it->second == expected) {
        Set(key, desired, sink);
        PutBytes(&out, desired);
      } else {
        PutBytes(&out, it->second);
      }
      break;
    }
    case Op::kGet: {
      auto it = data_.find(req.keys[0]);
      // The length goes into the buffer now and the value is queued by
      // reference after it; a SET meanwhile swaps data_'s pointer and the
      // queued reply still sends the bytes the GET saw.
      if (it != data_.end() && it->second.size() >= kShareBytes && reply) {
        PutU64(&out, it->second.size());
        sink->OutShared(conn, it->second.shared());  // `out` is stale now
        return Status::Ok();
      }
      PutBytes(&out, it == data_.end() ? std::string_view() : it->second);
      break;
    }
    case Op::kMultiGet:
      for (const auto& key : req.keys) {
        auto it = data_.find(key);
        PutBytes(&out, it == data_.end() ? std::string_view() : it->second);
      }
      break;
    case Op::kAdd: {
      int64_t result = 0;
      Status s = Add(req.keys[0], req.number, &result, sink);
      if (!s.ok()) return s;
      PutI64(&out, result);
      break;
    }
    case Op::kCheck: {
      bool all =
          std::all_of(req.keys.begin(), req.keys.end(),
                      [this](const std::string& k) { return Exists(k); });
      PutU8(&out, all ? kCheckReady : kCheckNotReady);
      break;
    }
    case Op::kWait:
      Wait(conn, req.keys, sink);
      return Status::Ok();
    case Op::kGetNumKeys:
      PutI64(&out, static_cast<int64_t>(data_.size()));
      break;
    case Op::kDeleteKey: {
      auto it = data_.find(req.keys[0]);
      bool found = it != data_.end();
      if (found) {
        StoredValue old = std::move(it->second);
        data_.erase(it);
        Notify(req.keys[0], kWatchDeleted, old, "", sink);
      }
      PutI64(&out, found ? 1 : 0);
      break;
    }
    case Op::kWatchKey:
      watchers_[req.keys[0]].push_back(conn);
      PutU8(&out, kWatchRegistered);
      break;
    case Op::kCancelWait:
      CancelWaits(conn);
      PutU8(&out, kWaitCanceled);
      break;
    case Op::kQueuePush:
      queues_[req.keys[0]].push_back(req.values[0]);
      Wake(req.keys[0], /*only_one=*/true, sink);
      return Status::Ok();
    case Op::kQueuePop:
      QueuePop(conn, req.keys[0], sink);
      return Status::Ok();
    case Op::kQueueLen: {
      auto it = queues_.find(req.keys[0]);
      PutI64(&out,
             it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    case Op::kListKeys:
      PutI64(&out, static_cast<int64_t>(data_.size()));
      for (const auto& kv : data_) PutBytes(&out, kv.first);
      break;
    case Op::kBarrier: {
      // A counting barrier on an ordinary counter: ADD 1, then release every
      // barrier waiter whose world size the counter has reached.
      int64_t count = 0;
      Status s = Add(req.keys[0], 1, &count, sink);
      if (!s.ok()) return s;
      barriers_[req.keys[0]].push_back({conn, req.number});
      ReleaseBarriers(req.keys[0], sink);
      return Status::Ok();
    }
  }
  discard_.clear();
  return Status::Ok();
}

void StoreState::Set(const std::string& key, std::string value,
                     ReplySink* sink) {
  auto [it, created] = data_.try_emplace(key);
  // The old value is copied only for a watched key (WATCH_KEY sends it).
  bool watched = !watchers_.empty() && watchers_.count(key);
  std::string old;
  if (watched) old = it->second;
  it->second = std::move(value);
  if (watched) {
    Notify(key, created ? kWatchCreated : kWatchUpdated, old, it->second, sink);
  }
  Wake(key, /*only_one=*/false, sink);
}

Status StoreState::Add(const std::string& key, int64_t delta, int64_t* result,
                       ReplySink* sink) {
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !ParseCounter(it->second, &current)) {
    return Status::Invalid("ADD to key '" + key +
                           "' whose value is not a decimal integer (no leading "
                           "digits, or beyond 64 bits)");
  }
  if (__builtin_add_overflow(current, delta, result)) {
    return Status::Invalid("ADD of " + std::to_string(delta) + " to key '" +
                           key + "' overflows a 64-bit counter");
  }
  Set(key, std::to_string(*result), sink);
  ReleaseBarriers(key, sink);
  return Status::Ok();
}

// One joiner's slot, record and binding in one request (kEnlistKey). A
// payload without its parts is bad input: its connection closes.
Status StoreState::Enlist(ConnId conn, const std::string& counter,
                          const std::string& payload, ReplySink* sink,
                          std::string* out) {
  const size_t a = payload.find('\n');
  const size_t b = a == std::string::npos ? a : payload.find('\n', a + 1);
  if (b == std::string::npos)
    return Status::Invalid("enlist request without its records and closes");
  int64_t slot = 0;
  Status s = Add(counter, 1, &slot, sink);
  if (!s.ok()) return s;
  const std::string n = std::to_string(slot);
  Set(payload.substr(0, a) + n, payload.substr(b + 1), sink);
  // Bound as kOnCloseKey binds: a joiner that dies while it waits for its
  // round is counted gone before the round even closes.
  std::string closes = payload.substr(a + 1, b - a - 1);
  if (!closes.empty()) on_close_[conn] = closes + n;
  PutBytes(out, n);
  return Status::Ok();
}

bool StoreState::Exists(const std::string& key) const {
  if (data_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreState::Wait(ConnId conn, const std::vector<std::string>& keys,
                      ReplySink* sink) {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!Exists(key)) missing.push_back(key);
  }
  if (missing.empty()) {
    ReplyU8(sink, conn, kStopWaiting);
    return;
  }
  uint64_t id = next_waiter_++;
  for (const auto& key : missing) key_waiters_[key].push_back(id);
  size_t count = missing.size();
  waiters_.emplace(id, Waiter{conn, count, std::move(missing)});
  conn_waiters_[conn].push_back(id);
}

void StoreState::Wake(const std::string& key, bool only_one, ReplySink* sink) {
  auto it = key_waiters_.find(key);
  if (it == key_waiters_.end()) return;
  std::vector<uint64_t>& ids = it->second;
  // Oldest first: waiters are released in the order they came. For a queue
  // push (only_one) the oldest waiter takes the item's arrival even when it
  // still misses other keys, so a second waiter is not woken for an item
  // the first will pop.
  size_t used = 0;
  for (bool woke = false; used < ids.size() && !(only_one && woke); ++used) {
    auto w = waiters_.find(ids[used]);
    DTRUN_CHECK(w != waiters_.end()) << "waiter " << ids[used] << " on key '"
                                     << key << "' is not registered";
    woke = true;
    if (--w->second.missing > 0) continue;
    ConnId conn = w->second.conn;
    Forget(ids[used], &key);
    ReplyU8(sink, conn, kStopWaiting);
  }
  ids.erase(ids.begin(), ids.begin() + used);
  if (ids.empty()) key_waiters_.erase(it);
}

void StoreState::Forget(uint64_t id, const std::string* except_key) {
  auto w = waiters_.find(id);
  DTRUN_CHECK(w != waiters_.end()) << "forgetting waiter " << id << " twice";
  for (const auto& key : w->second.keys) {
    if (except_key && key == *except_key) continue;
    auto kw = key_waiters_.find(key);
    if (kw == key_waiters_.end()) continue;
    auto& ids = kw->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) key_waiters_.erase(kw);
  }
  auto& mine = conn_waiters_[w->second.conn];
  mine.erase(std::remove(mine.begin(), mine.end(), id), mine.end());
  if (mine.empty()) conn_waiters_.erase(w->second.conn);
  waiters_.erase(w);
}

void StoreState::ReleaseBarriers(const std::string& key, ReplySink* sink) {
  auto it = barriers_.find(key);
  if (it == barriers_.end()) return;
  int64_t count = 0;
  auto d = data_.find(key);
  if (d == data_.end() || !ParseCounter(d->second, &count)) return;
  auto& list = it->second;
  // stable_partition keeps the barriers still waiting in arrival order.
  auto released = std::stable_partition(
      list.begin(), list.end(),
      [count](const BarrierWaiter& b) { return count < b.world_size; });
  for (auto b = released; b != list.end(); ++b) {
    ReplyU8(sink, b->conn, kStopWaiting);
  }
  list.erase(released, list.end());
  if (list.empty()) barriers_.erase(it);
}

void StoreState::CancelWaits(ConnId conn) {
  auto it = conn_waiters_.find(conn);
  if (it != conn_waiters_.end()) {
    std::vector<uint64_t> ids = it->second;
    for (uint64_t id : ids) Forget(id, nullptr);
  }
  for (auto b = barriers_.begin(); b != barriers_.end();) {
    auto& list = b->second;
    list.erase(std::remove_if(
                   list.begin(), list.end(),
                   [conn](const BarrierWaiter& w) { return w.conn == conn; }),
               list.end());
    b = list.empty() ? barriers_.erase(b) : std::next(b);
  }
}

// The on-close ADD comes after the connection's own registrations are gone,
// so its wakes reach only the others. A counter that cannot take the ADD
// (a value that is no number) is left as it is.
void StoreState::Disconnect(ConnId conn, ReplySink* sink) {
  CancelWaits(conn);
  for (auto w = watchers_.begin(); w != watchers_.end();) {
    auto& list = w->second;
    list.erase(std::remove(list.begin(), list.end(), conn), list.end());
    w = list.empty() ? watchers_.erase(w) : std::next(w);
  }
  auto bound = on_close_.find(conn);
  if (bound == on_close_.end()) return;
  const std::string key = std::move(bound->second);
  on_close_.erase(bound);
  int64_t ignored = 0;
  (void)Add(key, 1, &ignored, sink);
}

void StoreState::Clear() {
  // Waiters stay: clients of the previous attempt that still wait are
  // released when the new attempt sets their keys.
  data_.clear();
  queues_.clear();
}

void StoreState::Notify(const std::string& key, uint8_t type,
                        std::string_view old_value, std::string_view new_value,
                        ReplySink* sink) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  // Encoded once and appended to every watcher.
  std::string msg;
  PutU8(&msg, type);
  PutBytes(&msg, key);
  PutBytes(&msg, old_value);
  PutBytes(&msg, new_value);
  for (ConnId conn : it->second) {
    if (std::string* out = sink->Out(conn)) out->append(msg);
  }
}

void StoreState::QueuePop(ConnId conn, const std::string& key,
                          ReplySink* sink) {
  std::string* reply = sink->Out(conn);
  if (!reply) return;
  std::string& out = *reply;
  auto it = queues_.find(key);
  // The protocol's reply carries the length before the pop, not after.
  int64_t len =
      it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
  PutI64(&out, len);
  if (len > 0) {
    PutBytes(&out, it->second.front());
    it->second.pop_front();
    if (it->second.empty()) queues_.erase(it);
  }
}

}  // namespace dtrun::rendezvous
