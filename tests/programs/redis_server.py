"""A redis-server for the program tests: on 127.0.0.1 and a free port, answered before use, always stopped."""
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """redis-server started with `env` (and `args` after the common ones), stopped with SHUTDOWN NOSAVE (or killed);
    redis-cli runs with `cli_env` (None: this process's environment)."""

    def __init__(self, tmp: Path, env: dict, cli_env: dict | None, args: tuple = ()):
        self.port = free_port()
        self.cli_env = cli_env
        self.stderr_path = tmp / "redis.stderr"
        self.stdout_path = tmp / "redis.stdout"
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--daemonize", "no", "--dir", str(tmp), "--protected-mode", "yes", *args]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while self.cli("PING", check=False, text=True).stdout.strip() != "PONG":
            assert self.proc.poll() is None, f"redis-server exited: {self.log()}"
            assert time.monotonic() < deadline, f"redis-server did not answer: {self.log()}"
            time.sleep(0.05)

    def log(self) -> str:
        return self.stdout_path.read_text(errors="replace")[-2000:] + self.stderr_path.read_text(errors="replace")

    def cli(self, *args, check=True, timeout=30, **kw) -> subprocess.CompletedProcess:
        if "input" not in kw:
            kw["stdin"] = subprocess.DEVNULL
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args], capture_output=True,
                           timeout=timeout, env=self.cli_env, **kw)
        if check:
            assert r.returncode == 0, r
        return r

    def stop(self) -> int:
        """SHUTDOWN NOSAVE; returns the exit status (a process that does not stop is killed)."""
        if self.proc.poll() is None:
            self.cli("SHUTDOWN", "NOSAVE", check=False)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
