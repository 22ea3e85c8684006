#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::train {

// A payload to write, as the pieces it lies in (the raw format's index and
// each tensor's storage: checkpoint_payload.h), so that nothing is copied
// only to be joined; `owner` keeps what the pieces point into alive. A
// string converts: the payload is then that string, owned.
struct Payload {
  std::vector<std::string_view> pieces;
  std::shared_ptr<const void> owner;

  Payload() = default;
  Payload(std::string bytes);  // NOLINT: one owned piece
  Payload(const char* bytes) : Payload(std::string(bytes)) {}  // NOLINT
  uint64_t size() const;
  std::string Join() const;  // the pieces as one string (small payloads)
};

// A verified payload in memory: a file or a shared-memory copy mapped, or
// bytes read; `owner` keeps them (and a copy's lock) until the last holder
// lets go. Tensors decoded from it point into it.
struct PendingBlocks;
struct PayloadView {
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  // Set when the payload's blocks are still to be verified (VerifyWhen::
  // kAsCopied): CopyVerifying does it. Until then nothing read from the
  // payload may be kept.
  std::shared_ptr<const PendingBlocks> pending;
  std::string_view bytes() const { return {data, size}; }
};
// A DTCKPT2 payload's block size and each block's XXH3, from its header.
struct PendingBlocks {
  uint64_t block = 0;
  std::vector<uint64_t> hashes;
};

// How a file's frame checks its payload: XXH3-64 of each 4 MiB block
// ("DTCKPT2", at memory speed, verified on several threads), or SHA-256
// of the whole ("DTCKPT1", checkpoint.checksum = "sha256"). Both load.
enum class Checksum { kXxh3, kSha256 };  // checkpoint.checksum
// What a payload holds its tensors in: the raw format
// (checkpoint_payload.h) or torch's archives (checkpoint.payload =
// "torch": what files written before the raw format hold).
enum class PayloadFormat { kRaw, kTorch };  // checkpoint.payload

// One checkpoint file: writes `payload` to `path` crash-safely (temporary
// file in the same folder, fsync, rename, folder fsync). on_chunk: see
// CheckpointDir::on_chunk.
// `header`: CheckpointHeader(payload) when the caller has it already ("":
// computed here, XXH3).
Status WriteCheckpointFile(
    const std::string& path, const Payload& payload,
    const std::function<void(size_t)>& on_chunk = nullptr,
    const std::string& header = "");
// Reads (large files: maps) and verifies one checkpoint file; the payload,
// or Status::Invalid saying why it does not load ("truncated: ...",
// "checksum mismatch ...").
Result<PayloadView> ReadCheckpointFile(const std::string& path);
// The framing a file of `payload` starts with.
std::string CheckpointHeader(const Payload& payload,
                             Checksum checksum = Checksum::kXxh3);
// When a payload's blocks are verified: before it is returned, or as it is
// copied out (CopyVerifying), so that loading reads it once: the header,
// its own hash and the length are checked at once either way (DTCKPT1's
// one SHA-256 always at once).
enum class VerifyWhen { kNow, kAsCopied };
// The payload within a whole framed file's bytes, verified as
// ReadCheckpointFile verifies a file's; the view shares `owner`.
Result<PayloadView> VerifyCheckpointBytes(const char* data, size_t size,
                                          std::shared_ptr<const void> owner,
                                          VerifyWhen when = VerifyWhen::kNow);
Result<PayloadView> VerifyCheckpointBytes(std::string bytes);

// One copy out of a payload: `n` bytes from `from` to `to`.
struct ByteCopy {
  char* to;
  const char* from;
  size_t n;
};
// Makes `copies` and verifies every block of `payload` still pending, in
// one pass over it on up to four threads: each block is hashed a piece at
// a time and the copies out of a piece made while it is in cache. Copies
// from outside the payload are made last. Invalid, naming the first bad
// block's bytes ("checksum mismatch in payload bytes A-B"), when one does
// not match: the copies out of the payload are then partly made, those
// from outside not at all, and the caller must not keep what they wrote.
Status CopyVerifying(const PayloadView& payload,
                     const std::vector<ByteCopy>& copies);

// Epochs. Each time training resumes in a folder (or starts in it), rank 0
// records a new epoch there: its number and the step it resumed from. Every
// step's file carries the epoch that wrote it. A file of epoch e at step s
// belongs to a history that a later epoch E > e abandoned when E resumed
// from a step before s: a node cut off from the job (a partition) kept
// going, or persisted its memory copies, after the others had moved on
// without it. Such a file looks newer than it is, and never loads.
struct EpochRecord {
  int64_t epoch = 0;
  int64_t resumed_from = 0;  // the step; 0 for a start from scratch
  int64_t world_size = 0;    // the ranks that trained in it; 0: not said
};
// "" when a file of `epoch` at `step` is of the history `epochs` lead to;
// else why not ("written in epoch 3, but epoch 4 resumed from step 100").
// Files without an epoch (written before epochs were kept) are epoch 0.
std::string AbandonedBy(const std::vector<EpochRecord>& epochs, int64_t epoch,
                        int64_t step);
// The records file's payload, one "<epoch> <resumed_from> <world_size>"
// line each, and back (Invalid naming the line that is not two or three
// numbers).
std::string FormatEpochs(const std::vector<EpochRecord>& epochs);
Result<std::vector<EpochRecord>> ParseEpochs(const std::string& text);

// A folder of checkpoints, each one file "ckpt_<step>.dtck":
// clang-format off
//   "DTCKPT2\n" | u64 payload length | u64 block size | u64 XXH3 of each block
//              | u64 XXH3 of the header's bytes before it | zeros to 64 | payload
//   "DTCKPT1\n" | sha256(payload) (32 bytes) | u64 payload length | payload
// clang-format on
// (little endian; DTCKPT1 is written when checkpoint.checksum = "sha256").
// Writes go to a temporary file in the same folder, are fsynced, renamed over
// the final name and the folder fsynced, so a crash mid-write never leaves a
// file that loads. Loading verifies the checksum and falls back to the
// previous checkpoint. A write of step s moves files of later steps aside
// ("<name>.abandoned"): the writer resumed before them, so they belong to a
// history given up (or did not load), and must neither count as the newest
// nor push a good checkpoint out of the kept ones. Not thread-safe; one
// writer (rank 0) per folder.
class CheckpointDir {
 public:
  // keep_last: how many checkpoints to keep (older ones are deleted); >= 1.
  CheckpointDir(std::string dir, int keep_last);

  // Writes `payload` as the checkpoint of `step` (`header`: as for
  // WriteCheckpointFile).
  Status Write(int64_t step, const Payload& payload,
               const std::string& header = "");

  struct Loaded {
    int64_t step;
    PayloadView payload;
    std::string path;
  };
  // The newest checkpoint whose checksum verifies and that `accept` (when
  // given) accepts; each one skipped is described in *skipped ("path: why").
  // nullopt when none loads.
  // Steps after `at_most` are passed over.
  std::optional<Loaded> LoadLatest(
      std::vector<std::string>* skipped = nullptr,
      const std::function<Status(const Loaded&)>& accept = nullptr,
      int64_t at_most = std::numeric_limits<int64_t>::max()) const;

  // Steps of the checkpoints present, newest first.
  std::vector<int64_t> Steps() const;

  // The folder's epochs ("epochs.dtck", framed as a checkpoint file),
  // oldest first; none when the file is missing or does not verify.
  std::vector<EpochRecord> Epochs() const;
  // Records the next epoch (1 + the newest), resumed from `step` on
  // `world_size` ranks; its number. The record is durable (written as a
  // checkpoint file is) before this returns. The newest kKeptEpochs records are
  // kept.
  Result<int64_t> BeginEpoch(int64_t resumed_from, int64_t world_size = 0);
  static constexpr size_t kKeptEpochs = 256;

  // Sharded checkpoints: each rank writes its shard of `step` to
  // ShardPath(step, rank) with WriteCheckpointFile; once all have, rank 0
  // Write()s the step's manifest. A step counts only when its manifest
  // exists, so shards of an unfinished checkpoint never load; Write()
  // deletes the shards of steps it no longer keeps.
  std::string ShardPath(int64_t step, int rank) const;
  // The file names alone: "ckpt_<step, 12 digits>.dtck" and
  // "ckpt_<step>.shard_<rank>.dtck".
  static std::string StepName(int64_t step);
  static std::string ShardName(int64_t step, int rank);
  const std::string& dir() const { return dir_; }

  // Test hook: called after each chunk written to the temporary file.
  std::function<void(size_t bytes_written)> on_chunk;

 private:
  std::string PathFor(int64_t step) const;
  std::string dir_;
  int keep_last_;
};

}  // namespace dtrun::train
