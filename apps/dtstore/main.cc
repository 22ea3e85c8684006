// dtstore: a standalone c10d-compatible TCP store server.
//   dtstore --host H --port P [--log-level L] [--max-value-mb N]
// Prints "listening on H:P" as its first stdout line; exits 0 on
// SIGTERM/SIGINT, 2 on a bad flag, 3 when it cannot listen.
// A thin shell over rendezvous/store_server: flags, fd limit, signals. The
// server runs on its own thread; main only waits for a stop signal.

#include <signal.h>

#include <cstdio>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "dtrun_version.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/name_lookup.h"
#include "rendezvous/util/os_util.h"
#include "rendezvous/store_server.h"

namespace {

// dtstore's exit codes (the header comment's).
enum ExitCode : int { kExitStopped = 0, kExitUsage = 2, kExitCannotListen = 3 };

// Reads the flags into `opts` and sets the log level. Returns the exit code
// when dtstore should stop now (0 after --help/--version, kExitUsage on a bad
// flag), or nothing to go on.
std::optional<int> ParseFlags(int argc, char** argv,
                              dtrun::rendezvous::StoreServerOptions* out) {
  CLI::App app{"dtrun's standalone c10d TCPStore-compatible store server"};
  dtrun::rendezvous::StoreServerOptions& opts = *out;
  std::string log_level;
  // Bounded because a value's length comes from the client: a port scanner's
  // bytes once made torch's store allocate gigabytes (pytorch#106294). 64 MiB
  // is well above torch's own 8 MiB libuv limit.
  uint64_t max_value_mb = 64;
  app.add_option("--host", opts.host,
                 "address to bind ('::' = all, dual-stack)")
      ->capture_default_str();
  app.add_option("--port", opts.port, "port to listen on; 0 picks a free one")
      ->capture_default_str();
  app.add_option(
      "--log-level", log_level,
      "trace|debug|info|warn|error|off (default: $DTRUN_LOG_LEVEL or info)");
  app.add_option("--max-value-mb", max_value_mb,
                 "largest value accepted, in MiB")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.set_version_flag("--version",
                       "dtstore " DTRUN_VERSION " (git " DTRUN_GIT_COMMIT ")",
                       "print dtstore's version and git commit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitStopped : kExitUsage;
  }
  if (!dtrun::SetLogLevel(log_level)) {
    std::fprintf(stderr,
                 "dtstore: unknown --log-level '%s'; use one of "
                 "trace, debug, info, warn, error, off\n",
                 log_level.c_str());
    return kExitUsage;
  }
  opts.limits.max_value_bytes = max_value_mb << 20;
  return std::nullopt;
}

// Block the stop signals before the loop thread starts, so only sigwait in
// main receives them. Returns the blocked set.
sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  // A client that disconnects while its reply is written must cost an EPIPE
  // on that connection, not the whole server.
  signal(SIGPIPE, SIG_IGN);
  return stop;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any lookup and any thread (name_lookup.h).
  dtrun::os::UseBuiltinNameLookup();
  dtrun::rendezvous::StoreServerOptions opts;
  if (std::optional<int> rc = ParseFlags(argc, argv, &opts)) return *rc;
  dtrun::os::RaiseFileLimit();  // 1.13 clients open two connections each
  sigset_t stop = BlockStopSignals();

  auto server = dtrun::rendezvous::StoreServer::Start(opts);
  if (!server.ok()) {
    std::fprintf(stderr, "dtstore: %s\n", server.status().message().c_str());
    return kExitCannotListen;
  }
  // With --port 0 this line is how a caller learns the port, so it comes only
  // once the socket listens and is flushed at once (stdout is a pipe there,
  // fully buffered). IPv6 hosts get brackets so the line splits at the last
  // colon like any endpoint.
  std::string host = (*server)->host();
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  std::printf("listening on %s:%u\n", host.c_str(),
              unsigned((*server)->port()));
  std::fflush(stdout);
  (*server)->RunInBackground();
  // Stop joins the loop thread and closes every connection, so a supervisor's
  // SIGTERM ends with exit code 0, not a kill.
  int sig = 0;
  sigwait(&stop, &sig);
  dtrun::Logger("dtrun.store")->info("received signal {}; shutting down", sig);
  (*server)->Stop();
  return kExitStopped;
}
