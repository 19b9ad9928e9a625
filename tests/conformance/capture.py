#!/usr/bin/env python3
"""Record what arrives on a pipe, chunk by chunk, with arrival times.

    python trainer.py 2>&1 | python3 capture.py out.jsonl
    python trainer.py 2>err.txt | python3 capture.py out.jsonl   # stdout only

Each os.read() chunk becomes one JSON line:
    {"t": <seconds since capture start, monotonic>, "n": <len>, "b": "<repr of the bytes>"}
The bytes are also passed through to our stdout unchanged, so a terminal
still sees the output. A final line {"t": ..., "eof": true} marks EOF.

`python3 capture.py --show out.jsonl` prints the chunks as `t  repr` lines.
"""
import json
import os
import sys
import time


def show(path):
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("eof"):
                print("%9.3f  <EOF>" % r["t"])
            else:
                print("%9.3f  %s" % (r["t"], r["b"]))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--show":
        return show(sys.argv[2])
    out = open(sys.argv[1], "w")
    t0 = time.monotonic()
    while True:
        b = os.read(0, 65536)
        t = time.monotonic() - t0
        if not b:
            out.write(json.dumps({"t": round(t, 4), "eof": True}) + "\n")
            break
        out.write(json.dumps({"t": round(t, 4), "n": len(b), "b": repr(b)}) + "\n")
        out.flush()
        try:
            os.write(1, b)
        except OSError:
            pass
    out.close()


if __name__ == "__main__":
    main()
