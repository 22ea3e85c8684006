#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>

#include "rendezvous/store.h"

namespace dtrun::rendezvous {

// In-process Store for tests and single-process use (gloo's HashStore idea).
// Thread-safe; Wait blocks the calling thread on a condition variable.
class MemoryStore : public Store {
 public:
  explicit MemoryStore(
      std::chrono::milliseconds timeout = std::chrono::seconds(300))
      : timeout_(timeout) {}

  Status Set(const std::string& key, std::string_view value) override;
  Result<std::string> Get(const std::string& key) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;
  Result<std::string> CompareSet(const std::string& key,
                                 std::string_view expected,
                                 std::string_view desired) override;
  Result<bool> Check(const std::vector<std::string>& keys) override;
  Status Wait(const std::vector<std::string>& keys,
              std::chrono::milliseconds timeout) override;
  Result<bool> DeleteKey(const std::string& key) override;
  Result<int64_t> NumKeys() override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  // The slot and the record at once, as dtstore's one request does.
  Result<Enlisted> Enlist(const Enlistment& e) override;

  using Store::Wait;

 private:
  bool AllExist(const std::vector<std::string>& keys) const;  // REQUIRES: mu_

  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::unordered_map<std::string, std::string> data_;
};

}  // namespace dtrun::rendezvous
