"""The magics of dtrun's Jupyter extension (see the package's docstring)."""
import json
import os
import shlex
import subprocess
import tempfile

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import publish_display_data

from dtrun import protocol
from dtrun._binary import environ, find as find_binary
from dtrun.session import (LabelledLines, Session, SessionError, format_results,
                           format_timeline, parse_ranks, runner_line, spans)

# shows: the --show rank of each non-blocking cell, by handle name.
_STATE = {"session": None, "proc": None, "mode": True, "shows": {}}


def _session():
    if _STATE["session"] is None:
        raise _usage("no dtrun session: run %dist_init --num-processes N first")
    return _STATE["session"]


def _usage(text):
    return UsageError(text)


# %dist_init's flags that go to dtrun as they are (a session across nodes).
NODE_FLAGS = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend",
              "rdzv_endpoint", "rdzv_id", "local_addr")


def _start(num_processes, python=None, dtrun=None, gpu_ids=None, timeout=300.0, nodes=None):
    exe = dtrun or find_binary("dtrun")
    if not exe:
        raise _usage("cannot find the dtrun binary: pass --dtrun PATH or set $DTRUN")
    cmd = [exe, "--interactive", "--no-console", f"--nproc-per-node={num_processes}"]
    if python:
        cmd.append(f"--python={python}")
    if gpu_ids:
        cmd.append(f"--gpu-ids={gpu_ids}")
    for name, value in (nodes or {}).items():
        if value is not None:
            cmd.append(f"--{name.replace('_', '-')}={value}")
    # dtrun's log to a file (a pipe nobody reads would fill and stop it).
    log = tempfile.TemporaryFile("w+")
    # The ranks run the kernel's Python unless --python says otherwise.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=environ(),
                            start_new_session=True, preexec_fn=_die_with_parent)
    line = proc.stdout.readline()
    try:
        started = protocol.parse_session_line(line)
    except ValueError:
        started = None
    if started is None:
        proc.kill()
        rc = proc.wait()
        log.seek(0)
        said = log.read().strip()[-2000:]
        raise _usage(f"dtrun did not start a session (exit code {rc})" +
                     (f": {said}" if said else f"; run {shlex.join(cmd)} in a terminal to see why"))
    # Across nodes the line ends "key K": the store named is the rendezvous
    # store, and K names the current round's workers' store there.
    session = Session(started["host"], started["port"], started["world"],
                      session_dir=started["dir"], rdzv_key=started["key"])
    session.stream = True
    try:
        session.wait_ready(timeout=timeout)
    except SessionError:
        session.shutdown()
        proc.kill()
        proc.wait()
        raise
    _STATE.update(session=session, proc=proc, mode=True, shows={})
    return session


def _die_with_parent():
    """In the child: dtrun gets SIGTERM when the kernel that started it dies."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _shutdown():
    session, proc = _STATE["session"], _STATE["proc"]
    _STATE.update(session=None, proc=None)
    if session is not None:
        session.shutdown()
    if proc is not None:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait()


def _run(code, spec="all", show=None, noblock=False):
    session = _session()
    try:
        ranks = parse_ranks(spec, session.world)
        if show is not None and show not in ranks:
            raise SessionError(f"--show {show}: rank {show} does not run this cell ({spec})")
    except SessionError as e:
        raise _usage(str(e)) from None
    if noblock:
        name = session.start(code, ranks)
        _STATE["shows"][name] = show
        print(f"{name}: running on rank(s) {spans(ranks)}; %dist_result {name} shows what "
              f"has arrived, %dist_result {name} --wait waits for the end")
        return
    behind = session.busy_with(ranks)
    if behind:
        print(f"(waiting for {', '.join(behind)} to finish on these ranks first)")
    lines = LabelledLines(print, show) if session.stream else None
    _show(session.run(code, ranks, lines), lines, session.stream, show)


def _show(results, lines, streamed, show):
    """Prints a cell's results, labelled per rank; rich output as the
    notebook's own display data."""
    if lines:
        lines.flush()
    text = format_results({r: {k: v for k, v in res.items() if k != "displays"}
                           for r, res in results.items()}, streamed=streamed, show=show)
    if text:
        print(text)
    for r in sorted(results):
        if show is None or r == show:
            for bundle in results[r].get("displays", ()):
                _publish(r, bundle)


def _publish(rank, bundle):
    """A rank's rich output as the notebook's own display data, labelled."""
    data = dict(bundle)
    data["text/plain"] = f"[rank {rank}] {bundle.get('text/plain', '')}"
    if "text/html" in data:
        data["text/html"] = f"<div><small>[rank {rank}]</small></div>\n{data['text/html']}"
    publish_display_data(data, metadata={"dtrun": {"rank": rank}})


def _parse_cell_line(line, magic="rank"):
    """'%%rank' and '%%distributed' arguments: a rank spec ('[0, 1]', '1-3',
    'all'; %%rank only) with --local, --noblock and --show R anywhere ->
    (spec, local, show, noblock)."""
    words = shlex.split(line)
    local = noblock = False
    show, spec = None, []
    i = 0
    while i < len(words):
        if words[i] == "--local":
            local = True
        elif words[i] == "--noblock":
            noblock = True
        elif words[i] == "--show":
            if i + 1 >= len(words) or not words[i + 1].isdigit():
                raise _usage(f"--show takes a rank, e.g. %%{magic} --show 1")
            show = int(words[i + 1])
            i += 1
        elif words[i].startswith("--"):
            raise _usage(f"unknown option {words[i]}: %%{magic} takes --local, --noblock "
                         "and --show R")
        elif magic == "distributed":
            raise _usage(f"%%distributed runs on every rank ('{words[i]}'?): "
                         "%%rank SPEC picks ranks")
        else:
            spec.append(words[i])
        i += 1
    return " ".join(spec) or "all", local, show, noblock


def _on_off(line, what):
    arg = line.strip()
    if arg not in ("", "on", "off"):
        raise _usage(f"usage: %{what} on|off (no argument: show it)")
    return None if arg == "" else arg == "on"


def _names_and_option(line, option):
    """'a b --ranks 0,1' -> (['a', 'b'], '0,1')."""
    words = line.split()
    value = None
    if option in words:
        at = words.index(option)
        if at + 1 >= len(words):
            raise _usage(f"{option} needs a value")
        value = words[at + 1]
        del words[at:at + 2]
    if not words:
        raise _usage("name at least one variable")
    return words, value


def _to_all_ranks(lines):
    """IPython input transformer: with a session open and %dist_mode on, a
    plain cell runs on every rank (magics and %%cells keep their meaning)."""
    if (_STATE["session"] is None or not _STATE["mode"] or not lines
            or lines[0].lstrip().startswith("%")):
        return lines
    return [f"get_ipython().run_cell_magic('distributed', '', {json.dumps(''.join(lines))})\n"]


def _complete(text):
    """IPython custom matcher: names and attributes from rank 0."""
    session = _STATE["session"]
    if session is None or not text or not (text[0].isalpha() or text[0] == "_"):
        return []
    try:
        return session.complete(text, 0)
    except Exception:  # noqa: BLE001 - completion must never break the kernel
        return []


def _status_lines(session):
    st = session.statuses(fresh=True)
    dead = set(session.dead_ranks(list(st)))
    for r in range(session.world):
        s = st.get(r, {})
        gpu = f", GPU {s['gpu_mb']} MB" if "gpu_mb" in s else ""
        host = s.get("host", "") + (f" ({s['addr']})" if s.get("addr") else "")
        yield (f"rank {r}: host {host}, pid {s.get('pid')}, "
               f"{'dead' if r in dead else 'alive'}, {'busy' if s.get('busy') else 'idle'}, "
               f"last cell {s.get('last_cell')}, {s.get('rss_mb')} MB, {s.get('device')}{gpu}")
    yield runner_line(st)


@magics_class
class DtrunMagics(Magics):
    @magic_arguments()
    @argument("--num-processes", "-n", type=int, default=2)
    @argument("--gpu-ids", default=None, help="GPU per local rank, e.g. 0,2")
    @argument("--python", default=None)
    @argument("--dtrun", default=None)
    @argument("--nnodes", default=None, help="a session across nodes: N (start the others "
              "with dtrun --interactive --no-console)")
    @argument("--node-rank", default=None)
    @argument("--master-addr", default=None)
    @argument("--master-port", default=None)
    @argument("--rdzv-backend", default=None)
    @argument("--rdzv-endpoint", default=None)
    @argument("--rdzv-id", default=None)
    @argument("--local-addr", default=None)
    @line_magic
    def dist_init(self, line):
        args = parse_argstring(self.dist_init, line)
        if _STATE["session"] is not None:
            _shutdown()
        nodes = {name: getattr(args, name) for name in NODE_FLAGS}
        s = _start(args.num_processes, args.python, args.dtrun, args.gpu_ids, nodes=nodes)
        print(f"dtrun: {s.world} rank(s) ready (torch.distributed initialised); "
              "plain cells now run on every rank, %%rank SPEC on some")

    @cell_magic
    def rank(self, line, cell):
        self._cell("rank", line, cell)

    @cell_magic
    def distributed(self, line, cell):
        self._cell("distributed", line, cell)

    def _cell(self, magic, line, cell):
        """A cell on the ranks; --local: in the kernel too (after the ranks,
        or at once when they run it without blocking)."""
        spec, local, show, noblock = _parse_cell_line(line, magic)
        _run(cell, spec, show, noblock)
        if local:
            mode, _STATE["mode"] = _STATE["mode"], False  # this run stays in the kernel
            try:
                self.shell.run_cell(cell, store_history=False)
            finally:
                _STATE["mode"] = mode

    @line_magic
    def dist_result(self, line):
        session = _session()
        words = line.split()
        wait = "--wait" in words
        names = [w for w in words if w != "--wait"]
        if len(names) != 1 or any(w.startswith("--") for w in names):
            raise _usage("usage: %dist_result NAME [--wait]")
        show = _STATE["shows"].get(names[0])
        lines = LabelledLines(print, show) if wait and session.stream else None
        try:
            results = session.result(names[0], wait=wait, on_stream=lines)
        except SessionError as e:
            raise _usage(str(e)) from None
        _show(results, lines, lines is not None, show)

    @line_magic
    def dist_timeline(self, line):
        session = _session()
        arg = line.strip() or "10"
        if not arg.isdigit() or int(arg) == 0:
            raise _usage("usage: %dist_timeline [N] (the last N cells, default 10)")
        print(format_timeline(session.timeline, int(arg)))

    @line_magic
    def dist_mode(self, line):
        on = _on_off(line, "dist_mode")
        if on is not None:
            _STATE["mode"] = on
        print("dist_mode " + ("on: plain cells run on every rank" if _STATE["mode"] else
                              "off: plain cells run in the kernel; %%distributed and "
                              "%%rank on the ranks"))

    @line_magic
    def dist_stream(self, line):
        session = _session()
        on = _on_off(line, "dist_stream")
        if on is not None:
            session.stream = on
        print(f"streaming {'on' if session.stream else 'off'}")

    @line_magic
    def dist_timeout(self, line):
        session = _session()
        arg = line.strip()
        if arg == "off":
            session.timeout = None
            print("no cell timeout")
            return
        try:
            session.timeout = float(arg)
            if session.timeout <= 0:
                raise ValueError
        except ValueError:
            session.timeout = None
            raise _usage("usage: %dist_timeout SECONDS (> 0) | off") from None
        print(f"cells are interrupted after {session.timeout:g} s")

    @line_magic
    def dist_push(self, line):
        session = _session()
        names, spec = _names_and_option(line, "--ranks")
        missing = [n for n in names if n not in self.shell.user_ns]
        if missing:
            raise _usage(f"the kernel has no variable '{missing[0]}'")
        try:
            ranks = parse_ranks(spec or "all", session.world)
            session.push({n: self.shell.user_ns[n] for n in names}, ranks)
        except SessionError as e:
            raise _usage(str(e)) from None
        print(f"pushed {', '.join(names)} to rank(s) {', '.join(map(str, ranks))}")

    @line_magic
    def dist_pull(self, line):
        session = _session()
        names, rank = _names_and_option(line, "--rank")
        try:
            [r] = parse_ranks(rank or "0", session.world)
            values = session.pull(names, r)
        except (SessionError, ValueError) as e:
            raise _usage(str(e) if isinstance(e, SessionError)
                         else "--rank takes one rank") from None
        self.shell.user_ns.update(values)
        print(f"pulled {', '.join(names)} from rank {r}")

    @line_magic
    def sync(self, line):
        session = _session()
        try:
            session.sync()
        except SessionError as e:
            raise _usage(str(e)) from None
        print(f"all {session.world} ranks reached the barrier")

    @line_magic
    def dist_status(self, line):
        for text in _status_lines(_session()):
            print(text)

    @line_magic
    def dist_restart(self, line):
        session = _session()
        try:
            session.restart()
        except SessionError as e:
            raise _usage(str(e)) from None
        print(f"dtrun: {session.world} fresh worker(s) ready (attempt {session.attempt})")

    @line_magic
    def dist_shutdown(self, line):
        _shutdown()
        print("dtrun: workers stopped")


def load_ipython_extension(ip):
    ip.register_magics(DtrunMagics)
    if _to_all_ranks not in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.append(_to_all_ranks)
    if _complete not in ip.Completer.custom_matchers:
        ip.Completer.custom_matchers.append(_complete)


def unload_ipython_extension(ip):
    _shutdown()
    if _to_all_ranks in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.remove(_to_all_ranks)
    if _complete in ip.Completer.custom_matchers:
        ip.Completer.custom_matchers.remove(_complete)
