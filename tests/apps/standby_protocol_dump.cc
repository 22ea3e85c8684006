// Prints the standby protocol's names and limits
// (rendezvous/standby_protocol.h) as JSON, so that standby_protocol_test.py
// can check them against the Python standby's.
#include <iostream>
#include <nlohmann/json.hpp>

#include "rendezvous/standby_protocol.h"

int main() {
  namespace sp = dtrun::standby_protocol;
  const nlohmann::json out = {
      {"socket_fd", sp::kSocketFd},
      {"max_packet", sp::kMaxPacket},
      {"descriptors", sp::kDescriptors},
      {"fd_variable", sp::kFdVariable},
      {"script_variable", sp::kScriptVariable},
      {"module_variable", sp::kModuleVariable},
      {"ready", sp::kReady},
      {"seconds", sp::kSeconds},
      {"why", sp::kWhy},
      {"argv", sp::kArgv},
      {"env", sp::kEnv},
      {"cpus", sp::kCpus},
      {"parent", sp::kParent},
      {"pid", sp::kPid},
      {"error", sp::kError},
  };
  std::cout << out.dump(1) << "\n";
  return 0;
}
