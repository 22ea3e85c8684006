// The shared-memory copies' segments: a fixed header (magic, state, step,
// world, rank, folder, file table) then the files' bytes; flock(2) guards
// each segment; a header left "being written" marks a torn copy, one
// "set aside" a copy a restart found damaged.
#include "rendezvous/util/memory_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <type_traits>

#include "rendezvous/util/checkpoint_files.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::memory_checkpoint {
namespace {

constexpr char kMagic[8] = {'D', 'T', 'S', 'H', 'M', 'C', 'K', '1'};
constexpr uint32_t kBeingWritten = 0, kComplete = 1, kSetAside = 2;
constexpr size_t kNameMax = 64, kDirMax = 4096;
constexpr size_t kChunk = 4 << 20;  // bytes per read or write call

// A segment, as bytes:
//
//   [0, sizeof(Header))      the header below
//   [kDataStart, ...)        each file's bytes, one after another, at the
//                            offsets the header's entries give
//
// The header is written twice per copy: first with state "being written"
// (so a reader that comes after a crash knows), then, after the last file
// byte, with state "complete" and the entries. A reader trusts nothing in
// it: the magic, the state, the file count, each name and each range are
// checked against the segment's real size before anything is read (Parse).
// The files themselves carry their own checksum (lib/checkpoint.h's
// framing), which the training library verifies before it loads a copy;
// dtrun does not hash (a copy it persists is verified when it loads).
//
// Host byte order: a segment never leaves its node.
struct Header {
  char magic[8];
  uint32_t state;
  uint32_t file_count;
  int64_t step, world_size, rank;
  char dir[kDirMax];
  struct Entry {
    char name[kNameMax];
    uint64_t offset, length;
    int64_t shards;
  } files[kMaxFiles];
};
static_assert(std::is_trivially_copyable_v<Header>);
// Files start on a page after the header.
constexpr uint64_t kDataStart = (sizeof(Header) + 4095) / 4096 * 4096;

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// Holds an open segment and, while it lives, a flock on it.
class Locked {
 public:
  Locked(const std::string& path, int flags, int lock) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
    if (fd_ < 0) return;
    while (::flock(fd_, lock) != 0) {
      if (errno == EINTR) continue;
      ::close(fd_);
      fd_ = -1;
      return;
    }
  }
  ~Locked() {
    if (fd_ >= 0) ::close(fd_);  // drops the lock
  }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

Status WriteAll(int fd, const char* p, uint64_t n, uint64_t at,
                const std::string& path) {
  while (n > 0) {
    ssize_t w =
        ::pwrite(fd, p, std::min<uint64_t>(n, kChunk), static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Io(Errno("writing " + path));
    p += w;
    at += static_cast<uint64_t>(w);
    n -= static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

bool ReadAll(int fd, char* p, uint64_t n, uint64_t at) {
  while (n > 0) {
    ssize_t r =
        ::pread(fd, p, std::min<uint64_t>(n, kChunk), static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    at += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return true;
}

std::string Bounded(const char* s, size_t max) {
  return std::string(s, strnlen(s, max));
}

// The copy a header describes, or why it is not one. `size`: the
// segment's, which every file must lie within.
Result<MemoryCopy> Parse(const Header& h, const std::string& path,
                         uint64_t size) {
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0)
    return Status::Invalid("not a checkpoint copy");
  if (h.state == kSetAside)
    return Status::Invalid("set aside (a restart found it damaged)");
  if (h.state != kComplete)
    return Status::Invalid("incomplete (its writer stopped in the middle)");
  if (h.file_count > static_cast<uint32_t>(kMaxFiles))
    return Status::Invalid("bad file count");
  MemoryCopy copy;
  copy.path = path;
  copy.step = h.step;
  copy.world_size = h.world_size;
  copy.rank = h.rank;
  copy.dir = Bounded(h.dir, kDirMax);
  if (copy.dir.empty() || copy.dir[0] != '/')
    return Status::Invalid("no absolute folder");
  for (uint32_t i = 0; i < h.file_count; ++i) {
    const Header::Entry& e = h.files[i];
    MemoryFile f{Bounded(e.name, kNameMax), e.offset, e.length, e.shards};
    if (!checkpoint_files::IsCheckpointName(f.name) || f.offset < kDataStart ||
        f.length > size || f.offset > size - f.length) {
      return Status::Invalid("file " + std::to_string(i) + " is malformed");
    }
    copy.files.push_back(std::move(f));
  }
  return copy;
}

// The header of an open segment and its size; false when it has none.
bool ReadHeader(int fd, Header* h, uint64_t* size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kDataStart)
    return false;
  *size = static_cast<uint64_t>(st.st_size);
  return ReadAll(fd, reinterpret_cast<char*>(h), sizeof(Header), 0);
}

std::string SlotPath(const std::string& prefix, int local_rank, char slot) {
  return std::string(kShmDir) + "/" + prefix + "-" +
         std::to_string(local_rank) + "-" + slot;
}

// The slot to write: the one whose complete copy is older, or that holds
// none. An incomplete slot (a writer died in it) counts as holding none, so
// the good copy in the other slot survives the next write too. Between
// this choice and the write's exclusive lock nothing else writes: one
// writer per local rank.
char NextSlot(const std::string& prefix, int local_rank) {
  int64_t step[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    Locked seg(SlotPath(prefix, local_rank, "ab"[i]), O_RDONLY, LOCK_SH);
    Header h{};
    uint64_t size = 0;
    if (seg.fd() < 0 || !ReadHeader(seg.fd(), &h, &size)) continue;
    if (std::memcmp(h.magic, kMagic, 8) == 0 && h.state == kComplete)
      step[i] = h.step;
  }
  return step[0] <= step[1] ? 'a' : 'b';
}

// Names in /dev/shm that start with `start`.
std::vector<std::string> SegmentNames(const std::string& start) {
  std::vector<std::string> names;
  DIR* d = opendir(kShmDir);
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, start.c_str(), start.size()) == 0)
      names.push_back(e->d_name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// "/dev/shm/dtrun-<pid>-kept": not a segment name ("dtrun-<pid>-ckpt-...").
std::string KeptMarker(int pid) {
  return std::string(kShmDir) + "/dtrun-" + std::to_string(pid) + "-kept";
}

// The largest N of the folder's "ckpt_<N>.dtck" files; -1 when none.
int64_t NewestStepOnDisk(const std::string& dir) {
  int64_t newest = -1;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return newest;
  while (const dirent* e = ::readdir(d)) {
    newest = std::max(newest, checkpoint_files::StepOfName(e->d_name));
  }
  ::closedir(d);
  return newest;
}

// Copies one file of a copy to dir/name durably (os::WriteDurably).
// The segment stays share-locked throughout, so no writer reuses it; the
// copy goes through a 4 MiB buffer, so persisting a large checkpoint costs
// dtrun no more memory than that. The temporary name carries dtrun's pid,
// unlike any a worker uses, so two writers never share one.
Status PersistFile(const MemoryCopy& copy, const MemoryFile& file) {
  Locked seg(copy.path, O_RDONLY, LOCK_SH);
  Header h{};
  uint64_t size = 0;
  if (seg.fd() < 0 || !ReadHeader(seg.fd(), &h, &size) ||
      h.state != kComplete || h.step != copy.step) {
    return Status::Invalid(copy.path + " changed since it was read");
  }
  auto fill = [&](int out, const std::string& tmp) {
    std::string buf(std::min<uint64_t>(file.length, kChunk), '\0');
    Status s;
    for (uint64_t done = 0; done < file.length && s.ok();) {
      uint64_t n = std::min<uint64_t>(file.length - done, kChunk);
      if (!ReadAll(seg.fd(), buf.data(), n, file.offset + done))
        s = Status::Io(Errno("reading " + copy.path));
      else
        s = WriteAll(out, buf.data(), n, done, tmp);
      done += n;
    }
    return s;
  };
  return os::WriteDurably(copy.dir + "/" + file.name, fill);
}

// One folder's newest step: its shards, then its step's file. The folder
// is made first: a job whose first checkpoints lived only in memory may
// never have written to it.
void PersistStep(const std::vector<const MemoryCopy*>& copies,
                 PersistReport* report) {
  if (copies.empty()) return;
  Status made = os::MakeDirs(copies.front()->dir);
  if (!made.ok()) {
    report->notes.push_back(copies.front()->dir + ": " + made.message());
    report->failed = true;
    return;
  }
  const MemoryCopy* step_file_copy = nullptr;
  const MemoryFile* step_file = nullptr;
  for (const MemoryCopy* c : copies) {
    for (const MemoryFile& f : c->files) {
      if (f.name.find(".shard_") == std::string::npos) {
        step_file_copy = c;
        step_file = &f;
        continue;
      }
      const std::string path = c->dir + "/" + f.name;
      if (Exists(path)) continue;
      Status s = PersistFile(*c, f);
      if (s.ok()) {
        report->written.push_back(path);
      } else {
        report->notes.push_back(path + ": " + s.message());
        report->failed = true;
      }
    }
  }
  if (!step_file) return;
  const MemoryCopy& c = *step_file_copy;
  const std::string path = c.dir + "/" + step_file->name;
  if (Exists(path)) return;
  for (int64_t r = 0; r < step_file->shards; ++r) {
    if (!Exists(c.dir + "/" + checkpoint_files::ShardName(c.step, r))) {
      report->notes.push_back(
          path + ": not written, its shard " + std::to_string(r) +
          " is not on disk (another node's memory held it)");
      return;
    }
  }
  Status s = PersistFile(c, *step_file);
  if (s.ok()) {
    report->written.push_back(path);
  } else {
    report->notes.push_back(path + ": " + s.message());
    report->failed = true;
  }
}

}  // namespace

std::string PrefixOf(int pid) {
  return "dtrun-" + std::to_string(pid) + "-ckpt";
}

std::string CollectiveSegmentPrefix(int pid) {
  return "dtrun-ddp-" + std::to_string(pid);
}

const MemoryFile* MemoryCopy::Find(const std::string& name) const {
  for (const MemoryFile& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

MemorySlots::MemorySlots(std::string prefix, int local_rank)
    : prefix_(std::move(prefix)), local_rank_(local_rank) {}

// Marked "being written" before anything else changes and "complete" after
// the last byte: a writer killed in between leaves a segment no reader
// takes.
namespace {

// Each file starts on a page, so that a reader can map it and find its
// payload aligned.
uint64_t PageUp(uint64_t v) { return (v + 4095) / 4096 * 4096; }

// The segment's size for `files`: the header's pages, then each file on a
// page of its own.
uint64_t SegmentSize(const std::vector<FileToWrite>& files) {
  uint64_t at = kDataStart;
  for (const FileToWrite& f : files)
    at = PageUp(at + f.header.size() + f.size());
  return at;
}

// Writes `pieces` one after another from `at`, calling `halfway` (once)
// when the bytes written pass half of `total` (*done counts them).
Status WritePieces(int fd, const std::string& path,
                   const std::vector<std::string_view>& pieces, uint64_t at,
                   uint64_t total, uint64_t* done,
                   const std::function<void()>& halfway) {
  for (std::string_view p : pieces) {
    while (!p.empty()) {
      const uint64_t n = std::min<uint64_t>(p.size(), kChunk);
      Status s = WriteAll(fd, p.data(), n, at, path);
      if (!s.ok()) return s;
      const bool before = *done < total / 2;
      *done += n;
      at += n;
      p.remove_prefix(n);
      if (halfway && before && *done >= total / 2) halfway();
    }
  }
  return Status::Ok();
}

// The files' bytes after the header, each entry of `h` filled as its file
// goes in; `halfway` (a test's fault) once half of all the bytes are in.
Status WriteFiles(int fd, const std::string& path,
                  const std::vector<FileToWrite>& files, Header* h,
                  const std::function<void()>& halfway) {
  uint64_t total = 0, done = 0;
  for (const FileToWrite& f : files) total += f.header.size() + f.size();
  uint64_t at = kDataStart;
  for (size_t i = 0; i < files.size(); ++i) {
    const FileToWrite& f = files[i];
    Header::Entry& e = h->files[i];
    std::snprintf(e.name, sizeof(e.name), "%s", f.name.c_str());
    e.offset = at;
    e.length = f.header.size() + f.size();
    e.shards = f.shards;
    Status s = WritePieces(fd, path, {f.header}, at, total, &done, halfway);
    if (s.ok())
      s = WritePieces(fd, path, f.payload, at + f.header.size(), total, &done,
                      halfway);
    if (!s.ok()) return s;
    at = PageUp(at + e.length);
  }
  return Status::Ok();
}

}  // namespace

Status MemorySlots::Write(int64_t step, int64_t world_size, int64_t rank,
                          const std::string& dir,
                          const std::vector<FileToWrite>& files,
                          const std::function<void()>& halfway) {
  if (files.size() > static_cast<size_t>(kMaxFiles) || dir.size() >= kDirMax)
    return Status::Invalid(
        "memory checkpoint: too many files or too long a "
        "folder name");
  const std::string path =
      SlotPath(prefix_, local_rank_, NextSlot(prefix_, local_rank_));
  Locked seg(path, O_RDWR | O_CREAT, LOCK_EX);
  if (seg.fd() < 0) return Status::Io(Errno("opening " + path));
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.state = kBeingWritten;
  Status s =
      WriteAll(seg.fd(), reinterpret_cast<const char*>(&h), sizeof(h), 0, path);
  if (s.ok() && ::ftruncate(seg.fd(), static_cast<off_t>(SegmentSize(files))))
    s = Status::Io(Errno("sizing " + path + " (is /dev/shm full?)"));
  h.file_count = static_cast<uint32_t>(files.size());
  h.step = step;
  h.world_size = world_size;
  h.rank = rank;
  std::snprintf(h.dir, sizeof(h.dir), "%s", dir.c_str());
  if (s.ok()) s = WriteFiles(seg.fd(), path, files, &h, halfway);
  if (!s.ok()) return s;
  h.state = kComplete;
  return WriteAll(seg.fd(), reinterpret_cast<const char*>(&h), sizeof(h), 0,
                  path);
}

std::vector<MemoryCopy> ScanMemoryCopies(const std::string& prefix,
                                         std::vector<std::string>* unusable) {
  std::vector<MemoryCopy> copies;
  for (const std::string& name : SegmentNames(prefix + "-")) {
    const std::string path = std::string(kShmDir) + "/" + name;
    Locked seg(path, O_RDONLY, LOCK_SH);
    Header h{};
    uint64_t size = 0;
    Result<MemoryCopy> copy = Status::Invalid("unreadable");
    if (seg.fd() >= 0 && ReadHeader(seg.fd(), &h, &size))
      copy = Parse(h, path, size);
    if (copy.ok()) {
      copies.push_back(std::move(*copy));
    } else if (unusable) {
      unusable->push_back(path + ": " + copy.status().message());
    }
  }
  std::stable_sort(
      copies.begin(), copies.end(),
      [](const MemoryCopy& a, const MemoryCopy& b) { return a.step > b.step; });
  return copies;
}

void SetAside(const MemoryCopy& copy) {
  Locked seg(copy.path, O_RDWR, LOCK_EX);
  Header h{};
  uint64_t size = 0;
  if (seg.fd() < 0 || !ReadHeader(seg.fd(), &h, &size) ||
      h.state != kComplete || h.step != copy.step)
    return;
  h.state = kSetAside;
  (void)WriteAll(seg.fd(), reinterpret_cast<const char*>(&h), sizeof(h), 0,
                 copy.path);
}

// The mapping starts on the page the file starts on (every file does,
// PageUp); the lock stays with the mapping.
Result<MappedFile> MapMemoryFile(const MemoryCopy& copy,
                                 const MemoryFile& file) {
  auto seg = std::make_shared<Locked>(copy.path, O_RDONLY, LOCK_SH);
  Header h{};
  uint64_t size = 0;
  if (seg->fd() < 0 || !ReadHeader(seg->fd(), &h, &size) ||
      h.state != kComplete || h.step != copy.step ||
      file.offset + file.length > size) {
    return Status::Invalid(copy.path + " no longer holds step " +
                           std::to_string(copy.step));
  }
  const uint64_t start = file.offset / 4096 * 4096;
  const size_t len = static_cast<size_t>(file.offset + file.length - start);
  if (file.length == 0) return MappedFile{"", 0, seg};
  // Not populated: the verifying threads fault the pages in, in parallel
  // (0.02-0.04 s less for 0.77 GB than MAP_POPULATE's one thread, which on
  // a writable private mapping would also copy every page).
  void* map = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE,
                     seg->fd(), static_cast<off_t>(start));
  if (map == MAP_FAILED) return Status::Invalid(Errno("mapping " + copy.path));
  std::shared_ptr<const void> hold(
      map, [seg, len](const void* p) { ::munmap(const_cast<void*>(p), len); });
  return MappedFile{static_cast<const char*>(map) + (file.offset - start),
                    file.length, std::move(hold)};
}

uint64_t FileToWrite::size() const {
  uint64_t n = 0;
  for (std::string_view p : payload) n += p.size();
  return n;
}

// Each folder's newest step is what a restart would want; older copies are
// on disk already or superseded. Copies of several folders can share a
// node (two jobs' workers never share a prefix, but one job's ranks may
// be pointed at different folders); each folder is persisted on its own.
PersistReport PersistMemoryCopies(const std::string& prefix, bool only_newer) {
  PersistReport report;
  std::map<std::string, std::vector<const MemoryCopy*>> newest;  // by folder
  const std::vector<MemoryCopy> copies = ScanMemoryCopies(prefix);
  for (const MemoryCopy& c : copies) {
    auto& list = newest[c.dir];
    if (list.empty() || list.front()->step == c.step) list.push_back(&c);
  }
  for (const auto& [dir, list] : newest) {
    const int64_t on_disk = only_newer ? NewestStepOnDisk(dir) : -1;
    if (on_disk >= list.front()->step) {
      report.notes.push_back(dir + ": step " +
                             std::to_string(list.front()->step) +
                             " not persisted, superseded by step " +
                             std::to_string(on_disk) + " on disk");
      continue;
    }
    PersistStep(list, &report);
  }
  return report;
}

int RemoveMemoryCopies(const std::string& prefix) {
  int removed = 0;
  for (const std::string& name : SegmentNames(prefix + "-")) {
    if (::unlink((std::string(kShmDir) + "/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

namespace {

// The pids of "dtrun-<pid>-ckpt-..." segments whose process is gone
// (kill(pid, 0) finds none). A live process of that pid that is not dtrun
// keeps them: a rare leak, never a removal under a running job.
std::set<long long> OrphanPids() {
  std::set<long long> pids;
  for (const std::string& name : SegmentNames("dtrun-")) {
    long long pid = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "dtrun-%lld-ckpt-%n", &pid, &used) != 1 ||
        used == 0 || pid <= 0) {
      continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    pids.insert(pid);
  }
  return pids;
}

}  // namespace

void MarkKept(int pid) {
  const int fd =
      ::open(KeptMarker(pid).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

std::vector<std::string> PersistOrphanedCopies() {
  std::vector<std::string> lines;
  for (long long pid : OrphanPids()) {
    const std::string prefix = PrefixOf(static_cast<int>(pid));
    const std::string marker = KeptMarker(static_cast<int>(pid));
    if (!Exists(marker)) {
      for (const std::string& name : SegmentNames(prefix + "-")) {
        const std::string path = std::string(kShmDir) + "/" + name;
        if (::unlink(path.c_str()) == 0)
          lines.push_back("removed " + path +
                          ": a checkpoint copy of a dtrun that is gone");
      }
      continue;
    }
    PersistReport report = PersistMemoryCopies(prefix, /*only_newer=*/true);
    for (const std::string& path : report.written)
      lines.push_back("persisted " + path + " from the copy of dtrun " +
                      std::to_string(pid) + ", which is gone");
    if (report.failed) {
      for (const std::string& note : report.notes)
        lines.push_back("kept the copy of dtrun " + std::to_string(pid) +
                        " in " + kShmDir + ": " + note);
      continue;
    }
    for (const std::string& note : report.notes)
      lines.push_back("the copy of dtrun " + std::to_string(pid) + ": " + note);
    const int removed = RemoveMemoryCopies(prefix);
    ::unlink(marker.c_str());
    if (removed > 0)
      lines.push_back("removed " + std::to_string(removed) +
                      " checkpoint copies of dtrun " + std::to_string(pid) +
                      ", which is gone");
  }
  return lines;
}

std::vector<std::string> RemoveOrphanedCopies() {
  std::vector<std::string> removed;
  for (long long pid : OrphanPids()) {
    const std::string prefix = PrefixOf(static_cast<int>(pid)) + "-";
    for (const std::string& name : SegmentNames(prefix)) {
      const std::string path = std::string(kShmDir) + "/" + name;
      if (::unlink(path.c_str()) == 0) removed.push_back(path);
    }
  }
  return removed;
}

}  // namespace dtrun::memory_checkpoint
