// kernelsim's viewer: one pallas_call, grid step by grid step, showing which blocks move
// between the chip's memories (HBM, VMEM and SMEM on a TPU, and over ICI between the chips of
// a shard_map; global memory and shared memory / registers on a GPU), or one Mosaic GPU kernel (kernelsim.gpu), event by event per warpgroup,
// in the GPU's memories (global memory, shared memory, registers). One plain ES module, no
// build step: anywidget renders it in a notebook
// (`export default {render}`), and `standalone(el, data)` runs it on a page with the data
// inline (Trace.to_html, the course site). It draws what kernelsim/views/viewer.py sends --
// the model's lanes, in order, and its words -- and computes no number of its own beyond
// indexing, formatting and percentages.

const ACTIONS = ["fetch", "skip", "writeback", "keep"];
const SPEEDS = [1, 2, 5, 10, 30, 60, 0];          // steps per second; 0 = one per frame
const ANIMATE_BELOW_MS = 150;                        // packets fly only when steps are slower
const SMEM_CELLS = 64;                               // SMEM entries drawn per operand
const ARRAY_PX = 130;                                // tallest drawn operand, CSS pixels
const ICI_SHOWN = 32;                                // copies in flight listed per step

const CSS = `
.ks-viewer.ks-viewer{--ks-ink:#1f2933;--ks-soft:#52606d;--ks-line:#cbd2d9;--ks-idle:#eef1f4;
  font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ks-ink);
  background:#fff;position:relative;box-sizing:border-box;width:100%;max-width:100%;
  border:1px solid var(--ks-line);border-radius:6px;padding:10px;outline-offset:2px;
  overflow-wrap:anywhere}
.ks-viewer.ks-viewer *{box-sizing:border-box}
.ks-viewer.ks-viewer{container-type:inline-size}
.ks-viewer .ks-controls{position:sticky;top:var(--ks-sticky-top,0px);z-index:6;background:#fff;
  margin:0 -4px;padding:2px 4px;border-bottom:1px solid var(--ks-line)}
.ks-viewer .ks-body{display:grid;gap:0 18px;
  grid-template-columns:repeat(auto-fit,minmax(min(100%,250px),1fr))}
.ks-viewer .ks-body>*{min-width:0}
@container (min-width:620px){.ks-viewer .ks-body>[data-kind=arrays]{grid-column:span 2}}
.ks-viewer .ks-body>[data-kind=events]{grid-column:1/-1}
.ks-viewer button,.ks-viewer select{font:inherit;font-size:13px;padding:3px 9px;
  border:1px solid #9aa5b1;border-radius:4px;background:#f5f7fa;color:inherit;min-height:30px}
.ks-viewer select{max-width:100%}
.ks-viewer button:focus-visible,.ks-viewer select:focus-visible,.ks-viewer input:focus-visible{
  outline:2px solid #0072b2;outline-offset:1px}
.ks-viewer .ks-title{font-weight:600;font-size:14px;margin:0 0 6px}
.ks-viewer .ks-measured{margin:-2px 0 6px;font-variant-numeric:tabular-nums}
.ks-viewer .ks-measured>span{white-space:nowrap}
.ks-viewer .ks-row{display:flex;flex-wrap:wrap;gap:6px 10px;align-items:center;margin:4px 0}
.ks-viewer .ks-slider{flex:1 1 140px;min-width:120px}
.ks-viewer .ks-stepno{font-variant-numeric:tabular-nums;white-space:nowrap;font-weight:600}
.ks-viewer label{white-space:nowrap}
.ks-viewer .ks-toggles{display:flex;flex-wrap:wrap;gap:0 8px;min-width:0}
.ks-viewer .ks-status{margin:4px 0;padding:4px 8px;background:#f5f7fa;border-radius:4px;
  min-height:2.9em;overflow-wrap:anywhere}
.ks-viewer .ks-lane{border-top:1px solid var(--ks-line);padding:6px 0 4px;margin-top:4px}
.ks-viewer .ks-lane>h4{margin:0 0 4px;font-size:13px;font-weight:700}
.ks-viewer .ks-lane>h4 span{font-weight:400;color:var(--ks-soft)}
.ks-viewer .ks-ops{display:flex;flex-wrap:wrap;gap:10px 14px}
.ks-viewer .ks-op{flex:1 1 120px;min-width:110px;max-width:320px}
.ks-viewer .ks-name{font-weight:600;overflow-wrap:anywhere}
.ks-viewer .ks-meta{color:var(--ks-soft);font-size:12px;overflow-wrap:anywhere}
.ks-viewer .ks-array{position:relative;width:100%;background:var(--ks-idle);
  border:1px solid var(--ks-ink);overflow:hidden;margin:3px 0}
.ks-viewer .ks-block{position:absolute;border:2px solid var(--ks-ink);min-width:3px;
  min-height:3px}
.ks-viewer .ks-act{font-size:12px;font-weight:600}
.ks-viewer .ks-sw{display:inline-block;width:14px;height:14px;border:1px solid var(--ks-ink);
  vertical-align:-2px;margin-right:4px}
.ks-viewer .ks-vrow{display:flex;flex-wrap:wrap;gap:4px 8px;align-items:stretch;margin:4px 0}
.ks-viewer .ks-vlabel{flex:0 0 150px;min-width:0}
.ks-viewer .ks-slots{display:flex;flex-wrap:wrap;gap:6px;flex:1 1 180px}
.ks-viewer .ks-slot{flex:1 1 90px;max-width:200px;min-height:44px;border:1px solid #9aa5b1;
  border-left-width:8px;border-radius:3px;padding:2px 6px;background:#fff;font-size:12px}
.ks-viewer .ks-slot.ks-active{border-width:2px;border-left-width:8px;border-color:var(--ks-ink);
  box-shadow:0 0 0 2px rgba(0,0,0,.12)}
.ks-viewer .ks-slot b{display:block;font-size:12px}
.ks-viewer .ks-scratch{border-left-color:#e69f00}
.ks-viewer .ks-cap{margin:6px 0 2px}
.ks-viewer .ks-capbar{height:12px;background:var(--ks-idle);border:1px solid #9aa5b1;
  border-radius:3px;overflow:hidden}
.ks-viewer .ks-capbar>div{height:100%;background:#0072b2;min-width:2px}
.ks-viewer .ks-capbar.ks-over>div{background:#d55e00}
.ks-viewer .ks-cells{display:flex;flex-wrap:wrap;gap:3px;margin:3px 0}
.ks-viewer .ks-cell{min-width:30px;padding:1px 3px;text-align:center;border:1px solid #9aa5b1;
  border-radius:2px;font-size:12px;font-variant-numeric:tabular-nums;background:#fff}
.ks-viewer .ks-cell.ks-read{background:#cc79a7;color:#fff;font-weight:700;
  border-color:var(--ks-ink);text-decoration:underline}
.ks-viewer .ks-grid{display:grid;gap:1px;background:var(--ks-line);border:1px solid #9aa5b1;
  width:max-content;max-width:100%}
.ks-viewer .ks-gc{background:#fff;width:var(--ks-cs);height:var(--ks-cs)}
.ks-viewer .ks-gc.ks-done{background:#c6dbef}
.ks-viewer .ks-gc.ks-now{background:var(--ks-ink)}
.ks-viewer .ks-chart{position:relative;height:90px;border-left:1px solid #9aa5b1;
  border-bottom:1px solid #9aa5b1;margin:2px 0 2px}
.ks-viewer .ks-chart svg{position:absolute;inset:0;width:100%;height:100%}
.ks-viewer .ks-cursor{position:absolute;top:0;bottom:0;width:2px;background:#d55e00}
.ks-viewer .ks-axis{display:flex;justify-content:space-between;font-size:12px;
  color:var(--ks-soft)}
.ks-viewer .ks-legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin-top:6px}
.ks-viewer .ks-access{display:grid;gap:1px;margin-top:3px;width:max-content}
.ks-viewer .ks-access i{width:7px;height:7px;background:var(--ks-idle)}
.ks-viewer .ks-access i.r{background:#0072b2}.ks-viewer .ks-access i.w{background:#d55e00}
.ks-viewer .ks-access i.rw{background:linear-gradient(135deg,#0072b2 50%,#d55e00 50%)}
.ks-viewer .ks-packet{position:absolute;z-index:5;pointer-events:none;border:2px solid #1f2933;
  border-radius:2px;opacity:.9}
.ks-viewer .ks-wait{color:#d55e00;font-weight:600}
.ks-viewer .ks-strip{position:relative;display:flex;height:14px;border:1px solid #9aa5b1;
  margin:3px 0;overflow:hidden}
.ks-viewer .ks-strip i{flex:1 1 0;min-width:0}
.ks-viewer .ks-strip.ks-sep i+i{border-left:1px solid #fff}
.ks-viewer .ks-strip .ks-cursor{width:3px;margin-left:-1px;background:var(--ks-ink)}
.ks-viewer .ks-warn{color:#d55e00;font-size:12px;overflow-wrap:anywhere}
@media (max-width:480px){.ks-viewer{padding:6px}.ks-viewer .ks-vlabel{flex-basis:100%}
  .ks-viewer .ks-op{flex-basis:40%;min-width:0}}
`;

// ---- data -------------------------------------------------------------------------------

const TYPED = {i8: Int8Array, u16: Uint16Array, i32: Int32Array, f64: Float64Array};

function decode(v) {
  if (!v || typeof v !== "object" || !("t" in v)) return v;
  const raw = atob(v.b), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return new TYPED[v.t](bytes.buffer);
}

function fmtBytes(n) {
  const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [u, s] of units) if (n >= s) return `${+(n / s).toPrecision(3)} ${u}`;
  return `${n} B`;
}

function fmtSeconds(s) {
  for (const [u, k] of [["s", 1], ["ms", 1e-3], ["µs", 1e-6]]) {
    if (s >= k) return `${+(s / k).toPrecision(3)} ${u}`;
  }
  return `${+(s * 1e9).toPrecision(3)} ns`;
}

// the header's line of `kernelsim.run(..., measure=True)`: the chip's time beside the
// trace's estimate and their ratio (all three sent by viewer.py), or why it was not measured
function measuredLine(M) {
  if (M.seconds === null) {
    return h("div", {class: "ks-measured ks-meta", text: `not measured: ${M.note}`});
  }
  return h("div", {class: "ks-measured",
                   title: `device time: ${M.loop_calls} calls in one jitted loop, median of ${M.repeats}; ` +
                          `dispatched one by one from Python: ${fmtSeconds(M.dispatched_seconds)} per call`},
           h("span", {text: `measured ${fmtSeconds(M.seconds)} on ${M.device}`}), " · ",
           h("span", {text: `estimated ${fmtSeconds(M.estimate_s)} on ${M.chip}`}), " ",
           h("span", {class: "ks-ratio", text: `(${M.ratio.toFixed(2)}× the estimate)`}));
}

const tuple = (a) => `(${Array.from(a).join(", ")})`;

// CSS background of an action: its colour, and its pattern over it (the palette's hatches)
function actionBg(P, a) {
  const c = P.actions[a];
  const over = {
    fetch: "repeating-linear-gradient(45deg,rgba(255,255,255,.55) 0 2px,transparent 2px 7px)",
    writeback: "repeating-linear-gradient(-45deg,rgba(255,255,255,.55) 0 2px,transparent 2px 7px)",
    skip: "radial-gradient(rgba(255,255,255,.8) 1.2px,transparent 1.6px) 0 0/6px 6px",
    keep: "none",
  }[a];
  return `${over === "none" ? "" : over + ","}${c}`;
}

// Per call: typed arrays decoded once, and per-model views of them.
function prepare(call) {
  if (call._ready) return call;
  call.steps = decode(call.steps);
  call.grid_index = decode(call.grid_index);
  for (const o of call.operands) o.block_at = decode(o.block_at);
  for (const p of call.prefetch) {
    p.read_offsets = decode(p.read_offsets);
    p.reads = decode(p.reads);
  }
  if (call.accesses) for (const a of Object.values(call.accesses)) a.at = decode(a.at);
  call._ready = true;
  return call;
}

function prepareModel(m) {
  if (m._ready) return m;
  for (const o of Object.values(m.operands)) {
    o.actions = decode(o.actions);
    o.slot = decode(o.slot);
    o.filling = decode(o.filling);
  }
  m.cumulative = decode(m.cumulative);
  m._ready = true;
  return m;
}

// ---- DOM helpers ------------------------------------------------------------------------

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v);
  }
  for (const kid of kids) if (kid != null) e.append(kid);
  return e;
}

function injectStyle(root) {
  const doc = root.getRootNode();
  const host = doc.head || doc;
  if (host.querySelector && host.querySelector("style[data-ks-viewer]")) return;
  host.append(h("style", {"data-ks-viewer": "1", text: CSS}));
}

// ---- the viewer ---------------------------------------------------------------------------

class Viewer {
  constructor(model, el) {
    this.model = model;
    this.el = el;
    this.root = h("div", {class: "ks-viewer", tabindex: "0",
                          "aria-label": "kernelsim step viewer; arrow keys step, space plays"});
    el.append(this.root);
    injectStyle(el);
    this.playing = false;
    this.lastStep = -1;
    this.build();
    this.root.addEventListener("keydown", (e) => this.key(e));
    const redraw = () => this.build();
    for (const k of ["data", "call", "model", "chip", "hidden"]) model.on(`change:${k}`, redraw);
    // a step set in the kernel (viewer.step = k) may be out of range: show the nearest one
    model.on("change:step",
             () => this.draw(Math.max(0, Math.min(this.n - 1, model.get("step")))));
  }

  get data() { return this.model.get("data"); }

  set(k, v) {
    this.model.set(k, v);
    this.model.save_changes();
  }

  // Everything that depends on call, model, chip and the hidden operands.
  build() {
    this.stop();
    const D = this.data, P = D.palette;
    this.gpu = null;
    if (D.kind === "gpu_kernel") { this.buildGpu(D); return; }
    const ci = Math.min(this.model.get("call") || 0, D.calls.length - 1);
    const call = prepare(D.calls[ci]);
    const modelName = this.model.get("model") || D.model;
    const m = call.models[modelName];
    this.root.replaceChildren();
    this.call = call;
    this.P = P;
    const n = call.shown;
    this.n = n;
    const hidden = new Set(this.model.get("hidden") || []);

    // title and controls
    const sem = call.semantics.length ? ` · ${call.semantics.join(", ")}` : "";
    this.root.append(h("div", {class: "ks-title",
      text: `call ${call.index}: ${call.name}` +
            (call.device ? ` · device ${call.device.id}` : "") + ` · grid ${tuple(call.grid)} = ` +
            `${call.total_steps.toLocaleString("en-US")} steps${sem}` +
            (n < call.total_steps ? ` · showing ${n.toLocaleString("en-US")} of them` : "")}));
    if (call.measured) this.root.append(measuredLine(call.measured));
    const {prev, play, next, speed, slider} = this.playback("step", "grid step");
    this.speedSel = speed;
    const opts = h("div", {class: "ks-row ks-options"}, h("label", {}, "speed ", speed));
    if (D.calls.length > 1) {
      const sel = h("select", {class: "ks-call", "aria-label": "pallas_call"});
      D.calls.forEach((c, i) => sel.append(h("option", {value: i, text: `call ${i}: ${c.name}` +
        (c.device ? ` · device ${c.device.id}` : "")})));
      sel.value = String(ci);
      sel.onchange = () => this.set("call", +sel.value);
      opts.append(sel);
    }
    const msel = h("select", {class: "ks-model", "aria-label": "pipeline model"});
    for (const name of ["tpu", "gpu"]) msel.append(h("option", {value: name, text: name}));
    msel.value = modelName;
    msel.onchange = () => this.setModel(msel.value);
    opts.append(h("label", {}, "model ", msel));
    if (m) {
      const chip = m.costs[this.model.get("chip")] ? this.model.get("chip") : m.default_chip;
      this.chip = chip;
      const csel = h("select", {class: "ks-chip", "aria-label": "chip"});
      for (const name of Object.keys(m.costs)) csel.append(h("option", {value: name, text: name}));
      if (this.model.isLive) for (const name of D.chip_names?.[modelName] || []) {
        if (!m.costs[name]) csel.append(h("option", {value: name, text: name}));
      }
      csel.value = chip;
      csel.onchange = () => this.set("chip", csel.value);
      opts.append(h("label", {}, "chip ", csel));
    }
    const toggles = h("span", {class: "ks-toggles"});
    for (const o of call.operands) {
      const cb = h("input", {type: "checkbox", "data-operand": o.name});
      cb.checked = !hidden.has(o.name);
      cb.onchange = () => {
        const now = new Set(this.model.get("hidden") || []);
        if (cb.checked) now.delete(o.name); else now.add(o.name);
        this.set("hidden", [...now]);
      };
      toggles.append(h("label", {}, cb, ` ${o.name} `));
    }
    opts.append(toggles);
    this.root.append(opts);
    // the controls and what the step does stay in view while the lanes scroll past
    this.status = h("p", {class: "ks-status", role: "status", "aria-live": "polite"});
    this.root.append(h("div", {class: "ks-controls"},
                       h("div", {class: "ks-row"}, prev, play, next, slider, this.stepno),
                       this.status));

    if (!m) {  // the live widget asked the kernel for this model's schedule
      this.status.append(h("span", {class: "ks-wait",
                                    text: `computing the ${modelName} schedule in the kernel…`}));
      return;
    }
    this.m = prepareModel(m);
    this.cost = m.costs[this.chip];
    this.words = m.words;
    this.ops = call.operands.filter((o) => !hidden.has(o.name));
    this.smem = null;
    this.ici = null;
    this.scratchAccess = {};
    const body = h("div", {class: "ks-body"});
    for (const lane of m.lanes) {
      const section = h("section", {class: `ks-lane ks-${lane.kind}`, "data-lane": lane.id,
                                    "data-kind": lane.kind},
                        h("h4", {}, `${lane.title} `, h("span", {text: lane.note})));
      const build = LANES[lane.kind];  // a kind this module does not know: title and note
      if (build) build.call(this, section);
      body.append(section);
    }
    body.append(this.buildGrid(), this.buildTraffic());
    this.root.append(body);
    this.buildLegend();
    this.cur = -1;
    this.draw(Math.min(Math.max(this.model.get("step") || 0, 0), n - 1), true);
  }

  setModel(name) {
    const m = this.call.models[name];
    this.model.set("model", name);
    if (m) this.model.set("chip", m.default_chip);
    this.model.save_changes();
  }

  // ---- lanes: each builder fills its lane's section (LANES below maps kinds to them) ----

  buildArrays(lane) {
    const box = h("div", {class: "ks-ops"});
    this.hbm = {};
    for (const o of this.ops) {
      const ratio = o.h / o.w;
      let style;
      // at most ARRAY_PX high, so a lane of tall operands stays a fraction of a screen
      if (ratio > 6) style = `height:${ARRAY_PX}px;width:40px`;
      else if (ratio < 1 / 6) style = "height:30px";
      else style = `aspect-ratio:${o.w}/${o.h};width:min(100%,${Math.round(ARRAY_PX / ratio)}px)`;
      const lines = [];
      // white block boundaries every block size (up to 128 blocks per axis)
      const rule = (deg, pct) => `repeating-linear-gradient(${deg}deg,transparent 0 ` +
        `calc(${pct}% - 1px),#fff calc(${pct}% - 1px) ${pct}%)`;
      if (o.bw && o.w / o.bw <= 128) lines.push(rule(90, (100 * o.bw) / o.w));
      if (o.bh && o.h / o.bh <= 128) lines.push(rule(180, (100 * o.bh) / o.h));
      if (lines.length) style += `;background-image:${lines.join(",")}`;
      const block = h("div", {class: "ks-block", "data-block": o.name});
      const arr = h("div", {class: "ks-array", style, role: "img",
                            "aria-label": `${o.name} in ${this.words.off_chip}`}, block);
      const act = h("div", {class: "ks-act"});
      const bs = o.block_shape.map((b) => (b === null ? "·" : b)).join("×");
      const where = o.pipelined ? `block ${bs}` :
        `${this.words.spaces[o.space] || o.space}: the kernel copies it`;
      box.append(h("div", {class: "ks-op", "data-operand": o.name},
                       h("div", {class: "ks-name", text: `${o.name} `},
                         h("span", {class: "ks-meta", text: o.role})),
                       h("div", {class: "ks-meta",
                                 text: `${o.dtype}[${o.shape.join(", ")}] · ${where}`}),
                       arr, act));
      this.hbm[o.name] = {block, act, arr};
    }
    lane.append(box);
  }

  buildBuffers(lane) {
    const call = this.call, cost = this.cost, space = this.words.on_chip;
    this.slots = {};
    for (const o of this.ops) {
      if (!o.pipelined) continue;
      const nbuf = Math.max(cost.buffers[o.name] || 1, 1);
      const row = h("div", {class: "ks-slots"});
      const slots = [];
      for (let k = 0; k < nbuf; k++) {
        const state = h("span", {});
        const sw = h("span", {class: "ks-sw"});
        const access = h("div", {class: "ks-access"});
        const el = h("div", {class: "ks-slot", "data-slot": `${o.name}:${k}`},
                     h("b", {}, sw, `slot ${k}`), state, access);
        row.append(el);
        slots.push({el, state, sw, access});
      }
      lane.append(h("div", {class: "ks-vrow", "data-operand": o.name},
                    h("div", {class: "ks-vlabel"}, h("div", {class: "ks-name", text: o.name}),
                      h("div", {class: "ks-meta", text:
                        `${nbuf} × ${fmtBytes(o.buffer_bytes)} ` +
                        `(${this.words.spaces[o.space] || o.space})`})), row));
      this.slots[o.name] = slots;
    }
    for (const s of call.scratch) {
      const access = h("div", {class: "ks-access"});
      lane.append(h("div", {class: "ks-vrow", "data-scratch": s.name},
                    h("div", {class: "ks-vlabel"}, h("div", {class: "ks-name", text: s.name}),
                      h("div", {class: "ks-meta", text:
                        `scratch (${this.words.spaces[s.space] || s.space})`})),
                    h("div", {class: "ks-slots"},
                      h("div", {class: "ks-slot ks-scratch"},
                        h("b", {text: `${s.dtype}[${s.shape.join(", ")}]`}),
                        `${fmtBytes(s.bytes)}, lives for the whole call`, access))));
      this.scratchAccess[s.name] = access;
    }
    // capacity: on a TPU what Mosaic allocates (buffers, padded tiles, the body's values)
    // against the limit the compile enforces; else the call's on-chip footprint against the
    // chip's memory
    const scoped = Boolean(cost.vmem_limit);
    const used = scoped ? cost.mosaic_vmem : cost.onchip;
    const cap = scoped ? cost.vmem_limit : cost.chip_vmem;
    const pct = cap ? (100 * used) / cap : 0;
    const share = `${pct < 0.1 ? pct.toPrecision(1) : pct.toFixed(1)}%`;
    const bar = h("div", {class: "ks-capbar" + (used > cap ? " ks-over" : ""),
                          role: "meter", "aria-valuemin": 0, "aria-valuemax": cap,
                          "aria-valuenow": used, "aria-label": `${space} footprint`},
                  h("div", {style: `width:${Math.min(pct, 100)}%`}));
    lane.append(h("div", {class: "ks-cap"},
                  h("div", {class: "ks-meta", text: (scoped ?
                    `Mosaic allocates ${fmtBytes(used)} (${share}) of ${fmtBytes(cap)}, ` +
                    `${cost.vmem_limit_source}; ${fmtBytes(cost.chip_vmem)} ${space} in all` :
                    `footprint ${fmtBytes(used)} of ${fmtBytes(cap)} ${space} on ${this.chip} ` +
                    `(${share})`) + (used > cap ? " — does not fit" : "")}), bar));
  }

  buildScalars(lane) {
    this.smem = [];
    for (const p of this.call.prefetch) {
      const cells = h("div", {class: "ks-cells"});
      const shown = Math.min(p.values.length, SMEM_CELLS);
      const list = [];
      for (let i = 0; i < shown; i++) {
        const c = h("span", {class: "ks-cell", "data-entry": i, title: `${p.name}[${i}]`,
                             text: String(p.values[i])});
        cells.append(c);
        list.push(c);
      }
      const note = p.size > shown ? ` · first ${shown} of ${p.size} entries` : "";
      lane.append(h("div", {"data-operand": p.name},
                    h("span", {class: "ks-name", text: `${p.name} `}),
                    h("span", {class: "ks-meta",
                               text: `${p.dtype}[${p.shape.join(", ")}]${note}`}), cells));
      this.smem.push({p, list, hot: []});
    }
    const cost = this.cost;
    if (cost.chip_smem) {
      lane.append(h("div", {class: "ks-meta", text: `footprint ${fmtBytes(cost.smem)} of ` +
        `${fmtBytes(cost.chip_smem)} ${this.words.scalars} on ${this.chip}`}));
    }
  }

  // the remote copies this device's kernel starts; drawIci lists those in flight
  buildIci(lane) {
    const remote = this.call.body_dmas.filter((d) => d.remote);
    this.ici = {remote, title: this.m.lanes.find((l) => l.kind === "ici").title,
                now: h("div", {class: "ks-act"}), list: h("div", {class: "ks-slots"})};
    const who = this.call.device ? `device ${this.call.device.id}` : "this kernel";
    lane.append(h("div", {class: "ks-meta", text: `${remote.length} remote ` +
                  `cop${remote.length === 1 ? "y" : "ies"} started by ${who}`}),
                this.ici.now, this.ici.list);
  }

  // the copies in flight at grid step `step`: from the step that starts each to the one that
  // waits on it (to the end of the call when nothing waits); returns how many
  drawIci(step) {
    const live = this.ici.remote.filter((d) => d.start_step <= step &&
                                        (d.wait_step === null || step <= d.wait_step));
    this.ici.now.textContent = live.length ?
      `in flight at step ${step}: ${live.length} cop${live.length === 1 ? "y" : "ies"}` :
      `no remote copy in flight at step ${step}`;
    this.ici.list.replaceChildren(...live.slice(0, ICI_SHOWN).map((d) => h("div",
      {class: "ks-slot ks-active", "data-copy": this.ici.remote.indexOf(d)},
      h("b", {text: `device ${d.src_device} → device ${d.dst_device}`}),
      h("span", {style: "white-space:nowrap", text: fmtBytes(d.bytes)}),
      `, semaphore ${d.semaphore || "none"}`,
      h("div", {class: "ks-meta", text: `started at step ${d.start_step}, ` + (
        d.wait_step === null ? "never waited on" : `waited on at step ${d.wait_step}`)}))));
    if (live.length > ICI_SHOWN) {
      this.ici.list.append(h("div", {class: "ks-meta",
                                     text: `and ${live.length - ICI_SHOWN} more`}));
    }
    return live.length;
  }

  buildGrid() {
    const call = this.call, g = call.grid;
    const gh = g.length >= 2 ? g[g.length - 2] : 1, gw = g.length ? g[g.length - 1] : 1;
    const sec = h("section", {"data-lane": "grid"}, h("h4", {class: "ks-name", text: "grid"}));
    const axes = g.map((e, a) => `axis ${a}: ${e} (${call.semantics[a] || "-"})`).join(" · ");
    sec.append(h("div", {class: "ks-meta", text: `${axes || "no grid"}; row-major order, ` +
                                              "last axis fastest"}));
    this.gridLead = h("div", {class: "ks-meta"});
    this.cells = null;
    if (gh * gw <= 4096) {
      const cs = Math.max(4, Math.min(22, Math.floor(240 / Math.max(gw, 1))));
      const grid = h("div", {class: "ks-grid", role: "img", "aria-label": "grid points",
                             style: `grid-template-columns:repeat(${gw},var(--ks-cs));` +
                                    `--ks-cs:${cs}px`});
      this.cells = [];
      for (let i = 0; i < gh * gw; i++) {
        const c = h("i", {class: "ks-gc"});
        grid.append(c);
        this.cells.push(c);
      }
      sec.append(grid);
    }
    this.gridPoint = h("div", {class: "ks-act"});
    sec.append(this.gridPoint, this.gridLead);
    this.gw = gw;
    this.gh = gh;
    return sec;
  }

  buildTraffic() {
    const m = this.m, cost = this.cost, n = this.n, cum = m.cumulative;
    const total = Math.max(m.total_bytes, 1);
    const sec = h("section", {"data-lane": "traffic"},
                  h("h4", {class: "ks-name", text: `cumulative ${this.words.off_chip} traffic`}));
    const pts = [];
    const stride = Math.max(1, Math.floor(n / 1200));
    for (let i = 0; i < n; i += stride) pts.push(`${i},${total - cum[i]}`);
    pts.push(`${n - 1},${total - cum[n - 1]}`);
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 0 ${Math.max(n - 1, 1)} ${total}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#0072b2");
    line.setAttribute("stroke-width", "2");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
    this.cursor = h("div", {class: "ks-cursor"});
    sec.append(h("div", {class: "ks-chart"}, svg, this.cursor),
               h("div", {class: "ks-axis"}, h("span", {text: "step 0"}),
                 h("span", {text: `${fmtBytes(total)} total`}),
                 h("span", {text: `step ${lastStep(this.call)}`})));
    this.bytesNow = h("div", {class: "ks-act"});
    sec.append(this.bytesNow);
    sec.append(h("div", {class: "ks-meta ks-roofline", text:
      `${this.chip}: estimate ${fmtSeconds(cost.estimate_s)} = max(compute ` +
      `${fmtSeconds(cost.compute_s)}, memory ${fmtSeconds(cost.memory_s)}) + overhead ` +
      `${fmtSeconds(cost.overhead_s)} — ${cost.bound}-bound`}));
    return sec;
  }

  buildLegend() {
    const leg = h("div", {class: "ks-legend", "aria-label": "legend"});
    const swatch = (bg) => h("span", {class: "ks-sw", style: `background:${bg}`});
    const entry = (bg, text) => leg.append(h("span", {}, swatch(bg), text));
    for (const a of ACTIONS) entry(actionBg(this.P, a), this.words.labels[a]);
    if (this.smem) entry(this.P.smem_read, this.words.scalar_read);
    if (this.call.accesses) {
      entry(this.P.actions.fetch, "element read by the kernel");
      entry(this.P.actions.writeback, "element written");
    }
    this.root.append(leg);
  }

  // ---- a Mosaic GPU kernel: its memories as lanes, each warpgroup's events --------------

  // prev/play/next, speed and slider over this.n steps; `unit` names a step in labels
  // ("step" of the grid, "event" of a warpgroup), `sliderLabel` the slider
  playback(unit, sliderLabel) {
    const prev = h("button", {type: "button", class: "ks-prev", "aria-label": `previous ${unit}`,
                              text: "◀ prev"});
    const play = h("button", {type: "button", class: "ks-play", text: "▶ play"});
    const next = h("button", {type: "button", class: "ks-next", "aria-label": `next ${unit}`,
                              text: "next ▶"});
    const speed = h("select", {class: "ks-speed", "aria-label": "playback speed"});
    for (const s of SPEEDS) {
      speed.append(h("option", {value: s, text: s ? `${s} ${unit}s/s` : "max"}));
    }
    speed.value = String(this.speed ?? 5);
    const slider = h("input", {class: "ks-slider", type: "range", min: 0, max: this.n - 1,
                               step: 1, value: 0, "aria-label": sliderLabel});
    this.stepno = h("span", {class: "ks-stepno"});
    prev.onclick = () => this.go(this.cur - 1);
    next.onclick = () => this.go(this.cur + 1);
    play.onclick = () => (this.playing ? this.stop() : this.play());
    speed.onchange = () => {
      this.speed = +speed.value;
      if (this.playing) { this.stop(); this.play(); }
    };
    slider.oninput = () => this.go(+slider.value);
    this.playBtn = play;
    this.slider = slider;
    return {prev, play, next, speed, slider};
  }

  buildGpu(D) {
    const K = D.kernel;
    this.root.replaceChildren();
    this.gpu = D;
    this.m = null;
    this.P = D.palette;
    this.n = Math.max(K.shown, 1);
    this.touched = {};  // buffer name -> its box, outlined while an event touches it
    const grid = K.grid.map((g, a) => `${K.grid_names[a] || `axis ${a}`} ${g}`).join(", ");
    this.root.append(h("div", {class: "ks-title", text:
      `Mosaic GPU: ${K.name} · grid (${grid}) = ${K.ctas.toLocaleString("en-US")} CTAs ` +
      `× ${K.warpgroups} warpgroup${K.warpgroups > 1 ? "s" : ""} · ` +
      `events of CTA ${tuple(K.cta)}`}));
    const {prev, play, next, speed, slider} = this.playback("event", "event");
    this.root.append(h("div", {class: "ks-row ks-options"}, h("label", {}, "speed ", speed),
                       h("span", {class: "ks-meta", text: `model ${D.model} · chip ${D.chip}`})));
    this.status = h("p", {class: "ks-status", role: "status", "aria-live": "polite"});
    this.root.append(h("div", {class: "ks-controls"},
                       h("div", {class: "ks-row"}, prev, play, next, slider, this.stepno),
                       this.status));
    const body = h("div", {class: "ks-body"});
    for (const lane of D.lanes) {
      const section = h("section", {class: `ks-lane ks-${lane.kind}`, "data-lane": lane.id,
                                    "data-kind": lane.kind},
                        h("h4", {}, `${lane.title} `, h("span", {text: lane.note})));
      GPU_LANES[lane.kind].call(this, section);
      body.append(section);
    }
    body.append(this.buildGpuCost());
    this.root.append(body);
    const leg = h("div", {class: "ks-legend", "aria-label": "legend"});
    const seen = new Set();
    for (const w of D.events) for (const e of w) seen.add(e.kind);
    for (const [kind, k] of Object.entries(D.kinds)) {
      if (seen.has(kind)) {
        leg.append(h("span", {}, h("span", {class: "ks-sw", style: `background:${k.color}`}),
                     k.label));
      }
    }
    this.root.append(leg);
    this.cur = -1;
    this.draw(Math.min(Math.max(this.model.get("step") || 0, 0), this.n - 1), true);
  }

  // a buffer's box; a size in ``meta`` ({bytes: n}) never breaks between number and unit
  gpuBox(name, title, meta, attrs) {
    const parts = meta.map((m) => (typeof m === "string" ? m :
      h("span", {style: "white-space:nowrap", text: fmtBytes(m.bytes)})));
    const el = h("div", {class: "ks-slot", ...attrs}, h("b", {text: title}), ...parts);
    this.touched[name] = el;
    return el;
  }

  buildGpuGlobal(lane) {
    const row = h("div", {class: "ks-slots"});
    for (const g of this.gpu.gmem) {
      row.append(this.gpuBox(g.name, g.name, ["this CTA reads ", {bytes: g.read}, ", writes ",
                                              {bytes: g.written}], {"data-buffer": g.name}));
    }
    const K = this.gpu.kernel;
    lane.append(row, h("div", {class: "ks-meta", text:
      `whole launch: ${fmtBytes(K.gmem_read)} of global-memory reads that miss L2, ` +
      `${fmtBytes(K.gmem_write)} written`}));
  }

  buildGpuAllocations(lane, spaces) {
    const row = h("div", {class: "ks-slots"});
    for (const a of this.gpu.allocations) {
      if (!spaces.includes(a.space)) continue;
      const what = a.space === "barrier" ? `${a.shape.join("×")} barrier(s)` :
        `${a.dtype}[${a.shape.join(", ")}]`;
      row.append(this.gpuBox(a.name, a.name, [`${what}, `, {bytes: a.bytes}],
                             {"data-buffer": a.name}));
    }
    lane.append(row);
  }

  buildGpuShared(lane) {
    this.buildGpuAllocations(lane, ["smem", "barrier"]);
    const K = this.gpu.kernel, used = K.smem_bytes, cap = K.chip_smem;
    const pct = cap ? (100 * used) / cap : 0;
    lane.append(h("div", {class: "ks-cap"},
      h("div", {class: "ks-meta", text: `footprint ${fmtBytes(used)} per CTA of ` +
        `${fmtBytes(cap)} on ${this.gpu.chip} (${pct.toFixed(1)}%), as the lowering ` +
        `allocates it, ${K.barriers} barrier${K.barriers === 1 ? "" : "s"} included` +
        (used > cap ? " — does not fit" : "")}),
      h("div", {class: "ks-capbar" + (used > cap ? " ks-over" : ""), role: "meter",
                "aria-valuemin": 0, "aria-valuemax": cap, "aria-valuenow": used,
                "aria-label": "shared memory footprint"},
        h("div", {style: `width:${Math.min(pct, 100)}%`}))));
  }

  buildGpuRegisters(lane) {
    this.buildGpuAllocations(lane, ["regs"]);
  }

  buildGpuEvents(lane) {
    const K = this.gpu.kernel;
    this.rows = this.gpu.events.map((evs, w) => {
      // few enough events to tell apart: a white line between neighbours
      const strip = h("div", {class: "ks-strip" + (evs.length <= 200 ? " ks-sep" : ""), role: "img",
                              "aria-label": `warpgroup ${w}: ${evs.length} events`});
      for (const e of evs) strip.append(h("i", {style: `background:${this.P.events[e.kind]}`}));
      // one scale for every warpgroup: event i sits at the same x in each row
      if (evs.length < this.n) strip.append(h("b", {style: `flex:${this.n - evs.length} 1 0`}));
      const cursor = h("div", {class: "ks-cursor"});
      strip.append(cursor);
      const act = h("div", {class: "ks-act"});
      const more = K.event_counts[w] > evs.length ?
        ` (first ${evs.length.toLocaleString("en-US")} shown)` : "";
      lane.append(h("div", {"data-warpgroup": w},
                    h("div", {class: "ks-name", text: `warpgroup ${w} `},
                      h("span", {class: "ks-meta", text:
                        `${K.event_counts[w].toLocaleString("en-US")} events${more}`})),
                    strip, act));
      return {strip, cursor, act, evs};
    });
    if (K.events_dropped) {
      lane.append(h("div", {class: "ks-meta", text: `and ${K.events_dropped.toLocaleString(
        "en-US")} later events, counted in the totals but not listed by kernelsim`}));
    }
  }

  buildGpuCost() {
    const K = this.gpu.kernel;
    const sec = h("section", {class: "ks-lane", "data-lane": "cost"},
                  h("h4", {class: "ks-name", text: "roofline"}));
    sec.append(h("div", {class: "ks-meta ks-roofline", text:
      `${this.gpu.chip}: estimate ${fmtSeconds(K.estimate_s)} = max(compute ` +
      `${fmtSeconds(K.compute_s)}, global memory ${fmtSeconds(K.memory_s)}) — ` +
      `${K.bound}-bound; ${K.flops.toLocaleString("en-US")} FLOP`}));
    for (const w of K.warnings) sec.append(h("div", {class: "ks-warn", text: `⚠ ${w}`}));
    return sec;
  }

  drawGpu(i, force) {
    if (i === this.cur && !force) return;
    this.cur = i;
    this.slider.value = i;
    this.root.dataset.step = i;
    this.stepno.textContent = `event ${i.toLocaleString("en-US")} of 0–` +
      `${(this.n - 1).toLocaleString("en-US")}`;
    for (const el of Object.values(this.touched)) el.classList.remove("ks-active");
    const said = [];
    this.rows.forEach((r, w) => {
      const e = r.evs[i];
      r.cursor.style.display = e ? "" : "none";
      if (e) r.cursor.style.left = `${(100 * (i + 0.5)) / this.n}%`;
      if (!e) {
        r.act.textContent = "done";
        r.act.style.color = "#52606d";
        return;
      }
      r.act.textContent = e.text;
      r.act.style.color = "";
      for (const name of e.touch) this.touched[name]?.classList.add("ks-active");
      said.push(`warpgroup ${w}: ${e.text}`);
    });
    this.status.textContent = `event ${i}: ${said.join("; ") || "every warpgroup is done"}.`;
  }

  // ---- per step -------------------------------------------------------------------------

  go(i) {
    const s = Math.max(0, Math.min(this.n - 1, i));
    if (s === this.cur) return;
    this.draw(s);
    this.set("step", s);
  }

  draw(i, force) {
    if (this.gpu) { this.drawGpu(i, force); return; }
    if (!this.m || (i === this.cur && !force)) return;
    const call = this.call, m = this.m, P = this.P;
    const from = this.cur;
    this.cur = i;
    const step = call.steps[i];
    const g = call.grid.length;
    const point = call.grid_index.subarray(i * g, i * g + g);
    this.slider.value = i;
    this.root.dataset.step = step;
    this.stepno.textContent = `step ${step.toLocaleString("en-US")} of 0–` +
      `${(call.total_steps - 1).toLocaleString("en-US")}`;
    const words = [];
    const moves = [];
    for (const o of this.ops) {
      const k = o.block_at[i];
      const blk = tuple(o.blocks[k]);
      const ui = this.hbm[o.name];
      const r = o.rects[k];
      const bs = ui.block.style;
      bs.left = `${(100 * r[0]) / o.w}%`;
      bs.top = `${(100 * r[1]) / o.h}%`;
      bs.width = `${(100 * r[2]) / o.w}%`;
      bs.height = `${(100 * r[3]) / o.h}%`;
      if (!o.pipelined) {
        ui.act.textContent = `block ${blk}: copied by the kernel`;
        continue;
      }
      const s = m.operands[o.name];
      const a = ACTIONS[s.actions[i]];
      bs.background = actionBg(P, a);
      const bytes = o.block_bytes[k];
      const slot = s.slot[i];
      const moved = a === "fetch" || a === "writeback";
      ui.act.textContent = `${a} block ${blk}` + (moved ? ` · ${fmtBytes(bytes)}` : "");
      ui.act.style.color = a === "skip" ? "#52606d" : P.actions[a];
      const fill = {op: o.name, blk, slot, bytes: fmtBytes(bytes)};
      words.push(this.words.status[a].replace(/\{(\w+)\}/g, (_, k) => fill[k]));
      this.drawSlots(o, s, i, a, blk);
      if (moved) moves.push({o, a, slot});
    }
    for (const [name, el] of Object.entries(this.scratchAccess)) this.drawAccess(el, name, i);
    const read = this.smem ? this.drawSmem(i) : [];
    const flying = this.ici ? this.drawIci(step) : 0;
    this.drawGrid(point);
    const cum = m.cumulative[i];
    this.cursor.style.left = `${(100 * i) / Math.max(this.n - 1, 1)}%`;
    this.bytesNow.textContent = `${fmtBytes(cum)} of ${fmtBytes(m.total_bytes)} moved by ` +
      `step ${step} (${cum.toLocaleString("en-US")} B)`;
    this.status.textContent = `step ${step}, grid ${tuple(point)}: ` +
      (words.join("; ") || "no pipelined operand shown") +
      (read.length ? `; ${this.words.scalars} read ${read.join(", ")}` : "") +
      (flying ? `; ${flying} remote cop${flying === 1 ? "y" : "ies"} in flight over ` +
                `${this.ici.title}` : "") +
      ".";
    // packets fly for single steps at a pace the eye can follow, never piling up
    const now = performance.now(), calm = now - (this.drawnAt || 0) >= ANIMATE_BELOW_MS;
    this.drawnAt = now;
    for (const p of this.packets || []) p.remove();
    this.packets = [];
    if (from >= 0 && Math.abs(i - from) === 1 && calm && this.interval() >= ANIMATE_BELOW_MS) {
      this.fly(moves);
    }
  }

  drawSlots(o, s, i, a, blk) {
    const slots = this.slots[o.name];
    const used = s.slot[i], n = slots.length, isIn = o.role === "input";
    const other = n > 1 && s.filling[i] ? (isIn ? (used + 1) % n : (used + n - 1) % n) : -1;
    slots.forEach((sl, k) => {
      sl.el.classList.toggle("ks-active", k === used);
      if (k === used) {
        sl.el.style.borderLeftColor = this.P.actions[a];
        sl.sw.style.background = actionBg(this.P, a);
        sl.state.textContent = `${isIn ? "kernel reads" : "kernel writes"} ${blk}`;
        this.drawAccess(sl.access, o.name, i);
      } else if (k === other) {
        const fa = isIn ? "fetch" : "writeback";
        sl.el.style.borderLeftColor = this.P.actions[fa];
        sl.sw.style.background = actionBg(this.P, fa);
        sl.state.textContent = isIn ? "filling: next block" : "draining: previous block";
        sl.access.replaceChildren();
      } else {
        sl.el.style.borderLeftColor = "#cbd2d9";
        sl.sw.style.background = "#eef1f4";
        sl.state.textContent = "idle";
        sl.access.replaceChildren();
      }
    });
  }

  drawAccess(el, name, i) {
    const acc = this.call.accesses && this.call.accesses[name];
    if (!acc) return;
    const pic = acc.pictures[acc.at[i]];
    el.style.gridTemplateColumns = `repeat(${acc.cols},7px)`;
    el.setAttribute("title", "elements the kernel read (blue), wrote (vermillion) this step");
    const cls = ["", "r", "w", "rw"];
    if (el.children.length !== pic.length) {
      el.replaceChildren(...Array.from(pic, () => h("i", {})));
    }
    for (let k = 0; k < pic.length; k++) el.children[k].className = cls[+pic[k]];
  }

  drawSmem(i) {
    const names = [];
    for (const s of this.smem) {
      for (const c of s.hot) c.classList.remove("ks-read");
      s.hot = [];
      const p = s.p;
      for (let r = p.read_offsets[i]; r < p.read_offsets[i + 1]; r++) {
        const e = p.reads[r];
        names.push(`${p.name}[${e}]`);
        if (e < s.list.length) {
          s.list[e].classList.add("ks-read");
          s.hot.push(s.list[e]);
        }
      }
    }
    return names;
  }

  drawGrid(point) {
    const g = point.length;
    const row = g >= 2 ? point[g - 2] : 0, col = g ? point[g - 1] : 0;
    const lead = Array.from(point.subarray(0, Math.max(g - 2, 0)));
    this.gridPoint.textContent = `point ${tuple(point)}`;
    this.gridLead.textContent = lead.length ? `shown: axes ${g - 2}, ${g - 1} at ` +
      lead.map((v, a) => `axis ${a} = ${v}`).join(", ") : "";
    if (!this.cells) return;
    const now = row * this.gw + col;
    for (let k = 0; k < this.cells.length; k++) {
      this.cells[k].className = k === now ? "ks-gc ks-now" : k < now ? "ks-gc ks-done" : "ks-gc";
    }
  }

  // An animated copy: a block-sized packet from HBM to its VMEM slot (fetch) or back.
  fly(moves) {
    if (!this.root.animate || matchMedia("(prefers-reduced-motion: reduce)").matches) return;
    const base = this.root.getBoundingClientRect();
    const dur = Math.min(450, this.interval() * 0.8);
    for (const {o, a, slot} of moves) {
      const b = this.hbm[o.name].block.getBoundingClientRect();
      const sl = this.slots[o.name][slot].el.getBoundingClientRect();
      const [src, dst] = a === "fetch" ? [b, sl] : [sl, b];
      const size = 22;
      const p = h("div", {class: "ks-packet", style: `background:${actionBg(this.P, a)}` +
        `;width:${size}px;height:${size}px;left:0;top:0`});
      this.root.append(p);
      this.packets.push(p);
      const at = (r) => `translate(${r.left - base.left + r.width / 2 - size / 2}px,` +
                        `${r.top - base.top + r.height / 2 - size / 2}px)`;
      const done = () => p.remove();
      p.animate([{transform: at(src)}, {transform: at(dst)}],
                {duration: dur, easing: "ease-in-out"}).finished.then(done, done);
    }
  }

  // ---- playback and keys ----------------------------------------------------------------

  interval() {
    if (!this.playing) return 1000;
    const s = this.speed ?? 5;
    return s ? 1000 / s : 16;
  }

  play() {
    if (!this.m && !this.gpu) return;
    if (this.cur >= this.n - 1) this.go(0);
    this.playing = true;
    this.playBtn.textContent = "❚❚ pause";
    this.playBtn.setAttribute("aria-pressed", "true");
    this.status.setAttribute("aria-live", "off");
    let last = performance.now(), owed = 0;
    const tick = (now) => {
      if (!this.playing) return;
      const s = this.speed ?? 5;
      owed += s ? ((now - last) * s) / 1000 : 1;
      last = now;
      const k = Math.floor(owed);
      if (k >= 1) {
        owed -= k;
        if (this.cur + k >= this.n - 1) { this.go(this.n - 1); this.stop(); return; }
        this.go(this.cur + k);
      }
      this.raf = requestAnimationFrame(tick);
    };
    this.raf = requestAnimationFrame(tick);
  }

  stop() {
    this.playing = false;
    if (this.raf) cancelAnimationFrame(this.raf);
    if (this.playBtn) {
      this.playBtn.textContent = "▶ play";
      this.playBtn.setAttribute("aria-pressed", "false");
    }
    if (this.status) this.status.setAttribute("aria-live", "polite");
  }

  key(e) {
    const tag = e.target.tagName;
    if (tag === "SELECT" || (tag === "INPUT" && e.target.type !== "range")) return;
    const act = {ArrowRight: () => this.go(this.cur + 1), ArrowLeft: () => this.go(this.cur - 1),
                 Home: () => this.go(0), End: () => this.go(this.n - 1),
                 " ": () => (this.playing ? this.stop() : this.play())}[e.key];
    if (act) { e.preventDefault(); e.stopPropagation(); act(); }
  }
}

const GPU_LANES = {gmem: Viewer.prototype.buildGpuGlobal,
                   smem: Viewer.prototype.buildGpuShared,
                   regs: Viewer.prototype.buildGpuRegisters,
                   events: Viewer.prototype.buildGpuEvents};

const LANES = {arrays: Viewer.prototype.buildArrays, buffers: Viewer.prototype.buildBuffers,
               scalars: Viewer.prototype.buildScalars, ici: Viewer.prototype.buildIci};

function lastStep(call) {
  return (call.total_steps - 1).toLocaleString("en-US");
}

// A model with anywidget's interface for a page without a kernel: the data holds both
// models' schedules and every chip's costs, so every control works offline.
function localModel(data) {
  const state = {data, step: 0, call: data.call, model: data.model, chip: data.chip, hidden: []};
  const listeners = {};
  const changed = new Set();
  return {
    get: (k) => state[k],
    set: (k, v) => { if (state[k] !== v) { state[k] = v; changed.add(k); } },
    save_changes: () => {
      const keys = [...changed];
      changed.clear();
      const rebuild = keys.some((k) => k !== "step");
      const fire = (ev) => (listeners[ev] || []).forEach((f) => f());
      for (const k of keys) if (k === "step" || !rebuild) fire(`change:${k}`);
      if (rebuild) fire("change:data");
    },
    on: (ev, f) => { (listeners[ev] = listeners[ev] || []).push(f); },
    off: () => {},
  };
}

export function standalone(el, data) {
  const v = new Viewer(localModel(data), el);
  el.ksViewer = v;
  return v;
}

function render({model, el}) {
  model.isLive = true;
  const v = new Viewer(model, el);
  el.ksViewer = v;
  return () => v.stop();
}

export default {render};
