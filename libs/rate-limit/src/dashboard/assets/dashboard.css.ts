/** The dashboard's style sheet: served as `assets/app.css` (a file of its own: the CSP allows no inline style). */
export const DASHBOARD_CSS = String.raw`
:root {
  color-scheme: light dark;
  --bg: #f4f5f7; --card: #ffffff; --text: #1b1f24; --muted: #5b6470; --line: #d8dce2;
  --accent: #1f5fbf; --ok: #1a7f37; --bad: #c62828; --warn: #9a6700; --ok-bg: #e6f4ea; --bad-bg: #fdecea;
  --allowed: #1a7f37; --refused: #d93025; --focus: #ffbf47;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #111418; --card: #1a1f26; --text: #e6e9ee; --muted: #9aa4b1; --line: #2e3640;
    --accent: #7fb0ff; --ok: #5fd08a; --bad: #ff8a80; --warn: #e3b341; --ok-bg: #12301e; --bad-bg: #3b1717;
    --allowed: #5fd08a; --refused: #ff6f61;
  }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--text); }
a { color: var(--accent); }
.skip { position: absolute; left: -999px; top: 0; background: var(--card); padding: .5rem 1rem; z-index: 10; }
.skip:focus { left: .5rem; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
.top { display: flex; flex-wrap: wrap; align-items: baseline; justify-content: space-between; gap: .5rem 1rem; padding: .75rem 1.25rem; background: var(--card); border-bottom: 1px solid var(--line); }
h1 { font-size: 1.35rem; margin: 0; }
h2 { font-size: 1.05rem; margin: 0 0 .6rem; }
.muted { color: var(--muted); margin: 0; font-size: .9rem; }
main { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 1rem; padding: 1rem 1.25rem 4rem; max-width: 1500px; margin: 0 auto; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .9rem 1rem; min-width: 0; }
.wide, .health, #policies { grid-column: 1 / -1; }
.heading-row { display: flex; flex-wrap: wrap; justify-content: space-between; align-items: baseline; gap: .25rem 1rem; }
.controls { margin: 0 0 .6rem; display: flex; gap: .4rem; align-items: center; }
.status { font-weight: 600; padding: .55rem .8rem; border-radius: 6px; margin: 0 0 .6rem; border-left: 5px solid var(--muted); }
.status.up { background: var(--ok-bg); border-left-color: var(--ok); }
.status.degraded, .status.off { background: var(--bad-bg); border-left-color: var(--bad); }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(9.5rem, 1fr)); gap: .5rem 1rem; margin: 0; }
.facts div { border-top: 1px solid var(--line); padding-top: .3rem; }
.facts dt { color: var(--muted); font-size: .82rem; }
.facts dd { margin: 0; font-weight: 600; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.facts .bad { color: var(--bad); }
.scroll { overflow-x: auto; position: relative; }
.scroll table.wide-table { min-width: 40rem; }
.scroll:focus-visible { outline: 3px solid var(--focus); }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .4rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; font-size: .8rem; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.empty { color: var(--muted); font-style: italic; }
td.actions { white-space: nowrap; text-align: right; }
code { font: .85rem ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; overflow-wrap: break-word; }
.tag { display: inline-block; padding: 0 .4rem; border-radius: 4px; font-size: .8rem; border: 1px solid var(--line); }
.tag.shadow { color: var(--warn); border-color: var(--warn); }
.tag.override { color: var(--accent); border-color: var(--accent); }
button, select, input { font: inherit; color: inherit; }
button { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: .3rem .7rem; cursor: pointer; min-height: 2rem; }
button:hover { border-color: var(--accent); }
button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
button.danger { color: var(--bad); border-color: var(--bad); }
button.primary.danger { background: var(--bad); color: #fff; }
td.actions button + button { margin-left: .3rem; }
select, input { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: .3rem .5rem; min-height: 2rem; max-width: 100%; }
:focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }
.chart { margin: 0; }
#chart svg { width: 100%; height: auto; display: block; }
#chart .grid { stroke: var(--line); stroke-width: 1; }
#chart .axis { fill: var(--muted); font-size: 12px; }
#chart .allowed { stroke: var(--allowed); fill: none; stroke-width: 1.5; }
#chart .refused { stroke: var(--refused); fill: none; stroke-width: 1.5; }
#chart .legend-allowed { fill: var(--allowed); }
#chart .legend-refused { fill: var(--refused); }
.inline-form { display: flex; flex-wrap: wrap; gap: .4rem; align-items: center; margin-bottom: .6rem; }
.inline-form label { flex-basis: 100%; font-size: .85rem; color: var(--muted); }
.inline-form input { flex: 1 1 14rem; }
.buttons { display: flex; flex-wrap: wrap; gap: .4rem; justify-content: flex-end; margin-top: .6rem; }
.toast { position: fixed; bottom: 1rem; left: 50%; transform: translateX(-50%); margin: 0; max-width: min(90vw, 40rem); background: var(--text); color: var(--bg); padding: .5rem 1rem; border-radius: 6px; }
.toast:empty { display: none; }
.toast.bad { background: var(--bad); color: #fff; }
dialog { border: 1px solid var(--line); border-radius: 10px; background: var(--card); color: var(--text); width: min(32rem, 94vw); padding: 1rem 1.2rem; }
dialog::backdrop { background: rgb(0 0 0 / 45%); }
.fields { display: grid; gap: .55rem; }
.fields label { display: grid; gap: .15rem; font-size: .88rem; }
.fields .hint { color: var(--muted); font-size: .78rem; }
.error { color: var(--bad); margin: .5rem 0 0; }
.error:empty { display: none; }
@media (max-width: 760px) {
  main { grid-template-columns: minmax(0, 1fr); padding: .6rem .6rem 4rem; gap: .6rem; }
  .top { padding: .6rem; }
  th, td { padding: .35rem .3rem; }
}
`;
