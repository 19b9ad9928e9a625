#!/usr/bin/env python3
"""Start N ranks of a command the way `resilio run --ntasks N` does, and
record what each rank writes to its pipe, chunk by chunk.

    python3 launch.py --ntasks 2 --out DIR [--split] [--timeout S] -- python trainer.py ...

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
(127.0.0.1) and MASTER_PORT (a free port) in its environment, its own
process group, and a pipe for stdout and stderr together (2>&1), or one pipe
each with --split. DIR/rank<R>.jsonl gets one JSON line per os.read() chunk:
    {"t": seconds since launch, "fd": "out"|"err"|"both", "n": len, "b": repr(bytes)}
DIR/status.json gets each rank's exit status (negative: killed by that
signal) and run time. With --timeout S, ranks still running after S seconds
are sent SIGKILL (their whole process group), recorded as "timed_out".

`python3 capture.py --show DIR/rank0.jsonl` prints a recording.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pump(fd, name, out, lock, t0):
    while True:
        b = os.read(fd, 65536)
        t = time.monotonic() - t0
        with lock:
            if not b:
                out.write(json.dumps({"t": round(t, 4), "fd": name, "eof": True}) + "\n")
                out.flush()
                return
            out.write(json.dumps({"t": round(t, 4), "fd": name, "n": len(b), "b": repr(b)}) + "\n")
            out.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ntasks", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--split", action="store_true")
    p.add_argument("--timeout", type=float, default=0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    os.makedirs(a.out, exist_ok=True)
    port = free_port()
    t0 = time.monotonic()
    ranks = []
    for r in range(a.ntasks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ntasks), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(a.ntasks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = open(os.path.join(a.out, "rank%d.jsonl" % r), "w")
        lock = threading.Lock()
        ro, wo = os.pipe()
        if a.split:
            re_, we = os.pipe()
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=wo,
                                stderr=we if a.split else wo, start_new_session=True)
        os.close(wo)
        threads = [threading.Thread(target=pump, args=(ro, "out" if a.split else "both", out, lock, t0))]
        if a.split:
            os.close(we)
            threads.append(threading.Thread(target=pump, args=(re_, "err", out, lock, t0)))
        for th in threads:
            th.start()
        ranks.append({"proc": proc, "threads": threads, "out": out, "timed_out": False})
    deadline = t0 + a.timeout if a.timeout else None
    while True:
        for x in ranks:
            if "end" not in x and x["proc"].poll() is not None:
                x["end"] = time.monotonic() - t0
        if all("end" in x for x in ranks):
            break
        if deadline and time.monotonic() > deadline:
            for x in ranks:
                if x["proc"].poll() is None:
                    x["timed_out"] = True
                    try:
                        os.killpg(x["proc"].pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            break
        time.sleep(0.05)
    status = []
    for r, x in enumerate(ranks):
        rc = x["proc"].wait()
        status.append({"rank": r, "returncode": rc, "ended": round(x.get("end", time.monotonic() - t0), 3),
                       "timed_out": x["timed_out"]})
    for x in ranks:
        for th in x["threads"]:
            th.join(5)
        x["out"].close()
    with open(os.path.join(a.out, "status.json"), "w") as f:
        json.dump({"cmd": cmd, "ranks": status}, f, indent=1)
    print(json.dumps(status))


if __name__ == "__main__":
    main()
