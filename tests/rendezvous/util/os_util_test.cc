#include "rendezvous/util/os_util.h"

#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>

namespace dtrun::os {
namespace {

namespace fs = std::filesystem;

// Sets an environment variable for one test and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Each test works in its own folder under $TMPDIR, made and removed with
// std::filesystem so a bug in the functions under test cannot hide itself.
class OsUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        std::string(tmp && *tmp ? tmp : "/tmp") + "/os_util_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr) << templ;
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

TEST_F(OsUtilTest, MakeDirsCreatesParentsAndAcceptsExistingFolders) {
  ASSERT_TRUE(MakeDirs(Path("a/b/c")).ok());
  EXPECT_TRUE(fs::is_directory(Path("a/b/c")));
  EXPECT_TRUE(MakeDirs(Path("a/b")).ok());
  EXPECT_TRUE(MakeDirs(Path("a/b/c/")).ok());
  ASSERT_TRUE(MakeDirs(Path("a/b/x/y/")).ok());  // some parents exist
  EXPECT_TRUE(fs::is_directory(Path("a/b/x/y")));
}

TEST_F(OsUtilTest, MakeDirsNamesTheFolderItCannotCreate) {
  ASSERT_TRUE(WriteFile(Path("file"), "x").ok());
  Status s = MakeDirs(Path("file/sub/deeper"));
  ASSERT_EQ(s.code(), Status::Code::kIo);
  EXPECT_NE(s.message().find("'" + Path("file/sub") + "'"), std::string::npos)
      << s.message();
}

TEST_F(OsUtilTest, MakeTempDirCreatesAPrivateFolderUnderTmpdir) {
  ScopedEnv tmpdir("TMPDIR", dir_);
  auto made = MakeTempDir("job-");
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ(made->rfind(dir_ + "/job-", 0), 0u) << *made;
  EXPECT_EQ(made->size(), (dir_ + "/job-XXXXXX").size());
  struct stat st {};
  ASSERT_EQ(stat(made->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto second = MakeTempDir("job-");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*made, *second);
}

TEST_F(OsUtilTest, MakeTempDirSaysToSetTmpdirWhenItCannot) {
  ScopedEnv tmpdir("TMPDIR", Path("missing"));
  auto made = MakeTempDir("job-");
  ASSERT_EQ(made.status().code(), Status::Code::kIo);
  EXPECT_NE(made.status().message().find(Path("missing/job-XXXXXX")),
            std::string::npos);
  EXPECT_NE(made.status().message().find("set TMPDIR"), std::string::npos);
}

TEST_F(OsUtilTest, RemoveTreeRemovesEverythingButWhatLinksPointAt) {
  ASSERT_TRUE(WriteFile(Path("outside"), "keep").ok());
  ASSERT_TRUE(MakeDirs(Path("tree/sub")).ok());
  ASSERT_TRUE(WriteFile(Path("tree/sub/f"), "x").ok());
  fs::create_symlink(Path("outside"), Path("tree/link"));
  fs::create_directory_symlink(dir_, Path("tree/sub/up"));
  RemoveTree(Path("tree"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(Path("tree"))));
  EXPECT_EQ(ReadFileOrEmpty(Path("outside")), "keep");
}

TEST_F(OsUtilTest, RemoveTreeOfAMissingPathOrAFileWorks) {
  RemoveTree(Path("never-made"));
  ASSERT_TRUE(WriteFile(Path("lone"), "x").ok());
  RemoveTree(Path("lone"));
  EXPECT_FALSE(fs::exists(Path("lone")));
}

TEST_F(OsUtilTest, WriteThenReadKeepsEveryByte) {
  std::string bytes("a\0b\n\xff", 5);
  ASSERT_TRUE(WriteFile(Path("f"), bytes).ok());
  EXPECT_EQ(*ReadFile(Path("f")), bytes);
  ASSERT_TRUE(WriteFile(Path("f"), "short").ok());  // truncates
  EXPECT_EQ(ReadFileOrEmpty(Path("f")), "short");
}

// What `fill` writes replaces the file whole; while it writes, the old file
// is still there under its name and the new bytes only under the temporary.
TEST_F(OsUtilTest, WriteDurablyReplacesTheFileOnlyOnceItIsWhole) {
  ASSERT_TRUE(WriteFile(Path("f"), "old").ok());
  std::string seen_during, tmp_name;
  Status s = WriteDurably(Path("f"), [&](int fd, const std::string& tmp) {
    EXPECT_EQ(::write(fd, "new!", 4), 4);
    seen_during = ReadFileOrEmpty(Path("f"));
    tmp_name = tmp;
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(seen_during, "old");
  EXPECT_EQ(tmp_name, Path("f") + ".tmp." + std::to_string(getpid()));
  EXPECT_EQ(ReadFileOrEmpty(Path("f")), "new!");
  EXPECT_FALSE(fs::exists(tmp_name));
}

// A fill that fails leaves the old file and no temporary behind, and its
// error comes back; so does a folder that does not exist.
TEST_F(OsUtilTest, WriteDurablyThatFailsLeavesTheOldFile) {
  ASSERT_TRUE(WriteFile(Path("f"), "old").ok());
  Status s = WriteDurably(Path("f"), [](int fd, const std::string&) {
    EXPECT_EQ(::write(fd, "half", 4), 4);
    return Status::Io("disk full");
  });
  EXPECT_EQ(s.message(), "disk full");
  EXPECT_EQ(ReadFileOrEmpty(Path("f")), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), {}), 1);
  s = WriteDurably(Path("none/f"),
                   [](int, const std::string&) { return Status::Ok(); });
  ASSERT_EQ(s.code(), Status::Code::kIo);
  EXPECT_NE(s.message().find(Path("none/f") + ".tmp."), std::string::npos);
}

TEST_F(OsUtilTest, ReadAndWriteNameTheFileTheyCannotUse) {
  auto read = ReadFile(Path("missing"));
  ASSERT_EQ(read.status().code(), Status::Code::kIo);
  EXPECT_NE(read.status().message().find("'" + Path("missing") + "'"),
            std::string::npos);
  EXPECT_EQ(ReadFileOrEmpty(Path("missing")), "");
  Status write = WriteFile(Path("no/such/folder/f"), "x");
  ASSERT_EQ(write.code(), Status::Code::kIo);
  EXPECT_NE(write.message().find("'" + Path("no/such/folder/f") + "'"),
            std::string::npos);
}

TEST_F(OsUtilTest, FindInPathReturnsTheFirstExecutableMatch) {
  ASSERT_TRUE(MakeDirs(Path("bin1")).ok());
  ASSERT_TRUE(MakeDirs(Path("bin2")).ok());
  ASSERT_TRUE(WriteFile(Path("bin1/tool"), "not executable").ok());
  ASSERT_TRUE(WriteFile(Path("bin2/tool"), "#!/bin/sh\n").ok());
  ASSERT_EQ(chmod(Path("bin2/tool").c_str(), 0755), 0);
  ScopedEnv path("PATH", Path("bin1") + ":" + Path("bin2"));
  EXPECT_EQ(FindInPath("tool"), Path("bin2/tool"));
  EXPECT_EQ(FindInPath("absent"), "");
}

TEST(OsUtilHostTest, HostNameIsTheKernelsNodeName) {
  utsname u{};
  ASSERT_EQ(uname(&u), 0);
  EXPECT_EQ(HostName(), u.nodename);
}

TEST(OsUtilHostTest, RandomHexHasTheAskedDigitsAndVaries) {
  std::string a = RandomHex(32), b = RandomHex(32);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
  EXPECT_EQ(RandomHex(0), "");
}

TEST(OsUtilHostTest, UnixNowIsWallClockSeconds) {
  double before = static_cast<double>(std::time(nullptr));
  double now = UnixNow();
  EXPECT_GE(now, before);
  EXPECT_LT(now, before + 2);
}

}  // namespace
}  // namespace dtrun::os
