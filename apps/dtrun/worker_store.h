#pragma once

// A round's workers' store as one node sees it: hosted here (group rank
// 0), or reached by this node's workers directly or through this node's
// proxy (--store-proxy; rendezvous/store_proxy.h).

#include <cstdint>
#include <memory>
#include <string>

#include "apps/dtrun/launch_config.h"
#include "rendezvous/store_proxy.h"
#include "rendezvous/store_server.h"

namespace dtrun::agent {

// Whether --store-proxy (`mode`) puts the other nodes' workers behind
// proxies in a job of `world_size` workers. Pure.
bool UsesStoreProxy(StoreProxyMode mode, int world_size);

// Starts a round's workers' store on a free port and runs it. `arriving`:
// the connections that reach it at once (workers, or nodes' proxies); when
// they outgrow the kernel's listen queue it is said, once a job (*said).
Result<std::unique_ptr<rendezvous::StoreServer>> HostWorkerStore(
    int64_t arriving, bool* said);

// A running proxy to the workers' store at host:port, or null when none
// starts (said, with the reason: this node's workers then connect to the
// store itself).
std::unique_ptr<rendezvous::StoreProxy> StartWorkerProxy(
    const std::string& host, uint16_t port);

}  // namespace dtrun::agent
