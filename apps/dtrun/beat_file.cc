// The beat line's one parser and its reader (beat_file.h has the format).
#include "apps/dtrun/beat_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "apps/dtrun/run_layout.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

// A non-negative integer at `*at` (moved past it); -1 when there is none.
int64_t TakeCount(const std::string& line, size_t* at) {
  if (*at >= line.size() || line[*at] < '0' || line[*at] > '9') return -1;
  char* stop = nullptr;
  long long v = std::strtoll(line.c_str() + *at, &stop, 10);
  *at = static_cast<size_t>(stop - line.c_str());
  return v;
}

}  // namespace

BeatLine ParseBeatLine(const std::string& text) {
  BeatLine beat;
  const std::string line = text.substr(0, text.find('\n'));
  size_t at = line.find_first_not_of(" \t");
  if (at == std::string::npos) return beat;
  if (line.compare(at, 4, "done") == 0) {
    beat.step = kBeatDone;
    return beat;
  }
  beat.step = TakeCount(line, &at);
  if (beat.step < 0 || at >= line.size() || line[at] != ' ') return beat;
  char* stop = nullptr;
  const char* compute = line.c_str() + at + 1;
  double v = std::strtod(compute, &stop);
  if (stop == compute || v < 0) return beat;
  beat.compute_s = v;
  at = static_cast<size_t>(stop - line.c_str());
  if (at >= line.size() || line[at] != ' ') return beat;
  ++at;
  int64_t total = TakeCount(line, &at);
  if (total >= 0) beat.total_steps = total;
  return beat;
}

void BeatReader::Reset(const std::string& attempt_dir, int nproc) {
  attempt_dir_ = attempt_dir;
  last_.assign(static_cast<size_t>(nproc), Beat());
}

std::vector<int> BeatReader::ReadNew() {
  std::vector<int> fresh;
  for (int lr = 0; lr < size(); ++lr) {
    const std::string path = layout::BeatFile(attempt_dir_, lr);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || st.st_size == 0) continue;
    int64_t mtime =
        int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    Beat& beat = last_[static_cast<size_t>(lr)];
    if (beat.mtime_ns == mtime) continue;
    beat.mtime_ns = mtime;
    beat.line = ParseBeatLine(os::ReadFileOrEmpty(path));
    fresh.push_back(lr);
  }
  return fresh;
}

int64_t BeatReader::HighestStep() const {
  int64_t highest = -1;
  for (const Beat& b : last_) {
    const int64_t step = b.line.step;
    highest = std::max(highest, step == kBeatDone ? INT64_MAX : step);
  }
  return highest;
}

const Beat& BeatReader::last(int local_rank) const {
  static const Beat kNone;
  if (local_rank < 0 || local_rank >= size()) return kNone;
  return last_[static_cast<size_t>(local_rank)];
}

}  // namespace dtrun::agent
