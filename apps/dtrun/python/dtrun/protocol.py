"""The interactive session's protocol: every store key the client, the
workers and dtrun use, in one place.

dtrun (C++) writes a few of these itself: the crash record and, with several
nodes, the current round's key. Their C++ spelling is
apps/dtrun/interactive_protocol.h; tests/apps/interactive_protocol_test.py
checks that both agree. apps/dtrun/python/README.md describes the protocol.

Workers' store (each attempt, or each round with several nodes, has its own):
  dtrun/i/ready                  counter; each worker adds 1 once it serves cells
  dtrun/i/status/<rank>          JSON {pid, host, attempt, busy, last_cell, rss_mb, runner, ...}
  dtrun/i/has_status/<rank>      counter; > 0 once status/<rank> exists
  dtrun/i/cell/<n>               JSON {kind, code, ranks, stream, timeout?, noblock?, ...}
  dtrun/i/statusn/<n>            counter of ranks that refreshed their status for cell n
  dtrun/i/result/<n>/<rank>      JSON {ok, out, err, wall, value?, error?, interrupted?,
                                 abandoned?, timed_out?, cancelled?}
  dtrun/i/interrupt/<n>          counter; the client adds 1 to interrupt cell n
  dtrun/i/restart/<attempt>      counter; > 0: the workers of that attempt exit
  dtrun/i/stream/<n>/<rank>/<k>  JSON [which, text]: output chunk k
  dtrun/i/streamn/<n>/<rank>     counter of those chunks
  dtrun/i/data/<n>/<k>           chunk k of a "push" cell's pickled values
  dtrun/i/data/<n>/<rank>/<k>    chunk k of a "pull" cell's pickled values
  dtrun/i/pg/<generation>/...    the workers' own process group (%reset_pg)
  dtrun/crash, dtrun/crash_count one node: the latest worker crash, and how many

Rendezvous store (several nodes; it outlives the rounds):
  dtrun/i/<run_id>/current       "<round> <world> <host>:<port>" of the round's store
  dtrun/i/<run_id>/crash, .../crash_count   crashes on any node
"""

PREFIX = "dtrun/i/"
READY = PREFIX + "ready"
CRASH = "crash"
CRASH_COUNT = "crash_count"
LOCAL_CRASH_PREFIX = "dtrun/"
SESSION_LINE_TAG = "dtrun-interactive:"
_CURRENT = "current"


def cell_key(n):
    return f"{PREFIX}cell/{n}"


def result_key(n, rank):
    return f"{PREFIX}result/{n}/{rank}"


def status_key(rank):
    return f"{PREFIX}status/{rank}"


def interrupt_key(n):
    return f"{PREFIX}interrupt/{n}"


def restart_key(attempt):
    return f"{PREFIX}restart/{attempt}"


def status_answers_key(n):
    return f"{PREFIX}statusn/{n}"


def has_status_key(rank):
    return f"{PREFIX}has_status/{rank}"


def stream_key(n, rank, k):
    return f"{PREFIX}stream/{n}/{rank}/{k}"


def stream_count_key(n, rank):
    return f"{PREFIX}streamn/{n}/{rank}"


def data_key(n, k, rank=None):
    return f"{PREFIX}data/{n}/{k}" if rank is None else f"{PREFIX}data/{n}/{rank}/{k}"


def pg_prefix(generation):
    return f"{PREFIX}pg/{generation}"


def run_prefix(run_id):
    """Several nodes: the run's keys in the rendezvous store."""
    return f"{PREFIX}{run_id}/"


def current_round_key(run_id):
    return run_prefix(run_id) + _CURRENT


def parse_current_round(value):
    """(round, world, "host:port") from the value under current_round_key."""
    rnd, world, addr = value.split(" ")
    return int(rnd), int(world), addr


def run_id_of(round_key):
    """The run id a current_round_key was made from; ValueError for any
    other key."""
    if not (round_key.startswith(PREFIX) and round_key.endswith("/" + _CURRENT)):
        raise ValueError(f"{round_key!r} is not a key made by current_round_key")
    run_id = round_key[len(PREFIX):-len("/" + _CURRENT)]
    if not run_id:
        raise ValueError(f"{round_key!r} names no run id")
    return run_id


def crash_prefix(run_id=None):
    """Where dtrun publishes worker crashes: the workers' store on one node
    (run_id None), the rendezvous store of the run across nodes."""
    return LOCAL_CRASH_PREFIX if run_id is None else run_prefix(run_id)


def parse_session_line(line):
    """The fields of a headless session's first line,
    "dtrun-interactive: host H port P world W dir D [key K]", as a dict
    (port and world as ints, key None when absent); ValueError otherwise."""
    fields = line.split()
    if not fields or fields[0] != SESSION_LINE_TAG or len(fields) % 2 == 0:
        raise ValueError(f"not a session line: {line!r}")
    out = dict(zip(fields[1::2], fields[2::2]))
    if not {"host", "port", "world", "dir"} <= out.keys():
        raise ValueError(f"session line without host, port, world and dir: {line!r}")
    return {"host": out["host"], "port": int(out["port"]), "world": int(out["world"]),
            "dir": out["dir"], "key": out.get("key")}
