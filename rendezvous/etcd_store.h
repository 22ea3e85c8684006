#pragma once

// The Store interface on etcd's v3 key space, so that the rendezvous
// protocol (rendezvous.h) runs unchanged on a replicated store that no
// dtrun node hosts. Every key lives under `prefix` ("/dtrun/" by default).
// How each operation maps (rendezvous/README.md, "Rendezvous on etcd"):
//   Set, MultiSet        put; puts in one transaction
//   Get, Check, MultiGet one range, or ranges in one transaction; more
//                        than 128 keys: one range over the folder they share
//   Add                  one put per increment: a counter is its key's
//                        version (the number of puts since it was created),
//                        so concurrent adds never retry; Add(k, 0) reads the
//                        version. The value holds the writer's count (exact
//                        for a key one node writes, such as its heartbeat).
//                        Counters only count up.
//   LeaseKey             a put under a lease of this node's (etcd_lease.h)
//   Enlist               one transaction: the counter's put (its version
//                        is the slot) and the record's, under the joiner's
//                        id; ReadEnlisted reads the records' folder in the
//                        order they were created, which is the slots' order
//   CompareSet           a transaction comparing the value (missing: the
//                        create revision is 0)
//   Wait                 one key: reads, then waits on a watch of it, kept
//                        open for the next Wait of it (no polling; a pushed
//                        put ends the wait without a read). Several: the
//                        missing ones read again every 100 ms
// A transaction holds at most 128 operations (etcd's default
// --max-txn-ops); longer lists are split.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_lease.h"
#include "rendezvous/store.h"

namespace dtrun::rendezvous {

class EtcdStore : public Store {
 public:
  // `timeout` is the default of Get and Wait(keys).
  EtcdStore(std::unique_ptr<EtcdClient> client, std::string prefix,
            std::chrono::milliseconds timeout);

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
  // Keys under the prefix.
  Result<int64_t> NumKeys() override;
  Result<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys) override;
  Status MultiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) override;
  // With `alive`, the lease's key goes in the same transaction (the
  // lease granted first when there is none yet).
  Result<Enlisted> Enlist(const Enlistment& e) override;
  Result<std::vector<std::string>> ReadEnlisted(
      const std::string& records, int64_t count,
      std::chrono::milliseconds wait) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  // One lease for the node's life (granted again when it lapsed, or when
  // another TTL is asked), revoked when the store goes.
  Status LeaseKey(const std::string& key,
                  std::chrono::milliseconds ttl) override;
  void StillAlive() override;
  bool has_leases() const override { return true; }
  using Store::Wait;

  // Removes every key that starts with `prefix` (under the store's own);
  // returns how many there were.
  Result<int64_t> DeletePrefix(const std::string& prefix);

  // A stream of pushed changes of keys of this store (Rendezvous's
  // open_watch); it uses this store's client, which must outlive it.
  std::unique_ptr<KeyWatch> OpenWatch();

  EtcdClient* client() { return client_.get(); }

 private:
  // A key's value as read, with the revision it was last changed at (0:
  // missing).
  struct Entry {
    std::string value;
    int64_t mod_revision = 0;
  };
  // Reads `keys` (each missing one as mod_revision 0) and the store's
  // revision at the read.
  Status Read(const std::vector<std::string>& keys, std::vector<Entry>* out,
              int64_t* revision);
  // Read for more than a transaction's keys: one range over the folder
  // they share.
  Status ReadUnder(const std::vector<std::string>& keys,
                   std::vector<Entry>* out, int64_t* revision);
  // The first of `keys` missing (keys.size(): none).
  Result<size_t> FirstMissing(const std::vector<std::string>& keys);
  void WatchFor(const std::string& key, std::chrono::milliseconds left);
  // Readies Wait's watch of `key`; whether Wait must read the key first.
  bool Arm(const std::string& key, std::chrono::milliseconds timeout);
  // Wait for more than one key (a round's closer, for every joiner).
  Status WaitAll(const std::vector<std::string>& keys,
                 std::chrono::milliseconds timeout);

  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  // The count this client last gave each counter it added to: the value
  // its next put writes is one more.
  std::map<std::string, int64_t> counters_;
  // Wait's watch of the key it waits for, kept for the next call.
  std::mutex wait_mu_;
  std::unique_ptr<EtcdWatch> wait_watch_;
  std::string wait_key_;
  // LeaseKey's lease and the key last put under it.
  std::mutex lease_mu_;
  // A live lease of `ttl`: the one there is, or a new grant. lease_mu_ held.
  Status EnsureLease(std::chrono::milliseconds ttl);
  std::unique_ptr<EtcdLease> lease_;
  std::string leased_key_;
};

}  // namespace dtrun::rendezvous
