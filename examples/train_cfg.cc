// train_cfg CONFIG.toml [--set section.key=value ...] [--sample N]
// A config-driven DDP/FSDP trainer on dtrun's library. Run it under
// dtrun (or torchrun): dtrun --nproc-per-node=2 train_cfg
// examples/configs/digits_ddp.toml Exit codes: 0 done, 2 bad config or flag, 1
// training error.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "examples/train_cfg_config.h"
#include "lib/process_group.h"
#include "lib/standby_worker.h"
#include "lib/trainer.h"

namespace {

// A bad config or flag: what is wrong, the usage line, and exit code 2
// (argparse's, as the launcher's own usage errors), before anything starts.
int Usage(const std::string& why) {
  std::fprintf(stderr,
               "train_cfg: %s\nusage: train_cfg CONFIG.toml [--set "
               "section.key=value ...] [--sample N]\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Under dtrun --standby this process may be the node's standby: then the
  // workers it forks go on from here, libtorch already loaded.
  dtrun::train::ServeStandbyIfAsked(&argc, &argv);
  // Line by line, even into a pipe: a rank stopped with its group (the
  // launcher's SIGTERM) would lose the lines stdio still held.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) return Usage("no config file given");
  std::ifstream file(argv[1]);
  if (!file) {
    return Usage(std::string(argv[1]) + ": cannot read it (" +
                 std::strerror(errno) + ")");
  }
  const std::string text{std::istreambuf_iterator<char>(file),
                         std::istreambuf_iterator<char>()};
  // --set section.key=value overrides, applied over the file in order.
  std::vector<std::string> sets;
  long long sample = -1;  // --sample N: characters to generate, not train
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--sample" && i + 1 < argc) {
      char* end = nullptr;
      sample = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || sample < 1)
        return Usage("--sample takes a number of characters >= 1");
      continue;
    }
    if (arg != "--set" || i + 1 >= argc)
      return Usage("unexpected argument '" + arg + "'");
    sets.push_back(argv[++i]);
  }
  dtrun::train::TrainConfig config;
  dtrun::train::Faults faults;  // [fault]: for tests and demos
  std::string err =
      dtrun::examples::ReadTrainConfig(text, argv[1], sets, &config, &faults);
  if (!err.empty()) return Usage(err);
  dtrun::train::SetFaults(faults);
  if (sample > 0 && config.model != dtrun::train::ModelKind::kGpt)
    return Usage("--sample generates text: it needs model.type = \"gpt\"");
  try {
    if (sample > 0) return dtrun::train::SampleGpt(config, sample);
    return dtrun::train::Train(config);
  } catch (const std::exception& e) {
    // Train() wrote the launcher's error file (TORCHELASTIC_ERROR_FILE)
    std::fprintf(stderr, "train_cfg: %s\n", e.what());
    return 1;
  }
}
