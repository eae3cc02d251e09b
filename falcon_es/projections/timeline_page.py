"""The timeline page drawn from its model (``projections.timeline``): one HTML file with
its CSS, SVG and a few lines of script inline, so it opens anywhere with no network.

Every bar carries a ``<title>`` (the browser's own tooltip: the task, its actor and its
outcome) and ``data-task``, so hovering a task's run lights up the pool stretches it
held. Pools are ``<g class="pool">`` elements and tasks ``<g class="task">``, which is
what the tests count.
"""

from __future__ import annotations

import datetime as dt
import html
import string
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from falcon_es.projections.timeline import (
    HELD, IDLE, PROVISIONING, Page, PoolBar, Segment, TaskRow, wait_distribution)

CHART_WIDTH = 1100
LABEL_WIDTH = 230
ROW = 22
TASK_ROW = 16
AXIS = 26
#: About how wide (px) a character of a bar's label is: a held stretch is labelled
#: with as much of its task's id as fits.
CHAR_WIDTH = 6.5
#: Fill per supply mode (the bar's colour), and for a mode the page does not know.
MODE_COLOURS: Mapping[str, str] = MappingProxyType({
    "reservation": "#2b6cb0", "on-demand": "#2f855a", "flex-start": "#c05621"})
OTHER_MODE = "#6b46c1"
OUTCOME_COLOURS: Mapping[str, str] = MappingProxyType({
    "Succeeded": "#38a169", "Failed": "#e53e3e", "Aborted": "#dd6b20"})
RUNNING_COLOUR = "#3182ce"
#: Axis steps (seconds) to choose from, so an axis has at most about ten ticks.
STEPS = (60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)

PAGE = string.Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>$title</title>
<style>
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #1a202c; background: #fff; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 18px 0 6px; }
.note { color: #4a5568; margin: 0 0 10px; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -2px; border-radius: 2px; }
svg text { font: 11px system-ui, sans-serif; fill: #2d3748; }
svg text.holder { fill: #fff; pointer-events: none; }
svg .axis line { stroke: #e2e8f0; } svg .axis text { fill: #718096; }
.seg, .wait, .run { stroke: #fff; stroke-width: 0.5; }
.seg.provisioning { opacity: 0.4; } .seg.idle { fill: url(#idle); }
.wait { fill: #cbd5e0; } .handover { stroke: #1a202c; stroke-width: 2; }
.lit { stroke: #1a202c; stroke-width: 2; }
table { border-collapse: collapse; margin-bottom: 8px; }
td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #edf2f7; }
td:first-child, th:first-child { text-align: left; }
</style></head>
<body>
$defs
<h1>$title</h1>
<p class="note">$note</p>
<p class="legend">$legend</p>
$clusters
<h2>Tasks: wait (grey) and run</h2>
$tasks
$waits
<script>
(function () {
  var lit = [];
  function light(task) {
    lit.forEach(function (el) { el.classList.remove("lit"); });
    lit = task ? Array.prototype.slice.call(
      document.querySelectorAll('[data-task="' + task + '"]')) : [];
    lit.forEach(function (el) { el.classList.add("lit"); });
  }
  document.addEventListener("mouseover", function (event) {
    var el = event.target.closest ? event.target.closest("[data-task]") : null;
    light(el ? el.getAttribute("data-task") : null);
  });
}());
</script>
</body></html>
""")


def render(page: Page, *, title: str = "Falcon-ES timeline", waits: bool = False) -> str:
    """The page as one HTML document; ``waits`` adds the wait distribution per actor
    and per queue (``simulate --html``)."""
    scale = _Scale(page.start, page.end)
    owners = {t.task_id: t for t in page.tasks}
    clusters = "\n".join(_cluster(name, bars, scale, owners)
                         for name, bars in page.clusters.items()) or "<p>(no node pools)</p>"
    note = (f"{_stamp(page.start)} to {_stamp(page.end)} UTC: "
            f"{len(page.pools)} node pool(s) on {len(page.clusters)} cluster(s), "
            f"{len(page.tasks)} task(s). Hover a bar for the task, its actor and its outcome.")
    return PAGE.substitute(
        defs=IDLE_PATTERN, title=_esc(title), note=_esc(note), legend=_legend(page), clusters=clusters,
        tasks=_tasks(page.tasks, scale), waits=_waits(page) if waits else "")


class _Scale:
    def __init__(self, start: dt.datetime, end: dt.datetime) -> None:
        self.start = start
        self.seconds = max((end - start).total_seconds(), 1.0)

    def x(self, moment: dt.datetime) -> float:
        offset = (moment - self.start).total_seconds() / self.seconds
        return round(LABEL_WIDTH + min(max(offset, 0.0), 1.0) * CHART_WIDTH, 1)

    def width(self, start: dt.datetime, end: dt.datetime) -> float:
        return max(round(self.x(end) - self.x(start), 1), 1.0)

    def axis(self, height: float) -> str:
        step = next((s for s in STEPS if self.seconds / s <= 10), STEPS[-1])
        first = self.start + dt.timedelta(seconds=-self.start.timestamp() % step)
        ticks = []
        moment = first
        while (moment - self.start).total_seconds() <= self.seconds:
            x = self.x(moment)
            label = moment.strftime("%H:%M" if step < 86400 else "%m-%d")
            ticks.append(f'<line x1="{x}" y1="{AXIS - 6}" x2="{x}" y2="{height}"/>'
                         f'<text x="{x}" y="{AXIS - 10}" text-anchor="middle">{label}</text>')
            moment += dt.timedelta(seconds=step)
        return f'<g class="axis">{"".join(ticks)}</g>'


def _svg(body: str, height: float) -> str:
    width = LABEL_WIDTH + CHART_WIDTH + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{body}</svg>')


#: The hatching of idle stretches, defined once for every chart of the page.
IDLE_PATTERN = ('<svg width="0" height="0" style="position:absolute"><defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" '
                'patternTransform="rotate(45)"><rect width="6" height="6" fill="#edf2f7"/>'
                '<line x1="0" y1="0" x2="0" y2="6" stroke="#a0aec0" stroke-width="2"/>'
                '</pattern></defs></svg>')


def _cluster(name: str, bars: Sequence[PoolBar], scale: _Scale,
             owners: Mapping[str, TaskRow]) -> str:
    height = AXIS + ROW * len(bars) + 4
    rows = [_pool(bar, AXIS + i * ROW, scale, owners) for i, bar in enumerate(bars)]
    body = scale.axis(height) + "".join(rows)
    return f'<h2>Cluster {_esc(name)}</h2>\n' + _svg(body, height)


def _pool(bar: PoolBar, y: float, scale: _Scale, owners: Mapping[str, TaskRow]) -> str:
    colour = MODE_COLOURS.get(bar.supply_mode, OTHER_MODE)
    ended = "deleted" if bar.deleted else "not deleted yet"
    head = (f'<g class="pool" data-cluster="{_esc(bar.cluster)}" data-pool="{_esc(bar.name)}" '
            f'data-mode="{_esc(bar.supply_mode)}">'
            f'<text x="4" y="{y + 15}">{_esc(bar.name)}</text>'
            f'<rect class="bar" x="{scale.x(bar.start)}" y="{y + 3}" '
            f'width="{scale.width(bar.start, bar.end)}" height="{ROW - 6}" fill="none" '
            f'stroke="{colour}"><title>{_esc(bar.name)} ({bar.supply_mode}): created '
            f'{_stamp(bar.start)}, {ended} {_stamp(bar.end)}</title></rect>')
    segments = "".join(_segment(s, bar, y, scale, colour, owners) for s in bar.segments)
    marks = "".join(
        f'<line class="handover" x1="{scale.x(at)}" y1="{y + 1}" x2="{scale.x(at)}" '
        f'y2="{y + ROW - 1}"><title>hand-over {_stamp(at)}: {_esc(src)} to {_esc(dst)}'
        f'</title></line>' for at, src, dst in bar.handovers)
    return head + segments + marks + "</g>"


def _segment(segment: Segment, bar: PoolBar, y: float, scale: _Scale, colour: str,
             owners: Mapping[str, TaskRow]) -> str:
    task = owners.get(segment.task_id or "")
    who = _who(task, segment.task_id)
    title = {PROVISIONING: f"provisioning for {who}", HELD: f"held by {who}",
             IDLE: "idle: no task holds it"}[segment.kind]
    span = f"{_stamp(segment.start)} to {_stamp(segment.end)}"
    data = f' data-task="{_esc(segment.task_id)}"' if segment.task_id else ""
    fill = "" if segment.kind == IDLE else f' fill="{colour}"'
    x, width = scale.x(segment.start), scale.width(segment.start, segment.end)
    label = ""
    fits = int((width - 6) / CHAR_WIDTH)
    if segment.kind == HELD and segment.task_id and fits >= 3:
        label = (f'<text class="holder" x="{x + 4}" y="{y + 15}">'
                 f'{_esc(_shortened(segment.task_id, fits))}</text>')
    return (f'<rect class="seg {segment.kind}"{data} x="{x}" y="{y + 3}" '
            f'width="{width}" height="{ROW - 6}"{fill}>'
            f'<title>{_esc(bar.name)}: {_esc(title)}, {span}</title></rect>{label}')


def _shortened(text: str, fits: int) -> str:
    return text if len(text) <= fits else text[:fits - 1] + "…"


def _who(task: TaskRow | None, task_id: str | None) -> str:
    if task is None:
        return task_id or "?"
    return f"{task.task_id} {task.name} (actor {task.actor}, {task.outcome})"


def _tasks(tasks: Sequence[TaskRow], scale: _Scale) -> str:
    if not tasks:
        return "<p>(no tasks)</p>"
    height = AXIS + TASK_ROW * len(tasks) + 4
    rows = []
    end = scale.start + dt.timedelta(seconds=scale.seconds)
    for i, task in enumerate(tasks):
        y = AXIS + i * TASK_ROW
        title = _esc(f"{_who(task, task.task_id)} on {task.queue}")
        started = task.started or task.ended or end
        finished = task.ended or end
        colour = OUTCOME_COLOURS.get(task.outcome.split("/")[0], RUNNING_COLOUR)
        run = ""
        if task.started is not None:
            run = (f'<rect class="run" x="{scale.x(started)}" y="{y + 2}" '
                   f'width="{scale.width(started, finished)}" height="{TASK_ROW - 4}" '
                   f'fill="{colour}"><title>{title}: ran {_stamp(started)} to '
                   f'{_stamp(finished)}</title></rect>')
        rows.append(
            f'<g class="task" data-task="{_esc(task.task_id)}">'
            f'<text x="4" y="{y + 12}">{_esc(task.task_id)} {_esc(task.name)[:24]}</text>'
            f'<rect class="wait" x="{scale.x(task.submitted)}" y="{y + 2}" '
            f'width="{scale.width(task.submitted, started)}" height="{TASK_ROW - 4}">'
            f'<title>{title}: waited {int(task.wait_seconds(end))}s</title></rect>{run}</g>')
    return _svg(scale.axis(height) + "".join(rows), height)


def _waits(page: Page) -> str:
    """Wait to Running per actor and per queue: a table and a bar to the p90."""
    parts = []
    for key, heading in (("actor", "actor"), ("queue", "queue (cluster/topology)")):
        stats = wait_distribution(page.tasks, page.end, key)
        longest = max((s["max"] for s in stats.values()), default=1.0) or 1.0
        rows = "".join(
            f'<tr><td>{_esc(name)}</td><td>{int(s["count"])}</td><td>{s["p50"]}</td>'
            f'<td>{s["p90"]}</td><td>{s["max"]}</td><td><svg width="200" height="10">'
            f'<rect class="dist" width="{round(200 * s["p90"] / longest, 1)}" height="10" '
            f'fill="{RUNNING_COLOUR}"/></svg></td></tr>' for name, s in stats.items())
        parts.append(f"<h2>Wait to Running (s) per {heading}</h2><table><tr><th>{key}</th>"
                     f"<th>tasks</th><th>p50</th><th>p90</th><th>max</th><th>p90</th></tr>"
                     f"{rows}</table>")
    return "\n".join(parts)


def _legend(page: Page) -> str:
    modes = sorted({bar.supply_mode for bar in page.pools}) or sorted(MODE_COLOURS)
    items = [f'<span><i style="background:{MODE_COLOURS.get(m, OTHER_MODE)}"></i>{_esc(m)}</span>'
             for m in modes]
    items.append('<span><i style="background:#a0aec0"></i>idle (hatched); pale: '
                 'provisioning</span>')
    items.append('<span><i style="background:#1a202c;width:3px"></i>hand-over</span>')
    items += [f'<span><i style="background:{colour}"></i>task {outcome}</span>'
              for outcome, colour in (*OUTCOME_COLOURS.items(), ("running", RUNNING_COLOUR))]
    return "".join(items)


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)
