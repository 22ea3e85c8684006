// OpenSSL's EVP interface: it picks the fastest implementation the CPU
// allows at run time.
#include "lib/formats/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <stdexcept>

namespace dtrun::train {

struct Sha256::Context {
  EVP_MD_CTX* md = nullptr;
};

// Failures here mean libcrypto could not allocate a few bytes or does not
// have SHA-256 at all: nothing a caller can do about, so they throw.
Sha256::Sha256() : ctx_(std::make_unique<Context>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (!ctx_->md || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256: libcrypto's EVP_DigestInit_ex failed");
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_->md); }

void Sha256::Update(const void* data, size_t size) {
  if (size > 0 && EVP_DigestUpdate(ctx_->md, data, size) != 1)
    throw std::runtime_error("SHA-256: libcrypto's EVP_DigestUpdate failed");
}

std::array<uint8_t, 32> Sha256::Digest() {
  std::array<uint8_t, 32> out{};
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx_->md, out.data(), &n) != 1 || n != out.size())
    throw std::runtime_error("SHA-256: libcrypto's EVP_DigestFinal_ex failed");
  return out;
}

std::string Sha256::HexDigest() {
  std::string hex;
  char buf[3];
  for (uint8_t b : Digest()) {
    std::snprintf(buf, sizeof(buf), "%02x", b);
    hex += buf;
  }
  return hex;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.HexDigest();
}

}  // namespace dtrun::train
