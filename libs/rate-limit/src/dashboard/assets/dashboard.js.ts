import { RENDER_JS } from './dashboard-render.js.js';
import { VIEW_JS } from './dashboard-view.js.js';

/**
 * The page's script, served as `assets/app.js` (the CSP allows only the page's own scripts): it reads the
 * dashboard's API every 2 s and renders it, and sends each change, once confirmed in a dialog, as a JSON
 * POST with the dashboard's header. Plain browser JavaScript, no framework, no build step.
 */
const APP_JS = String.raw`
var base = document.currentScript.src.replace(/assets\/app\.js(\?.*)?$/, '');
var REFRESH_MS = 2000;
var ui = { policy: '', window: '300', inspected: null, policies: [] };

function read(response) {
  return response.json().catch(function () { return {}; }).then(function (body) {
    if (response.ok) return body;
    var message = Array.isArray(body.message) ? body.message.join('; ') : body.message;
    throw new Error(message || response.status + ' ' + response.statusText);
  });
}
function get(path) { return fetch(base + path, { credentials: 'same-origin', headers: { accept: 'application/json' } }).then(read); }
function post(path, body) {
  return fetch(base + path, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json', accept: 'application/json', 'x-rate-limit-dashboard': '1' },
    body: JSON.stringify(body),
  }).then(read);
}
function query(params) {
  return Object.keys(params).map(function (k) { return encodeURIComponent(k) + '=' + encodeURIComponent(params[k]); }).join('&');
}

var toastTimer;
function announce(message, bad) {
  var result = $('result');
  result.className = bad ? 'toast bad' : 'toast';
  result.textContent = message;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(function () { result.textContent = ''; }, 6000);
}

/* The dialog: every change is confirmed here, with its fields and a reason, then sent. */
var pending = null;
function confirmChange(options) {
  var dialog = $('dialog');
  setText($('dialog-title'), options.title);
  setText($('dialog-text'), options.text || '');
  setText($('dialog-error'), '');
  setText($('dialog-ok'), options.confirm);
  $('dialog-ok').className = options.danger ? 'primary danger' : 'primary';
  var fields = (options.fields || []).concat([{ name: 'reason', label: 'Reason (written to the audit trail)', required: options.reasonRequired, maxlength: 200 }]);
  $('dialog-fields').replaceChildren.apply($('dialog-fields'), fields.map(function (f) {
    var input = f.options
      ? el('select', { name: f.name }, f.options.map(function (o) { return el('option', { value: o[0], text: o[1], selected: o[0] === f.value }); }))
      : el('input', { name: f.name, type: f.type || 'text', value: f.value, required: f.required, min: f.min, max: f.max, step: f.step, maxlength: f.maxlength, inputmode: f.type === 'number' ? 'decimal' : undefined, autocomplete: 'off', 'aria-describedby': f.hint ? 'hint-' + f.name : undefined });
    return el('label', {}, [el('span', { text: f.label + (f.required ? '' : ' (optional)') }), input, f.hint ? el('span', { class: 'hint', id: 'hint-' + f.name, text: f.hint }) : null]);
  }));
  pending = options;
  dialog.showModal();
  var first = dialog.querySelector('input, select');
  if (first) first.focus();
}
function dialogValues() {
  var values = {};
  $('dialog-fields').querySelectorAll('input, select').forEach(function (input) { values[input.name] = input.value.trim(); });
  return values;
}
function closeDialog() { pending = null; $('dialog').close(); }

function submitDialog(event) {
  event.preventDefault();
  if (!pending) return;
  var options = pending;
  var values = dialogValues();
  var body;
  try { body = options.body(values); } catch (error) { setText($('dialog-error'), error.message); return; }
  if (values.reason) body.reason = values.reason;
  else if (options.reasonRequired) { setText($('dialog-error'), 'Give a reason: it goes to the audit trail.'); return; }
  $('dialog-ok').disabled = true;
  post(options.path, body).then(function (answer) {
    closeDialog();
    announce(options.done(answer));
    refresh();
    if (ui.inspected) inspect(ui.inspected);
  }, function (error) {
    setText($('dialog-error'), error.message);
  }).finally(function () { $('dialog-ok').disabled = false; });
}
function wholeNumber(value, label) {
  if (value === '') return undefined;
  if (!/^\d+$/.test(value)) throw new Error(label + ' must be a whole number');
  return Number(value);
}

function blockDialog(target) {
  confirmChange({
    title: 'Block', confirm: 'Block', danger: true, reasonRequired: true, path: 'api/block',
    text: 'Every instance refuses it before any bucket, within a few seconds, until the block ends.',
    fields: [
      { name: 'target', label: 'Identity or address range', value: target, required: true, maxlength: 100, hint: 'ip:203.0.113.7, ip:10.0.0.0/8, user:42, key:<digest>' },
      { name: 'minutes', label: 'For how many minutes', type: 'number', value: '60', required: true, min: 1, max: 43200, step: 1 },
    ],
    body: function (v) { return { target: v.target, seconds: (wholeNumber(v.minutes, 'Minutes') || 0) * 60 }; },
    done: function (entry) { return 'Blocked ' + entry.target + ' until ' + dateTime(entry.until) + '.'; },
  });
}
function unblockDialog(target) {
  confirmChange({
    title: 'Unblock ' + target, confirm: 'Unblock', path: 'api/unblock', fields: [],
    body: function () { return { target: target }; },
    done: function (a) { return a.removed ? 'Unblocked ' + target + '.' : target + ' was not blocked.'; },
  });
}
function overrideDialog(scope, identity) {
  var policy = ui.policies.find(function (p) { return p.scope === scope; }) || {};
  confirmChange({
    title: 'Override ' + scope + (identity ? ' for ' + identity : ''), confirm: 'Override', reasonRequired: true, path: 'api/override',
    text: 'Every instance decides with these numbers within a few seconds; the code\u2019s numbers come back when it is cleared or ends. Leave a field empty to keep the code\u2019s value.',
    fields: [
      { name: 'identity', label: 'Identity (empty: every identity)', value: identity || '', maxlength: 100 },
      { name: 'capacity', label: 'Capacity (burst)', type: 'number', min: 1, step: 1, value: '', hint: 'In code: ' + num(policy.capacity) },
      { name: 'refillPerSecond', label: 'Refill per second', type: 'number', min: 0, step: 'any', value: '', hint: 'In code: ' + num(policy.refillPerSecond) },
      { name: 'mode', label: 'Mode', value: '', options: [['', 'as in code (' + (policy.enforce === false ? 'shadow' : 'enforce') + ')'], ['enforce', 'enforce: refuse over the limit'], ['shadow', 'shadow: count, never refuse']] },
      { name: 'minutes', label: 'For how many minutes (empty: until cleared)', type: 'number', min: 1, step: 1, value: '' },
    ],
    body: function (v) {
      var body = { scope: scope };
      if (v.identity) body.identity = v.identity;
      var capacity = wholeNumber(v.capacity, 'Capacity');
      if (capacity !== undefined) body.capacity = capacity;
      if (v.refillPerSecond !== '') {
        var refill = Number(v.refillPerSecond);
        if (!isFinite(refill) || refill <= 0) throw new Error('Refill per second must be a number above 0');
        body.refillPerSecond = refill;
      }
      if (v.mode) body.enforce = v.mode === 'enforce';
      var minutes = wholeNumber(v.minutes, 'Minutes');
      if (minutes !== undefined) body.ttlSeconds = minutes * 60;
      return body;
    },
    done: function (o) { return 'Override of ' + o.scope + (o.identity ? ' for ' + o.identity : '') + ' set: ' + numbers(o) + '.'; },
  });
}
function clearOverrideDialog(scope, identity) {
  confirmChange({
    title: 'Clear the override of ' + scope + (identity ? ' for ' + identity : ''), confirm: 'Clear', path: 'api/override/clear', fields: [],
    text: 'The code\u2019s numbers apply again on every instance within a few seconds.',
    body: function () { return identity ? { scope: scope, identity: identity } : { scope: scope }; },
    done: function (a) { return a.removed ? 'Override cleared.' : 'No override was in force.'; },
  });
}
function resetDialog(scope, identity) {
  confirmChange({
    title: 'Reset ' + identity + ' on ' + scope, confirm: 'Reset', path: 'api/reset', fields: [],
    text: 'Its bucket is full again (a penalty included) for its next request.',
    body: function () { return { scope: scope, identity: identity }; },
    done: function () { return 'Bucket of ' + identity + ' on ' + scope + ' reset.'; },
  });
}

function button(label, key, onclick, extra) {
  return el('button', { type: 'button', 'data-key': key, onclick: onclick, class: extra && extra.cls, 'aria-label': extra && extra.aria, text: label });
}
`;

/** The page's whole script: the view helpers, the API calls and dialogs above, then the rendering and the refresh. */
export const DASHBOARD_JS = `(function () {\n'use strict';\n${VIEW_JS}\n${APP_JS}\n${RENDER_JS}\n})();\n`;
