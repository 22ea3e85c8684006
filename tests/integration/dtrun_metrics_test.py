"""dtrun --metrics-port against a live job: the text a scrape gets, checked
by Prometheus' own promtool, scraped by a real Prometheus server; and
TORCHELASTIC_HEALTH_CHECK_PORT's answer. Skipped (77) without Prometheus."""
import argparse
import json
import os
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

    @unittest.skipUnless(shutil.which("prometheus"), "needs the prometheus server")
    def test_a_real_prometheus_scrapes_the_job(self):
        port, web = free_port(), free_port()
        self.job(port)
        config = os.path.join(self.tmp.name, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n"
                    f"  - job_name: dtrun\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{port}']\n")
        self.start(["prometheus", f"--config.file={config}",
                    f"--storage.tsdb.path={os.path.join(self.tmp.name, 'tsdb')}",
                    f"--web.listen-address=127.0.0.1:{web}"])
        query = f"http://127.0.0.1:{web}/api/v1/query?query=dtrun_worker_step"
        result = self.wait_for("a scraped series", lambda: json.loads(get(query)[1])["data"][
            "result"], timeout=90)
        self.assertEqual(sorted(r["metric"]["rank"] for r in result), ["0", "1"])
        self.assertGreater(float(result[0]["value"][1]), 0)

    def test_the_health_check_port_answers_while_workers_beat(self):
        port, health = free_port(), free_port()
        self.job(port, health)
        self.wait_for("a healthy answer", lambda: get(f"http://127.0.0.1:{health}/")[0] == 200)

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
