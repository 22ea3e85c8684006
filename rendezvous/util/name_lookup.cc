// Host name lookups in a static binary: see name_lookup.h.
#include "rendezvous/util/name_lookup.h"

#include <nss.h>
#include <sys/auxv.h>

#include <sstream>

#include "rendezvous/util/os_util.h"

namespace dtrun::os {

namespace {

// Written once by UseBuiltinNameLookup before any thread starts; read-only
// after that.
std::vector<std::string>& Dropped() {
  static std::vector<std::string> dropped;
  return dropped;
}

// The words after "hosts:", an [action ...] group kept as one word.
std::vector<std::string> HostsWords(const std::string& conf) {
  std::istringstream lines(conf);
  std::string line;
  while (std::getline(lines, line)) {
    line = line.substr(0, line.find('#'));
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line.compare(start, 6, "hosts:") != 0)
      continue;
    std::vector<std::string> words;
    std::istringstream in(line.substr(start + 6));
    std::string word;
    while (in >> word) {
      // "[NOTFOUND=return !UNAVAIL=continue]" spans several words.
      while (word.front() == '[' && word.back() != ']') {
        std::string more;
        if (!(in >> more)) break;
        word += " " + more;
      }
      words.push_back(word);
    }
    return words;  // glibc reads the first hosts line
  }
  return {};
}

}  // namespace

HostsLookup BuiltinHostsLookup(const std::string& nsswitch_conf) {
  HostsLookup out;
  bool keeping = false;  // whether the last service was kept: its actions go
  for (const std::string& word : HostsWords(nsswitch_conf)) {
    if (word.front() == '[') {
      if (keeping) out.kept += " " + word;
      continue;
    }
    keeping = word == "files" || word == "dns";
    if (keeping) {
      out.kept += (out.kept.empty() ? "" : " ") + word;
    } else {
      out.dropped.push_back(word);
    }
  }
  if (out.kept.empty()) out.kept = "files dns";
  return out;
}

void UseBuiltinNameLookup() {
  // A static executable has no program interpreter, so the kernel passes no
  // interpreter base in the auxiliary vector.
  if (getauxval(AT_BASE) != 0) return;
  HostsLookup lookup =
      BuiltinHostsLookup(ReadFileOrEmpty("/etc/nsswitch.conf"));
  if (lookup.dropped.empty()) return;
  // glibc then never reads the hosts line again (its reload is disabled).
  if (__nss_configure_lookup("hosts", lookup.kept.c_str()) == 0)
    Dropped() = lookup.dropped;
}

std::string NameLookupHint() {
  if (Dropped().empty()) return "";
  std::string names;
  for (const std::string& d : Dropped())
    names += (names.empty() ? "" : ", ") + d;
  return "; this static binary resolves names from /etc/hosts and DNS only "
         "(/etc/nsswitch.conf's hosts line also names " +
         names +
         ", which it does not load): put the name in /etc/hosts, give an IP "
         "address, or build dtrun on this system with "
         "-DDTRUN_STATIC_RUNTIME=OFF";
}

}  // namespace dtrun::os
