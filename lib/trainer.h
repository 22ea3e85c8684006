#pragma once

#include "lib/train_config.h"

namespace dtrun::train {

// Runs (or resumes, from the newest good checkpoint) a data-parallel (DDP) or
// fully sharded (FSDP) training run in the process group of the launcher's
// environment. A checkpoint holds the model, the optimizer, the step (which
// fixes the sampler's position) and every rank's RNG state; an FSDP sharded
// checkpoint saved on N ranks resumes on any number of ranks. Rank 0 prints
// progress lines and a last line
//   done: steps=N loss=L eval_accuracy=A params_sha256=H
// Returns the process exit code. Throws dtrun::train::Error on setup errors;
// an error of the run itself is also written to $TORCHELASTIC_ERROR_FILE
// (torchrun's format, dist_env.h) before the process group closes, so that
// the launcher names this rank, not a peer that lost its connection.
int Train(const TrainConfig& config);

}  // namespace dtrun::train
