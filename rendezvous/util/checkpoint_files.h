#pragma once

// A checkpoint folder's file names, spelled once for both sides: the
// training library writes and reads them (lib/checkpoint.h), dtrun persists
// memory copies under them (memory_checkpoint.h). No libtorch.
//
//   ckpt_<step, 12 digits>.dtck                 a step's file
//   ckpt_<step, 12 digits>.shard_<rank>.dtck    an FSDP rank's shard of it
//   epochs.dtck                                 the folder's epochs
//   <name>.abandoned                            a file of a history given up
//   <name>.tmp.<pid>                            a write in progress

#include <cstdint>
#include <string>

namespace dtrun::checkpoint_files {

inline constexpr char kEpochsName[] = "epochs.dtck";
inline constexpr char kAbandonedSuffix[] = ".abandoned";

// Zero-padded so that names sort as steps do.
std::string StepName(int64_t step);
std::string ShardName(int64_t step, int64_t rank);

// The step a step file's name carries ("ckpt_<digits>.dtck" exactly;
// temporary and set-aside files never count), else -1.
int64_t StepOfName(const std::string& name);
// The step and rank a shard's name carries, else false.
bool ShardOfName(const std::string& name, int64_t* step, int64_t* rank);
// A name a memory copy may carry: a checkpoint file's, with no path in it.
bool IsCheckpointName(const std::string& name);

}  // namespace dtrun::checkpoint_files
