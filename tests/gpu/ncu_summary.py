"""Sums an ncu --csv --metrics gpu__time_duration.sum report per kernel name: calls, total and mean us.
usage: python3 tests/gpu/ncu_summary.py REPORT.csv"""
import csv
import collections
import sys

rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
name_i, value_i, unit_i = cols.index("Kernel Name"), cols.index("Metric Value"), cols.index("Metric Unit")
total = collections.defaultdict(float)
calls = collections.Counter()
for r in rows[head + 1:]:
    if len(r) <= value_i:
        continue
    v = float(r[value_i].replace(",", ""))
    us = v / 1e3 if r[unit_i] == "nsecond" else v if r[unit_i] == "usecond" else v * 1e3
    name = r[name_i].split("(")[0].split("<")[0][:60]
    total[name] += us
    calls[name] += 1
print(f"{'kernel':60s} {'calls':>6s} {'total us':>10s} {'mean us':>9s}")
for name, t in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{name:60s} {calls[name]:6d} {t:10.1f} {t / calls[name]:9.2f}")
