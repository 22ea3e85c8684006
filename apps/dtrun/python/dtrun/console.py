"""The console of `dtrun --interactive`: reads cells (with line editing and
history on a terminal), runs them on the selected ranks of the live workers
and prints each rank's output, labelled, in rank order."""
import argparse
import codeop
import os
import shutil
import signal
import sys
import time

try:
    import torch
    from dtrun.session import (LabelledLines, Session, SessionError, format_results,
                               format_timeline, parse_ranks, runner_line, spans)
except ImportError as e:  # the interpreter has no torch
    sys.stderr.write(f"dtrun --interactive: {sys.executable} cannot import what a session needs "
                     f"({e}); pass --python with a Python that has PyTorch (on Debian: "
                     "/usr/bin/python3 with python3-torch)\n")
    sys.exit(1)

HELP = """\
A cell runs on every rank unless its first line selects some:
  %rank 0 | %rank 0,2 | %rank 1-3 | %rank all   then the code (same line or next lines)
  %rank 0-3 --show 1 CODE   runs on 0-3, prints rank 1's output (and all errors)
  %rank all --noblock CODE  returns at once with a name (c1, c2, ...) while it runs
                            (%distributed --noblock CODE: the same on every rank)
  %result NAME [--wait]     what a non-blocking cell's ranks sent so far, or wait for it
  %timeline [N]             each rank's wall time of the last N cells, slowest marked
Each rank keeps its own variables; rank, local_rank, world_size, device, torch,
dist and display are predefined. Where the workers' Python has IPython, cells
run through it: %time, !cmd, obj?, %%timeit and the other IPython magics work
(a line or first line starting % that is none of this console's own goes to
the ranks; a %%cell ends with an empty line). Ctrl-C interrupts a running cell
on its ranks; Tab completes names and attributes from rank 0.
  %pull NAME [--rank R]     print rank R's NAME (default rank 0), fetched to the CPU
  %push NAME=EXPR [--ranks SPEC]   evaluate EXPR here, set NAME on the ranks
  %sync            a barrier on every rank
  %stream on|off   show output as it is printed (default off: per rank, at the end)
  %timeout S|off   interrupt cells that run longer than S seconds
  %status          each rank: host, pid, alive, busy or idle, last cell, memory;
                   and whether cells run through IPython or plain exec
  %restart         new workers with fresh state
  %shutdown        stop the workers and leave (also Ctrl-D)
  %help            this text"""


class Console:
    def __init__(self, session, out=sys.stdout):
        self.s = session
        self.out = out
        self.tty = sys.stdin.isatty()
        self.compiler = codeop.CommandCompiler()
        self.local = {"torch": torch}  # where %push evaluates its expression
        self.ipython = None  # IPython's input transformer, when the ranks use IPython
        self.shows = {}  # the --show rank of each non-blocking cell, by name

    def say(self, text):
        self.out.write(text + ("\n" if text and not text.endswith("\n") else ""))
        self.out.flush()

    # -- input -----------------------------------------------------------
    def read_line(self, prompt):
        if self.tty:
            return input(prompt)
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def read_cell(self):
        """One cell: a magic line, or Python lines until complete (a block
        ends with an empty line, as in the Python REPL). Returns (spec,
        code), spec being None (every rank), "magic" (a console magic) or
        the %rank options; None at EOF."""
        lines = []
        ranks_spec = None
        while True:
            try:
                line = self.read_line("... " if lines or ranks_spec is not None else ">>> ")
            except EOFError:
                if lines:
                    return ranks_spec, "\n".join(lines)
                return None
            if not lines and ranks_spec is None:
                stripped = line.strip()
                if not stripped:
                    continue
                if stripped.startswith("%") and not stripped.startswith("%%"):
                    word, _, rest = stripped.partition(" ")
                    if word in ("%rank", "%distributed"):
                        ranks_spec, code = _rank_options(word, rest)
                        if code.strip():
                            lines.append(code.strip())
                            if self.complete(lines):
                                return ranks_spec, "\n".join(lines)
                        continue
                    if word in MAGICS or not self.ipython:
                        return "magic", stripped
                    # An IPython line magic (%time ...): a cell for the ranks.
            if lines and not line.strip():
                return ranks_spec, "\n".join(lines)  # an empty line ends a block
            lines.append(line)
            if self.complete(lines):
                return ranks_spec, "\n".join(lines)

    def complete(self, lines):
        source = "\n".join(lines)
        if self.ipython:
            if lines[0].lstrip().startswith("%%"):
                return False  # a cell magic's body ends with an empty line
            status, _ = self.ipython.check_complete(source + "\n")
            if status != "incomplete":
                return True
            source = self.ipython.transform_cell(source)  # "def f(:" is not incomplete
        try:
            return self.compiler(source, "<cell>", "single") is not None
        except (SyntaxError, OverflowError, ValueError):
            return True  # let it fail at compile time with the message
        try:
            return self.compiler(source, "<cell>", "single") is not None
        except (SyntaxError, OverflowError, ValueError):
            return True  # let it fail at compile time with the message

    # -- commands --------------------------------------------------------
    def run_cell(self, options, code):
        spec, shown, noblock = options or ("all", None, False)
        try:
            ranks = parse_ranks(spec, self.s.world)
            show = None
            if shown is not None:
                if not shown.isdigit() or int(shown) not in ranks:
                    raise SessionError(f"--show {shown}: name one of the ranks that run the cell")
                show = int(shown)
        except SessionError as e:
            self.say(f"error: {e}")
            return
        try:
            compile(self.ipython.transform_cell(code) if self.ipython else code,
                    "<cell>", "exec")
        except SyntaxError as e:
            self.say(f"SyntaxError: {e.msg} (line {e.lineno}); nothing was run")
            return
        if noblock:
            name = self.s.start(code, ranks)
            self.shows[name] = show
            self.say(f"{name}: running on rank(s) {spans(ranks)}; %result {name} shows what "
                     f"has arrived, %result {name} --wait waits for the end")
            return
        behind = self.s.busy_with(ranks)
        if behind:
            self.say(f"(waiting for {', '.join(behind)} to finish on these ranks first)")
        on_stream = LabelledLines(self.say, show) if self.s.stream else None
        self.show(self.s.run(code, ranks, on_stream), on_stream, show)

    def show(self, results, on_stream, show):
        if on_stream:
            on_stream.flush()
        text = format_results(results, streamed=on_stream is not None, show=show)
        if text:
            self.say(text)

    def result(self, arg):
        words = arg.split()
        wait = "--wait" in words
        names = [w for w in words if w != "--wait"]
        if len(names) != 1 or names[0].startswith("--"):
            self.say("usage: %result NAME [--wait]")
            return
        show = self.shows.get(names[0])
        on_stream = LabelledLines(self.say, show) if wait and self.s.stream else None
        self.show(self.s.result(names[0], wait=wait, on_stream=on_stream), on_stream, show)

    def timeline(self, arg):
        arg = arg or "10"
        if not arg.isdigit() or int(arg) == 0:
            self.say("usage: %timeline [N] (the last N cells, default 10)")
            return
        self.say(format_timeline(self.s.timeline, int(arg)))

    def magic(self, line):
        word, _, arg = line.partition(" ")
        arg = arg.strip()
        if word == "%help":
            self.say(HELP)
        elif word == "%stream":
            if arg not in ("on", "off"):
                self.say("usage: %stream on|off")
            else:
                self.s.stream = arg == "on"
                self.say(f"streaming {arg}")
        elif word == "%timeout":
            if arg == "off":
                self.s.timeout = None
                self.say("no cell timeout")
            else:
                try:
                    self.s.timeout = float(arg)
                    if self.s.timeout <= 0:
                        raise ValueError
                    self.say(f"cells are interrupted after {self.s.timeout:g} s")
                except ValueError:
                    self.say("usage: %timeout SECONDS (> 0) | off")
        elif word == "%status":
            self.status()
        elif word in ("%result", "%dist_result"):
            self.result(arg)
        elif word in ("%timeline", "%dist_timeline"):
            self.timeline(arg)
        elif word == "%sync":
            self.s.sync()
            self.say(f"all {self.s.world} ranks reached the barrier")
        elif word == "%pull":
            self.pull(arg)
        elif word == "%push":
            self.push(arg)
        elif word == "%restart":
            self.say("restarting the workers...")
            self.s.restart()
            self.say(f"{self.s.world} fresh worker(s) ready (attempt {self.s.attempt})")
        elif word in ("%shutdown", "%exit", "%quit"):
            return False
        else:
            self.say(f"unknown magic {word}; %help lists them (the workers' Python has no "
                     "IPython, whose magics would run on the ranks)")
        return True

    def pull(self, arg):
        words = arg.split()
        if len(words) not in (1, 3) or (len(words) == 3 and words[1] != "--rank"):
            self.say("usage: %pull NAME [--rank R]")
            return
        rank = parse_ranks(words[2] if len(words) == 3 else "0", self.s.world)[0]
        value = self.s.pull([words[0]], rank)[words[0]]
        self.local[words[0]] = value
        self.say(f"[rank {rank}] {words[0]} = {value!r}")

    def push(self, arg):
        target, _, spec = arg.partition(" --ranks ")
        name, eq, expr = target.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not expr.strip():
            self.say("usage: %push NAME=EXPR [--ranks SPEC]")
            return
        ranks = parse_ranks(spec or "all", self.s.world)
        try:
            value = eval(expr, self.local)  # noqa: S307 - the user's own expression
        except Exception as e:  # noqa: BLE001 - shown to the user
            self.say(f"error: {expr.strip()}: {e!r}; nothing was pushed")
            return
        self.local[name] = value
        self.s.push({name: value}, ranks)
        self.say(f"pushed {name} to rank(s) {', '.join(map(str, ranks))}")

    def status(self):
        st = self.s.statuses(fresh=True)
        dead = set(self.s.dead_ranks(list(st)))
        for s in st.values():  # on several nodes, the address each node advertises
            s["host"] += f" ({s['addr']})" if s.get("addr") else ""
        host_width = max([4] + [len(s["host"]) for s in st.values()])
        self.say(f"{'rank':>4}  {'host':{host_width}}  {'pid':>7}  {'alive':5}  {'state':5}  "
                 f"{'last cell':>9}  {'memory':>9}  device")
        for r in range(self.s.world):
            s = st.get(r)
            if not s:
                self.say(f"{r:>4}  (not reported)")
                continue
            last = "-" if s["last_cell"] is None else str(s["last_cell"])
            mem = "-" if s["rss_mb"] is None else f"{s['rss_mb']:.0f} MB"
            gpu = f" ({s['gpu_mb']:.0f} MB)" if "gpu_mb" in s else ""
            self.say(f"{r:>4}  {s['host']:{host_width}}  {s['pid']:>7}  "
                     f"{'no' if r in dead else 'yes':5}  {'busy' if s['busy'] else 'idle':5}  "
                     f"{last:>9}  {mem:>9}  {s['device']}{gpu}")
        self.say(runner_line(st))

    def use_ipython(self):
        """Checks and completes cells as the ranks' IPython will read them,
        when they run through IPython and this Python has it too."""
        if any(r != "exec" for r in self.s.runners.values()):
            try:
                from IPython.core.inputtransformer2 import TransformerManager
            except ImportError:
                return
            self.ipython = TransformerManager()

    def loop(self):
        self.use_ipython()
        if self.tty:
            _enable_history(self.s)
            self.say(f"dtrun interactive: {self.s.world} rank(s) ready. %help for help; "
                     "Ctrl-D or %shutdown to leave.")
        while True:
            try:
                cell = self.read_cell()
            except KeyboardInterrupt:
                self.say("")
                continue
            if cell is None:
                return 0
            kind, text = cell
            try:
                if kind == "magic":
                    if not self.magic(text):
                        return 0
                else:
                    self.run_cell(kind, text)
            except SessionError as e:
                self.say(f"error: {e}")
                if self.s.launcher_pid and not _launcher_alive(self.s.launcher_pid):
                    return 1


# The console's own magics; any other %word goes to the ranks' IPython.
MAGICS = ("%help", "%stream", "%timeout", "%status", "%sync", "%pull", "%push", "%restart",
          "%shutdown", "%exit", "%quit", "%result", "%dist_result", "%timeline",
          "%dist_timeline")


def _rank_options(word, rest):
    """'%rank SPEC [--show R] [--noblock] [CODE]' (or '%distributed
    [--noblock] [CODE]') -> ((spec, show, noblock), code)."""
    words = rest.split(" ")
    spec = "all"
    if word == "%rank" and words and words[0]:
        spec = words.pop(0)
    show, noblock = None, False
    while words and words[0] in ("--show", "--noblock", ""):
        option = words.pop(0)
        if option == "--noblock":
            noblock = True
        elif option == "--show":
            show = words.pop(0) if words else ""
    return (spec, show, noblock), " ".join(words)


def _launcher_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _exits(pid, seconds):
    """Whether the child `pid` exits by itself within `seconds` (reaped)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        time.sleep(0.05)
    return False


def _enable_history(session):
    try:
        import atexit
        import readline
    except ImportError:
        return
    matches = []

    def complete(text, state):
        if state == 0:
            matches[:] = session.complete(text, 0) if text else []
        return matches[state] if state < len(matches) else None

    readline.set_completer(complete)
    readline.set_completer_delims(" \t\n`~!@#$%^&*()-=+[{]}\\|;:'\",<>/?")
    readline.parse_and_bind("tab: complete")
    path = os.path.expanduser("~/.dtrun_history")
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)
    atexit.register(lambda: _save_history(readline, path))


def _save_history(readline, path):
    try:
        readline.write_history_file(path)
    except OSError:
        pass


def main():
    p = argparse.ArgumentParser(prog="dtrun --interactive")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--launcher-pid", type=int)
    p.add_argument("--log", help="dtrun's log, named when something fails")
    p.add_argument("--session-dir", help="removed at the end unless something failed")
    p.add_argument("--rdzv-key", help="several nodes: where the rendezvous store at "
                   "--host/--port names the current round's store")
    a = p.parse_args()
    session = Session(a.host, a.port, a.world_size, a.launcher_pid, a.session_dir, a.rdzv_key)
    console = Console(session)
    rc = 0
    try:
        try:
            session.wait_ready()
        except KeyboardInterrupt:
            rc = 130
        else:
            rc = console.loop()
    except SessionError as e:
        console.say(f"error: {e}" + (f" (see {a.log})" if a.log else ""))
        rc = 1
    finally:
        session.shutdown()
        if a.launcher_pid:
            # With several nodes dtrun ends the job on every node by itself.
            if not (a.rdzv_key and rc == 0 and _exits(a.launcher_pid, 30)):
                try:
                    os.kill(a.launcher_pid, signal.SIGTERM)
                    os.waitpid(a.launcher_pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
        if a.session_dir and rc == 0:
            shutil.rmtree(a.session_dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
