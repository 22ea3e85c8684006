// The cost of one heartbeat (rendezvous::Heartbeat::Beat: one pwrite) in C++,
// with the step alone and with the step's compute time (stragglers).
// Usage: hang_bench [BEATS]; prints "cpp_beat_us <mean microseconds>" and
// "cpp_timed_beat_us <mean microseconds>".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include "rendezvous/heartbeat.h"

int main(int argc, char** argv) {
  long beats = argc > 1 ? std::atol(argv[1]) : 200000;
  char dir[] = "/tmp/dtrun-hang-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  std::string path = std::string(dir) + "/heartbeat";
  setenv(dtrun::rendezvous::Heartbeat::kEnv, path.c_str(), 1);
  {
    dtrun::rendezvous::Heartbeat hb;
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < beats; ++i) hb.Beat(i);
    double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    std::printf("cpp_beat_us %.3f\n", s / beats * 1e6);
    start = std::chrono::steady_clock::now();
    for (long i = 0; i < beats; ++i) hb.Beat(i, 0.0123456);
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    std::printf("cpp_timed_beat_us %.3f\n", s / beats * 1e6);
  }
  unlink(path.c_str());
  rmdir(dir);
  return 0;
}
