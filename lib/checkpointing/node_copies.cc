// The training side of memory checkpoints: the segments are the launcher's
// (rendezvous/util/memory_checkpoint.h); this adds the rules of a resume
// (the newest step every rank can read, its checksums verified).
#include "lib/checkpointing/node_copies.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "lib/checkpoint.h"

namespace dtrun::train {

namespace mc = memory_checkpoint;

namespace {

// Relative folders are the worker's, whose working folder dtrun gave it.
// Segments carry the absolute folder: dtrun, which persists them, runs
// elsewhere, and a restarted worker must match the copies of its own
// folder only.
std::string Absolute(const std::string& dir) {
  if (!dir.empty() && dir[0] == '/') return dir;
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof(cwd))) return dir;
  return std::string(cwd) + "/" + dir;
}

}  // namespace

std::unique_ptr<NodeCopies> NodeCopies::FromEnv(int local_rank,
                                                const std::string& dir) {
  const char* prefix = std::getenv(mc::kPrefixEnv);
  if (!prefix || !*prefix) return nullptr;
  return std::unique_ptr<NodeCopies>(
      new NodeCopies(prefix, local_rank, Absolute(dir)));
}

NodeCopies::NodeCopies(std::string prefix, int local_rank, std::string dir)
    : prefix_(std::move(prefix)),
      dir_(std::move(dir)),
      slots_(prefix_, local_rank) {}

Status NodeCopies::Write(int64_t step, int64_t world_size, int64_t rank,
                         const std::vector<mc::FileToWrite>& files,
                         const std::function<void()>& halfway) {
  return slots_.Write(step, world_size, rank, dir_, files, halfway);
}

void NodeCopies::Scan() {
  unusable_.clear();
  scanned_ = mc::ScanMemoryCopies(prefix_, &unusable_);
}

const mc::MemoryCopy* NodeCopies::Holder(int64_t step, const std::string& name,
                                         int64_t world_size) const {
  for (const mc::MemoryCopy& c : scanned_) {
    if (c.step == step && c.dir == dir_ &&
        (world_size < 0 || c.world_size == world_size) && c.Find(name)) {
      return &c;
    }
  }
  return nullptr;
}

// The scanned copies are newest first, so the first step whose files are
// all on the node is the answer; a step older than `at_least` (the
// folder's newest) is never worth reading from memory.
int64_t NodeCopies::Newest(
    const std::function<std::vector<std::string>(int64_t)>& names,
    int64_t at_least, int64_t world_size) const {
  for (const mc::MemoryCopy& c : scanned_) {  // newest first
    if (c.step < at_least) break;
    bool all = true;
    for (const std::string& name : names(c.step))
      all = all && Holder(c.step, name, world_size) != nullptr;
    if (all) return c.step;
  }
  return -1;
}

// The file is mapped in place under the segment's shared lock, which the
// view holds (so no writer can change the bytes while they are read).
Result<PayloadView> NodeCopies::Read(int64_t step, const std::string& name,
                                     VerifyWhen when) const {
  for (const mc::MemoryCopy& c : scanned_) {
    const mc::MemoryFile* f =
        c.step == step && c.dir == dir_ ? c.Find(name) : nullptr;
    if (!f) continue;
    auto mapped = mc::MapMemoryFile(c, *f);
    if (!mapped.ok()) return mapped.status();
    auto payload =
        VerifyCheckpointBytes(mapped->data, mapped->size, mapped->hold, when);
    if (!payload.ok())
      return Status::Invalid(c.path + ": " + name + ": " +
                             payload.status().message());
    return payload;
  }
  return Status::Invalid("no copy of " + name + " in " + where());
}

void NodeCopies::SetAside(int64_t step, const std::string& name) {
  for (const mc::MemoryCopy& c : scanned_) {
    if (c.step == step && c.dir == dir_ && c.Find(name)) {
      mc::SetAside(c);
      return;
    }
  }
}

std::string NodeCopies::where() const {
  return std::string(mc::kShmDir) + "/" + prefix_ + "-*";
}

}  // namespace dtrun::train
