"""git under LD_PRELOAD=libmallard.so: init, add, commit, log, gc and fsck in a temporary repository."""
import hashlib


def git_env(home):
    return {"HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "Mallard Test",
            "GIT_AUTHOR_EMAIL": "test@mallard.invalid", "GIT_COMMITTER_NAME": "Mallard Test",
            "GIT_COMMITTER_EMAIL": "test@mallard.invalid", "LC_ALL": "C"}


def test_git_init_add_commit_log(preload, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = git_env(tmp_path)
    reports = []

    def git(*args, stats=True):
        r = preload.run(["git", *args], cwd=repo, extra_env=env, stats=stats)
        reports.extend(r.reports)
        return r

    git("init", "-q", "-b", "main")
    # Many small files and a few large ones (zlib deflates them through malloc'd buffers).
    for i in range(200):
        (repo / f"file{i:03d}.txt").write_text(f"line {i}\n" * (i + 1))
    big = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(40000))
    (repo / "big.bin").write_bytes(big)
    git("add", ".")
    git("commit", "-q", "-m", "first commit under mallard")
    (repo / "file007.txt").write_text("changed\n")
    (repo / "new.txt").write_text("new file\n")
    git("add", "-A")
    git("commit", "-q", "-m", "second commit")

    log = git("log", "--format=%s|%an").stdout.splitlines()
    assert log == ["second commit|Mallard Test", "first commit under mallard|Mallard Test"]
    stat = git("show", "--stat", "--format=%s", "HEAD").stdout
    assert "file007.txt" in stat and "new.txt" in stat and "2 files changed" in stat
    assert git("show", "HEAD~1:file007.txt").stdout == "line 7\n" * 8
    blob = preload.run(["git", "cat-file", "blob", "HEAD:big.bin"], cwd=repo, extra_env=env, text=False)
    reports.extend(blob.reports)
    assert blob.stdout == big
    assert git("status", "--porcelain").stdout == ""
    git("gc", "-q")
    git("fsck", "--full", "--no-progress")
    assert git("rev-list", "--count", "HEAD").stdout.strip() == "2"

    # Every git process (and those gc spawned) printed a clean report; the busiest took thousands of blocks.
    preload.check_reports(reports, min_mallocs=2000, min_reports=12)
