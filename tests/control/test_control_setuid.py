"""Secure-execution mode: a set-UID-root program linked with Mallard, run by an unprivileged user, ignores
MALLARD_CONF and MALLARD_CONF_PATH (no file read with its privileges, no abort on the user's say-so)."""
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def traversable_dir():
    """A folder on a mount that honours set-UID bits, whose every ancestor others may traverse."""
    candidates = [tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]
    for d in candidates:
        if not os.path.isdir(d) or os.statvfs(d).f_flag & os.ST_NOSUID:
            continue
        path, ok = os.path.realpath(d), True
        while True:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                ok = False
                break
            if path == "/":
                break
            path = os.path.dirname(path)
        if ok:
            return d
    pytest.fail(f"no folder among {candidates} is traversable by others on a mount allowing set-UID programs")


@pytest.fixture
def setuid_probe(build_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes a set-UID-root program and runs it as nobody")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing")
    d = tempfile.mkdtemp(prefix="mallard-setuid-", dir=traversable_dir())
    try:
        os.chmod(d, 0o755)
        prog = os.path.join(d, "probe")
        shutil.copy(build_dir / "bin" / "mallard-setuid-probe", prog)
        os.chown(prog, 0, 0)
        os.chmod(prog, 0o4755)
        secret = os.path.join(d, "secret.conf")   # readable by root only
        with open(secret, "w") as f:
            f.write("topsecret_token_4242:hunter2\nnarenas:3\n")
        os.chmod(secret, 0o600)
        yield prog, secret
    finally:
        shutil.rmtree(d)


def run_as_nobody(prog, **env_extra):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env_extra}
    return subprocess.run([*NOBODY, prog], env=env, capture_output=True, text=True, timeout=60)


def assert_secure_mode(r):
    assert "secure=1" in r.stdout and "euid=0" in r.stdout and "ruid=65534" in r.stdout, (
        f"the kernel did not run the set-UID program in secure-execution mode (no_new_privs set for this process "
        f"tree, or a nosuid mount?): {r.stdout!r} {r.stderr!r}")


def test_setuid_program_ignores_user_configuration(setuid_probe):
    prog, secret = setuid_probe
    r = run_as_nobody(prog, MALLARD_CONF_PATH=secret, MALLARD_CONF="abort_conf:true,verbose:true,narenas:bad")
    assert r.returncode == 0, f"status {r.returncode}; stderr: {r.stderr}"
    assert_secure_mode(r)
    assert "topsecret" not in r.stderr and "hunter2" not in r.stderr, r.stderr
    assert r.stderr == "", r.stderr   # neither the file, nor verbose:true, nor the bad value was honoured


def test_setuid_program_does_not_echo_shadow(setuid_probe):
    prog, _ = setuid_probe
    r = run_as_nobody(prog, MALLARD_CONF_PATH="/etc/shadow", MALLARD_CONF="abort_conf:true,no_such_option:1")
    assert r.returncode == 0, f"status {r.returncode}; stderr: {r.stderr}"
    assert_secure_mode(r)
    with open("/etc/shadow") as f:
        users = [line.split(":", 1)[0] for line in f if ":" in line]
    leaked = [u for u in users if u and u in r.stderr]
    assert not leaked, f"shadow entries on stderr: {leaked}: {r.stderr}"


def test_same_program_not_set_uid_honours_configuration(setuid_probe):
    """Control: without the set-UID bit the same program reads MALLARD_CONF (the test above is not vacuous)."""
    prog, secret = setuid_probe
    os.chmod(prog, 0o755)
    os.chmod(secret, 0o644)
    r = run_as_nobody(prog, MALLARD_CONF_PATH=secret, MALLARD_CONF="verbose:true")
    assert r.returncode == 0, r.stderr
    assert "secure=0" in r.stdout, r.stdout
    assert "narenas:3" in r.stderr, r.stderr   # the file was read and verbose:true printed the options
