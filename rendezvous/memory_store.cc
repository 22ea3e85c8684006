// The in-memory store: one map under one mutex; Wait blocks on a condition
// variable that every write notifies.
#include "rendezvous/memory_store.h"

#include "rendezvous/util/describe.h"
#include "rendezvous/store_state.h"

namespace dtrun::rendezvous {

Status MemoryStore::Set(const std::string& key, std::string_view value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = std::string(value);
  }
  // Notified after unlocking so the woken waiters do not block on mu_ at
  // once; every waiter re-checks its own keys (one condition for all keys).
  changed_.notify_all();
  return Status::Ok();
}

// Waits for a missing key, as the TCP client does, so code tested over
// this store behaves the same over the network.
Result<std::string> MemoryStore::Get(const std::string& key) {
  Status s = Wait({key}, timeout_);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  return data_[key];
}

// A missing key counts as 0, and a value that is not a number is refused,
// as the TCP store does, so tests over this store see the same errors.
Result<int64_t> MemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Same parse as the server's ADD, so counters agree across stores.
    auto it = data_.find(key);
    if (it != data_.end() && !ParseCounter(it->second, &value)) {
      return Status::Invalid("add to key '" + key +
                             "': value is not a decimal integer");
    }
    value += delta;
    data_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

// Under one lock, as dtstore does it in one request: a closer never finds
// a slot without its record, so rounds over this store in the tests take
// the path the product's store takes (no wait for trailing records).
Result<Store::Enlisted> MemoryStore::Enlist(const Enlistment& e) {
  int64_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(e.counter);
    if (it != data_.end() && !ParseCounter(it->second, &slot)) {
      return Status::Invalid("enlist in '" + e.counter +
                             "': value is not a decimal integer");
    }
    data_[e.counter] = std::to_string(++slot);
    data_[e.records + std::to_string(slot)] = e.record;
  }
  changed_.notify_all();
  return Enlisted{slot, false};
}

Result<std::string> MemoryStore::CompareSet(const std::string& key,
                                            std::string_view expected,
                                            std::string_view desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (expected.empty()) data_[key] = std::string(desired);
      result = std::string(expected.empty() ? desired : expected);
    } else if (it->second == expected) {
      it->second = std::string(desired);
      result = it->second;
    } else {
      result = it->second;
    }
  }
  changed_.notify_all();
  return result;
}

bool MemoryStore::AllExist(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!data_.count(k)) return false;
  }
  return true;
}

Result<bool> MemoryStore::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  return AllExist(keys);
}

Status MemoryStore::Wait(const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (changed_.wait_for(lock, timeout, [&] { return AllExist(keys); })) {
    return Status::Ok();
  }
  return Status::Timeout("memory store: wait for keys " + DescribeKeys(keys) +
                         " timed out after " + DescribeSeconds(timeout));
}

Result<bool> MemoryStore::DeleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) == 1;
}

Result<int64_t> MemoryStore::NumKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

}  // namespace dtrun::rendezvous
