#!/usr/bin/env python3
"""results/ holds what the docs cite (scripts/lab tidy).

  scripts/tidy_results.py [--root DIR]             tidy the committed runs (git rm / git add; commit after)
  scripts/tidy_results.py [--root DIR] --dry-run   say what it would do, change nothing
(--root: another checkout than this script's; tests/checks/check_tidy.py's fixture repository)

1. The cited folders: every results/<folder> named by a tracked file outside results/ (README,
   docs/ - docs/runs.md aside, which lists every folder -, experiments/, scripts/, src/, tests/,
   tools/), then, transitively, by the kept folders' own .md and .json files.
2. A committed folder nothing cites leaves the tree (git rm -r); results/removed.json records it
   with the commit that holds it (HEAD here), and docs/runs.md lists it from there (scripts/docs.py),
   so `git show COMMIT:results/FOLDER/README.md` still finds it.
3. In a kept folder, Google Benchmark's raw bench.json (results.csv has every figure the report
   draws; compare.py reads the repetitions) becomes bench.json.gz (gzip, no timestamp), and the
   plots are re-encoded with pngquant (256-colour palettes; ~3.5x smaller, drawn the same) when it
   is installed (Debian's pngquant).
docs.py --check keeps the tracked results/ under BUDGET_MB, naming this command.
Standard library, git and (optionally) pngquant.
"""
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
REMOVED = os.path.join(RESULTS, "removed.json")
BUDGET_MB = 15
CITE = re.compile(r"results/([0-9A-Za-z][\w.\-]*)|\.\./(?!results/)([0-9A-Za-z][\w.\-]*)")  # a path, or a sibling's
SOURCES = (".md", ".py", ".json", ".cpp", ".hpp", ".sh", ".txt", ".cmake", ".cu", ".cuh")


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout


def tracked():
    return [p for p in git("ls-files", "-z").split("\0") if p]


def committed_folders(files):
    return sorted({p.split("/")[1] for p in files if p.startswith("results/") and p.count("/") >= 2})


def cited(files, folders):
    """The folders a tracked file outside results/ names, and those the kept folders name."""
    names = set(folders)

    def cites(path):
        try:
            with open(os.path.join(ROOT, path), errors="replace") as f:
                return {m.rstrip(".-") for pair in CITE.findall(f.read()) for m in pair if m} & names
        except OSError:
            return set()

    keep = set()
    for p in files:
        if not p.startswith("results/") and p != "docs/runs.md" and (p.endswith(SOURCES) or "CMakeLists" in p):
            keep |= cites(p)
    todo = list(keep)
    while todo:
        folder = todo.pop()
        for p in files:
            if p.startswith(f"results/{folder}/") and p.endswith((".md", ".json")):
                for c in cites(p) - keep:
                    keep.add(c)
                    todo.append(c)
    return keep


def tracked_bytes(files):
    return sum(os.path.getsize(os.path.join(ROOT, p)) for p in files
               if p.startswith("results/") and os.path.isfile(os.path.join(ROOT, p)))


def results_megabytes():
    """The tracked files under results/, in MB (0 outside a git checkout): docs.py --check's budget."""
    try:
        return tracked_bytes(tracked()) / 1e6
    except (OSError, subprocess.CalledProcessError):
        return 0.0


def compress(path, dry):
    """bench.json -> bench.json.gz, the same bytes inside, no timestamp (the same file every time)."""
    if dry:
        return
    with open(path, "rb") as f, open(path + ".gz.tmp", "wb") as raw:
        with gzip.GzipFile(filename="bench.json", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            shutil.copyfileobj(f, gz)
    os.replace(path + ".gz.tmp", path + ".gz")  # written whole
    rel = os.path.relpath(path, ROOT)
    git("rm", "-q", rel)
    git("add", rel + ".gz")


def requantize(path, dry):
    """pngquant in place when it makes the file smaller; False when pngquant is missing."""
    if dry:
        return True
    r = subprocess.run(["pngquant", "--quality=70-95", "--speed", "1", "--strip", "--skip-if-larger", "--force",
                        "--ext", ".png", path], capture_output=True)
    if r.returncode not in (0, 98, 99):  # 98: would be larger, 99: below the quality floor - both keep it
        raise SystemExit(f"tidy: pngquant failed on {path}: {r.stderr.decode().strip()}")
    git("add", os.path.relpath(path, ROOT))
    return True


def main(argv):
    global ROOT, RESULTS, REMOVED
    if len(argv) >= 2 and argv[0] == "--root":
        ROOT = os.path.abspath(argv[1])
        RESULTS, REMOVED = os.path.join(ROOT, "results"), os.path.join(ROOT, "results", "removed.json")
        argv = argv[2:]
    if argv not in ([], ["--dry-run"]):
        raise SystemExit("usage: scripts/tidy_results.py [--root DIR] [--dry-run]")
    dry = argv == ["--dry-run"]
    files = tracked()
    folders = committed_folders(files)
    keep = cited(files, folders)
    before = tracked_bytes(files)
    head = git("rev-parse", "--short=12", "HEAD").strip()
    removed = {}
    if os.path.exists(REMOVED):
        with open(REMOVED) as f:
            removed = json.load(f)
    gone = [f for f in folders if f not in keep]
    for folder in gone:
        print(f"tidy: {folder}: cited nowhere: leaves the tree (kept in git at {head})")
        removed[folder] = head
        if not dry:
            git("rm", "-r", "-q", f"results/{folder}")
    if gone and not dry:
        with open(REMOVED + ".tmp", "w") as f:
            json.dump(dict(sorted(removed.items())), f, indent=1)
            f.write("\n")
        os.replace(REMOVED + ".tmp", REMOVED)
        git("add", os.path.relpath(REMOVED, ROOT))
    have_pngquant = shutil.which("pngquant") is not None
    if not have_pngquant:
        print("tidy: pngquant not installed (apt-get install pngquant): plots left as they are", file=sys.stderr)
    for p in files:
        parts = p.split("/")
        if p.startswith("results/") and len(parts) >= 3 and parts[1] in keep:
            path = os.path.join(ROOT, p)
            if parts[-1] == "bench.json" and os.path.getsize(path) > 16384:
                print(f"tidy: {p} -> bench.json.gz")
                compress(path, dry)
            elif p.endswith(".png") and have_pngquant and os.path.getsize(path) > 32768:
                requantize(path, dry)
    after = tracked_bytes(tracked())
    print(f"tidy: results/ {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB (budget {BUDGET_MB} MB)"
          + (" (dry run: nothing changed)" if dry else "; commit what git status shows"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
