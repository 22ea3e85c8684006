#pragma once

// --numa-binding: which CPUs each worker may run on. The topology comes from
// hwloc (Debian's libhwloc), so HWLOC_XMLFILE and HWLOC_SYNTHETIC describe
// another machine; the plan is a pure function of it. Modes as torchrun's
// (torch/numa/binding.py): node, socket, exclusive, core-complex.

#include <string>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::agent {

// One NUMA node, by the OS's CPU numbers (hwloc PU os_index).
struct NumaNodeInfo {
  int os_index = 0;
  std::vector<int> cpus;                    // every CPU of the node
  std::vector<int> socket_cpus;             // every CPU of its package
  std::vector<std::vector<int>> cores;      // the CPUs of each core
  std::vector<std::vector<int>> complexes;  // the CPUs of each L3 domain
};

struct Topology {
  std::vector<NumaNodeInfo> numa;
  // NUMA index (into `numa`) of each NVIDIA GPU, in PCI bus order (as
  // nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID number them).
  std::vector<int> gpu_numa;
};

// This machine's topology (or the one HWLOC_XMLFILE / HWLOC_SYNTHETIC
// describes). Status::Invalid says why hwloc could not give one.
Result<Topology> LoadTopology();

// The CPUs of each of `nproc` local workers. A worker's NUMA node is its
// GPU's when the job has GPUs (`devices`: the physical GPU index of each
// local rank; empty for a CPU job), else the workers are spread over the
// NUMA nodes in contiguous blocks. Then:
//   node          every CPU of that node
//   socket        every CPU of the node's package
//   exclusive     a disjoint share of the node's cores for each worker on it
//   core-complex  one L3 domain of the node, round-robin among its workers
// Status::Invalid names the mode or the node that cannot be served. Pure.
Result<std::vector<std::vector<int>>> PlanBinding(
    const std::string& mode, const Topology& topology, int nproc,
    const std::vector<int>& devices);

// The physical GPU index of each local rank: CUDA_VISIBLE_DEVICES' entries
// when they are numbers, else 0..nproc-1; empty when there are fewer GPUs
// than workers (a CPU job). Pure.
std::vector<int> GpuOfLocalRanks(const std::string& cuda_visible_devices,
                                 int gpu_count, int nproc);

// "0-3,8,10-11" for the log.
std::string CpuListText(const std::vector<int>& cpus);

// --numa-binding=`mode` on this machine: each local rank's CPUs from hwloc's
// topology, every one of them a CPU dtrun may run on (a topology from
// HWLOC_XMLFILE / HWLOC_SYNTHETIC may name CPUs this machine, or dtrun's
// cpuset under SLURM or a container, lacks: Invalid, naming it). Logs the
// plan.
Result<std::vector<std::vector<int>>> PlanCpus(
    const std::string& mode, const std::string& cuda_visible_devices,
    int nproc);

}  // namespace dtrun::agent
