#include "apps/dtrun/rdzv_config.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

std::string ErrorOf(const std::string& text) {
  auto c = ParseRdzvConf(text);
  EXPECT_FALSE(c.ok()) << text;
  return c.ok() ? "" : c.status().message();
}

// torchrun's, but for the keep-alive: 1 s x 3, where torchrun's 5 s x 3
// leaves a silent node unnoticed for 15 s.
TEST(RdzvConfigTest, EmptyGivesTheDefaults) {
  RdzvConfig c = *ParseRdzvConf("");
  EXPECT_EQ(c.join_timeout, milliseconds(600000));
  EXPECT_EQ(c.last_call_timeout, milliseconds(30000));
  EXPECT_EQ(c.keep_alive_interval, milliseconds(1000));
  EXPECT_EQ(c.keep_alive_max_attempt, 3);
  EXPECT_FALSE(c.read_timeout.has_value());
  EXPECT_FALSE(c.is_host.has_value());
  EXPECT_EQ(c.silent_limit(), milliseconds(3000));
}

TEST(RdzvConfigTest, EveryKeyParses) {
  RdzvConfig c = *ParseRdzvConf(
      "join_timeout=60,last_call_timeout=0,keep_alive_interval=0.5,"
      "keep_alive_max_attempt=4,read_timeout=2.25,is_host=false");
  EXPECT_EQ(c.join_timeout, milliseconds(60000));
  EXPECT_EQ(c.last_call_timeout, milliseconds(0));
  EXPECT_EQ(c.keep_alive_interval, milliseconds(500));
  EXPECT_EQ(c.keep_alive_max_attempt, 4);
  EXPECT_EQ(c.read_timeout, milliseconds(2250));
  EXPECT_EQ(c.is_host, false);
  EXPECT_EQ(c.silent_limit(), milliseconds(2000));
}

TEST(RdzvConfigTest, IsHostTakesPythonsSpellings) {
  for (const char* yes : {"1", "true", "True", "yes", "on"}) {
    EXPECT_EQ(ParseRdzvConf(std::string("is_host=") + yes)->is_host, true)
        << yes;
  }
  EXPECT_NE(
      ErrorOf("is_host=maybe").find("is_host='maybe' is not true or false"),
      std::string::npos);
}

TEST(RdzvConfigTest, ABadValueNamesTheKeyAndTheValue) {
  EXPECT_EQ(ErrorOf("join_timeout=abc"),
            "--rdzv-conf: join_timeout='abc' is not a number of seconds > 0");
  EXPECT_NE(ErrorOf("join_timeout=0").find("join_timeout='0'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("last_call_timeout=-1").find(">= 0"), std::string::npos);
  EXPECT_NE(
      ErrorOf("keep_alive_interval=nan").find("keep_alive_interval='nan'"),
      std::string::npos);
  EXPECT_NE(ErrorOf("keep_alive_max_attempt=0").find("a whole number >= 1"),
            std::string::npos);
  EXPECT_NE(ErrorOf("keep_alive_max_attempt=2.5").find("'2.5'"),
            std::string::npos);
}

TEST(RdzvConfigTest, AnUnknownKeyIsAnErrorListingTheKnownOnes) {
  std::string e = ErrorOf("join_timout=60");
  EXPECT_NE(e.find("unknown key 'join_timout' (value '60')"), std::string::npos)
      << e;
  EXPECT_NE(e.find("join_timeout"), std::string::npos) << e;
}

TEST(RdzvConfigTest, TorchrunKeysDtrunDoesNotUseAreKeptForAWarning) {
  RdzvConfig c =
      *ParseRdzvConf("close_timeout=5,store_type=tcp,join_timeout=9");
  EXPECT_EQ(c.ignored,
            (std::vector<std::string>{"close_timeout=5", "store_type=tcp"}));
  EXPECT_EQ(c.join_timeout, milliseconds(9000));
}

TEST(RdzvConfigTest, AnItemWithoutEqualsIsAnError) {
  EXPECT_NE(ErrorOf("join_timeout").find("'join_timeout' is not key=value"),
            std::string::npos);
  EXPECT_NE(ErrorOf("join_timeout=1,,is_host=1").find("'' is not key=value"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrun::agent
