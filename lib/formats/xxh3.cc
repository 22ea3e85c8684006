// The portable build of XXH3 and the choice between it and the AVX2 one
// (xxh3_avx2.cc, on x86-64 only), made once per process.
#include "lib/formats/xxh3.h"

#define DTRUN_XXH3_NS portable
#include "lib/formats/xxh3_impl.inc"

namespace dtrun::train {

#if defined(__x86_64__) && defined(DTRUN_XXH3_AVX2)
namespace avx2 {
uint64_t Hash(const void* data, size_t size);
void* NewState();
void FreeState(void* s);
void Update(void* s, const void* data, size_t size);
uint64_t Digest(const void* s);
}  // namespace avx2

namespace {
// Asked once: the answer cannot change while the process runs, and a
// stream must finish on the build it began with.
bool UseAvx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
}  // namespace

uint64_t Xxh3(const void* data, size_t size) {
  return UseAvx2() ? avx2::Hash(data, size) : portable::Hash(data, size);
}
Xxh3Stream::Xxh3Stream()
    : state_(UseAvx2() ? avx2::NewState() : portable::NewState()),
      avx2_(UseAvx2()) {}
Xxh3Stream::~Xxh3Stream() {
  avx2_ ? avx2::FreeState(state_) : portable::FreeState(state_);
}
void Xxh3Stream::Update(const void* data, size_t size) {
  avx2_ ? avx2::Update(state_, data, size)
        : portable::Update(state_, data, size);
}
uint64_t Xxh3Stream::Digest() const {
  return avx2_ ? avx2::Digest(state_) : portable::Digest(state_);
}
#else
uint64_t Xxh3(const void* data, size_t size) {
  return portable::Hash(data, size);
}
Xxh3Stream::Xxh3Stream() : state_(portable::NewState()), avx2_(false) {}
Xxh3Stream::~Xxh3Stream() { portable::FreeState(state_); }
void Xxh3Stream::Update(const void* data, size_t size) {
  portable::Update(state_, data, size);
}
uint64_t Xxh3Stream::Digest() const { return portable::Digest(state_); }
#endif

}  // namespace dtrun::train
