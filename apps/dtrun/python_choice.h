#pragma once

#include <map>
#include <string>

namespace dtrun::agent {

// Which Python runs the workers (and the standby, an interactive session's
// console and workers), and why: torchrun runs `$PYTHON_EXEC` or the Python
// that runs torchrun itself; dtrun is a binary, so it is told that Python by
// the `dtrun` package (`python -m dtrun`, `dtrun.launch`, the Jupyter
// extension), or finds it beside itself when pip put it in an environment's
// bin/ (a venv's or conda's). Most binding first.
enum class PythonOrigin {
  kFlag,         // --python
  kPythonExec,   // $PYTHON_EXEC
  kCaller,       // the Python that started dtrun through the dtrun package
  kEnvironment,  // python3 beside dtrun in a venv's or conda's bin/
  kPath,         // python3 from PATH
};

// The variable through which the dtrun package hands the binary its
// sys.executable. dtrun removes it from the workers' environment.
inline constexpr char kCallerPython[] = "DTRUN_CALLER_PYTHON";

struct PythonChoice {
  std::string python = "python3";  // a path, or a name looked up in PATH
  PythonOrigin origin = PythonOrigin::kPath;
};

// The interpreter before flags, from dtrun's environment and the path of
// its own binary: $PYTHON_EXEC, else $DTRUN_CALLER_PYTHON, else python3 (or
// python) beside `self_exe` when its folder's parent is an environment's
// prefix (holds pyvenv.cfg or conda-meta/), else "python3" from PATH. Reads
// only those few paths' existence.
PythonChoice DefaultPython(const std::map<std::string, std::string>& env,
                           const std::string& self_exe);

// How the start line names the origin: "the Python that ran `python -m
// dtrun`", "--python", ...
const char* PythonOriginText(PythonOrigin origin);

// " (Python: <interpreter>, <origin>; python3 on PATH is <other>)" when the
// workers' interpreter is not python3 from PATH, else empty. Pure.
std::string PythonNote(const std::string& interpreter, PythonOrigin origin,
                       const std::string& path_python3);

}  // namespace dtrun::agent
