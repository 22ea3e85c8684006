#pragma once

#include <map>
#include <string>

namespace dtrun {

// The process's environment (environ) as a map. Shared by the launcher and
// the training library, which both turn it into typed settings with pure
// functions.
std::map<std::string, std::string> ProcessEnvironment();

}  // namespace dtrun
