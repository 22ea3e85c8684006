// Checkpoint file names (checkpoint_files.h).
#include "rendezvous/util/checkpoint_files.h"

#include <cstdio>

namespace dtrun::checkpoint_files {
namespace {

constexpr char kHead[] = "ckpt_";
constexpr char kTail[] = ".dtck";

bool AllDigits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::string StepName(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt_%012lld.dtck",
                static_cast<long long>(step));
  return name;
}

std::string ShardName(int64_t step, int64_t rank) {
  char name[80];
  std::snprintf(name, sizeof(name), "ckpt_%012lld.shard_%lld.dtck",
                static_cast<long long>(step), static_cast<long long>(rank));
  return name;
}

int64_t StepOfName(const std::string& name) {
  const std::string head = kHead, tail = kTail;
  if (name.size() <= head.size() + tail.size() ||
      name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return -1;
  const std::string digits =
      name.substr(head.size(), name.size() - head.size() - tail.size());
  if (!AllDigits(digits) || digits.size() > 18) return -1;
  return std::stoll(digits);
}

bool ShardOfName(const std::string& name, int64_t* step, int64_t* rank) {
  long long s = 0, r = 0;
  int used = 0;
  if (std::sscanf(name.c_str(), "ckpt_%lld.shard_%lld.dtck%n", &s, &r, &used) !=
          2 ||
      name.c_str()[used] != '\0' || s < 0 || r < 0)
    return false;
  *step = s;
  *rank = r;
  return true;
}

bool IsCheckpointName(const std::string& name) {
  return name.rfind(kHead, 0) == 0 && name.size() > 10 &&
         name.compare(name.size() - 5, 5, kTail) == 0 &&
         name.find('/') == std::string::npos;
}

}  // namespace dtrun::checkpoint_files
