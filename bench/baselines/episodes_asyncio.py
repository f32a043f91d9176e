#!/usr/bin/env python3
"""The baseline for bench/episodes.lua: the hello environment's episodes run
the way a Python harness with a local runtime runs them. asyncio drives the
concurrency; each sandbox is a temporary directory mounted as /app in a
fresh `bwrap` (new namespaces, host system directories read-only) for every
command; file reads and writes go straight to that directory on the host
(cheaper than a harness that execs `cat`, so the comparison favours Python).
Every episode does what envs/hello.lua does: empty /app and write the task's
files with file operations (setup), run the reference solution (agent), inspect /app (score),
remove the box (cleanup), and append its trace and result as JSON lines.

usage: episodes_asyncio.py [-n EPISODES] [-c CONCURRENCY] [--out DIR]
prints one JSON line: {"episodes", "seconds", "episodes_per_s", "mean_reward"}
"""
import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time

WORDS = ["pear", "apple", "fig", "apple", "kiwi", "pear", "banana", "fig", "cherry"]
LOG = "\n".join(["INFO start", "ERROR disk full", "INFO retry", "WARN slow", "ERROR disk full",
                 "INFO done", "ERROR timeout", ""])

TASKS = [
    {"id": "hello-file", "solution": "printf 'Hello, world!\\n' > /app/hello.txt"},
    {"id": "count-errors", "files": {"app.log": LOG},
     "solution": "grep -c '^ERROR' /app/app.log > /app/errors.txt"},
    {"id": "sort-words", "files": {"words.txt": "\n".join(WORDS) + "\n"},
     "solution": "sort -u /app/words.txt > /app/sorted.txt"},
    {"id": "greet-script",
     "solution": "printf '#!/bin/sh\\necho \"hi $1\"\\n' > /app/greet.sh && chmod +x /app/greet.sh"},
    {"id": "tree", "solution": "mkdir -p /app/project/src /app/project/docs && touch /app/project/README.md"},
]

BWRAP = ["bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
         "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc",
         "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--unshare-all", "--die-with-parent",
         "--new-session"]


async def sandbox_exec(box, cmd, trace, timeout=30):
    argv = BWRAP + ["--bind", box, "/app", "--chdir", "/app"]
    argv += ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else cmd
    t0 = time.monotonic()
    p = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                             stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(p.communicate(), timeout)
    except asyncio.TimeoutError:
        p.kill()
        out, err = await p.communicate()
    trace.append({"t": time.time(), "kind": "exec", "data": {
        "cmd": cmd, "code": p.returncode, "duration": time.monotonic() - t0,
        "stdout": out.decode(errors="replace")[:4096], "stderr": err.decode(errors="replace")[:4096]}})
    return p.returncode, out.decode(errors="replace")


def read(box, name):
    try:
        with open(os.path.join(box, name)) as f:
            return f.read().rstrip()
    except OSError:
        return None


async def score(task, box, trace):
    tid = task["id"]
    if tid == "hello-file":
        return read(box, "hello.txt") == "Hello, world!"
    if tid == "count-errors":
        return read(box, "errors.txt") == "3"
    if tid == "sort-words":
        return read(box, "sorted.txt") == "\n".join(sorted(set(WORDS)))
    if tid == "greet-script":
        code, out = await sandbox_exec(box, ["/app/greet.sh", "ada"], trace)
        return code == 0 and out.rstrip() == "hi ada"
    code, _ = await sandbox_exec(box, "test -d /app/project/src && test -d /app/project/docs && "
                                      "test -f /app/project/README.md", trace)
    return code == 0


async def episode(i, out_dir, results):
    task = TASKS[i % len(TASKS)]
    trace = [{"t": time.time(), "kind": "start", "data": {"task": task["id"], "rollout": i // len(TASKS)}}]
    phases = {}
    t0 = time.monotonic()
    box = tempfile.mkdtemp(prefix="hello-")                      # provision
    phases["provision"] = time.monotonic() - t0
    try:
        t = time.monotonic()                                     # setup
        for name in os.listdir(box):                             # empty /app, as hello does
            path = os.path.join(box, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        for name, data in task.get("files", {}).items():
            with open(os.path.join(box, name), "w") as f:
                f.write(data)
        phases["setup"] = time.monotonic() - t
        t = time.monotonic()                                     # agent
        await sandbox_exec(box, task["solution"], trace, timeout=120)
        phases["agent"] = time.monotonic() - t
        t = time.monotonic()                                     # score
        reward = 1 if await score(task, box, trace) else 0
        phases["score"] = time.monotonic() - t
    finally:
        t = time.monotonic()                                     # cleanup
        shutil.rmtree(box, ignore_errors=True)
        phases["cleanup"] = time.monotonic() - t
    eid = f"{task['id']}.r{i // len(TASKS)}"
    with open(os.path.join(out_dir, "traces", eid + ".jsonl"), "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in trace))
    rec = {"id": eid, "task": task["id"], "reward": reward, "status": "ok", "phases": phases,
           "duration": time.monotonic() - t0}
    with open(os.path.join(out_dir, "episodes.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
    results.append(reward)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("-c", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out_dir = a.out or tempfile.mkdtemp(prefix="hello-run-")
    os.makedirs(os.path.join(out_dir, "traces"), exist_ok=True)
    sem = asyncio.Semaphore(a.c)
    results = []

    async def bounded(i):
        async with sem:
            await episode(i, out_dir, results)

    t0 = time.monotonic()
    await asyncio.gather(*(bounded(i) for i in range(a.n)))
    secs = time.monotonic() - t0
    if not a.out:
        shutil.rmtree(out_dir, ignore_errors=True)
    print(json.dumps({"episodes": len(results), "seconds": secs, "episodes_per_s": len(results) / secs,
                      "mean_reward": sum(results) / max(len(results), 1)}))


if __name__ == "__main__":
    asyncio.run(main())
