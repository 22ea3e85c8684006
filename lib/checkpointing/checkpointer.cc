// The checkpointer's shared half (resume, epochs, the failure message) and
// the sync mode; the background modes are background_checkpointer.cc's.
#include "lib/checkpointing/checkpointer.h"

#include <signal.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdio>
#include <cstdlib>

#include "lib/checkpointing/background_checkpointer.h"
#include "lib/formats/checkpoint_payload.h"
#include "rendezvous/util/check.h"

namespace dtrun::train {
namespace {

// The loop waits until the checkpoint is durable: the strategy writes its
// part (FSDP: every shard), rank 0 the step's file, last.
class SyncCheckpointer : public Checkpointer {
 public:
  explicit SyncCheckpointer(const CheckpointContext& ctx) : Checkpointer(ctx) {}

  void Save(int64_t done, const StepActions&) override {
    const auto start = std::chrono::steady_clock::now();
    StepFile file;
    GatherRngStates(&file);
    file.parts = strategy_.Save(opt_, dir_, done);
    Stamp(done, &file);
    if (rank_ == 0) {
      const Payload payload =
          EncodeTensors(file.ToTensors(), c_.payload_format);
      Status s =
          dir_.Write(done, payload, CheckpointHeader(payload, c_.checksum));
      if (!s.ok()) throw Error(NotSaved(done, s.message()));
    }
    // nobody runs ahead of a checkpoint in progress
    dist_.pg().barrier()->wait();
    if (rank_ == 0) {
      std::printf("checkpoint step %lld: training waited %.1f ms (sync)\n",
                  (long long)done, MsSince(start));
    }
  }
};

}  // namespace

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
}

void KillSelf(int rank, int64_t step, const char* where) {
  std::fprintf(stderr,
               "fault injection: rank %d kills itself %s of step %lld\n", rank,
               where, (long long)step);
  std::fflush(stderr);
  raise(SIGKILL);
  std::abort();
}

std::unique_ptr<Checkpointer> Checkpointer::Make(const CheckpointContext& ctx) {
  if (ctx.config->checkpoint_dir.empty()) return nullptr;
  if (ctx.config->checkpoint_mode == CheckpointMode::kSync)
    return std::make_unique<SyncCheckpointer>(ctx);
  return std::make_unique<BackgroundCheckpointer>(ctx);
}

Checkpointer::Checkpointer(const CheckpointContext& ctx)
    : c_(*ctx.config),
      dist_(*ctx.dist),
      strategy_(*ctx.strategy),
      opt_(*ctx.opt),
      device_(ctx.device),
      rank_(ctx.dist->rank()),
      world_(ctx.dist->world_size()),
      dir_(ctx.config->checkpoint_dir, ctx.config->keep_checkpoints) {}

int64_t Checkpointer::Resume() {
  epochs_ = dir_.Epochs();
  int64_t start = ResumeFromCopies();
  if (start >= 0) {
    source_ = "memory";
  } else {
    source_ = "disk";
    start = ResumeFromFolder();
  }
  // Every rank: a failed restore touched every rank's model.
  if (start == 0 && restore_spoiled_ >= 0) {
    throw Error(
        "the memory copy of step " + std::to_string(restore_spoiled_) +
        " did not verify as it was loaded, after part of it was in the "
        "model, and " +
        c_.checkpoint_dir +
        " holds no checkpoint to load instead: the copy is set aside, and "
        "the next restart starts from step 0");
  }
  if (start == 0) source_ = "none";
  BeginEpoch(start);
  return start;
}

// The newest checkpoint that loads and whose other files verify, the same
// on every rank; the step to start from (0 when there is none).
int64_t Checkpointer::ResumeFromFolder() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> skipped;
  StepFile file;
  auto accept = [&](const CheckpointDir::Loaded& l) {
    auto tensors = DecodeTensors(l.payload);
    auto parsed = tensors.ok() ? StepFile::FromTensors(std::move(*tensors))
                               : Result<StepFile>(tensors.status());
    if (!parsed.ok()) return parsed.status();
    const std::string stale = AbandonedBy(epochs_, parsed->epoch, l.step);
    if (!stale.empty()) return Status::Invalid(stale);
    file = std::move(*parsed);
    return strategy_.Complete(file.parts, Strategy::FolderShards(dir_), l.step);
  };
  auto loaded = AgreedLatest(&skipped, accept);
  if (rank_ == 0) {
    for (const auto& s : skipped)
      std::fprintf(stderr, "checkpoint skipped: %s\n", s.c_str());
  }
  if (!loaded) return 0;
  Status restored = Restore(file);  // verified: the copies cannot fail
  DTRUN_CHECK(restored.ok()) << restored.message();
  if (rank_ == 0) {
    std::printf(
        "resumed from %s at step %lld (saved on %lld ranks; read in %.1f "
        "ms)\n",
        loaded->path.c_str(), (long long)file.step, (long long)file.world_size,
        MsSince(start));
  }
  return file.step;
}

// The ranks may see different folders (one per node), or one folder at
// different moments (a checkpoint being persisted while they look): each
// loads its newest, and until they agree every rank loads again the newest
// at or before the oldest of theirs. A rank with none sends every rank to
// step 0. Without this, ranks resumed from different steps would train
// apart without a word (DDP broadcasts no parameters after a restore).
std::optional<CheckpointDir::Loaded> Checkpointer::AgreedLatest(
    std::vector<std::string>* skipped,
    const std::function<Status(const CheckpointDir::Loaded&)>& accept) {
  auto loaded = dir_.LoadLatest(skipped, accept);
  for (;;) {
    const int64_t mine = loaded ? loaded->step : 0;
    const int64_t oldest = AllMin(mine), newest = -AllMin(-mine);
    if (oldest == newest) return loaded;
    if (rank_ == 0) {
      std::fprintf(stderr,
                   "the ranks' newest checkpoints differ (steps %lld to "
                   "%lld): every rank resumes from step %lld or before\n",
                   (long long)oldest, (long long)newest, (long long)oldest);
    }
    if (oldest == 0) {
      strategy_.Discard();
      return std::nullopt;
    }
    if (mine > oldest) loaded = dir_.LoadLatest(skipped, accept, oldest);
  }
}

Status Checkpointer::Restore(const StepFile& file) {
  Status s = strategy_.Restore(
      file.parts, opt_, file.unverified.pending ? &file.unverified : nullptr);
  if (s.ok()) RestoreRng(file);
  return s;
}

// Bitwise resume needs each rank's generator exactly where it was (dropout
// draws from it). On another world size rank r's saved stream belongs to a
// different slice of the batch, so the ranks reseed from the step instead.
void Checkpointer::RestoreRng(const StepFile& file) {
  if (file.world_size == world_ &&
      static_cast<size_t>(rank_) < file.rng.size()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(file.rng[static_cast<size_t>(rank_)]);
    if (device_.is_cuda() &&
        static_cast<size_t>(rank_) < file.cuda_rng.size()) {
      at::Generator cuda = at::globalContext().defaultGenerator(device_);
      cuda.set_state(file.cuda_rng[static_cast<size_t>(rank_)]);
    }
  } else {
    torch::manual_seed(RankSeed(c_, rank_, file.step));
  }
}

// Records the folder's next epoch, resumed from `start` (rank 0), and
// shares its number with every rank. Without the record (a full or
// read-only folder) the epoch is still one more than the newest read, but
// a file it writes cannot be told from a cut-off node's: said once.
void Checkpointer::BeginEpoch(int64_t start) {
  int64_t epoch = 0;
  if (rank_ == 0) {
    auto begun = dir_.BeginEpoch(start, world_);
    epoch =
        begun.ok() ? *begun : (epochs_.empty() ? 0 : epochs_.back().epoch) + 1;
    if (!begun.ok()) {
      std::fprintf(stderr, "epoch %lld not recorded in %s: %s\n",
                   (long long)epoch, dir_.dir().c_str(),
                   begun.status().message().c_str());
    }
  }
  epoch_ = -AllMin(-epoch);
}

std::string Checkpointer::NotSaved(int64_t step, const std::string& why) const {
  const std::vector<int64_t> steps = dir_.Steps();
  std::string newest = "none";
  for (int64_t s : steps) {
    if (s < step) {
      newest = "step " + std::to_string(s) + " (it still loads)";
      break;
    }
  }
  return "checkpoint at step " + std::to_string(step) + " not saved: " + why +
         ". The newest checkpoint in " + dir_.dir() + " is " + newest +
         "; free space there (or make it writable), or set checkpoint.dir to "
         "another folder, then resume";
}

// The generators as the next step finds them: restored, a resumed run's
// dropout masks are those of an unbroken one, on the CPU and on a GPU.
void Checkpointer::GatherRngStates(StepFile* file) {
  ProcessGroup& pg = dist_.pg();
  auto gather = [&](const at::Generator& gen) {
    torch::Tensor mine = gen.get_state().to(device_);
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < pg.getSize(); ++r)
      out[0].push_back(torch::empty_like(mine));
    std::vector<torch::Tensor> in{mine};
    pg.allgather(out, in)->wait();
    for (auto& t : out[0]) t = t.to(torch::kCPU);
    return out[0];
  };
  file->rng = gather(at::detail::getDefaultCPUGenerator());
  if (device_.is_cuda())
    file->cuda_rng = gather(at::globalContext().defaultGenerator(device_));
}

int64_t Checkpointer::AllMin(int64_t v) {
  std::vector<torch::Tensor> t{torch::tensor({v}, torch::kLong).to(device_)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MIN;
  dist_.pg().allreduce(t, opts)->wait();
  return t[0].item<int64_t>();
}

void Checkpointer::Stamp(int64_t done, StepFile* file) const {
  file->step = done;
  file->world_size = world_;
  file->epoch = epoch_;
}

}  // namespace dtrun::train
