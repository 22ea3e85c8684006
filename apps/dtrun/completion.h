#pragma once

#include <string>
#include <vector>

namespace dtrun::agent {

// One command-line flag as the shell completions see it.
struct FlagSpec {
  std::vector<std::string> names;    // every spelling: "-m", "--module", ...
  bool takes_value = false;          // false: a switch
  std::string help;                  // one line
  std::vector<std::string> choices;  // values to offer; empty: any (files)
  bool torchrun = true;  // torchrun has it too (false: dtrun's own flag)
  // The value may be left out (`--status` alone): then the next word is
  // not taken as its value when it starts with '-'.
  bool optional_value = false;
};

// Completion scripts for `dtrun --print-completion bash|zsh|tcsh`, generated
// from the parser's own flags so they never drift from it. Words up to the
// program complete as flags (and their choices); after it, as the program's
// own command line. Pure: text in, text out.
std::string BashCompletion(const std::vector<FlagSpec>& flags);
std::string ZshCompletion(const std::vector<FlagSpec>& flags);
std::string TcshCompletion(const std::vector<FlagSpec>& flags);

// The script for `shell` ("bash", "zsh" or "tcsh"); empty for any other.
std::string CompletionScript(const std::string& shell,
                             const std::vector<FlagSpec>& flags);

}  // namespace dtrun::agent
