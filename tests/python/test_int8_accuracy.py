"""scripts/int8_accuracy.py (flash_int8's error and cosine against float64, smoothing and integer P.V
on and off; results/2026-12-06-int8_pv) on a small shape: every configuration runs, and the figures
it prints are an int8 kernel's - errors of rounding, not of a wrong kernel, cosines near 1."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_int8_accuracy_script_runs_every_configuration():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "int8_accuracy.py"), "192", "2", "32"],
                         capture_output=True, text=True, check=True, env=dict(os.environ)).stdout
    rows = re.findall(r"max rel err ([0-9.e+-]+), min cosine ([0-9.]+)", out)
    assert len(rows) == 16, out  # 2 inputs x causal on/off x smoothing on/off x integer P.V on/off
    for err, cos in rows:
        assert 0 < float(err) < 0.2 and float(cos) > 0.99, out
