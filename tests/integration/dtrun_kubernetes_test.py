"""dtrun as Kubernetes operators start torchrun: through the environment.
Each test runs two loopback "pods", each a dtrun with exactly the variables
the operator sets (read from their source, named below) and the plain
command line the operator runs, and checks what the workers got.

- Kubeflow Trainer v2 (TrainJob on JobSet): PET_NNODES, PET_NPROC_PER_NODE
  (`auto`), PET_NODE_RANK from the job-completion index, PET_MASTER_ADDR,
  PET_MASTER_PORT=29500 (here a free port), JOB_COMPLETION_INDEX; each pod
  in a cgroup of its own with a CPU quota, as a pod's CPU limit is, so
  `auto` counts 1 CPU, not the host's.
- PyTorchJob v1: the same PET_* and, for the pod, MASTER_ADDR, MASTER_PORT,
  WORLD_SIZE (pods) and RANK (pod index), which must not reach the workers
  as theirs; with an elastic policy PET_RDZV_*, PET_NNODES=min:max,
  PET_MAX_RESTARTS, PET_RDZV_CONF and PET_STANDALONE="".
- Volcano's pytorch plugin: MASTER_ADDR, MASTER_PORT, WORLD_SIZE = pods,
  RANK = pod index, which the user's command line maps to dtrun's flags.
- A master's name that does not resolve yet (a headless service's record
  comes seconds after the pod) is retried until the join timeout, and the
  log says so.
"""
import json
import os
import subprocess
import sys
import unittest

from dtrun_proc import NodesTestCase, parse_args

ARGS, REST = parse_args()
DTRUN = os.path.abspath(ARGS.dtrun)
PY = "/usr/bin/python3"
FAST = "join_timeout=60,last_call_timeout=0.5"
CGROUP_CPU = "/sys/fs/cgroup/cpu"


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The workers write what they were given; dtrun runs .py files with PY.
WORKER = """import json, os, sys
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_MAX_RESTARTS")
with open(os.path.join(sys.argv[1], "rank_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
"""


class Pods(NodesTestCase):
    """Loopback pods: dtrun with an operator's environment, in a cgroup."""

    def setUp(self):
        super().setUp()
        self.worker = os.path.join(self.dir, "train.py")
        with open(self.worker, "w") as f:
            f.write(WORKER)
        self.cgroups = []

    def tearDown(self):
        super().tearDown()
        for cg in self.cgroups:
            try:
                os.rmdir(cg)
            except OSError:
                pass

    def cgroup_with_cpus(self, name, cpus):
        """A cgroup v1 cpu cgroup with a quota of `cpus` CPUs (cgroup v2's
        cpu.max where that is mounted instead)."""
        if os.path.isdir(CGROUP_CPU):
            path = os.path.join(CGROUP_CPU, f"dtrun_test_{os.getpid()}_{name}")
            os.makedirs(path, exist_ok=True)
            self.cgroups.append(path)
            with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
                f.write("100000")
            with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(100000 * cpus))
            return path
        path = os.path.join("/sys/fs/cgroup", f"dtrun_test_{os.getpid()}_{name}")
        os.makedirs(path, exist_ok=True)
        self.cgroups.append(path)
        with open(os.path.join(path, "cpu.max"), "w") as f:
            f.write(f"{100000 * cpus} 100000")
        return path

    def pod(self, env, args, cgroup=None):
        """A dtrun started with `env` on top of a clean environment (no
        PET_*, RANK, WORLD_SIZE, MASTER_* of the test's own)."""
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("PET_") and k not in (
                    "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
        base.update(env)
        base["PYTHON_EXEC"] = PY
        pre = None
        if cgroup:
            def pre():
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
        p = subprocess.Popen([DTRUN] + args, env=base, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=pre)
        self.procs.append(p)
        return p

    def finish(self, pods, timeout=120):
        outs = []
        for p in pods:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
        for rc, out, err in outs:
            self.assertEqual(rc, 0, err)
        return outs

    def ranks(self):
        got = {}
        for name in os.listdir(self.dir):
            if name.startswith("rank_"):
                with open(os.path.join(self.dir, name)) as f:
                    env = json.load(f)
                got[int(env["RANK"])] = env
        return got



class Operators(Pods):
    """Each operator's variables, as its source sets them."""

    def test_trainer_v2_jobset_auto_counts_the_pods_cpu_limit(self):
        port = free_port()
        pods = []
        for index in range(2):
            env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto",
                   "PET_NODE_RANK": str(index), "JOB_COMPLETION_INDEX": str(index),
                   "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
            pods.append(self.pod(env, [self.worker, self.dir],
                                 self.cgroup_with_cpus(f"pod{index}", 1)))
        self.finish(pods)
        got = self.ranks()
        self.assertEqual(sorted(got), [0, 1])  # 1 CPU a pod: 1 worker each
        for rank, env in got.items():
            self.assertEqual(env["WORLD_SIZE"], "2")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "1")
            self.assertEqual(env["GROUP_RANK"], str(rank))

    def test_pytorchjob_v1_pod_variables_do_not_reach_the_workers(self):
        port = free_port()
        pods = []
        for index in range(2):
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "WORLD_SIZE": "2", "RANK": str(index),
                   "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
                   "PET_NNODES": "2", "PET_NODE_RANK": str(index),
                   "PET_NPROC_PER_NODE": "2"}
            pods.append(self.pod(env, [self.worker, self.dir]))
        self.finish(pods)
        got = self.ranks()
        self.assertEqual(sorted(got), [0, 1, 2, 3])
        for rank, env in got.items():
            self.assertEqual(env["WORLD_SIZE"], "4")  # not the pod's 2
            self.assertEqual(env["GROUP_RANK"], str(rank // 2))
            self.assertEqual(env["LOCAL_RANK"], str(rank % 2))

    def test_pytorchjob_v1_elastic_with_an_empty_pet_standalone(self):
        port = free_port()
        pods = []
        for index in range(2):
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "WORLD_SIZE": "2", "RANK": str(index),
                   "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
                   "PET_RDZV_ID": "job-k8s", "PET_NNODES": "1:2",
                   "PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "3",
                   "PET_RDZV_CONF": FAST + ",last_call_timeout=2",
                   "PET_STANDALONE": ""}
            pods.append(self.pod(env, [self.worker, self.dir]))
        self.finish(pods)
        got = self.ranks()
        self.assertEqual(sorted(got), [0, 1])
        for env in got.values():
            self.assertEqual(env["WORLD_SIZE"], "2")
            self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "3")

    def test_volcano_variables_mapped_on_the_command_line(self):
        port = free_port()
        pods = []
        for index in range(2):
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "WORLD_SIZE": "2", "RANK": str(index)}
            args = [f"--nnodes={env['WORLD_SIZE']}", f"--node-rank={env['RANK']}",
                    f"--master-addr={env['MASTER_ADDR']}",
                    f"--master-port={env['MASTER_PORT']}", "--nproc-per-node=1",
                    self.worker, self.dir]
            pods.append(self.pod(env, args))
        self.finish(pods)
        got = self.ranks()
        self.assertEqual(sorted(got), [0, 1])
        for rank, env in got.items():
            self.assertEqual(env["WORLD_SIZE"], "2")
            self.assertEqual(env["GROUP_RANK"], str(rank))

    def test_a_master_name_that_does_not_resolve_yet_is_retried(self):
        env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1",
               "PET_MASTER_ADDR": "job-node-0-0.job.invalid",
               "PET_MASTER_PORT": str(free_port()),
               "PET_RDZV_CONF": "join_timeout=3"}
        p = self.pod(env, [self.worker, self.dir])
        _, err = p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("the rendezvous endpoint job-node-0-0.job.invalid does not resolve "
                      "yet", err)
        self.assertIn("retrying until the join timeout", err)
        self.assertIn("within the join timeout (3 s", err)
        self.assertEqual(err.count("does not resolve yet"), 1)  # said once


MANIFESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                         "examples", "kubernetes")


def load(name):
    import yaml  # python3-yaml
    with open(os.path.join(MANIFESTS, name)) as f:
        return yaml.safe_load(f)


class Manifests(Pods):
    """examples/kubernetes/: each manifest's command, environment and CPU
    limit, as its operator turns them into a pod's, run as two loopback pods
    (the master's service name stands for 127.0.0.1, the image's
    /workspace/train.py for the test's worker)."""

    def run_pods(self, command, envs, cpus):
        self.assertEqual(command[0], "dtrun")
        self.assertEqual(command[1:], ["/workspace/train.py"])  # no flags: the env drives
        pods = []
        for index, env in enumerate(envs):
            pods.append(self.pod(env, [self.worker, self.dir],
                                 self.cgroup_with_cpus(f"m{index}", cpus)))
        self.finish(pods)
        return self.ranks()

    def test_jobset(self):
        m = load("jobset.yaml")
        job = m["spec"]["replicatedJobs"][0]
        spec = job["template"]["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        codes = spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
        self.assertEqual(sorted(codes), [2, 93])  # dtrun's codes not worth a retry
        c = spec["template"]["spec"]["containers"][0]
        port = str(free_port())
        envs = []
        for index in range(spec["completions"]):
            env = {}
            for e in c["env"]:
                if "valueFrom" in e:
                    self.assertIn("job-completion-index",
                                  e["valueFrom"]["fieldRef"]["fieldPath"])
                    env[e["name"]] = str(index)
                else:
                    env[e["name"]] = e["value"]
            self.assertEqual(env["PET_MASTER_ADDR"],
                             f"{m['metadata']['name']}-{job['name']}-0-0.{m['metadata']['name']}")
            env.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=port)
            envs.append(env)
        got = self.run_pods(c["command"], envs, int(c["resources"]["limits"]["cpu"]))
        self.assertEqual(sorted(got), [0, 1])
        self.assertTrue(all(e["WORLD_SIZE"] == "2" for e in got.values()))

    def test_trainjob(self):
        m = load("trainjob.yaml")
        t = m["spec"]["trainer"]
        self.assertEqual(m["spec"]["runtimeRef"]["name"], "torch-distributed")
        port = str(free_port())
        envs = [{"PET_NNODES": str(t["numNodes"]), "PET_NPROC_PER_NODE": str(t["numProcPerNode"]),
                 "PET_NODE_RANK": str(i), "JOB_COMPLETION_INDEX": str(i),
                 "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}
                for i in range(t["numNodes"])]
        cpus = int(t["resourcesPerNode"]["limits"]["cpu"])
        got = self.run_pods(t["command"], envs, cpus)
        self.assertEqual(len(got), t["numNodes"] * cpus)  # auto: the CPU limit

    def test_pytorchjob(self):
        m = load("pytorchjob.yaml")
        ep = m["spec"]["elasticPolicy"]
        w = m["spec"]["pytorchReplicaSpecs"]["Worker"]
        c = w["template"]["spec"]["containers"][0]
        port = str(free_port())
        envs = []
        for i in range(w["replicas"]):
            envs.append({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "WORLD_SIZE": str(w["replicas"]), "RANK": str(i),
                         "PET_RDZV_BACKEND": ep["rdzvBackend"],
                         "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
                         "PET_RDZV_ID": m["metadata"]["name"],
                         "PET_NNODES": f"{ep['minReplicas']}:{ep['maxReplicas']}",
                         "PET_MAX_RESTARTS": str(ep["maxRestarts"]),
                         "PET_NPROC_PER_NODE": m["spec"]["nprocPerNode"],
                         "PET_RDZV_CONF": FAST + ",last_call_timeout=2",
                         "PET_STANDALONE": ""})
        got = self.run_pods(c["command"], envs, int(c["resources"]["limits"]["cpu"]))
        self.assertEqual(sorted(got), [0, 1])
        self.assertTrue(all(e["TORCHELASTIC_MAX_RESTARTS"] == str(ep["maxRestarts"])
                            for e in got.values()))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
