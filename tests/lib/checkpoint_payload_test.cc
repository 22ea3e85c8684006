// The checkpoint payload codec and the step file's schema, on the CPU.
#include "lib/formats/checkpoint_payload.h"

#include <gtest/gtest.h>

namespace dtrun::train {
namespace {

TEST(CheckpointPayloadTest, TensorsRoundTripBitwiseInBothFormats) {
  torch::manual_seed(3);
  TensorMap in = {{"w", torch::randn({4, 5})},
                  {"step", torch::tensor(int64_t{42})},
                  {"bytes", BytesTensor(std::string("a\0b", 3))}};
  for (PayloadFormat format : {PayloadFormat::kRaw, PayloadFormat::kTorch}) {
    const std::string bytes = EncodeTensors(in, format).Join();
    EXPECT_EQ(bytes.rfind("DTRAW1", 0) == 0, format == PayloadFormat::kRaw);
    auto out = DecodeTensors(bytes);
    ASSERT_TRUE(out.ok()) << out.status().message();
    ASSERT_EQ(out->size(), 3u);
    EXPECT_TRUE(torch::equal(out->at("w"), in.at("w")));
    EXPECT_EQ(out->at("step").item<int64_t>(), 42);
    EXPECT_EQ(TensorBytes(out->at("bytes")), std::string("a\0b", 3));
    EXPECT_EQ(out->at("w").device(), torch::Device(torch::kCPU));
  }
}

// Every dtype the raw format has a code for, of every shape it must keep
// (a scalar, an empty tensor, a transposed one that is not contiguous),
// and a large one that is decoded in place: it points into the payload.
TEST(CheckpointPayloadTest, RawKeepsEveryDtypeAndShape) {
  torch::manual_seed(4);
  TensorMap in = {{"f32", torch::randn({3, 7})},
                  {"f64", torch::randn({2}, torch::kDouble)},
                  {"f16", torch::randn({5}).to(torch::kHalf)},
                  {"bf16", torch::randn({5}).to(torch::kBFloat16)},
                  {"i64", torch::tensor(int64_t{-9})},
                  {"i32", torch::arange(6, torch::kInt).reshape({2, 3})},
                  {"i16", torch::arange(4, torch::kShort)},
                  {"i8", torch::arange(-2, 2, torch::kChar)},
                  {"u8", torch::arange(9, torch::kByte)},
                  {"bool", torch::tensor({true, false, true})},
                  {"empty", torch::empty({0, 4})},
                  {"transposed", torch::randn({4, 6}).t()},
                  {"large", torch::randn({256, 256})}};
  const std::string bytes = EncodeTensors(in).Join();
  auto held = std::make_shared<const std::string>(bytes);
  auto out =
      DecodeTensors(PayloadView{held->data(), held->size(), held, nullptr});
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->size(), in.size());
  for (const auto& [key, t] : in) {
    EXPECT_EQ(out->at(key).scalar_type(), t.scalar_type()) << key;
    EXPECT_EQ(out->at(key).sizes(), t.sizes()) << key;
    EXPECT_TRUE(torch::equal(out->at(key), t)) << key;
  }
  const char* large = static_cast<const char*>(out->at("large").data_ptr());
  EXPECT_TRUE(large >= held->data() && large < held->data() + held->size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % 64,
            reinterpret_cast<uintptr_t>(held->data()) % 64);
}

// A dtype without a code (complex) makes the whole map a torch archive,
// which loads the same.
TEST(CheckpointPayloadTest, ADtypeWithoutACodeFallsBackToAnArchive) {
  TensorMap in = {{"c", torch::randn({3}, torch::kComplexFloat)},
                  {"f", torch::randn({3})}};
  const std::string bytes = EncodeTensors(in).Join();
  EXPECT_NE(bytes.rfind("DTRAW1", 0), 0u);
  auto out = DecodeTensors(bytes);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_TRUE(torch::equal(out->at("c"), in.at("c")));
}

// An index that lies about its tensors is refused, naming the tensor,
// never read past the payload's end.
TEST(CheckpointPayloadTest, ARawIndexThatDoesNotFitIsInvalid) {
  const std::string good =
      EncodeTensors({{"weight", torch::randn({64, 64})}}).Join();
  auto refused = [](const std::string& bytes) {
    auto out = DecodeTensors(bytes);
    return out.ok() ? std::string("loaded") : out.status().message();
  };
  EXPECT_NE(refused(good.substr(0, good.size() - 1)).find("'weight'"),
            std::string::npos);  // its bytes run past the end
  std::string dtype = good;
  dtype[16 + 4 + 2 + 6] = 99;  // after count, name length and "weight"
  EXPECT_NE(refused(dtype).find("unknown dtype code 99"), std::string::npos);
  std::string index_len = good;
  index_len[15] = '\x7f';  // the length's top byte
  EXPECT_NE(refused(index_len).find("runs past the payload"),
            std::string::npos);
  EXPECT_NE(refused(good.substr(0, 12)).find("not a raw"), std::string::npos);
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
  auto back = StepFile::FromTensors(*DecodeTensors(EncodeTensors(t).Join()));
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
