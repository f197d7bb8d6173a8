"""`mallard env`: the lines that enable an allocator in a shell, /etc/profile.d, a Dockerfile or a systemd unit."""
from __future__ import annotations

import sys

from ..common import EXIT_OK, alloc_opt, check_conf, default_allocator, get_allocator, parse_conf

NAME = "env"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("env", help="lines that enable an allocator in a shell, /etc/profile.d, a Dockerfile")
    alloc_opt(s, default_text="mallard when found, else glibc")
    s.add_argument("--format", choices=["all", "shell", "profile.d", "dockerfile", "systemd"], default="all")


def run(args) -> int:
    default_allocator(args)
    a = get_allocator(args.allocator)
    conf = parse_conf(args.conf)
    conf_var = check_conf(a, conf)
    fmt = args.format
    lines: list[str] = []

    def section(title: str, body: list[str]) -> None:
        if fmt == "all":
            lines.append(f"# --- {title}")
        lines.extend(body)
        if fmt == "all":
            lines.append("")

    q = "'"
    if a.path is None:
        shell = ["unset LD_PRELOAD  # glibc's malloc is the default: preload nothing"]
        docker = ["# glibc's malloc is the default: no ENV line (remove any ENV LD_PRELOAD)"]
        systemd = ["# glibc's malloc is the default: remove any Environment=LD_PRELOAD line"]
    else:
        shell = [f'export LD_PRELOAD="{a.path}${{LD_PRELOAD:+:$LD_PRELOAD}}"']
        docker = [f"ENV LD_PRELOAD={a.path}"]
        systemd = [f"Environment=LD_PRELOAD={a.path}"]
    if conf_var:
        var, value = conf_var
        shell.append(f"export {var}={q}{value}{q}")
        docker.append(f'ENV {var}="{value}"')
        systemd.append(f"Environment={var}={value}")
    if fmt in ("all", "shell"):
        section("shell: this session (or ~/.bashrc)", shell)
    if fmt in ("all", "profile.d"):
        section(f"/etc/profile.d/{a.name}-malloc.sh: every login shell",
                [f"# enable {a.name} {a.version} for every program started from a login shell"] + shell)
    if fmt in ("all", "dockerfile"):
        section("Dockerfile", docker)
    if fmt in ("all", "systemd"):
        section("systemd unit ([Service] section)", systemd)
    sys.stdout.write("\n".join(lines).rstrip("\n") + "\n")
    return EXIT_OK
