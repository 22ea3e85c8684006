// Background checkpoints (background_checkpointer.h): the loop's copy, the
// saver's thread, and the node's memory copies they resume from first.
#include "lib/checkpointing/background_checkpointer.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <thread>

#include "lib/formats/checkpoint_payload.h"
#include "lib/faults.h"
#include "rendezvous/util/memory_checkpoint.h"

namespace dtrun::train {

BackgroundCheckpointer::BackgroundCheckpointer(const CheckpointContext& ctx)
    : Checkpointer(ctx), staging_(ctx.device) {
  if (c_.checkpoint_mode != CheckpointMode::kMemory) return;
  copies_ = NodeCopies::FromEnv(dist_.env().local_rank, c_.checkpoint_dir);
  if (!copies_ && rank_ == 0) {
    std::fprintf(stderr,
                 "checkpoint.mode = \"memory\": this launcher keeps no "
                 "shared-memory copies (dtrun does); checkpoints are "
                 "written as in \"async\" mode\n");
  }
}

bool BackgroundCheckpointer::Whole() const {
  return rank_ == 0 || (copies_ && dist_.env().local_rank == 0);
}

std::vector<std::string> BackgroundCheckpointer::MemoryFilesOf(
    int64_t step) const {
  std::vector<std::string> names{CheckpointDir::StepName(step)};
  if (c_.strategy == StrategyKind::kFsdp)
    names.push_back(CheckpointDir::ShardName(step, rank_));
  return names;
}

// Every rank must find the same step on its node, none older than the
// folder's newest: the step is the smallest of the ranks' newest, and any
// rank that cannot read it sends every rank to the folder.
// All-reduces decide it, so every rank takes the same path even when the
// nodes' memories differ (a node that was replaced has none): a rank that
// holds nothing says -1 and the whole group reads the folder. A copy is
// trusted only once its checksum verifies, as a file's would be: its
// header at once, its blocks as the restore copies them.
int64_t BackgroundCheckpointer::ResumeFromCopies() {
  if (c_.checkpoint_mode != CheckpointMode::kMemory) return -1;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> on_disk = dir_.Steps();
  const int64_t disk = on_disk.empty() ? 0 : on_disk.front();
  int64_t mine = -1;
  if (copies_) {
    copies_->Scan();
    // A DDP step file holds the whole state and loads on any world size
    // (a node lost, the survivors go on); FSDP's shards are cut for the
    // world that saved them.
    const int64_t world = c_.strategy == StrategyKind::kFsdp ? world_ : -1;
    mine = copies_->Newest([this](int64_t s) { return MemoryFilesOf(s); },
                           std::max<int64_t>(disk, 1), world);
    if (dist_.env().local_rank == 0) {
      for (const auto& u : copies_->unusable())
        std::fprintf(stderr, "checkpoint copy not used: %s\n", u.c_str());
    }
  }
  const int64_t step = AllMin(mine);
  StepFile file;
  Status loaded = Status::Invalid("not every rank holds a copy of a step");
  if (step > 0) loaded = LoadFromMemory(step, &file);
  if (!AllLoaded(step, file, loaded)) {
    strategy_.Discard();
    if (rank_ == 0 && copies_ && dist_.env().restart_count > 0) {
      std::printf(
          "no memory copy to resume from (%s; the folder's newest "
          "is step %lld): resuming from disk\n",
          step > 0 ? "a rank's copy does not load"
                   : "not every rank's node holds one",
          (long long)disk);
    }
    return -1;
  }
  if (!RestoredFromCopy(step, &file)) return -1;
  if (rank_ == 0) {
    std::printf(
        "resumed from memory at step %lld (copies in %s; the folder's newest "
        "is step %lld; read in %.1f ms)\n",
        (long long)step, copies_->where().c_str(), (long long)disk,
        MsSince(start));
  }
  return step;
}

// The copy's blocks are verified as the state is copied out of it (one
// pass over it): a block that does not match leaves this rank's model a
// mix, and every rank goes on to the folder, whose restore overwrites it
// all (or, with none there, Resume() refuses to start from it). The bad
// copy is set aside so that no restart reads it again.
bool BackgroundCheckpointer::RestoredFromCopy(int64_t step, StepFile* file) {
  Status restored = Restore(*file);
  *file = StepFile();  // lets go of the copy and its lock
  if (!restored.ok()) {
    std::fprintf(stderr, "rank %d: memory copy of step %lld: %s\n", rank_,
                 (long long)step, restored.message().c_str());
    copies_->SetAside(step, CheckpointDir::StepName(step));
  }
  if (AllMin(restored.ok() ? 1 : 0) == 1) return true;
  strategy_.Discard();
  restore_spoiled_ = step;
  if (rank_ == 0) {
    std::printf(
        "the memory copy of step %lld did not verify as it was loaded (a "
        "rank's; set aside): resuming from disk\n",
        (long long)step);
  }
  return false;
}

// A copy of a history given up is refused like a stale file, and every
// rank's copy must be of one epoch: a node that was cut off keeps copies
// of the history the others gave up.
bool BackgroundCheckpointer::AllLoaded(int64_t step, const StepFile& file,
                                       Status loaded) {
  const std::string stale =
      loaded.ok() ? AbandonedBy(epochs_, file.epoch, step) : "";
  if (!stale.empty()) loaded = Status::Invalid(stale);
  const int64_t none = std::numeric_limits<int64_t>::max();
  const int64_t newest = -AllMin(loaded.ok() ? -file.epoch : -none);
  if (loaded.ok() && file.epoch < newest) {
    loaded = Status::Invalid("written in epoch " + std::to_string(file.epoch) +
                             ", other ranks' copies in epoch " +
                             std::to_string(newest) +
                             ": a history given up (a node cut off from the "
                             "job kept it)");
  }
  if (!loaded.ok() && step > 0)
    std::fprintf(stderr, "rank %d: memory copy of step %lld: %s\n", rank_,
                 (long long)step, loaded.message().c_str());
  return AllMin(loaded.ok() ? 1 : 0) == 1;
}

Status BackgroundCheckpointer::LoadFromMemory(int64_t step, StepFile* file) {
  auto payload =
      copies_->Read(step, CheckpointDir::StepName(step), VerifyWhen::kAsCopied);
  auto tensors = payload.ok() ? DecodeTensors(*payload)
                              : Result<TensorMap>(payload.status());
  auto parsed = tensors.ok() ? StepFile::FromTensors(std::move(*tensors))
                             : Result<StepFile>(tensors.status());
  if (!parsed.ok()) return parsed.status();
  *file = std::move(*parsed);
  file->unverified = std::move(*payload);
  Strategy::ShardSource source;
  source.read = [this](int64_t s, int r) {
    return copies_->Read(s, CheckpointDir::ShardName(s, r));
  };
  source.own_only = true;
  source.where = copies_->where();
  return strategy_.Complete(file->parts, source, step);
}

// The loop only copies; the saver's thread writes in the sync mode's order
// (every shard durable, then the step's file).
void BackgroundCheckpointer::Save(int64_t done, const StepActions& actions) {
  const auto start = std::chrono::steady_clock::now();
  Wait(done);
  SaveJob job;
  // Gathered before the copy, whose device-to-host transfer the gather's
  // own small one would queue behind.
  GatherRngStates(&job.file);
  job.whole = Whole();
  staging_.Begin();
  Strategy::Snapshot copy = strategy_.Copy(opt_, job.whole, staging_.copier());
  job.ready = staging_.End();
  job.file.parts = std::move(copy.parts);
  job.shard = std::move(copy.shard);
  job.encode = std::move(copy.encode);
  Stamp(done, &job.file);
  // fault.kill_in = "copy": the copy is made and nothing of it written,
  // so the newest copy anywhere is the previous checkpoint's.
  if (actions.kill_in_checkpoint &&
      InjectedFaults().kill_in == KillPoint::kCopy)
    KillSelf(rank_, done, "once it copied the checkpoint");
  job.step = done;
  job.durable_key = dist_.attempt_prefix() + "dtrun_ckpt/" +
                    std::to_string(done) + "/durable/";
  job.persist = actions.persist;
  job.kill = actions.kill_in_checkpoint;  // kill_in = "write"
  StartSave(std::move(job));
  if (rank_ == 0) {
    std::printf("checkpoint step %lld: training waited %.1f ms (%s%s)\n",
                (long long)done, MsSince(start),
                copies_ ? "memory: the copy; written to shared memory in the "
                          "background"
                        : "async: the copy; written in the background",
                copies_ && actions.persist ? ", and to disk" : "");
  }
}

// At most one write in flight: one still running when the next checkpoint
// is due is waited for and said, never skipped; one that failed fails the
// run as a sync write would (the last good checkpoint stays the newest).
void BackgroundCheckpointer::Wait(int64_t due) {
  const bool was_running = saver_.running();
  AsyncSave::Finished f = saver_.Wait();
  if (f.step < 0) return;
  if (!f.status.ok())
    throw Error(NotSaved(f.step, f.status.message() + " (in the background)"));
  if (!unpersisted_.empty()) {
    const std::string why = std::move(unpersisted_);
    unpersisted_.clear();
    // The run's end (or a stop) must leave it on disk; until then the copy
    // in this node's memory holds it, and the next persist retries.
    if (due < 0) throw Error(NotSaved(f.step, why + " (kept in memory)"));
    std::fprintf(stderr,
                 "rank %d: checkpoint step %lld is in this node's memory but "
                 "not on disk: %s; the next persist (checkpoint.persist_every) "
                 "retries\n",
                 rank_, (long long)f.step, why.c_str());
  }
  if (rank_ != 0) return;
  if (was_running) {
    std::printf(
        "checkpoint step %lld: still being written when %s; training waited "
        "%.1f ms for it (write %.1f ms)\n",
        (long long)f.step,
        due < 0 ? "the run ended"
                : ("step " + std::to_string(due) + " was due").c_str(),
        f.waited_s * 1000, f.write_s * 1000);
  } else {
    std::printf("checkpoint step %lld: written in the background in %.1f ms\n",
                (long long)f.step, f.write_s * 1000);
  }
}

void BackgroundCheckpointer::Settle() {
  abandon_ = true;
  AsyncSave::Finished f = saver_.Wait();
  abandon_ = false;
  unpersisted_.clear();
  if (f.step >= 0 && !f.status.ok()) {
    std::fprintf(stderr,
                 "rank %d: checkpoint step %lld not finished: %s (the group "
                 "re-forms in place)\n",
                 rank_, (long long)f.step, f.status.message().c_str());
  }
}

// The other ranks' shards durable, in slices, so that Settle() ends the
// wait for one whose rank died.
Status BackgroundCheckpointer::WaitForShards(
    const std::vector<std::string>& keys) {
  const auto deadline =
      std::chrono::steady_clock::now() + save_store_->timeout();
  for (;;) {
    Status s = save_store_->Wait(keys, std::chrono::milliseconds(100));
    if (s.code() != Status::Code::kTimeout) return s;
    if (abandon_) return Status::Unavailable("a rank's shard never came");
    if (std::chrono::steady_clock::now() >= deadline) return s;
  }
}

// From a GPU: the pinned buffers made once.
void BackgroundCheckpointer::Reserve() {
  if (!staging_.staged()) return;
  const auto start = std::chrono::steady_clock::now();
  staging_.Begin();
  strategy_.Copy(opt_, Whole(), staging_.copier());
  staging_.End().Wait();
  staging_.Fence();
  if (rank_ == 0) {
    std::printf(
        "checkpoint buffers: %.1f MB of pinned host memory, made in "
        "%.1f ms\n",
        static_cast<double>(staging_.pinned_bytes()) / 1e6, MsSince(start));
  }
}

void BackgroundCheckpointer::StartSave(SaveJob job) {
  if (job.shard && !save_store_) save_store_ = dist_.ConnectStore();
  saver_.Start(job.step, [this, job = std::move(job)]() mutable {
    return WriteSave(job);
  });
}

// The saver's thread. In memory mode the copy comes first and alone on
// most checkpoints: a worker that dies later still leaves it to dtrun,
// which persists it; every persist_every-th one then also goes to disk,
// exactly as an async checkpoint would, so a node that dies loses at most
// the steps since then.
Status BackgroundCheckpointer::WriteSave(SaveJob& job) {
  job.ready.Wait();
  // [fault] save_delay_ms: a slow disk
  if (const int delay_ms = InjectedFaults().save_delay_ms; delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  Encoded e;
  if (job.shard) {
    e.shard_payload = EncodeTensors(*job.shard, c_.payload_format);
    e.shard_header = CheckpointHeader(e.shard_payload, c_.checksum);
  }
  if (job.whole) {
    if (job.encode) {
      for (auto& [name, t] : job.encode()) job.file.parts[name] = std::move(t);
    }
    e.step_payload = EncodeTensors(job.file.ToTensors(), c_.payload_format);
    e.step_header = CheckpointHeader(e.step_payload, c_.checksum);
  }
  // fault.kill_in = "write": halfway through this rank's first write,
  // the memory copy's in memory mode, else the file's.
  std::function<void()> halfway;
  if (job.kill)
    halfway = [this, &job] {
      KillSelf(rank_, job.step, "halfway through the write");
    };
  if (!copies_) return WriteToDisk(job, e, halfway);
  Status s = WriteCopies(job, e, halfway);
  if (!s.ok() || !job.persist) return s;
  Status disk = WriteToDisk(job, e, nullptr);
  if (!disk.ok()) unpersisted_ = disk.message();
  return Status::Ok();
}

Status BackgroundCheckpointer::WriteCopies(
    const SaveJob& job, const Encoded& e,
    const std::function<void()>& halfway) {
  namespace mc = memory_checkpoint;
  std::vector<mc::FileToWrite> files;
  if (job.shard) {
    files.push_back({CheckpointDir::ShardName(job.step, rank_), e.shard_header,
                     e.shard_payload.pieces, 0});
  }
  if (job.whole) {
    files.push_back({CheckpointDir::StepName(job.step), e.step_header,
                     e.step_payload.pieces, job.shard ? world_ : 0});
  }
  if (files.empty()) return Status::Ok();
  // fault.damage_copy_at_step: one byte of the step's payload flipped in
  // the copy only (the checksum was taken before; the disk gets the good).
  char* damaged = nullptr;
  if (job.whole && job.step == InjectedFaults().damage_copy_at_step &&
      dist_.env().restart_count == 0) {
    const auto& pieces = e.step_payload.pieces;
    const std::string_view& big =
        *std::max_element(pieces.begin(), pieces.end(),
                          [](auto a, auto b) { return a.size() < b.size(); });
    damaged = const_cast<char*>(big.data() + big.size() / 2);
    *damaged ^= 1;
  }
  Status s = copies_->Write(job.step, world_, rank_, files, halfway);
  if (damaged) *damaged ^= 1;
  return s;
}

// Each rank's shard is durable before the step's file names it: the
// saver's thread says so through the store (a key per rank and step), and
// rank 0's thread waits for every rank's key before it writes the step's
// file. No collective runs off the loop's thread.
Status BackgroundCheckpointer::WriteToDisk(
    const SaveJob& job, const Encoded& e,
    const std::function<void()>& halfway) {
  const std::string& key = job.durable_key;
  // fault.kill_in = "write": once half of this rank's first file is out
  auto half = [&halfway](size_t total) -> std::function<void(size_t)> {
    if (!halfway) return nullptr;
    return [&halfway, total](size_t written) {
      if (written >= total / 2) halfway();
    };
  };
  // A shard that could not be written is said too ("failed"), so that
  // rank 0 does not wait for it.
  if (job.shard) {
    Status s =
        WriteCheckpointFile(dir_.ShardPath(job.step, rank_), e.shard_payload,
                            half(e.shard_payload.size()), e.shard_header);
    Status said =
        save_store_->Set(key + std::to_string(rank_), s.ok() ? "1" : "failed");
    if (!s.ok()) return s;
    if (!said.ok()) return said;
  }
  if (rank_ != 0) return Status::Ok();
  if (job.shard) {
    std::vector<std::string> keys;
    for (int r = 0; r < world_; ++r) keys.push_back(key + std::to_string(r));
    Status s = WaitForShards(keys);
    if (!s.ok()) return s;
    for (int r = 0; r < world_; ++r) {
      Result<std::string> v = save_store_->Get(keys[static_cast<size_t>(r)]);
      if (!v.ok()) return v.status();
      if (*v != "1") {
        return Status::Io("rank " + std::to_string(r) +
                          " could not write its shard (its log says why)");
      }
    }
  }
  dir_.on_chunk = job.shard ? nullptr : half(e.step_payload.size());
  return dir_.Write(job.step, e.step_payload, e.step_header);
}

}  // namespace dtrun::train
