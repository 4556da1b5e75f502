"""The run dashboard's stylesheet (dashboard.py), kept apart from the page's logic."""

CSS = """
:root { --fg: #1f2328; --muted: #656d76; --line: #d8dee4; --bg: #f6f8fa; --accent: #0969da;
        }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       color: var(--fg); background: #fff; }
main { max-width: 1400px; margin: 0 auto; padding: 24px 28px 48px; }
header h1 { margin: 0 0 2px; font-size: 24px; }
header .path { color: var(--muted); font-family: ui-monospace, Menlo, Consolas, monospace;
               font-size: 12px; word-break: break-all; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 18px 0 6px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px; min-width: 150px;
        background: var(--bg); }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 22px; font-weight: 600; }
.card .s { color: var(--muted); font-size: 12px; }
nav { margin: 14px 0 0; font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 14px; }
h2 code { font-size: 13px; color: var(--muted); font-weight: 400; }
h2 { font-size: 18px; margin: 34px 0 6px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 14px; margin: 18px 0 6px; }
p.note { color: var(--muted); margin: 4px 0 10px; font-size: 13px; }
img.plot { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: right;
         white-space: nowrap; }
th { background: var(--bg); font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
tr.best td { background: #dafbe1; }
.scroll { overflow-x: auto; }
.ci { color: var(--muted); font-size: 11px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); gap: 8px 28px; }
.grid > div { min-width: 0; overflow-x: auto; }
.grid table { width: 100%; }
td.name { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px;
          white-space: normal; overflow-wrap: anywhere; }
.up { color: #0550ae; } .down { color: #953800; } .flat { color: var(--muted); }
pre { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px;
      overflow-x: auto; font-size: 13px; }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
.health { border-left: 4px solid #1a7f37; background: #f0fff4; padding: 8px 14px;
          border-radius: 0 6px 6px 0; margin: 8px 0 12px; }
.health.warning { border-color: #bf8700; background: #fff8c5; }
.health.failing { border-color: #cf222e; background: #ffebe9; }
.health b { text-transform: uppercase; letter-spacing: .04em; }
.card.failing { border-color: #cf222e; background: #ffebe9; }
.card.warning { border-color: #bf8700; background: #fff8c5; }
table.events td { white-space: normal; text-align: left; }
table.events td.msg { max-width: 980px; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
"""
