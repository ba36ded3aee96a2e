#!/usr/bin/env python3
"""The verdict of tests/device/gpu-read-check.sh, from the files it recorded in its OUT directory.

Prints PASS or FAIL for each check, writes the same lines to OUT/verdict.txt, and exits 1 when
any check fails (2 when OUT is not a directory). It reads files only, so it runs anywhere, on a
fresh check or on one recorded earlier (`gpu-read-check.sh --verdict OUT`); the integration test
`tests/tests/gpu_read_check.rs` runs it against recorded good and bad outputs.

What OUT holds (written by gpu-read-check.sh):
  pids.txt                 `lightning PID` and `plain PID`, the two training processes
  trained.txt              `lightning RC` and `plain RC`, their exit statuses
  gpus-1.json, gpus-2.json `governor gpus --json` twice, one after the other (`.rc` beside)
  apps-1.csv               nvidia-smi's compute processes right after gpus-1.json
                           (`--query-compute-apps=pid,used_memory --format=csv,noheader,nounits`: MiB)
  cgroup-NAME.txt          /proc/PID/cgroup of each training process, read by the script
  parse-NAME.json          `governor parse --summary` of each log (`.rc` beside)
  settings-before.csv, settings-after.csv   nvidia-smi's device settings before and after
"""

import json
import math
import os
import sys

NAMES = ("lightning", "plain")
MEMORY_TOLERANCE = 0.05


def read(out, name):
    try:
        with open(os.path.join(out, name), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def pairs(text):
    """`NAME VALUE` lines as a dict."""
    result = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            result[parts[0]] = parts[1]
    return result


def rc(out, name):
    text = read(out, name)
    return text.strip() if text is not None else "missing"


def gpus(out, name):
    """`governor gpus --json` as a list of GPUs, or an error string."""
    text = read(out, name)
    if text is None:
        return f"{name} missing"
    status = rc(out, name.replace(".json", ".rc"))
    if status != "0":
        return f"`governor gpus --json` exited {status}: {(read(out, name.replace('.json', '.err')) or '').strip()[:300]}"
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"{name} is not JSON: {e}"
    if not isinstance(value, list):
        return f"{name} is not a list of GPUs"
    return value


def process_of(gpu_list, pid):
    """(gpu, process) of `pid` in `governor gpus --json`, or None."""
    for gpu in gpu_list:
        for p in gpu.get("processes") or []:
            if p.get("pid") == pid:
                return gpu, p
    return None


def nvidia_smi_mib(out):
    """nvidia-smi's used memory per pid, MiB."""
    result = {}
    for line in (read(out, "apps-1.csv") or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            try:
                result[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    return result


def cgroup_paths(text):
    """The paths of a /proc/PID/cgroup file's lines (`ID:CONTROLLERS:PATH`)."""
    return {line.split(":", 2)[2] for line in (text or "").splitlines() if line.count(":") >= 2}


def check_all(out):
    """[(name, passed, detail)] for every check."""
    checks = []
    pids = {k: int(v) for k, v in pairs(read(out, "pids.txt")).items() if v.isdigit()}
    missing_pids = [n for n in NAMES if n not in pids]
    first, second = gpus(out, "gpus-1.json"), gpus(out, "gpus-2.json")

    # Both training processes found by `governor gpus`.
    if missing_pids:
        checks.append(("found", False, f"pids.txt lacks {', '.join(missing_pids)}"))
    elif isinstance(first, str):
        checks.append(("found", False, first))
    else:
        absent = [f"{n} (pid {pids[n]})" for n in NAMES if process_of(first, pids[n]) is None]
        listed = sorted(p.get("pid") for g in first for p in g.get("processes") or [])
        checks.append(
            ("found", not absent,
             f"not listed: {', '.join(absent)}; governor gpus listed pids {listed}" if absent
             else ", ".join(f"{n} pid {pids[n]} on GPU {process_of(first, pids[n])[0].get('index')}" for n in NAMES))
        )
    found = {n: process_of(first, pids[n]) for n in NAMES if n in pids and not isinstance(first, str)}
    found = {n: v for n, v in found.items() if v is not None}

    # Their GPU memory within 5% of nvidia-smi's per-process figure.
    smi = nvidia_smi_mib(out)
    notes, ok = [], len(found) == len(NAMES)
    for n in NAMES:
        if n not in found:
            notes.append(f"{n}: not found by governor gpus")
            continue
        ours = (found[n][1].get("gpu_memory_bytes") or 0) / float(1 << 20)
        theirs = smi.get(pids[n])
        if theirs is None or theirs <= 0:
            ok = False
            notes.append(f"{n}: nvidia-smi lists no memory for pid {pids[n]} (apps-1.csv)")
            continue
        apart = abs(ours - theirs) / theirs
        if apart > MEMORY_TOLERANCE:
            ok = False
        notes.append(f"{n}: governor {ours:.0f} MiB, nvidia-smi {theirs:.0f} MiB ({apart:.1%} apart)")
    checks.append(("memory", ok, "; ".join(notes) + f" (at most {MEMORY_TOLERANCE:.0%} apart)"))

    # Each with its cgroup: the one /proc/PID/cgroup gave the script.
    notes, ok = [], len(found) == len(NAMES)
    for n in NAMES:
        if n not in found:
            notes.append(f"{n}: not found by governor gpus")
            continue
        ours = found[n][1].get("cgroup")
        theirs = cgroup_paths(read(out, f"cgroup-{n}.txt"))
        if not ours or ours not in theirs:
            ok = False
            notes.append(f"{n}: governor says {ours!r}, /proc/{pids[n]}/cgroup has {sorted(theirs)}")
        else:
            notes.append(f"{n}: {ours}")
    checks.append(("cgroup", ok, "; ".join(notes)))

    # Energy counted: more than 0 J over each of the two intervals on every GPU they ran on.
    if isinstance(first, str) or isinstance(second, str):
        checks.append(("energy", False, first if isinstance(first, str) else second))
    elif not found:
        checks.append(("energy", False, "no training process found on any GPU"))
    else:
        notes, ok = [], True
        for index in sorted({g.get("index") for g, _ in found.values()}):
            joules = []
            for read_ in (first, second):
                gpu = next((g for g in read_ if g.get("index") == index), {})
                joules.append(gpu.get("energy_joules_over_interval"))
            if not all(isinstance(j, (int, float)) and j > 0 for j in joules):
                ok = False
            notes.append(f"GPU {index}: {joules[0]} J then {joules[1]} J")
        checks.append(("energy", ok, "; ".join(notes) + " (each must be > 0)"))

    # Both logs parsed by `governor parse --summary`: records found and a loss.
    notes, ok = [], True
    for n in NAMES:
        status = rc(out, f"parse-{n}.rc")
        try:
            summary = json.loads((read(out, f"parse-{n}.json") or "").strip().splitlines()[0])
        except (ValueError, IndexError):
            summary = None
        if status != "0" or not isinstance(summary, dict):
            ok = False
            notes.append(f"{n}: governor parse exited {status}, no summary")
            continue
        records, signal, last = summary.get("records") or 0, summary.get("signal") or "", summary.get("last")
        good = (records > 0 and "loss" in signal.lower()
                and isinstance(last, (int, float)) and math.isfinite(last))
        ok = ok and good
        notes.append(f"{n}: {records} records, {summary.get('format')}, signal {signal or None} last {last}")
    checks.append(("logs", ok, "; ".join(notes)))

    # Both training processes ended well.
    trained = pairs(read(out, "trained.txt"))
    bad = [f"{n} exited {trained.get(n, 'unknown')}" for n in NAMES if trained.get(n) != "0"]
    checks.append(("trained", not bad, "; ".join(bad) if bad else "both exited 0"))

    # Device settings unchanged.
    before, after = read(out, "settings-before.csv"), read(out, "settings-after.csv")
    if not before or not before.strip() or after is None:
        checks.append(("settings", False, "nvidia-smi's settings were not recorded before and after"))
    elif before != after:
        checks.append(("settings", False, f"before: {before.strip()!r}; after: {after.strip()!r}"))
    else:
        checks.append(("settings", True, f"the same before and after ({len(before.splitlines())} GPU(s))"))
    return checks


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(f"usage: {sys.argv[0]} OUT_DIR (the directory gpu-read-check.sh wrote)", file=sys.stderr)
        return 2
    out = sys.argv[1]
    checks = check_all(out)
    lines = [f"{'PASS' if passed else 'FAIL'} {name}: {detail}" for name, passed, detail in checks]
    failed = sum(1 for _, passed, _ in checks if not passed)
    lines.append(f"gpu-read-check: {len(checks) - failed} of {len(checks)} checks passed")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    try:
        with open(os.path.join(out, "verdict.txt"), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
