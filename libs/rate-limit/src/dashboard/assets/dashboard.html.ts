/**
 * The dashboard's page. An asset in TypeScript (Nest's CLI and webpack copy no other file into a build):
 * no inline script or style, so that it runs under the CSP of `DASHBOARD_CSP`; the script fills it in.
 */

function escapeAttribute(value: string): string {
  return value.replace(/&/g, '&amp;').replace(/"/g, '&quot;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/** The page, with its assets addressed from `base` (the page's own path and a slash: no `<base>` under the CSP). */
export function dashboardPage(base: string): string {
  const at = escapeAttribute(base);
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Rate limits</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${at}assets/app.css">
<script src="${at}assets/app.js" defer></script>
</head>
<body>
<a class="skip" href="#main">Skip to the content</a>
<header class="top">
  <h1>Rate limits</h1>
  <p id="updated" class="muted">Loading…</p>
</header>
<main id="main">
  <section id="health" class="card health" aria-labelledby="health-title">
    <h2 id="health-title">Health of this instance</h2>
    <p id="health-status" class="status" role="status">Loading…</p>
    <dl id="health-facts" class="facts"></dl>
  </section>

  <section id="policies" class="card" aria-labelledby="policies-title">
    <h2 id="policies-title">Policies</h2>
    <div class="scroll" tabindex="0" role="region" aria-labelledby="policies-title">
      <table class="wide-table">
        <thead><tr><th scope="col">Policy</th><th scope="col">Key</th><th scope="col" class="num">Capacity</th><th scope="col" class="num">Refill /s</th><th scope="col">Mode</th><th scope="col">Override</th><th scope="col">Routes</th><th scope="col"><span class="sr">Actions</span></th></tr></thead>
        <tbody id="policies-body"></tbody>
      </table>
    </div>
  </section>

  <section id="traffic" class="card wide" aria-labelledby="traffic-title">
    <div class="heading-row">
      <h2 id="traffic-title">Allowed and refused per second, last 15 minutes</h2>
      <p class="controls"><label for="policy">Policy</label> <select id="policy"></select></p>
    </div>
    <figure class="chart">
      <div id="chart"></div>
      <figcaption id="chart-caption" class="muted"></figcaption>
    </figure>
  </section>

  <section id="top" class="card" aria-labelledby="top-title">
    <div class="heading-row">
      <h2 id="top-title">Top refused identities</h2>
      <p class="controls"><label for="window">Over</label> <select id="window"><option value="300">5 min</option><option value="3600">1 h</option><option value="86400">24 h</option></select></p>
    </div>
    <div class="scroll" tabindex="0" role="region" aria-labelledby="top-title">
      <table>
        <thead><tr><th scope="col">Identity</th><th scope="col" class="num">Refused</th><th scope="col" class="num">Allowed</th><th scope="col"><span class="sr">Actions</span></th></tr></thead>
        <tbody id="top-body"></tbody>
      </table>
    </div>
  </section>

  <section id="inspector" class="card" aria-labelledby="inspector-title">
    <h2 id="inspector-title">Identity inspector</h2>
    <form id="inspect-form" class="inline-form">
      <label for="inspect-identity">Identity on the selected policy</label>
      <input id="inspect-identity" name="identity" required maxlength="100" autocomplete="off" spellcheck="false" placeholder="ip:203.0.113.7, user:42, key:…">
      <button type="submit">Inspect</button>
    </form>
    <div id="inspection" aria-live="polite"></div>
  </section>

  <section id="blocks" class="card" aria-labelledby="blocks-title">
    <div class="heading-row">
      <h2 id="blocks-title">Blocks in force</h2>
      <p class="controls"><button type="button" id="block-new">Block an identity or range…</button></p>
    </div>
    <div class="scroll" tabindex="0" role="region" aria-labelledby="blocks-title">
      <table class="wide-table">
        <thead><tr><th scope="col">Target</th><th scope="col">Reason</th><th scope="col">By</th><th scope="col">Until</th><th scope="col"><span class="sr">Actions</span></th></tr></thead>
        <tbody id="blocks-body"></tbody>
      </table>
    </div>
  </section>

  <section id="overrides" class="card" aria-labelledby="overrides-title">
    <h2 id="overrides-title">Overrides in force</h2>
    <div class="scroll" tabindex="0" role="region" aria-labelledby="overrides-title">
      <table class="wide-table">
        <thead><tr><th scope="col">Policy</th><th scope="col">Identity</th><th scope="col">Numbers</th><th scope="col">Reason</th><th scope="col">By</th><th scope="col">Until</th><th scope="col"><span class="sr">Actions</span></th></tr></thead>
        <tbody id="overrides-body"></tbody>
      </table>
    </div>
  </section>

  <section id="audit" class="card wide" aria-labelledby="audit-title">
    <h2 id="audit-title">Audit trail</h2>
    <div class="scroll" tabindex="0" role="region" aria-labelledby="audit-title">
      <table class="wide-table">
        <thead><tr><th scope="col">When</th><th scope="col">By</th><th scope="col">Action</th><th scope="col">Policy</th><th scope="col">Target</th><th scope="col">Reason</th><th scope="col">Detail</th></tr></thead>
        <tbody id="audit-body"></tbody>
      </table>
    </div>
  </section>
</main>
<p id="result" class="toast" role="status" aria-live="polite"></p>
<dialog id="dialog" aria-labelledby="dialog-title" aria-describedby="dialog-text">
  <form id="dialog-form" novalidate>
    <h2 id="dialog-title"></h2>
    <p id="dialog-text"></p>
    <div id="dialog-fields" class="fields"></div>
    <p id="dialog-error" class="error" role="alert"></p>
    <div class="buttons"><button type="button" id="dialog-cancel">Cancel</button> <button type="submit" id="dialog-ok" class="primary">Confirm</button></div>
  </form>
</dialog>
</body>
</html>
`;
}
