#pragma once

// train_cfg's config: a TOML file's text and --set section.key=value
// overrides into a TrainConfig, every section, key, type and choice
// checked. Apart from train_cfg's main so that it is fuzzed
// (tests/fuzz/parsers_fuzz.cc) and tested without libtorch.

#include <string>
#include <vector>

#include "lib/faults.h"
#include "lib/train_config.h"

namespace dtrun::examples {

// "" and *out filled (and *faults, when given, from the [fault] table: what
// tests and demos inject through SetFaults), or what is wrong, naming the
// key (or the line of `text`, with `source` for the file's name): train_cfg
// exits 2 with it.
// `sets` are --set's arguments, applied in order over the file's values.
// Never throws for any `text` or `sets`.
std::string ReadTrainConfig(const std::string& text, const std::string& source,
                            const std::vector<std::string>& sets,
                            dtrun::train::TrainConfig* out,
                            dtrun::train::Faults* faults = nullptr);

}  // namespace dtrun::examples
