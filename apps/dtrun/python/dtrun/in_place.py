"""In-place recovery for a Python worker (`dtrun --restart=in-place`): when
a rank dies, dtrun starts only its replacement, and the other ranks keep
their processes, build their process group again around it and hand it
their state. Without this helper a Python worker is restarted with its
whole group, as under torchrun. What a worker writes:

    import dtrun.in_place
    group = dtrun.in_place.Group()          # init_process_group (gloo), opted in
    step = group.join(0, net, opt)          # a replacement: the survivors' step
    model = DDP(net)
    while step < steps:
        try:
            train_one_step(model, opt, step)
            step += 1
            group.beat(step)                # dtrun sees the step (and the recovery)
        except RuntimeError as e:           # a collective failed: a rank died
            step = group.regroup(e, step, net, opt)
            model = DDP(net)                # DDP again, on the new group

`step` is the number of steps whose update is in the model. Every rank's
data and random draws must depend on the step alone (seed a generator from
it), so that a replacement draws what the rank it replaces would have. The
state moved is `net.state_dict()` and `opt.state_dict()`, torch.save'd by
the lowest rank holding the newest step and sent to each rank behind it.
The protocol with dtrun is rendezvous/in_place.h's."""
import io
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["Group"]

RESTART_ENV, IN_PLACE, READY_SUFFIX = "DTRUN_RESTART", "in-place", ".in_place"
REGROUP_WAIT = timedelta(seconds=60)  # rendezvous/in_place.h's kRegroupWait


def _regroup_key(attempt):
    return f"/worker/attempt_{attempt}/dtrun_regroup"


class Group:
    """This rank's default process group, built in its attempt's key space
    of the launcher's store, and re-formed there after a failure."""

    def __init__(self, backend="gloo", timeout=timedelta(minutes=30)):
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.wanted = os.environ.get(RESTART_ENV) == IN_PLACE
        self.backend, self.timeout = backend, timeout
        self._beat_path = os.environ.get("DTRUN_HEARTBEAT_FILE", "")
        self._beat = None
        self.store = self._connect()
        self._init()
        if self.wanted and self._beat_path:  # dtrun replaces in place only then
            open(self._beat_path + READY_SUFFIX, "w").close()

    def _connect(self):
        """A client of the launcher's store. Torch >= 2.4 asks for libuv,
        which some builds lack (Debian's): then without it."""
        addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        try:
            return dist.TCPStore(*addr, self.world_size, False, self.timeout)
        except RuntimeError as e:
            if "libuv" not in str(e):
                raise
            return dist.TCPStore(*addr, self.world_size, False, self.timeout, use_libuv=False)

    def _init(self):
        # A key space of its own per attempt: the group a replacement joins
        # is never confused with the one that failed.
        store = dist.PrefixStore(f"/worker/attempt_{self.attempt}/dtrun_pypg", self.store)
        dist.init_process_group(self.backend, store=store, rank=self.rank,
                                world_size=self.world_size, timeout=self.timeout)

    def join(self, step, model, optimizer):
        """The step to start from: on a replacement, the survivors' state
        (model and optimizer loaded) and its step (collective with their
        regroup()); on any other rank, `step`."""
        if not (self.wanted and self.attempt > 0 and self._announced(self.attempt)):
            return step
        return self._share(-1, model, optimizer, time.time())

    def regroup(self, error, step, model, optimizer):
        """After `error` (a failed collective): the group re-formed around
        the replacement dtrun starts, the newest state shared; returns the
        step to go on from. Raises `error` when in-place recovery was not
        asked for or no replacement comes (then the group restarts whole)."""
        if not self.wanted:
            raise error
        print(f"rank {self.rank}: {error}\nrank {self.rank}: re-forming the group in place "
              f"after step {step} (attempt {self.attempt + 1})", file=sys.stderr, flush=True)
        # Dropped first: its sockets close, so every survivor's collective
        # in flight fails now rather than at its timeout.
        dist.destroy_process_group()
        try:
            self.store.wait([_regroup_key(self.attempt + 1)], REGROUP_WAIT)
        except RuntimeError:
            raise error
        self.attempt += 1
        self._init()
        return self._share(step, model, optimizer, time.time())

    def _announced(self, attempt):
        """Whether dtrun's word for `attempt` is in the store. torch 1.13's
        store has no check(): a short wait on a connection of its own, since
        a timed-out wait leaves that client unusable."""
        key = _regroup_key(attempt)
        if hasattr(self.store, "check"):
            return self.store.check([key])
        probe = self._connect()
        try:
            probe.wait([key], timedelta(milliseconds=10))
            return True
        except RuntimeError:
            return False

    def beat(self, step):
        """dtrun's beat: the step completed (its hang watch, progress and
        recovery report read it; a replacement counts as back once it beats)."""
        if not self._beat_path:
            return
        if self._beat is None:
            self._beat = os.open(self._beat_path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._beat, b"%d\n" % step, 0)

    def _share(self, held, model, optimizer, began):
        held_t = torch.tensor([held], dtype=torch.long)
        every = [torch.zeros(1, dtype=torch.long) for _ in range(self.world_size)]
        dist.all_gather(every, held_t)
        held_by = [int(t.item()) for t in every]
        newest = max(held_by)
        if newest < 0:
            raise RuntimeError("the group re-formed in place, but no rank holds the run's state")
        source = held_by.index(newest)
        if self.rank == source:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            for r, h in enumerate(held_by):
                if h < newest:
                    dist.send(torch.tensor([data.numel()], dtype=torch.long), r)
                    dist.send(data, r)
        elif held < newest:
            size = torch.zeros(1, dtype=torch.long)
            dist.recv(size, source)
            data = torch.empty(int(size.item()), dtype=torch.uint8)
            dist.recv(data, source)
            state = torch.load(io.BytesIO(data.numpy().tobytes()))
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        self._resumed(newest, "peer" if held < newest else "kept", began)
        return newest

    def _resumed(self, step, source, began):
        # dtrun's recovery report reads this record beside the beat file.
        if self._beat_path:
            with open(self._beat_path + ".resume", "w") as f:
                f.write("%d %s %.6f %.6f\n" % (step, source, began, time.time()))
