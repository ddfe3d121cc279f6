/* cat-edge dashboard: polls the aggregator's JSON API and draws it. Vanilla JS, no build step.
 *
 * Data flow: every POLL_MS (only while the tab is visible) GET /status and /agents, then
 * GET /history?since=<last version seen> for the new rounds only (paged by HISTORY_PAGE).
 * Per-round costs from /history are summed here into cumulative costs, actual and dense.
 * The summary shows the uplink (KPIs and the first row), the downlink and their total from
 * /status, each against its dense float32 baseline when the aggregator knows it, then what
 * the agents actually sent (re-sends included) and that plus what they received.
 * Fetch errors show the "disconnected" banner and retry with a capped exponential backoff.
 *
 * Everything that comes from the network is written with textContent, never innerHTML:
 * agent ids and profile names are chosen by devices.
 */
"use strict";

(() => {
  const POLL_MS = 2000;
  const MAX_BACKOFF_MS = 16000;
  const FETCH_TIMEOUT_MS = 8000;
  const HISTORY_PAGE = 1000;
  const MARKERS_UP_TO = 80; // draw point markers when a series has at most this many points
  /** Okabe–Ito colours (colour-blind safe), yellow left out for contrast on white. */
  const AGENT_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#882255", "#8C6D31"];

  // ------------------------------------------------------------------ formatting

  const PREFIXES = [
    [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""], [1e-3, "m"], [1e-6, "µ"], [1e-9, "n"],
  ];

  const isNum = (v) => typeof v === "number" && Number.isFinite(v);

  /** 1234.5, "B" -> "1.23 kB" (decimal SI prefixes, 3 significant digits). */
  function si(value, unit, digits = 3) {
    if (!isNum(value)) return "–";
    if (value === 0) return `0 ${unit}`;
    const abs = Math.abs(value);
    for (const [scale, prefix] of PREFIXES) {
      if (abs >= scale * 0.9995 || scale === 1e-9) {
        const scaled = value / scale;
        return `${trimNumber(scaled.toPrecision(digits))} ${prefix}${unit}`;
      }
    }
    return `${value} ${unit}`;
  }

  function trimNumber(text) {
    // toPrecision may give "1.00e+3" for 999.95 rounded up; fall back to a plain number.
    if (text.includes("e")) return String(Number(text));
    return text;
  }

  function fmtCount(v) {
    if (!isNum(v)) return "–";
    if (Math.abs(v) < 1e5) return Math.round(v).toLocaleString("en-US");
    return si(v, "");
  }

  function fmtSeconds(v) {
    if (!isNum(v)) return "–";
    if (Math.abs(v) < 120) return si(v, "s");
    if (Math.abs(v) < 7200) return `${(v / 60).toPrecision(3)} min`;
    return `${(v / 3600).toPrecision(3)} h`;
  }

  function fmtLoss(v) {
    if (!isNum(v)) return "–";
    if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e4)) return v.toExponential(3);
    return v.toPrecision(4);
  }

  /** Axis labels: "3.00 s" -> "3 s", "0.6600" -> "0.66" (trailing zeros add nothing there). */
  function tickLabel(label) {
    return label.replace(/^(-?\d+)\.0+(?=\D|$)/, "$1").replace(/^(-?\d+\.\d*?[1-9])0+(?=\D|$)/, "$1");
  }

  /** A linear tick value with just enough decimals for its step. */
  function tickNumber(v, step, fmt) {
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return tickLabel(fmt(v));
    return v.toFixed(Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
  }

  const fmtPercent = (v) => (isNum(v) ? `${(100 * v).toFixed(1)} %` : "–");

  function relTime(seconds) {
    if (!isNum(seconds)) return "–";
    const s = Math.max(0, seconds);
    if (s < 5) return "just now";
    if (s < 90) return `${Math.round(s)} s ago`;
    if (s < 5400) return `${Math.round(s / 60)} min ago`;
    if (s < 172800) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} d ago`;
  }

  /** The cost metrics: key in CostTotals, label, and formatter (units in the key names). */
  const METRICS = {
    bits: { label: "bits", axis: "cumulative bits", fmt: (v) => si(v, "bit") },
    packets: { label: "packets", axis: "cumulative packets", fmt: fmtCount },
    airtime_s: { label: "airtime", axis: "cumulative airtime", fmt: fmtSeconds },
    energy_j: { label: "energy", axis: "cumulative radio energy", fmt: (v) => si(v, "J") },
    bytes: { label: "update bytes", axis: "cumulative update bytes", fmt: (v) => si(v, "B") },
  };

  function savingText(actual, dense) {
    if (!isNum(actual) || !isNum(dense) || actual <= 0 || dense <= 0) return "";
    const f = dense / actual;
    if (f >= 1) return `${f >= 100 ? f.toFixed(0) : f.toPrecision(3)}× less than dense`;
    return `${(1 / f).toPrecision(3)}× more than dense`;
  }

  // ------------------------------------------------------------------ plotting

  function cssVar(name, fallback) {
    const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  /** A "nice" step (1, 2 or 5 times a power of ten) giving about `count` intervals. */
  function niceStep(range, count) {
    const raw = range / Math.max(1, count);
    const p = 10 ** Math.floor(Math.log10(raw));
    const m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }

  function linearTicks(lo, hi, step) {
    const ticks = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
      ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return ticks;
  }

  function logTicks(lo, hi) {
    const a = Math.floor(Math.log10(lo));
    const b = Math.ceil(Math.log10(hi));
    const decades = Math.log10(hi / lo);
    const mults = decades <= 2 ? [1, 2, 5] : decades <= 4 ? [1, 3] : [1];
    const ticks = [];
    for (let e = a; e <= b; e++) {
      for (const m of mults) {
        const v = m * 10 ** e;
        if (v >= lo * 0.999 && v <= hi * 1.001) ticks.push(v);
      }
    }
    return ticks;
  }

  /**
   * A small line chart on a canvas: linear or log x, left y axis, optional right y axis
   * (0..1, formatted as percent), dashed series, point markers, hover tooltip.
   *
   * series: [{name, color, dash?, width?, axis?: "y"|"y2", points: [{x, y, key}]}]
   * opts: {xLog, xLabel, xFmt, yLabel, yFmt, yZero, y2Label, tooltip(key) -> [[label, text]]}
   */
  class LineChart {
    constructor(canvas, tip, opts) {
      this.canvas = canvas;
      this.tip = tip;
      this.opts = opts;
      this.series = [];
      this.hoverKey = null;
      this.layout = null;
      canvas.addEventListener("mousemove", (ev) => this.onHover(ev));
      canvas.addEventListener("mouseleave", () => this.setHover(null));
      new ResizeObserver(() => this.draw()).observe(canvas);
    }

    setData(series, opts) {
      this.series = series;
      Object.assign(this.opts, opts || {});
      this.draw();
      this.showTip(); // the hovered point may have moved (new rounds, another metric)
    }

    pointCount() {
      return this.series.reduce((n, s) => n + s.points.length, 0);
    }

    draw() {
      const { canvas, opts } = this;
      const dpr = window.devicePixelRatio || 1;
      const w = canvas.clientWidth;
      const h = canvas.clientHeight;
      if (w === 0 || h === 0) return;
      if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
        canvas.width = Math.round(w * dpr);
        canvas.height = Math.round(h * dpr);
      }
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, h);
      canvas.dataset.points = String(this.pointCount());

      const usable = (p) => isNum(p.y) && isNum(p.x) && (!opts.xLog || p.x > 0);
      const main = this.series.filter((s) => (s.axis || "y") === "y");
      const right = this.series.filter((s) => s.axis === "y2");
      const xs = [];
      const ys = [];
      for (const s of this.series) {
        for (const p of s.points) {
          if (!usable(p)) continue;
          xs.push(p.x);
          if ((s.axis || "y") === "y") ys.push(p.y);
        }
      }
      if (xs.length === 0) {
        this.layout = null;
        return;
      }

      const font = getComputedStyle(document.body).fontFamily;
      const colAxis = cssVar("--axis", "#5b6675");
      const colGrid = cssVar("--grid", "#e6eaf0");
      const hasRight = right.some((s) => s.points.some(usable));
      const m = { l: 62, r: hasRight ? 52 : 14, t: 10, b: 42 };
      const pw = w - m.l - m.r;
      const ph = h - m.t - m.b;
      if (pw < 40 || ph < 40) return;

      // x domain
      let x0 = Math.min(...xs);
      let x1 = Math.max(...xs);
      if (opts.xLog) {
        if (x0 === x1) { x0 /= 2; x1 *= 2; }
        const pad = (Math.log10(x1) - Math.log10(x0)) * 0.04;
        x0 = 10 ** (Math.log10(x0) - pad);
        x1 = 10 ** (Math.log10(x1) + pad);
      } else if (x0 === x1) {
        x0 -= 1; x1 += 1;
      }
      // y domain
      let y0 = ys.length ? Math.min(...ys) : 0;
      let y1 = ys.length ? Math.max(...ys) : 1;
      if (opts.yZero) y0 = Math.min(0, y0);
      if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
      const ypad = (y1 - y0) * 0.06;
      if (!(opts.yZero && y0 === 0)) y0 -= ypad;
      y1 += ypad;

      const lx0 = Math.log10(x0);
      const lx1 = Math.log10(x1);
      const sx = opts.xLog
        ? (v) => m.l + ((Math.log10(v) - lx0) / (lx1 - lx0)) * pw
        : (v) => m.l + ((v - x0) / (x1 - x0)) * pw;
      const sy = (v) => m.t + (1 - (v - y0) / (y1 - y0)) * ph;
      const sy2 = (v) => m.t + (1 - v) * ph;
      this.layout = { m, pw, ph, sx, sy, sy2, w, h };

      // grid + ticks
      ctx.font = `11px ${font}`;
      ctx.lineWidth = 1;
      ctx.strokeStyle = colGrid;
      ctx.fillStyle = colAxis;
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      const yCount = Math.max(2, Math.round(ph / 50));
      const yStep = opts.yInteger ? Math.max(1, niceStep(y1 - y0, yCount)) : niceStep(y1 - y0, yCount);
      for (const v of linearTicks(y0, y1, yStep)) {
        const py = Math.round(sy(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(m.l, py); ctx.lineTo(m.l + pw, py); ctx.stroke();
        ctx.fillText(tickNumber(v, yStep, opts.yFmt), m.l - 6, py);
      }
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      const xStep = niceStep(x1 - x0, Math.max(2, Math.round(pw / 90)));
      const xTicks = opts.xLog ? logTicks(x0, x1) : linearTicks(x0, x1, opts.xInteger ? Math.max(1, xStep) : xStep);
      let lastRight = -Infinity;
      for (const v of xTicks) {
        const px = Math.round(sx(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(px, m.t); ctx.lineTo(px, m.t + ph); ctx.stroke();
        const label = tickLabel(opts.xFmt(v));
        const half = ctx.measureText(label).width / 2;
        if (px - half > lastRight + 6 && px + half <= w) {
          ctx.fillText(label, px, m.t + ph + 6);
          lastRight = px + half;
        }
      }
      if (hasRight) {
        ctx.textAlign = "left";
        ctx.textBaseline = "middle";
        for (const v of [0, 0.25, 0.5, 0.75, 1]) ctx.fillText(`${v * 100}%`, m.l + pw + 6, sy2(v));
      }
      // frame
      ctx.strokeStyle = colAxis;
      ctx.beginPath();
      ctx.moveTo(m.l + 0.5, m.t); ctx.lineTo(m.l + 0.5, m.t + ph + 0.5); ctx.lineTo(m.l + pw, m.t + ph + 0.5);
      ctx.stroke();
      // axis titles
      ctx.fillStyle = colAxis;
      ctx.font = `12px ${font}`;
      ctx.textAlign = "center";
      ctx.textBaseline = "bottom";
      ctx.fillText(opts.xLabel, m.l + pw / 2, h - 2);
      ctx.save();
      ctx.translate(12, m.t + ph / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.textBaseline = "middle";
      ctx.fillText(opts.yLabel, 0, 0);
      ctx.restore();
      if (hasRight && opts.y2Label) {
        ctx.save();
        ctx.translate(w - 8, m.t + ph / 2);
        ctx.rotate(Math.PI / 2);
        ctx.textBaseline = "middle";
        ctx.fillText(opts.y2Label, 0, 0);
        ctx.restore();
      }

      // hover guide
      const hover = this.hoverKey === null ? null : this.findKey(this.hoverKey);
      if (hover) {
        ctx.strokeStyle = colAxis;
        ctx.setLineDash([3, 3]);
        ctx.beginPath(); ctx.moveTo(Math.round(hover.px) + 0.5, m.t); ctx.lineTo(Math.round(hover.px) + 0.5, m.t + ph); ctx.stroke();
        ctx.setLineDash([]);
      }

      // series, clipped to the plot area; the main series last so it is drawn on top
      ctx.save();
      ctx.beginPath();
      ctx.rect(m.l, m.t - 4, pw + 4, ph + 8);
      ctx.clip();
      const ordered = [...right, ...main].reverse().sort((a, b) => (a.z || 0) - (b.z || 0));
      for (const s of ordered) {
        const yOf = s.axis === "y2" ? sy2 : sy;
        ctx.strokeStyle = s.color;
        ctx.fillStyle = s.color;
        ctx.lineWidth = s.width || 2;
        ctx.lineJoin = "round";
        ctx.lineCap = "round";
        ctx.setLineDash(s.dash || []);
        ctx.beginPath();
        let pen = false;
        for (const p of s.points) {
          if (!usable(p)) { pen = false; continue; }
          const px = sx(p.x);
          const py = yOf(p.y);
          if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
          pen = true;
        }
        ctx.stroke();
        ctx.setLineDash([]);
        if (s.markers !== false && s.points.length <= MARKERS_UP_TO) {
          for (const p of s.points) {
            if (!usable(p)) continue;
            ctx.beginPath();
            ctx.arc(sx(p.x), yOf(p.y), (s.width || 2) + 1.2, 0, 2 * Math.PI);
            ctx.fill();
          }
        }
      }
      ctx.restore();
    }

    /** The x pixel of `key` in the first hoverable series that has it. */
    findKey(key) {
      if (!this.layout) return null;
      for (const s of this.series) {
        if (s.hover === false) continue;
        for (const p of s.points) {
          if (p.key === key && isNum(p.x) && isNum(p.y) && (!this.opts.xLog || p.x > 0)) {
            return { px: this.layout.sx(p.x) };
          }
        }
      }
      return null;
    }

    onHover(ev) {
      if (!this.layout) return;
      const rect = this.canvas.getBoundingClientRect();
      const mx = ev.clientX - rect.left;
      let best = null;
      let bestD = Infinity;
      for (const s of this.series) {
        if (s.hover === false) continue;
        for (const p of s.points) {
          if (!isNum(p.x) || !isNum(p.y) || (this.opts.xLog && p.x <= 0)) continue;
          const d = Math.abs(this.layout.sx(p.x) - mx);
          if (d < bestD) { bestD = d; best = p.key; }
        }
      }
      this.setHover(bestD < 40 ? best : null);
    }

    setHover(key) {
      if (key === this.hoverKey) return;
      this.hoverKey = key;
      this.draw();
      this.showTip();
    }

    showTip() {
      const tip = this.tip;
      const key = this.hoverKey;
      const at = key === null ? null : this.findKey(key);
      if (!at) { tip.hidden = true; return; }
      tip.replaceChildren();
      for (const [label, text, color] of this.opts.tooltip(key)) {
        const row = document.createElement("div");
        if (color) {
          const dot = document.createElement("span");
          dot.className = "agent-dot";
          dot.style.background = color;
          row.append(dot);
        }
        const b = document.createElement("b");
        b.textContent = label;
        row.append(b, ` ${text}`);
        tip.append(row);
      }
      tip.hidden = false;
      const { m, pw } = this.layout;
      const left = at.px + 12 + tip.offsetWidth > m.l + pw ? at.px - 12 - tip.offsetWidth : at.px + 12;
      tip.style.left = `${Math.max(0, left)}px`;
      tip.style.top = `${m.t + 4}px`;
    }
  }

  // ------------------------------------------------------------------ state

  const $ = (id) => document.getElementById(id);

  const state = {
    rounds: [], // RoundOut objects in version order, each with .cum and .cumDense added
    last: 0, // highest version seen
    cum: {}, // running totals per metric
    cumDense: {},
    status: null,
    agents: [],
    agentColors: new Map(),
    metric: "airtime_s",
    timer: null,
    inFlight: false,
    failures: 0,
    lastOk: null,
  };

  function resetHistory() {
    state.rounds = [];
    state.last = 0;
    state.cum = {};
    state.cumDense = {};
  }

  function colorOf(agent) {
    if (!state.agentColors.has(agent)) {
      state.agentColors.set(agent, AGENT_COLORS[state.agentColors.size % AGENT_COLORS.length]);
    }
    return state.agentColors.get(agent);
  }

  function addRound(r) {
    const cum = {};
    const cumDense = {};
    for (const k of Object.keys(METRICS)) {
      const a = r.totals && isNum(r.totals[k]) ? r.totals[k] : 0;
      const d = r.dense_equivalent && isNum(r.dense_equivalent[k]) ? r.dense_equivalent[k] : 0;
      state.cum[k] = (state.cum[k] || 0) + a;
      state.cumDense[k] = (state.cumDense[k] || 0) + d;
      cum[k] = state.cum[k];
      cumDense[k] = state.cumDense[k];
    }
    state.rounds.push({ ...r, cum, cumDense });
    state.last = Math.max(state.last, r.version);
  }

  // ------------------------------------------------------------------ fetching

  async function getJSON(path) {
    const ctrl = new AbortController();
    const timer = setTimeout(() => ctrl.abort(), FETCH_TIMEOUT_MS);
    try {
      const resp = await fetch(path, { signal: ctrl.signal, cache: "no-store", headers: { Accept: "application/json" } });
      if (!resp.ok) {
        let detail = "";
        try { detail = (await resp.json()).detail || ""; } catch (_) { /* not JSON */ }
        throw new Error(`GET ${path}: HTTP ${resp.status}${detail ? ` (${detail})` : ""}`);
      }
      return await resp.json();
    } catch (err) {
      if (err.name === "AbortError") throw new Error(`GET ${path}: no answer within ${FETCH_TIMEOUT_MS / 1000} s`);
      if (err instanceof TypeError) throw new Error(`GET ${path}: the aggregator is unreachable`);
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  async function pullHistory() {
    for (;;) {
      const page = await getJSON(`/history?since=${state.last}&limit=${HISTORY_PAGE}`);
      const rounds = (page && Array.isArray(page.rounds) ? page.rounds : [])
        .filter((r) => r && isNum(r.version) && r.version > state.last)
        .sort((a, b) => a.version - b.version);
      for (const r of rounds) addRound(r);
      if (rounds.length < HISTORY_PAGE) return;
    }
  }

  async function poll() {
    state.timer = null;
    if (document.hidden || state.inFlight) return;
    state.inFlight = true;
    let delay = POLL_MS;
    try {
      const [status, agents] = await Promise.all([getJSON("/status"), getJSON("/agents")]);
      // A lower version than we have drawn means a new job or a wiped data dir: start over.
      if (status && isNum(status.model_version) && status.model_version < state.last) resetHistory();
      await pullHistory();
      state.status = status || null;
      state.agents = Array.isArray(agents) ? agents : [];
      state.failures = 0;
      state.lastOk = Date.now();
      setBanner(null);
      render();
    } catch (err) {
      state.failures += 1;
      delay = Math.min(POLL_MS * 2 ** (state.failures - 1), MAX_BACKOFF_MS);
      setBanner(err, delay);
    } finally {
      state.inFlight = false;
      schedule(delay);
    }
  }

  function schedule(delay) {
    clearTimeout(state.timer);
    state.timer = document.hidden ? null : setTimeout(poll, delay);
  }

  function setBanner(err, delay) {
    const banner = $("banner");
    if (!err) { banner.hidden = true; return; }
    const attempt = state.failures > 1 ? ` (attempt ${state.failures})` : "";
    $("banner-detail").textContent = `${err.message}. Next try in ${Math.round(delay / 1000)} s${attempt}.`;
    banner.hidden = false;
  }

  // ------------------------------------------------------------------ rendering

  function text(id, value, title) {
    const el = $(id);
    el.textContent = value;
    if (title !== undefined) el.title = title;
  }

  function renderHeader() {
    const s = state.status;
    if (!s) return;
    text("job", s.job || "–");
    const st = $("state");
    st.textContent = s.state || "unknown";
    st.dataset.state = s.state || "unknown";
    text("round", isNum(s.round) ? String(s.round) : "–",
      s.mode ? `${s.mode} mode; the open round collects updates computed at this version` : undefined);
    text("version", isNum(s.model_version) ? `v${s.model_version}` : "–");
    text("loss", fmtLoss(s.loss), isNum(s.loss) ? String(s.loss) : "not evaluated yet");
    text("accuracy", fmtPercent(s.accuracy));
    /* /status eta: time to the target loss at the recent rate (null: no target, or unknown) */
    const eta = s.eta;
    /* early: the decreases still grow. Without a loss floor the count holds them at their
       level ("at least"); with it the ETA is the midpoint of a range ("about") */
    const pending = eta && eta.eta_s > 0;
    const atLeast = pending && eta.lower_bound ? "≥ " : "";
    const about = pending && eta.early && !eta.lower_bound ? "~ " : "";
    const range = about && isNum(eta.eta_low_s) && isNum(eta.eta_high_s)
      ? `; between ${fmtSeconds(eta.eta_low_s)} and ${fmtSeconds(eta.eta_high_s)} ` +
        "(the decreases still grow)" : "";
    text("eta", eta ? (eta.eta_s > 0 ? atLeast + about + fmtSeconds(eta.eta_s) : "reached") : "–",
      eta ? `loss ${fmtLoss(eta.target_loss)} in ${atLeast}${about}${eta.versions_left} versions of ` +
        `${fmtSeconds(eta.seconds_per_version)} (fit over the last ${eta.window})` + range +
        (atLeast ? "; the decreases still grow, so the target is most likely later" : "")
        : "no target loss (AGG_TARGET_LOSS), or the recent rate does not reach it");
    text("live", isNum(s.live_agents) ? `${s.live_agents} / ${isNum(s.agents) ? s.agents : "?"}` : "–");
    const fin = $("finish");
    if (s.state === "finished" && s.finish_reason) {
      fin.textContent = `Finished: ${s.finish_reason}`;
      fin.hidden = false;
    } else {
      fin.hidden = true;
    }
    for (const li of document.querySelectorAll(".kpi")) {
      const k = li.dataset.metric;
      const a = s.totals ? s.totals[k] : undefined;
      const d = s.dense_equivalent ? s.dense_equivalent[k] : undefined;
      li.querySelector(".kpi-value").textContent = METRICS[k].fmt(a);
      li.querySelector(".kpi-dense").textContent = isNum(d) ? `dense: ${METRICS[k].fmt(d)}` : "";
      li.querySelector(".kpi-saving").textContent = savingText(a, d);
    }
    renderDirections(s);
    renderWaiting(s);
    renderHold(s);
    renderRefused(s);
  }

  /** "Held by c's downlink (daily_cap) until 14:02:10, for 5 min": a round that could
   *  close waits for agents' downlinks (/status hold; null when not held). */
  function renderHold(s) {
    const el = $("hold");
    const h = s.hold;
    if (!h || !Array.isArray(h.held_by)) {
      el.hidden = true;
      return;
    }
    const now = Date.now() / 1000;
    const who = h.held_by.slice(0, WAITING_SHOWN).join(", ");
    const more = h.held_by.length > WAITING_SHOWN ? ` and ${h.held_by.length - WAITING_SHOWN} more` : "";
    const until = isNum(h.held_until) ? new Date(h.held_until * 1000).toLocaleTimeString() : "?";
    const since = isNum(h.since) ? `, for ${relTime(now - h.since).replace(" ago", "")}` : "";
    el.textContent = `Held by the downlink of ${who}${more} (${h.reason}) until ${until}${since}`;
    el.title = h.held_by.join(", ");
    el.hidden = false;
  }

  const WAITING_SHOWN = 8;

  /** "Round 3 waits for b (12 s), c (12 s)": live agents without an update for the open
   *  round (/status waiting_for), longest waited for first. */
  function renderWaiting(s) {
    const el = $("waiting");
    const waiting = Array.isArray(s.waiting_for) ? s.waiting_for : [];
    if (s.state !== "running" || !waiting.length) {
      el.hidden = true;
      return;
    }
    const now = Date.now() / 1000;
    const ago = (w) => (isNum(w.since) ? ` (${relTime(now - w.since).replace(" ago", "")})` : "");
    const names = waiting.slice(0, WAITING_SHOWN).map((w) => `${w.agent}${ago(w)}`);
    const more = waiting.length > WAITING_SHOWN ? ` and ${waiting.length - WAITING_SHOWN} more` : "";
    el.textContent = `Round ${s.round} waits for ${names.join(", ")}${more}`;
    el.title = waiting.map((w) => w.agent).join(", ");
    el.hidden = false;
  }

  /** "Refused: agent-bad (wrong_semantics ×3, 12 s ago)": agents refused for their
   *  settings (/status refused_agents, most recent first); a refused hello registers
   *  nothing, so these never appear in the agents table. */
  function renderRefused(s) {
    const el = $("refused-agents");
    const refused = Array.isArray(s.refused_agents) ? s.refused_agents : [];
    if (!refused.length) {
      el.hidden = true;
      return;
    }
    const now = Date.now() / 1000;
    const one = (r) => `${r.agent} (${r.reason} ×${fmtCount(r.count)}, ${relTime(now - r.last)})`;
    const more = refused.length > WAITING_SHOWN ? ` and ${refused.length - WAITING_SHOWN} more` : "";
    el.textContent = `Refused: ${refused.slice(0, WAITING_SHOWN).map(one).join(", ")}${more}`;
    el.title = "The aggregator refused these agents (their settings do not fit the job) and " +
      "told each why: " + refused.map((r) => `${r.agent}: ${r.reason}`).join(", ");
    el.hidden = false;
  }

  /** The uplink's counters name messages "updates"; the other directions "messages". */
  function costOf(c) {
    if (!c) return undefined;
    return isNum(c.messages) ? c : { ...c, messages: c.updates };
  }

  const DIRECTION_FMT = { messages: fmtCount, bytes: (v) => si(v, "B"), ...Object.fromEntries(
    ["packets", "airtime_s", "energy_j"].map((k) => [k, METRICS[k].fmt])) };

  /** The rows of what the agents actually sent (re-sends included) and both directions,
   *  added under the accepted spend once (static/index.html has the accepted rows only). */
  const SENT_ROWS = [
    ["sent", "Uplink, all sent", "every message the agents sent, re-sends and refused ones included (/status sent_total)"],
    ["sent_and_received", "All sent + received", "what the agents' radios spent, both directions (/status sent_and_received_total)"],
  ];

  function ensureSentRows(body) {
    for (const [dir, label, title] of SENT_ROWS) {
      if (body.querySelector(`tr[data-dir="${dir}"]`)) continue;
      const tr = document.createElement("tr");
      tr.dataset.dir = dir;
      tr.className = "dir-sent";
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = label;
      th.title = title;
      tr.append(th);
      for (const k of Object.keys(DIRECTION_FMT)) {
        const td = document.createElement("td");
        td.className = "num";
        td.dataset.metric = k;
        td.textContent = "–";
        tr.append(td);
      }
      body.append(tr);
    }
  }

  /** Uplink, downlink and total, each against its dense float32 baseline when known; then
   *  everything the agents sent (re-sends included) and that plus what they received. */
  function renderDirections(s) {
    const rows = {
      up: [costOf(s.totals), costOf(s.dense_equivalent)],
      down: [s.downlink, s.dense_equivalent_downlink],
      total: [s.total, s.dense_equivalent_total],
      sent: [s.sent_total, undefined],
      sent_and_received: [s.sent_and_received_total, undefined],
    };
    const body = document.getElementById("directions-body");
    if (body) ensureSentRows(body);
    for (const tr of document.querySelectorAll("#directions-body tr")) {
      const baseline = tr.dataset.dir in { up: 1, down: 1, total: 1 };
      const [actual, dense] = rows[tr.dataset.dir] || [];
      for (const td of tr.querySelectorAll("td")) {
        const k = td.dataset.metric;
        const a = actual ? actual[k] : undefined;
        const d = dense ? dense[k] : undefined;
        const value = document.createElement("span");
        value.className = "dir-value";
        value.textContent = isNum(a) ? DIRECTION_FMT[k](a) : "–";
        const vs = document.createElement("span");
        vs.className = "dir-dense";
        if (k !== "messages" && isNum(d)) {
          const saving = savingText(a, d);
          vs.textContent = `dense ${DIRECTION_FMT[k](d)}${saving ? ` · ${saving.replace(" than dense", "")}` : ""}`;
        } else if (k !== "messages" && baseline && tr.dataset.dir !== "up" && actual) {
          vs.textContent = "dense: unknown";
          vs.title = "the dense downlink baseline is kept in memory: unknown after the aggregator resumed the job";
        }
        td.replaceChildren(value, vs);
      }
    }
  }

  function renderLossChart() {
    const k = state.metric;
    const fmt = METRICS[k].fmt;
    const rounds = state.rounds;
    const evaluated = rounds.filter((r) => isNum(r.loss));
    const hasAcc = rounds.some((r) => isNum(r.accuracy));
    const series = [];
    const lossColor = cssVar("--loss", "#7b2cbf");
    const accColor = cssVar("--accuracy", "#0f766e");
    const denseColor = cssVar("--dense", "#8a94a3");
    if (evaluated.length) {
      series.push({
        name: "same rounds priced as dense", color: denseColor, dash: [6, 4], width: 1.5, markers: false, z: 0, hover: false,
        points: rounds.map((r) => ({ x: r.cumDense[k], y: r.loss, key: r.version })),
      });
      if (hasAcc) {
        series.push({
          name: "accuracy", color: accColor, axis: "y2", width: 1.5, markers: false, z: 1,
          points: rounds.map((r) => ({ x: r.cum[k], y: r.accuracy, key: r.version })),
        });
      }
      series.push({
        name: "loss", color: lossColor, width: 2.5, z: 2,
        points: rounds.map((r) => ({ x: r.cum[k], y: r.loss, key: r.version })),
      });
    }
    charts.loss.setData(series, { xLabel: `${METRICS[k].axis} (log scale)`, xFmt: fmt });
    const empty = $("loss-empty");
    empty.hidden = evaluated.length > 0;
    if (!evaluated.length && rounds.length) {
      empty.textContent = "Rounds are committing, but no loss has been evaluated yet (is AGG_EVAL_DATA set?).";
    }
    const legend = $("loss-legend");
    legend.replaceChildren(...[...series].reverse().map((s) => legendItem(s.name, s.color, !!s.dash)));
    const canvas = $("loss-chart");
    const lastEval = evaluated[evaluated.length - 1];
    canvas.setAttribute("aria-label", lastEval
      ? `Loss against cumulative ${METRICS[k].label} (log scale) over ${evaluated.length} evaluated rounds: ` +
        `loss ${fmtLoss(evaluated[0].loss)} at ${fmt(evaluated[0].cum[k])}, ` +
        `${fmtLoss(lastEval.loss)} at ${fmt(lastEval.cum[k])}.`
      : "Loss against cumulative communication cost: no evaluated round yet.");
  }

  function renderTChart() {
    const byAgent = new Map();
    for (const a of [...state.agents].map((x) => x.agent).sort()) byAgent.set(a, []);
    for (const r of state.rounds) {
      for (const a of Object.keys(r.agents || {})) if (!byAgent.has(a)) byAgent.set(a, []);
    }
    const names = [...byAgent.keys()].sort();
    for (const a of names) colorOf(a);
    const series = names.map((a) => ({
      name: a,
      color: colorOf(a),
      width: 2,
      // a null y breaks the line where the agent did not report
      points: state.rounds.map((r) => ({
        x: r.version, y: r.agents && r.agents[a] ? r.agents[a].t : null, key: r.version,
      })),
    }));
    charts.t.setData(series, {});
    $("t-empty").hidden = state.rounds.length > 0;
    $("t-legend").replaceChildren(...series.map((s) => legendItem(s.name, s.color, false)));
    const last = state.rounds[state.rounds.length - 1];
    $("t-chart").setAttribute("aria-label", last
      ? `Entries sent per agent over ${state.rounds.length} rounds; at version ${last.version}: ` +
        Object.entries(last.agents || {}).map(([a, v]) => `${a} T=${v.t}`).join(", ")
      : "T per agent over rounds: no committed round yet.");
  }

  function legendItem(name, color, dashed) {
    const li = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = dashed ? "swatch dashed" : "swatch";
    if (dashed) sw.style.color = color; else sw.style.background = color;
    sw.setAttribute("aria-hidden", "true");
    li.append(sw, document.createTextNode(name));
    return li;
  }

  function cell(tag, value, cls, title) {
    const el = document.createElement(tag);
    el.textContent = value;
    if (cls) el.className = cls;
    if (title) el.title = title;
    if (tag === "th") el.scope = "row";
    return el;
  }

  function renderAgents() {
    const body = $("agents-body");
    const agents = [...state.agents].sort((a, b) => String(a.agent).localeCompare(String(b.agent)));
    const live = agents.filter((a) => a.live).length;
    const refused = agents.filter((a) => a.messages_rejected > 0).length;
    const waiting = new Set(((state.status && state.status.waiting_for) || []).map((w) => w.agent));
    $("agents-count").textContent = agents.length
      ? `(${live} live of ${agents.length}${refused ? ` · ${refused} refused` : ""})` : "";
    if (!agents.length) {
      const tr = document.createElement("tr");
      tr.className = "placeholder";
      const td = cell("td", "No agent has said hello yet.");
      td.colSpan = 12;
      tr.append(td);
      body.replaceChildren(tr);
      return;
    }
    const now = Date.now() / 1000;
    body.replaceChildren(...agents.map((a) => {
      const tr = document.createElement("tr");
      const name = cell("th", "");
      const dot = document.createElement("span");
      dot.className = "agent-dot";
      dot.style.background = colorOf(a.agent);
      dot.setAttribute("aria-hidden", "true");
      name.append(dot, document.createTextNode(a.agent));
      const stateText = a.state || (a.live ? "online" : "offline");
      const status = document.createElement("td");
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.dataset.state = a.live && stateText !== "done" ? "online" : stateText;
      badge.textContent = a.live && stateText !== "done" ? "live" : stateText;
      badge.title = `agent state: ${stateText}`;
      status.append(badge);
      if (waiting.has(a.agent)) {
        const tag = document.createElement("span");
        tag.className = "waiting-tag";
        tag.textContent = "waited for";
        tag.title = "the open round has no update from this agent yet";
        status.append(tag);
      }
      const nRefused = isNum(a.messages_rejected) ? a.messages_rejected : 0;
      if (nRefused > 0) {
        tr.className = "refused";
        const tag = document.createElement("span");
        tag.className = "refused-tag";
        tag.textContent = `${fmtCount(nRefused)} refused`;
        tag.title = `${nRefused} of its messages were refused (the aggregator tells the agent why)`;
        status.append(tag);
      }
      const t = a.totals || {};
      const down = a.downlink || {};
      const both = a.total || {};
      const costTitle = (c, what) => isNum(c.bytes)
        ? `${what}: ${fmtCount(c.messages)} messages, ${fmtCount(c.packets)} packets, ${fmtSeconds(c.airtime_s)} airtime, ${si(c.energy_j, "J")}`
        : undefined;
      const seen = isNum(a.last_seen) ? new Date(a.last_seen * 1000).toLocaleString() : undefined;
      tr.append(
        name,
        cell("td", a.profile || "–", "profile", [a.compressor, a.policy, a.semantics].filter(Boolean).join(" · ")),
        status,
        cell("td", relTime(now - a.last_seen), "", seen),
        cell("td", fmtCount(a.updates_accepted), "num", isNum(a.last_round) ? `last round ${a.last_round}` : undefined),
        cell("td", si(t.bytes, "B"), "num"),
        cell("td", fmtCount(t.packets), "num"),
        cell("td", fmtSeconds(t.airtime_s), "num"),
        cell("td", si(t.energy_j, "J"), "num"),
        cell("td", si(down.bytes, "B"), "num", costTitle(down, "received")),
        cell("td", si(both.bytes, "B"), "num", costTitle(both, "sent + received")),
        cell("td", isNum(a.last_t) ? fmtCount(a.last_t) : "–", "num"),
      );
      return tr;
    }));
  }

  function renderUpdated() {
    if (state.lastOk === null) return;
    const rounds = state.rounds.length;
    $("updated").textContent = `Updated ${new Date(state.lastOk).toLocaleTimeString()} · ${rounds} round${rounds === 1 ? "" : "s"} in history · refreshing every ${POLL_MS / 1000} s while this tab is visible`;
  }

  function render() {
    renderHeader();
    renderLossChart();
    renderTChart();
    renderAgents();
    renderUpdated();
  }

  // ------------------------------------------------------------------ start

  const charts = {
    loss: new LineChart($("loss-chart"), $("loss-tip"), {
      xLog: true, xLabel: "", xFmt: String, yLabel: "loss", yFmt: fmtLoss, y2Label: "accuracy",
      tooltip: (key) => {
        const r = state.rounds.find((x) => x.version === key);
        if (!r) return [];
        const f = METRICS[state.metric].fmt;
        const rows = [["Version", String(r.version)], ["Loss", fmtLoss(r.loss)]];
        if (isNum(r.accuracy)) rows.push(["Accuracy", fmtPercent(r.accuracy)]);
        rows.push(["Spent", f(r.cum[state.metric])], ["Dense", f(r.cumDense[state.metric])]);
        return rows;
      },
    }),
    t: new LineChart($("t-chart"), $("t-tip"), {
      xLog: false, xInteger: true, xLabel: "model version (round)", xFmt: (v) => String(v),
      yLabel: "T (entries sent)", yFmt: fmtCount, yZero: true, yInteger: true,
      tooltip: (key) => {
        const r = state.rounds.find((x) => x.version === key);
        if (!r) return [];
        const rows = Object.entries(r.agents || {})
          .sort(([a], [b]) => a.localeCompare(b))
          .map(([a, v]) => [a, `T=${v.t}, ${si(v.bytes, "B")}`, colorOf(a)]);
        const more = rows.length > 12 ? [[`+${rows.length - 12}`, "more agents"]] : [];
        return [["Version", String(r.version)], ...rows.slice(0, 12), ...more];
      },
    }),
  };

  const picker = $("metric");
  const saved = (() => { try { return localStorage.getItem("cat-edge.metric"); } catch (_) { return null; } })();
  if (saved && METRICS[saved]) picker.value = saved;
  state.metric = picker.value;
  picker.addEventListener("change", () => {
    state.metric = picker.value;
    try { localStorage.setItem("cat-edge.metric", picker.value); } catch (_) { /* private mode */ }
    renderLossChart();
  });

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(state.timer);
      state.timer = null;
    } else if (state.timer === null && !state.inFlight) {
      poll();
    }
  });

  poll();
})();
