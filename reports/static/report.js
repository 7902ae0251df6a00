/* diagnose report: the attention-map viewer. Reads the one JSON blob in #report-data and draws
   maps in <canvas>. Text from the model (token strings) only ever goes through textContent or
   fillText, never innerHTML, so it cannot become markup. Works from file:// with no server. */
(function () {
  "use strict";
  var blob = document.getElementById("report-data");
  var sources = blob ? (JSON.parse(blob.textContent).heads || []) : [];
  var $ = function (id) { return document.getElementById(id); };
  var state = { source: 0, layer: 0, head: 0, example: 0 };
  var cache = {};
  var MARGIN = 92, MAIN = 560, THUMB = 110;

  function decode(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  /* cells are stored as round(255 * sqrt(weight)): sqrt keeps small weights visible */
  function cells(src, ex, layer, head) {
    var key = [src, ex, layer, head].join(":");
    if (!cache[key]) cache[key] = decode(sources[src].examples[ex].maps[layer][head]);
    return cache[key];
  }
  function shade(q) {
    var t = q / 255;
    return "rgb(" + Math.round(255 - 242 * t) + "," + Math.round(255 - 184 * t) + "," + Math.round(255 - 94 * t) + ")";
  }
  /* Token text is data: a U+202E in it must reverse only itself. In the DOM each piece goes in
     its own <bdi>; where only text can go (<option>, canvas) it is wrapped in FSI..PDI, with
     its own isolate marks removed so that it cannot close ours. */
  function iso(s) {
    return "\u2068" + String(s).replace(/[\u2066-\u2069]/g, "") + "\u2069";
  }
  function setText(el, parts) {
    /* parts: strings (ours) and {data: value} (from the files), each of the latter in a <bdi> */
    while (el.firstChild) el.removeChild(el.firstChild);
    parts.forEach(function (p) {
      if (typeof p === "string") { el.appendChild(document.createTextNode(p)); return; }
      var b = document.createElement("bdi");
      b.textContent = String(p.data);
      el.appendChild(b);
    });
  }
  function short(tok) {
    var s = String(tok).replace(/\s/g, "\u00b7");
    return iso(s.length > 9 ? s.slice(0, 8) + "\u2026" : s);
  }
  function draw(canvas, src, exIdx, layer, head, size, labels) {
    var ex = sources[src].examples[exIdx];
    var q = cells(src, exIdx, layer, head);
    var margin = labels ? MARGIN : 0;
    var n = Math.max(ex.n_q, ex.n_k);
    var cell = Math.max(1, Math.floor((size - margin) / n));
    canvas.width = margin + cell * ex.n_k;
    canvas.height = margin + cell * ex.n_q;
    var ctx = canvas.getContext("2d");
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (var i = 0; i < ex.n_q; i++) {
      for (var j = 0; j < ex.n_k; j++) {
        ctx.fillStyle = shade(q[i * ex.n_k + j]);
        ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
      }
    }
    if (labels) {
      var every = Math.max(1, Math.ceil(9 / cell));
      ctx.fillStyle = "#1f2328";
      ctx.font = Math.min(11, Math.max(8, cell - 1)) + "px monospace";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      for (i = 0; i < ex.n_q; i += every) ctx.fillText(short(ex.tokens[ex.q_offset + i]), margin - 4, margin + (i + 0.5) * cell);
      ctx.save();
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      for (j = 0; j < ex.n_k; j += every) ctx.fillText(short(ex.tokens[j]), -margin + 4, margin + (j + 0.5) * cell);
      ctx.restore();
    }
    return { cell: cell, margin: margin, ex: ex, q: q };
  }
  function flagOf(src, layer, head) {
    var f = sources[src].flagged;
    for (var i = 0; i < f.length; i++) if (f[i].layer === layer && f[i].head === head) return f[i];
    return null;
  }
  function option(select, value, text) {
    var o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    select.appendChild(o);
  }
  function fill(select, items) {
    while (select.firstChild) select.removeChild(select.firstChild);
    items.forEach(function (it) { option(select, it[0], it[1]); });
  }
  function fillSelectors() {
    var s = sources[state.source];
    fill($("map-layer"), Array.from({ length: s.n_layers }, function (_, l) { return [l, "layer " + l]; }));
    fill($("map-head"), Array.from({ length: s.n_heads }, function (_, h) {
      var f = flagOf(state.source, state.layer, h);
      return [h, "head " + h + (f ? "  \u2605 " + iso(f.kind) : "")];
    }));
    fill($("map-example"), s.examples.map(function (ex, i) {
      var text = "", n = 0;
      for (; n < Math.min(6, ex.tokens.length) && text.length < 40; n++) text += (n ? " " : "") + iso(ex.tokens[n]);
      return [i, (i + 1) + ": " + text + (n < ex.tokens.length ? " \u2026" : "")];
    }));
    $("map-layer").value = String(state.layer);
    $("map-head").value = String(state.head);
    $("map-example").value = String(state.example);
  }
  var current = null;
  function tokens(ex) {
    var box = $("map-tokens");
    while (box.firstChild) box.removeChild(box.firstChild);
    ex.tokens.forEach(function (t, i) {
      var span = document.createElement("span");
      span.textContent = String(t);
      span.title = "position " + i;
      box.appendChild(span);
    });
  }
  function gallery() {
    var box = $("map-gallery");
    while (box.firstChild) box.removeChild(box.firstChild);
    var s = sources[state.source];
    var picks = s.flagged.map(function (f) { return { layer: f.layer, head: f.head, label: f.label, kind: f.kind }; })
      .concat(s.top.map(function (t) { return { layer: t.layer, head: t.head, label: t.label, kind: "top effect" }; }));
    picks.slice(0, 12).forEach(function (p) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = p.kind.replace(/[^a-z_ ]/g, "") + (p.layer === state.layer && p.head === state.head ? " current" : "");
      var c = document.createElement("canvas");
      draw(c, state.source, state.example, p.layer, p.head, THUMB, false);
      setText(b, [p.label + " ", { data: p.kind }]);
      b.insertBefore(c, b.firstChild);
      b.addEventListener("click", function () { state.layer = p.layer; state.head = p.head; update(); });
      box.appendChild(b);
    });
  }
  function update() {
    fillSelectors();
    var canvas = $("map-canvas");
    current = draw(canvas, state.source, state.example, state.layer, state.head, MAIN, true);
    canvas.dataset.view = [state.source, state.layer, state.head, state.example].join(",");
    setText($("map-title"), [{ data: sources[state.source].name }, " \u2014 layer " + state.layer + ", head " +
      state.head + ", example " + (state.example + 1)]);
    var f = flagOf(state.source, state.layer, state.head);
    setText($("map-flag"), f ? [{ data: f.kind }, ": ", { data: f.reason }] : []);
    tokens(current.ex);
    gallery();
  }
  function hover(ev) {
    if (!current) return;
    var r = ev.target.getBoundingClientRect();
    var x = (ev.clientX - r.left) * (ev.target.width / r.width) - current.margin;
    var y = (ev.clientY - r.top) * (ev.target.height / r.height) - current.margin;
    var j = Math.floor(x / current.cell), i = Math.floor(y / current.cell), ex = current.ex;
    var spans = $("map-tokens").children;
    for (var k = 0; k < spans.length; k++) spans[k].className = "";
    if (i < 0 || j < 0 || i >= ex.n_q || j >= ex.n_k) return;
    var w = Math.pow(current.q[i * ex.n_k + j] / 255, 2);
    var qi = ex.q_offset + i;
    setText($("map-info"), ["query " + qi + " \u201c", { data: ex.tokens[qi] }, "\u201d \u2192 key " + j + " \u201c",
      { data: ex.tokens[j] }, "\u201d: " + w.toFixed(3)]);
    if (spans[j]) spans[j].className = "k";
    if (spans[qi]) spans[qi].className = "q";
  }
  function start() {
    var usable = sources.filter(function (s) { return s.examples.length > 0; });
    if (!usable.length) {
      $("map-empty").hidden = false;
      document.querySelector("#maps .viewer").hidden = true;
      document.querySelector("#maps .controls").hidden = true;
      return;
    }
    state.source = sources.indexOf(usable[0]);
    fill($("map-source"), sources.map(function (s, i) { return [i, iso(s.name) + (s.examples.length ? "" : " (no maps)")]; }));
    if (sources.length < 2) $("map-source").parentNode.hidden = true;
    function pickDefault() {
      var s = sources[state.source], first = s.flagged[0] || s.top[0] || { layer: 0, head: 0 };
      state.layer = first.layer; state.head = first.head; state.example = 0;
    }
    pickDefault();
    $("map-source").value = String(state.source);
    $("map-source").addEventListener("change", function (e) {
      var i = Number(e.target.value);
      if (!sources[i].examples.length) { e.target.value = String(state.source); return; }
      state.source = i; pickDefault(); update();
    });
    $("map-layer").addEventListener("change", function (e) { state.layer = Number(e.target.value); update(); });
    $("map-head").addEventListener("change", function (e) { state.head = Number(e.target.value); update(); });
    $("map-example").addEventListener("change", function (e) { state.example = Number(e.target.value); update(); });
    $("map-canvas").addEventListener("mousemove", hover);
    update();
  }
  if ($("map-canvas")) start();
})();
