"""scripts/models_hf.py's tables: every committed run's summary.md is what its models_hf.csv gives
(the report re-made from the measured rows, `scripts/lab report FOLDER`), and its arguments are
checked before anything is measured."""

import glob
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import models_hf  # noqa: E402

RUNS = [os.path.dirname(p) for p in sorted(glob.glob(os.path.join(ROOT, "results", "*models_hf*", "models_hf.csv")))
        if "step_cache_s" in open(p).readline()]


@pytest.mark.parametrize("folder", RUNS, ids=os.path.basename)
def test_committed_summary_is_the_csv_s(folder):
    import csv
    with open(os.path.join(folder, "models_hf.csv")) as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(folder, "summary.md")) as f:
        assert models_hf.summary(rows) == f.read()
    assert {r["implementation"] for r in rows} >= {"sdpa", "lab:q8_0", "hqq:4"}


def test_arguments_are_checked(capsys):
    for argv, says in ((["--out", "x", "--contexts", "1k"], "--contexts: '1k'; allowed: comma-separated integers"),
                       (["--out", "x", "--steps", "0"], "--steps, --layers and every context: >= 1"),
                       ([], "--out: required")):
        with pytest.raises(SystemExit):
            models_hf.main(argv)
        assert says in capsys.readouterr().err
