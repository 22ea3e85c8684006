#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace dtrun::rendezvous {

// A worker's heartbeat for `dtrun --hang-timeout`: Beat(step) writes the step
// to the file dtrun names in $DTRUN_HEARTBEAT_FILE (dtrun watches its
// modification time). A no-op when the variable is not set. One per
// process; not thread-safe. Header-only so any worker can use it.
class Heartbeat {
 public:
  static constexpr const char* kEnv = "DTRUN_HEARTBEAT_FILE";

  Heartbeat() {
    const char* path = std::getenv(kEnv);
    if (path && *path) fd_ = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  }
  ~Heartbeat() {
    if (fd_ >= 0) ::close(fd_);
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // One pwrite of "<step>\n" at offset 0; readers take the first line, so a
  // shorter number over a longer one needs no truncation.
  void Beat(int64_t step) {
    if (fd_ < 0) return;
    char buf[24];
    int n =
        std::snprintf(buf, sizeof(buf), "%lld\n", static_cast<long long>(step));
    (void)!::pwrite(fd_, buf, static_cast<size_t>(n), 0);
  }
  // The same with the seconds this step spent outside collectives (its own
  // compute: a slow rank shows here, where the step time, evened out by
  // the collectives, hides it): "<step> <seconds>\n".
  void Beat(int64_t step, double compute_seconds) {
    if (fd_ < 0) return;
    char buf[48];
    int n = std::snprintf(buf, sizeof(buf), "%lld %.6f\n",
                          static_cast<long long>(step), compute_seconds);
    (void)!::pwrite(fd_, buf, static_cast<size_t>(n), 0);
  }
  // The same with the steps the run will take in all, for dtrun's progress
  // display (step N of M, the time left): "<step> <seconds> <total>\n".
  void Beat(int64_t step, double compute_seconds, int64_t total_steps) {
    if (fd_ < 0) return;
    char buf[72];
    int n = std::snprintf(buf, sizeof(buf), "%lld %.6f %lld\n",
                          static_cast<long long>(step), compute_seconds,
                          static_cast<long long>(total_steps));
    (void)!::pwrite(fd_, buf, static_cast<size_t>(n), 0);
  }
  // Once an attempt's state is in place: the resume record dtrun's
  // recovery report reads, "<step> <source> <init> <load>\n" in the file
  // beside the beat (<DTRUN_HEARTBEAT_FILE>.resume): the step resumed from
  // and its source ("disk", "memory", "none"), when the rank was set up and
  // when its state was loaded (unix seconds). A no-op without dtrun.
  static void Resumed(int64_t step, const char* source, double init_unix,
                      double load_unix) {
    const char* beat = std::getenv(kEnv);
    if (!beat || !*beat) return;
    char path[4096];
    if (std::snprintf(path, sizeof(path), "%s.resume", beat) >=
        static_cast<int>(sizeof(path)))
      return;
    char line[160];
    int n = std::snprintf(line, sizeof(line), "%lld %s %.6f %.6f\n",
                          static_cast<long long>(step), source, init_unix,
                          load_unix);
    int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    (void)!::write(fd, line, static_cast<size_t>(n));
    ::close(fd);
  }
  // The loop is over: dtrun stops watching (teardown may take a while).
  void Done() {
    if (fd_ >= 0) (void)!::pwrite(fd_, "done\n", 5, 0);
  }
  bool enabled() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace dtrun::rendezvous
