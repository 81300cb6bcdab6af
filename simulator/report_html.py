"""The HTML report of a program (`sticksat report --html FILE`, and the service's
`GET /programs/{key}/report`; docs/report.md): one self-contained file, no scripts, no
external assets: the summary, the per-op table, the timeline per core, the roofline plot
and the LX occupancy over time as inline SVG, the restickifies and the diff against
another program. Every string that comes from a program or graph (op, tensor and graph
names, notes) is HTML-escaped; each op row carries its exact simulated time in `data-us`
(and the summary the total in `data-total-us`) for tools and tests that read the page."""
from __future__ import annotations

import math
from html import escape
from typing import Optional

from simulator.report import (Report, fmt_bytes, fmt_pct, fmt_us, operands_text, sig_digits, sorted_rows)

_COLORS = {"pt": "#4e79a7", "sfp": "#59a14f", "dma": "#e15759"}
_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px} th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:left}
th{background:#f5f5f5;position:sticky;top:0} td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bar{display:inline-block;height:9px;background:#4e79a7;vertical-align:middle}
.kv span{display:inline-block;margin-right:18px} .kv b{font-weight:600}
.notes{font-size:12px;color:#555} svg{background:#fff;border:1px solid #ddd}
.lx{color:#b07aa1;font-weight:600} td.w{max-width:19em;overflow-wrap:anywhere} td.o{font:11px ui-monospace,monospace}
nav{font-size:12px;margin-bottom:10px} nav a{margin-right:14px}
"""
_HEAD = "<meta charset='utf-8'><meta name='viewport' content='width=device-width'>"


def _svg_text(x, y, s, anchor="start", size=10, extra="") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" {extra}>{escape(str(s))}</text>'


def timeline_svg(report: Report, width: int = 1000) -> str:
    """One row per core: each op's busy span on that core, coloured by unit."""
    cores = [c for c, spans in enumerate(report.per_core) if spans]
    total = report.total_us or 1.0
    left, row_h, top = 50, 12, 18
    height = top + row_h * max(1, len(cores)) + 24
    sx = (width - left - 10) / total
    unit = {r.op: r.ex_unit for r in report.ops}
    parts = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for i, c in enumerate(cores):
        y = top + i * row_h
        parts.append(_svg_text(left - 4, y + row_h - 3, f"core {c}", "end", 9))
        for op, a, b in report.per_core[c]:
            w = max(0.5, (b - a) * sx)
            parts.append(f'<rect x="{left + a * sx:.2f}" y="{y + 1}" width="{w:.2f}" height="{row_h - 2}" '
                         f'fill="{_COLORS.get(unit.get(op), "#999")}"><title>{escape(op)}: '
                         f'{escape(fmt_us(a))} - {escape(fmt_us(b))}</title></rect>')
    y = top + len(cores) * row_h + 14
    for k in range(6):
        t = total * k / 5
        parts.append(_svg_text(left + t * sx, y, fmt_us(t), "end" if k == 5 else "middle", 9))
    parts.append(_svg_text(left, 12, "PT (matmul)", size=10, extra=f'fill="{_COLORS["pt"]}"'))
    parts.append(_svg_text(left + 90, 12, "SFP (vector)", size=10, extra=f'fill="{_COLORS["sfp"]}"'))
    parts.append(_svg_text(left + 180, 12, "DMA (restickify, copy)", size=10, extra=f'fill="{_COLORS["dma"]}"'))
    parts.append("</svg>")
    return "".join(parts)


def roofline_svg(report: Report, width: int = 640, height: int = 400) -> str:
    """Log-log: operational intensity (MAC per device-memory byte) against achieved MAC/ns;
    the roof is min(peak compute, peak bandwidth x intensity)."""
    pts = [r for r in report.ops if r.intensity_mac_per_byte and r.achieved_mac_per_ns]
    peak, bw = report.peak_mac_per_ns, report.peak_gbps   # GB/s = bytes per ns
    xs = [r.intensity_mac_per_byte for r in pts] + [peak / bw]
    ys = [r.achieved_mac_per_ns for r in pts] + [peak]
    x0 = 10 ** math.floor(math.log10(min(xs) / 2)); x1 = 10 ** math.ceil(math.log10(max(xs) * 2))
    y0 = 10 ** math.floor(math.log10(min(ys) / 2)); y1 = 10 ** math.ceil(math.log10(max(ys) * 2))
    l, r_, t, b = 60, 20, 20, 45
    X = lambda v: l + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * (width - l - r_)
    Y = lambda v: height - b - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * (height - t - b)
    parts = [f'<svg id="roofline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for e in range(int(math.log10(x0)), int(math.log10(x1)) + 1):
        parts.append(f'<line x1="{X(10**e):.1f}" y1="{t}" x2="{X(10**e):.1f}" y2="{height - b}" stroke="#eee"/>')
        parts.append(_svg_text(X(10 ** e), height - b + 14, sig_digits(10 ** e, 3), "middle", 9))
    for e in range(int(math.log10(y0)), int(math.log10(y1)) + 1):
        parts.append(f'<line x1="{l}" y1="{Y(10**e):.1f}" x2="{width - r_}" y2="{Y(10**e):.1f}" stroke="#eee"/>')
        parts.append(_svg_text(l - 4, Y(10 ** e) + 3, sig_digits(10 ** e, 3), "end", 9))
    ridge = peak / bw
    xa = max(x0, y0 / bw)
    parts.append(f'<polyline fill="none" stroke="#c00" stroke-width="2" points="{X(xa):.1f},{Y(bw * xa):.1f} '
                 f'{X(ridge):.1f},{Y(peak):.1f} {X(x1):.1f},{Y(peak):.1f}"/>')
    parts.append(_svg_text(X(x1) - 4, Y(peak) - 5, f"peak {sig_digits(peak)} MAC/ns", "end", 10, 'fill="#c00"'))
    parts.append(_svg_text(X(xa) + 6, Y(bw * xa) - 6, f"{sig_digits(bw)} GB/s", "start", 10, 'fill="#c00"'))
    for r in pts:
        parts.append(f'<circle class="pt" cx="{X(r.intensity_mac_per_byte):.1f}" cy="{Y(r.achieved_mac_per_ns):.1f}" '
                     f'r="{3 + 6 * math.sqrt(r.share):.1f}" fill="#4e79a7" fill-opacity="0.6"><title>{escape(r.op)}: '
                     f'{sig_digits(r.achieved_mac_per_ns, 3)} MAC/ns ({escape(fmt_pct(r.compute_fraction))} of peak), '
                     f'{sig_digits(r.achieved_gbps or 0, 3)} GB/s, {escape(fmt_us(r.simulated_us))}</title></circle>')
    parts.append(_svg_text((l + width - r_) / 2, height - 8, "intensity (MAC per device-memory byte)", "middle", 11))
    parts.append(_svg_text(14, (t + height - b) / 2, "achieved MAC/ns", "middle", 11,
                           f'transform="rotate(-90 14 {(t + height - b) / 2:.1f})"'))
    parts.append("</svg>")
    return "".join(parts)


def lx_svg(report: Report, width: int = 1000, height: int = 180) -> str:
    """LX bytes reserved per core over time (every core reserves the same slice size) and
    the per-core capacity."""
    steps = report.lx_occupancy or [(0.0, 0), (report.total_us, 0)]
    total = report.total_us or 1.0
    cap = report.lx_bytes_per_core
    top_v = max(cap, max(v for _, v in steps)) or 1
    l, r_, t, b = 60, 10, 14, 24
    X = lambda v: l + v / total * (width - l - r_)
    Y = lambda v: height - b - v / top_v * (height - t - b)
    pts = [f"{X(0):.1f},{Y(0):.1f}"]
    prev = 0
    for tm, v in steps:
        pts.append(f"{X(tm):.1f},{Y(prev):.1f}")
        pts.append(f"{X(tm):.1f},{Y(v):.1f}")
        prev = v
    pts.append(f"{X(total):.1f},{Y(0):.1f}")
    parts = [f'<svg id="lx" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<polygon points="{" ".join(pts)}" fill="#b07aa1" fill-opacity="0.5" stroke="#b07aa1"/>',
             f'<line x1="{l}" y1="{Y(cap):.1f}" x2="{width - r_}" y2="{Y(cap):.1f}" stroke="#c00" stroke-dasharray="4 3"/>',
             _svg_text(width - r_ - 4, Y(cap) - 4, f"LX per core {fmt_bytes(cap)}", "end", 10, 'fill="#c00"'),
             _svg_text(l - 4, Y(0) + 3, "0", "end", 9),
             _svg_text(l - 4, Y(top_v) + 8, fmt_bytes(top_v), "end", 9)]
    for k in range(6):
        parts.append(_svg_text(X(total * k / 5), height - 8, fmt_us(total * k / 5), "end" if k == 5 else "middle", 9))
    parts.append("</svg>")
    return "".join(parts)


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset(), tid: str = "",
           row_attrs: Optional[list[str]] = None, classes: Optional[dict[int, str]] = None) -> str:
    """Cells are HTML already (escape before); `row_attrs[i]` is the attribute text of row
    i; numeric columns are right-aligned, `classes` gives other columns a class (w: long
    names that may wrap anywhere, o: operand lists in monospace)."""
    h = "".join(f"<th>{escape(x)}</th>" for x in headers)
    cls = {i: "n" for i in numeric}
    cls.update(classes or {})
    body = []
    for k, row in enumerate(rows):
        attrs = f" {row_attrs[k]}" if row_attrs else ""
        body.append(f"<tr{attrs}>" + "".join(f'<td class="{cls[i]}">{c}</td>' if i in cls else f"<td>{c}</td>"
                                             for i, c in enumerate(row)) + "</tr>")
    return f'<table id="{tid}"><thead><tr>{h}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def render_html(report: Report, diff: Optional[dict] = None, top: Optional[int] = None,
                nav: Optional[list[tuple[str, str]]] = None, facts: Optional[list[tuple[str, str]]] = None) -> str:
    """The page. `nav`: (href, label) links above the title (the service links the store
    index and the JSON); `facts`: (label, value) pairs shown under the summary (the
    service shows the store key, options and when it was solved). Both are escaped."""
    m = report.summary
    rows = sorted_rows(report, top)
    links = "".join(f'<a href="{escape(href)}">{escape(label)}</a>' for href, label in (nav or []))
    extra = "".join(f"<span>{escape(k)} <b>{escape(v)}</b></span>" for k, v in (facts or []))
    head = ((f"<nav>{links}</nav>" if links else "")
            + f"<h1>{escape(report.graph or 'program')}</h1>"
            f'<div class="kv" id="summary" data-total-us="{report.total_us!r}"><span>planner <b>{escape(report.planner)}</b></span>'
            f"<span>status <b>{escape(str(m.get('status') or '-'))}</b></span>"
            f"<span>simulated <b>{escape(fmt_us(report.total_us))}</b></span>"
            f"<span>predicted <b>{escape(fmt_us(m.get('predicted_us')))}</b></span>"
            f"<span>lower bound <b>{escape(fmt_us(m.get('lower_bound_us')))}</b></span>"
            f"<span>solver gap <b>{escape(fmt_pct(m.get('solver_gap')))}</b></span>"
            f"<span>solve <b>{escape(fmt_us((m.get('solve_seconds') or 0) * 1e6))}</b></span></div>"
            f'<div class="kv"><span>{m["ops"]} ops ({m["compute_ops"]} compute, {m["restickifies"]} restickify, '
            f'{m["relayouts"]} LX relayout)</span><span>{m["bundles"]} bundles</span>'
            f'<span>{m["lx_residencies"]} LX residencies</span><span>hardware {escape(report.hardware)}</span></div>'
            + (f'<div class="kv">{extra}</div>' if extra else ""))
    notes = "".join(f"<li>{escape(n)}</li>" for n in m.get("notes", []))
    op_rows = []
    for r in rows:
        ops_txt = escape(operands_text(r)).replace("@LX", '@<span class="lx">LX</span>')
        op_rows.append([escape(r.op), escape(r.source or "-"), escape(r.layer or "-"), escape(r.opfunc),
                        str(r.cores), escape(r.core_split), escape(r.temporal_tiles), ops_txt, escape(r.bound_by),
                        escape(fmt_us(r.simulated_us)),
                        f'<span class="bar" style="width:{100 * r.share:.1f}px"></span> {escape(fmt_pct(r.share))}'])
    roof_rows = [[escape(r.op), sig_digits(r.macs) if r.macs else "-", escape(fmt_bytes(r.hbm_bytes)) if r.hbm_bytes else "-",
                  sig_digits(r.intensity_mac_per_byte, 3) if r.intensity_mac_per_byte else "-",
                  escape(fmt_pct(r.compute_fraction)), sig_digits(r.achieved_gbps, 3) if r.achieved_gbps else "-",
                  escape(fmt_pct(r.bandwidth_fraction)), escape(r.bound_by)] for r in rows]
    rs_rows = [[escape(x.op), escape(x.tensor), f"{x.from_stick} → {x.to_stick}", escape(x.memory),
                escape(fmt_us(x.simulated_us)), escape(", ".join(x.consumers) or "-")] for x in report.restickifies]
    op_attrs = [f'data-op="{escape(r.op)}" data-us="{r.simulated_us!r}"' for r in rows]
    parts = [f"<!DOCTYPE html><html lang='en'><head>{_HEAD}<title>sticksat report: {escape(report.graph)}"
             f"</title><style>{_CSS}</style></head><body>", head,
             f'<ul class="notes">{notes}</ul>' if notes else "",
             f"<h2>Ops by simulated time ({len(rows)} of {len(report.ops)})</h2>",
             "<p class='notes'>operands: role:stick dim@memory (dev: device memory, LX: scratchpad, LXt: a fused "
             "kernel's tile buffer)</p>",
             _table(["op", "source", "layer", "kind", "cores", "split", "tiles", "operands", "bound by", "time",
                     "share"], op_rows, {4, 9, 10}, "ops", op_attrs, {0: "w", 1: "w", 7: "o"}),
             "<h2>Timeline per core</h2>", timeline_svg(report),
             f"<h2>Roofline</h2><p class='notes'>peak {sig_digits(report.peak_mac_per_ns)} MAC/ns (PT, all cores), "
             f"{sig_digits(report.peak_gbps)} GB/s device memory; a dot per op with MACs, sized by its share of time</p>",
             roofline_svg(report),
             _table(["op", "MACs", "device bytes", "MAC/byte", "% peak compute", "GB/s", "% peak bw", "bound by"],
                    roof_rows, {1, 2, 3, 4, 5, 6}, "roofline-table", classes={0: "w"}),
             "<h2>LX occupancy per core</h2>", lx_svg(report),
             f"<h2>Restickifies ({len(report.restickifies)})</h2>",
             _table(["op", "tensor", "stick dim", "memory", "time", "needed by"], rs_rows, {4}, "restickifies",
                    classes={0: "w", 1: "w", 5: "w"})
             if rs_rows else "<p>none</p>"]
    if diff is not None:
        d_rows = [[escape(r["op"]), escape(r["what"]), escape(r["this"]), escape(r["other"]),
                   ("+" if r["delta_us"] >= 0 else "") + escape(fmt_us(r["delta_us"]))] for r in diff["ops"]]
        parts.append(f"<h2>Diff: this {escape(fmt_us(diff['this_us']))}, other {escape(fmt_us(diff['other_us']))}</h2>")
        parts.append(_table(["op", "differs in", "this", "other", "cost"], d_rows, {4}, "diff",
                            classes={0: "w", 1: "w", 2: "w", 3: "w"})
                     if d_rows else "<p>no differing decisions</p>")
    parts.append("</body></html>")
    return "".join(parts)
