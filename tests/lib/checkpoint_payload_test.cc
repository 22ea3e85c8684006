// The checkpoint payload codec and the step file's schema, on the CPU.
#include "lib/checkpoint_payload.h"

#include <gtest/gtest.h>

namespace dtrun::train {
namespace {

TEST(CheckpointPayloadTest, TensorsRoundTripBitwise) {
  torch::manual_seed(3);
  TensorMap in = {{"w", torch::randn({4, 5})},
                  {"step", torch::tensor(int64_t{42})},
                  {"bytes", BytesTensor(std::string("a\0b", 3))}};
  auto out = DecodeTensors(EncodeTensors(in));
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_TRUE(torch::equal(out->at("w"), in.at("w")));
  EXPECT_EQ(out->at("step").item<int64_t>(), 42);
  EXPECT_EQ(TensorBytes(out->at("bytes")), std::string("a\0b", 3));
  EXPECT_EQ(out->at("w").device(), torch::Device(torch::kCPU));
}

TEST(CheckpointPayloadTest, BytesThatAreNoArchiveAreInvalid) {
  auto out = DecodeTensors("DTCKPT1 but not a zip archive");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Status::Code::kInvalid);
  EXPECT_NE(out.status().message().find("not a tensor archive"),
            std::string::npos)
      << out.status().message();
}

TEST(CheckpointPayloadTest, BytesTensorOfNothing) {
  EXPECT_EQ(TensorBytes(BytesTensor("")), "");
}

TEST(StepFileTest, SchemaKeysAndRoundTrip) {
  StepFile f;
  f.step = 150;
  f.world_size = 2;
  f.epoch = 3;
  f.rng = {torch::arange(3), torch::arange(4)};
  f.parts = {{"model", BytesTensor("m")}, {"optimizer", BytesTensor("o")}};
  TensorMap t = f.ToTensors();
  // The names on disk, which older checkpoints also use.
  for (const char* key :
       {"step", "world_size", "epoch", "rng_0", "rng_1", "model", "optimizer"})
    EXPECT_TRUE(t.count(key)) << key;
  EXPECT_EQ(t.size(), 7u);
  auto back = StepFile::FromTensors(*DecodeTensors(EncodeTensors(t)));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->step, 150);
  EXPECT_EQ(back->world_size, 2);
  EXPECT_EQ(back->epoch, 3);
  ASSERT_EQ(back->rng.size(), 2u);
  EXPECT_TRUE(torch::equal(back->rng[1], torch::arange(4)));
  EXPECT_EQ(back->parts.size(), 2u);  // only the strategy's parts are left
  EXPECT_EQ(TensorBytes(back->parts.at("optimizer")), "o");
}

TEST(StepFileTest, MissingOrMalformedScalarsAreNamed) {
  auto no_step = StepFile::FromTensors({{"world_size", torch::tensor(1)}});
  ASSERT_FALSE(no_step.ok());
  EXPECT_NE(no_step.status().message().find("no 'step'"), std::string::npos);
  auto vector_world = StepFile::FromTensors(
      {{"step", torch::tensor(1)}, {"world_size", torch::arange(2)}});
  ASSERT_FALSE(vector_world.ok());
  EXPECT_NE(vector_world.status().message().find("'world_size' holds 2"),
            std::string::npos);
}

TEST(StepFileTest, WithoutGeneratorsTheRngIsEmpty) {
  auto f = StepFile::FromTensors(
      {{"step", torch::tensor(7)}, {"world_size", torch::tensor(4)}});
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->rng.empty());  // the trainer reseeds from the step
}

}  // namespace
}  // namespace dtrun::train
