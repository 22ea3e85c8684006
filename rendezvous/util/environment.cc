// environ read once into a map: the pure functions that turn it into
// settings take the map, so tests pass whatever environment they need.
#include "rendezvous/util/environment.h"

// Not declared by any standard header in C++; POSIX only promises it exists.
extern char** environ;

namespace dtrun {

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    // Entries without '=' can be put there by execve's caller; skip them.
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace dtrun
