#pragma once

// [checkpoint] mode = "memory": checkpoint copies in shared memory that
// outlive the worker that made them.
//
// Each local rank keeps two segments on its node's tmpfs,
// /dev/shm/<prefix>-<local rank>-<a|b>, and writes each checkpoint into
// the one that does not hold its newest complete copy, so a crash in the
// middle of a write leaves the other. A segment holds the files the rank
// would write to the checkpoint folder, byte for byte as they would lie on
// disk (lib/checkpoint.h's framing, with its checksum), and says which step,
// world size, rank and folder they belong to.
//
// dtrun names the prefix ("dtrun-<its pid>-ckpt", in DTRUN_CHECKPOINT_SHM),
// persists the newest copies to their folder when a worker of its node
// dies, and removes its segments when the job ends; a later dtrun removes
// those of one that was killed first. The training library writes the
// copies and reads them back on a restart. Writers hold flock(2)'s
// exclusive lock on a segment, readers a shared one; the kernel drops a
// dead process's lock, and a writer that died leaves its segment marked
// "being written", which no reader takes. No libtorch: the launcher links
// this.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::memory_checkpoint {

// The variable that carries the prefix to the workers.
constexpr char kPrefixEnv[] = "DTRUN_CHECKPOINT_SHM";
// The folder the segments live in (POSIX shared memory on Linux).
constexpr char kShmDir[] = "/dev/shm";
// The most files one segment holds (a step's file and a shard).
constexpr int kMaxFiles = 4;

// The prefix of dtrun process `pid`'s segments.
std::string PrefixOf(int pid);
// The prefix of the segment a worker of `pid` creates for its group's
// collectives on one host (lib's DDP and FSDP: "<prefix>-<random>"). It
// removes the name once every rank has the segment mapped; dtrun removes
// one left by a worker that died before (RemoveMemoryCopies).
std::string CollectiveSegmentPrefix(int pid);

// One file of a copy, as it lies in its segment.
struct MemoryFile {
  std::string name;  // its name in the folder: "ckpt_000000000050.dtck"
  uint64_t offset = 0, length = 0;  // its bytes in the segment
  // A step's file: how many shard files it names (0: none). dtrun persists
  // it only once they are all on disk, so that a step's file on disk always
  // means a whole checkpoint.
  int64_t shards = 0;
};

// One complete segment.
struct MemoryCopy {
  std::string path;                            // /dev/shm/...
  int64_t step = 0, world_size = 0, rank = 0;  // rank: the saver's global rank
  std::string dir;                             // the checkpoint folder
  std::vector<MemoryFile> files;
  // The file named `name`, or null.
  const MemoryFile* Find(const std::string& name) const;
};

// A file to write into a segment: its framing header and its payload's
// pieces (lib/checkpoint.h's Payload), kept apart so that nothing is copied
// only to be joined.
struct FileToWrite {
  std::string name;
  std::string_view header;
  std::vector<std::string_view> payload;
  int64_t shards = 0;
  uint64_t size() const;
};

// One local rank's two segments. Not thread-safe: one writer.
class MemorySlots {
 public:
  MemorySlots(std::string prefix, int local_rank);
  // Writes `files` as the copy of `step` (folder `dir`, absolute) into the
  // slot not holding this rank's newest complete copy, waiting for readers
  // of that slot (dtrun persisting it) to finish. `halfway` (a test's
  // fault) runs once half the bytes are in. Status::Io names the segment.
  Status Write(int64_t step, int64_t world_size, int64_t rank,
               const std::string& dir, const std::vector<FileToWrite>& files,
               const std::function<void()>& halfway = nullptr);

 private:
  std::string prefix_;
  int local_rank_;
};

// Every segment of `prefix`: the complete copies, newest step first. Each
// segment that is not one (being written, its writer died in the middle,
// or it does not parse) is described in *unusable ("path: why").
std::vector<MemoryCopy> ScanMemoryCopies(
    const std::string& prefix, std::vector<std::string>* unusable = nullptr);

// `file` of `copy` mapped in place (no copy), the segment's shared lock
// held until the last holder of `hold` lets go: no writer can change the bytes
// meanwhile, and the rank's next copy waits for it, so a reader must let go
// once it has loaded them. Private: writes to the mapping stay in this process.
// Status::Invalid when the segment no longer holds that copy (rewritten or
// removed since the scan).
struct MappedFile {
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> hold;
};
Result<MappedFile> MapMemoryFile(const MemoryCopy& copy,
                                 const MemoryFile& file);

// Marks `copy`'s segment "set aside" (a reader found its bytes damaged):
// no scan lists it again, and the rank's next copy is written into it.
// Waits for the segment's other readers; nothing when it no longer holds
// that copy.
void SetAside(const MemoryCopy& copy);

// What PersistMemoryCopies did, in lines for dtrun's log.
struct PersistReport {
  std::vector<std::string> written;  // paths made durable
  std::vector<std::string> notes;    // what was not, and why
  // Whether a file this node held could not be written (a full disk, a
  // read-only or failing folder): its copy must be kept. A shard that
  // another node held is a note only.
  bool failed = false;
};
// For each folder named by a copy of `prefix`: writes the newest step's
// files that are not yet there (shards first, then the step's file once
// all its shards are), each to a temporary name, fsynced, renamed, the
// folder fsynced. Existing files are left alone. `only_newer`: a folder
// whose newest step file on disk is the copies' step or later is left as
// it is (the copies are superseded; a note says so).
PersistReport PersistMemoryCopies(const std::string& prefix,
                                  bool only_newer = false);

// Marks the copies of dtrun `pid` as kept on purpose (their persisting
// failed), for PersistOrphanedCopies: a /dev/shm file of its own.
void MarkKept(int pid);

// Removes every segment of `prefix`; returns how many.
int RemoveMemoryCopies(const std::string& prefix);
// The copies of dtrun processes that are gone. Those kept on purpose
// (MarkKept) are persisted where they are newer than their folder's
// newest step, and removed once nothing of them failed to persist (one
// still failing stays for the next dtrun); those of a dtrun killed before
// it removed them are removed, unpersisted: its job went on without them,
// and a node killed whole loses its memory anyway. Returns what was done,
// one line each.
std::vector<std::string> PersistOrphanedCopies();
// Removes the segments of dtrun processes that are gone (killed before
// they could remove them); returns their paths.
std::vector<std::string> RemoveOrphanedCopies();

}  // namespace dtrun::memory_checkpoint
