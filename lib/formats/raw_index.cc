// The raw payload's index, byte by byte; every field read is checked
// against what is left of the index and every range against the payload.
#include "lib/formats/raw_index.h"

#include <cstring>
#include <limits>

namespace dtrun::train::raw {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads fields off the front of the index; false once one would run past
// its end.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetString(size_t n, std::string* s) {
    if (in_.size() < n) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  size_t left() const { return in_.size(); }

 private:
  std::string_view in_;
};

// Tensors start on a cache line: a mapped payload's tensors are then as
// aligned as an allocator's, which vectorized kernels assume for speed.
uint64_t RoundUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The product of `sizes` times `element`, or false on a negative size or
// an overflow.
bool CountBytes(const std::vector<int64_t>& sizes, uint64_t element,
                uint64_t* out) {
  uint64_t n = element;
  for (int64_t d : sizes) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / uint64_t(d))
      return false;
    n *= static_cast<uint64_t>(d);
  }
  *out = n;
  return true;
}

// One entry off the front of the index, or why not.
std::string ReadEntry(Reader* r, Entry* e) {
  uint16_t name_len = 0;
  uint8_t dtype = 0, dims = 0;
  if (!r->Get(&name_len) || !r->GetString(name_len, &e->name))
    return "its name runs past the index";
  if (!r->Get(&dtype) || !r->Get(&dims)) return "it runs past the index";
  if (ElementSize(dtype) == 0)
    return "unknown dtype code " + std::to_string(dtype);
  if (dims > kMaxDims) return std::to_string(dims) + " dimensions";
  e->dtype = static_cast<Dtype>(dtype);
  e->sizes.resize(dims);
  for (int64_t& d : e->sizes)
    if (!r->Get(&d)) return "its sizes run past the index";
  if (!r->Get(&e->offset) || !r->Get(&e->bytes))
    return "its range runs past the index";
  uint64_t want = 0;
  if (!CountBytes(e->sizes, ElementSize(dtype), &want))
    return "a negative or too large size";
  if (want != e->bytes)
    return std::to_string(e->bytes) + " bytes for sizes that need " +
           std::to_string(want);
  return "";
}

}  // namespace

uint64_t ElementSize(uint8_t code) {
  switch (static_cast<Dtype>(code)) {
    case Dtype::kFloat64:
    case Dtype::kInt64:
      return 8;
    case Dtype::kFloat32:
    case Dtype::kInt32:
      return 4;
    case Dtype::kFloat16:
    case Dtype::kBFloat16:
    case Dtype::kInt16:
      return 2;
    case Dtype::kInt8:
    case Dtype::kUInt8:
    case Dtype::kBool:
      return 1;
  }
  return 0;
}

// The index's length is known before it is written (every field has a
// fixed size but the names), so the offsets can be filled in one pass.
std::string EncodeIndex(std::vector<Entry>* entries, uint64_t* total) {
  std::string index;
  Put(&index, static_cast<uint32_t>(entries->size()));
  uint64_t index_len = sizeof(uint32_t);
  for (const Entry& e : *entries)
    index_len += 2 + e.name.size() + 2 + 8 * e.sizes.size() + 16;
  uint64_t at = RoundUp(sizeof(kMagic) + 8 + index_len);
  for (Entry& e : *entries) {
    e.offset = at;
    at = RoundUp(at + e.bytes);
    Put(&index, static_cast<uint16_t>(e.name.size()));
    index += e.name;
    Put(&index, static_cast<uint8_t>(e.dtype));
    Put(&index, static_cast<uint8_t>(e.sizes.size()));
    for (int64_t d : e.sizes) Put(&index, d);
    Put(&index, e.offset);
    Put(&index, e.bytes);
  }
  *total = entries->empty() ? RoundUp(sizeof(kMagic) + 8 + index_len)
                            : entries->back().offset + entries->back().bytes;
  std::string head(kMagic, sizeof(kMagic));
  Put(&head, index_len);
  head += index;
  head.resize(RoundUp(head.size()), '\0');
  return head;
}

bool IsRaw(std::string_view payload) {
  return payload.size() >= sizeof(kMagic) &&
         std::memcmp(payload.data(), kMagic, sizeof(kMagic)) == 0;
}

// The count is not trusted to size anything: entries are read until the
// index runs out, so a count of four billion costs one failed read.
Result<std::vector<Entry>> ParseIndex(std::string_view head, uint64_t size) {
  uint64_t index_len = 0;
  if (!IsRaw(head) || head.size() < sizeof(kMagic) + 8)
    return Status::Invalid("not a raw tensor payload");
  std::memcpy(&index_len, head.data() + sizeof(kMagic), 8);
  if (index_len > head.size() - sizeof(kMagic) - 8)
    return Status::Invalid("its index (" + std::to_string(index_len) +
                           " bytes) runs past the payload");
  const uint64_t data_start = sizeof(kMagic) + 8 + index_len;
  Reader r(head.substr(sizeof(kMagic) + 8, index_len));
  uint32_t count = 0;
  if (!r.Get(&count)) return Status::Invalid("its index has no count");
  std::vector<Entry> out;
  for (uint32_t i = 0; i < count; ++i) {
    Entry e;
    std::string why = ReadEntry(&r, &e);
    if (why.empty() &&
        (e.offset < data_start || e.offset > size || e.bytes > size - e.offset))
      why = "its bytes lie outside the payload";
    if (!why.empty()) {
      return Status::Invalid("tensor " + std::to_string(i) +
                             (e.name.empty() ? "" : " '" + e.name + "'") +
                             " of the index: " + why);
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace dtrun::train::raw
