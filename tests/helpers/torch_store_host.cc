// Hosts libtorch's own c10d::TCPStore server (1.13 on the host, 2.6 when
// built in the root of scripts/torch2.sh) in its own process, for
// side-by-side benchmarks. Prints "listening on 127.0.0.1:PORT" and serves
// until SIGTERM/SIGINT. Usage: torch_store_host [PORT]
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

int main(int argc, char** argv) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  c10d::TCPStoreOptions opts;
  opts.port = argc > 1 ? static_cast<uint16_t>(std::atoi(argv[1])) : 0;
  opts.isServer = true;
  opts.waitWorkers = false;
#if TORCH_VERSION_MAJOR >= 2
  opts.useLibUV = false;  // Debian's 2.x is built without libuv
#endif
  c10d::TCPStore store("127.0.0.1", opts);
  std::printf("listening on 127.0.0.1:%u\n", unsigned(store.getPort()));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  return 0;
}
