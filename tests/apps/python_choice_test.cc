#include "apps/dtrun/python_choice.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace dtrun::agent {
namespace {

namespace fs = std::filesystem;
using Env = std::map<std::string, std::string>;

// A folder under $TMPDIR standing for an installation prefix: bin/dtrun,
// bin/python3, and whatever marks it as an environment.
class PythonChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    prefix_ = fs::path(tmp ? tmp : "/tmp") /
              ("python_choice_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(prefix_ / "bin");
    Touch(prefix_ / "bin" / "dtrun", true);
  }
  void TearDown() override { fs::remove_all(prefix_); }
  static void Touch(const fs::path& p, bool executable) {
    std::ofstream(p).put('\n');
    if (executable)
      fs::permissions(p, fs::perms::owner_all, fs::perm_options::add);
  }
  std::string Dtrun() const { return (prefix_ / "bin" / "dtrun").string(); }
  std::string Bin(const char* name) const {
    return (prefix_ / "bin" / name).string();
  }
  fs::path prefix_;
};

TEST_F(PythonChoiceTest, APlainFolderKeepsPython3FromPath) {
  // /usr/bin holds python3 too: the .deb's dtrun must not start preferring
  // it to the user's PATH.
  Touch(Bin("python3"), true);
  PythonChoice c = DefaultPython({}, Dtrun());
  EXPECT_EQ(c.python, "python3");
  EXPECT_EQ(c.origin, PythonOrigin::kPath);
  EXPECT_EQ(DefaultPython({}, "").python, "python3");
}

TEST_F(PythonChoiceTest, AVenvsBinGivesItsPython) {
  Touch(prefix_ / "pyvenv.cfg", false);
  Touch(Bin("python3"), true);
  PythonChoice c = DefaultPython({}, Dtrun());
  EXPECT_EQ(c.python, Bin("python3"));
  EXPECT_EQ(c.origin, PythonOrigin::kEnvironment);
}

TEST_F(PythonChoiceTest, ACondaPrefixWithOnlyPythonGivesIt) {
  fs::create_directories(prefix_ / "conda-meta");
  Touch(Bin("python"), true);
  EXPECT_EQ(DefaultPython({}, Dtrun()).python, Bin("python"));
}

TEST_F(PythonChoiceTest, AnEnvironmentWithoutAnInterpreterIsNone) {
  Touch(prefix_ / "pyvenv.cfg", false);
  Touch(Bin("python3"), false);  // not executable
  EXPECT_EQ(DefaultPython({}, Dtrun()).origin, PythonOrigin::kPath);
}

TEST_F(PythonChoiceTest, PythonExecThenTheCallerWin) {
  Touch(prefix_ / "pyvenv.cfg", false);
  Touch(Bin("python3"), true);
  Env both = {{"PYTHON_EXEC", "/opt/py"}, {kCallerPython, "/venv/bin/python"}};
  EXPECT_EQ(DefaultPython(both, Dtrun()).python, "/opt/py");
  EXPECT_EQ(DefaultPython(both, Dtrun()).origin, PythonOrigin::kPythonExec);
  Env caller = {{kCallerPython, "/venv/bin/python"}};
  EXPECT_EQ(DefaultPython(caller, Dtrun()).python, "/venv/bin/python");
  EXPECT_EQ(DefaultPython(caller, Dtrun()).origin, PythonOrigin::kCaller);
  // Empty values are unset ones.
  Env empty = {{"PYTHON_EXEC", ""}, {kCallerPython, ""}};
  EXPECT_EQ(DefaultPython(empty, Dtrun()).python, Bin("python3"));
}

TEST(PythonNoteTest, SaysOnlyAnInterpreterOtherThanPaths) {
  EXPECT_EQ(
      PythonNote("/usr/bin/python3", PythonOrigin::kPath, "/usr/bin/python3"),
      "");
  EXPECT_EQ(PythonNote("/v/bin/python", PythonOrigin::kCaller,
                       "/usr/local/bin/python3"),
            " (Python: /v/bin/python, from the Python that started dtrun; "
            "python3 on PATH is /usr/local/bin/python3)");
  EXPECT_EQ(PythonNote("/v/bin/python3", PythonOrigin::kEnvironment, ""),
            " (Python: /v/bin/python3, from the environment dtrun is "
            "installed in; python3 on PATH is none)");
}

}  // namespace
}  // namespace dtrun::agent
