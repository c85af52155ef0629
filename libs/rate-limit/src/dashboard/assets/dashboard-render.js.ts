/**
 * The last part of the page's script (see dashboard.js.ts): each section rendered from the API's
 * answers, the inspector, and the refresh every 2 s.
 */
export const RENDER_JS = String.raw`
var lastHealth = '';
function renderHealth(state) {
  var h = state.health, ops = state.operations;
  var line, cls;
  if (h.status === 'up') { cls = 'status up'; line = 'Up: ' + h.store + ' decides every request.'; }
  else { cls = 'status degraded'; line = 'Degraded: ' + (h.reason || 'the store cannot decide') + '.'; }
  if (ops.enabled && ops.syncFailing) { cls = 'status degraded'; line += ' The periodic sync fails: overrides and blocks are as last read' + (ops.syncError ? ' (' + ops.syncError + ')' : '') + '.'; }
  var status = $('health-status');
  // Set only when it changes: the status is announced to screen readers.
  if (line !== lastHealth) { status.className = cls; status.textContent = line; lastHealth = line; }
  var facts = [
    ['Store', h.store + (h.reachable ? ', reachable' : ', not reachable'), !h.reachable],
    ['Failure mode', h.failureMode],
    ['Failing nodes', h.failingNodes.length ? h.failingNodes.join(', ') : 'none', h.failingNodes.length > 0],
    ['Fallback decisions, last minute', num(h.fallbackDecisionsLastMinute), h.fallbackDecisionsLastMinute > 0],
  ];
  if (ops.enabled) {
    facts.push(['Overrides in force', num(ops.overrides)], ['Blocks in force', num(ops.blocks)]);
    facts.push(['Last sync', ops.lastSyncAt ? time(ops.lastSyncAt) : 'not yet', ops.syncFailing]);
  } else {
    facts.push(['Operations', 'off: RateLimitModule.forRoot({ operations: true }) turns them on', true]);
  }
  var rows = facts.map(function (f) { return el('div', {}, [el('dt', { text: f[0] }), el('dd', { text: f[1], class: f[2] ? 'bad' : undefined })]); });
  var signature = JSON.stringify(facts);
  if (shown.facts !== signature) { shown.facts = signature; $('health-facts').replaceChildren.apply($('health-facts'), rows); }
}

function renderPolicies(policies) {
  ui.policies = policies;
  replaceRows($('policies-body'), 'policies', policies.length === 0 ? [emptyRow(8, 'No named policy on any route.')] : policies.map(function (p) {
    var o = p.override;
    var overrideText = o ? [el('span', { class: 'tag override', text: numbers(o) }), ' by ' + o.by + ', ' + until(o.until)] : ['—'];
    if (p.identityOverrides > 0) overrideText.push(el('br'), p.identityOverrides + ' for single identities');
    var mode = (o && o.enforce !== undefined ? o.enforce : p.enforce) ? 'enforce' : 'shadow';
    return el('tr', {}, [
      el('th', { scope: 'row' }, [code(p.scope)]),
      cell(p.keyBy),
      cell(num(o && o.capacity !== undefined ? o.capacity : p.capacity), 'num'),
      cell(num(o && o.refillPerSecond !== undefined ? o.refillPerSecond : p.refillPerSecond), 'num'),
      cell(el('span', { class: 'tag ' + mode, text: mode })),
      el('td', {}, overrideText),
      cell(p.routes.join(', ')),
      el('td', { class: 'actions' }, [
        button('Override…', 'override:' + p.scope, function () { overrideDialog(p.scope); }, { aria: 'Override ' + p.scope }),
        o ? button('Clear', 'clear:' + p.scope, function () { clearOverrideDialog(p.scope); }, { aria: 'Clear the override of ' + p.scope }) : null,
      ]),
    ]);
  }));
  var select = $('policy');
  var names = policies.map(function (p) { return p.scope; });
  if (!names.includes(ui.policy)) ui.policy = names[0] || '';
  var signature = names.join('\n');
  if (shown.select !== signature) {
    shown.select = signature;
    select.replaceChildren.apply(select, names.map(function (n) { return el('option', { value: n, text: n, selected: n === ui.policy }); }));
  }
}

function renderTop(top) {
  replaceRows($('top-body'), 'top', top.length === 0 ? [emptyRow(4, 'No refused request in this window.')] : top.map(function (t) {
    return el('tr', {}, [
      el('th', { scope: 'row' }, [code(t.identity)]),
      cell(num(t.refused), 'num'),
      cell(num(t.allowed), 'num'),
      el('td', { class: 'actions' }, [
        button('Inspect', 'inspect:' + t.identity, function () { $('inspect-identity').value = t.identity; inspect(t.identity); }, { aria: 'Inspect ' + t.identity }),
        button('Block…', 'block:' + t.identity, function () { blockDialog(t.identity); }, { cls: 'danger', aria: 'Block ' + t.identity }),
      ]),
    ]);
  }));
}

function renderBlocks(blocks) {
  replaceRows($('blocks-body'), 'blocks', blocks.length === 0 ? [emptyRow(5, 'Nothing is blocked.')] : blocks.map(function (b) {
    return el('tr', {}, [
      el('th', { scope: 'row' }, [code(b.target)]), cell(b.reason), cell(b.by), cell(until(b.until)),
      el('td', { class: 'actions' }, [button('Unblock…', 'unblock:' + b.target, function () { unblockDialog(b.target); }, { aria: 'Unblock ' + b.target })]),
    ]);
  }));
}

function renderOverrides(overrides) {
  replaceRows($('overrides-body'), 'overrides', overrides.length === 0 ? [emptyRow(7, 'No override: every policy has the code\u2019s numbers.')] : overrides.map(function (o) {
    var key = o.scope + '|' + (o.identity || '');
    return el('tr', {}, [
      el('th', { scope: 'row' }, [code(o.scope)]), cell(o.identity ? code(o.identity) : 'every identity'), cell(numbers(o)), cell(o.reason), cell(o.by), cell(until(o.until)),
      el('td', { class: 'actions' }, [button('Clear…', 'clear-o:' + key, function () { clearOverrideDialog(o.scope, o.identity); }, { aria: 'Clear the override of ' + o.scope + (o.identity ? ' for ' + o.identity : '') })]),
    ]);
  }));
}

/** What a change set, in words: the override's numbers, the end of a block or an override. */
function detail(d) {
  var parts = numbers(d) ? [numbers(d)] : [];
  if (d.until !== undefined) parts.push('until ' + dateTime(d.until));
  Object.keys(d).forEach(function (k) { if (['capacity', 'refillPerSecond', 'enforce', 'until'].indexOf(k) < 0) parts.push(k + ' ' + JSON.stringify(d[k])); });
  return parts.join(', ');
}

function renderAudit(audit) {
  replaceRows($('audit-body'), 'audit', audit.length === 0 ? [emptyRow(7, 'No change yet.')] : audit.map(function (a) {
    return el('tr', {}, [
      el('th', { scope: 'row', text: dateTime(a.at) }), cell(a.by), cell(a.action), cell(a.scope ? code(a.scope) : '—'),
      cell(a.target ? code(a.target) : '—'), cell(a.reason || '—'), cell(a.detail ? detail(a.detail) : '—'),
    ]);
  }));
}

function fact(label, value) { return el('div', {}, [el('dt', { text: label }), el('dd', { text: value })]); }
function inspect(identity) {
  ui.inspected = identity;
  var scope = ui.policy;
  return get('api/identity?' + query({ scope: scope, identity: identity })).then(function (i) {
    var facts = el('dl', { class: 'facts' }, [
      fact('Identity', i.identity), fact('Policy', i.scope),
      fact('Numbers now', num(i.capacity) + ' burst, ' + num(i.refillPerSecond) + '/s, ' + (i.enforce ? 'enforce' : 'shadow')),
      fact('Tokens now', num(i.tokens)), fact('Full in', duration(i.secondsToFull)),
      fact('Next request', i.retryAfterSeconds > 0 ? 'refused for ' + duration(i.retryAfterSeconds) : 'would pass'),
      fact('Override', i.override ? numbers(i.override) + ' (' + i.override.reason + ')' : 'none'),
      fact('Block', i.block ? 'until ' + dateTime(i.block.until) + ' (' + i.block.reason + ')' : 'none'),
    ]);
    var actions = el('div', { class: 'buttons' }, [
      button('Reset bucket…', 'i-reset', function () { resetDialog(scope, i.identity); }),
      button('Override for this identity…', 'i-override', function () { overrideDialog(scope, i.identity); }),
      i.block ? button('Unblock…', 'i-unblock', function () { unblockDialog(i.block.target); }) : button('Block…', 'i-block', function () { blockDialog(i.identity); }, { cls: 'danger' }),
    ]);
    $('inspection').replaceChildren(facts, actions);
  }, function (error) {
    $('inspection').replaceChildren(el('p', { class: 'error', role: 'alert', text: error.message }));
  });
}

var timer, loading = false;
function refresh() {
  if (loading) return Promise.resolve();
  loading = true;
  clearTimeout(timer);
  return get('api/state').then(function (state) {
    renderHealth(state);
    var on = state.operations.enabled;
    ['policies', 'traffic', 'top', 'inspector', 'blocks', 'overrides', 'audit'].forEach(function (id) { $(id).hidden = !on; });
    if (!on) return;
    renderPolicies(state.policies);
    renderBlocks(state.blocks);
    renderOverrides(state.overrides);
    renderAudit(state.audit);
    if (!ui.policy) return;
    var scope = ui.policy;
    return Promise.all([
      get('api/series?' + query({ scope: scope })).then(function (points) { drawChart($('chart'), $('chart-caption'), scope, points); }),
      get('api/top?' + query({ scope: scope, by: 'refused', window: ui.window })).then(renderTop),
    ]);
  }).then(function () {
    setText($('updated'), 'Updated ' + time(Date.now()) + ', every ' + REFRESH_MS / 1000 + ' s');
  }, function (error) {
    setText($('updated'), 'Not updated: ' + error.message);
  }).finally(function () {
    loading = false;
    timer = setTimeout(refresh, REFRESH_MS);
  });
}

$('policy').addEventListener('change', function (e) { ui.policy = e.target.value; shown.top = ''; refresh(); });
$('window').addEventListener('change', function (e) { ui.window = e.target.value; refresh(); });
$('inspect-form').addEventListener('submit', function (e) {
  e.preventDefault();
  var value = $('inspect-identity').value.trim();
  if (value) inspect(value);
});
$('block-new').addEventListener('click', function () { blockDialog(''); });
$('dialog-form').addEventListener('submit', submitDialog);
$('dialog-cancel').addEventListener('click', closeDialog);
$('dialog').addEventListener('close', function () { pending = null; });
refresh();
`;
