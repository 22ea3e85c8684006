#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "lib/dist_env.h"
#include "rendezvous/store_client.h"
#include "lib/torch_compat.h"

namespace dtrun::train {

// Errors at the libtorch boundary (lib/ lives in libtorch's world, where
// c10d throws): one small hierarchy.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class StoreError : public Error {
 public:
  using Error::Error;
};
class TimeoutError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct ProcessGroupOptions {
  // Timeout of store operations and collectives. Default 30 min (c10d's).
  std::chrono::milliseconds timeout{30 * 60 * 1000};
  // How long to keep retrying the store connection. Default 300 s.
  std::chrono::milliseconds connect_timeout{300 * 1000};
  // "gloo", "nccl", or "auto": nccl when this build has it (CMake found a
  // CUDA-enabled Torch) and a GPU is visible, else gloo.
  std::string backend = "auto";
};

// A process group built from the launcher's environment: a store client at
// MASTER_ADDR:MASTER_PORT (dtrun's client, 1.13 dialect, so torchrun's store
// works too) in the attempt's key space "/worker/attempt_<n>", and gloo on
// CPU, NCCL on the GPU numbered LOCAL_RANK (which becomes the current CUDA
// device). Thread rules: those of c10d's process groups. Gloo needs its
// headers at build time: a lib built against a Torch without them (pip's
// wheels) refuses "gloo", and "auto" without a GPU, naming why.
class Distributed {
 public:
  // Throws Error naming the rank, the store address and the time waited.
  static std::unique_ptr<Distributed> FromEnv(
      const ProcessGroupOptions& options = {});
  ~Distributed();

  const DistEnv& env() const;
  int rank() const { return env().rank; }
  int world_size() const { return env().world_size; }
  ProcessGroup& pg();
  // "gloo" or "nccl". With nccl, tensors handed to pg() live on GPU
  // local_rank (device "cuda:<local_rank>").
  const std::string& backend() const;
  bool uses_cuda() const { return backend() == "nccl"; }
  // A store connection of its own, for a thread other than the one that
  // runs collectives (async checkpoints); keys are the caller's to prefix
  // with attempt_prefix(). Throws StoreError naming the rank.
  // `dialect`: 2.x's for a store that speaks it (dtrun's), whose timed-out
  // wait is canceled rather than the connection replaced.
  std::unique_ptr<rendezvous::TcpStoreClient> ConnectStore(
      rendezvous::Dialect dialect = rendezvous::Dialect::kTorch113) const;
  // "/worker/attempt_<n>/": this attempt's key space in the store.
  std::string attempt_prefix() const;
  // In-place recovery (rendezvous/in_place.h): drops this group, whose
  // collectives in flight then fail, waits up to `wait` for dtrun's word
  // that attempt `restart_count` re-forms in place, runs `meanwhile` with
  // the rank being replaced (the replacement is starting), and builds the
  // group again in that attempt's key space, where the replacement builds
  // its own (collective). Throws TimeoutError when the word does not come
  // (nobody is being replaced), Error on NCCL (not supported) or when the
  // group cannot be built.
  void Regroup(int restart_count, std::chrono::milliseconds wait,
               const std::function<void(int replaced)>& meanwhile);
  // Whether this process replaces a failed rank of a group that re-forms
  // in place (dtrun's word for this attempt is in the store).
  bool JoinsInPlace();
  // Releases the group's communicators (NCCL's), as torch's
  // destroy_process_group does; collectives fail after it. The destructor
  // calls it; calling it earlier, at the end of a run, is the same.
  void Shutdown();
  // Lets go of the group without destroying it: a collective stuck on a
  // peer that will never answer (a SIGSTOPped or cut-off node) would hold
  // its destructor forever. Its threads and buffers stay until the process
  // ends. Before this object goes, when a new round leaves the group.
  void Abandon();

  struct Impl;

 private:
  explicit Distributed(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrun::train
