/**
 * The first half of the page's script (see dashboard.js.ts): building elements, formatting numbers and
 * times, and the chart, drawn as SVG from the series. Plain browser JavaScript in a string; no template
 * literals inside (this is one).
 */
export const VIEW_JS = String.raw`
var SVG = 'http://www.w3.org/2000/svg';

function $(id) { return document.getElementById(id); }

/** An element: attrs are attributes, except text (its text) and on<event> (a listener). */
function el(tag, attrs, children) {
  var node = document.createElement(tag);
  for (var name in attrs || {}) {
    var value = attrs[name];
    if (value === undefined || value === null || value === false) continue;
    if (name === 'text') node.textContent = String(value);
    else if (name.slice(0, 2) === 'on') node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  (children || []).forEach(function (child) { if (child !== null && child !== undefined) node.append(child); });
  return node;
}

function svg(tag, attrs, text) {
  var node = document.createElementNS(SVG, tag);
  for (var name in attrs) node.setAttribute(name, String(attrs[name]));
  if (text !== undefined) node.textContent = text;
  return node;
}

function setText(node, value) { if (node.textContent !== value) node.textContent = value; }
function num(n) { return n === undefined || n === null ? '—' : Number(n).toLocaleString('en-US', { maximumFractionDigits: 3 }); }
function time(ms) { return new Date(ms).toLocaleTimeString('en-GB', { hour12: false }); }
function dateTime(ms) {
  var d = new Date(ms);
  var today = new Date();
  return d.toDateString() === today.toDateString() ? time(ms) : d.toLocaleString('en-GB', { hour12: false });
}
function duration(seconds) {
  if (seconds < 90) return Math.round(seconds) + ' s';
  if (seconds < 5400) return Math.round(seconds / 60) + ' min';
  if (seconds < 172800) return Math.round(seconds / 3600) + ' h';
  return Math.round(seconds / 86400) + ' days';
}
function until(ms) { return ms === undefined || ms === null ? 'until cleared' : dateTime(ms) + ' (in ' + duration(Math.max(0, (ms - Date.now()) / 1000)) + ')'; }
function code(value) { return el('code', { text: value }); }
function cell(content, cls) { return el('td', { class: cls }, [content]); }
function emptyRow(columns, message) { return el('tr', {}, [el('td', { colspan: columns, class: 'empty', text: message })]); }
function numbers(o) {
  var parts = [];
  if (o.capacity !== undefined) parts.push('capacity ' + num(o.capacity));
  if (o.refillPerSecond !== undefined) parts.push(num(o.refillPerSecond) + '/s');
  if (o.enforce !== undefined) parts.push(o.enforce ? 'enforce' : 'shadow');
  return parts.join(', ');
}

/**
 * Replaces a table body's rows when what they show changed, and gives the focus back to the control that
 * had it (same data-key), so that a refresh never moves a keyboard user.
 */
var shown = {};
function replaceRows(body, key, rows) {
  var signature = rows.map(function (row) { return row.outerHTML; }).join('');
  if (shown[key] === signature) return;
  shown[key] = signature;
  var active = document.activeElement;
  var focusKey = active && body.contains(active) ? active.getAttribute('data-key') : null;
  body.replaceChildren.apply(body, rows);
  if (focusKey) {
    var again = body.querySelector('[data-key="' + CSS.escape(focusKey) + '"]');
    if (again) again.focus();
  }
}

/** Rounds up to 1, 2 or 5 times a power of ten: the chart's top. */
function niceMax(value) {
  if (value <= 1) return 1;
  var power = Math.pow(10, Math.floor(Math.log10(value)));
  var steps = [1, 2, 5, 10];
  for (var i = 0; i < steps.length; i++) if (steps[i] * power >= value) return steps[i] * power;
  return 10 * power;
}

/** Allowed and refused per second as two lines, newest at the right, with its totals as the caption. */
function drawChart(container, caption, scope, points) {
  // As wide as its box, so that its text keeps its size on a phone as on a laptop.
  var width = Math.max(300, Math.round(container.clientWidth || 960)), height = width < 600 ? 200 : 240, left = 48, right = 12, top = 16, bottom = 28;
  var plotW = width - left - right, plotH = height - top - bottom;
  var allowed = 0, refused = 0, peak = 0;
  points.forEach(function (p) { allowed += p.allowed; refused += p.refused; peak = Math.max(peak, p.allowed, p.refused); });
  var max = niceMax(peak);
  var summary = scope + ', last ' + duration(points.length) + ': ' + num(allowed) + ' allowed, ' + num(refused) + ' refused; peak ' + num(peak) + ' per second';
  var root = svg('svg', { viewBox: '0 0 ' + width + ' ' + height, role: 'img', 'aria-label': 'Chart of ' + summary });
  root.append(svg('title', {}, 'Allowed and refused per second: ' + summary));
  for (var i = 0; i <= 4; i++) {
    var y = top + plotH - (plotH * i) / 4;
    root.append(svg('line', { class: 'grid', x1: left, x2: width - right, y1: y, y2: y }));
    root.append(svg('text', { class: 'axis', x: left - 6, y: y + 4, 'text-anchor': 'end' }, num((max * i) / 4)));
  }
  var n = Math.max(points.length, 2);
  var minutes = Math.round(points.length / 60);
  var labels = width < 600 ? 3 : 5;
  for (var m = 0; m <= minutes; m += Math.max(1, Math.round(minutes / labels))) {
    var x = left + plotW - (plotW * m * 60) / (n - 1);
    root.append(svg('text', { class: 'axis', x: x, y: height - 8, 'text-anchor': m === 0 ? 'end' : 'middle' }, m === 0 ? 'now' : '−' + m + ' min'));
  }
  ['allowed', 'refused'].forEach(function (kind) {
    var coordinates = points.map(function (p, index) {
      var px = left + (plotW * index) / (n - 1);
      var py = top + plotH - (plotH * p[kind]) / max;
      return px.toFixed(1) + ',' + py.toFixed(1);
    });
    root.append(svg('polyline', { class: kind, points: coordinates.join(' ') }));
  });
  var legend = svg('g', { 'aria-hidden': 'true' });
  legend.append(svg('rect', { class: 'legend-allowed', x: left + 8, y: top, width: 10, height: 10 }));
  legend.append(svg('text', { class: 'axis', x: left + 22, y: top + 9 }, 'allowed'));
  legend.append(svg('rect', { class: 'legend-refused', x: left + 90, y: top, width: 10, height: 10 }));
  legend.append(svg('text', { class: 'axis', x: left + 104, y: top + 9 }, 'refused'));
  root.append(legend);
  container.replaceChildren(root);
  setText(caption, 'Last ' + duration(points.length) + ': ' + num(allowed) + ' allowed, ' + num(refused) + ' refused (all instances, as of their last sync).');
}
`;
