// What every Store gets for free, built on its Get/Set/Add: the
// defaults a backend may override with a faster one.
#include "rendezvous/store.h"

#include <algorithm>

namespace dtrun::rendezvous {

Result<std::vector<std::string>> Store::MultiGet(
    const std::vector<std::string>& keys) {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    // Get waits for a missing key; MultiGet reads it as empty instead.
    auto exists = Check({key});
    if (!exists.ok()) return exists.status();
    if (!*exists) {
      values.emplace_back();
      continue;
    }
    auto value = Get(key);
    if (!value.ok()) return value.status();
    values.push_back(std::move(*value));
  }
  return values;
}

Status Store::MultiSet(const std::vector<std::string>& keys,
                       const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return Status::Invalid("multi_set of " + std::to_string(keys.size()) +
                           " keys with " + std::to_string(values.size()) +
                           " values; pass one value per key");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    Status s = Set(keys[i], values[i]);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Result<Store::Enlisted> Store::Enlist(const Enlistment& e) {
  auto slot = Add(e.counter, 1);
  if (!slot.ok()) return slot.status();
  Status s = Set(e.records + std::to_string(*slot), e.record);
  if (!s.ok()) return s;
  return Enlisted{*slot, false};
}

Result<std::vector<std::string>> Store::ReadEnlisted(
    const std::string& records, int64_t count, std::chrono::milliseconds wait) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (int64_t slot = 1; slot <= count; ++slot)
    keys.push_back(records + std::to_string(slot));
  if (wait.count() > 0 && !keys.empty()) {
    Status s = Wait(keys, wait);
    if (!s.ok()) return s;
  }
  return MultiGet(keys);
}

}  // namespace dtrun::rendezvous
