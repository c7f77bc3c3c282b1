// app.js: the page around membudget's command line.
//
// The page has no model of its own. Every figure comes from running the CLI compiled to
// WebAssembly (membudget.js, built by tools/web_build.sh): the knobs become an argv, dropped files
// are written into emscripten's in-memory file system (MEMFS), and mb_run(argv) runs cli::run,
// the function the native `membudget` executable runs. What it prints on stdout (--format json)
// is what the page draws; the timeline is the SVG that `predict --plot` writes, read back from MEMFS.
//
// Self-test (tools/web_check.py): selftest.html, index.html with cases.js loaded first, runs every
// case's argv and writes the results as JSON into <pre id="mb-selftest">; index.html?demo=NAME fills the page with
// the example config NAME for a screenshot. Both finish before the page's load event (the module
// is compiled synchronously, see web/CMakeLists.txt), so headless Chromium's --dump-dom and
// --screenshot see the finished page.
"use strict";

const GiB = 1024 ** 3;
// The cards of the fit table: names the CLI's --device accepts (known_devices() in
// src/model/job.cpp); their capacities come from the CLI's answer, not from here.
const CARDS = ["H200", "H100-80GB", "H100-NVL", "A100-80GB", "A100-40GB", "L40S", "L4", "A10G",
               "RTX-4090", "RTX-3090", "B200", "MI300X", "V100-32GB", "V100-16GB", "T4"];
const DEFAULT_CARD = "H100-80GB";
// What the user dropped, picked or pasted is written to /models/NAME.json: the CLI names a model
// without a name_or_path after its file, so NAME is the example's or the dropped file's name.
let modelName = "model";
const configPath = () => `/models/${modelName}.json`;
const TRAINER_PATH = "/input/trainer_args.json";
const PLOT_PATH = "/output/step.svg";

// ---- the module: stdout and stderr are collected byte by byte (Module.stdout / stderr), so the
// page sees exactly the bytes the native CLI would print, newlines and UTF-8 included.
const io = { out: [], err: [] };
const moduleStart = performance.now();
const ready = createMembudget({
  stdout: (byte) => io.out.push(byte),
  stderr: (byte) => io.err.push(byte),
  print: () => {}, printErr: () => {},
}).ready.then((mod) => {  // emscripten 3.1.6's MODULARIZE factory returns the module; .ready resolves it
  const loadMs = performance.now();  // from navigation start: page, script and module
  mod.FS.mkdirTree("/input");
  mod.FS.mkdirTree("/models");
  mod.FS.mkdirTree("/output");
  return { mod, loadMs, moduleMs: loadMs - moduleStart };
});

const decoder = new TextDecoder("utf-8");

// Runs one command line (argv without the program name); returns {rc, stdout, stderr}.
function runCli(mod, argv) {
  io.out.length = 0;
  io.err.length = 0;
  const rc = mod.ccall("mb_run", "number", ["string"], [JSON.stringify(argv)]);
  return { rc, stdout: decoder.decode(new Uint8Array(io.out)), stderr: decoder.decode(new Uint8Array(io.err)) };
}

// Writes a file into MEMFS, making its folders (paths relative to MEMFS's cwd, "/", or absolute).
function writeFile(mod, path, text) {
  const slash = path.lastIndexOf("/");
  if (slash > 0) mod.FS.mkdirTree(path.slice(0, slash));
  mod.FS.writeFile(path, text);
}

// ---- formatting
const gib = (b) => (b / GiB).toFixed(2) + " GiB";
const el = (tag, attrs = {}, ...children) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
};
const shellQuote = (a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'");
const phaseLabel = (p) => p.replace(/_peak$/, "").replace(/_/g, " ");

function table(head, rows) {
  const t = el("table");
  t.append(el("tr", {}, ...head.map((h) => el("th", { text: h }))));
  for (const r of rows) {
    const tr = el("tr", r.class ? { class: r.class } : {});
    for (const c of r.cells) tr.append(typeof c === "object" ? el("td", c) : el("td", { text: String(c) }));
    t.append(tr);
  }
  return t;
}

// ---- the knobs as flags
function jobFlags() {
  const flags = [];
  for (const input of document.querySelectorAll("#knobs [data-flag]")) {
    const v = input.value.trim();
    if (v !== "") flags.push(input.dataset.flag, v);  // empty: the CLI's (or the trainer args') default
  }
  if (document.getElementById("trainer-text").value.trim() !== "") flags.push("--trainer-args", TRAINER_PATH);
  return flags;
}
const card = () => document.getElementById("card").value || DEFAULT_CARD;

// ---- rendering
function showError(text) {
  const e = document.getElementById("error");
  e.hidden = !text;
  e.textContent = text || "";
}

function renderPhases(p) {
  const box = document.getElementById("phases");
  box.replaceChildren();
  const reserved = p.reserved_phases || {};
  const limit = p.device ? p.device.capacity * (1 - p.device.headroom) : 0;
  const scale = Math.max(p.peak, ...Object.values(reserved), limit, 1);
  for (const [name, bytes] of Object.entries(p.phases)) {
    const bar = el("div", { class: "bar" }, el("div", { class: "fill", style: `width:${(100 * bytes) / scale}%` }));
    if (reserved[name] !== undefined) bar.append(el("div", { class: "reserved", style: `width:${(100 * reserved[name]) / scale}%` }));
    if (limit) bar.append(el("div", { class: "limit", style: `left:${(100 * limit) / scale}%` }));
    box.append(el("div", { text: phaseLabel(name) + (name === p.peak_phase ? " (peak)" : "") }), bar,
               el("div", { class: "num", text: gib(bytes) }));
  }
  box.append(el("div", { class: "legend", text:
    "bar: allocated (torch.cuda.max_memory_allocated)" + (Object.keys(reserved).length ? "; grey line: reserved by the caching allocator" : "") +
    (limit ? `; red mark: ${p.device.name} less ${Math.round(p.device.headroom * 100)}% headroom` : "") }));
}

function renderSummary(p) {
  const j = p.job;
  const parts = [`${p.model.name}: ${(p.model.parameters / 1e9).toFixed(2)} B parameters`,
                 `${j.mode} · batch ${j.batch} × seq ${j.seq} · ${j.precision}` + (j.mode === "train" ? ` · ${j.optimizer}` +
                 (j.optimizer_impl ? ` (${j.optimizer_impl})` : "") + ` · recompute ${j.recompute}` : "") + ` · ${j.attention}`,
                 `peak ${gib(p.peak)} (${phaseLabel(p.peak_phase)})` + (p.reserved_peak ? `, reserved ${gib(p.reserved_peak)}, nvidia-smi ${gib(p.nvidia_smi)}` : "")];
  if (p.rank !== undefined) parts.push(`rank ${JSON.stringify(p.rank)}`);
  const s = document.getElementById("summary");
  s.replaceChildren(...parts.map((t) => el("div", { text: t })));
}

function renderTerms(p) {
  const rows = Object.entries(p.terms).map(([k, v]) => ({ cells: [k.replace(/_/g, " "), gib(v), v.toLocaleString("en")] }));
  document.getElementById("terms").replaceChildren(table(["term", "GiB", "bytes"], rows));
}

function renderTimeline(mod) {
  const box = document.getElementById("timeline");
  let svg = "";
  try { svg = mod.FS.readFile(PLOT_PATH, { encoding: "utf8" }); } catch (e) { /* not written */ }
  // The SVG is membudget's own (render_timeline_svg escapes every text it draws): inlined as is.
  box.innerHTML = svg.replace(/^<\?xml[^>]*>\s*/, "") || "<p class='note'>no timeline for this job</p>";
}

// One predict per card: the fit is the CLI's own decision (allocated, or reserved when the
// caching-allocator replay applies), taken on that card.
function renderFit(mod, base) {
  const rows = [];
  for (const name of CARDS) {
    const r = runCli(mod, ["predict", ...base, "--device", name, "--format", "json"]);
    if (r.rc !== 0 && r.rc !== 1) continue;
    const d = JSON.parse(r.stdout).device;
    rows.push({ class: name === card() ? "chosen" : "", headroom: d.headroom, allocatedBasis: d.basis !== "reserved", cells: [d.name, gib(d.capacity), gib(d.allocated_required),
      gib(d.required) + (d.basis === "reserved" ? "" : " *"), { class: d.fits ? "yes" : "no", text: d.fits ? "fits" : "does not fit" }] });
  }
  const box = document.getElementById("fit");
  const headroom = rows.length ? rows[0].headroom : 0.05;
  box.replaceChildren(table(["card", "capacity", "allocated", "reserved (required)", `with ${Math.round(headroom * 100)}% headroom`], rows));
  if (rows.some((r) => r.allocatedBasis))
    box.append(el("p", { class: "note", text: "* no reserved figure for this job: the allocated requirement decides." }));
}

function renderMaxBatch(mod, base) {
  const box = document.getElementById("maxbatch");
  const [model, ...job] = base;
  const flags = [];  // the job less its micro-batch, which max-batch searches for
  for (let i = 0; i < job.length; i += 2) if (job[i] !== "--batch") flags.push(job[i], job[i + 1]);
  const r = runCli(mod, ["max-batch", model, ...flags, "--device", card(), "--format", "json"]);
  if (r.rc !== 0 && r.rc !== 1) { box.replaceChildren(el("p", { class: "note", text: r.stderr.trim() })); return; }
  const m = JSON.parse(r.stdout);
  const rows = [{ cells: ["card", m.device.name] }, { cells: ["sequence", m.seq] },
                { cells: ["largest micro-batch", m.max_micro_batch] }];
  if (m.required !== undefined) rows.push({ cells: ["its requirement", gib(m.required) + ` (${m.basis})`] });
  rows.push({ cells: ["limit", gib(m.device.limit)] });
  box.replaceChildren(table(["", ""], rows));
}

function renderServe(mod, model) {
  const box = document.getElementById("serve");
  const r = runCli(mod, ["serve", model, "--device", card(), "--format", "json"]);
  if (r.rc !== 0 && r.rc !== 1) { box.replaceChildren(el("p", { class: "note", text: r.stderr.trim() })); return; }
  const s = JSON.parse(r.stdout);
  const rows = [["card", s.device.name], ["weights", gib(s.memory.weights)], ["activation peak", gib(s.memory.activation_peak)],
                ["KV pool", gib(s.pool.pool_bytes)], ["KV tokens", s.pool.kv_tokens.toLocaleString("en")],
                ["max concurrency", `${s.pool.max_concurrency.toFixed(2)}× at ${s.config.max_model_len.toLocaleString("en")} tokens`]];
  box.replaceChildren(table(["", ""], rows.map((c) => ({ cells: c }))), el("p", { class: "note", text: s.log.join(" · ") }));
}

// Everything the page shows for the current inputs.
function predictAll(mod) {
  const t0 = performance.now();
  const configText = document.getElementById("config-text").value;
  if (configText.trim() === "") { showError("Drop, paste or pick a config.json first."); return; }
  writeFile(mod, configPath(), configText);
  const trainerText = document.getElementById("trainer-text").value;
  if (trainerText.trim() !== "") writeFile(mod, TRAINER_PATH, trainerText);
  try { mod.FS.unlink(PLOT_PATH); } catch (e) { /* none yet */ }

  const base = [configPath(), ...jobFlags()];
  const argv = ["predict", ...base, "--device", card(), "--format", "json", "--plot", PLOT_PATH];
  document.getElementById("command").textContent = "membudget " + argv.map(shellQuote).join(" ");
  const r = runCli(mod, argv);
  if (r.rc !== 0 && r.rc !== 1) {  // 1: it does not fit the card, still an answer
    showError(r.stderr.trim() || `membudget exited with ${r.rc}`);
    for (const id of ["summary", "phases", "timeline", "fit", "maxbatch", "serve", "terms"]) document.getElementById(id).replaceChildren();
    return;
  }
  showError(r.stderr.trim());  // warnings, if any
  const p = JSON.parse(r.stdout);
  renderSummary(p);
  renderPhases(p);
  renderTimeline(mod);
  renderTerms(p);
  renderFit(mod, base);
  renderMaxBatch(mod, base);
  renderServe(mod, configPath());
  document.getElementById("summary").append(el("div", { class: "note", text: `computed in ${(performance.now() - t0).toFixed(0)} ms` }));
}

// ---- inputs: drop, choose or paste
// A file's name as the model's: "llama-3.2-1b.json" gives "llama-3.2-1b"; "config.json" says nothing.
function nameOf(fileName) {
  const stem = fileName.replace(/\.json$/i, "").replace(/[^\w.+-]/g, "_");
  return stem && stem !== "config" ? stem : "model";
}

function wireDrop(zoneId, fileId, textId, onChange, onName) {
  const zone = document.getElementById(zoneId);
  const read = (file) => file.text().then((t) => {
    document.getElementById(textId).value = t;
    if (onName) onName(nameOf(file.name));
    onChange();
  });
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    if (e.dataTransfer.files.length) read(e.dataTransfer.files[0]);
  });
  document.getElementById(fileId).addEventListener("change", (e) => { if (e.target.files.length) read(e.target.files[0]); });
}

function setUp({ mod }) {
  const examples = window.MB_EXAMPLES || {};
  const select = document.getElementById("example");
  for (const name of Object.keys(examples)) select.append(el("option", { value: name, text: name }));
  const cardSelect = document.getElementById("card");
  for (const name of CARDS) cardSelect.append(el("option", { value: name, text: name }));
  cardSelect.value = DEFAULT_CARD;

  const run = () => predictAll(mod);
  select.addEventListener("change", () => {
    if (!select.value) return;
    modelName = select.value;
    document.getElementById("config-text").value = examples[select.value];
    run();
  });
  // Pasted text is the model "model"; a dropped or picked file is named after its file.
  document.getElementById("config-text").addEventListener("input", () => { modelName = "model"; select.value = ""; });
  wireDrop("config-drop", "config-file", "config-text", run, (name) => { modelName = name; select.value = ""; });
  wireDrop("trainer-drop", "trainer-file", "trainer-text", run);
  document.getElementById("knobs").addEventListener("submit", (e) => { e.preventDefault(); run(); });
  document.getElementById("run").disabled = false;

  const demo = new URLSearchParams(location.search).get("demo");
  if (demo && examples[demo]) {
    select.value = demo;
    modelName = demo;
    document.getElementById("config-text").value = examples[demo];
    run();
  }
}

// ---- self-test: every case of cases.js (written by tools/web_check.py) through the CLI
function selfTest({ mod }) {
  const suite = window.MB_CASES;
  const out = document.getElementById("mb-selftest");
  for (const [path, text] of Object.entries(suite.files)) writeFile(mod, path, text);
  const t0 = performance.now();
  const results = suite.cases.map((c) => ({ name: c.name, ...runCli(mod, c.argv) }));
  out.textContent = JSON.stringify({ run_ms: performance.now() - t0, results });
}

ready.then((m) => {
  const status = document.getElementById("mb-status");
  status.textContent = `module ready in ${m.loadMs.toFixed(0)} ms (WebAssembly ${m.moduleMs.toFixed(0)} ms)`;
  status.classList.add("ready");
  document.getElementById("mb-load-ms").textContent = JSON.stringify({ load_ms: m.loadMs, module_ms: m.moduleMs });
  if (window.MB_CASES) selfTest(m); else setUp(m);
}).catch((e) => {
  const status = document.getElementById("mb-status");
  status.textContent = "the module failed to load: " + e;
  status.classList.add("failed");
  document.getElementById("mb-load-ms").textContent = JSON.stringify({ error: String(e) });
});
