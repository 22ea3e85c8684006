// The workers' store's two ends on a node (worker_store.h): hosting it, and
// the proxy that carries a node's workers to it.
#include "apps/dtrun/worker_store.h"

#include "apps/dtrun/launch_config.h"
#include "rendezvous/util/log.h"

namespace dtrun::agent {

bool UsesStoreProxy(StoreProxyMode mode, int world_size) {
  return mode == StoreProxyMode::kOn ||
         (mode == StoreProxyMode::kAuto && world_size > kProxyAutoWorkers);
}

Result<std::unique_ptr<rendezvous::StoreServer>> HostWorkerStore(
    int64_t arriving, bool* said) {
  auto server =
      rendezvous::StoreServer::Start(rendezvous::StoreServerOptions{});
  if (!server.ok()) return server.status();
  (*server)->RunInBackground();
  std::string advice =
      rendezvous::AcceptQueueAdvice(arriving, rendezvous::SystemSomaxconn());
  if (!advice.empty() && !*said) {
    Logger("dtrun.agent")->warn("the workers' store: {}", advice);
    *said = true;
  }
  return server;
}

std::unique_ptr<rendezvous::StoreProxy> StartWorkerProxy(
    const std::string& host, uint16_t port) {
  rendezvous::StoreProxyOptions po;
  po.upstream_host = host;
  po.upstream_port = port;
  po.connect_timeout = std::chrono::seconds(10);
  auto proxy = rendezvous::StoreProxy::Start(po);
  if (!proxy.ok()) {
    Logger("dtrun.agent")
        ->warn(
            "{}; this node's workers connect to the store itself "
            "(--store-proxy=off says the same without trying)",
            proxy.status().message());
    return nullptr;
  }
  (*proxy)->RunInBackground();
  return std::move(*proxy);
}

}  // namespace dtrun::agent
