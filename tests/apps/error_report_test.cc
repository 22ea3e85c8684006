#include "apps/dtrun/error_report.h"

#include <signal.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

namespace dtrun::agent {
namespace {

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/dtrun_error_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(ErrorReportTest, ReadsTorchrunRecordFormat) {
  std::string path = WriteTemp(
      R"({"message": {"message": "ValueError: bad", "extraInfo": )"
      R"({"py_callstack": "Traceback...\nValueError: bad", "timestamp": "1700000000"}}})");
  WorkerFailure f;
  ReadErrorFile(path, &f);
  EXPECT_EQ(f.error_file, path);
  EXPECT_EQ(f.message, "ValueError: bad");
  EXPECT_EQ(f.traceback, "Traceback...\nValueError: bad");
  EXPECT_EQ(f.timestamp, 1700000000.0);
  std::remove(path.c_str());
}

TEST(ErrorReportTest, ReadsPlainStringMessageWithTopLevelTimestamp) {
  std::string path = WriteTemp(R"({"message": "oops", "timestamp": 12})");
  WorkerFailure f;
  ReadErrorFile(path, &f);
  EXPECT_EQ(f.message, "oops");
  EXPECT_EQ(f.timestamp, 12.0);
  std::remove(path.c_str());
}

TEST(ErrorReportTest, GarbageFileIsReportedNotDropped) {
  std::string path = WriteTemp("not json");
  WorkerFailure f;
  ReadErrorFile(path, &f);
  EXPECT_NE(f.message.find("not torchrun's JSON"), std::string::npos);
  std::remove(path.c_str());
}

TEST(ErrorReportTest, MissingFileLeavesFailureAlone) {
  WorkerFailure f;
  ReadErrorFile("/nonexistent/error.json", &f);
  EXPECT_TRUE(f.error_file.empty());
}

TEST(ErrorReportTest, RootCauseIsEarliestAndSetsExitCode) {
  std::vector<WorkerFailure> failures(2);
  failures[0].timestamp = 20;
  failures[0].exit_code = 1;
  failures[1].timestamp = 10;
  failures[1].signal = SIGSEGV;
  failures[1].rank = 3;
  EXPECT_EQ(RootCause(failures), 1u);
  EXPECT_EQ(ExitCodeFor(failures[1]), 128 + SIGSEGV);
  EXPECT_EQ(ExitCodeFor(failures[0]), 1);
  std::string summary =
      FormatFailureSummary("train", "node0", failures, 3, "/logs/x");
  EXPECT_NE(summary.find("train FAILED"), std::string::npos);
  EXPECT_NE(summary.find("rank      : 3 (local_rank: 0)"), std::string::npos);
  EXPECT_NE(summary.find("SIGSEGV"), std::string::npos);
  EXPECT_NE(summary.find("exit code : 139"), std::string::npos);
  EXPECT_NE(summary.find("/logs/x"), std::string::npos);
  EXPECT_NE(summary.find("attempts  : 3 (--max-restarts=2)"),
            std::string::npos);
  // A group that is not restarted (a worker in D state) says so truly.
  std::string early =
      FormatFailureSummary("train", "node0", failures, 1, "/logs/x", 5);
  EXPECT_NE(early.find("attempts  : 1 (--max-restarts=5)"), std::string::npos);
}

TEST(ErrorReportTest, RootCauseJsonAddsErrorCode) {
  WorkerFailure f;
  f.exit_code = 5;
  f.message = "boom";
  auto j = nlohmann::json::parse(RootCauseJson(f));
  EXPECT_EQ(j["message"]["errorCode"], 5);
  EXPECT_EQ(j["message"]["message"], "boom");
}

}  // namespace
}  // namespace dtrun::agent
