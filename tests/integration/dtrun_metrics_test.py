"""dtrun --metrics-port against a live job: the text a scrape gets, checked
by Prometheus' own promtool, scraped by a real Prometheus server; and
TORCHELASTIC_HEALTH_CHECK_PORT's answer. Skipped (77) without Prometheus."""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from dtrun_proc import stop_all
import urllib.error
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--python", default="/usr/bin/python3")
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "hang_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class MetricsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.procs = []

    def tearDown(self):
        stop_all(self.procs)
        self.tmp.cleanup()

    def start(self, cmd, env=None):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)
        self.procs.append(proc)
        return proc

    def wait_for(self, what, check, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = check()
            except (OSError, ValueError):
                got = None
            if got:
                return got
            time.sleep(0.2)
        self.fail(f"no {what} within {timeout} s")

    def job(self, metrics, health=None):
        env = dict(os.environ)
        if health:
            env["TORCHELASTIC_HEALTH_CHECK_PORT"] = str(health)
        return self.start([ARGS.dtrun, "--python", ARGS.python, "--nproc-per-node=2",
                           f"--metrics-port={metrics}", "--rdzv-id=metricsjob", WORKER,
                           "wedge", "100000", "99", "99"], env)

    def test_a_scrape_holds_every_rank_and_promtool_accepts_it(self):
        port = free_port()
        self.job(port)
        text = self.wait_for("steps in /metrics", lambda: (
            lambda r: r[0] == 200 and 'dtrun_worker_step{run_id="metricsjob"' in r[1] and r[1])(
                get(f"http://127.0.0.1:{port}/metrics")))
        for rank in (0, 1):
            self.assertIn(f'rank="{rank}"', text)
        for name in ("dtrun_worker_up", "dtrun_worker_beat_age_seconds",
                     "dtrun_worker_resident_bytes", "dtrun_restarts_total"):
            self.assertIn(f"# TYPE {name} ", text)
        promtool = shutil.which("promtool")
        if promtool:
            check = subprocess.run([promtool, "check", "metrics"], input=text,
                                   capture_output=True, text=True)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        status, _ = get(f"http://127.0.0.1:{port}/other")
        self.assertEqual(status, 404)

    def two_nodes(self, *extra, work=("wedge", "100000", "99", "99")):
        """A 2-node job (2 workers each, on loopback hosts), each node with
        its own metrics port; the ports."""
        rdzv, ports = free_port(), [free_port(), free_port()]
        for node, addr in enumerate(("127.0.0.2", "127.0.0.3")):
            self.start([ARGS.dtrun, "--python", ARGS.python, "--nnodes=2", "--nproc-per-node=2",
                        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv}",
                        "--rdzv-id=metrics2", f"--local-addr={addr}", f"--node-rank={node}",
                        f"--metrics-port={ports[node]}", *extra, WORKER, *work])
        return ports

    def test_a_single_node_serves_the_job_and_its_store(self):
        port = free_port()
        self.job(port)
        text = self.wait_for("the job's step", lambda: (
            lambda r: 'dtrun_job_step{run_id="metricsjob"}' in r[1] and r[1])(
                get(f"http://127.0.0.1:{port}/metrics")))
        self.assertIn('dtrun_job_ranks_running{run_id="metricsjob"} 2\n', text)
        # One node has no rendezvous: the family, and no stand-in sample.
        self.assertIn('# TYPE dtrun_rendezvous_round gauge\n', text)
        self.assertNotIn('dtrun_rendezvous_round{', text)
        self.assertRegex(text, r'dtrun_worker_cpu_seconds_total\{run_id="metricsjob",[^}]*\} \d')
        self.assertRegex(text, r'dtrun_build_info\{version="[^"]+",revision="[^"]*"\} 1\n')
        self.assertRegex(text, r'dtrun_store_connections\{run_id="metricsjob",store="workers"\} \d')

    def test_two_nodes_the_first_adds_the_job_wide_view(self):
        ports = self.two_nodes()
        first = self.wait_for("the job-wide view on node 0", lambda: (
            lambda r: 'dtrun_job_ranks_running{run_id="metrics2"} 4' in r[1] and r[1])(
                get(f"http://127.0.0.1:{ports[0]}/metrics")))
        self.assertIn('dtrun_job_nodes{run_id="metrics2"} 2\n', first)
        self.assertRegex(first, r'dtrun_rendezvous_round\{run_id="metrics2"\} \d')
        self.assertRegex(first, r'dtrun_store_keys\{run_id="metrics2",store="workers"\} \d')
        promtool = shutil.which("promtool")
        if promtool:
            check = subprocess.run([promtool, "check", "metrics"], input=first,
                                   capture_output=True, text=True)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        second = self.wait_for("node 1's ranks", lambda: (
            lambda r: 'rank="3"' in r[1] and r[1])(get(f"http://127.0.0.1:{ports[1]}/metrics")))
        self.assertNotIn("dtrun_job_", second)  # one node speaks for the job
        # Whichever node bound the endpoint's port first hosts the
        # rendezvous store, and counts what it answered.
        self.assertRegex(first + second, r'dtrun_store_requests_total\{run_id="metrics2",'
                                         r'store="rendezvous"\} [1-9]')

    def test_a_proxied_node_counts_its_proxy(self):
        """--store-proxy=on: node 1's workers reach the workers' store
        through its proxy, which says so on node 1's port (the workers
        all_reduce over gloo, holding their store connections)."""
        ports = self.two_nodes("--store-proxy=on", work=("collective", "100000000"))
        carrying = re.compile(r'dtrun_store_proxy_workers\{run_id="metrics2"\} [1-9]')
        second = self.wait_for("node 1's proxy carrying its workers", lambda: (
            lambda r: carrying.search(r[1]) and r[1])(
                get(f"http://127.0.0.1:{ports[1]}/metrics")))
        self.assertIn('dtrun_store_proxy_up{run_id="metrics2"} 1\n', second)
        self.assertRegex(second, r'dtrun_store_proxy_frames_total\{run_id="metrics2"\} [1-9]')
        first = get(f"http://127.0.0.1:{ports[0]}/metrics")[1]
        self.assertNotIn("dtrun_store_proxy_", first)

    def test_outcome_textfile_counts_runs_for_node_exporter(self):
        """--metrics-textfile: torchrun's run outcomes counted over this
        node's runs, checked by promtool and served by a real node_exporter's
        textfile collector."""
        folder = os.path.join(self.tmp.name, "textfile")
        os.makedirs(folder)
        path = os.path.join(folder, "dtrun.prom")
        for program, restarts in (("/bin/true", 0), ("/bin/false", 1), ("/bin/true", 0)):
            subprocess.run([ARGS.dtrun, "--no-python", "--nproc-per-node=1",
                            f"--max-restarts={restarts}", f"--metrics-textfile={path}",
                            "--log-level=error", program], capture_output=True, timeout=60)
        with open(path) as f:
            text = f.read()
        self.assertIn('dtrun_runs_total{outcome="success",retries="no_retries"} 2\n', text)
        self.assertIn('dtrun_runs_total{outcome="failure",retries="with_retries"} 1\n', text)
        self.assertIn('dtrun_runs_total{outcome="failure",retries="no_retries"} 0\n', text)
        self.assertRegex(text, r'dtrun_last_run_success\{run_id="[^"]+"\} 1\n')
        self.assertEqual(os.listdir(folder), ["dtrun.prom"])  # no temporary left
        promtool = shutil.which("promtool")
        if promtool:
            check = subprocess.run([promtool, "check", "metrics"], input=text,
                                   capture_output=True, text=True)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        exporter = shutil.which("prometheus-node-exporter")
        if not exporter:
            self.skipTest("no prometheus-node-exporter")
        port = free_port()
        self.start([exporter, f"--web.listen-address=127.0.0.1:{port}",
                    "--collector.disable-defaults", "--collector.textfile",
                    f"--collector.textfile.directory={folder}"])
        scraped = self.wait_for("dtrun_runs_total from node_exporter", lambda: (
            lambda r: r[0] == 200 and "dtrun_runs_total" in r[1] and r[1])(
                get(f"http://127.0.0.1:{port}/metrics")))
        self.assertIn('dtrun_runs_total{outcome="failure",retries="with_retries"} 1', scraped)
        self.assertIn('\nnode_textfile_scrape_error 0\n', scraped)

    @unittest.skipUnless(shutil.which("prometheus"), "needs the prometheus server")
    def test_a_real_prometheus_scrapes_a_two_node_job(self):
        ports, web = self.two_nodes(), free_port()
        config = os.path.join(self.tmp.name, "prometheus.yml")
        targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n"
                    f"  - job_name: dtrun\n    static_configs:\n"
                    f"      - targets: [{targets}]\n")
        self.start(["prometheus", f"--config.file={config}",
                    f"--storage.tsdb.path={os.path.join(self.tmp.name, 'tsdb')}",
                    f"--web.listen-address=127.0.0.1:{web}"])
        query = f"http://127.0.0.1:{web}/api/v1/query?query=dtrun_worker_step"
        result = self.wait_for("every rank's series", lambda: (
            lambda r: len(r) == 4 and r)(json.loads(get(query)[1])["data"]["result"]), timeout=90)
        self.assertEqual(sorted(r["metric"]["rank"] for r in result), ["0", "1", "2", "3"])
        self.assertGreater(max(float(r["value"][1]) for r in result), 0)
        query = f"http://127.0.0.1:{web}/api/v1/query?query=dtrun_job_ranks_running"
        job = self.wait_for("the job-wide series", lambda: (
            lambda r: r and r[0]["value"][1] == "4" and r)(
                json.loads(get(query)[1])["data"]["result"]), timeout=60)
        self.assertEqual(len(job), 1)  # from node 0 alone

    def test_the_health_check_port_answers_while_workers_beat(self):
        port, health = free_port(), free_port()
        self.job(port, health)
        self.wait_for("a healthy answer", lambda: get(f"http://127.0.0.1:{health}/")[0] == 200)

    def test_the_health_port_is_up_before_the_rendezvous(self):
        # Node 1 of 2 waits for a node 0 that does not come: alive, not ready.
        health = free_port()
        env = dict(os.environ, TORCHELASTIC_HEALTH_CHECK_PORT=str(health))
        self.start([ARGS.dtrun, "--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1",
                    f"--master-port={free_port()}", "--rdzv-conf=join_timeout=60",
                    "--no-python", "true"], env)
        self.wait_for("a live answer", lambda: get(f"http://127.0.0.1:{health}/healthz")[0] == 200)
        code, body = get(f"http://127.0.0.1:{health}/readyz")
        self.assertEqual(code, 503)
        self.assertIn("the workers have not started", body)
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{health}/healthz", method="HEAD"), timeout=10) as r:
            self.assertEqual((r.status, r.read()), (200, b""))

    def test_a_port_in_use_exits_2_naming_the_flag(self):
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            s.listen()
            busy = s.getsockname()[1]
            p = subprocess.run([ARGS.dtrun, f"--metrics-port={busy}", "--no-python", "true"],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--metrics-port", p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
