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
  // The loop is over: dtrun stops watching (teardown may take a while).
  void Done() {
    if (fd_ >= 0) (void)!::pwrite(fd_, "done\n", 5, 0);
  }
  bool enabled() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace dtrun::rendezvous
