"""A comparison's parts, which compare.py puts together: its runs (runs.py), where they train (placement.py), their
report and its statistics (report.py, stats.py), its pictures (plots.py, acts.py) and a ladder of sizes (ladder.py)."""
