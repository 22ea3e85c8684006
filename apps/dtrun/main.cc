// dtrun: a drop-in for torchrun. Composition root only: parse the command
// line, build the real objects, run, map the outcome to an exit code.
#include <cstdio>

#include "apps/dtrun/cli.h"
#include "apps/dtrun/clock.h"
#include "apps/dtrun/interactive.h"
#include "apps/dtrun/launcher.h"
#include "apps/dtrun/posix_spawner.h"
#include "rendezvous/log.h"

int main(int argc, char** argv) {
  using namespace dtrun::agent;
  CliResult cli = ParseCommandLine(argc, argv);
  if (cli.exit_code >= 0) return cli.exit_code;
  if (!dtrun::SetLogLevel(cli.config.log_level)) {
    std::fprintf(stderr, "dtrun: --log-level: unknown level '%s'; use trace, debug, info, "
                 "warn, error or off\n", cli.config.log_level.c_str());
    return 2;
  }
  if (cli.config.interactive) return RunInteractive(cli.config);
  PosixSpawner spawner;
  SteadyClock clock;
  Launcher launcher(cli.config, &spawner, &clock);
  return launcher.Run();
}
