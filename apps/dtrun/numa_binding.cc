// --numa-binding: hwloc reads the topology once at start (LoadTopology);
// PlanBinding turns it into CPU lists (pure); posix_worker_group.cc applies
// each list with sched_setaffinity in the child before exec.
#include "apps/dtrun/numa_binding.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>

#include "rendezvous/util/log.h"

namespace dtrun::agent {
namespace {

using TopologyPtr = std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)>;

// The OS numbers of the processing units (hardware threads) in `set`,
// sorted: what sched_setaffinity takes.
std::vector<int> CpusOf(hwloc_topology_t topo, hwloc_const_cpuset_t set) {
  std::vector<int> out;
  hwloc_obj_t pu = nullptr;
  while ((pu = hwloc_get_next_obj_inside_cpuset_by_type(topo, set, HWLOC_OBJ_PU,
                                                        pu))) {
    out.push_back(static_cast<int>(pu->os_index));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The CPUs of each object of `type` (core, L3 cache, package) inside `set`:
// the units that "exclusive" and "core-complex" hand out whole.
std::vector<std::vector<int>> GroupsInside(hwloc_topology_t topo,
                                           hwloc_const_cpuset_t set,
                                           hwloc_obj_type_t type) {
  std::vector<std::vector<int>> out;
  hwloc_obj_t obj = nullptr;
  while (
      (obj = hwloc_get_next_obj_inside_cpuset_by_type(topo, set, type, obj))) {
    out.push_back(CpusOf(topo, obj->cpuset));
  }
  return out;
}

// One NUMA node as the planner sees it: its CPUs, its package (for
// "socket") and the groups "exclusive" and "core-complex" split it into.
NumaNodeInfo DescribeNode(hwloc_topology_t topo, hwloc_obj_t node) {
  NumaNodeInfo info;
  info.os_index = static_cast<int>(node->os_index);
  info.cpus = CpusOf(topo, node->cpuset);
  hwloc_obj_t package =
      hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, node);
  info.socket_cpus = package ? CpusOf(topo, package->cpuset) : info.cpus;
  info.cores = GroupsInside(topo, node->cpuset, HWLOC_OBJ_CORE);
  if (info.cores.empty()) {
    for (int cpu : info.cpus) info.cores.push_back({cpu});
  }
  info.complexes = GroupsInside(topo, node->cpuset, HWLOC_OBJ_L3CACHE);
  if (info.complexes.empty()) info.complexes.push_back(info.cpus);
  return info;
}

// The NUMA node (index into `numa`) whose CPUs hold `set`'s first CPU.
int NodeOf(hwloc_topology_t topo, hwloc_const_cpuset_t set,
           const std::vector<NumaNodeInfo>& numa) {
  std::vector<int> cpus = CpusOf(topo, set);
  for (size_t i = 0; i < numa.size() && !cpus.empty(); ++i) {
    const auto& c = numa[i].cpus;
    if (std::find(c.begin(), c.end(), cpus.front()) != c.end())
      return static_cast<int>(i);
  }
  return 0;
}

// Ranks' NUMA nodes: the GPU's, or contiguous blocks over the nodes.
std::vector<int> NodesOfRanks(const Topology& t, int nproc,
                              const std::vector<int>& devices) {
  std::vector<int> out;
  int nodes = static_cast<int>(t.numa.size());
  for (int lr = 0; lr < nproc; ++lr) {
    size_t d = lr < static_cast<int>(devices.size())
                   ? static_cast<size_t>(devices[lr])
                   : t.gpu_numa.size();
    out.push_back(d < t.gpu_numa.size() ? t.gpu_numa[d] : lr * nodes / nproc);
  }
  return out;
}

}  // namespace

Result<Topology> LoadTopology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    return Status::Invalid("--numa-binding: hwloc cannot start");
  TopologyPtr topo(raw, hwloc_topology_destroy);
  // PCI devices, to find each GPU's NUMA node.
  hwloc_topology_set_io_types_filter(topo.get(),
                                     HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo.get()) != 0) {
    return Status::Invalid(
        "--numa-binding: hwloc cannot read the topology (check "
        "HWLOC_XMLFILE / HWLOC_SYNTHETIC if set)");
  }
  Topology t;
  hwloc_obj_t node = nullptr;
  while ((node = hwloc_get_next_obj_by_type(topo.get(), HWLOC_OBJ_NUMANODE,
                                            node))) {
    if (!hwloc_bitmap_iszero(node->cpuset))
      t.numa.push_back(DescribeNode(topo.get(), node));
  }
  if (t.numa.empty()) {
    // A machine without NUMA information is one node holding every CPU.
    hwloc_obj_t root = hwloc_get_root_obj(topo.get());
    t.numa.push_back(DescribeNode(topo.get(), root));
  }
  // NVIDIA GPUs by PCI bus id (nvidia-smi's numbering), each with the node
  // of the first non-I/O object above it.
  std::vector<std::pair<uint64_t, int>> gpus;
  hwloc_obj_t pci = nullptr;
  while ((pci = hwloc_get_next_pcidev(topo.get(), pci))) {
    const auto& dev = pci->attr->pcidev;
    if (dev.vendor_id != 0x10de || (dev.class_id >> 8) != 0x03) continue;
    uint64_t bus_id = (uint64_t{dev.domain} << 24) | (uint64_t{dev.bus} << 16) |
                      (uint64_t{dev.dev} << 8) | dev.func;
    hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(topo.get(), pci);
    gpus.emplace_back(bus_id,
                      near ? NodeOf(topo.get(), near->cpuset, t.numa) : 0);
  }
  std::sort(gpus.begin(), gpus.end());
  for (const auto& gpu : gpus) t.gpu_numa.push_back(gpu.second);
  return t;
}

Result<std::vector<std::vector<int>>> PlanBinding(
    const std::string& mode, const Topology& t, int nproc,
    const std::vector<int>& devices) {
  if (t.numa.empty()) return Status::Invalid("--numa-binding: no NUMA node");
  std::vector<int> node_of = NodesOfRanks(t, nproc, devices);
  std::map<int, std::vector<int>> ranks_on;  // node -> its local ranks
  for (int lr = 0; lr < nproc; ++lr) ranks_on[node_of[lr]].push_back(lr);
  std::vector<std::vector<int>> plan(static_cast<size_t>(nproc));
  for (const auto& [n, ranks] : ranks_on) {
    const NumaNodeInfo& node = t.numa[static_cast<size_t>(n)];
    int share = static_cast<int>(ranks.size());
    for (int j = 0; j < share; ++j) {
      std::vector<int>& cpus = plan[static_cast<size_t>(ranks[j])];
      if (mode == "node") {
        cpus = node.cpus;
      } else if (mode == "socket") {
        cpus = node.socket_cpus;
      } else if (mode == "core-complex") {
        cpus = node.complexes[static_cast<size_t>(j) % node.complexes.size()];
      } else if (mode == "exclusive") {
        int cores = static_cast<int>(node.cores.size());
        if (share > cores) {
          return Status::Invalid(
              "--numa-binding=exclusive: " + std::to_string(share) +
              " workers on NUMA node " + std::to_string(node.os_index) +
              " but it has " + std::to_string(cores) +
              " cores; use node or socket, or fewer workers");
        }
        // Contiguous, near-equal shares of whole cores.
        for (int c = j * cores / share; c < (j + 1) * cores / share; ++c) {
          const auto& core = node.cores[static_cast<size_t>(c)];
          cpus.insert(cpus.end(), core.begin(), core.end());
        }
      } else {
        return Status::Invalid("--numa-binding: unknown mode '" + mode + "'");
      }
    }
  }
  return plan;
}

std::vector<int> GpuOfLocalRanks(const std::string& visible, int gpu_count,
                                 int nproc) {
  if (gpu_count < nproc) return {};
  std::vector<int> out;
  size_t start = 0;
  while (!visible.empty() && start <= visible.size() &&
         static_cast<int>(out.size()) < nproc) {
    size_t comma = std::min(visible.find(',', start), visible.size());
    std::string item = visible.substr(start, comma - start);
    char* end = nullptr;
    long index = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end) return {};  // GPU-UUIDs: order unknown here
    out.push_back(static_cast<int>(index));
    start = comma + 1;
  }
  for (int lr = static_cast<int>(out.size()); lr < nproc; ++lr)
    out.push_back(lr);
  return out;
}

std::string CpuListText(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

Result<std::vector<std::vector<int>>> PlanCpus(
    const std::string& mode, const std::string& cuda_visible_devices,
    int nproc) {
  auto topology = LoadTopology();
  if (!topology.ok()) return topology.status();
  std::vector<int> devices = GpuOfLocalRanks(
      cuda_visible_devices, static_cast<int>(topology->gpu_numa.size()), nproc);
  auto plan = PlanBinding(mode, *topology, nproc, devices);
  if (!plan.ok()) return plan.status();
  cpu_set_t mine;
  CPU_ZERO(&mine);
  sched_getaffinity(0, sizeof(mine), &mine);
  for (size_t lr = 0; lr < plan->size(); ++lr) {
    for (int cpu : (*plan)[lr]) {
      if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mine)) continue;
      return Status::Invalid(
          "--numa-binding=" + mode + ": CPU " + std::to_string(cpu) +
          " (planned for local_rank " + std::to_string(lr) +
          ") is not one dtrun may run on here; does HWLOC_XMLFILE or "
          "HWLOC_SYNTHETIC describe another machine?");
    }
  }
  auto log = Logger("dtrun.agent");
  for (size_t lr = 0; lr < plan->size(); ++lr) {
    log->info("--numa-binding={}: local_rank {} on CPUs {}{}", mode, lr,
              CpuListText((*plan)[lr]),
              devices.empty()
                  ? ""
                  : " (near GPU " + std::to_string(devices[lr]) + ")");
  }
  return plan;
}

}  // namespace dtrun::agent
