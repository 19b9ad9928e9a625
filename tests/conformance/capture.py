#!/usr/bin/env python3
"""Record what arrives on a pipe, chunk by chunk, with arrival times.

    python trainer.py 2>&1 | python3 capture.py out.jsonl
    python trainer.py 2>err.txt | python3 capture.py out.jsonl   # stdout only

Each os.read() chunk becomes one JSON line:
    {"t": <seconds since capture start, monotonic>, "n": <len>, "b": "<repr of the bytes>"}
The bytes are also passed through to our stdout unchanged, so a terminal
still sees the output. A final line {"t": ..., "eof": true} marks EOF.

`python3 capture.py --show out.jsonl` prints the chunks as `t  repr` lines.

`python3 capture.py --export REC.jsonl PREFIX` turns a recording (ours or
launch.py's) into PREFIX.bin (the bytes, concatenated) and PREFIX.tsv (one
line per chunk: `t<TAB>fd<TAB>len`, t in seconds), as kept under
captures/. Runs of more than 4 chunks that are each one bare progress frame
(b"\r..." with no newline, or b"\n\r..." for a nested bar) or a lone b"\n"
are cut to their first and last 2 chunks; a line
`# elided <n> frame chunks (<bytes> bytes)` in the .tsv marks each cut, so the
.bin stays a valid (shorter) stream. A chunk longer than 1500 bytes (a
traceback) keeps its first 300 and last 500 bytes around a line
`[... <n> bytes elided by capture.py ...]`, also marked in the .tsv.
`--show PREFIX.bin` prints it back.
"""
import ast
import json
import os
import re
import sys
import time

FRAME = re.compile(rb"^\n?(\r[^\n]*)?$")


def load(path):
    """[(t, fd, bytes)] and the EOF time, from a .jsonl recording or a .bin + .tsv."""
    if path.endswith(".bin"):
        data = open(path, "rb").read()
        out, off = [], 0
        for line in open(path[:-4] + ".tsv"):
            if line.startswith("#"):
                out.append((None, "#", line.strip().encode()))
                continue
            t, fd, n = line.split("\t")
            out.append((float(t), fd, data[off:off + int(n)]))
            off += int(n)
        return out
    out = []
    for line in open(path):
        r = json.loads(line)
        if r.get("eof"):
            out.append((r["t"], r.get("fd", "both"), None))
        else:
            out.append((r["t"], r.get("fd", "both"), ast.literal_eval(r["b"])))
    return out


def export(rec, prefix, keep=2):
    chunks = load(rec)
    kept, run = [], []

    def flush_run():
        if len(run) > 2 * keep:
            cut = run[keep:-keep]
            kept.extend(run[:keep])
            kept.append((None, "#", b"# elided %d frame chunks (%d bytes)"
                         % (len(cut), sum(len(c[2]) for c in cut))))
            kept.extend(run[-keep:])
        else:
            kept.extend(run)
        run.clear()

    for c in chunks:
        if c[2] is not None and FRAME.match(c[2]):
            run.append(c)
            continue
        flush_run()
        if c[2] is not None and len(c[2]) > 1500:
            n = len(c[2]) - 800
            kept.append((None, "#", b"# next chunk: %d bytes elided in its middle" % n))
            c = (c[0], c[1], c[2][:300] + b"\n[... %d bytes elided by capture.py ...]\n" % n + c[2][-500:])
        kept.append(c)
    flush_run()
    with open(prefix + ".bin", "wb") as b, open(prefix + ".tsv", "w") as t:
        for tm, fd, data in kept:
            if fd == "#":
                t.write(data.decode() + "\n")
            elif data is None:
                t.write("# eof %s at %.3f\n" % (fd, tm))
            else:
                b.write(data)
                t.write("%.3f\t%s\t%d\n" % (tm, fd, len(data)))


def show(path):
    for t, fd, data in load(path):
        if fd == "#":
            print("           %s" % data.decode())
        elif data is None:
            print("%9.3f %-4s <EOF>" % (t, fd))
        else:
            print("%9.3f %-4s %r" % (t, fd, data))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--show":
        return show(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] == "--export":
        return export(sys.argv[2], sys.argv[3])
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
