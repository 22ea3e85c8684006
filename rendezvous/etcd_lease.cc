// etcd leases through the JSON gateway: /v3/lease/grant, /v3/lease/keepalive
// (a streaming call; one request in the body gets one answer, under
// "result") and /v3/lease/revoke. A lease that expired answers a renewal
// without a TTL.
#include "rendezvous/etcd_lease.h"

#include <algorithm>
#include <string>

namespace dtrun::rendezvous {
namespace {

using std::chrono::milliseconds;

// Bound on the revocation at the end: a member that does not answer must
// not hold dtrun's exit (the lease then expires by itself).
constexpr milliseconds kRevokeTimeout{1000};

}  // namespace

Result<std::unique_ptr<EtcdLease>> EtcdLease::Grant(const EtcdOptions& options,
                                                    milliseconds ttl) {
  auto client = EtcdClient::Connect(options);
  if (!client.ok()) return client.status();
  const int64_t seconds = std::max<int64_t>(1, (ttl.count() + 999) / 1000);
  auto reply = (*client)->Call("/v3/lease/grant", {{"TTL", seconds}});
  if (!reply.ok()) return reply.status();
  const int64_t id = etcd_framing::IntField(*reply, "ID");
  const int64_t granted = etcd_framing::IntField(*reply, "TTL");
  if (id == 0 || granted <= 0) {
    return Status::Io("etcd: malformed reply to a lease grant: " +
                      reply->dump().substr(0, 200));
  }
  const milliseconds period(granted * 1000 / 3);
  // A renewal that outlasts its period is one that failed: the next goes
  // to another member.
  (*client)->set_timeout(period);
  return std::unique_ptr<EtcdLease>(
      new EtcdLease(std::move(*client), id, milliseconds(granted * 1000), ttl));
}

EtcdLease::EtcdLease(std::unique_ptr<EtcdClient> client, int64_t id,
                     milliseconds ttl, milliseconds asked)
    : client_(std::move(client)),
      id_(id),
      ttl_(ttl),
      asked_(asked),
      touched_(SteadyClock::now()),
      renewed_(touched_),
      thread_([this] { Run(); }) {}

EtcdLease::~EtcdLease() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (lost_) return;
  client_->set_timeout(kRevokeTimeout);
  (void)client_->Call("/v3/lease/revoke", {{"ID", std::to_string(id_)}});
}

void EtcdLease::Touch() {
  std::lock_guard<std::mutex> lock(mu_);
  touched_ = SteadyClock::now();
}

bool EtcdLease::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !lost_ && SteadyClock::now() - renewed_ < ttl_;
}

void EtcdLease::Run() {
  const milliseconds period = ttl_ / 3;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !lost_) {
    cv_.wait_for(lock, period, [this] { return stop_; });
    if (stop_) break;
    // A holder silent for a TTL is let go: the lease lapses as if the
    // process had stopped.
    if (SteadyClock::now() - touched_ > ttl_) continue;
    const auto sent = SteadyClock::now();
    lock.unlock();
    const Held held = Renew();
    lock.lock();
    if (held == Held::kYes) renewed_ = sent;
    lost_ = held == Held::kGone;
  }
}

// A failed request (no member answered in the period) is not a lost
// lease: the next period tries again, and etcd alone decides expiry.
EtcdLease::Held EtcdLease::Renew() {
  auto reply =
      client_->Call("/v3/lease/keepalive", {{"ID", std::to_string(id_)}});
  if (!reply.ok()) return Held::kUnknown;
  auto result = reply->find("result");
  if (result == reply->end() || !result->is_object()) return Held::kUnknown;
  return etcd_framing::IntField(*result, "TTL") > 0 ? Held::kYes : Held::kGone;
}

}  // namespace dtrun::rendezvous
