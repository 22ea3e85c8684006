#include "lib/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef DTRUN_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "rendezvous/util/environment.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/store_client.h"

namespace dtrun::train {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string Text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// c10d::Store over dtrun's client, so gloo rendezvous goes through the same
// code (deadlines, clear errors) as the agents. Statuses become exceptions.
class DtrunC10dStore : public c10d::Store {
 public:
  DtrunC10dStore(std::unique_ptr<rendezvous::TcpStoreClient> client, int rank)
      : c10d::Store(client->timeout()),
        client_(std::move(client)),
        rank_(rank) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Check(client_->Set(key, Text(value)));
  }
  std::vector<uint8_t> compareSet(
      const std::string& key, const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) override {
    return Bytes(
        Value(client_->CompareSet(key, Text(expected), Text(desired))));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return Bytes(Value(client_->Get(key)));
  }
  int64_t add(const std::string& key, int64_t value) override {
    return Value(client_->Add(key, value));
  }
  bool deleteKey(const std::string& key) override {
    return Value(client_->DeleteKey(key));
  }
  bool check(const std::vector<std::string>& keys) override {
    return Value(client_->Check(keys));
  }
  int64_t getNumKeys() override { return Value(client_->NumKeys()); }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& t) override {
    Check(client_->Wait(keys, t));
  }

 private:
  // Timeouts keep their own type: callers tell a slow peer from a broken
  // store by it.
  void Check(const Status& s) {
    if (s.ok()) return;
    std::string msg = "rank " + std::to_string(rank_) + ": " + s.message();
    if (s.code() == Status::Code::kTimeout) throw TimeoutError(msg);
    throw StoreError(msg);
  }
  template <typename T>
  T Value(Result<T> r) {
    Check(r.status());
    return std::move(*r);
  }

  std::unique_ptr<rendezvous::TcpStoreClient> client_;
  int rank_;
};

}  // namespace

struct Distributed::Impl {
  DistEnv env;
  std::string backend;
  c10::intrusive_ptr<ProcessGroup> pg;
  rendezvous::StoreClientOptions store_options;  // for ConnectStore
};

namespace {

// Without NCCL in the build no GPU is usable by the process group, whatever
// the machine has.
int VisibleGpus() {
#ifdef DTRUN_HAVE_NCCL
  return c10::cuda::device_count();
#else
  return 0;
#endif
}

// Resolves "auto" and refuses what this build or machine cannot do.
std::string ChooseBackend(const std::string& wanted, const DistEnv& env) {
  const std::string who = "rank " + std::to_string(env.rank) + ": ";
  if (wanted == "gloo") return wanted;
  if (wanted != "nccl" && wanted != "auto") {
    throw Error(who + "unknown backend '" + wanted +
                "': use \"gloo\", \"nccl\" or \"auto\"");
  }
  const int gpus = VisibleGpus();
#ifndef DTRUN_HAVE_NCCL
  if (wanted == "nccl") {
    throw Error(
        who +
        "backend \"nccl\" asked for, but this build has no NCCL (its Torch is "
        "CPU-only); rebuild against a CUDA-enabled libtorch or use \"gloo\"");
  }
#endif
  if (gpus == 0) {
    if (wanted == "nccl")
      throw Error(who + "backend \"nccl\" asked for, but no GPU is visible");
    return "gloo";
  }
  if (env.local_rank >= gpus) {
    throw Error(who + "LOCAL_RANK " + std::to_string(env.local_rank) +
                " but only " + std::to_string(gpus) +
                " GPU(s) visible; start at most " + std::to_string(gpus) +
                " workers per node (--nproc-per-node) or use backend \"gloo\"");
  }
  return "nccl";
}

}  // namespace

std::unique_ptr<Distributed> Distributed::FromEnv(
    const ProcessGroupOptions& options) {
  auto env = ReadDistEnv(ProcessEnvironment());
  if (!env.ok()) throw Error(env.status().message());
  auto impl = std::make_unique<Impl>();
  impl->env = *env;
  rendezvous::StoreClientOptions copts;
  copts.host = env->master_addr;
  copts.port = static_cast<uint16_t>(env->master_port);
  copts.timeout = options.timeout;
  copts.connect_timeout = options.connect_timeout;
  // 1.13's dialect: torchrun's store answers it as well as dtrun's.
  copts.dialect = rendezvous::Dialect::kTorch113;
  impl->store_options = copts;
  auto client = rendezvous::TcpStoreClient::Connect(copts);
  if (!client.ok()) {
    throw StoreError("rank " + std::to_string(env->rank) + ": " +
                     client.status().message());
  }
  auto base =
      c10::make_intrusive<DtrunC10dStore>(std::move(*client), env->rank);
  // torchrun 1.13 keeps one store across restarts; the attempt prefix keeps
  // attempts apart there (dtrun gives each attempt a fresh store anyway).
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "/worker/attempt_" + std::to_string(env->restart_count) + "/dtrun_pg",
      base);
  impl->backend = ChooseBackend(options.backend, *env);
#ifdef DTRUN_HAVE_NCCL
  if (impl->backend == "nccl") {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(env->local_rank));
    auto nccl = c10d::ProcessGroupNCCL::Options::create();
    nccl->timeout = options.timeout;
    impl->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        store, env->rank, env->world_size, nccl);
    return std::unique_ptr<Distributed>(new Distributed(std::move(impl)));
  }
#endif
  // GLOO_SOCKET_IFNAME as in PyTorch: without it gloo binds to the address
  // the host name resolves to, which on some hosts is not the network the
  // other nodes can reach.
  auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  gloo->devices.push_back(
      ifname && *ifname
          ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
          : c10d::ProcessGroupGloo::createDefaultDevice());
  gloo->threads = 2;  // PyTorch's default: DDP's bucket all-reduces overlap
  impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env->rank,
                                                         env->world_size, gloo);
  return std::unique_ptr<Distributed>(new Distributed(std::move(impl)));
}

Distributed::Distributed(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Distributed::~Distributed() = default;
const DistEnv& Distributed::env() const { return impl_->env; }
ProcessGroup& Distributed::pg() { return *impl_->pg; }
const std::string& Distributed::backend() const { return impl_->backend; }

std::string Distributed::attempt_prefix() const {
  return "/worker/attempt_" + std::to_string(impl_->env.restart_count) + "/";
}

std::unique_ptr<rendezvous::TcpStoreClient> Distributed::ConnectStore() const {
  auto client = rendezvous::TcpStoreClient::Connect(impl_->store_options);
  if (!client.ok()) {
    throw StoreError("rank " + std::to_string(impl_->env.rank) + ": " +
                     client.status().message());
  }
  return std::move(*client);
}

}  // namespace dtrun::train
