// A checkpoint's save and load against a memcpy of the same bytes: the
// state of examples/configs/mlp100m_ddp.toml (96.4 M parameters and their
// SGD momentum, 0.77 GB of float32), in the raw format with XXH3 (the
// default) and in the format before it (torch's archive, SHA-256).
//
// Each round measures, in this order:
//   memcpy       one memcpy of all the bytes into memory already touched
//   save_disk    encode, frame, write, fsync to --dir (a sync checkpoint)
//   save_shm     encode, frame, write into a /dev/shm segment (memory mode)
//   load_shm     map the segment's file, verify, decode, copy into the
//                model's tensors (already touched: a model built, as a
//                restarted worker's is before it resumes)
//   load_shm_fresh  the same, into fresh tensors populated in one call
//                (a restarted worker's optimizer state)
//   load_disk    the same from --dir's file (in the page cache)
// One JSON object per round and format on stdout.
//
// Usage: payload_bench [--dir D] [--rounds N] [--formats raw,torch]
//                      [--scale F]
// PAYLOAD_BENCH_STAGES=1 also prints, on stderr, how long the memory
// copy's mapping, its header's check and the copies into the tensors
// (verifying its blocks) took; PAYLOAD_BENCH_VERIFY=first verifies every
// block before the copy instead (the load before it verified as it copied).
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lib/checkpoint.h"
#include "lib/formats/checkpoint_payload.h"
#include "lib/checkpointing/state_copy.h"
#include "rendezvous/util/memory_checkpoint.h"

namespace {

using dtrun::train::Checksum;
using dtrun::train::PayloadFormat;
using dtrun::train::TensorMap;
namespace mc = dtrun::memory_checkpoint;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// mlp100m: 2048 -> 6 x 4096 -> 1000, weights and biases, and a momentum
// buffer of each.
TensorMap State(double scale) {
  std::vector<int64_t> sizes = {2048, 4096, 4096, 4096, 4096, 4096, 4096, 1000};
  TensorMap m;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    const int64_t out = static_cast<int64_t>(sizes[i + 1] * scale),
                  in = static_cast<int64_t>(sizes[i] * scale);
    for (const char* kind : {"model", "optim"}) {
      const std::string pre =
          std::string("ddp.") + kind + "." + std::to_string(i) + ".";
      m[pre + "weight"] = torch::randn({out, in});
      m[pre + "bias"] = torch::randn({out});
    }
  }
  return m;
}

uint64_t Bytes(const TensorMap& m) {
  uint64_t n = 0;
  for (const auto& [k, t] : m) n += t.numel() * t.element_size();
  return n;
}

// Copies every decoded tensor into its destination (the restore); with
// `pending`, verifying its blocks as they are copied, as a restart's
// restore of a memory copy does.
void CopyInto(const TensorMap& from, TensorMap* into,
              const dtrun::train::PayloadView* pending = nullptr) {
  const double t0 = Now();
  std::vector<torch::Tensor> dst, src;
  for (auto& [k, t] : *into) {
    dst.push_back(t);
    src.push_back(from.at(k));
  }
  if (pending) {
    if (!dtrun::train::CopyTensors(dst, src, *pending).ok())
      throw std::runtime_error("the copy did not verify");
  } else {
    dtrun::train::CopyTensors(dst, src);
  }
  if (std::getenv("PAYLOAD_BENCH_STAGES"))
    std::fprintf(stderr, "copy %.4f\n", Now() - t0);
}

// Empty tensors like `like`, from one mapping populated in one call, as
// the restore makes a fresh optimizer's state.
TensorMap Fresh(const TensorMap& like, std::shared_ptr<void>* region) {
  size_t total = 0;
  for (const auto& [k, t] : like)
    total += (t.numel() * t.element_size() + 63) / 64 * 64;
  void* map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  region->reset(map, [total](void* p) { ::munmap(p, total); });
  TensorMap out;
  char* at = static_cast<char*>(map);
  for (const auto& [k, t] : like) {
    out[k] = torch::from_blob(at, t.sizes(), torch::kFloat);
    at += (t.numel() * t.element_size() + 63) / 64 * 64;
  }
  return out;
}

struct Round {
  double save_disk = 0, save_shm = 0, load_shm = 0, load_shm_fresh = 0,
         load_disk = 0;
};

// Loads `name` from the segments of `prefix` into `into`.
double LoadShm(const std::string& prefix, TensorMap* into, bool fresh) {
  const double t0 = Now();
  auto copies = mc::ScanMemoryCopies(prefix);
  const mc::MemoryFile* f = copies.at(0).Find("ckpt_000000000001.dtck");
  auto mapped = mc::MapMemoryFile(copies[0], *f);
  const double t1 = Now();
  // PAYLOAD_BENCH_VERIFY=first: every block verified before the copy
  // (two passes over the copy, as before the restore verified as it
  // copied).
  const char* first = std::getenv("PAYLOAD_BENCH_VERIFY");
  const auto when = first && std::string(first) == "first"
                        ? dtrun::train::VerifyWhen::kNow
                        : dtrun::train::VerifyWhen::kAsCopied;
  auto view = dtrun::train::VerifyCheckpointBytes(mapped->data, mapped->size,
                                                  mapped->hold, when);
  if (!view.ok()) throw std::runtime_error(view.status().message());
  const double t2 = Now();
  auto tensors = dtrun::train::DecodeTensors(*view);
  if (std::getenv("PAYLOAD_BENCH_STAGES"))
    std::fprintf(stderr, "map %.4f verify %.4f\n", t1 - t0, t2 - t1);
  std::shared_ptr<void> region;
  const dtrun::train::PayloadView* pending = view->pending ? &*view : nullptr;
  if (fresh) {
    TensorMap dest = Fresh(*into, &region);
    CopyInto(*tensors, &dest, pending);
  } else {
    CopyInto(*tensors, into, pending);
  }
  return Now() - t0;
}

Round Measure(const TensorMap& state, TensorMap* into, PayloadFormat format,
              const std::string& dir) {
  Round r;
  const Checksum sum =
      format == PayloadFormat::kRaw ? Checksum::kXxh3 : Checksum::kSha256;
  double t0 = Now();
  {
    auto p = dtrun::train::EncodeTensors(state, format);
    if (!dtrun::train::WriteCheckpointFile(dir + "/b.dtck", p, nullptr,
                                           CheckpointHeader(p, sum))
             .ok())
      throw std::runtime_error("write failed");
  }
  r.save_disk = Now() - t0;
  const std::string prefix = "dtrun-bench" + std::to_string(getpid());
  t0 = Now();
  {
    auto p = dtrun::train::EncodeTensors(state, format);
    const std::string h = CheckpointHeader(p, sum);
    mc::MemorySlots slots(prefix, 0);
    if (!slots.Write(1, 1, 0, dir, {{"ckpt_000000000001.dtck", h, p.pieces, 0}})
             .ok())
      throw std::runtime_error("segment write failed");
  }
  r.save_shm = Now() - t0;
  r.load_shm = LoadShm(prefix, into, false);
  r.load_shm_fresh = LoadShm(prefix, into, true);
  t0 = Now();
  {
    auto view = dtrun::train::ReadCheckpointFile(dir + "/b.dtck");
    auto tensors = dtrun::train::DecodeTensors(*view);
    CopyInto(*tensors, into);
  }
  r.load_disk = Now() - t0;
  mc::RemoveMemoryCopies(prefix);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp", formats = "raw,torch";
  int rounds = 5;
  double scale = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (a == "--formats") formats = argv[i + 1];
    if (a == "--scale") scale = std::stod(argv[i + 1]);
  }
  torch::manual_seed(1);
  const TensorMap state = State(scale);
  TensorMap into;
  for (const auto& [k, t] : state) into[k] = torch::zeros_like(t);
  const uint64_t bytes = Bytes(state);
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (int round = 0; round < rounds; ++round) {
    const double t0 = Now();
    std::memcpy(b.data(), a.data(), bytes);
    const double memcpy_s = Now() - t0;
    for (const char* f : {"raw", "torch"}) {
      if (formats.find(f) == std::string::npos) continue;
      const PayloadFormat format =
          std::string(f) == "raw" ? PayloadFormat::kRaw : PayloadFormat::kTorch;
      Round r = Measure(state, &into, format, dir);
      if (!torch::equal(into.begin()->second, state.begin()->second))
        throw std::runtime_error("loaded state differs");
      std::printf(
          "{\"round\": %d, \"format\": \"%s\", \"bytes\": %llu, "
          "\"memcpy\": %.4f, \"save_disk\": %.4f, \"save_shm\": %.4f, "
          "\"load_shm\": %.4f, \"load_shm_fresh\": %.4f, \"load_disk\": "
          "%.4f}\n",
          round, f, static_cast<unsigned long long>(bytes), memcpy_s,
          r.save_disk, r.save_shm, r.load_shm, r.load_shm_fresh, r.load_disk);
      std::fflush(stdout);
    }
  }
  ::unlink((dir + "/b.dtck").c_str());
  return 0;
}
