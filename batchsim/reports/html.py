"""A self-contained HTML report: opens from disk with no server and no network.

Every image is a base64 ``data:`` URI, the CSS and a ~20-line table sorter
are inline, and there is no external URL anywhere (the page cannot phone
home, and it still renders when mailed or archived). Every string that comes
from a user (scenario names, policy names, file paths) goes through
:func:`html.escape`.
"""

from __future__ import annotations

import base64
import html
from typing import Sequence

from batchsim.reports.runs import ReportInfo
from batchsim.reports.tables import Column, shown_columns, table_rows

__all__ = ["page", "figure_html", "table_html", "header_html", "notes_html", "esc"]


def esc(s: object) -> str:
    """Escape any value for HTML text and attribute positions."""
    return html.escape(str(s), quote=True)


_CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Roboto,'DejaVu Sans',Arial,sans-serif;color:#1b1f24;
margin:0;background:#f6f7f9}
main{max-width:1340px;margin:0 auto;padding:20px 24px 40px;background:#fff}
header h1{font-size:24px;margin:0 0 4px}
header p.sub{margin:0 0 14px;color:#57606a}
dl.meta{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:4px 18px;margin:0;
padding:12px 14px;background:#f6f8fa;border:1px solid #d8dee4;border-radius:6px}
dl.meta dt{font-weight:600;color:#57606a}dl.meta dd{margin:0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.badge.yes{background:#dafbe1;color:#116329}.badge.no{background:#fff1e5;color:#953800}
h2{font-size:18px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid #d8dee4}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:5px 9px;border-bottom:1px solid #e6e9ed;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left;font-weight:600}
th{background:#f6f8fa;cursor:pointer;user-select:none;white-space:normal;min-width:54px;
max-width:110px;vertical-align:bottom;font-weight:600}
td .ci{display:block;font-size:11px;color:#57606a}
th:hover{background:#eaeef2}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:hover{background:#f6f8fa}
figure{margin:10px 0 22px}figure img{max-width:100%;height:auto;border:1px solid #e6e9ed}
figcaption{color:#57606a;font-size:13px;margin-top:4px}
p.note,ul.note{color:#57606a;font-size:13px}
details summary{cursor:pointer;font-weight:600;margin:8px 0}
footer{margin-top:30px;color:#57606a;font-size:12px}
"""

_JS = """
document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.title = 'click to sort';
  th.addEventListener('click', function () {
    var table = th.closest('table'), body = table.tBodies[0];
    var idx = Array.prototype.indexOf.call(th.parentNode.children, th);
    var asc = th.getAttribute('aria-sort') !== 'ascending';
    table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[idx].getAttribute('data-v'), y = b.cells[idx].getAttribute('data-v');
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


def header_html(info: ReportInfo) -> str:
    """Title and the facts a reader needs before trusting any number."""
    calibrated = ('<span class="badge yes">calibrated</span>' if info.calibrated else
                  '<span class="badge no">uncalibrated (datasheet peaks)</span>')
    items = [("scenario", esc(info.scenario)), ("model", esc(info.model)),
             ("hardware", esc(info.hardware)), ("cost model", calibrated),
             ("batchsim", esc(info.version)),
             ("seeds", esc(info.seeds) + (" (mean ± 95% CI)" if info.seeds > 1 else ""))]
    items += [(esc(k), esc(v)) for k, v in info.details]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    return (f"<header><h1>{esc(info.title)}</h1>"
            f'<p class="sub">batchsim {esc(info.version)}: discrete-event simulation priced by a '
            f"roofline cost model</p><dl class=\"meta\">{dl}</dl></header>")


def table_html(rows: Sequence[dict], columns: Sequence[Column], table_id: str) -> str:
    """A sortable table: click a header to sort by it (numbers by value). Optional
    columns no row has are left out (:func:`batchsim.reports.tables.shown_columns`)."""
    columns = shown_columns(rows, columns)
    head = "".join(f'<th scope="col">{esc(c.label)}</th>' for c in columns)
    body = []
    for cells in table_rows(rows, columns):
        tds = "".join(f'<td data-v="{esc(key)}">{esc(text)}'
                      + (f'<span class="ci">{esc(ci)}</span>' if ci else "") + "</td>"
                      for text, ci, key in cells)
        body.append(f"<tr>{tds}</tr>")
    return (f'<div class="scroll"><table class="sortable" id="{esc(table_id)}">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def figure_html(png: bytes, alt: str, caption: str) -> str:
    """An embedded PNG (data URI) with its caption."""
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def notes_html(lines: Sequence[str]) -> str:
    """A list of plain-text notes (escaped)."""
    return '<ul class="note">' + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>"


def page(info: ReportInfo, sections: Sequence[tuple[str, str]], footer: str = "") -> str:
    """The whole document: header, then ``(title, body html)`` sections in order."""
    parts = [header_html(info)]
    for title, body in sections:
        parts.append(f"<section><h2>{esc(title)}</h2>{body}</section>")
    if footer:
        parts.append(f"<footer>{esc(footer)}</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(info.title)}</title><style>{_CSS}</style></head>"
            f"<body><main>{''.join(parts)}</main><script>{_JS}</script></body></html>\n")
