#include "apps/dtrun/completion.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/dtrun/cli.h"

namespace dtrun::agent {
namespace {

std::vector<FlagSpec> Flags() {
  return {{{"-m", "--module"}, false, "run as a module", {}},
          {{"--log-level", "--log_level"},
           true,
           "level [default: info]",
           {"info", "off"}},
          {{"--log-dir", "--log_dir"}, true, "folder: it's yours", {}}};
}

int ParseExitCode(std::vector<std::string> args) {
  args.insert(args.begin(), "dtrun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data())
      .exit_code.value_or(-1);
}

TEST(CompletionTest, BashOffersDashedAndShortSpellingsOnly) {
  std::string script = BashCompletion(Flags());
  EXPECT_NE(script.find("compgen -W \"-m --module --log-level --log-dir\""),
            std::string::npos);
  EXPECT_NE(script.find("complete -o filenames -o bashdefault -F _dtrun dtrun"),
            std::string::npos);
}

TEST(CompletionTest, BashKnowsWhichFlagsTakeValuesInEverySpelling) {
  std::string script = BashCompletion(Flags());
  EXPECT_NE(script.find("--log-level|--log_level|--log-dir|--log_dir)"),
            std::string::npos);
  EXPECT_NE(script.find("--log-level|--log_level)\n      COMPREPLY=($(compgen "
                        "-W \"info off\""),
            std::string::npos);
}

TEST(CompletionTest, ZshEscapesHelpAndListsChoices) {
  std::string script = ZshCompletion(Flags());
  EXPECT_EQ(script.rfind("#compdef dtrun\n", 0), 0u);
  EXPECT_NE(script.find(
                "'--log-level=[level \\[default\\: info\\]]:value:(info off)'"),
            std::string::npos);
  EXPECT_NE(script.find("'--log-dir=[folder\\: it'\\''s yours]:value:_files'"),
            std::string::npos);
  EXPECT_NE(script.find("'-m[run as a module]'"), std::string::npos);
}

TEST(CompletionTest, UnknownShellGetsNoScript) {
  EXPECT_EQ(CompletionScript("fish", Flags()), "");
  EXPECT_FALSE(CompletionScript("zsh", Flags()).empty());
}

TEST(CompletionTest, CommandLinePrintsCompletionOrRejectsTheShell) {
  testing::internal::CaptureStdout();
  EXPECT_EQ(ParseExitCode({"--print-completion", "bash"}), 0);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(out.find("--print-completion|--print_completion)\n      "
                     "COMPREPLY=($(compgen -W \"bash zsh tcsh\""),
            std::string::npos);
  EXPECT_EQ(ParseExitCode({"--print-completion", "fish"}), 2);
}

TEST(CompletionTest, VersionNamesProgramVersionAndCommit) {
  EXPECT_EQ(VersionText("dtrun").rfind("dtrun ", 0), 0u);
  EXPECT_NE(VersionText("dtrun").find(" (git "), std::string::npos);
}

}  // namespace
}  // namespace dtrun::agent
