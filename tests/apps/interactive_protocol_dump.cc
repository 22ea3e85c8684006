// Prints the launcher's half of the interactive protocol
// (apps/dtrun/interactive_protocol.h) as JSON, for run id and session values
// given on the command line, so that interactive_protocol_test.py can check
// the Python half against it.
//   interactive_protocol_dump RUN_ID ROUND WORLD ADDR HOST PORT DIR
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/dtrun/interactive_protocol.h"

int main(int argc, char** argv) {
  namespace ip = dtrun::interactive_protocol;
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s RUN_ID ROUND WORLD ADDR HOST PORT DIR\n",
                 argv[0]);
    return 2;
  }
  const std::string run_id = argv[1], addr = argv[4], host = argv[5],
                    dir = argv[7];
  const int round = std::atoi(argv[2]), world = std::atoi(argv[3]);
  const auto port = static_cast<uint16_t>(std::atoi(argv[6]));
  nlohmann::json j = {
      {"prefix", ip::kPrefix},
      {"crash", ip::kCrash},
      {"crash_count", ip::kCrashCount},
      {"local_crash_prefix", ip::kLocalCrashPrefix},
      {"run_prefix", ip::RunPrefix(run_id)},
      {"current_round_key", ip::CurrentRoundKey(run_id)},
      {"current_round_value", ip::CurrentRoundValue(round, world, addr)},
      {"nodes_crash_prefix", ip::NodesCrashPrefix(run_id)},
      {"session_line_tag", ip::kSessionLineTag},
      {"session_line", ip::SessionLine(host, port, world, dir, "")},
      {"session_line_nodes",
       ip::SessionLine(host, port, world, dir, ip::CurrentRoundKey(run_id))},
  };
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}
