// A checkpoint file's frame (checkpoint.h): the header that lets a reader
// tell a whole file from a torn or damaged one, built from a payload's
// pieces and checked over a mapping of the file. DTCKPT2 hashes 4 MiB
// blocks with XXH3, so that a 0.77 GB payload verifies on two threads in
// less time than one copy of it; DTCKPT1 (SHA-256) still reads, and is
// written where it is asked for.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "lib/checkpoint.h"
#include "lib/formats/sha256.h"
#include "lib/formats/xxh3.h"

namespace dtrun::train {
namespace {

constexpr char kMagic1[] = "DTCKPT1\n";
constexpr char kMagic2[] = "DTCKPT2\n";
constexpr size_t kMagicLen = 8;
constexpr size_t kHeader1Len = kMagicLen + 32 + 8;
constexpr uint64_t kBlock = 4 << 20;
// The largest block a header may name: a bigger one is damage, not a
// choice of ours.
constexpr uint64_t kMaxBlock = uint64_t{1} << 30;
// Files smaller than this are read; larger ones mapped.
constexpr size_t kMapFrom = 1 << 20;

// How many blocks `len` bytes make; the last one may be short, and an
// empty payload has none (its header still carries its own hash).
uint64_t Blocks(uint64_t len, uint64_t block) {
  return len == 0 ? 0 : (len + block - 1) / block;
}

// magic, length, block size, the block hashes, the header's own hash,
// zeros to a multiple of 64 (the payload then starts aligned in a page).
size_t Header2Len(uint64_t blocks) {
  return (kMagicLen + 8 + 8 + 8 * blocks + 8 + 63) / 64 * 64;
}

// Host byte order, which is little endian on every machine dtrun builds
// for; a frame never needs to be read on another kind.
void PutU64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Runs fn(i) for i in [0, n) on up to four threads, each a contiguous range
// (so each streams through memory); on one when there is little to do.
void ForBlocks(uint64_t n, const std::function<void(uint64_t)>& fn) {
  const uint64_t threads = std::min<uint64_t>(
      {4, std::max(1u, std::thread::hardware_concurrency()), (n + 7) / 8});
  if (threads <= 1) {
    for (uint64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  for (uint64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&fn, n, t, threads] {
      for (uint64_t i = n * t / threads; i < n * (t + 1) / threads; ++i) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

// The XXH3 of each block of the pieces laid end to end. A block within one
// piece is hashed in one call; one that spans pieces is streamed.
std::vector<uint64_t> BlockHashes(const Payload& p) {
  std::vector<uint64_t> starts;  // each piece's offset in the payload
  uint64_t at = 0;
  for (const auto& piece : p.pieces) {
    starts.push_back(at);
    at += piece.size();
  }
  std::vector<uint64_t> out(Blocks(at, kBlock));
  ForBlocks(out.size(), [&](uint64_t b) {
    const uint64_t begin = b * kBlock, end = std::min(at, begin + kBlock);
    size_t i = static_cast<size_t>(
        std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() -
        1);
    if (end - starts[i] <= p.pieces[i].size()) {
      out[b] = Xxh3(p.pieces[i].data() + (begin - starts[i]), end - begin);
      return;
    }
    Xxh3Stream h;
    for (uint64_t pos = begin; pos < end; ++i) {
      const uint64_t from = pos - starts[i];
      const uint64_t take =
          std::min<uint64_t>(p.pieces[i].size() - from, end - pos);
      h.Update(p.pieces[i].data() + from, take);
      pos += take;
    }
    out[b] = h.Digest();
  });
  return out;
}

// The frame files had before DTCKPT2: one SHA-256 over the whole
// payload. Still written where checkpoint.checksum = "sha256" asks for a
// cryptographic hash (a folder someone else could write into).
std::string Header1(const Payload& payload) {
  Sha256 sha;
  for (const auto& piece : payload.pieces) sha.Update(piece);
  auto digest = sha.Digest();
  std::string header(kMagic1, kMagicLen);
  header.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  PutU64(&header, payload.size());
  return header;
}

std::string Truncated(uint64_t have, uint64_t want) {
  return "truncated: " + std::to_string(have) + " of " + std::to_string(want) +
         " payload bytes";
}

// One pass of SHA-256: 2 GB/s with SHA-NI, a fifth of memory speed.
Result<PayloadView> Verify1(const char* data, size_t size,
                            std::shared_ptr<const void> owner) {
  if (size < kHeader1Len)
    return Status::Invalid("not a dtrun checkpoint (bad header)");
  const uint64_t len = GetU64(data + kMagicLen + 32);
  if (len != size - kHeader1Len)
    return Status::Invalid(Truncated(size - kHeader1Len, len));
  Sha256 sha;
  sha.Update(data + kHeader1Len, len);
  auto digest = sha.Digest();
  if (std::memcmp(digest.data(), data + kMagicLen, 32) != 0)
    return Status::Invalid("checksum mismatch");
  return PayloadView{data + kHeader1Len, len, std::move(owner), nullptr};
}

// The first bad block's bytes, for a Status message.
Status BadBlock(uint64_t b, uint64_t block, uint64_t len) {
  const uint64_t begin = b * block;
  return Status::Invalid("checksum mismatch in payload bytes " +
                         std::to_string(begin) + "-" +
                         std::to_string(std::min(len, begin + block)));
}

// The header's own hash first (a damaged length or block size must not
// steer the rest), then the length, then every block (or, kAsCopied, the
// blocks' hashes kept for CopyVerifying).
Result<PayloadView> Verify2(const char* data, size_t size,
                            std::shared_ptr<const void> owner,
                            VerifyWhen when) {
  const size_t fixed = kMagicLen + 16;
  if (size < fixed)
    return Status::Invalid("not a dtrun checkpoint (bad header)");
  const uint64_t len = GetU64(data + kMagicLen),
                 block = GetU64(data + kMagicLen + 8);
  if (block == 0 || block > kMaxBlock || len > (uint64_t{1} << 50))
    return Status::Invalid("not a dtrun checkpoint (bad header)");
  const uint64_t blocks = Blocks(len, block);
  const size_t hashed = fixed + 8 * blocks, header = Header2Len(blocks);
  if (size < header) return Status::Invalid(Truncated(0, len));
  if (Xxh3(data, hashed) != GetU64(data + hashed))
    return Status::Invalid("checksum mismatch in the header");
  if (len != size - header)
    return Status::Invalid(Truncated(size - header, len));
  const char* payload = data + header;
  if (when == VerifyWhen::kAsCopied) {
    auto pending = std::make_shared<PendingBlocks>();
    pending->block = block;
    for (uint64_t b = 0; b < blocks; ++b)
      pending->hashes.push_back(GetU64(data + fixed + 8 * b));
    return PayloadView{payload, len, std::move(owner), std::move(pending)};
  }
  // The first bad block any thread finds is the one named; the others
  // finish their ranges (stopping early would save little on a file that
  // is refused anyway).
  std::atomic<uint64_t> bad{blocks};
  ForBlocks(blocks, [&](uint64_t b) {
    const uint64_t begin = b * block, n = std::min(len - begin, block);
    if (Xxh3(payload + begin, n) != GetU64(data + fixed + 8 * b)) {
      uint64_t none = blocks;
      bad.compare_exchange_strong(none, b);
    }
  });
  if (bad.load() != blocks) return BadBlock(bad.load(), block, len);
  return PayloadView{payload, len, std::move(owner), nullptr};
}

// The part of `c` whose source lies in [begin, end), copied.
void CopyPart(const ByteCopy& c, const char* begin, const char* end) {
  const char* from = std::max(c.from, begin);
  const char* to = std::min(c.from + c.n, end);
  if (from < to) std::memcpy(c.to + (from - c.from), from, to - from);
}

// Each block hashed in pieces this size, small enough that a piece is
// still in the core's cache when the copies out of it read it.
constexpr uint64_t kCachePiece = 256 << 10;

// What failed and the system's reason, for a Status message.
std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

}  // namespace

Payload::Payload(std::string bytes) {
  auto held = std::make_shared<const std::string>(std::move(bytes));
  pieces.push_back(*held);
  owner = std::move(held);
}

uint64_t Payload::size() const {
  uint64_t n = 0;
  for (const auto& piece : pieces) n += piece.size();
  return n;
}

std::string Payload::Join() const {
  std::string out;
  out.reserve(size());
  for (const auto& piece : pieces) out.append(piece);
  return out;
}

std::string CheckpointHeader(const Payload& payload, Checksum checksum) {
  if (checksum == Checksum::kSha256) return Header1(payload);
  const std::vector<uint64_t> hashes = BlockHashes(payload);
  std::string header(kMagic2, kMagicLen);
  PutU64(&header, payload.size());
  PutU64(&header, kBlock);
  for (uint64_t h : hashes) PutU64(&header, h);
  PutU64(&header, Xxh3(header.data(), header.size()));
  header.resize(Header2Len(hashes.size()), '\0');
  return header;
}

Result<PayloadView> VerifyCheckpointBytes(const char* data, size_t size,
                                          std::shared_ptr<const void> owner,
                                          VerifyWhen when) {
  if (size >= kMagicLen && std::memcmp(data, kMagic2, kMagicLen) == 0)
    return Verify2(data, size, std::move(owner), when);
  if (size >= kMagicLen && std::memcmp(data, kMagic1, kMagicLen) == 0)
    return Verify1(data, size, std::move(owner));
  return Status::Invalid("not a dtrun checkpoint (bad header)");
}

Result<PayloadView> VerifyCheckpointBytes(std::string bytes) {
  auto held = std::make_shared<const std::string>(std::move(bytes));
  return VerifyCheckpointBytes(held->data(), held->size(), held);
}

// Each copy is cut at the blocks its source spans, so that each block's
// thread makes its part.
Status CopyVerifying(const PayloadView& payload,
                     const std::vector<ByteCopy>& copies) {
  const char* base = payload.data;
  const uint64_t len = payload.size;
  const PendingBlocks* pending = payload.pending.get();
  const uint64_t block = pending ? pending->block : kBlock;
  const uint64_t blocks = Blocks(len, block);
  std::vector<std::vector<ByteCopy>> in(blocks);
  std::vector<ByteCopy> outside;
  const auto lo = reinterpret_cast<uintptr_t>(base);
  for (const ByteCopy& c : copies) {
    const auto from = reinterpret_cast<uintptr_t>(c.from);
    if (c.n == 0 || from < lo || from - lo > len || c.n > len - (from - lo)) {
      outside.push_back(c);
      continue;
    }
    for (uint64_t at = from - lo, end = at + c.n; at < end;) {
      const uint64_t stop = std::min(end, (at / block + 1) * block);
      in[at / block].push_back({c.to + (at - (from - lo)), base + at,
                                static_cast<size_t>(stop - at)});
      at = stop;
    }
  }
  std::atomic<uint64_t> bad{blocks};
  ForBlocks(blocks, [&](uint64_t b) {
    const char* begin = base + b * block;
    const uint64_t n = std::min(len - b * block, block);
    if (!pending) {
      for (const ByteCopy& c : in[b]) std::memcpy(c.to, c.from, c.n);
      return;
    }
    Xxh3Stream h;
    for (uint64_t at = 0; at < n; at += kCachePiece) {
      const uint64_t m = std::min(kCachePiece, n - at);
      h.Update(begin + at, m);
      for (const ByteCopy& c : in[b]) CopyPart(c, begin + at, begin + at + m);
    }
    if (h.Digest() != pending->hashes[b]) {
      uint64_t none = blocks;
      bad.compare_exchange_strong(none, b);
    }
  });
  if (bad.load() != blocks) return BadBlock(bad.load(), block, len);
  for (const ByteCopy& c : outside) std::memcpy(c.to, c.from, c.n);
  return Status::Ok();
}

// A large file is mapped (the page cache's pages, no copy) and the payload
// decoded in place: reading it into fresh memory first cost a page fault
// per 4 KiB and a copy. Not populated: the verifying threads fault the
// pages in, in parallel, which measured faster than MAP_POPULATE's one
// thread (and MAP_POPULATE on a writable private mapping copies every
// page). Private: a write to a tensor never reaches the file.
Result<PayloadView> ReadCheckpointFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Invalid(Errno("opening " + path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::Invalid(Errno("reading " + path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kMapFrom) {
    std::string bytes(size, '\0');
    size_t got = 0;
    while (got < size) {
      ssize_t r =
          ::pread(fd, bytes.data() + got, size - got, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    ::close(fd);
    bytes.resize(got);
    return VerifyCheckpointBytes(std::move(bytes));
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Status::Invalid(Errno("mapping " + path));
  std::shared_ptr<const void> owner(
      map, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return VerifyCheckpointBytes(static_cast<const char*>(map), size,
                               std::move(owner));
}

}  // namespace dtrun::train
