"""`mallard list`, `run`, `env`, `which`: allocators found, preloaded, printed for shells and identified in processes."""
from __future__ import annotations

import json
import os
import subprocess

import pytest


def test_list_shows_glibc_first_then_every_allocator(mallard, allocators, build):
    r = mallard("list", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    names = [a["name"] for a in data["allocators"]]
    assert names[0] == "glibc" and data["allocators"][0]["path"] is None
    assert "mallard" in names
    # Libraries of the build that are not allocators: the tracer, the fault-injection shim, the no-stats build.
    assert not {"mallard-tracer", "mallard-faults", "mallard-nostats"} & set(names), names
    mallard_entry = next(a for a in data["allocators"] if a["name"] == "mallard")
    # The soname file (libmallard.so.0) is preferred where the build or install has one: the same library.
    assert os.path.realpath(mallard_entry["path"]) == os.path.realpath(build / "lib" / "libmallard.so")
    for peer in ("jemalloc", "mimalloc", "tcmalloc"):
        if peer in names:
            entry = next(a for a in data["allocators"] if a["name"] == peer)
            assert os.path.isfile(entry["path"]) and entry["version"] not in ("", "unknown")
            assert peer not in data["missing"]
        else:
            assert peer in data["missing"] and "apt-get install" in data["missing"][peer]
    text = mallard("list")
    assert text.returncode == 0
    for a in allocators:
        assert a.name in text.stdout
        if a.path:
            assert a.path in text.stdout


@pytest.mark.parametrize("name,conf,var", [("mallard", "purge_delay_ms:100", "MALLARD_CONF"),
                                           ("jemalloc", "narenas:2,dirty_decay_ms:100", "MALLOC_CONF")])
def test_run_preloads_keeps_existing_preload_and_passes_conf(mallard, allocators, need, name, conf, var):
    a = need(allocators, name)
    r = mallard("run", "-a", name, "--conf", conf, "--", "sh", "-c",
                f'echo "P=$LD_PRELOAD"; echo "C=${var}"; echo "M=$MALLARD_CONF"; exit 7', env={"LD_PRELOAD": "libkeep.so"})
    assert r.returncode == 7, r.stderr
    assert f"P={a.path}:libkeep.so" in r.stdout
    assert f"C={conf}" in r.stdout
    if var != "MALLARD_CONF":
        assert "M=\n" in r.stdout  # nothing the allocator would ignore


@pytest.mark.parametrize("name,conf", [("jemalloc", "purge_delay_ms:100"), ("mimalloc", "narenas:2"),
                                       ("glibc", "narenas:2")])
@pytest.mark.parametrize("sub", ["run", "env", "vmem", "profile"])
def test_conf_an_allocator_would_ignore_is_refused(mallard, allocators, need, name, conf, sub):
    if name != "glibc":
        need(allocators, name)
    r = mallard(sub, "-a", name, "--conf", conf, *(["--", "true"] if sub != "env" else []))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--conf" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_run_really_switches_the_allocator(mallard, allocators, need, prog):
    need(allocators, "jemalloc")
    # The running program maps the allocator it was given: check with `mallard which` on it.
    p = subprocess.Popen([*mallard_cmd(mallard), "run", "-a", "jemalloc", "--", prog("arenas"), "30"],
                         env=mallard.env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("ready")
        w = mallard("which", "--json", str(p.pid))  # `run` execs the program: same PID
        assert w.returncode == 0, w.stderr
        assert json.loads(w.stdout)["allocator"] == "jemalloc"
    finally:
        p.kill()
        p.wait()


def mallard_cmd(m) -> list[str]:
    import sys

    return [sys.executable, "-m", "mallard_cli"]


def test_run_glibc_preloads_nothing(mallard):
    r = mallard("run", "-a", "glibc", "--", "sh", "-c", 'echo "P=${LD_PRELOAD:-none}"')
    assert r.returncode == 0 and "P=none" in r.stdout


def test_run_reports_signal_like_a_shell(mallard):
    r = mallard("run", "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == -15 or r.returncode == 128 + 15


def test_env_prints_shell_profile_d_and_dockerfile_lines(mallard, allocators, need):
    a = need(allocators, "mallard")
    r = mallard("env", "-a", "mallard", "--conf", "narenas:2")
    assert r.returncode == 0, r.stderr
    assert f'export LD_PRELOAD="{a.path}${{LD_PRELOAD:+:$LD_PRELOAD}}"' in r.stdout
    assert "/etc/profile.d/mallard-malloc.sh" in r.stdout
    assert f"ENV LD_PRELOAD={a.path}" in r.stdout
    assert 'ENV MALLARD_CONF="narenas:2"' in r.stdout
    # The shell lines really work: sourcing them preloads the library.
    shell = mallard("env", "-a", "mallard", "--format", "shell").stdout
    out = subprocess.run(["sh", "-c", shell + '\necho "$LD_PRELOAD"'], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"]})
    assert out.stdout.strip() == a.path
    g = mallard("env", "-a", "glibc", "--format", "dockerfile")
    assert g.returncode == 0 and not any(l.startswith("ENV") for l in g.stdout.splitlines()) and "default" in g.stdout


@pytest.mark.parametrize("name", ["glibc", "mallard", "jemalloc", "mimalloc", "tcmalloc"])
def test_which_names_the_allocator_of_a_running_process(mallard, allocators, need, prog, name):
    a = need(allocators, name)
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if a.path:
        env["LD_PRELOAD"] = a.path
    p = subprocess.Popen([prog("arenas"), "30"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("ready")
        r = mallard("which", str(p.pid))
        assert r.returncode == 0, r.stderr
        assert f"PID {p.pid}" in r.stdout
        first = r.stdout.splitlines()[0]
        assert first.rstrip().endswith(": " + name), first
    finally:
        p.kill()
        p.wait()


def test_which_says_when_it_cannot_tell(mallard, build):
    static = build / "bin" / "mallard-testprog-static"
    if not static.is_file():
        pytest.skip("static linking unavailable (no libc.a): mallard-testprog-static was not built")
    p = subprocess.Popen([str(static), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("ready")
        r = mallard("which", "--json", str(p.pid))
        assert r.returncode == 0
        data = json.loads(r.stdout)
        assert data["allocator"] is None and "statically linked" in data["reason"]
        assert "cannot tell" in mallard("which", str(p.pid)).stdout
    finally:
        p.kill()
        p.wait()
