// The process group from torchrun's environment: dtrun's own store client
// (so a torchrun store or a dtrun store serves alike), gloo or NCCL on top,
// and c10d's exceptions turned into this library's errors at the boundary.
#include "lib/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
// pip's torch wheels ship no gloo headers although their torch has gloo:
// CMake defines DTRUN_HAVE_GLOO only when it found them.
#ifdef DTRUN_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef DTRUN_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "rendezvous/in_place.h"
#include "rendezvous/util/environment.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/store_client.h"

namespace dtrun::train {
namespace {

// An attempt's key space in the store, "/worker/attempt_<n>/", as
// torchrun 1.13's agent names it.
std::string AttemptPrefix(int restart_count) {
  return "/worker/attempt_" + std::to_string(restart_count) + "/";
}

std::vector<uint8_t> Bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string Text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// c10d::Store over dtrun's client, so gloo rendezvous goes through the same
// code (deadlines, clear errors) as the agents. Statuses become exceptions.
class DtrunC10dStore : public c10d::Store {
 public:
  DtrunC10dStore(std::unique_ptr<rendezvous::TcpStoreClient> client, int rank,
                 rendezvous::StoreClientOptions options)
      : c10d::Store(client->timeout()),
        client_(std::move(client)),
        rank_(rank),
        options_(std::move(options)) {}

#if DTRUN_TORCH_AT_LEAST(2, 7)
  // A store for another thread (torch >= 2.7 asks for one; NCCL's watchdog
  // and the abort path use it): a connection of its own to the same store,
  // as TCPStore's clone is.
  c10::intrusive_ptr<c10d::Store> clone() override {
    auto client = rendezvous::TcpStoreClient::Connect(options_);
    if (!client.ok()) {
      throw StoreError("rank " + std::to_string(rank_) + ": " +
                       client.status().message());
    }
    return c10::make_intrusive<DtrunC10dStore>(std::move(*client), rank_,
                                               options_);
  }
#endif

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
  rendezvous::StoreClientOptions options_;  // for clone()
};

}  // namespace

struct Distributed::Impl {
  DistEnv env;
  std::string backend;
  ProcessGroupOptions options;
  c10::intrusive_ptr<ProcessGroup> pg;
  // The store without the attempt's prefix (in-place recovery's word)
  c10::intrusive_ptr<c10d::Store> store;
  rendezvous::StoreClientOptions store_options;  // for ConnectStore
#ifdef DTRUN_HAVE_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // pg, when it is NCCL
#endif
  bool shut_down = false;
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

#ifdef DTRUN_HAVE_GLOO
constexpr bool kHaveGloo = true;
#else
constexpr bool kHaveGloo = false;
#endif

// Gloo asked for (or the only choice) in a build without its headers.
Error NoGloo(const std::string& who, const std::string& why) {
  return Error(who + why +
               ", but this build of lib has no gloo: its Torch's include "
               "folder has no gloo headers (pip's torch wheels ship none). "
               "Install gloo's headers for that torch (Debian: libgloo-dev) "
               "and rebuild, or use backend \"nccl\" on GPUs");
}

// Resolves "auto" and refuses what this build or machine cannot do.
std::string ChooseBackend(const std::string& wanted, const DistEnv& env) {
  const std::string who = "rank " + std::to_string(env.rank) + ": ";
  if (wanted == "gloo") {
    if (!kHaveGloo) throw NoGloo(who, "backend \"gloo\" asked for");
    return wanted;
  }
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
    if (!kHaveGloo) throw NoGloo(who, "no GPU is visible for \"auto\"");
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

namespace {

#ifdef DTRUN_HAVE_NCCL
// NCCL on GPU LOCAL_RANK (of those CUDA_VISIBLE_DEVICES leaves). torch
// older than 2.2 reads async error handling under its old name only; dtrun
// sets the new one, so it is copied unless the user set the old.
void StartNccl(Distributed::Impl* impl, c10::intrusive_ptr<c10d::Store> store,
               const ProcessGroupOptions& options) {
#if !DTRUN_TORCH_AT_LEAST(2, 2)
  const char* async_errors = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  if (async_errors && !std::getenv("NCCL_ASYNC_ERROR_HANDLING"))
    setenv("NCCL_ASYNC_ERROR_HANDLING", async_errors, 0);
#endif
  const DistEnv& env = impl->env;
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = options.timeout;
  impl->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      store, env.rank, env.world_size, opts);
  impl->pg = impl->nccl;
}
#endif

#ifdef DTRUN_HAVE_GLOO
// GLOO_SOCKET_IFNAME as in PyTorch: without it gloo binds to the address
// the host name resolves to, which on some hosts is not the network the
// other nodes can reach.
void StartGloo(Distributed::Impl* impl, c10::intrusive_ptr<c10d::Store> store,
               const ProcessGroupOptions& options) {
  auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  gloo->devices.push_back(
      ifname && *ifname
          ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
          : c10d::ProcessGroupGloo::createDefaultDevice());
  gloo->threads = 2;  // PyTorch's default: DDP's bucket all-reduces overlap
  impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
      store, impl->env.rank, impl->env.world_size, gloo);
}
#endif

// The group of attempt env.restart_count, in its own key space: torchrun
// 1.13 keeps one store across restarts; the attempt prefix keeps attempts
// apart there (dtrun gives each attempt a fresh store anyway), and keeps
// an in-place group's keys apart from the group it replaces.
void StartGroup(Distributed::Impl* impl) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      AttemptPrefix(impl->env.restart_count) + "dtrun_pg", impl->store);
#ifdef DTRUN_HAVE_NCCL
  if (impl->backend == "nccl") StartNccl(impl, store, impl->options);
#endif
#ifdef DTRUN_HAVE_GLOO
  if (impl->backend == "gloo") StartGloo(impl, store, impl->options);
#endif
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
  impl->backend = ChooseBackend(options.backend, *env);
  auto client = rendezvous::TcpStoreClient::Connect(copts);
  if (!client.ok()) {
    throw StoreError("rank " + std::to_string(env->rank) + ": " +
                     client.status().message());
  }
  impl->options = options;
  impl->store =
      c10::make_intrusive<DtrunC10dStore>(std::move(*client), env->rank, copts);
  StartGroup(impl.get());
  return std::unique_ptr<Distributed>(new Distributed(std::move(impl)));
}

Distributed::Distributed(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Distributed::~Distributed() { Shutdown(); }

// torch >= 2.4 warns at exit that "destroy_process_group() was not called"
// when a NCCL group is destroyed without shutting down: its communicators
// are released here, after pending work, as destroy_process_group does.
void Distributed::Shutdown() {
  if (impl_->shut_down) return;
  impl_->shut_down = true;
#if defined(DTRUN_HAVE_NCCL) && DTRUN_TORCH_AT_LEAST(2, 4)
  if (impl_->nccl) impl_->nccl->shutdown();
#endif
}
void Distributed::Abandon() { (void)impl_->pg.release(); }

void Distributed::Regroup(int restart_count, std::chrono::milliseconds wait,
                          const std::function<void(int replaced)>& meanwhile) {
  const std::string who = "rank " + std::to_string(impl_->env.rank) + ": ";
  if (impl_->backend != "gloo")
    throw Error(who + "in-place recovery needs gloo, this group runs " +
                impl_->backend);
  // Dropped first: its sockets close, so that every survivor's collective
  // in flight fails now rather than at its timeout.
  impl_->pg.reset();
  const std::string key = rendezvous::in_place::RegroupKey(restart_count);
  try {
    impl_->store->wait({key}, wait);
  } catch (const TimeoutError&) {
    throw TimeoutError(who + "no replacement came within " +
                       std::to_string(wait.count() / 1000) +
                       " s (dtrun did not re-form attempt " +
                       std::to_string(restart_count) + " in place)");
  }
  const std::vector<uint8_t> replaced = impl_->store->get(key);
  meanwhile(std::atoi(std::string(replaced.begin(), replaced.end()).c_str()));
  impl_->env.restart_count = restart_count;
  StartGroup(impl_.get());
}

bool Distributed::JoinsInPlace() {
  return impl_->env.restart_count > 0 && rendezvous::in_place::Wanted() &&
         impl_->store->check(
             {rendezvous::in_place::RegroupKey(impl_->env.restart_count)});
}

const DistEnv& Distributed::env() const { return impl_->env; }
ProcessGroup& Distributed::pg() { return *impl_->pg; }
const std::string& Distributed::backend() const { return impl_->backend; }

std::string Distributed::attempt_prefix() const {
  return AttemptPrefix(impl_->env.restart_count);
}

std::unique_ptr<rendezvous::TcpStoreClient> Distributed::ConnectStore(
    rendezvous::Dialect dialect) const {
  rendezvous::StoreClientOptions options = impl_->store_options;
  options.dialect = dialect;
  auto client = rendezvous::TcpStoreClient::Connect(options);
  if (!client.ok()) {
    throw StoreError("rank " + std::to_string(impl_->env.rank) + ": " +
                     client.status().message());
  }
  return std::move(*client);
}

}  // namespace dtrun::train
