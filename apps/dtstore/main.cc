// dtstore: a standalone c10d-compatible TCP store server.
//   dtstore --host H --port P [--log-level L] [--max-value-mb N]
// Prints "listening on H:P" as its first stdout line; exits 0 on
// SIGTERM/SIGINT, 2 on a bad flag, 3 when it cannot listen.

#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "dtrun_version.h"
#include "rendezvous/log.h"
#include "rendezvous/store_server.h"

namespace {

// 1.13 clients open two connections each; a large job needs many fds.
void RaiseFdLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrun's standalone c10d TCPStore-compatible store server"};
  dtrun::rdzv::StoreServerOptions opts;
  std::string log_level;
  uint64_t max_value_mb = 64;
  app.add_option("--host", opts.host, "address to bind ('::' = all, dual-stack)")
      ->capture_default_str();
  app.add_option("--port", opts.port, "port to listen on; 0 picks a free one")
      ->capture_default_str();
  app.add_option("--log-level", log_level,
                 "trace|debug|info|warn|error|off (default: $DTRUN_LOG_LEVEL or info)");
  app.add_option("--max-value-mb", max_value_mb, "largest value accepted, in MiB")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.set_version_flag("--version", "dtstore " DTRUN_VERSION " (git " DTRUN_GIT_COMMIT ")",
                       "print dtstore's version and git commit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (!dtrun::SetLogLevel(log_level)) {
    std::fprintf(stderr, "dtstore: unknown --log-level '%s'; use one of "
                 "trace, debug, info, warn, error, off\n", log_level.c_str());
    return 2;
  }
  opts.limits.max_value_bytes = max_value_mb << 20;
  RaiseFdLimit();

  // Block the stop signals before the loop thread starts, so only
  // sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = dtrun::rdzv::StoreServer::Start(opts);
  if (!server.ok()) {
    std::fprintf(stderr, "dtstore: %s\n", server.status().message().c_str());
    return 3;
  }
  std::string host = (*server)->host();
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  std::printf("listening on %s:%u\n", host.c_str(), unsigned((*server)->port()));
  std::fflush(stdout);
  (*server)->RunInBackground();
  int sig = 0;
  sigwait(&stop, &sig);
  dtrun::Logger("dtrun.store")->info("received signal {}; shutting down", sig);
  (*server)->Stop();
  return 0;
}
