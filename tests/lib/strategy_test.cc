// Each strategy on its own, in a process group of one rank (gloo over an
// in-process store on loopback): what it saves is what it restores, into a
// fresh model and optimizer, and it refuses the other strategy's folder;
// FSDP goes back to the model as first made (in place, before any
// checkpoint).
#include "lib/parallel/strategy.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include "lib/precision.h"
#include "lib/process_group.h"
#include "rendezvous/store_server.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::train {
namespace {

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

class StrategyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = rendezvous::StoreServer::Start({});
    ASSERT_TRUE(server.ok());
    server_ = server->release();
    server_->RunInBackground();
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(server_->port()).c_str(), 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    ProcessGroupOptions o;
    o.backend = "gloo";
    dist_ = Distributed::FromEnv(o).release();
  }
  static void TearDownTestSuite() {
    delete dist_;
    delete server_;
  }
  void SetUp() override {
    auto dir = os::MakeTempDir("strategy_test");
    ASSERT_TRUE(dir.ok());
    dir_ = *dir;
  }
  void TearDown() override { os::RemoveTree(dir_); }

  // A small MLP with the given seed, and SGD with momentum over `params`.
  static std::shared_ptr<torch::nn::SequentialImpl> Model(int seed) {
    torch::manual_seed(seed);
    auto m = std::make_shared<torch::nn::SequentialImpl>();
    m->push_back(torch::nn::Linear(6, 8));
    m->push_back(torch::nn::ReLU());
    m->push_back(torch::nn::Linear(8, 3));
    return m;
  }
  static std::unique_ptr<torch::optim::SGD> Sgd(std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(
        p, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  // One step, so the optimizer has momentum to save.
  static void TrainStep(Strategy& s, torch::optim::Optimizer& opt) {
    torch::manual_seed(9);
    auto x = torch::randn({4, 6});
    auto y = torch::tensor({0, 1, 2, 1}, torch::kLong);
    opt.zero_grad();
    s.Backward(torch::cross_entropy_loss(s.Forward(x), y), /*last=*/true);
    opt.step();
  }
  // Saves a trained strategy's state, restores it into a fresh one built
  // from another seed, and checks that parameters and the next step agree.
  void RoundTrip(const TrainConfig& c) {
    CheckpointDir dir(dir_, 2);
    auto a = MakeStrategy(Model(1), &dist_->pg(), c);
    auto opt_a = Sgd(a->OptimizerParams());
    TrainStep(*a, *opt_a);
    TensorMap parts = a->Save(*opt_a, dir, 1);
    auto b = MakeStrategy(Model(2), &dist_->pg(), c);
    auto opt_b = Sgd(b->OptimizerParams());
    ASSERT_TRUE(b->Complete(parts, Strategy::FolderShards(dir), 1).ok());
    ASSERT_TRUE(b->Restore(parts, *opt_b).ok());
    auto pa = a->FullParams(), pb = b->FullParams();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
    TrainStep(*a, *opt_a);  // momentum restored: the next step agrees too
    TrainStep(*b, *opt_b);
    pa = a->FullParams();
    pb = b->FullParams();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "after a step, " << i;
  }

  static rendezvous::StoreServer* server_;
  static Distributed* dist_;
  std::string dir_;
};

rendezvous::StoreServer* StrategyTest::server_ = nullptr;
Distributed* StrategyTest::dist_ = nullptr;

// Autocast on the CPU in bfloat16 inside the scope (nested too), float32
// outside; clipping scales to the norm asked for.
TEST(AutocastScopeTest, MatmulsRunInBfloat16InsideOnly) {
  auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    AutocastScope outer(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    {
      AutocastScope inner(torch::kCPU, torch::kBFloat16);
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    AutocastScope none(torch::kCPU, torch::kFloat32);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
}

TEST_F(StrategyTest, ClippingScalesToTheNormAsClipGradNormDoes) {
  auto model =
      std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(3, 2));
  TrainConfig c;
  auto ddp = MakeStrategy(model, &dist_->pg(), c);
  std::vector<torch::Tensor> reference;
  for (auto& p : model->parameters()) {
    p.mutable_grad() = torch::full_like(p, 2.0);
    reference.push_back(p.grad().clone().requires_grad_(false));
  }
  const double norm = ddp->GradNorm();
  EXPECT_NEAR(norm, 2.0 * std::sqrt(8.0), 1e-6);  // 8 elements of 2
  EXPECT_TRUE(ddp->ClipGrads(norm, 1.0));
  std::vector<torch::Tensor> expected;
  for (auto& r : reference)
    expected.push_back(torch::zeros_like(r).requires_grad_(true));
  for (size_t i = 0; i < expected.size(); ++i)
    expected[i].mutable_grad() = reference[i];
  torch::nn::utils::clip_grad_norm_(expected, 1.0);
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i].grad()));
  EXPECT_NEAR(ddp->GradNorm(), 1.0, 1e-5);
  EXPECT_FALSE(ddp->ClipGrads(ddp->GradNorm(), 2.0));  // under the bound: kept
}

TEST_F(StrategyTest, DdpSavesWhatItRestores) {
  TrainConfig c;
  RoundTrip(c);
}

TEST_F(StrategyTest, FsdpShardedSavesWhatItRestores) {
  TrainConfig c;
  c.strategy = StrategyKind::kFsdp;
  RoundTrip(c);
  EXPECT_TRUE(Exists(CheckpointDir(dir_, 2).ShardPath(1, 0)));
}

TEST_F(StrategyTest, FsdpFullSavesWhatItRestoresInTheStepFile) {
  TrainConfig c;
  c.strategy = StrategyKind::kFsdp;
  c.checkpoint_format = CheckpointFormat::kFull;
  RoundTrip(c);
  EXPECT_FALSE(Exists(CheckpointDir(dir_, 2).ShardPath(1, 0)));
}

TEST_F(StrategyTest, EachRefusesTheOthersCheckpoints) {
  CheckpointDir dir(dir_, 2);
  TrainConfig ddp, fsdp;
  fsdp.strategy = StrategyKind::kFsdp;
  auto d = MakeStrategy(Model(1), &dist_->pg(), ddp);
  auto f = MakeStrategy(Model(1), &dist_->pg(), fsdp);
  auto opt = Sgd(d->OptimizerParams());
  TensorMap ddp_parts = d->Save(*opt, dir, 1);
  EXPECT_THROW(f->Complete(ddp_parts, Strategy::FolderShards(dir), 1), Error);
  TensorMap fsdp_parts = {{"fsdp_shards", torch::tensor(int64_t{1})}};
  EXPECT_THROW(d->Complete(fsdp_parts, Strategy::FolderShards(dir), 1), Error);
}

TEST_F(StrategyTest, FsdpNamesAShardThatDoesNotLoad) {
  CheckpointDir dir(dir_, 2);
  TrainConfig c;
  c.strategy = StrategyKind::kFsdp;
  auto f = MakeStrategy(Model(1), &dist_->pg(), c);
  TensorMap parts = {{"fsdp_shards", torch::tensor(int64_t{1})}};
  Status missing = f->Complete(parts, Strategy::FolderShards(dir), 5);
  EXPECT_EQ(missing.code(), Status::Code::kInvalid);
  EXPECT_NE(missing.message().find(dir.ShardPath(5, 0)), std::string::npos)
      << missing.message();
  ASSERT_TRUE(WriteCheckpointFile(dir.ShardPath(5, 0), "not tensors").ok());
  Status garbage = f->Complete(parts, Strategy::FolderShards(dir), 5);
  EXPECT_NE(garbage.message().find("not a tensor archive"), std::string::npos)
      << garbage.message();
}

// In place before the first checkpoint: a trained FSDP rank goes back to
// the model as first made, its optimizer's state dropped, and then trains
// as a fresh one does; DDP keeps its state another way and refuses.
TEST_F(StrategyTest, FsdpStartsOverFromTheModelAsFirstMade) {
  TrainConfig c;
  c.strategy = StrategyKind::kFsdp;
  auto trained = MakeStrategy(Model(1), &dist_->pg(), c);
  auto opt = Sgd(trained->OptimizerParams());
  TrainStep(*trained, *opt);
  TrainStep(*trained, *opt);
  auto fresh = MakeStrategy(Model(1), &dist_->pg(), c);
  auto opt_fresh = Sgd(fresh->OptimizerParams());
  trained->StartOver(*Model(1), *opt);
  auto pa = trained->FullParams(), pb = fresh->FullParams();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  TrainStep(*trained, *opt);  // no momentum left from before
  TrainStep(*fresh, *opt_fresh);
  pa = trained->FullParams();
  pb = fresh->FullParams();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "after a step, " << i;
  EXPECT_FALSE(trained->EveryRankHoldsAll());
  auto ddp = MakeStrategy(Model(1), &dist_->pg(), TrainConfig{});
  EXPECT_TRUE(ddp->EveryRankHoldsAll());
  EXPECT_THROW(ddp->StartOver(*Model(1), *opt), Error);
}

}  // namespace
}  // namespace dtrun::train
