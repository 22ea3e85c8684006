// In-place recovery's collectives: who holds the newest state, and moving
// it to the ranks behind over point-to-point sends (gloo's), with no file
// and no serializer in between.
#include "lib/parallel/in_place.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "lib/checkpointing/state_copy.h"
#include "lib/process_group.h"
#include "rendezvous/in_place.h"

namespace dtrun::train {
namespace {

// Tags keep the header apart from the tensors that follow it.
constexpr int kHeaderSizeTag = 1, kHeaderTag = 2, kTensorTag = 3;

void Send(ProcessGroup& pg, torch::Tensor t, int dst, int tag) {
  std::vector<torch::Tensor> v{std::move(t)};
  pg.send(v, dst, tag)->wait();
}
void Receive(ProcessGroup& pg, torch::Tensor t, int src, int tag) {
  std::vector<torch::Tensor> v{std::move(t)};
  pg.recv(v, src, tag)->wait();
}

// One line per tensor: "<name>\t<dtype number>\t<dim>,<dim>,...".
std::string Header(const TensorMap& state) {
  std::ostringstream out;
  for (const auto& [name, t] : state) {
    out << name << '\t' << static_cast<int>(t.scalar_type()) << '\t';
    for (int64_t d = 0; d < t.dim(); ++d) out << (d ? "," : "") << t.size(d);
    out << '\n';
  }
  return out.str();
}

struct Field {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};

std::vector<Field> ParseHeader(const std::string& text) {
  std::vector<Field> fields;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream parts(line);
    std::string name, dtype, dims;
    std::getline(parts, name, '\t');
    std::getline(parts, dtype, '\t');
    std::getline(parts, dims);
    Field f{name, static_cast<torch::ScalarType>(std::stoi(dtype)), {}};
    std::istringstream each(dims);
    for (std::string d; std::getline(each, d, ',');)
      f.shape.push_back(std::stoll(d));
    fields.push_back(std::move(f));
  }
  return fields;
}

// A staged segment: the header's size (8 bytes), the header, then each
// tensor's bytes, every part starting on a 64-byte boundary.
constexpr size_t kAlign = 64;
size_t Aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t StageBytes(const std::string& header, const TensorMap& state) {
  size_t bytes = Aligned(8 + header.size());
  for (const auto& [name, t] : state)
    bytes += Aligned(static_cast<size_t>(t.numel()) * t.element_size());
  return bytes;
}

// Views of each field, in header order, into `base`.
TensorMap Views(char* base, const std::vector<Field>& fields,
                const std::shared_ptr<void>& keep) {
  uint64_t header_size = 0;
  std::memcpy(&header_size, base, 8);
  size_t at = Aligned(8 + header_size);
  TensorMap state;
  for (const Field& f : fields) {
    auto options = torch::TensorOptions().dtype(f.dtype);
    state[f.name] = torch::from_blob(
        base + at, f.shape, [keep](void*) {}, options);
    at += Aligned(static_cast<size_t>(state[f.name].numel()) *
                  state[f.name].element_size());
  }
  return state;
}

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

std::atomic<int> group_attempt{0}, announced_attempt{0};

}  // namespace

bool GroupBroken() {
  return announced_attempt.load(std::memory_order_relaxed) >
         group_attempt.load(std::memory_order_relaxed);
}
void SetGroupAttempt(int attempt) { group_attempt.store(attempt); }
void ResetGroupAttempts(int attempt) {
  group_attempt.store(attempt);
  announced_attempt.store(attempt);
}
void AnnounceAttempt(int attempt) {
  int seen = announced_attempt.load();
  while (seen < attempt &&
         !announced_attempt.compare_exchange_weak(seen, attempt)) {
  }
}
void ThrowIfGroupBroken(const char* where) {
  if (GroupBroken()) {
    throw Error(std::string(where) +
                ": the group is re-forming in place (a rank died, or dtrun "
                "began a new round)");
  }
}

// Work::wait(timeout) throws when the slice ends with the work still in
// flight; an error of the work itself comes with it completed.
void WaitUnlessGroupBroken(const c10::intrusive_ptr<c10d::Work>& work,
                           bool sliced, const char* where) {
  if (!sliced) {
    work->wait();
    return;
  }
  for (;;) {
    try {
      work->wait(std::chrono::milliseconds(100));
      return;
    } catch (...) {
      if (work->isCompleted()) throw;
    }
    ThrowIfGroupBroken(where);
  }
}

std::string StageName(int master_port, int restart_count, int rank) {
  return "/" + rendezvous::in_place::StagePrefix(master_port) +
         std::to_string(restart_count) + "-" + std::to_string(rank);
}

Status StageState(const std::string& name, const TensorMap& state) {
  const std::string header = Header(state);
  const size_t bytes = StageBytes(header, state);
  // A stale one of a job killed whole goes; MAP_POPULATE makes its pages
  // in one call rather than a fault each as the copy writes them.
  ::shm_unlink(name.c_str());
  int fd =
      ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Io(Errno("shm_open " + name));
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = err == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_POPULATE, fd, 0)
                        : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    errno = err ? err : errno;
    return Status::Io(Errno("staging " + std::to_string(bytes >> 20) +
                            " MiB in /dev/shm as " + name));
  }
  auto* p = static_cast<char*>(base);
  const uint64_t header_size = header.size();
  std::memcpy(p, &header_size, 8);
  std::memcpy(p + 8, header.data(), header.size());
  std::shared_ptr<void> keep(base, [bytes](void* b) { ::munmap(b, bytes); });
  TensorMap views = Views(p, ParseHeader(header), keep);
  std::vector<torch::Tensor> dst, src;
  for (const auto& [name_, t] : state) {
    dst.push_back(views.at(name_));
    src.push_back(t.detach().to(torch::kCPU).contiguous());
  }
  CopyTensors(dst, src);
  return Status::Ok();
}

Result<TensorMap> MapState(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return Status::Io(Errno("shm_open " + name));
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0 && st.st_size >= 8;
  void* base = sized ? ::mmap(nullptr, static_cast<size_t>(st.st_size),
                              PROT_READ, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) return Status::Io(Errno("mapping " + name));
  const size_t bytes = static_cast<size_t>(st.st_size);
  std::shared_ptr<void> keep(base, [bytes](void* b) { ::munmap(b, bytes); });
  auto* p = static_cast<char*>(base);
  uint64_t header_size = 0;
  std::memcpy(&header_size, p, 8);
  if (8 + header_size > bytes) return Status::Invalid(name + ": bad header");
  return Views(p, ParseHeader(std::string(p + 8, header_size)), keep);
}

void Unstage(const std::string& name) { ::shm_unlink(name.c_str()); }

HeldState AgreeOnState(ProcessGroup& pg, int64_t held, int64_t staged) {
  const int world = pg.getSize();
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < world; ++r)
    out[0].push_back(torch::empty({2}, torch::kLong));
  std::vector<torch::Tensor> in{torch::tensor({held, staged}, torch::kLong)};
  pg.allgather(out, in)->wait();
  HeldState s;
  for (int r = 0; r < world; ++r) {
    s.held.push_back(out[0][r][0].item<int64_t>());
    s.staged.push_back(out[0][r][1].item<int64_t>());
    s.newest = std::max(s.newest, s.held.back());
  }
  for (int r = 0; r < world; ++r) {
    if (s.staged[r] == s.newest && s.held[r] == s.newest) {
      s.source = r;
      break;
    }
  }
  for (int r = 0; r < world && s.source < 0; ++r) {
    if (s.held[r] == s.newest) s.source = r;
  }
  return s;
}

void SendState(ProcessGroup& pg, int dst, const TensorMap& state) {
  const std::string header = Header(state);
  Send(pg, torch::tensor({static_cast<int64_t>(header.size())}, torch::kLong),
       dst, kHeaderSizeTag);
  auto bytes =
      torch::empty({static_cast<int64_t>(header.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr(), header.data(), header.size());
  Send(pg, bytes, dst, kHeaderTag);
  for (const auto& [name, t] : state) {
    if (t.numel() == 0) continue;
    Send(pg, t.detach().to(torch::kCPU).contiguous(), dst, kTensorTag);
  }
}

TensorMap ReceiveState(ProcessGroup& pg, int src) {
  auto size = torch::empty({1}, torch::kLong);
  Receive(pg, size, src, kHeaderSizeTag);
  auto bytes = torch::empty({size.item<int64_t>()}, torch::kUInt8);
  Receive(pg, bytes, src, kHeaderTag);
  TensorMap state;
  for (const Field& f :
       ParseHeader(std::string(static_cast<const char*>(bytes.data_ptr()),
                               static_cast<size_t>(bytes.numel())))) {
    auto t = torch::empty(f.shape, f.dtype);
    if (t.numel() > 0) Receive(pg, t, src, kTensorTag);
    state[f.name] = t;
  }
  return state;
}

}  // namespace dtrun::train
