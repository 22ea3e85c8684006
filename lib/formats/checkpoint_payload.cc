// The payload codec's torch side: libtorch's serialize archive (torch's
// OutputArchive and InputArchive) for files of that format, the raw
// format's tensors made from (and into) byte ranges (payload_raw.cc reads
// and writes its index), and the step's file's keys. Decoding never
// trusts the bytes: anything that does not load is Invalid.
#include "lib/formats/checkpoint_payload.h"

#include <cstring>
#include <optional>
#include <sstream>

#include "lib/formats/raw_index.h"

namespace dtrun::train {
namespace {

constexpr char kStep[] = "step";
constexpr char kWorldSize[] = "world_size";
constexpr char kEpoch[] = "epoch";

std::string RngKey(int64_t rank) { return "rng_" + std::to_string(rank); }
std::string CudaRngKey(int64_t rank) {
  return "cuda_rng_" + std::to_string(rank);
}

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

// Tensors below this many bytes are decoded as copies: a small tensor kept
// (a scalar, a generator's state) must not hold a whole mapped file, or a
// shared-memory copy's lock, for as long as it lives.
constexpr uint64_t kViewFrom = 64 << 10;

// torch's dtypes and the format's codes, both ways: the codes are the
// format's own, so a checkpoint does not depend on torch's enum values.
std::optional<raw::Dtype> RawDtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat:
      return raw::Dtype::kFloat32;
    case torch::kDouble:
      return raw::Dtype::kFloat64;
    case torch::kHalf:
      return raw::Dtype::kFloat16;
    case torch::kBFloat16:
      return raw::Dtype::kBFloat16;
    case torch::kLong:
      return raw::Dtype::kInt64;
    case torch::kInt:
      return raw::Dtype::kInt32;
    case torch::kShort:
      return raw::Dtype::kInt16;
    case torch::kChar:
      return raw::Dtype::kInt8;
    case torch::kByte:
      return raw::Dtype::kUInt8;
    case torch::kBool:
      return raw::Dtype::kBool;
    default:
      return std::nullopt;
  }
}

torch::ScalarType TorchDtype(raw::Dtype d) {
  switch (d) {
    case raw::Dtype::kFloat32:
      return torch::kFloat;
    case raw::Dtype::kFloat64:
      return torch::kDouble;
    case raw::Dtype::kFloat16:
      return torch::kHalf;
    case raw::Dtype::kBFloat16:
      return torch::kBFloat16;
    case raw::Dtype::kInt64:
      return torch::kLong;
    case raw::Dtype::kInt32:
      return torch::kInt;
    case raw::Dtype::kInt16:
      return torch::kShort;
    case raw::Dtype::kInt8:
      return torch::kChar;
    case raw::Dtype::kUInt8:
      return torch::kByte;
    case raw::Dtype::kBool:
      return torch::kBool;
  }
  return torch::kByte;  // ParseIndex admits no other code
}

// The index, then each tensor's own bytes (and zeros up to the next
// multiple of 64): nothing copied that is already contiguous on the CPU.
// nullopt when a dtype has no code.
std::optional<Payload> EncodeRaw(const TensorMap& tensors) {
  static const char kZeros[raw::kAlign] = {};
  auto held = std::make_shared<std::vector<torch::Tensor>>();
  std::vector<raw::Entry> entries;
  for (const auto& [key, t] : tensors) {
    std::optional<raw::Dtype> code = RawDtype(t.scalar_type());
    if (!code) return std::nullopt;
    torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    raw::Entry e;
    e.name = key;
    e.dtype = *code;
    e.sizes = c.sizes().vec();
    e.bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    entries.push_back(std::move(e));
    held->push_back(std::move(c));
  }
  uint64_t total = 0;
  auto head =
      std::make_shared<const std::string>(raw::EncodeIndex(&entries, &total));
  Payload p;
  p.pieces.push_back(*head);
  uint64_t at = head->size();
  for (size_t i = 0; i < entries.size(); ++i) {
    p.pieces.push_back(
        {static_cast<const char*>((*held)[i].data_ptr()), entries[i].bytes});
    at = entries[i].offset + entries[i].bytes;
    const uint64_t next =
        i + 1 < entries.size() ? entries[i + 1].offset : total;
    if (next > at) p.pieces.push_back({kZeros, next - at});
  }
  p.owner = std::make_shared<std::pair<decltype(head), decltype(held)>>(
      std::move(head), std::move(held));
  return p;
}

// Large tensors point into the payload and share its owner; small ones
// are copies. The index was checked whole (ParseIndex) before the first
// tensor is made: a bad entry never leaves half a map behind, and no
// tensor ever spans bytes past the payload.
Result<TensorMap> DecodeRaw(const PayloadView& payload) {
  auto entries = raw::ParseIndex(payload.bytes(), payload.size);
  if (!entries.ok()) return entries.status();
  TensorMap out;
  for (const raw::Entry& e : *entries) {
    char* at = const_cast<char*>(payload.data) + e.offset;
    auto options = torch::TensorOptions().dtype(TorchDtype(e.dtype));
    if (e.bytes < kViewFrom) {
      out[e.name] = torch::from_blob(at, e.sizes, options).clone();
    } else {
      std::shared_ptr<const void> owner = payload.owner;
      out[e.name] = torch::from_blob(
          at, e.sizes, [owner](void*) {}, options);
    }
  }
  return out;
}

// libtorch's serialize archive (a zip file), the format its own save and
// load use: tensors of any dtype and device, no format of ours to keep.
std::string EncodeArchive(const TensorMap& tensors) {
  torch::serialize::OutputArchive archive;
  for (const auto& [key, t] : tensors) archive.write(key, t);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// The SHA-256 of the file already held, so bytes that are not an archive
// here mean a file written by something else: an error, not an exception.
Result<TensorMap> DecodeArchive(std::string_view payload) {
  std::istringstream in{std::string(payload)};
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

}  // namespace

Payload EncodeTensors(const TensorMap& tensors, PayloadFormat format) {
  if (format == PayloadFormat::kRaw) {
    std::optional<Payload> raw = EncodeRaw(tensors);
    if (raw) return std::move(*raw);
  }
  return Payload(EncodeArchive(tensors));
}

// A payload still to verify: a torch archive is verified first (torch
// reads it whole, and is not made for damaged bytes); a raw index that
// does not decode is named as the damage it is when its blocks do not
// verify.
Result<TensorMap> DecodeTensors(const PayloadView& payload) {
  if (!raw::IsRaw(payload.bytes())) {
    Status whole = payload.pending ? CopyVerifying(payload, {}) : Status::Ok();
    if (!whole.ok()) return whole;
    return DecodeArchive(payload.bytes());
  }
  auto decoded = DecodeRaw(payload);
  if (!decoded.ok() && payload.pending) {
    Status whole = CopyVerifying(payload, {});
    if (!whole.ok()) return whole;
  }
  return decoded;
}

Result<TensorMap> DecodeTensors(std::string payload) {
  auto held = std::make_shared<const std::string>(std::move(payload));
  return DecodeTensors(PayloadView{held->data(), held->size(), held, nullptr});
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
  for (size_t r = 0; r < cuda_rng.size(); ++r) out[CudaRngKey(r)] = cuda_rng[r];
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
  for (int64_t r = 0; r < f.world_size; ++r) {
    auto it = tensors.find(CudaRngKey(r));
    if (it == tensors.end()) break;
    f.cuda_rng.push_back(it->second);
    tensors.erase(it);
  }
  f.parts = std::move(tensors);
  return f;
}

}  // namespace dtrun::train
