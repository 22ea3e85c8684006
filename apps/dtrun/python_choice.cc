// The workers' interpreter: see python_choice.h.
#include "apps/dtrun/python_choice.h"

#include <unistd.h>

namespace dtrun::agent {

namespace {

std::string Get(const std::map<std::string, std::string>& env,
                const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// python3 (or python) in `bin` when bin/.. is a venv or a conda prefix. A
// plain folder such as /usr/bin or a build tree is no environment: the
// .deb's /usr/bin/dtrun keeps PATH's python3, as it always has.
std::string EnvironmentPython(const std::string& bin) {
  std::string prefix = Parent(bin);
  if (!Exists(prefix + "/pyvenv.cfg") && !Exists(prefix + "/conda-meta"))
    return "";
  for (const char* name : {"python3", "python"}) {
    std::string path = bin + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

}  // namespace

PythonChoice DefaultPython(const std::map<std::string, std::string>& env,
                           const std::string& self_exe) {
  if (!Get(env, "PYTHON_EXEC").empty())
    return {Get(env, "PYTHON_EXEC"), PythonOrigin::kPythonExec};
  if (!Get(env, kCallerPython).empty())
    return {Get(env, kCallerPython), PythonOrigin::kCaller};
  // The binary's own path, not a link to it: /proc/self/exe is resolved by
  // the kernel, and pip copies the binary into the environment's bin/.
  std::string beside =
      self_exe.empty() ? "" : EnvironmentPython(Parent(self_exe));
  if (!beside.empty()) return {beside, PythonOrigin::kEnvironment};
  return {};
}

const char* PythonOriginText(PythonOrigin origin) {
  switch (origin) {
    case PythonOrigin::kFlag:
      return "--python";
    case PythonOrigin::kPythonExec:
      return "$PYTHON_EXEC";
    case PythonOrigin::kCaller:
      return "the Python that started dtrun";
    case PythonOrigin::kEnvironment:
      return "the environment dtrun is installed in";
    case PythonOrigin::kPath:
      return "PATH";
  }
  return "PATH";
}

std::string PythonNote(const std::string& interpreter, PythonOrigin origin,
                       const std::string& path_python3) {
  if (interpreter == path_python3) return "";
  return std::string(" (Python: ") + interpreter + ", from " +
         PythonOriginText(origin) + "; python3 on PATH is " +
         (path_python3.empty() ? "none" : path_python3) + ")";
}

}  // namespace dtrun::agent
