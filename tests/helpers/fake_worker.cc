// A worker for dtrun's tests. Reads RANK etc. from the environment and does
// what its flags say, in this order:
//   --pid-dir D        write D/pid_<RANK>_<TORCHELASTIC_RESTART_COUNT> (its
//   pid)
//   --env-dir D        write D/env_<RANK> (its whole environment; files
//                      appear whole, like --pid-dir's)
//   --stamp-dir D      write D/start_<RANK>_<RESTART> (unix ns at start)
//   --lines N          print N lines "line <i> from rank <RANK>" on stdout
//   --stderr TEXT      print TEXT and a newline on stderr
//   --partial TEXT     print TEXT on stdout with no newline, in pieces
//   --wait-pids N      wait (up to 10 s) until N ranks of this restart wrote
//                      their --pid-dir file (so a failure next can't stop
//                      a peer before it recorded itself)
//   --only-rank R      what follows applies to rank R only (others exit 0)
//   --fail-once D      exit 3 if D/failed_<RANK> is missing (and create it;
//                      with --stamp-dir, also write exit_<RANK>_<RESTART>)
//   --error-file MSG   write a torchrun-style error file with MSG, then exit 1
//   --sleep-ms N       sleep N ms
//   --ignore-term      ignore SIGTERM from here on
//   --hang             sleep until killed
//   --beat-every-ms N  beat forever, every N ms: the step, 1 ms of compute
//                      and 1000000 steps in all (for the metrics benchmark)
//   --vfork-stall      vfork a child that sleeps: until it exits (killed
//                      with the process group), this worker is in
//                      uninterruptible sleep (D state, killable)
//   --record-signal S D  on signal S (a number), write D/got_<S>_<RANK> and
//                      go on
//   --kill-self SIG    raise SIG
//   --exit N           exit N
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "rendezvous/heartbeat.h"

extern char** environ;

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Writes DIR/NAME whole: to a hidden temporary first, then renamed, with stop
// signals held, so a reader polling for the file never sees it half-written
// and a stopped worker leaves no partial one.
void WriteWhole(const std::string& dir, const std::string& name,
                const std::string& content) {
  const std::string path = dir + "/" + name, tmp = dir + "/." + name + ".tmp";
  sigset_t stop, old;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(SIG_BLOCK, &stop, &old);
  std::ofstream(tmp) << content;
  std::rename(tmp.c_str(), path.c_str());
  sigprocmask(SIG_SETMASK, &old, nullptr);
}

long long UnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Kept out of main so vfork cannot clobber main's locals.
__attribute__((noinline)) void VforkStall() {
  if (vfork() == 0) {
    pause();
    _exit(0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string rank = Env("RANK"), restart = Env("TORCHELASTIC_RESTART_COUNT");
  std::string stamp_dir, pid_dir;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string arg = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--ignore-term") {
      signal(SIGTERM, SIG_IGN);
      continue;
    }
    if (flag == "--hang") {
      for (;;) pause();
    }
    if (flag == "--beat-every-ms") {
      dtrun::rendezvous::Heartbeat beat;
      for (int64_t step = 1;; ++step) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::atoi(arg.c_str())));
        beat.Beat(step, 0.001, 1000000);
      }
    }
    if (flag == "--vfork-stall") {
      // The parent of a vfork waits in the kernel (wait_for_vfork_done) in
      // TASK_KILLABLE, which /proc shows as D: a real uninterruptible sleep
      // that SIGKILL still ends, so tests clean up.
      VforkStall();
      continue;
    }
    if (flag == "--record-signal" && i + 2 < argc) {
      static std::string record_path_prefix;
      record_path_prefix = std::string(argv[i + 2]) + "/got_";
      static std::string record_rank;
      record_rank = "_" + rank;
      signal(std::atoi(argv[i + 1]), [](int signo) {
        std::string path =
            record_path_prefix + std::to_string(signo) + record_rank;
        FILE* f = std::fopen(path.c_str(), "w");
        if (f) std::fclose(f);
      });
      i += 2;
      continue;
    }
    ++i;
    if (flag == "--pid-dir") {
      pid_dir = arg;
      WriteWhole(arg, "pid_" + rank + "_" + restart,
                 std::to_string(getpid()) + "\n");
    } else if (flag == "--wait-pids") {
      const int want = std::atoi(arg.c_str());
      for (int waited = 0; waited < 10000; waited += 5) {
        int have = 0;
        for (int r = 0; r < want; ++r) {
          std::string path =
              pid_dir + "/pid_" + std::to_string(r) + "_" + restart;
          if (access(path.c_str(), F_OK) == 0) ++have;
        }
        if (have == want) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } else if (flag == "--env-dir") {
      std::string all;
      for (char** e = environ; *e; ++e) all += std::string(*e) + "\n";
      WriteWhole(arg, "env_" + rank, all);
    } else if (flag == "--stamp-dir") {
      stamp_dir = arg;
      std::ofstream(arg + "/start_" + rank + "_" + restart)
          << UnixNanos() << "\n";
    } else if (flag == "--lines") {
      for (int n = 0; n < std::atoi(arg.c_str()); ++n) {
        std::printf("line %d from rank %s\n", n, rank.c_str());
      }
      std::fflush(stdout);
    } else if (flag == "--stderr") {
      std::fprintf(stderr, "%s\n", arg.c_str());
    } else if (flag == "--partial") {
      for (char c : arg) {
        (void)!write(1, &c, 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else if (flag == "--only-rank") {
      if (rank != arg) return 0;
    } else if (flag == "--fail-once") {
      std::string marker = arg + "/failed_" + rank;
      if (access(marker.c_str(), F_OK) != 0) {
        std::ofstream(marker) << "1\n";
        if (!stamp_dir.empty()) {
          std::ofstream(stamp_dir + "/exit_" + rank + "_" + restart)
              << UnixNanos() << "\n";
        }
        return 3;
      }
    } else if (flag == "--error-file") {
      std::ofstream(Env("TORCHELASTIC_ERROR_FILE"))
          << "{\"message\": {\"message\": \"RuntimeError: " << arg
          << "\", \"extraInfo\": {\"py_callstack\": \"Traceback "
             "(fake)\\nRuntimeError: "
          << arg << "\", \"timestamp\": \"" << UnixNanos() / 1000000000
          << "\"}}}";
      return 1;
    } else if (flag == "--sleep-ms") {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::atoi(arg.c_str())));
    } else if (flag == "--kill-self") {
      raise(std::atoi(arg.c_str()));
    } else if (flag == "--exit") {
      return std::atoi(arg.c_str());
    } else {
      std::fprintf(stderr, "fake_worker: unknown flag %s\n", flag.c_str());
      return 99;
    }
  }
  return 0;
}
