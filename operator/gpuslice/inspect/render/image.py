"""The occupancy map as an image (SVG) and a page (HTML), for docs and dashboards.

Hand-written SVG: bars in proportion to GPU memory, one colour per tenant, hatching for
draining and tainted memory, a tooltip per segment. No fonts or scripts to fetch, so
the file renders the same in a browser, on GitHub and in Grafana's text panel. Every text is
XML-escaped, from a printable copy of the report (``printable``: a control character is no XML, and
one a tenant wrote would leave a browser showing nothing).
"""

from __future__ import annotations

from html import escape

from gpuslice.inspect.render.labels import (
    STATE_COLOURS,
    STATE_WORDS,
    colour,
    describe,
    fit,
    gpu_summary,
    rows,
    size_pair,
    tenant_colour,
)
from gpuslice.inspect.render.printable import printable_model
from gpuslice.planning.reads.occupancy import GpuMap
from gpuslice.planning.reads.status_report import StatusReport

WIDTH = 1100
LEFT = 150  # node and GPU names
BAR = 780
ROW = 30
BAR_HEIGHT = 22
CHAR = 6.6  # average width of a 11px sans-serif character
FONT = "font-family:DejaVu Sans,Verdana,Helvetica,Arial,sans-serif"

_DEFS = """<defs>
<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#facc15"/><line x1="0" y1="0" x2="0" y2="6" stroke="#a16207" stroke-width="2"/>
</pattern>
<pattern id="cross" width="8" height="8" patternUnits="userSpaceOnUse">
<rect width="8" height="8" fill="#dc2626"/><path d="M0 0L8 8M8 0L0 8" stroke="#7f1d1d" stroke-width="1.2"/>
</pattern>
</defs>"""


def _fill(state: str, segment_colour: str) -> str:
    return {"draining": "url(#hatch)", "tainted": "url(#cross)"}.get(state, segment_colour)


def _bar(gpu: GpuMap, x: float, y: float) -> list[str]:
    total = sum(s.span for s in gpu.segments) or 1
    out = []
    at = x
    for segment in gpu.segments:
        w = BAR * segment.span / total
        text = fit(segment, int((w - 6) / CHAR))
        ink = "#111827" if segment.state in ("draining", "free") else "#ffffff"
        out.append(f'<g><title>{escape(describe(segment))}</title>'
                   f'<rect x="{at:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" height="{BAR_HEIGHT}"'
                   f' fill="{_fill(segment.state, colour(segment))}" stroke="#ffffff" stroke-width="1"/>'
                   + (f'<text x="{at + 3:.1f}" y="{y + 15:.1f}" font-size="11" fill="{ink}">{escape(text)}</text>'
                      if text else "") + "</g>")
        at += w
    return out


def svg(report: StatusReport) -> str:
    report = printable_model(report)
    body: list[str] = []
    y = 30.0
    body.append(f'<text x="20" y="{y}" font-size="16" font-weight="bold">GPU occupancy</text>')
    y += 14
    if not report.map.nodes:
        y += 20
        body.append(f'<text x="20" y="{y}" font-size="12">No node publishes gpuslice devices.</text>')
    for node in report.map.nodes:
        y += 26
        facts = f"{len(node.gpus)} GPUs" + ("" if node.complete else ", pool being rewritten") + (
            f", {node.gpus_without_devices} GPUs publish no device" if node.gpus_without_devices else "")
        body.append(f'<text x="20" y="{y}" font-size="13" font-weight="bold">{escape(node.name)}'
                    f'<tspan dx="8" font-weight="normal" fill="#6b7280">{escape(facts)}</tspan></text>')
        y += 8
        for title, gpu in rows(node.gpus):
            body.append(f'<text x="30" y="{y + 15}" font-size="11">{escape(title)}'
                        f'<tspan dx="6" fill="#6b7280">{escape(gpu.mode)}</tspan></text>')
            body += _bar(gpu, LEFT, y)
            extra = gpu_summary(gpu) + (f" · {'; '.join(gpu.tainted_reasons)}" if gpu.tainted_reasons else "")
            extra += f" · {gpu.freeing}" if gpu.freeing else ""
            body.append(f'<text x="{LEFT + BAR + 8}" y="{y + 15}" font-size="10" fill="#4b5563">'
                        f'{escape(extra)}</text>')
            y += ROW
    y += 14
    x = 20.0
    tenants = sorted({s.holder.namespace for g in report.map.gpus for s in g.segments if s.holder is not None})
    legend = [(tenant_colour(t), t) for t in tenants]
    legend += [(_fill(state, STATE_COLOURS[state]), words.split(":")[0]) for state, words in STATE_WORDS.items()
               if state != "allocated"]
    for fill, short in legend:
        body.append(f'<rect x="{x}" y="{y}" width="14" height="12" fill="{fill}"/>'
                    f'<text x="{x + 18}" y="{y + 10}" font-size="11">{escape(short)}</text>')
        x += 26 + CHAR * len(short) + 12
    y += 40
    y = _totals(report, body, y)
    height = int(y + 10)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}"'
            f' viewBox="0 0 {WIDTH} {height}" style="{FONT}">{_DEFS}'
            f'<rect width="100%" height="100%" fill="#ffffff"/>' + "".join(body) + "</svg>\n")


def _totals(report: StatusReport, body: list[str], y: float) -> float:
    body.append(f'<text x="20" y="{y}" font-size="13" font-weight="bold">Tenants: use against limit</text>')
    y += 8
    for policy in report.policies:
        for tenant in policy.tenants:
            y += 20
            limit = tenant.limit_bytes
            share = min(1.0, tenant.allocated_bytes / limit) if limit else (1.0 if tenant.allocated_bytes else 0.0)
            body.append(f'<text x="30" y="{y}" font-size="11">{escape(tenant.namespace)}'
                        f'<tspan dx="5" fill="#6b7280">in {escape(policy.name)}</tspan></text>')
            body.append(f'<rect x="{LEFT + 80}" y="{y - 11}" width="300" height="13" fill="#e5e7eb"/>')
            fill = "#dc2626" if tenant.over else tenant_colour(tenant.namespace)
            body.append(f'<rect x="{LEFT + 80}" y="{y - 11}" width="{300 * share:.1f}" height="13" fill="{fill}"/>')
            words = (f"{tenant.allocated} / {'no limit' if tenant.limit is None else tenant.limit} devices,"
                     f" {size_pair(tenant.allocated_bytes, limit)}")
            body.append(f'<text x="{LEFT + 390}" y="{y}" font-size="11">{escape(words)}</text>')
    y += 30
    body.append(f'<text x="20" y="{y}" font-size="13" font-weight="bold">Policies</text>')
    for policy in report.policies:
        y += 20
        ready = policy.condition("Ready")
        degraded = policy.condition("Degraded")
        words = (f"{policy.mode}, {policy.nodes} nodes, {policy.gpus} GPUs: {policy.published} devices,"
                 f" {policy.allocated} allocated, {policy.held} held, {policy.draining} draining,"
                 f" {policy.tainted} tainted, {policy.free} free · Ready {ready.status if ready else '?'}"
                 + (f" · Degraded {degraded.reason}" if degraded and degraded.status == "True" else ""))
        body.append(f'<text x="30" y="{y}" font-size="11"><tspan font-weight="bold">{escape(policy.name)}</tspan>'
                    f' {escape(words)}</text>')
    for note in report.notes:
        y += 18
        body.append(f'<text x="20" y="{y}" font-size="11" fill="#b45309">note: {escape(note)}</text>')
    return y + 10


def html(report: StatusReport) -> str:
    report = printable_model(report)
    rows = "".join(
        f"<tr><td>{escape(t.namespace)}</td><td>{escape(p.name)}</td><td>{t.allocated} / "
        f"{'-' if t.limit is None else t.limit}</td><td>{size_pair(t.allocated_bytes, t.limit_bytes)}</td></tr>"
        for p in report.policies for t in p.tenants)
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>gpuslice status</title>"
            "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
            "td,th{padding:2px 10px;border-bottom:1px solid #e5e7eb;text-align:left}</style></head><body>"
            + svg(report)
            + "<h3>Tenants</h3><table><tr><th>namespace</th><th>policy</th><th>devices</th><th>memory</th></tr>"
            + rows + "</table></body></html>\n")
