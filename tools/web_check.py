#!/usr/bin/env python3
"""Checks the web page (web/, docs/web.md) in headless Chromium against the native CLI.

    python3 tools/web_check.py --cli build/membudget [--build-dir build-web] [--no-build]

1. Builds the page if needed (tools/web_build.sh; incremental).
2. Turns every committed accuracy case (the measured steps in tests/data/torch_*_h200.json) into a
   `predict ... --format json` command line: distributed cases through tools/dist_table.py's
   flags_of, single-GPU training cases as tests/test_accuracy_measured.cpp builds their Job,
   prefill cases as tests/test_serving_measured.cpp does (--mode infer).
3. Runs each command line with the native CLI, and all of them in the page (selftest.html: the
   page with cases.js, which writes the configs into MEMFS, runs every argv through mb_run and
   writes the results into the DOM, read back with --dump-dom), and fails unless the page's exit
   code, stdout and stderr equal the CLI's byte for byte, and every answer has its phases and terms.
4. Fails unless the page with a real config (index.html?demo=llama-3.2-1b) shows the phase bars,
   the timeline SVG, the device fit table, the largest micro-batch and the serving pool, and keeps
   its screenshot (BUILD_DIR/screenshot.png); unless the module is ready in under a second from
   disk (performance.now() in the page, the median of three loads); and unless the wasm is under
   2 MB compressed with gzip -9.

Exits 0 when all hold, 1 with a message naming what failed.
"""
import argparse
import base64
import concurrent.futures
import gzip
import hashlib
import html
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_GZIP_BYTES = 2 * 1000 * 1000  # "under 2 MB"
MAX_LOAD_MS = 1000.0
DEMO = "llama-3.2-1b"  # configs/hf/llama-3.2-1b.json, one of the page's examples


def fail(msg):
    print("web_check: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def load_dist_table():
    """tools/dist_table.py's flags_of: the one Python mapping of a distributed case to flags."""
    spec = importlib.util.spec_from_file_location("dist_table", os.path.join(ROOT, "tools", "dist_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.flags_of


def single_gpu_flags(j):
    """A single-GPU training case's job as flags, field for field as
    tests/test_accuracy_measured.cpp builds its Job (adamw-fused is AdamW with fused=True)."""
    opt = j["optimizer"]
    f = ["--batch", str(j["batch"]), "--seq", str(j["seq"]), "--precision", j["precision"],
         "--optimizer", "adamw" if opt == "adamw-fused" else opt,
         "--recompute", j["recompute"], "--attention", j["attention"]]
    if opt == "adamw-fused":
        f += ["--optimizer-impl", "fused"]
    if j.get("optimizer_impl"):
        f += ["--optimizer-impl", j["optimizer_impl"]]
    if j.get("experts_implementation"):
        f += ["--experts", j["experts_implementation"]]
    if j.get("lora"):
        f += ["--lora", str(j["lora"])]
    return f


class Configs:
    """The config files the cases name, as paths relative to the repository: committed ones as
    they are, overridden ones written under BUILD_DIR/cases/. The page gets the same files at the
    same relative paths in MEMFS, so both sides see the same argv and the same names."""

    def __init__(self, build_dir):
        self.dir = os.path.join(build_dir, "cases")
        self.files = {}  # relative path -> text

    def get(self, config, overrides=None):
        path = os.path.join(ROOT, config)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if overrides:
            cfg = json.loads(text)
            cfg.update(overrides)
            text = json.dumps(cfg, indent=1)
            stem = os.path.basename(config)[:-len(".json")]
            digest = hashlib.sha1(text.encode()).hexdigest()[:10]
            path = os.path.join(self.dir, f"{stem}-{digest}.json")
            os.makedirs(self.dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        # relative inside the checkout (the path appears in messages); absolute outside it
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(".."):
            rel = os.path.abspath(path)
        self.files[rel] = text
        return rel


def collect_cases(build_dir):
    """(name, argv) for every measured case; the skipped ones (no flags for their layout) named."""
    flags_of = load_dist_table()
    configs = Configs(build_dir)
    cases, skipped = [], []
    data = os.path.join(ROOT, "tests", "data")
    for fname in sorted(os.listdir(data)):
        if not (fname.startswith("torch_") and fname.endswith("_h200.json")):
            continue
        with open(os.path.join(data, fname), encoding="utf-8") as fh:
            doc = json.load(fh)
        if "models" in doc:  # tools/torch_profile_prefill.py: serving, one model × shapes
            for model in doc["models"]:
                if model.get("status", "ok") != "ok":
                    continue
                folder = "tests/data/hf/moe" if fname == "torch_prefill_moe_h200.json" else "configs/hf"
                cfg = configs.get(f"{folder}/{model['config']}", model.get("overrides"))
                for shape in model["shapes"]:
                    if shape.get("status") != "ok":
                        continue
                    cases.append((f"{fname}:{model['config']}:{shape['batch']}x{shape['seq']}",
                                  ["predict", cfg, "--mode", "infer", "--batch", str(shape["batch"]),
                                   "--seq", str(shape["seq"]), "--format", "json"]))
            continue
        for i, c in enumerate(doc["cases"]):
            if c.get("status") != "ok":
                continue
            if "job" not in c:  # tools/torch_saved_tensors.py: a reduced-depth model, one step
                j = c["case"]
                cfg = configs.get(j["config"], {"num_hidden_layers": j["layers"]} if j.get("layers") else None)
                flags = ["--batch", str(j["batch"]), "--seq", str(j["seq"]), "--precision", j["precision"],
                         "--recompute", j["recompute"], "--attention", j["attention"]]
                name = f"{fname}:{i}:{c.get('config_name', '')}"
            else:
                j = c["job"]
                cfg = configs.get(j["config"], j.get("overrides"))
                flags = flags_of(j) if ("strategy" in j or "stages" in j) else single_gpu_flags(j)
                name = f"{fname}:{c.get('name', i)}"
            if flags is None:
                skipped.append(name)
                continue
            cases.append((name, ["predict", cfg, *flags, "--format", "json"]))
    return cases, skipped, configs.files


def run_native(cli, argv):
    p = subprocess.run([cli, *argv], cwd=ROOT, capture_output=True, timeout=300)
    return {"rc": p.returncode, "stdout": p.stdout.decode("utf-8"), "stderr": p.stderr.decode("utf-8")}


def chromium_dom(chromium, url, extra=()):
    """The page's DOM after its load event, as headless Chromium dumps it."""
    with tempfile.TemporaryDirectory() as profile:
        p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            f"--user-data-dir={profile}", *extra, "--dump-dom", url],
                           capture_output=True, timeout=900)
    if p.returncode != 0 or not p.stdout:
        fail(f"chromium exited {p.returncode} on {url}: {p.stderr.decode(errors='replace')[-800:]}")
    return p.stdout.decode("utf-8")


def pre_json(dom, element_id):
    m = re.search(r'<pre id="%s"[^>]*>(.*?)</pre>' % re.escape(element_id), dom, re.S)
    if not m or not m.group(1).strip():
        fail(f"the page wrote nothing into #{element_id} (the module did not load, or the script failed)")
    return json.loads(html.unescape(m.group(1)))


def first_difference(a, b, path="$"):
    """Where two JSON values first differ, for the failure message."""
    if type(a) is not type(b):
        return f"{path}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{path}.{k}: missing on one side"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def compare(cases, native, page):
    """The failures: the page's answer differs from the CLI's, or an answer lacks its figures."""
    problems = []
    by_name = {r["name"]: r for r in page}
    for (name, argv), want in zip(cases, native):
        got = by_name.get(name)
        if got is None:
            problems.append(f"{name}: the page returned no result")
            continue
        if want["rc"] in (0, 1):  # an answer (1: it does not fit the card): its figures must be there
            try:
                answer = json.loads(want["stdout"])
            except ValueError:
                problems.append(f"{name}: the CLI's stdout is not JSON")
                continue
            missing = [k for k in ("phases", "terms", "peak") if k not in answer]
            if answer.get("job", {}).get("mode") == "train" and "rank" not in answer and \
                    answer.get("job", {}).get("profile") == "torch":
                missing += [k for k in ("reserved_peak", "reserved_phases") if k not in answer]
            if missing:
                problems.append(f"{name}: the answer lacks {', '.join(missing)}")
        for stream in ("rc", "stdout", "stderr"):
            if got[stream] != want[stream]:
                detail = ""
                if stream == "stdout":
                    try:
                        detail = ": " + str(first_difference(json.loads(want["stdout"]), json.loads(got["stdout"])))
                    except ValueError:
                        detail = f": {got['stdout'][:200]!r}"
                elif stream == "stderr":
                    detail = f": CLI {want['stderr'][:200]!r}, page {got['stderr'][:200]!r}"
                else:
                    detail = f": CLI {want['rc']}, page {got['rc']} ({got['stderr'].strip()[:200]})"
                problems.append(f"{name}: {stream} differs{detail}  [membudget {' '.join(argv)}]")
                break
    return problems


def wasm_sizes(js_path):
    """The wasm that SINGLE_FILE inlined into membudget.js (base64), raw and gzip -9."""
    with open(js_path, encoding="utf-8") as fh:
        js = fh.read()
    m = re.search(r"data:application/octet-stream;base64,([A-Za-z0-9+/=]+)", js)
    if not m:
        fail(f"{js_path} holds no inlined wasm (built without SINGLE_FILE?)")
    wasm = base64.b64decode(m.group(1))
    if wasm[:4] != b"\0asm":
        fail(f"the data inlined in {js_path} is not a wasm module")
    return len(wasm), len(gzip.compress(wasm, compresslevel=9)), len(js)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "membudget"), help="the native CLI to compare with")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-web"), help="where tools/web_build.sh builds")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--no-build", action="store_true", help="use the page already built")
    a = ap.parse_args()
    build_dir = os.path.abspath(a.build_dir)
    page_dir = os.path.join(build_dir, "page")
    t_start = time.monotonic()

    if not a.no_build:
        env = dict(os.environ, MEMBUDGET_WEB_BUILD=build_dir)
        t0 = time.monotonic()
        p = subprocess.run(["bash", os.path.join(ROOT, "tools", "web_build.sh")], cwd=ROOT, env=env,
                           capture_output=True, text=True)
        if p.returncode != 0:
            fail("tools/web_build.sh failed:\n" + (p.stdout + p.stderr)[-3000:])
        print(f"web_check: page built in {time.monotonic() - t0:.1f} s")
    for f in ("index.html", "app.js", "membudget.js", "examples.js"):
        if not os.path.exists(os.path.join(page_dir, f)):
            fail(f"{page_dir}/{f} is missing: run tools/web_build.sh")
    if not os.access(a.cli, os.X_OK):
        fail(f"the native CLI {a.cli} is not there: build it first (tools/setup.sh)")
    if not shutil.which(a.chromium):
        fail(f"{a.chromium} not found: tools/setup.sh installs Debian's chromium")

    raw, gz, js = wasm_sizes(os.path.join(page_dir, "membudget.js"))
    print(f"web_check: wasm {raw:,} bytes, {gz:,} with gzip -9 (membudget.js {js:,})")
    if gz >= MAX_GZIP_BYTES:
        fail(f"the wasm is {gz:,} bytes with gzip -9, not under {MAX_GZIP_BYTES:,}")

    # -- every accuracy case, native and in the page
    cases, skipped, files = collect_cases(build_dir)
    if len(cases) < 100:
        fail(f"only {len(cases)} accuracy cases found under tests/data/torch_*_h200.json")
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        native = list(pool.map(lambda c: run_native(a.cli, c[1]), cases))
    t_native = time.monotonic() - t0
    with open(os.path.join(page_dir, "cases.js"), "w", encoding="utf-8") as fh:
        fh.write("// Written by tools/web_check.py: the accuracy cases the self-test runs.\nwindow.MB_CASES = ")
        json.dump({"files": files, "cases": [{"name": n, "argv": v} for n, v in cases]}, fh)
        fh.write(";\n")
    with open(os.path.join(page_dir, "index.html"), encoding="utf-8") as fh:
        index = fh.read()
    hook = '<script src="examples.js"></script>'
    if hook not in index:
        fail("web/index.html no longer loads examples.js: selftest.html cannot be made from it")
    with open(os.path.join(page_dir, "selftest.html"), "w", encoding="utf-8") as fh:
        fh.write(index.replace(hook, '<script src="cases.js"></script>\n' + hook))
    t0 = time.monotonic()
    dom = chromium_dom(a.chromium, "file://" + os.path.join(page_dir, "selftest.html"))
    t_page = time.monotonic() - t0
    result = pre_json(dom, "mb-selftest")
    problems = compare(cases, native, result["results"])
    answered = sum(1 for r in native if r["rc"] in (0, 1))
    print(f"web_check: {len(cases)} accuracy cases ({answered} answered, {len(cases) - answered} refused by the CLI), "
          f"native {t_native:.1f} s, page {t_page:.1f} s (the cases {result['run_ms'] / 1000:.1f} s in the page)")
    if skipped:
        print(f"web_check: {len(skipped)} cases have no flags for their layout in tools/dist_table.py: "
              + ", ".join(skipped[:5]) + (" …" if len(skipped) > 5 else ""))
    if problems:
        for p in problems[:20]:
            print("  " + p, file=sys.stderr)
        fail(f"{len(problems)} of {len(cases)} cases differ between the page and the CLI")
    print(f"web_check: {len(cases)} cases: the page's bytes equal the CLI's")

    # -- the page with a real config: every section filled, and its screenshot
    demo_url = "file://" + os.path.join(page_dir, "index.html") + "?demo=" + DEMO
    dom = chromium_dom(a.chromium, demo_url, ["--window-size=1400,2600"])
    sections = {
        "phase bars": r'<div id="phases"[^>]*>\s*<div>floor',
        "timeline SVG": r'<div id="timeline"[^>]*>\s*<svg',
        "device fit table": r'<div id="fit"[^>]*><table>.*?H200',
        "largest micro-batch": r'<div id="maxbatch"[^>]*><table>.*?largest micro-batch',
        "serving pool": r'<div id="serve"[^>]*><table>.*?KV pool',
    }
    missing = [name for name, pattern in sections.items() if not re.search(pattern, dom, re.S)]
    if missing:
        err = re.search(r'<pre id="error"[^>]*>(.*?)</pre>', dom, re.S)
        fail(f"the page with {DEMO} shows no {', '.join(missing)}" + (f" (error: {html.unescape(err.group(1))[:300]})" if err else ""))
    shot = os.path.join(build_dir, "screenshot.png")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([a.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,2600",
                        f"--screenshot={shot}", demo_url], capture_output=True, timeout=300)
    if not os.path.exists(shot) or os.path.getsize(shot) < 10000:
        fail(f"no screenshot at {shot}")
    print(f"web_check: the page with {DEMO} shows every section; screenshot {shot}")

    # -- load time from disk, in the page (performance.now() when the module is ready)
    loads = [pre_json(chromium_dom(a.chromium, "file://" + os.path.join(page_dir, "index.html")), "mb-load-ms")
             for _ in range(3)]
    if any("error" in l for l in loads):
        fail("the module failed to load: " + str(loads))
    median = statistics.median(l["load_ms"] for l in loads)
    print("web_check: module ready in " + ", ".join(f"{l['load_ms']:.0f}" for l in loads) +
          f" ms from navigation (median {median:.0f}; WebAssembly compile and start "
          f"{statistics.median(l['module_ms'] for l in loads):.0f} ms)")
    if median >= MAX_LOAD_MS:
        fail(f"the page takes {median:.0f} ms to load, not under {MAX_LOAD_MS:.0f}")
    print(f"web_check: OK in {time.monotonic() - t_start:.1f} s")


if __name__ == "__main__":
    main()
