#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace dtrun::train {

// XXH3-64 (xxHash, Debian's libxxhash-dev: its header, inlined), the
// checkpoint frame's checksum: one pass at memory speed where SHA-256 ran
// at 2 GB/s. Where the CPU has AVX2 a copy compiled for it runs (12 GB/s
// on the development VM, against 6 GB/s for SSE2); every copy gives the
// same digest.
uint64_t Xxh3(const void* data, size_t size);

// The same digest over bytes fed in pieces. Not thread-safe; one per
// stream.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  void* state_;
  bool avx2_;
};

}  // namespace dtrun::train
