"""dtrun's interactive sessions from IPython/Jupyter: `%load_ext dtrun`.

  %dist_init --num-processes N [--gpu-ids 0,2] [--python PY] [--dtrun PATH]
      starts `dtrun --interactive --no-console` with N workers; from then on a
      plain cell runs on every rank (while %dist_mode is on)
  %dist_mode [on|off]     plain cells on every rank (on) or in the kernel (off)
  %%distributed [--local] [--noblock]   a cell on every rank, whatever the mode
  %%rank [0] / %%rank 1-3 / %%rank all [--local] [--noblock] [--show R]
      a cell on those ranks only; --local: in the kernel too; --noblock:
      return at once with a name (c1, c2, ...); --show R: only rank R's
      output (the others' errors still show)
  %dist_result NAME [--wait]          what a non-blocking cell's ranks sent so
                                      far, or wait for the end
  %dist_timeline [N]      each rank's wall time of the last N cells, slowest marked
  %dist_push NAME... [--ranks SPEC]   kernel variables -> ranks (default all)
  %dist_pull NAME... [--rank R]       rank R's variables -> kernel (default 0;
                                      tensors arrive on the CPU)
  %sync                   a barrier on every rank
  %dist_stream [on|off]   output as it is printed (default on)
  %dist_timeout S|off     interrupt cells that run longer than S seconds
  %dist_status            each rank: host, pid, alive, busy/idle, memory
  %dist_restart           new workers with fresh state
  %dist_shutdown          stops the workers
Cells run through the ranks' IPython when their Python has it (magics,
!cmd, obj?), else through exec; %dist_status says which. The kernel's
interrupt button interrupts the cell on its ranks. What a rank
displays (display(obj), objects with _repr_html_/_repr_png_, matplotlib
figures) shows as that output type, labelled with the rank. Tab completes
from rank 0's namespace.

The package sits in dtrun's source tree under apps/dtrun/python (put that on
PYTHONPATH), and dtrun writes it next to each interactive session.
"""


def load_ipython_extension(ip):
    from dtrun import magics

    magics.load_ipython_extension(ip)


def unload_ipython_extension(ip):
    from dtrun import magics

    magics.unload_ipython_extension(ip)
