// Prefixing is all this does: every key gets the prefix, every reply
// comes back unchanged.
#include "rendezvous/prefix_store.h"

namespace dtrun::rendezvous {

std::vector<std::string> PrefixStore::Keys(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(Key(k));
  return out;
}

Status PrefixStore::Set(const std::string& key, std::string_view value) {
  return inner_->Set(Key(key), value);
}
Result<std::string> PrefixStore::Get(const std::string& key) {
  return inner_->Get(Key(key));
}
Result<int64_t> PrefixStore::Add(const std::string& key, int64_t delta) {
  return inner_->Add(Key(key), delta);
}
Result<std::string> PrefixStore::CompareSet(const std::string& key,
                                            std::string_view expected,
                                            std::string_view desired) {
  return inner_->CompareSet(Key(key), expected, desired);
}
Result<bool> PrefixStore::Check(const std::vector<std::string>& keys) {
  return inner_->Check(Keys(keys));
}
Status PrefixStore::Wait(const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout) {
  return inner_->Wait(Keys(keys), timeout);
}
Result<bool> PrefixStore::DeleteKey(const std::string& key) {
  return inner_->DeleteKey(Key(key));
}

}  // namespace dtrun::rendezvous
