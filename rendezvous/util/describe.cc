// The message formatters: short enough to keep a key list or a duration
// on one log line, the same spelling everywhere.
#include "rendezvous/util/describe.h"

#include <cstdio>

namespace dtrun::rendezvous {

std::string DescribeKeys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i == 3 && keys.size() > 4) {
      out += ", ... " + std::to_string(keys.size() - 3) + " more";
      break;
    }
    out += (i ? ", " : "") + keys[i];
  }
  return out + "]";
}

std::string DescribeSeconds(std::chrono::nanoseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fs",
                std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace dtrun::rendezvous
