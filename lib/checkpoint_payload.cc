// The payload codec: libtorch's serialize archive (torch::serialize's
// OutputArchive and InputArchive), so no format of ours is kept for tensors.
// Decoding never trusts the bytes: anything torch cannot load is Invalid.
#include "lib/checkpoint_payload.h"

#include <cstring>
#include <sstream>

namespace dtrun::train {
namespace {

constexpr char kStep[] = "step";
constexpr char kWorldSize[] = "world_size";
constexpr char kEpoch[] = "epoch";

std::string RngKey(int64_t rank) { return "rng_" + std::to_string(rank); }

// The scalar at `key`, moved out of `tensors`.
Status TakeScalar(TensorMap* tensors, const char* key, int64_t* out) {
  auto it = tensors->find(key);
  if (it == tensors->end())
    return Status::Invalid(std::string("no '") + key + "' in the step's file");
  if (it->second.numel() != 1) {
    return Status::Invalid(std::string("'") + key + "' holds " +
                           std::to_string(it->second.numel()) +
                           " values, not one");
  }
  *out = it->second.item<int64_t>();
  tensors->erase(it);
  return Status::Ok();
}

}  // namespace

// libtorch's serialize archive (a zip file), the format its own save and
// load use: tensors of any dtype and device, no format of ours to keep.
std::string EncodeTensors(const TensorMap& tensors) {
  torch::serialize::OutputArchive archive;
  for (const auto& [key, t] : tensors) archive.write(key, t);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// The SHA-256 of the file already held, so bytes that are not an archive
// here mean a file written by something else: an error, not an exception.
Result<TensorMap> DecodeTensors(const std::string& payload) {
  std::istringstream in(payload);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(in, torch::kCPU);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    return Status::Invalid("not a tensor archive: " +
                           what.substr(0, what.find('\n')));
  }
  TensorMap out;
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    if (archive.try_read(key, t)) out[key] = t;
  }
  return out;
}

// A copy: the tensor owns its bytes, whatever becomes of `bytes`.
torch::Tensor BytesTensor(const std::string& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::string TensorBytes(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()),
                     static_cast<size_t>(c.numel() * c.element_size()));
}

// The keys lib/README.md's "Checkpoint format" table lists.
TensorMap StepFile::ToTensors() const {
  TensorMap out = parts;
  out[kStep] = torch::tensor(step);
  out[kWorldSize] = torch::tensor(world_size);
  out[kEpoch] = torch::tensor(epoch);
  for (size_t r = 0; r < rng.size(); ++r) out[RngKey(r)] = rng[r];
  return out;
}

// What is not the trainer's (step, world size, generators) is the
// strategy's: it checks its own parts in Complete().
Result<StepFile> StepFile::FromTensors(TensorMap tensors) {
  StepFile f;
  Status s = TakeScalar(&tensors, kStep, &f.step);
  if (s.ok()) s = TakeScalar(&tensors, kWorldSize, &f.world_size);
  if (s.ok() && tensors.count(kEpoch))
    s = TakeScalar(&tensors, kEpoch, &f.epoch);
  if (!s.ok()) return s;
  for (int64_t r = 0; r < f.world_size; ++r) {
    auto it = tensors.find(RngKey(r));
    if (it == tensors.end()) break;  // saved without generators: reseed
    f.rng.push_back(it->second);
    tensors.erase(it);
  }
  f.parts = std::move(tensors);
  return f;
}

}  // namespace dtrun::train
