#pragma once

// The raw checkpoint payload's index (checkpoint_payload.h has the layout):
// written and read without libtorch, so that a hostile or damaged index is
// refused before any tensor is made from it, and can be fuzzed alone.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::train::raw {

constexpr char kMagic[8] = {'D', 'T', 'R', 'A', 'W', '1', '\n', '\0'};
// Each tensor's bytes start at a multiple of this in the payload.
constexpr uint64_t kAlign = 64;
// The most dimensions a tensor may have (torch's own limit is 64 too).
constexpr int kMaxDims = 64;

// The element types the format knows, by a code of its own (torch's enum
// may change; these never do).
enum class Dtype : uint8_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt64 = 5,
  kInt32 = 6,
  kInt16 = 7,
  kInt8 = 8,
  kUInt8 = 9,
  kBool = 10,
};
// Bytes per element of a code; 0 for a code the format does not know.
uint64_t ElementSize(uint8_t code);

struct Entry {
  std::string name;
  Dtype dtype = Dtype::kUInt8;
  std::vector<int64_t> sizes;
  uint64_t offset = 0;  // from the payload's first byte
  uint64_t bytes = 0;
};

// The bytes before the first tensor: magic, index length, index, zeros to
// kAlign. Fills each entry's offset (its bytes follow one another in
// order, each at a multiple of kAlign) and returns the payload's whole
// size in *total.
std::string EncodeIndex(std::vector<Entry>* entries, uint64_t* total);
// Whether a payload starts as a raw one does.
bool IsRaw(std::string_view payload);
// The entries of a raw payload of `size` bytes whose first bytes are
// `head`: Invalid, naming the entry, for anything that does not fit (an
// index past its end, a name or dimension count out of bounds, an unknown
// dtype, a negative size, bytes that are not sizes x element size, a range
// past the payload or before the data).
Result<std::vector<Entry>> ParseIndex(std::string_view head, uint64_t size);

}  // namespace dtrun::train::raw
