#pragma once

// torchrun's command line goes through Python's argparse; dtrun's through
// CLI11, which knows none of argparse's habits. This is the part of argparse
// that scripts written for torchrun rely on, applied to argv before CLI11
// sees it: unambiguous prefixes of long flags, a lone "--" before the
// program, and the program's own arguments kept verbatim except for one
// "--" right after it.

#include <string>
#include <vector>

#include "apps/dtrun/completion.h"

namespace dtrun::agent {

// argv split at the program, with every flag spelt in full.
struct SplitArgv {
  std::vector<std::string> flags;       // dtrun's own, for CLI11
  std::vector<std::string> entrypoint;  // the program and its arguments
  std::string error;                    // non-empty: a usage error (exit 2)
};

// Splits `args` (argv without argv[0]) by the rules above. A long flag that
// is no flag's name but the beginning of exactly one flag's names is that
// flag (`--nnode=2` is `--nnodes=2`); the beginning of several is an error
// naming them, unless only one of them is torchrun's (then it is that one,
// so dtrun's own flags never make a torchrun command line ambiguous). A
// flag that takes a value takes the next word when it has no `=`. The first
// word that is not a flag or a flag's value is the program; a "--" right
// after it is dropped, once. Pure.
SplitArgv SplitAtProgram(const std::vector<std::string>& args,
                         const std::vector<FlagSpec>& flags);

}  // namespace dtrun::agent
