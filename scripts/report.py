#!/usr/bin/python3
"""Writes report.md and PNG plots for one attnlab results folder, from that folder only.

    /usr/bin/python3 scripts/report.py RESULTS_DIR [--out DIR]

The entry point of the scripts/report/ package (its __init__ says what each module does).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import main  # noqa: E402  (the package scripts/report/, found before this file)

if __name__ == "__main__":
    sys.exit(main())
