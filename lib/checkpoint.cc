// Checkpoint files and folders: every write goes to a temporary name,
// fsync, rename, folder fsync, so a crash leaves the old file or the new
// one whole; every read verifies the frame (checkpoint_frame.cc) before
// the payload is trusted. The folder's rules (which step loads, keep, epochs,
// stale files set aside) live here; what a payload holds does not.
#include "lib/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "rendezvous/util/checkpoint_files.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::train {
namespace {

// Written in chunks so that a test can kill the writer halfway (on_chunk).
constexpr size_t kChunk = 4 << 20;
constexpr const char* kEpochsName = checkpoint_files::kEpochsName;

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

Status WriteAllFd(int fd, const char* p, size_t n,
                  const std::function<void(size_t)>& on_chunk, size_t* written,
                  const std::string& path) {
  while (n > 0) {
    size_t take = std::min(n, kChunk);
    ssize_t w = ::write(fd, p, take);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Io(Errno("writing " + path));
    p += w;
    n -= static_cast<size_t>(w);
    *written += static_cast<size_t>(w);
    if (on_chunk) on_chunk(*written);
  }
  return Status::Ok();
}

// Writes header and payload to `fd` (the temporary file `tmp`).
Status WritePieces(int fd, const std::string& tmp, const std::string& header,
                   const Payload& payload,
                   const std::function<void(size_t)>& on_chunk) {
  size_t written = 0;
  Status s =
      WriteAllFd(fd, header.data(), header.size(), on_chunk, &written, tmp);
  for (size_t i = 0; s.ok() && i < payload.pieces.size(); ++i) {
    s = WriteAllFd(fd, payload.pieces[i].data(), payload.pieces[i].size(),
                   on_chunk, &written, tmp);
  }
  return s;
}

// Shards of steps no longer kept, and of older steps that never got a
// manifest (a crash between shards and manifest). Shards of later steps
// are left alone: they may belong to a checkpoint being written.
void DeleteStaleShards(const std::string& dir, int64_t step,
                       const std::vector<int64_t>& kept) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> doomed;
  while (dirent* e = readdir(d)) {
    int64_t shard_step = 0, rank = 0;
    if (checkpoint_files::ShardOfName(e->d_name, &shard_step, &rank) &&
        std::find(kept.begin(), kept.end(), shard_step) == kept.end() &&
        shard_step <= step) {
      doomed.push_back(dir + "/" + e->d_name);
    }
  }
  closedir(d);
  // Unlinked after the walk: POSIX leaves unspecified what readdir returns
  // for entries removed while it runs.
  for (const auto& path : doomed) ::unlink(path.c_str());
}

}  // namespace

CheckpointDir::CheckpointDir(std::string dir, int keep_last)
    : dir_(std::move(dir)), keep_last_(std::max(1, keep_last)) {}

// Zero-padded so that names sort as steps do.
std::string CheckpointDir::StepName(int64_t step) {
  return checkpoint_files::StepName(step);
}

std::string CheckpointDir::ShardName(int64_t step, int rank) {
  return checkpoint_files::ShardName(step, rank);
}

std::string CheckpointDir::PathFor(int64_t step) const {
  return dir_ + "/" + StepName(step);
}

// Through os::WriteDurably (temporary file, fsync, rename, folder fsync):
// a reader sees either the old file or the whole new one, and ranks writing
// shards to one folder never share a temporary name.
Status WriteCheckpointFile(const std::string& final_path,
                           const Payload& payload,
                           const std::function<void(size_t)>& on_chunk,
                           const std::string& header) {
  const std::string dir = final_path.substr(0, final_path.rfind('/') + 1);
  if (!dir.empty()) {
    Status made = os::MakeDirs(dir);
    if (!made.ok()) return Status::Io("checkpoint: " + made.message());
  }
  const std::string& head = header.empty() ? CheckpointHeader(payload) : header;
  return os::WriteDurably(final_path, [&](int fd, const std::string& tmp) {
    return WritePieces(fd, tmp, head, payload, on_chunk);
  });
}

Status CheckpointDir::Write(int64_t step, const Payload& payload,
                            const std::string& header) {
  Status s = os::MakeDirs(dir_);
  if (!s.ok()) return Status::Io("checkpoint: " + s.message());
  s = WriteCheckpointFile(PathFor(step), payload, on_chunk, header);
  if (!s.ok()) return s;
  // Pruned only after the new file is durable: a crash in between leaves one
  // checkpoint too many, never one too few. Later steps are set aside first
  // (renamed, not deleted: nothing is lost that someone may want to read).
  auto steps = Steps();
  // One that cannot be renamed stays (the loader still refuses it by its
  // epoch), but never counts among the kept.
  while (!steps.empty() && steps.front() > step) {
    const std::string from = PathFor(steps.front());
    (void)::rename(from.c_str(),
                   (from + checkpoint_files::kAbandonedSuffix).c_str());
    steps.erase(steps.begin());
  }
  std::vector<int64_t> kept(
      steps.begin(),
      steps.begin() + std::min(steps.size(), static_cast<size_t>(keep_last_)));
  for (size_t i = kept.size(); i < steps.size(); ++i)
    ::unlink(PathFor(steps[i]).c_str());
  DeleteStaleShards(dir_, step, kept);
  return Status::Ok();
}

std::string CheckpointDir::ShardPath(int64_t step, int rank) const {
  return dir_ + "/" + ShardName(step, rank);
}

std::vector<int64_t> CheckpointDir::Steps() const {
  std::vector<int64_t> steps;
  DIR* d = opendir(dir_.c_str());
  if (!d) return steps;
  while (dirent* e = readdir(d)) {
    // Temporary files ("....dtck.tmp.<pid>") never count.
    const int64_t step = checkpoint_files::StepOfName(e->d_name);
    if (step >= 0) steps.push_back(step);
  }
  closedir(d);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Only a later epoch can abandon a file: an epoch's own files are its
// history, and an earlier epoch's resume point says nothing about files
// written after it. A resume from step r keeps every file at r or before.
std::string AbandonedBy(const std::vector<EpochRecord>& epochs, int64_t epoch,
                        int64_t step) {
  for (const EpochRecord& later : epochs) {
    if (later.epoch > epoch && step > later.resumed_from) {
      return "written in epoch " + std::to_string(epoch) + ", but epoch " +
             std::to_string(later.epoch) + " resumed from step " +
             std::to_string(later.resumed_from) +
             ": a history given up (a node cut off from the job wrote it)";
    }
  }
  return "";
}

std::string FormatEpochs(const std::vector<EpochRecord>& epochs) {
  std::string out;
  for (const EpochRecord& e : epochs)
    out += std::to_string(e.epoch) + " " + std::to_string(e.resumed_from) +
           " " + std::to_string(e.world_size) + "\n";
  return out;
}

// Strict: a line must be exactly two or three non-negative numbers (the
// world size came later), so a list that
// another program wrote into the folder is refused rather than half-read.
Result<std::vector<EpochRecord>> ParseEpochs(const std::string& text) {
  std::vector<EpochRecord> out;
  size_t at = 0;
  for (int line = 1; at < text.size(); ++line) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string l = text.substr(at, end - at);
    at = end + 1;
    long long epoch = 0, step = 0, world = 0;
    char tail = 0;
    const int n = std::sscanf(l.c_str(), "%lld %lld %lld%c", &epoch, &step,
                              &world, &tail);
    if ((n != 2 && n != 3) || epoch < 0 || step < 0 || world < 0) {
      return Status::Invalid("epochs line " + std::to_string(line) + " '" +
                             l.substr(0, 40) + "' is not two or three numbers");
    }
    out.push_back({epoch, step, world});
  }
  return out;
}

std::vector<EpochRecord> CheckpointDir::Epochs() const {
  auto payload = ReadCheckpointFile(dir_ + "/" + kEpochsName);
  if (!payload.ok()) return {};
  auto parsed = ParseEpochs(std::string(payload->bytes()));
  return parsed.ok() ? *parsed : std::vector<EpochRecord>{};
}

// The whole list is rewritten through a temporary file and a rename, so a
// crash leaves the old list or the new one, never a torn one; a list that
// does not verify reads as none, which only makes the rule lenient.
Result<int64_t> CheckpointDir::BeginEpoch(int64_t resumed_from,
                                          int64_t world_size) {
  std::vector<EpochRecord> epochs = Epochs();
  const int64_t next = epochs.empty() ? 1 : epochs.back().epoch + 1;
  epochs.push_back({next, resumed_from, world_size});
  if (epochs.size() > kKeptEpochs)
    epochs.erase(epochs.begin(), epochs.end() - kKeptEpochs);
  // Framed with SHA-256 (DTCKPT1): a few lines, whose hash costs nothing,
  // in the frame tools that read the list already know.
  const Payload list(FormatEpochs(epochs));
  Status s = WriteCheckpointFile(dir_ + "/" + kEpochsName, list, nullptr,
                                 CheckpointHeader(list, Checksum::kSha256));
  if (!s.ok()) return s;
  return next;
}

// Newest first, past any that fail to verify or to be accepted: a crash
// mid-write or a lost shard costs the steps since the previous good
// checkpoint, not the run.
std::optional<CheckpointDir::Loaded> CheckpointDir::LoadLatest(
    std::vector<std::string>* skipped,
    const std::function<Status(const Loaded&)>& accept, int64_t at_most) const {
  for (int64_t step : Steps()) {
    if (step > at_most) continue;
    std::string path = PathFor(step);
    auto payload = ReadCheckpointFile(path);
    Status why = payload.status();
    if (payload.ok()) {
      Loaded loaded{step, std::move(*payload), path};
      why = accept ? accept(loaded) : Status::Ok();
      if (why.ok()) return loaded;
    }
    if (skipped) skipped->push_back(path + ": " + why.message());
  }
  return std::nullopt;
}

}  // namespace dtrun::train
