#!/usr/bin/env python3
"""build-hybrid benchmark, side by side on the same input in one run:
    qforge build-hybrid   vs   cp -r of the INT4 input   vs   the Python baseline
(bench/hybrid_baseline.py: safetensors load_file/save_file per shard, index rebuilt).

On a filesystem that shares extents (XFS, btrfs) `cp -r` reflinks and build-hybrid shares the
unchanged tensors' blocks, so two more rows show what writing every byte costs there:
`cp -r --reflink=never`, and build-hybrid without its checksum manifest (the manifest is the
one thing that still reads every byte). The filesystem type is printed with the table.

    hybrid_bench.py --qforge build/bin/qforge --python PY_WITH_TORCH --dir WORKDIR
                    [--preset 35b-a3b] [--layers 8 (0: all)] [--runs 3] [--keep-inputs]
                    [--also OTHER_QFORGE]

Inputs are synthesized with random values (`qforge synth --layout intel-int4 / qwen-fp8`,
same config; build-hybrid runs with --no-check since the two are unrelated values). Each
timing includes a final `sync` (every tool's output on disk), runs alternate between the
tools, and the page cache is warm for all of them alike. Peak RSS comes from wait4().
Prints a table (stdout) with medians and ratios to cp -r; --json for machines.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd):
    """Wall seconds (command + sync) and peak RSS in bytes."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err}")
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0, usage.ru_maxrss * 1024


def used(path):
    """Bytes in use on the filesystem holding path (shared blocks count once), once the
    filesystem has finished freeing what was deleted (XFS frees in the background)."""
    def now():
        st = os.statvfs(path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize
    subprocess.run(["sync", "-f", path], check=True)
    last, steady = now(), 0
    for _ in range(100):
        time.sleep(0.1)
        cur = now()
        steady = steady + 1 if cur == last else 0
        if steady >= 5:
            break
        last = cur
    return last


def du(path):
    return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True).stdout.split()[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qforge", required=True)
    ap.add_argument("--python", required=True, help="a Python with torch and safetensors")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--preset", default="35b-a3b")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of the inputs; 0: all")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep-inputs", action="store_true")
    ap.add_argument("--also", action="append", default=[], metavar="QFORGE",
                    help="another qforge binary: its build-hybrid gets a row too (A/B in one run)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    int4, fp8 = os.path.join(a.dir, "int4"), os.path.join(a.dir, "fp8")
    for path, layout in ((int4, "intel-int4"), (fp8, "qwen-fp8")):
        if not os.path.isdir(path):
            print(f"synthesizing {path} ({a.preset}, {a.layers} layers, {layout})", file=sys.stderr)
            depth = ["--layers", str(a.layers)] if a.layers > 0 else []
            subprocess.run([a.qforge, "synth", path, "--preset", a.preset, "--layout", layout] + depth,
                           check=True, stdout=subprocess.DEVNULL)
    out = os.path.join(a.dir, "out")
    hybrid = [a.qforge, "build-hybrid", "--no-check", "--int4", int4, "--fp8", fp8, "--out", out]
    tools = {
        "cp -r (INT4 input)": ["cp", "-r", int4, out],
        "cp -r --reflink=never": ["cp", "-r", "--reflink=never", int4, out],
        "qforge build-hybrid": hybrid,
        "  --no-checksums": hybrid + ["--no-checksums"],
        "python baseline": [a.python, os.path.join(HERE, "hybrid_baseline.py"), int4, fp8, out],
    }
    for other in a.also:
        tools[f"build-hybrid ({other})"] = [other] + hybrid[1:]
    fs_type = subprocess.run(["stat", "-f", "-c", "%T", a.dir], capture_output=True,
                             text=True).stdout.strip()
    results = {name: {"seconds": [], "rss": []} for name in tools}
    out_bytes, disk_bytes = {}, {}
    for run in range(a.runs):
        for name, cmd in tools.items():
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            before = used(a.dir)
            s, rss = timed(cmd)
            results[name]["seconds"].append(s)
            results[name]["rss"].append(rss)
            out_bytes[name] = du(out)
            disk_bytes[name] = used(a.dir) - before
            print(f"run {run + 1}/{a.runs} {name}: {s:.2f} s, peak RSS {rss / 2**20:.0f} MiB",
                  file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    if not a.keep_inputs:
        shutil.rmtree(int4)
        shutil.rmtree(fp8)
    cp = statistics.median(results["cp -r (INT4 input)"]["seconds"])
    qf = statistics.median(results["qforge build-hybrid"]["seconds"])
    rows = []
    for name, r in results.items():
        med = statistics.median(r["seconds"])
        rows.append({"tool": name, "median_s": med, "min_s": min(r["seconds"]), "max_s": max(r["seconds"]),
                     "vs_cp": med / cp, "vs_qforge": med / qf, "peak_rss_bytes": max(r["rss"]),
                     "output_bytes": out_bytes[name], "disk_bytes_used": disk_bytes[name]})
    if a.json:
        print(json.dumps({"preset": a.preset, "layers": a.layers, "runs": a.runs, "filesystem": fs_type,
                          "rows": rows}, indent=2))
        return
    depth = f"{a.layers} layers" if a.layers > 0 else "all layers"
    print(f"build-hybrid benchmark: {a.preset}, {depth}, {a.runs} runs, warm cache, each + sync, "
          f"filesystem {fs_type}")
    width = max(22, max(len(name) for name in tools))
    print(f"{'tool':<{width}} {'median s':>9} {'min..max s':>14} {'x cp -r':>8} {'x qforge':>9} {'peak RSS':>10} "
          f"{'output':>10} {'new disk use':>13}")
    for r in rows:
        print(f"{r['tool']:<{width}} {r['median_s']:>9.2f} {r['min_s']:>6.2f}..{r['max_s']:<6.2f} "
              f"{r['vs_cp']:>8.2f} {r['vs_qforge']:>9.2f} {r['peak_rss_bytes'] / 2**20:>7.0f} MiB "
              f"{r['output_bytes'] / 2**20:>7.0f} MiB {r['disk_bytes_used'] / 2**20:>9.0f} MiB")


if __name__ == "__main__":
    main()
