// argparse's rules for torchrun's command line, applied before CLI11 parses
// the flags: see argv_rules.h. Pure.
#include "apps/dtrun/argv_rules.h"

#include <set>

namespace dtrun::agent {
namespace {

// The flags whose names begin with `prefix` (distinct flags, not spellings).
std::vector<const FlagSpec*> Candidates(const std::string& prefix,
                                        const std::vector<FlagSpec>& flags) {
  std::vector<const FlagSpec*> out;
  for (const FlagSpec& f : flags) {
    for (const std::string& n : f.names) {
      if (n.size() > 2 && n.compare(0, prefix.size(), prefix) == 0) {
        out.push_back(&f);
        break;
      }
    }
  }
  return out;
}

const FlagSpec* Exact(const std::string& name,
                      const std::vector<FlagSpec>& flags) {
  for (const FlagSpec& f : flags) {
    for (const std::string& n : f.names) {
      if (n == name) return &f;
    }
  }
  return nullptr;
}

// The long spelling a prefix stands for, or an error.
std::string Resolve(const std::string& prefix,
                    const std::vector<FlagSpec>& flags, const FlagSpec** flag) {
  std::vector<const FlagSpec*> found = Candidates(prefix, flags);
  if (found.size() > 1) {
    std::vector<const FlagSpec*> torchrun;
    for (const FlagSpec* f : found) {
      if (f->torchrun) torchrun.push_back(f);
    }
    if (torchrun.size() == 1) found = torchrun;
  }
  if (found.empty()) {
    return "unknown flag '" + prefix + "' (see dtrun --help)";
  }
  if (found.size() > 1) {
    std::string names;
    for (const FlagSpec* f : found) {
      for (const std::string& n : f->names) {
        if (n.size() > 2 && n.find('_') == std::string::npos) {
          names += (names.empty() ? "" : ", ") + n;
          break;
        }
      }
    }
    return "ambiguous flag '" + prefix + "' could match " + names +
           "; spell it out";
  }
  *flag = found.front();
  return "";
}

// The spelling of `flag` that begins with `prefix` (keeps the user's dashes
// or underscores, which PET_ names and messages do not care about).
std::string Spelling(const FlagSpec& flag, const std::string& prefix) {
  for (const std::string& n : flag.names) {
    if (n.size() > 2 && n.compare(0, prefix.size(), prefix) == 0) return n;
  }
  return flag.names.back();
}

// Reads the flag at args[*i], and its value (attached, or the next word,
// when *i moves on to it), into out->flags in a spelling CLI11 knows. False
// with out->error set for a flag dtrun does not know or a missing value.
bool TakeFlag(const std::vector<std::string>& args, size_t* i,
              const std::vector<FlagSpec>& flags, SplitArgv* out) {
  const std::string& a = args[*i];
  const FlagSpec* flag = nullptr;
  std::string word = a, value;
  bool has_value = false;
  if (a[1] == '-') {
    size_t eq = a.find('=');
    std::string name = a.substr(0, eq);
    has_value = eq != std::string::npos;
    if (has_value) value = a.substr(eq + 1);
    flag = Exact(name, flags);
    if (!flag) {
      out->error = Resolve(name, flags, &flag);
      if (!out->error.empty()) return false;
      name = Spelling(*flag, name);
    }
    word = has_value ? name + "=" + value : name;
  } else {
    // A short flag, its value either attached (-r3) or the next word.
    flag = Exact(a.substr(0, 2), flags);
    if (!flag || (a.size() > 2 && !flag->takes_value)) {
      out->error = "unknown flag '" + a + "' (see dtrun --help)";
      return false;
    }
    if (a.size() > 2) {
      out->flags.push_back(a.substr(0, 2));
      word = a.substr(2);
      has_value = true;
    }
  }
  out->flags.push_back(word);
  const bool next_is_flag =
      *i + 1 >= args.size() || args[*i + 1].rfind("-", 0) == 0;
  if (flag->takes_value && !has_value &&
      !(flag->optional_value && next_is_flag)) {
    if (*i + 1 >= args.size()) {
      out->error = "flag '" + a + "' expects a value";
      return false;
    }
    out->flags.push_back(args[++*i]);
  }
  return true;
}

}  // namespace

SplitArgv SplitAtProgram(const std::vector<std::string>& args,
                         const std::vector<FlagSpec>& flags) {
  SplitArgv out;
  size_t i = 0;
  bool positional_only = false;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (positional_only || a.size() < 2 || a[0] != '-') break;
    if (a == "--") {
      // argparse: everything after a lone "--" is positional.
      positional_only = true;
      continue;
    }
    if (!TakeFlag(args, &i, flags, &out)) return out;
  }
  out.entrypoint.assign(args.begin() + static_cast<long>(i), args.end());
  // torchrun's argparse drops a "--" between the script and its arguments
  // (`torchrun train.py -- --depth=26`); the script never sees it.
  if (out.entrypoint.size() > 1 && out.entrypoint[1] == "--") {
    out.entrypoint.erase(out.entrypoint.begin() + 1);
  }
  return out;
}

}  // namespace dtrun::agent
