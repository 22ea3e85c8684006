// Store on etcd's v3 API (see etcd_store.h for the mapping). int64 fields
// come back as JSON strings and fields at their default value are left out
// (a missing "succeeded" is false), as the gateway marshals protobuf.
#include "rendezvous/etcd_store.h"

#include <algorithm>
#include <thread>

#include "rendezvous/util/socket_util.h"

namespace dtrun::rendezvous {
namespace {

using etcd_framing::BoolField;
using etcd_framing::FirstKv;
using etcd_framing::IntField;
using nlohmann::json;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// etcd's default --max-txn-ops.
constexpr size_t kMaxTxnOps = 128;
// Bound on the counters remembered for Add's first try.
constexpr size_t kMaxCounters = 4096;

// The request_range / request_put operations of a transaction.
json RangeOp(const std::string& key) {
  return {{"request_range", {{"key", Base64Encode(key)}}}};
}

json PutOp(const std::string& key, std::string_view value) {
  return {{"request_put",
           {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}}}};
}

// A reply that parsed as JSON but lacks what the request must return: a
// proxy in the way, or an etcd this code does not know.
Status Malformed(const std::string& what) {
  return Status::Io("etcd: malformed reply to " + what);
}

}  // namespace

EtcdStore::EtcdStore(std::unique_ptr<EtcdClient> client, std::string prefix,
                     milliseconds timeout)
    : client_(std::move(client)),
      prefix_(std::move(prefix)),
      timeout_(timeout) {}

Status EtcdStore::Set(const std::string& key, std::string_view value) {
  json body = {{"key", Base64Encode(prefix_ + key)},
               {"value", Base64Encode(value)}};
  return client_->Call("/v3/kv/put", body).status();
}

// One transaction of ranges per 128 keys. The revision is the first
// transaction's: a watch from revision + 1 misses no change made after the
// read (later transactions only make it later, never earlier).
Status EtcdStore::Read(const std::vector<std::string>& keys,
                       std::vector<Entry>* out, int64_t* revision) {
  if (keys.size() > kMaxTxnOps) return ReadUnder(keys, out, revision);
  out->assign(keys.size(), Entry{});
  for (size_t start = 0; start < keys.size(); start += kMaxTxnOps) {
    size_t end = std::min(keys.size(), start + kMaxTxnOps);
    json ops = json::array();
    for (size_t i = start; i < end; ++i)
      ops.push_back(RangeOp(prefix_ + keys[i]));
    auto reply = client_->Call("/v3/kv/txn", {{"success", ops}});
    if (!reply.ok()) return reply.status();
    std::vector<etcd_framing::Kv> kvs;
    Status s = etcd_framing::DecodeRanges(
        *reply, end - start, &kvs, revision && start == 0 ? revision : nullptr);
    if (!s.ok()) return s;
    for (size_t i = start; i < end; ++i) {
      const etcd_framing::Kv& kv = kvs[i - start];
      if (kv.found) (*out)[i] = Entry{kv.value, kv.mod_revision};
    }
  }
  return Status::Ok();
}

// Many keys (a round's every joiner, every rank) share a folder: one range
// over what they have in common reads them all in one request, where a
// transaction of ranges reads 128 (32 requests, each waiting its turn on a
// busy member, for 4,096 joiners). Keys under the folder not asked for
// come along and are dropped.
Status EtcdStore::ReadUnder(const std::vector<std::string>& keys,
                            std::vector<Entry>* out, int64_t* revision) {
  std::string common = keys[0];
  for (const auto& k : keys) {
    size_t n = 0;
    while (n < common.size() && n < k.size() && common[n] == k[n]) ++n;
    common.resize(n);
  }
  const std::string from = prefix_ + common;
  auto reply = client_->Call("/v3/kv/range",
                             {{"key", Base64Encode(from)},
                              {"range_end", Base64Encode(PrefixEnd(from))}});
  if (!reply.ok()) return reply.status();
  std::map<std::string, etcd_framing::Kv> found;
  Status s = etcd_framing::DecodeRangeAll(*reply, &found, revision);
  if (!s.ok()) return s;
  out->assign(keys.size(), Entry{});
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = found.find(prefix_ + keys[i]);
    if (it != found.end())
      (*out)[i] = Entry{it->second.value, it->second.mod_revision};
  }
  return Status::Ok();
}

// c10d's GET waits for the key: read, and only when it is missing pay for
// a watch.
Result<std::string> EtcdStore::Get(const std::string& key) {
  std::vector<Entry> got;
  Status s = Read({key}, &got, nullptr);
  if (s.ok() && got[0].mod_revision != 0) return got[0].value;
  if (s.ok()) s = Wait({key}, timeout_);
  if (s.ok()) s = Read({key}, &got, nullptr);
  if (!s.ok()) return s;
  return got[0].value;
}

Result<int64_t> EtcdStore::Add(const std::string& key, int64_t delta) {
  if (delta < 0) {
    return Status::Invalid("etcd counters only count up: Add(" + key + ", " +
                           std::to_string(delta) + ")");
  }
  const std::string full = prefix_ + key;
  if (delta == 0) {
    auto reply = client_->Call("/v3/kv/range", {{"key", Base64Encode(full)}});
    if (!reply.ok()) return reply.status();
    return FirstKv(*reply).version;
  }
  // Each increment is one put: the count is the key's version afterwards
  // (its previous version, returned by the put, plus one). No
  // compare-and-swap, so thousands of nodes taking a slot at once cost one
  // request each, not a retry storm.
  std::lock_guard<std::mutex> lock(mu_);
  int64_t count = 0;
  for (int64_t i = 0; i < delta; ++i) {
    auto seen = counters_.find(key);
    const int64_t guess = (seen == counters_.end() ? 0 : seen->second) + 1;
    json body = {{"key", Base64Encode(full)},
                 {"value", Base64Encode(std::to_string(guess))},
                 {"prev_kv", true}};
    auto reply = client_->Call("/v3/kv/put", body);
    if (!reply.ok()) {
      counters_.erase(key);
      return reply.status();
    }
    auto prev = reply->find("prev_kv");
    count = prev != reply->end() ? IntField(*prev, "version") + 1 : 1;
    if (counters_.size() >= kMaxCounters) counters_.clear();
    counters_[key] = count;
  }
  return count;
}

Result<std::string> EtcdStore::CompareSet(const std::string& key,
                                          std::string_view expected,
                                          std::string_view desired) {
  const std::string full = prefix_ + key;
  json compare = {{"key", Base64Encode(full)}, {"result", "EQUAL"}};
  if (expected.empty()) {
    compare["target"] = "CREATE";
    compare["create_revision"] = 0;
  } else {
    compare["target"] = "VALUE";
    compare["value"] = Base64Encode(expected);
  }
  json body = {{"compare", json::array({compare})},
               {"success", json::array({PutOp(full, desired)})},
               {"failure", json::array({RangeOp(full)})}};
  auto reply = client_->Call("/v3/kv/txn", body);
  if (!reply.ok()) return reply.status();
  if (BoolField(*reply, "succeeded")) return std::string(desired);
  std::vector<etcd_framing::Kv> kvs;
  if (!etcd_framing::DecodeRanges(*reply, 1, &kvs, nullptr).ok())
    return Malformed("a compare-set of " + key);
  // c10d's answer for a missing key and a non-empty expectation.
  if (!kvs[0].found) return std::string(expected);
  return kvs[0].value;
}

Result<bool> EtcdStore::Check(const std::vector<std::string>& keys) {
  std::vector<Entry> got;
  Status s = Read(keys, &got, nullptr);
  if (!s.ok()) return s;
  return std::all_of(got.begin(), got.end(),
                     [](const Entry& e) { return e.mod_revision != 0; });
}

// The index of the first of `keys` the store does not hold; keys.size()
// when it holds them all.
Result<size_t> EtcdStore::FirstMissing(const std::vector<std::string>& keys) {
  std::vector<Entry> got;
  Status s = Read(keys, &got, nullptr);
  if (!s.ok()) return s;
  size_t missing = 0;
  while (missing < got.size() && got[missing].mod_revision != 0) ++missing;
  return missing;
}

// Opens the watch of `key` that Wait keeps between calls; one that cannot
// be opened leaves none, after a pause of at most `left`. (Not from the
// revision of the read before it: thousands of watches that start in the
// past each cost the members a scan of the history until they catch up,
// which stalled 4,096 joiners for minutes; a second read is cheaper.)
void EtcdStore::WatchFor(const std::string& key, milliseconds left) {
  wait_watch_ = std::make_unique<EtcdWatch>(client_.get(), prefix_);
  wait_key_ = key;
  if (!wait_watch_->WatchKey(wait_key_).ok()) {
    wait_watch_.reset();
    sockets::SleepUntil(SteadyClock::now() + std::min(left, milliseconds(50)));
  }
}

namespace {

// Whether `changes` put `key` (a watch's events carry the value, so the
// key is known to be there without a read).
bool Puts(const std::vector<KeyChange>& changes, const std::string& key) {
  return std::any_of(changes.begin(), changes.end(), [&](const KeyChange& c) {
    return c.key == key && c.kind != KeyChange::Kind::kDeleted;
  });
}

}  // namespace

// Whether Wait must read `key`: not when the watch kept from the last call
// has seen no change since that call found it missing. A key not watched
// yet is watched before the read, so a put after it is pushed: one read.
bool EtcdStore::Arm(const std::string& key, milliseconds timeout) {
  if (wait_watch_ && key == wait_key_) {
    auto changed = wait_watch_->AwaitChange(milliseconds(0));
    return !changed.ok() || *changed;
  }
  WatchFor(key, timeout);
  return true;
}

// The watch of the key waited for stays open between calls: a joiner
// waits for its round's `final` in steps of half a second (so it can
// answer signals). The store is read only when that watch reports a change
// (or is new): thousands of joiners cost etcd nothing while they wait.
Status EtcdStore::Wait(const std::vector<std::string>& keys,
                       milliseconds timeout) {
  if (keys.size() > 1) return WaitAll(keys, timeout);
  std::lock_guard<std::mutex> lock(wait_mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool read = keys.empty() || Arm(keys[0], timeout);
  size_t missing = 0;
  for (;;) {
    if (read) {
      auto first = FirstMissing(keys);
      if (!first.ok()) return first.status();
      missing = *first;
      if (missing == keys.size()) {
        wait_watch_.reset();  // its key is there: nobody waits for it again
        return Status::Ok();
      }
    }
    // Rounded up: a wait never ends before its time.
    auto left = std::chrono::ceil<milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= milliseconds(0)) {
      return Status::Timeout("etcd: key " + keys[missing] +
                             " did not appear within " +
                             std::to_string(timeout.count()) + " ms");
    }
    if (!wait_watch_) {
      // The watch was lost (or never opened): watched from now on; the read
      // above may predate the watch, so the loop reads once more.
      WatchFor(keys[missing], left);
      read = true;
      continue;
    }
    auto changed = wait_watch_->AwaitChange(left);
    std::vector<KeyChange> seen;
    read = !changed.ok() || *changed;
    if (!changed.ok() || !wait_watch_->TakeChanges(&seen).ok()) {
      // Its member went away and no other took the watch: read again.
      wait_watch_.reset();
      sockets::SleepUntil(SteadyClock::now() +
                          std::min(left, milliseconds(50)));
    } else if (Puts(seen, keys[missing])) {
      wait_watch_.reset();  // the last missing key came: no read needed
      return Status::Ok();
    }
  }
}

// The closer of a round waits for every joiner's record: reading them all
// again after each arrival costs N/128 transactions per key, N^2/128 in
// all (95 s at 4,096 joiners on this machine's etcd). Instead only the
// keys still missing are read again, every 100 ms: the wait costs about
// the first read plus a transaction per 128 late keys per step, and ends
// at most a step after the last key. (A watch of the keys' range, tried
// first, could not be opened at all while 4,096 joiners held theirs.)
Status EtcdStore::WaitAll(const std::vector<std::string>& keys,
                          milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> missing = keys;
  for (;;) {
    std::vector<Entry> got;
    Status s = Read(missing, &got, nullptr);
    if (!s.ok()) return s;
    std::vector<std::string> still;
    for (size_t i = 0; i < missing.size(); ++i)
      if (got[i].mod_revision == 0) still.push_back(std::move(missing[i]));
    missing = std::move(still);
    if (missing.empty()) return Status::Ok();
    auto left = std::chrono::ceil<milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= milliseconds(0)) {
      return Status::Timeout(
          "etcd: key " + missing[0] + " did not appear within " +
          std::to_string(timeout.count()) + " ms" +
          (missing.size() > 1
               ? " (nor " + std::to_string(missing.size() - 1) + " more)"
               : ""));
    }
    sockets::SleepUntil(SteadyClock::now() + std::min(left, milliseconds(100)));
  }
}

Result<bool> EtcdStore::DeleteKey(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.erase(key);
  }
  auto reply = client_->Call("/v3/kv/deleterange",
                             {{"key", Base64Encode(prefix_ + key)}});
  if (!reply.ok()) return reply.status();
  return IntField(*reply, "deleted") > 0;
}

std::unique_ptr<KeyWatch> EtcdStore::OpenWatch() {
  return std::make_unique<EtcdWatch>(client_.get(), prefix_);
}

Result<int64_t> EtcdStore::DeletePrefix(const std::string& prefix) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.clear();
  }
  const std::string full = prefix_ + prefix;
  auto reply = client_->Call("/v3/kv/deleterange",
                             {{"key", Base64Encode(full)},
                              {"range_end", Base64Encode(PrefixEnd(full))}});
  if (!reply.ok()) return reply.status();
  return IntField(*reply, "deleted");
}

Result<int64_t> EtcdStore::NumKeys() {
  json body = {{"key", Base64Encode(prefix_)},
               {"range_end", Base64Encode(PrefixEnd(prefix_))},
               {"count_only", true}};
  auto reply = client_->Call("/v3/kv/range", body);
  if (!reply.ok()) return reply.status();
  return IntField(*reply, "count");
}

Result<std::vector<std::string>> EtcdStore::MultiGet(
    const std::vector<std::string>& keys) {
  std::vector<Entry> got;
  Status s = Read(keys, &got, nullptr);
  if (!s.ok()) return s;
  std::vector<std::string> values;
  values.reserve(got.size());
  for (Entry& e : got) values.push_back(std::move(e.value));
  return values;
}

// Each transaction of 128 puts is atomic; a list longer than that is set in
// several, in order (the rendezvous writes at most a round's ranks at once).
Status EtcdStore::MultiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  if (keys.size() != values.size())
    return Status::Invalid("MultiSet: keys and values differ in number");
  for (size_t start = 0; start < keys.size(); start += kMaxTxnOps) {
    size_t end = std::min(keys.size(), start + kMaxTxnOps);
    json ops = json::array();
    for (size_t i = start; i < end; ++i)
      ops.push_back(PutOp(prefix_ + keys[i], values[i]));
    Status s = client_->Call("/v3/kv/txn", {{"success", ops}}).status();
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// The slot and the record in one consensus round: both puts share the
// transaction's revision, and transactions are ordered, so the records'
// creation order is the counter's.
Result<Store::Enlisted> EtcdStore::Enlist(const Enlistment& e) {
  json put = PutOp(prefix_ + e.counter, "n");
  put["request_put"]["prev_kv"] = true;
  json ops = json::array({put, PutOp(prefix_ + e.records + e.id, e.record)});
  std::unique_lock<std::mutex> lease_lock(lease_mu_);
  const bool alive = !e.alive.empty() && EnsureLease(e.alive_ttl).ok();
  if (alive) {
    json leased = PutOp(prefix_ + e.alive + e.id, "1");
    leased["request_put"]["lease"] = std::to_string(lease_->id());
    ops.push_back(std::move(leased));
    lease_->Touch();
  }
  auto reply = client_->Call("/v3/kv/txn", {{"success", ops}});
  if (!reply.ok()) return reply.status();
  if (alive) leased_key_ = e.alive + e.id;
  lease_lock.unlock();
  auto responses = reply->find("responses");
  if (responses == reply->end() || !responses->is_array() || responses->empty())
    return Malformed("an enlist in " + e.counter);
  const json& first = (*responses)[0];
  auto response = first.find("response_put");
  if (response == first.end()) return Malformed("an enlist in " + e.counter);
  auto prev = response->find("prev_kv");
  return Enlisted{prev != response->end() ? IntField(*prev, "version") + 1 : 1,
                  alive};
}

// The folder's first `count` records by creation; on etcd a record never
// trails its slot, so there is nothing to wait for.
Result<std::vector<std::string>> EtcdStore::ReadEnlisted(
    const std::string& records, int64_t count, milliseconds wait) {
  (void)wait;
  std::vector<std::string> out;
  if (count <= 0) return out;
  const std::string from = prefix_ + records;
  auto reply = client_->Call("/v3/kv/range",
                             {{"key", Base64Encode(from)},
                              {"range_end", Base64Encode(PrefixEnd(from))},
                              {"sort_order", "ASCEND"},
                              {"sort_target", "CREATE"},
                              {"limit", count}});
  if (!reply.ok()) return reply.status();
  auto kvs = reply->find("kvs");
  if (kvs != reply->end() && kvs->is_array()) {
    for (const json& kv : *kvs) {
      std::string value;
      auto v = kv.find("value");
      if (v != kv.end() && v->is_string())
        (void)Base64Decode(v->get<std::string>(), &value);
      out.push_back(std::move(value));
    }
  }
  out.resize(static_cast<size_t>(count));
  return out;
}

// Detaching puts the key again without a lease, so its end is never read
// as the node's death.
Status EtcdStore::LeaseKey(const std::string& key, milliseconds ttl) {
  std::lock_guard<std::mutex> lock(lease_mu_);
  if (key.empty()) {
    if (leased_key_.empty()) return Status::Ok();
    Status s = Set(leased_key_, "left");
    leased_key_.clear();
    return s;
  }
  if (Status s = EnsureLease(ttl); !s.ok()) return s;
  lease_->Touch();
  json body = {{"key", Base64Encode(prefix_ + key)},
               {"value", Base64Encode("1")},
               {"lease", std::to_string(lease_->id())}};
  Status s = client_->Call("/v3/kv/put", body).status();
  if (s.ok()) leased_key_ = key;
  return s;
}

Status EtcdStore::EnsureLease(milliseconds ttl) {
  if (lease_ && lease_->alive() && lease_->asked() == ttl) return Status::Ok();
  lease_.reset();
  auto granted = EtcdLease::Grant(client_->options(), ttl);
  if (!granted.ok()) return granted.status();
  lease_ = std::move(*granted);
  return Status::Ok();
}

void EtcdStore::StillAlive() {
  std::lock_guard<std::mutex> lock(lease_mu_);
  if (lease_) lease_->Touch();
}

}  // namespace dtrun::rendezvous
