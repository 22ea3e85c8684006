"""A real etcd cluster for tests and benchmarks: one member per loopback
address (127.0.0.2, 127.0.0.3, ...), each on a free port of its own, data in
a temporary folder. Members can be killed, stopped (SIGSTOP) and started
again with their data. With tls=True clients must present a certificate
signed by the cluster's CA (made here with the openssl command)."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(folder, hosts):
    """A CA, a server certificate valid for `hosts`, a client certificate of
    that CA and one of another CA; returns their paths."""
    subj = "/CN=dtrun-test-{}"
    for ca in ("ca", "other_ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", subj.format(ca),
                 cwd=folder)
    san = ",".join(f"IP:{h}" for h in hosts)
    with open(os.path.join(folder, "san.cnf"), "w") as f:
        f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
    with open(os.path.join(folder, "client.cnf"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for name, ca, ext in (("server", "ca", "san.cnf"), ("client", "ca", "client.cnf"),
                          ("stranger", "other_ca", "client.cnf")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", subj.format(name), cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
                 f"{ca}.key", "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                 "-extfile", ext, cwd=folder)
    return {k: os.path.join(folder, v) for k, v in (
        ("cacert", "ca.pem"), ("cert", "client.pem"), ("key", "client.key"),
        ("server_cert", "server.pem"), ("server_key", "server.key"),
        ("stranger_cert", "stranger.pem"), ("stranger_key", "stranger.key"))}


class EtcdCluster:
    def __init__(self, size=3, first_host=2, tls=False, enable_v2=False, fast=True):
        self.dir = tempfile.mkdtemp(prefix="dtrun-etcd-")
        self.hosts = [f"127.0.0.{first_host + i}" for i in range(size)]
        self.client_ports = [free_port(h) for h in self.hosts]
        self.peer_ports = [free_port(h) for h in self.hosts]
        self.tls = tls
        self.enable_v2 = enable_v2
        self.fast = fast
        self.certs = make_certs(self.dir, self.hosts) if tls else {}
        self.procs = [None] * size
        self.token = f"dtrun-{os.getpid()}-{time.monotonic_ns()}"

    @property
    def scheme(self):
        return "https" if self.tls else "http"

    def endpoint(self, i):
        return f"{self.hosts[i]}:{self.client_ports[i]}"

    def endpoints(self):
        return ",".join(self.endpoint(i) for i in range(len(self.hosts)))

    def _args(self, i):
        name = f"m{i}"
        cluster = ",".join(f"m{j}=http://{h}:{p}"
                           for j, (h, p) in enumerate(zip(self.hosts, self.peer_ports)))
        url = f"{self.scheme}://{self.endpoint(i)}"
        args = [ETCD, "--name", name, "--data-dir", os.path.join(self.dir, name),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", f"http://{self.hosts[i]}:{self.peer_ports[i]}",
                "--initial-advertise-peer-urls", f"http://{self.hosts[i]}:{self.peer_ports[i]}",
                "--initial-cluster", cluster, "--initial-cluster-token", self.token,
                "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "error"]
        if self.fast:
            # A leader lost is replaced in about half a second.
            args += ["--heartbeat-interval", "50", "--election-timeout", "500"]
        if self.enable_v2:
            args += ["--enable-v2"]
        if self.tls:
            args += ["--cert-file", self.certs["server_cert"], "--key-file",
                     self.certs["server_key"], "--client-cert-auth",
                     "--trusted-ca-file", self.certs["cacert"]]
        return args

    def start_member(self, i):
        log = open(os.path.join(self.dir, f"m{i}.log"), "a")
        self.procs[i] = subprocess.Popen(self._args(i), stdout=log, stderr=log,
                                         start_new_session=True)
        log.close()

    def start(self, timeout=30):
        for i in range(len(self.hosts)):
            self.start_member(i)
        if not self.wait_healthy(timeout):
            self.close()
            raise RuntimeError(f"etcd did not come up; logs in {self.dir}")
        return self

    def _get(self, i, path, timeout=1.0):
        ctx = None
        if self.tls:
            import ssl
            ctx = ssl.create_default_context(cafile=self.certs["cacert"])
            ctx.load_cert_chain(self.certs["cert"], self.certs["key"])
        url = f"{self.scheme}://{self.endpoint(i)}{path}"
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return r.read().decode()

    def healthy(self, i):
        try:
            return '"true"' in self._get(i, "/health")
        except Exception:
            return False

    def wait_healthy(self, timeout, members=None):
        members = range(len(self.hosts)) if members is None else members
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.healthy(i) for i in members):
                return True
            time.sleep(0.1)
        return False

    def leader(self):
        """Index of the member that leads now, or None."""
        import json
        for i in range(len(self.hosts)):
            if not self.alive(i):
                continue
            try:
                req = urllib.request.Request(
                    f"http://{self.endpoint(i)}/v3/maintenance/status", data=b"{}")
                if self.tls:
                    return None
                with urllib.request.urlopen(req, timeout=1) as r:
                    st = json.loads(r.read())
                if st.get("leader") == st["header"]["member_id"]:
                    return i
            except Exception:
                continue
        return None

    def enable_auth(self, user, password):
        """etcd's authentication on: `user` (root, which etcd requires
        first) with `password`, then `auth enable`."""
        ctl = ["etcdctl", f"--endpoints={self.scheme}://{self.endpoint(0)}"]
        env = dict(os.environ, ETCDCTL_API="3")
        for args in (["user", "add", user, f"--new-user-password={password}"],
                     ["auth", "enable"]):
            subprocess.run(ctl + args, env=env, check=True, capture_output=True, timeout=30)

    def alive(self, i):
        return self.procs[i] is not None and self.procs[i].poll() is None

    def kill(self, i):
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
        self.procs[i] = None

    def pause(self, i):
        self.procs[i].send_signal(signal.SIGSTOP)

    def resume(self, i):
        self.procs[i].send_signal(signal.SIGCONT)

    def close(self):
        for i in range(len(self.hosts)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)
