#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "rendezvous/store.h"
#include "tests/testing/fake_clock.h"

namespace dtrun::testing {

// A view of another store whose waits run on a FakeClock: a Wait for keys
// that are missing advances the clock by its timeout and times out at once,
// as if nothing had changed meanwhile. Only a node that is alone may wait
// this way (nobody else could set the keys during the simulated time); tests
// of several nodes turn it on once the others are done (set_simulating).
class SimulatedStore : public rendezvous::Store {
 public:
  SimulatedStore(rendezvous::Store* inner, FakeClock* clock,
                 bool simulating = true)
      : inner_(inner), clock_(clock), simulating_(simulating) {}
  void set_simulating(bool on) { simulating_ = on; }
  int simulated_waits() const { return simulated_waits_; }

  Status Set(const std::string& k, std::string_view v) override {
    return inner_->Set(k, v);
  }
  Result<std::string> Get(const std::string& k) override {
    return inner_->Get(k);
  }
  Result<int64_t> Add(const std::string& k, int64_t d) override {
    return inner_->Add(k, d);
  }
  Result<std::string> CompareSet(const std::string& k, std::string_view e,
                                 std::string_view d) override {
    return inner_->CompareSet(k, e, d);
  }
  Result<bool> Check(const std::vector<std::string>& k) override {
    return inner_->Check(k);
  }
  Status Wait(const std::vector<std::string>& keys,
              std::chrono::milliseconds timeout) override {
    if (!simulating_) return inner_->Wait(keys, timeout);
    auto present = inner_->Check(keys);
    if (!present.ok() || *present) return present.status();
    clock_->Advance(timeout);
    ++simulated_waits_;
    return Status::Timeout("simulated wait of " +
                           std::to_string(timeout.count()) + " ms");
  }
  Result<bool> DeleteKey(const std::string& k) override {
    return inner_->DeleteKey(k);
  }
  Result<int64_t> NumKeys() override { return inner_->NumKeys(); }
  Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& k) override {
    return inner_->MultiGet(k);
  }
  Status MultiSet(const std::vector<std::string>& k,
                  const std::vector<std::string>& v) override {
    return inner_->MultiSet(k, v);
  }
  std::chrono::milliseconds timeout() const override {
    return inner_->timeout();
  }

 private:
  rendezvous::Store* inner_;
  FakeClock* clock_;
  std::atomic<bool> simulating_;
  std::atomic<int> simulated_waits_{0};
};

}  // namespace dtrun::testing
