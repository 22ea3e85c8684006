#pragma once
// A store server (dtstore, or the helper hosting libtorch's) started as a
// child process for the benchmarks, and the CPU time a process has used.

#include <sched.h>
#include <spawn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace dtrun::testing {

struct ServerProcess {
  pid_t pid = -1;  // -1: it could not be started
  uint16_t port = 0;
};

// Runs args[0] with args and reads the port from its first stdout line
// ("listening on H:P"). The caller stops the process.
inline ServerProcess SpawnServer(std::vector<std::string> args) {
  int out[2];
  if (pipe(out) != 0) return {};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ServerProcess s;
  if (posix_spawn(&s.pid, args[0].c_str(), &fa, nullptr, argv.data(),
                  environ) != 0)
    s.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  std::string line;
  char c;
  while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
  close(out[0]);
  auto colon = line.rfind(':');
  if (colon != std::string::npos)
    s.port = static_cast<uint16_t>(std::atoi(line.c_str() + colon + 1));
  return s;
}

// --pin C,S: the client on CPU C, the servers on CPU S. Left to the
// scheduler on a small machine, a server's thread lands on the client's core
// or on the other one run by run, and the two cost very differently (a
// 1 MiB GET costs dtstore ~115 us of CPU beside the client and ~300 us across
// cores, where every wake-up is an interrupt to the other core); nor does it
// place the two servers alike. Pinning makes the placement the same for both.
struct Pinning {
  int client = -1;  // -1: not pinned
  int server = -1;
};

// Parses "C,S"; false (and a message naming the value) when malformed.
inline bool ParsePinning(const std::string& value, Pinning* pin) {
  int c = -1, s = -1;
  char extra = 0;
  if (std::sscanf(value.c_str(), "%d,%d%c", &c, &s, &extra) != 2 || c < 0 ||
      s < 0 || c >= CPU_SETSIZE || s >= CPU_SETSIZE) {
    std::fprintf(stderr,
                 "--pin '%s': expected CLIENT_CPU,SERVER_CPU, e.g. 0,1\n",
                 value.c_str());
    return false;
  }
  pin->client = c;
  pin->server = s;
  return true;
}

// Moves the calling thread to `cpu`; what it starts afterwards (threads,
// processes) inherits that. False when the CPU cannot be used.
inline bool PinCallerTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) == 0) return true;
  std::fprintf(stderr, "--pin: cannot run on CPU %d\n", cpu);
  return false;
}

// utime + stime of `pid` (fields 14 and 15 of /proc/PID/stat), in seconds.
inline double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)),
                   std::istreambuf_iterator<char>());
  auto paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(text.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace dtrun::testing
