#include "lib/train_plan.h"
#include "lib/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>

#include <set>

namespace dtrun::train {
namespace {

class TrainPlanTest : public ::testing::Test {
 protected:
  TrainPlanTest() {
    c_.steps = 100;
    c_.checkpoint_dir = "/ckpt";
    c_.checkpoint_every = 30;
    c_.log_every = 20;
    c_.eval_every = 50;
  }
  // The steps (1..steps) after which `pick` is set on `rank`.
  std::vector<int64_t> StepsWhere(bool StepActions::*pick, int rank = 0,
                                  bool first = true) {
    std::vector<int64_t> out;
    for (int64_t done = 1; done <= c_.steps; ++done) {
      if (ActionsAfterStep(c_, f_, done, rank, first).*pick)
        out.push_back(done);
    }
    return out;
  }
  TrainConfig c_;
  Faults f_;
};

TEST_F(TrainPlanTest, CheckpointsEveryNAndAfterTheLastStep) {
  EXPECT_EQ(StepsWhere(&StepActions::checkpoint),
            (std::vector<int64_t>{30, 60, 90, 100}));
  EXPECT_EQ(StepsWhere(&StepActions::checkpoint, 3),
            (std::vector<int64_t>{30, 60, 90, 100}));
}

// Memory mode goes to disk every persist_every-th checkpoint, at the last
// step and at a stop; the other modes at every checkpoint.
TEST_F(TrainPlanTest, MemoryModePersistsEveryNthCheckpointAndTheLast) {
  c_.checkpoint_every = 10;
  EXPECT_EQ(StepsWhere(&StepActions::persist).size(), 10u);  // sync
  c_.checkpoint_mode = CheckpointMode::kMemory;
  c_.persist_every = 4;
  EXPECT_EQ(StepsWhere(&StepActions::persist),
            (std::vector<int64_t>{40, 80, 100}));
  c_.stop_after_step = 50;
  EXPECT_EQ(StepsWhere(&StepActions::persist),
            (std::vector<int64_t>{40, 50, 80, 100}));
}

TEST_F(TrainPlanTest, AKillInACheckpointFiresAtItsCheckpointNotAfterTheStep) {
  c_.checkpoint_mode = CheckpointMode::kAsync;
  f_.kill_rank = 1;
  f_.kill_at_step = 60;
  f_.kill_in = KillPoint::kCopy;
  EXPECT_TRUE(StepsWhere(&StepActions::kill, 1).empty());
  EXPECT_EQ(StepsWhere(&StepActions::kill_in_checkpoint, 1),
            (std::vector<int64_t>{60}));
  EXPECT_TRUE(StepsWhere(&StepActions::kill_in_checkpoint, 1, false).empty());
  EXPECT_EQ(ValidateFaults(c_, f_), "");
  f_.kill_at_step = 61;  // no checkpoint there
  EXPECT_NE(ValidateFaults(c_, f_).find("must be a checkpoint's step"),
            std::string::npos);
  f_.kill_at_step = 60;
  c_.checkpoint_mode = CheckpointMode::kSync;
  EXPECT_NE(ValidateFaults(c_, f_).find("needs checkpoint.mode"),
            std::string::npos);
}

TEST(ValidateConfigTest, MemoryModeRefusesTheFullFormat) {
  TrainConfig c;
  c.checkpoint_mode = CheckpointMode::kMemory;
  c.strategy = StrategyKind::kFsdp;
  EXPECT_EQ(ValidateConfig(c), "");
  c.checkpoint_format = CheckpointFormat::kFull;
  EXPECT_NE(ValidateConfig(c).find("use format = \"sharded\""),
            std::string::npos);
  c.checkpoint_format = CheckpointFormat::kSharded;
  c.persist_every = 0;
  EXPECT_NE(ValidateConfig(c).find("checkpoint.persist_every"),
            std::string::npos);
}

TEST_F(TrainPlanTest, NoCheckpointsWithoutAFolder) {
  c_.checkpoint_dir.clear();
  EXPECT_TRUE(StepsWhere(&StepActions::checkpoint).empty());
}

TEST_F(TrainPlanTest, LogsOnRankZeroEveryNAndAfterTheLastStep) {
  c_.log_every = 40;
  EXPECT_EQ(StepsWhere(&StepActions::log), (std::vector<int64_t>{40, 80, 100}));
  EXPECT_TRUE(StepsWhere(&StepActions::log, 1).empty());
}

TEST_F(TrainPlanTest, LogEveryZeroLogsOnlyTheLastStep) {
  c_.log_every = 0;
  EXPECT_EQ(StepsWhere(&StepActions::log), std::vector<int64_t>{100});
}

TEST_F(TrainPlanTest, EvaluatesEveryNOnEveryRankAndNeverWhenZero) {
  EXPECT_EQ(StepsWhere(&StepActions::eval, 2), (std::vector<int64_t>{50, 100}));
  c_.eval_every = 0;
  EXPECT_TRUE(StepsWhere(&StepActions::eval).empty());
}

TEST_F(TrainPlanTest, FaultsFireOnTheirRankAndStepOnTheFirstAttemptOnly) {
  f_.kill_rank = 1;
  f_.kill_at_step = 70;
  f_.hang_rank = 0;
  f_.hang_at_step = 17;
  EXPECT_EQ(StepsWhere(&StepActions::kill, 1), std::vector<int64_t>{70});
  EXPECT_TRUE(StepsWhere(&StepActions::kill, 0).empty());
  EXPECT_TRUE(StepsWhere(&StepActions::kill, 1, /*first=*/false).empty());
  EXPECT_EQ(StepsWhere(&StepActions::hang, 0), std::vector<int64_t>{17});
  EXPECT_TRUE(StepsWhere(&StepActions::hang, 0, /*first=*/false).empty());
}

TEST_F(TrainPlanTest, NoFaultsByDefault) {
  EXPECT_TRUE(StepsWhere(&StepActions::kill).empty());
  EXPECT_TRUE(StepsWhere(&StepActions::hang).empty());
}

TEST_F(TrainPlanTest, StopsAfterTheGivenStepOnEveryRankEvenOnARestart) {
  EXPECT_TRUE(StepsWhere(&StepActions::stop).empty());
  c_.stop_after_step = 10;
  EXPECT_EQ(StepsWhere(&StepActions::stop, 1, /*first=*/false),
            std::vector<int64_t>{10});
}

// nanoGPT's get_lr: learning_rate * (it + 1) / (warmup_iters + 1).
TEST_F(TrainPlanTest, WarmupRisesLinearlyThenStaysConstantAsNanoGpts) {
  c_.lr = 0.1;
  c_.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRate(c_, 0), 0.1 * 1 / 5);
  EXPECT_DOUBLE_EQ(LearningRate(c_, 3), 0.1 * 4 / 5);
  EXPECT_DOUBLE_EQ(LearningRate(c_, 4), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(c_, 50), 0.1);
}

TEST_F(TrainPlanTest, CosineFallsFromPeakToZeroAfterWarmup) {
  c_.lr = 0.1;
  c_.schedule = Schedule::kCosine;
  c_.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(LearningRate(c_, 10), 0.1);
  EXPECT_NEAR(LearningRate(c_, 55), 0.05,
              1e-12);  // halfway through the 90 cosine steps
  EXPECT_NEAR(LearningRate(c_, 100), 0.0, 1e-12);
  EXPECT_NEAR(LearningRate(c_, 150), 0.0, 1e-12);  // past the end: stays at 0
}

// nanoGPT's get_lr after its warmup: min_lr + 0.5 (1 + cos(pi ratio))
// (lr - min_lr), ratio over [warmup, lr_decay_iters], min_lr after.
TEST_F(TrainPlanTest, CosineEndsAtMinLrAtDecayStepsAsNanoGpts) {
  c_.lr = 1e-3;
  c_.min_lr = 1e-4;
  c_.schedule = Schedule::kCosine;
  c_.warmup_steps = 100;
  c_.decay_steps = 2000;
  c_.steps = 5000;
  for (int64_t it : {100, 500, 1050, 1999, 2000, 3000}) {
    const double ratio = std::min(1.0, (it - 100) / 1900.0);
    EXPECT_NEAR(LearningRate(c_, it),
                1e-4 + 0.5 * (1 + std::cos(M_PI * ratio)) * 9e-4, 1e-15)
        << it;
  }
}

TEST_F(TrainPlanTest, GptKeysAreChecked) {
  c_.model = ModelKind::kGpt;
  EXPECT_NE(ValidateConfig(c_).find("data.source = \"text\""),
            std::string::npos);
  c_.data = DataSource::kText;
  EXPECT_NE(ValidateConfig(c_).find("needs data.path"), std::string::npos);
  c_.text_path = "t.txt";
  EXPECT_EQ(ValidateConfig(c_), "");
  c_.n_head = 5;
  EXPECT_NE(ValidateConfig(c_).find("model.n_embd (768)"), std::string::npos);
  c_.n_head = 12;
  c_.decay = "matrices";
  EXPECT_NE(ValidateConfig(c_).find("adamw"), std::string::npos);
  c_.optimizer = OptimizerKind::kAdamW;
  EXPECT_EQ(ValidateConfig(c_), "");
}

TEST_F(TrainPlanTest, RankSeedsDifferAcrossRanksAndStepsAndRepeat) {
  std::set<uint64_t> seeds;
  for (int rank = 0; rank < 8; ++rank) {
    for (int64_t step : {0, 10, 150}) seeds.insert(RankSeed(c_, rank, step));
  }
  EXPECT_EQ(seeds.size(), 24u);
  EXPECT_EQ(RankSeed(c_, 3, 150), RankSeed(c_, 3, 150));
  TrainConfig other = c_;
  other.seed = 2;
  EXPECT_NE(RankSeed(other, 0, 0), RankSeed(c_, 0, 0));
}

TEST(ValidateConfigTest, DefaultsAreValid) {
  EXPECT_EQ(ValidateConfig(TrainConfig()), "");
}

TEST(ValidateConfigTest, NamesTheKeyAndTheChoices) {
  TrainConfig c;
  EXPECT_EQ(ParseChoice("strategy.type", "zero", &c.strategy),
            "strategy.type 'zero': use \"ddp\" or \"fsdp\"");
  EXPECT_EQ(c.strategy, StrategyKind::kDdp);  // untouched
  EXPECT_EQ(ParseChoice("optimizer.type", "lamb", &c.optimizer),
            "optimizer.type 'lamb': use \"sgd\" or \"adam\" or \"adamw\"");
  c.backend = "mpi";
  EXPECT_EQ(ValidateConfig(c),
            "strategy.backend 'mpi': use \"auto\" or \"gloo\" or \"nccl\"");
}

TEST(ValidateConfigTest, EveryChoiceParsesToItsEnum) {
  TrainConfig c;
  EXPECT_EQ(ParseChoice("model.type", "cnn", &c.model), "");
  EXPECT_EQ(c.model, ModelKind::kCnn);
  EXPECT_EQ(ParseChoice("data.source", "synthetic", &c.data), "");
  EXPECT_EQ(c.data, DataSource::kSynthetic);
  EXPECT_EQ(ParseChoice("strategy.type", "fsdp", &c.strategy), "");
  EXPECT_EQ(c.strategy, StrategyKind::kFsdp);
  EXPECT_EQ(ParseChoice("optimizer.type", "adamw", &c.optimizer), "");
  EXPECT_EQ(c.optimizer, OptimizerKind::kAdamW);
  EXPECT_EQ(ParseChoice("schedule.type", "cosine", &c.schedule), "");
  EXPECT_EQ(c.schedule, Schedule::kCosine);
  EXPECT_EQ(ParseChoice("checkpoint.format", "full", &c.checkpoint_format), "");
  EXPECT_EQ(c.checkpoint_format, CheckpointFormat::kFull);
  EXPECT_EQ(ParseChoice("checkpoint.mode", "async", &c.checkpoint_mode), "");
  EXPECT_EQ(c.checkpoint_mode, CheckpointMode::kAsync);
  EXPECT_EQ(ParseChoice("checkpoint.mode", "memory", &c.checkpoint_mode), "");
  EXPECT_EQ(c.checkpoint_mode, CheckpointMode::kMemory);
  EXPECT_EQ(ParseChoice("checkpoint.mode", "flash", &c.checkpoint_mode),
            "checkpoint.mode 'flash': use \"sync\" or \"async\" or \"memory\"");
  Faults f;
  EXPECT_EQ(ParseChoice("fault.kill_in", "write", &f.kill_in), "");
  EXPECT_EQ(f.kill_in, KillPoint::kWrite);
  // Exactly as written: TOML strings are case-sensitive.
  EXPECT_NE(ParseChoice("optimizer.type", "SGD", &c.optimizer), "");
}

TEST(ValidateFaultsTest, ASaveDelayWithoutAsyncWritesIsRefused) {
  TrainConfig c;
  Faults f;
  f.save_delay_ms = 100;  // would delay nothing in sync mode
  EXPECT_EQ(ValidateFaults(c, f),
            "fault.save_delay_ms delays background writes only: set "
            "checkpoint.mode = \"async\" or \"memory\", or drop it");
  c.checkpoint_mode = CheckpointMode::kAsync;
  EXPECT_EQ(ValidateFaults(c, f), "");
  c.checkpoint_mode = CheckpointMode::kMemory;
  EXPECT_EQ(ValidateFaults(c, f), "");
  f.save_delay_ms = -1;
  EXPECT_EQ(ValidateFaults(c, f), "fault.save_delay_ms must be >= 0");
  f.save_delay_ms = 0;
  f.damage_copy_at_step = 4;
  EXPECT_EQ(ValidateFaults(c, f), "");
  c.checkpoint_mode = CheckpointMode::kAsync;
  EXPECT_NE(ValidateFaults(c, f).find("fault.damage_copy_at_step"),
            std::string::npos);
}

// The faults are process-wide, set apart from the config a user fills in.
TEST(ValidateFaultsTest, SetFaultsIsWhatTheLoopReads) {
  EXPECT_EQ(InjectedFaults().kill_rank, -1);
  Faults f;
  f.hang_rank = 2;
  SetFaults(f);
  EXPECT_EQ(InjectedFaults().hang_rank, 2);
  SetFaults(Faults());
  EXPECT_EQ(InjectedFaults().hang_rank, -1);
}

TEST(ValidateConfigTest, RefusesOutOfRangeNumbers) {
  TrainConfig c;
  c.accumulate = 0;
  EXPECT_NE(ValidateConfig(c).find("train.accumulate must be >= 1"),
            std::string::npos);
  c = TrainConfig();
  c.checkpoint_every = 0;
  EXPECT_NE(ValidateConfig(c).find("checkpoint.every"), std::string::npos);
  c = TrainConfig();
  c.test_fraction = 1;
  EXPECT_EQ(ValidateConfig(c), "data.test_fraction must be in (0, 1)");
}

TEST(ChooseDeviceTest, NcclTakesTheGpuOfLocalRank) {
  EXPECT_EQ(ChooseDevice("auto", "nccl", 3, 4).index, 3);
  EXPECT_EQ(ChooseDevice("cuda", "nccl", 0, 1).index, 0);
  DeviceChoice d = ChooseDevice("auto", "nccl", 2, 2);
  EXPECT_NE(d.error.find("LOCAL_RANK 2 but only 2 GPU(s) visible"),
            std::string::npos)
      << d.error;
  d = ChooseDevice("cpu", "nccl", 0, 1);
  EXPECT_NE(d.error.find("use backend \"gloo\""), std::string::npos) << d.error;
}

TEST(ChooseDeviceTest, GlooStaysOnTheCpuUnlessCudaIsAskedFor) {
  EXPECT_EQ(ChooseDevice("auto", "gloo", 1, 8).index, -1);
  EXPECT_EQ(ChooseDevice("cpu", "gloo", 1, 8).index, -1);
  EXPECT_EQ(ChooseDevice("auto", "gloo", 0, 0).error, "");
}

TEST(ChooseDeviceTest, GlooOnCudaSharesTheVisibleGpusAmongTheRanks) {
  // --virtual-local-rank: every worker is LOCAL_RANK 0 with one GPU visible
  EXPECT_EQ(ChooseDevice("cuda", "gloo", 0, 1).index, 0);
  // four ranks on one GPU, and on two
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ChooseDevice("cuda", "gloo", r, 1).index, 0);
    EXPECT_EQ(ChooseDevice("cuda", "gloo", r, 2).index, r % 2);
  }
  DeviceChoice d = ChooseDevice("cuda", "gloo", 0, 0);
  EXPECT_EQ(d.index, -1);
  EXPECT_NE(d.error.find("no GPU is visible"), std::string::npos) << d.error;
}

TEST(ValidateConfigTest, DeviceIsAChoiceAndNcclNeedsAGpu) {
  TrainConfig c;
  for (const char* ok : {"auto", "cpu", "cuda"}) {
    c.device = ok;
    EXPECT_EQ(ValidateConfig(c), "") << ok;
  }
  c.device = "gpu";
  EXPECT_NE(ValidateConfig(c).find("strategy.device"), std::string::npos);
  c.device = "cpu";
  c.backend = "nccl";
  EXPECT_NE(ValidateConfig(c).find("NCCL moves GPU tensors only"),
            std::string::npos);
}

// torch.amp.GradScaler's rule: x0.5 on a step that is not finite (its
// growth count reset), x2 after growth_interval finite steps in a row.
TEST(LossScalerTest, HalvesOnOverflowAndDoublesAfterTheInterval) {
  LossScaler s(1024, 3);
  s.Update(true);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 2);
  s.Update(false);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.Restore(8, 2);
  s.Update(true);
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(LossScaler().scale(), 65536);
}

TEST(ValidateConfigTest, Fp16IsAChoiceWithAPositiveScale) {
  TrainConfig c;
  c.precision = "fp16";
  EXPECT_EQ(ValidateConfig(c), "");
  c.init_scale = 0;
  EXPECT_NE(ValidateConfig(c).find("train.init_scale"), std::string::npos);
  c.init_scale = 1;
  c.growth_interval = 0;
  EXPECT_NE(ValidateConfig(c).find("train.growth_interval"), std::string::npos);
  c.precision = "fp8";
  EXPECT_EQ(ValidateConfig(c),
            "train.precision 'fp8': use \"fp32\" or \"bf16\" or \"fp16\"");
}

}  // namespace
}  // namespace dtrun::train
