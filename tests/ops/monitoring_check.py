#!/usr/bin/env python3
"""monitoring_check.py - do the dashboard and the alert rules name only what
the daemons export?

  monitoring_check.py names DASHBOARD.json RULES.yml      print every PromQL expression, one a line
  monitoring_check.py check SCRAPES_DIR EXPRS_FILE       check them against real scrapes

`check` reads every *.txt in SCRAPES_DIR (Prometheus text from /metrics of
real daemons), then for every expression: each metric it names must be a
series the daemons exported (or `up`, which Prometheus records itself), and
each label matcher must match: `k="v"` needs a series of that metric with
k="v", `k=~"re"` a series with label k (job and instance are added by
Prometheus at scrape time: skipped). Prints one line per problem; exit 1 if
any.
"""
import json
import re
import sys

PROMETHEUS_OWN = {"up"}
SCRAPE_LABELS = {"job", "instance"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan", "le"}


def exprs_of(dashboard, rules):
    out = []
    dash = json.load(open(dashboard))

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append(t["expr"])
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict) and "label_values(" in q.get("query", ""):
            m = re.match(r"label_values\((\w+)", q["query"])
            out.append(m.group(1))
    # the rules file: "expr:" values, single line or a "|" block
    lines = open(rules).read().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", lines[i])
        if m:
            if m.group(2).strip() == "|":
                ind = None
                block = []
                i += 1
                while i < len(lines):
                    l = lines[i]
                    cur = len(l) - len(l.lstrip())
                    if l.strip() and ind is None:
                        ind = cur
                    if l.strip() and cur < ind:
                        break
                    block.append(l.strip())
                    i += 1
                out.append(" ".join(block))
                continue
            out.append(m.group(2).strip())
        i += 1
    return [" ".join(e.split()) for e in out]


def selectors(expr):
    """(metric, [(key, op, value)]) for each vector selector in expr."""
    e = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    e = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m.group(0).replace(" ", "\x00"), e)
    # grouping clauses hold label names, not metrics
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)              # range / subquery durations
    out = []
    for m in re.finditer(r'([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(\{[^}]*\})?', e):
        name, braces = m.group(1), m.group(2)
        if not name and not braces:
            continue
        rest = e[m.end():]
        if name and rest.lstrip().startswith("("):
            continue                                 # a function or aggregation
        if name and (name.lower() in KEYWORDS or re.fullmatch(r"[0-9.e+-]+", name)):
            continue
        if name and re.fullmatch(r"[0-9].*", name):
            continue
        start = m.start()
        if start > 0 and e[start - 1] in "$":
            continue                                 # a dashboard variable
        matchers = []
        if braces:
            for mm in re.finditer(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', braces.replace("\x00", " ")):
                matchers.append((mm.group(1), mm.group(2), mm.group(3)))
        if name:
            out.append((name, matchers))
    return out


def load_scrapes(d):
    import glob
    series = {}                                      # name -> list of label dicts
    for f in glob.glob(d + "/*.txt"):
        for line in open(f):
            if not line.strip() or line.startswith("#"):
                continue
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s', line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            series.setdefault(m.group(1), []).append(labels)
    return series


def check(scrapes, exprs_file):
    series = load_scrapes(scrapes)
    problems = 0
    n = 0
    for expr in open(exprs_file).read().splitlines():
        if not expr.strip():
            continue
        for name, matchers in selectors(expr):
            n += 1
            if name in PROMETHEUS_OWN:
                continue
            if name not in series:
                print(f"not exported: {name}   in: {expr}")
                problems += 1
                continue
            for k, op, v in matchers:
                if k in SCRAPE_LABELS or "$" in v:
                    continue
                if op == "=" and not any(s.get(k) == v for s in series[name]):
                    print(f"no series {name}{{{k}=\"{v}\"}}   in: {expr}")
                    problems += 1
                elif op in ("=~", "!~", "!=") and not any(k in s for s in series[name]):
                    print(f"{name} has no label {k}   in: {expr}")
                    problems += 1
    print(f"# {n} selectors checked, {problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1] == "names":
        for e in exprs_of(sys.argv[2], sys.argv[3]):
            print(e)
        sys.exit(0)
    sys.exit(check(sys.argv[2], sys.argv[3]))
