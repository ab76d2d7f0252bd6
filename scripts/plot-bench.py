#!/usr/bin/env python3
"""Turn netio-perf JSON results into SVG plots (python3 standard library only).

    python3 scripts/plot-bench.py [-o DIR] RESULTS.json [MORE.json ...]

writes into DIR (default: the current directory)

- latency.svg: median round-trip time of `pingpong` against message size;
- bandwidth.svg: one-way bandwidth of `bw` against message size;

one line per provider, send mode and loop flavour, next to the plain-TCP
baselines measured in the same runs (dashed). Bars span the fastest and the
slowest run. A plot without data is not written.
"""

import argparse
import json
import math
import os
import statistics
import sys
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
          "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]


def size_label(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def load(paths):
    docs = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                docs.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"plot-bench: cannot read {p}: {e}")
        if docs[-1].get("tool") != "netio-perf":
            sys.exit(f"plot-bench: {p} is not a netio-perf result file")
    return docs


def collect(docs, test, key, scale):
    """{series label: {size: [median, min, max]}} with baselines dashed."""
    series = {}
    dashed = set()
    for doc in docs:
        flavour = "busy-poll" if doc.get("busy_poll") else "interrupt"
        provider = doc.get("provider", "?")
        if provider == "sim":
            flavour = "simulator cost, real time"
        for r in doc.get("results", []):
            if r.get("test") != test or r.get("size") is None:
                continue
            for f in r.get("figures", []):
                if f.get("key") != key or f.get("unit", "").startswith("virtual"):
                    continue
                label = f"{provider} {r.get('mode')} ({flavour})"
                parts = [(label, f.get("provider"))]
                if f.get("baseline"):
                    base = doc.get("baseline") or "plain TCP"
                    parts.append((base, f["baseline"]))
                    dashed.add(base)
                for name, stat in parts:
                    if not stat:
                        continue
                    pts = series.setdefault(name, {}).setdefault(r["size"], [])
                    pts.append((stat["median"] * scale, stat["min"] * scale,
                                stat["max"] * scale))
    out = {}
    for name, by_size in series.items():
        out[name] = {
            s: (statistics.median(p[0] for p in v), min(p[1] for p in v),
                max(p[2] for p in v))
            for s, v in by_size.items()
        }
    return out, dashed


def nice_max(v):
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * e:
            return m * e
    return 10 * e


def svg_plot(title, ylabel, series, dashed, note):
    W, H = 760, 460
    L, R, T, B = 80, 250, 50, 60
    pw, ph = W - L - R, H - T - B
    sizes = sorted({s for pts in series.values() for s in pts})
    ymax = nice_max(max(p[2] for pts in series.values() for p in pts.values()) * 1.05)
    lo, hi = math.log2(sizes[0]), math.log2(sizes[-1])
    if hi == lo:
        lo, hi = lo - 1, hi + 1

    def x(s):
        return L + (math.log2(s) - lo) / (hi - lo) * pw

    def y(v):
        return T + ph - v / ymax * ph

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L + pw / 2}" y="24" text-anchor="middle" font-size="15">'
         f'{escape(title)}</text>',
         f'<text x="{L + pw / 2}" y="40" text-anchor="middle" fill="#555">'
         f'{escape(note)}</text>']
    for i in range(6):
        v = ymax * i / 5
        yy = y(v)
        o.append(f'<line x1="{L}" y1="{yy:.1f}" x2="{L + pw}" y2="{yy:.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{yy + 4:.1f}" text-anchor="end">{v:g}</text>')
    for s in sizes:
        xx = x(s)
        o.append(f'<line x1="{xx:.1f}" y1="{T}" x2="{xx:.1f}" y2="{T + ph}" stroke="#eee"/>')
        o.append(f'<text x="{xx:.1f}" y="{T + ph + 18}" text-anchor="middle">'
                 f'{escape(size_label(s))}</text>')
    o.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    o.append(f'<text x="{L + pw / 2}" y="{H - 15}" text-anchor="middle">message size</text>')
    o.append(f'<text transform="translate(20,{T + ph / 2}) rotate(-90)" '
             f'text-anchor="middle">{escape(ylabel)}</text>')
    for i, (name, pts) in enumerate(sorted(series.items())):
        c = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="6,4"' if name in dashed else ""
        ordered = sorted(pts.items())
        path = " ".join(f"{x(s):.1f},{y(v[0]):.1f}" for s, v in ordered)
        o.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for s, (med, mn, mx) in ordered:
            o.append(f'<line x1="{x(s):.1f}" y1="{y(mn):.1f}" x2="{x(s):.1f}" y2="{y(mx):.1f}" '
                     f'stroke="{c}"/>')
            o.append(f'<circle cx="{x(s):.1f}" cy="{y(med):.1f}" r="3.5" fill="{c}">'
                     f'<title>{escape(name)}, {escape(size_label(s))}: {med:.4g}</title></circle>')
        ly = T + 10 + i * 20
        o.append(f'<line x1="{L + pw + 15}" y1="{ly}" x2="{L + pw + 45}" y2="{ly}" '
                 f'stroke="{c}" stroke-width="2"{dash}/>')
        o.append(f'<text x="{L + pw + 50}" y="{ly + 4}">{escape(name)}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="netio-perf --json output files")
    ap.add_argument("-o", "--out", default=".", help="output directory")
    args = ap.parse_args()
    docs = load(args.files)
    os.makedirs(args.out, exist_ok=True)
    dates = sorted({d.get("machine", {}).get("date", "?")[:10] for d in docs})
    cpus = sorted({str(d.get("machine", {}).get("nproc", "?")) for d in docs})
    note = f"medians of runs, bars: fastest to slowest run; {', '.join(dates)}; {'/'.join(cpus)} CPUs"
    plots = [
        ("latency.svg", "pingpong", "median_rtt", 1.0,
         "Round-trip latency (lower is better)", "median round trip (µs)"),
        ("bandwidth.svg", "bw", "bandwidth", 1e-9,
         "One-way bandwidth (higher is better)", "bandwidth (GB/s)"),
    ]
    written = 0
    for fname, test, key, scale, title, ylabel in plots:
        series, dashed = collect(docs, test, key, scale)
        if not series:
            print(f"plot-bench: no {test} results, {fname} not written", file=sys.stderr)
            continue
        path = os.path.join(args.out, fname)
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg_plot(title, ylabel, series, dashed, note))
        print(f"plot-bench: wrote {path}")
        written += 1
    if written == 0:
        sys.exit("plot-bench: nothing to plot (no pingpong or bw results)")


if __name__ == "__main__":
    main()
