"""dtrun's interactive sessions from IPython/Jupyter: `%load_ext dtrun`.

  %dist_init --num-processes N [--python PY] [--dtrun PATH]
      starts `dtrun --interactive --no-console` with N workers; from then on a
      plain cell runs on every rank
  %%rank [0] / %%rank 1-3 / %%rank all    a cell on those ranks only
  %dist_status      each rank: pid, alive, busy/idle, last cell, memory
  %dist_shutdown    stops the workers

The package sits in dtrun's source tree under apps/dtrun/python (put that on
PYTHONPATH), and dtrun writes it next to each interactive session.
"""
import json
import os
import shlex
import shutil
import subprocess

_STATE = {"session": None, "proc": None}


def _session():
    if _STATE["session"] is None:
        raise RuntimeError("no dtrun session: run %dist_init --num-processes N first")
    return _STATE["session"]


def _start(num_processes, python=None, dtrun=None, timeout=300.0):
    from dtrun.session import Session, SessionError

    exe = dtrun or os.environ.get("DTRUN") or shutil.which("dtrun")
    if not exe:
        raise RuntimeError("cannot find the dtrun binary: pass --dtrun PATH or set $DTRUN")
    cmd = [exe, "--interactive", "--no-console", f"--nproc-per-node={num_processes}"]
    if python:
        cmd.append(f"--python={python}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True, preexec_fn=_die_with_parent)
    line = proc.stdout.readline()
    fields = line.split()
    if not line.startswith("dtrun-interactive:") or len(fields) < 9:
        proc.kill()
        raise RuntimeError(f"dtrun did not start a session (exit code {proc.wait()}); "
                           f"run {' '.join(shlex.quote(c) for c in cmd)} in a terminal to see why")
    host, port, world = fields[2], int(fields[4]), int(fields[6])
    session = Session(host, port, world, session_dir=fields[8])
    try:
        session.wait_ready(timeout=timeout)
    except SessionError:
        session.shutdown()
        proc.kill()
        proc.wait()
        raise
    _STATE.update(session=session, proc=proc)
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


def _run(code, spec="all"):
    from dtrun.session import parse_ranks, format_results

    session = _session()
    results = session.run(code, parse_ranks(spec, session.world))
    text = format_results(results)
    if text:
        print(text)


def _to_all_ranks(lines):
    """IPython input transformer: with a session open, a plain cell runs on
    every rank (magics and %%cells keep their meaning)."""
    if _STATE["session"] is None or not lines or lines[0].lstrip().startswith("%"):
        return lines
    return [f"get_ipython().run_cell_magic('rank', 'all', {json.dumps(''.join(lines))})\n"]


def load_ipython_extension(ip):
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
    from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

    @magics_class
    class DtrunMagics(Magics):
        @magic_arguments()
        @argument("--num-processes", "-n", type=int, default=2)
        @argument("--python", default=None)
        @argument("--dtrun", default=None)
        @line_magic
        def dist_init(self, line):
            args = parse_argstring(self.dist_init, line)
            if _STATE["session"] is not None:
                _shutdown()
            s = _start(args.num_processes, args.python, args.dtrun)
            print(f"dtrun: {s.world} rank(s) ready (torch.distributed initialised); "
                  "plain cells now run on every rank, %%rank SPEC on some")

        @cell_magic
        def rank(self, line, cell):
            _run(cell, line or "all")

        @line_magic
        def dist_status(self, line):
            session = _session()
            st = session.statuses(fresh=True)
            dead = set(session.dead_ranks(list(st)))
            for r in range(session.world):
                s = st.get(r, {})
                print(f"rank {r}: pid {s.get('pid')}, {'dead' if r in dead else 'alive'}, "
                      f"{'busy' if s.get('busy') else 'idle'}, last cell {s.get('last_cell')}, "
                      f"{s.get('rss_mb')} MB, {s.get('device')}")

        @line_magic
        def dist_shutdown(self, line):
            _shutdown()
            print("dtrun: workers stopped")

    ip.register_magics(DtrunMagics)
    if _to_all_ranks not in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.append(_to_all_ranks)


def unload_ipython_extension(ip):
    _shutdown()
    if _to_all_ranks in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.remove(_to_all_ranks)
