"""A self-contained HTML step player: inline JSON and JavaScript, a canvas, no network.

``to_html(t)`` returns a full page; ``fragment=True`` returns one ``<div>`` with its own
script (several can share a page). Every number comes from the Trace's schedule; the page
only draws it. Above ``max_bytes`` the player keeps an even sample of the steps (always the
first and last) and says "showing N of M steps".
"""

from __future__ import annotations

import hashlib
import html as _html
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kernelsim.views import palette as pal
from kernelsim.views.data import block_rects, call_view, panel_dims, panel_extent

if TYPE_CHECKING:
    from kernelsim.trace import Trace

_counter = itertools.count()


def _lines(op, axis) -> int | None:
    if axis is None or axis < 0 or op.block_dims[axis].kind != "blocked":
        return None
    return int(op.block_dims[axis].size)


def player_data(t: Trace, call: int = 0, shown: np.ndarray | None = None) -> dict[str, Any]:
    """The JSON the player draws, for the steps in ``shown`` (all steps if None)."""
    v = call_view(t, call)
    steps = v.call.steps
    shown = np.arange(steps) if shown is None else np.asarray(shown)
    grid = v.call.grid_indices()[shown]
    cum = v.schedule.cumulative_bytes
    ops = []
    for s in v.schedule.operands:
        op = s.operand
        r, c = panel_dims(op)
        h, w = panel_extent(op)
        rects = block_rects(op)[shown].astype(np.int64)
        blocks = op.block_indices[shown]
        ops.append({
            "name": op.name, "role": op.role, "dtype": op.dtype, "shape": list(op.shape),
            "block": [None if b is None else int(b) for b in op.block_shape],
            "h": int(h), "w": int(w), "bh": _lines(op, r), "bw": _lines(op, c),
            "rects": rects.reshape(-1).tolist(),
            "blocks": blocks.reshape(-1).tolist(), "ndim": int(blocks.shape[1]),
            "actions": "".join(str(int(a)) for a in s.actions[shown]),
            "bytes": s.moved_bytes[shown].tolist(),
        })
    return {
        "call": v.index, "name": v.call.name, "model": v.model, "chip": v.chip.name,
        "grid": list(v.call.grid), "total_steps": steps, "steps": shown.tolist(),
        "grid_index": grid.reshape(-1).tolist(), "grid_ndim": int(grid.shape[1]),
        "cumulative": cum[shown].tolist(), "total_bytes": int(cum[-1]) if cum.size else 0,
        "operands": ops, "palette": pal.as_json(), "actions": ["fetch", "skip", "writeback",
                                                                  "keep"],
    }


_CSS = """
.ks-player{font:13px/1.4 system-ui,sans-serif;color:#1f2933;max-width:1100px}
.ks-player .ks-head{font-weight:600;font-size:15px;margin:4px 0}
.ks-player .ks-sub{color:#52606d;margin-bottom:6px}
.ks-player .ks-controls{display:flex;gap:6px;align-items:center;margin:6px 0}
.ks-player .ks-controls input[type=range]{flex:1}
.ks-player button{font:inherit;padding:2px 10px}
.ks-player canvas{display:block;max-width:100%}
.ks-player table{border-collapse:collapse;margin-top:6px}
.ks-player td,.ks-player th{padding:1px 8px;text-align:left;border-bottom:1px solid #e4e7eb}
.ks-player .ks-legend span{display:inline-block;margin-right:12px}
.ks-player .ks-legend i{display:inline-block;width:11px;height:11px;margin-right:4px;
  vertical-align:-1px}
"""

_JS = r"""
(function(root, D){
  var P = D.palette, A = D.actions, n = D.steps.length, cur = 0, timer = null;
  var q = function(s){ return root.querySelector(s); };
  var canvas = q('canvas'), ctx = canvas.getContext('2d');
  var slider = q('.ks-slider'), step = q('.ks-step'), tbody = q('tbody');
  var PW = 250, PH = 230, PAD = 34, cols = Math.max(D.operands.length, 1);
  canvas.width = cols * (PW + PAD) + PAD; canvas.height = PH + 70;
  slider.max = n - 1;
  var legend = q('.ks-legend');
  A.forEach(function(a){
    var s = document.createElement('span'), i = document.createElement('i');
    i.style.background = P.actions[a]; s.appendChild(i);
    s.appendChild(document.createTextNode(P.labels[a])); legend.appendChild(s);
  });
  function fmt(b){ var u=['B','KiB','MiB','GiB'], k=0; while(b>=1024&&k<3){b/=1024;k++;}
    return (k? b.toPrecision(3) : b) + ' ' + u[k]; }
  function tuple(arr, i, nd){ return '(' + arr.slice(i*nd, i*nd+nd).join(', ') + ')'; }
  function draw(){
    var s = D.steps[cur];
    step.textContent = 'step ' + (s + 1) + ' of ' + D.total_steps.toLocaleString('en-US');
    q('.ks-grid').textContent = 'grid index ' + tuple(D.grid_index, cur, D.grid_ndim);
    q('.ks-bytes').textContent = 'cumulative HBM ' + fmt(D.cumulative[cur]) + ' of ' +
      fmt(D.total_bytes) + ' (' + D.cumulative[cur].toLocaleString('en-US') + ' B)';
    slider.value = cur;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.font = '12px system-ui,sans-serif';
    tbody.innerHTML = '';
    D.operands.forEach(function(o, k){
      var sc = Math.min(PW / o.w, PH / o.h), w = o.w * sc, h = o.h * sc;
      var x0 = PAD + k * (PW + PAD), y0 = 34;
      ctx.fillStyle = P.ink;
      ctx.fillText(o.name + ' ' + o.role + ' [' + o.shape.join(', ') + ']', x0, 14);
      ctx.fillStyle = P.idle; ctx.fillRect(x0, y0, w, h);
      ctx.strokeStyle = P.edge; ctx.lineWidth = 1; ctx.beginPath();
      if (o.bw && o.w / o.bw <= 256) for (var x = o.bw; x < o.w; x += o.bw) {
        ctx.moveTo(x0 + x*sc, y0); ctx.lineTo(x0 + x*sc, y0 + h); }
      if (o.bh && o.h / o.bh <= 256) for (var y = o.bh; y < o.h; y += o.bh) {
        ctx.moveTo(x0, y0 + y*sc); ctx.lineTo(x0 + w, y0 + y*sc); }
      ctx.stroke();
      var a = A[+o.actions[cur]], r = o.rects.slice(cur*4, cur*4 + 4);
      var bx = x0 + r[0]*sc, by = y0 + r[1]*sc, bw = Math.max(r[2]*sc, 2),
          bh = Math.max(r[3]*sc, 2);
      ctx.fillStyle = P.actions[a]; ctx.fillRect(bx, by, bw, bh);
      ctx.strokeStyle = P.ink; ctx.strokeRect(bx, by, bw, bh);
      ctx.strokeRect(x0, y0, w, h);
      ctx.fillStyle = P.actions[a]; ctx.font = 'bold 13px system-ui,sans-serif';
      ctx.fillText(a + '  block ' + tuple(o.blocks, cur, o.ndim), x0, y0 + h + 18);
      ctx.font = '12px system-ui,sans-serif';
      var tr = document.createElement('tr');
      [o.name, tuple(o.blocks, cur, o.ndim), a, o.bytes[cur].toLocaleString('en-US')].forEach(
        function(c, j){ var td = document.createElement('td'); td.textContent = c;
          if (j == 2) { td.style.color = P.actions[a]; td.style.fontWeight = 600; }
          tr.appendChild(td); });
      tr.setAttribute('data-operand', o.name); tr.setAttribute('data-action', a);
      tbody.appendChild(tr);
    });
  }
  function go(i){ cur = Math.max(0, Math.min(n - 1, i)); draw(); }
  q('.ks-prev').onclick = function(){ go(cur - 1); };
  q('.ks-next').onclick = function(){ go(cur + 1); };
  slider.oninput = function(){ go(+slider.value); };
  var play = q('.ks-play');
  play.onclick = function(){
    if (timer) { clearInterval(timer); timer = null; play.textContent = 'play'; return; }
    if (cur == n - 1) go(0);
    play.textContent = 'pause';
    timer = setInterval(function(){ if (cur >= n - 1) { play.onclick(); } else go(cur + 1); },
                        Math.max(30, 4000 / n));
  };
  draw();
})(document.getElementById(%(id)s), %(data)s);
"""


def _fragment(data: dict[str, Any], uid: str) -> str:
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    shown, total = len(data["steps"]), data["total_steps"]
    note = (f"showing {shown:,} of {total:,} steps" if shown < total
            else f"all {total:,} steps")
    title = _html.escape(f"call {data['call']}: {data['name']}")
    sub = _html.escape(f"grid {tuple(data['grid'])} = {total:,} steps; model {data['model']} "
                       f"on {data['chip']}; {note}")
    return (
        f'<div class="ks-player" id="{uid}" data-total-steps="{total}" '
        f'data-shown-steps="{shown}">\n<style>{_CSS}</style>\n'
        f'<div class="ks-head">{title}</div>\n<div class="ks-sub">{sub}</div>\n'
        '<div class="ks-controls"><button class="ks-prev" type="button">prev</button>'
        '<button class="ks-play" type="button">play</button>'
        '<button class="ks-next" type="button">next</button>'
        '<input class="ks-slider" type="range" min="0" value="0" step="1" '
        'aria-label="grid step"></div>\n'
        '<div><b class="ks-step"></b> &middot; <span class="ks-grid"></span> &middot; '
        '<span class="ks-bytes"></span></div>\n<canvas></canvas>\n'
        '<div class="ks-legend"></div>\n'
        '<table><thead><tr><th>operand</th><th>block</th><th>action</th><th>bytes moved</th>'
        '</tr></thead><tbody></tbody></table>\n'
        f'<script>{_JS % {"id": json.dumps(uid), "data": payload}}</script>\n</div>'
    )


def _sample(steps: int, n: int) -> np.ndarray:
    return np.unique(np.round(np.linspace(0, steps - 1, max(min(n, steps), 2))).astype(
        np.int64)) if steps > 1 else np.arange(steps)


def player(t: Trace, call: int = 0, max_bytes: int = 1_000_000) -> str:
    """The player ``<div>`` for call ``call``, at most ``max_bytes`` (steps sampled if
    needed)."""
    steps = t.calls[call].steps
    data = player_data(t, call)
    uid = "ks-" + hashlib.sha1(json.dumps([t.calls[call].name, steps, next(_counter)])
                               .encode()).hexdigest()[:10]
    out = _fragment(data, uid)
    n = steps
    while len(out.encode()) > max_bytes and n > 2:
        fixed = len(_fragment(player_data(t, call, _sample(steps, 2)), uid).encode())
        per_step = (len(out.encode()) - fixed) / max(len(data["steps"]) - 2, 1)
        n = min(int((max_bytes - fixed) / per_step * 0.95) + 2, n - 1)
        data = player_data(t, call, _sample(steps, max(n, 2)))
        out = _fragment(data, uid)
    return out


def to_html(t: Trace, path: str | Path | None = None, call: int = 0, fragment: bool = False,
            max_bytes: int = 1_000_000) -> str:
    """The player as a full page (or a fragment); written to ``path`` when given."""
    body = player(t, call, max_bytes - (0 if fragment else 400))
    if not fragment:
        title = _html.escape(f"kernelsim: {t.calls[call].name}")
        body = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                '<link rel="icon" href="data:,">'
                f'<title>{title}</title></head>\n<body>\n{body}\n</body></html>\n')
    if path is not None:
        Path(path).write_text(body, encoding="utf-8")
    return body
