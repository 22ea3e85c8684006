#pragma once

#include <string>

#include "rendezvous/store.h"

namespace dtrun::rendezvous {

// Namespacing decorator: key -> prefix + "/" + key, as c10d's PrefixStore.
// Does not own `inner`, which must outlive it. Thread rules: those of inner.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store* inner)
      : prefix_(std::move(prefix)), inner_(inner) {}

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
  // All keys of the inner store, as c10d does.
  Result<int64_t> NumKeys() override { return inner_->NumKeys(); }
  std::chrono::milliseconds timeout() const override {
    return inner_->timeout();
  }

  using Store::Wait;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> Keys(const std::vector<std::string>& keys) const;

  std::string prefix_;
  Store* inner_;
};

}  // namespace dtrun::rendezvous
