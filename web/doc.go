// Package web is the auditor UI: plain HTML, CSS and small vanilla
// JavaScript modules, embedded in the binary with go:embed and served by
// Handler at "/". There is no build step and nothing is loaded from outside
// the binary, so the UI works on a machine with no internet.
//
// Layout:
//
//	static/index.html     the one page; the app fills its <main>
//	static/app.css        all styles (no inline styles: the CSP forbids them)
//	static/js/app.js      entry module: hash router, sign-in, navigation
//	static/js/api.js      fetch wrapper: bearer token, problem+json, downloads
//	static/js/dom.js      tiny DOM and formatting helpers
//	static/js/runs.js     #/runs, #/runs/{id}, #/runs/{id}/items, #/runs/{id}/events
//	static/js/sources.js  #/sources, #/sources/{id}
//	static/js/charts.js   the run and source pages' charts of GET .../timeline
//	static/js/ledger.js   #/ledger
//	static/vendor/uplot/  uPlot 1.6.32 from npm (dist/uPlot.iife.min.js,
//	                      uPlot.min.css) with its MIT licence, unmodified
//	testdata/fakeapi/     fixtures of the fake API the browser test serves
//
// The charts are drawn by uPlot, a small canvas library for time series,
// loaded as a classic script before the modules (it defines the global
// uPlot). charts.js keeps every chart it draws in window.auditdCharts by
// name, so that the browser test can compare the data uPlot was given with
// the API's timeline. The fake API's timelines are added up by the reports
// package from a fixture ledger (timeline_fixture_test.go), so the charts
// are checked against what the real route answers for those events.
//
// The UI is a client of the REST API described by api/openapi.yaml and
// nothing more: every page is built from /v1/* responses, with the token the
// user pasted at sign-in (kept in sessionStorage, so it dies with the tab).
// A 401 from any call drops the token and returns to sign-in. Downloads
// (evidence and reconciliation workbooks) are fetched with the token and
// saved from a blob, because a plain link would not carry the header.
//
// Pages read the API's JSON as api/openapi.yaml defines it; the tests check
// the fake API's fixtures against that file, so a change to the contract
// that the UI depends on fails here. docs/UI.md lists the calls per page.
//
// Handler serves only the embedded files; the API owns /v1/*, /healthz,
// /metrics and /openapi.yaml and is mounted beside it. Every response carries
// a strict Content-Security-Policy (scripts, styles and connections from the
// same origin only; no inline script or style), and files are served with
// an ETag and "no-cache" so a new binary's UI is picked up on the next load
// while an unchanged one costs a 304.
package web
