// XXH3 compiled for AVX2 (lib/CMakeLists.txt gives this file -mavx2 on
// x86-64); xxh3.cc calls it only where the CPU has AVX2.
#include <cstddef>
#include <cstdint>

#define DTRUN_XXH3_NS avx2
#include "lib/formats/xxh3_impl.inc"
