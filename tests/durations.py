#!/usr/bin/env python3
"""durations.py BUILD_DIR [BUILD_DIR...] [--top N] [--markdown] [--count]:
where the suite's time goes, from meson's testlog.json of each build: per
build the sum of test durations, the part spent in tests meson runs alone
(is_parallel: false - nothing else runs beside them), and the slowest N
tests. tests/README.md's table is this script's --markdown output.
--count: only "PASSED FAILED SKIPPED" per build (run-all.sh's totals)."""
import json
import os
import sys


def load(build):
    log = os.path.join(build, "meson-logs", "testlog.json")
    rows = []
    with open(log) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    serial = set()
    intro = os.path.join(build, "meson-info", "intro-tests.json")
    if os.path.exists(intro):
        with open(intro) as f:
            serial = {t["name"] for t in json.load(f) if not t["is_parallel"]}
    return rows, serial


def main(argv):
    top, md, counts, builds = 15, False, False, []
    it = iter(argv)
    for a in it:
        if a == "--top":
            top = int(next(it))
        elif a == "--markdown":
            md = True
        elif a == "--count":
            counts = True
        else:
            builds.append(a)
    if not builds:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for b in builds:
        rows, serial = load(b)
        if counts:
            res = [r.get("result", "") for r in rows]
            ok = sum(x in ("OK", "EXPECTEDFAIL") for x in res)
            skip = sum(x == "SKIP" for x in res)
            print(ok, len(res) - ok - skip, skip)
            continue
        name = lambda r: r["name"].split(" / ")[-1]
        total = sum(r["duration"] for r in rows)
        alone = sum(r["duration"] for r in rows if name(r) in serial)
        print(f"{b}: {len(rows)} tests, sum {total:.0f} s, run alone {alone:.0f} s, "
              f"parallel {total - alone:.0f} s")
        rows.sort(key=lambda r: -r["duration"])
        if md:
            print("\n| s | test | suite | alone |\n|---:|---|---|---|")
        for r in rows[:top]:
            suite = r["name"].split(" / ")[0].split(":")[-1] if " / " in r["name"] else ""
            flag = "yes" if name(r) in serial else ""
            if md:
                print(f"| {r['duration']:.1f} | {name(r)} | {suite} | {flag} |")
            else:
                print(f"  {r['duration']:7.1f}  {r['result']:<8} {name(r)} [{suite}]"
                      f"{' (alone)' if flag else ''}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
