#!/usr/bin/env python3
"""scripts/tidy_results.py on a fixture repository (ctest Tidy.results): a folder the docs cite, one
only a kept folder cites, and one nothing cites; the tidy must keep the first two, take the third
out (results/removed.json names the commit holding it, git still has it there), gzip a kept
folder's bench.json with the same bytes inside, and leave a dry run's tree untouched."""
import gzip
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TIDY = os.path.join(HERE, "..", "..", "scripts", "tidy_results.py")


def run(*args, cwd):
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, check=True).stdout


def write(root, rel, text):
    os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    with open(os.path.join(root, rel), "w") as f:
        f.write(text)


def main():
    with tempfile.TemporaryDirectory() as root:
        run("git", "init", "-q", cwd=root)
        run("git", "config", "user.email", "t@t", cwd=root)
        run("git", "config", "user.name", "t", cwd=root)
        bench = json.dumps({"benchmarks": [{"name": f"attn/x/{i}", "real_time": i} for i in range(2000)]})
        write(root, "docs/perf.md", "See [the run](../results/2026-01-01-cited/README.md).\n")
        write(root, "results/2026-01-01-cited/README.md", "Follows [the older run](../2026-01-01-chained/README.md).\n")
        write(root, "results/2026-01-01-cited/bench.json", bench)
        write(root, "results/2026-01-01-chained/README.md", "notes\n")
        write(root, "results/2026-01-01-orphan/README.md", "nobody links here\n")
        run("git", "add", "-A", cwd=root)
        run("git", "commit", "-qm", "fixture", cwd=root)
        head = run("git", "rev-parse", "--short=12", "HEAD", cwd=root).strip()

        dry = run(sys.executable, TIDY, "--root", root, "--dry-run", cwd=root)
        assert "2026-01-01-orphan: cited nowhere" in dry, dry
        assert run("git", "status", "--short", cwd=root) == "", "a dry run changed the tree"

        run(sys.executable, TIDY, "--root", root, cwd=root)
        left = run("git", "ls-files", "results", cwd=root).split()
        assert "results/2026-01-01-cited/README.md" in left and "results/2026-01-01-chained/README.md" in left, left
        assert not any("orphan" in p for p in left), left
        assert "results/2026-01-01-cited/bench.json.gz" in left and "results/2026-01-01-cited/bench.json" not in left
        with gzip.open(os.path.join(root, "results/2026-01-01-cited/bench.json.gz"), "rt") as f:
            assert f.read() == bench, "bench.json.gz does not hold bench.json's bytes"
        with open(os.path.join(root, "results/removed.json")) as f:
            assert json.load(f) == {"2026-01-01-orphan": head}
        assert run("git", "show", f"{head}:results/2026-01-01-orphan/README.md", cwd=root) == "nobody links here\n"
    print("check_tidy: cited and chained runs kept, the orphan out (its commit recorded), bench.json gzipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
