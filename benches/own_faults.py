#!/usr/bin/env python3
"""Robustness figures for resilio's own faults (Python 3 standard library only).

Outside Slurm, `resilio run -- CMD` is local mode with one rank: the process
started (the *launcher*) starts a rank *agent* (`resilio run` again, with
RESILIO_LOCAL_LAUNCHER=single) which starts the *trainer*. The figures:

  kill9     kill -9 of the top-level `resilio run`, of the rank agent, and of
            the trainer, at a random 50-600 ms after start; then: journals
            whole (every line json.loads, a last line without newline is torn),
            `resilio report` exits 0 with an ETTR line, nothing left 2 s later.
  malformed N malformed datagrams on RESILIO_SOCKET: agent RSS, panics,
            exit code after the trainer is stopped with SIGTERM, journal whole.
  garbage   N MiB of hostile stdout (30 MiB without a newline, '\\r' bars,
            binary, step lines): bytes identical?, agent peak RSS, steps seen
            vs printed, wall time vs the same trainer without resilio.
  local     `resilio run --ntasks 2 --max-restarts 3`: kill -9 of rank 1's
            agent at 3 s, and kill -9 of the launcher at 3 s.

Every process of a trial carries a unique marker (in the environment given to
`resilio run`, inherited by all its descendants, and in the trainer's argv);
leftovers are found by scanning /proc for it.

Usage: python3 benches/own_faults.py [--only kill9,malformed,garbage,local]
       [--kill-trials 200] [--agent-kill-trials 100] [--trainer-kill-trials 50]
       [--datagrams 100000] [--garbage-mib 52] [--keep]
"""
import argparse
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "resilio")
MARK_ENV = "RESILIO_MEASURE_MARKER"

# ---------------------------------------------------------------- trainers

FAST_TRAINER = r'''
import os, socket, sys, time
marker, steps = sys.argv[1], int(sys.argv[2])
path = os.environ.get("RESILIO_SOCKET")
s = None
if path:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
for i in range(1, steps + 1):
    print(f"step {i}", flush=True)
    if s is not None:
        try:
            s.sendto(f"step={i} loss=1.0".encode(), path)
        except OSError:
            pass
    time.sleep(0.001)
'''

SLEEP_TRAINER = r'''
import os, signal, sys, time
out, marker = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGTERM, lambda *a: sys.exit(17))
with open(out + ".tmp", "w") as f:
    f.write(f"{os.getpid()}\n{os.environ.get('RESILIO_SOCKET', '')}\n")
os.replace(out + ".tmp", out)
print("step 1", flush=True)
time.sleep(60)
sys.exit(0)
'''

GARBAGE_TRAINER = r'''
import random, sys
side, total, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
MiB = 1 << 20
rnd = random.Random(12345)
out = sys.stdout.buffer
side_f = open(side, "wb")
written = 0
step = 0
def emit(b):
    global written
    out.write(b)
    side_f.write(b)
    written += len(b)
def step_line():
    global step
    step += 1
    emit(b"\nstep %d\n" % step)
CH = 64 * 1024
long_budget = min(30 * MiB, int(total * 30 / 52))
bar_budget = int(total * 10 / 52)
bin_budget = int(total * 10 / 52)
words = b"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod "
segments = []
# three lines of ~10 MiB each, no newline inside
for _ in range(3):
    segments.append(("long", long_budget // 3))
segments.append(("bars", bar_budget))
segments.append(("bin", bin_budget))
rnd.shuffle(segments)
for kind, size in segments:
    done = 0
    if kind == "long":
        pat = (words * (CH // len(words) + 1))[:CH]
        while done < size:
            n = min(CH, size - done)
            emit(pat[:n]); done += n
        step_line()
    elif kind == "bars":
        i, n = 0, 10 ** 9
        while done < size:
            buf = []
            blen = 0
            while blen < CH:
                i += 1
                pct = (i // 1000) % 101
                b = b"\r%3d%%|%-20s| %d/%d [00:01<00:02, 3.2it/s]" % (pct, b"#" * (pct // 5), i, n)
                buf.append(b); blen += len(b)
            chunk = b"".join(buf)
            emit(chunk); done += len(chunk)
            if rnd.random() < 0.1:
                step_line()
        step_line()
    else:
        while done < size:
            n = min(CH, size - done)
            emit(rnd.randbytes(n)); done += n
            step_line()
# the rest: normal step lines, the last line of all a step line
while written < total - 40:
    step_line()
if written < total:
    emit(b"x" * (total - written - 1) + b"\n") if total - written > 1 else emit(b"\n")
step_line()
out.flush(); side_f.close()
with open(side + ".steps", "w") as f:
    f.write(str(step))
'''

TEN_S_TRAINER = r'''
import os, socket, sys, time
marker, steps, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
path = os.environ.get("RESILIO_SOCKET")
for i in range(1, steps + 1):
    time.sleep(interval)
    print(f"step {i}", flush=True)
    if path:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.setblocking(False)
            s.sendto(f"step={i} loss=1.0".encode(), path)
            s.close()
        except OSError:
            pass
'''

# ---------------------------------------------------------------- helpers


def clean_env(state, marker):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RESILIO_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                         "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["RESILIO_STATE_DIR"] = state
    env["RESILIO_SYSTEM_CONFIG"] = ""
    env[MARK_ENV] = marker
    return env


def write_trainer(d, name, text):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        rest = s.rsplit(")", 1)[1].split()
        return rest[0], int(rest[1])  # state, ppid
    except (OSError, IndexError, ValueError):
        return None, None


def alive(pid):
    st, _ = proc_state(pid)
    return st is not None and st != "Z"


def marked(marker):
    """Live (non-zombie) processes carrying the marker in argv or environment."""
    m = marker.encode()
    found = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        pid = int(d)
        hit = False
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if m in f.read():
                        hit = True
                        break
            except OSError:
                pass
        if hit and alive(pid):
            found.append(pid)
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st, pp = proc_state(int(d))
            if pp == pid and st not in (None, "Z"):
                out.append(int(d))
    return out


def status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def kill_all(marker):
    for p in marked(marker):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def job_dir(state, job):
    d = os.path.join(state, "jobs", job)
    if os.path.isdir(d):
        return d
    hits = glob.glob(os.path.join(state, "**", "jobs", job), recursive=True)
    return hits[0] if hits else d


def check_journals(state, job):
    """(files, lines, torn) over every *.jsonl under the job's directory.
    torn: list of (file, line_no, repr of the start of the line)."""
    d = job_dir(state, job)
    files = sorted(glob.glob(os.path.join(d, "**", "*.jsonl"), recursive=True))
    lines = 0
    torn = []
    for fn in files:
        with open(fn, "rb") as f:
            data = f.read()
        parts = data.split(b"\n")
        last_unterminated = parts[-1] != b""
        if not last_unterminated:
            parts = parts[:-1]
        for i, ln in enumerate(parts):
            lines += 1
            bad = False
            try:
                bad = not isinstance(json.loads(ln), dict)
            except ValueError:
                bad = True
            if i == len(parts) - 1 and last_unterminated:
                bad = True
            if bad:
                torn.append((os.path.relpath(fn, state), i + 1, repr(ln[:120])))
    return files, lines, torn


def records(state, job):
    out = []
    for fn in sorted(glob.glob(os.path.join(job_dir(state, job), "**", "*.jsonl"), recursive=True)):
        with open(fn, "rb") as f:
            for ln in f.read().split(b"\n"):
                try:
                    r = json.loads(ln)
                    r["_file"] = os.path.basename(fn)
                    out.append(r)
                except ValueError:
                    pass
    out.sort(key=lambda r: r.get("ts", ""))
    return out


def report(state, job, as_json=False):
    cmd = [BIN, "report", job, "--state-dir", state] + (["--json"] if as_json else [])
    env = clean_env(state, "none")
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return "timeout", "", ""


def panicked(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"panicked")
    except OSError:
        return 0


def table(title, rows):
    print(f"\n== {title}")
    if not rows:
        return
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for j, r in enumerate(rows):
        print("  " + "  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())
        if j == 0:
            print("  " + "  ".join("-" * x for x in w))
    sys.stdout.flush()


# ---------------------------------------------------------------- 1. kill -9


def kill9_trial(base, trainer, job, victim, rnd, notes):
    """victim: 'top' (the `resilio run` started), 'agent' (its rank agent),
    'trainer'. Returns a dict of outcomes."""
    state = os.path.join(base, "state")
    marker = f"rmeasure-{uuid.uuid4().hex}"
    env = clean_env(state, marker)
    errf = os.path.join(base, f"{job}.stderr")
    with open(errf, "wb") as err:
        t0 = time.monotonic()
        top = subprocess.Popen(
            [BIN, "run", "--job-id", job, "--max-restarts", "0", "--", "python3", trainer, marker, "5000"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        wait = rnd.uniform(0.05, 0.6)
        time.sleep(max(0.0, t0 + wait - time.monotonic()))
        target = None
        if victim == "top":
            target = top.pid
        else:
            # the rank agent: the top-level's child running the resilio binary;
            # the trainer: the agent's child running python3
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and target is None:
                for a in children(top.pid):
                    c = cmdline(a)
                    if not c or os.path.basename(c[0].decode(errors="replace")) != "resilio":
                        continue
                    if victim == "agent":
                        target = a
                        break
                    for t in children(a):
                        tc = cmdline(t)
                        if tc and b"python" in os.path.basename(tc[0]) and trainer.encode() in tc:
                            target = t
                            break
                if target is None:
                    time.sleep(0.005)
        if target is None:
            notes.append(f"{job}: no {victim} found to kill (top exit {top.poll()})")
            kill_all(marker)
            top.wait()
            return {"found": False}
        t_kill = time.monotonic()
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
        # until nothing of the trial is alive, at most 2 s after the kill
        left = []
        while True:
            if top.poll() is None:
                pass
            left = marked(marker)
            if not left or time.monotonic() >= t_kill + 2.0:
                break
            time.sleep(0.02)
        left = marked(marker) if left else []
        leftover_desc = []
        for p in left:
            leftover_desc.append(f"{p}:{b' '.join(cmdline(p))[:100].decode(errors='replace')}")
        kill_all(marker)
        try:
            rc = top.wait(timeout=10)
        except subprocess.TimeoutExpired:
            top.kill()
            rc = top.wait()
    files, lines, torn = check_journals(state, job)
    rrc, rout, rerr = report(state, job)
    ettr = any("ETTR" in ln for ln in rout.splitlines())
    res = {
        "found": True, "wait_ms": int(wait * 1000), "rc": rc, "files": len(files), "lines": lines,
        "torn": torn, "report_ok": rrc == 0 and ettr, "report_rc": rrc,
        "report_err": rerr.strip()[:300], "leftover": leftover_desc, "panics": panicked(errf),
    }
    if torn:
        notes.append(f"{job} ({victim}, killed at {res['wait_ms']} ms): torn {torn}")
    if not res["report_ok"]:
        notes.append(f"{job} ({victim}): report rc={rrc} ETTR line={ettr} stderr={rerr.strip()[:300]!r}")
    if leftover_desc:
        notes.append(f"{job} ({victim}): alive 2 s after the kill: {leftover_desc}")
    if res["panics"]:
        notes.append(f"{job} ({victim}): 'panicked' on stderr, see {errf}")
    return res


def fig_kill9(base, counts, seed=1):
    rnd = random.Random(seed)
    d = os.path.join(base, "kill9")
    os.makedirs(d)
    trainer = write_trainer(d, "fast_trainer.py", FAST_TRAINER)
    notes = []
    rows = [["victim (SIGKILL)", "trials", "torn records", "report failures", "leftover trials",
             "panics", "journal lines", "exit codes of `resilio run`", "secs"]]
    for victim, n in counts:
        if n <= 0:
            continue
        t0 = time.monotonic()
        res = [kill9_trial(d, trainer, f"{victim[0]}{i}", victim, rnd, notes) for i in range(n)]
        ok = [r for r in res if r["found"]]
        codes = {}
        for r in ok:
            codes[r["rc"]] = codes.get(r["rc"], 0) + 1
        rows.append([
            {"top": "top-level resilio run", "agent": "rank agent", "trainer": "trainer"}[victim],
            f"{len(ok)}/{n}",
            sum(len(r["torn"]) for r in ok),
            sum(1 for r in ok if not r["report_ok"]),
            sum(1 for r in ok if r["leftover"]),
            sum(1 for r in ok if r["panics"]),
            sum(r["lines"] for r in ok),
            " ".join(f"{k}:{v}" for k, v in sorted(codes.items(), key=lambda kv: str(kv[0]))),
            f"{time.monotonic() - t0:.0f}",
        ])
    table("1. kill -9 (random 50-600 ms after start; --max-restarts 0)", rows)
    for n in notes[:40]:
        print("  ! " + n)
    if len(notes) > 40:
        print(f"  ! ... {len(notes) - 40} more")


# ---------------------------------------------------------------- 2. malformed datagrams


def malformed_payloads(rnd, n):
    huge = [b"step=18446744073709551615", b"step=18446744073709551616", b"step=-1",
            b"step=" + b"9" * 4000, b"step=1e400", b"step=0x10", b"step=NaN", b"step=inf",
            b"step=5 loss=NaN", b"step=6 loss=inf compute_s=-inf", b"step=7 compute_s=1e308",
            b"v=0 step=1", b"v=NaN", b"v=99999999999999999999 step=3", b"checkpoint_done=18446744073709551615",
            b"phase=checkpoint step=18446744073709551615", b"phase=" + b"a" * 7000,
            b"", b"\n", b"\x00" * 100, b"step=\xff\xfe", b"=", b"==", b"step==1", b"step= 1"]
    jsons = [b'{"step": 1, "loss": 2.0, "phase": "compute"}', b'{"step": 18446744073709551615}',
             b'[{"a": [1, 2, {"b": null}]}]']
    kinds = 0
    for i in range(n):
        k = i % 10
        if k in (0, 1, 2):  # random bytes 0-2000 long
            yield rnd.randbytes(rnd.randint(0, 2000))
        elif k == 3:  # truncated JSON
            j = rnd.choice(jsons)
            yield j[:rnd.randint(0, len(j) - 1)]
        elif k == 4:  # huge numbers, NaN, bad versions
            yield rnd.choice(huge)
        elif k == 5:  # deep nesting (JSON and brackets), sometimes over 8 KiB
            depth = rnd.choice([10, 100, 1000, 4000, 20000])
            yield b'{"a":' * depth + b"1" + b"}" * depth if rnd.random() < 0.5 else b"[" * depth
        elif k == 6:  # many tokens, random metric keys (bounded state?)
            yield b" ".join(b"k%d=%d" % (rnd.randrange(10 ** 9), rnd.randrange(100)) for _ in range(rnd.randint(1, 200)))
        elif k == 7:  # random phase names, valid charset (each unknown one is new)
            yield b"phase=p%d step=%d" % (rnd.randrange(10 ** 12), rnd.randrange(10 ** 6))
        elif k == 8:  # bare words, random printable
            yield bytes(rnd.randrange(32, 127) for _ in range(rnd.randint(1, 300)))
        else:  # over 8 KiB
            yield rnd.randbytes(rnd.choice([8193, 9000, 16384, 65000]))
        kinds += 1


def fig_malformed(base, n, seed=2):
    d = os.path.join(base, "malformed")
    os.makedirs(d)
    state = os.path.join(d, "state")
    trainer = write_trainer(d, "sleep_trainer.py", SLEEP_TRAINER)
    marker = f"rmeasure-{uuid.uuid4().hex}"
    ready = os.path.join(d, "ready")
    errf = os.path.join(d, "stderr")
    job = "malformed"
    err = open(errf, "wb")
    top = subprocess.Popen([BIN, "run", "--job-id", job, "--max-restarts", "0", "--", "python3", trainer, ready, marker],
                           env=clean_env(state, marker), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 20
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(ready) as f:
        tpid, sock = f.read().split("\n")[:2]
    tpid = int(tpid)
    _, agent = proc_state(tpid)  # the rank agent: the trainer's parent
    time.sleep(1.0)
    before = status_kb(agent, "VmRSS")
    before_top = status_kb(top.pid, "VmRSS")
    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            v = status_kb(agent, "VmRSS")
            if v:
                samples.append(v)
            time.sleep(0.05)
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    rnd = random.Random(seed)
    sent = dropped = retries = 0
    t0 = time.monotonic()
    for payload in malformed_payloads(rnd, n):
        tries = 0
        while True:
            try:
                s.sendto(payload, sock)
                sent += 1
                break
            except (BlockingIOError, InterruptedError):
                tries += 1
                retries += 1
                if tries > 2000:  # ~2 s of a full queue: give this one up
                    dropped += 1
                    break
                time.sleep(0.001)
            except OSError as e:
                if e.errno in (105, 11):  # ENOBUFS, EAGAIN
                    tries += 1
                    retries += 1
                    if tries > 2000:
                        dropped += 1
                        break
                    time.sleep(0.001)
                else:  # EMSGSIZE etc: the kernel refused it, not resilio
                    dropped += 1
                    break
    send_s = time.monotonic() - t0
    time.sleep(1.0)
    stop.set()
    th.join()
    after = status_kb(agent, "VmRSS")
    hwm = status_kb(agent, "VmHWM")
    top_hwm = status_kb(top.pid, "VmHWM")
    agent_alive = alive(agent)
    os.kill(tpid, signal.SIGTERM)
    try:
        rc = top.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = "timeout"
        kill_all(marker)
        top.wait()
    err.close()
    files, lines, torn = check_journals(state, job)
    recs = records(state, job)
    rexit = [r for r in recs if r.get("kind") == "rank_exit"]
    mal = [r for r in recs if r.get("kind") == "malformed_message"]
    unk = [r for r in recs if r.get("kind") == "unknown_phase"]
    time.sleep(0.5)
    left = marked(marker)
    kill_all(marker)
    rows = [["figure", "value"],
            ["datagrams generated", n],
            ["datagrams sent (accepted by the kernel)", sent],
            ["refused by the kernel (EMSGSIZE) or gave up", dropped],
            ["EAGAIN/ENOBUFS retries", retries],
            ["send time", f"{send_s:.1f} s ({sent / max(send_s, 1e-9):.0f}/s)"],
            ["rank agent RSS before / peak sampled / after", f"{before} / {max(samples) if samples else '?'} / {after} kB"],
            ["rank agent VmHWM at the end", f"{hwm} kB"],
            ["top-level resilio run RSS before / VmHWM end", f"{before_top} / {top_hwm} kB"],
            ["agent alive after the flood", "yes" if agent_alive else "NO"],
            ["panics ('panicked' on stderr)", panicked(errf)],
            ["exit code of resilio run (trainer exits 17 on SIGTERM)", rc],
            ["rank_exit exit_code / malformed_messages",
             " ".join(f"{r.get('exit_code')}/{r.get('malformed_messages')}" for r in rexit) or "none"],
            ["malformed_message / unknown_phase records", f"{len(mal)} / {len(unk)}"],
            ["journal lines / torn", f"{lines} / {len(torn)}"],
            ["processes left 0.5 s after exit", len(left)]]
    table(f"2. malformed datagrams ({n})", rows)
    if torn:
        print(f"  ! torn: {torn[:5]}")


# ---------------------------------------------------------------- 3. garbage output


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def fig_garbage(base, mib):
    d = os.path.join(base, "garbage")
    os.makedirs(d)
    state = os.path.join(d, "state")
    trainer = write_trainer(d, "garbage_trainer.py", GARBAGE_TRAINER)
    total = mib << 20
    # without resilio
    marker0 = f"rmeasure-{uuid.uuid4().hex}"
    side0 = os.path.join(d, "side0")
    out0 = os.path.join(d, "out0")
    t0 = time.monotonic()
    with open(out0, "wb") as o:
        subprocess.run(["python3", trainer, side0, str(total), marker0], stdout=o,
                       env=clean_env(state, marker0), check=True)
    bare_s = time.monotonic() - t0
    # with resilio
    marker = f"rmeasure-{uuid.uuid4().hex}"
    side = os.path.join(d, "side")
    outp = os.path.join(d, "out")
    errf = os.path.join(d, "stderr")
    job = "garbage"
    samples = {}
    stop = threading.Event()
    with open(outp, "wb") as o, open(errf, "wb") as e:
        t0 = time.monotonic()
        top = subprocess.Popen([BIN, "run", "--job-id", job, "--max-restarts", "0", "--", "python3", trainer, side, str(total), marker],
                               env=clean_env(state, marker), stdin=subprocess.DEVNULL, stdout=o, stderr=e)

        def sampler():
            while not stop.is_set():
                pids = [top.pid] + children(top.pid)
                for p in pids:
                    c = cmdline(p)
                    if not c or os.path.basename(c[0].decode(errors="replace")) != "resilio":
                        continue
                    role = "top" if p == top.pid else "agent"
                    rss, hwm = status_kb(p, "VmRSS"), status_kb(p, "VmHWM")
                    cur = samples.setdefault(role, [0, 0])
                    if rss:
                        cur[0] = max(cur[0], rss)
                    if hwm:
                        cur[1] = max(cur[1], hwm)
                time.sleep(0.05)
        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        try:
            rc = top.wait(timeout=600)
        except subprocess.TimeoutExpired:
            rc = "timeout"
            kill_all(marker)
            top.wait()
        wall = time.monotonic() - t0
        stop.set()
        th.join()
    size_in = os.path.getsize(side)
    size_out = os.path.getsize(outp)
    same = sha256_file(side) == sha256_file(outp)
    first_diff = None
    if not same:
        with open(side, "rb") as a, open(outp, "rb") as b:
            off = 0
            while True:
                x, y = a.read(1 << 16), b.read(1 << 16)
                if x != y:
                    for i in range(min(len(x), len(y))):
                        if x[i] != y[i]:
                            break
                    else:
                        i = min(len(x), len(y))
                    first_diff = off + i
                    break
                if not x:
                    break
                off += len(x)
    with open(side + ".steps") as f:
        printed = int(f.read())
    recs = records(state, job)
    rexit = [r for r in recs if r.get("kind") == "rank_exit"]
    files, lines, torn = check_journals(state, job)
    jsize = sum(os.path.getsize(f) for f in files)
    left = marked(marker)
    kill_all(marker)
    rows = [["figure", "value"],
            ["bytes written by the trainer", size_in],
            ["bytes out of resilio run's stdout", size_out],
            ["sha256 identical", "yes" if same else f"NO (first difference at byte {first_diff})"],
            ["rank agent peak VmRSS / VmHWM (50 ms samples)", "%s / %s kB" % tuple(samples.get("agent", ["?", "?"]))],
            ["top-level resilio run peak VmRSS / VmHWM", "%s / %s kB" % tuple(samples.get("top", ["?", "?"]))],
            ["steps printed by the trainer", printed],
            ["rank_exit last_step / steps_seen",
             " ".join(f"{r.get('last_step')}/{r.get('steps_seen')}" for r in rexit) or "none"],
            ["exit code", rc],
            ["wall: with resilio / without / ratio", f"{wall:.2f} s / {bare_s:.2f} s / {wall / bare_s:.2f}"],
            ["panics", panicked(errf)],
            ["journal bytes / lines / torn", f"{jsize} / {lines} / {len(torn)}"],
            ["processes left", len(left)]]
    table(f"3. garbage output ({mib} MiB)", rows)


# ---------------------------------------------------------------- 4. local launcher


def rank_agents(launcher, marker):
    """{rank: pid} of the `resilio run` processes whose environment has RANK=r."""
    out = {}
    for p in marked(marker):
        c = cmdline(p)
        if not c or os.path.basename(c[0].decode(errors="replace")) != "resilio" or p == launcher:
            continue
        env = environ(p)
        if b"RANK" in env and b"RESILIO_LOCAL_LAUNCHER" in env:
            out[int(env[b"RANK"])] = p
    return out


def local_case(d, trainer, job, victim):
    state = os.path.join(d, "state")
    marker = f"rmeasure-{uuid.uuid4().hex}"
    errf = os.path.join(d, f"{job}.stderr")
    err = open(errf, "wb")
    t0 = time.monotonic()
    top = subprocess.Popen([BIN, "run", "--job-id", job, "--ntasks", "2", "--max-restarts", "3", "--",
                            "python3", trainer, marker, "100", "0.1"],
                           env=clean_env(state, marker), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=err)
    time.sleep(3.0)
    agents = rank_agents(top.pid, marker)
    killed = agents.get(1) if victim == "rank1" else top.pid
    note = f"ranks' agents {agents}"
    if killed:
        os.kill(killed, signal.SIGKILL)
    if victim == "rank1":
        try:
            rc = top.wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        end = time.monotonic()
    else:
        rc = top.wait()
        # the ranks train on: wait for the job_end (rank 0's agent writes it)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(r.get("kind") == "job_end" for r in records(state, job)) and not rank_agents(0, marker):
                break
            time.sleep(0.1)
        end = time.monotonic()
    wall = end - t0
    time.sleep(5.0)
    left = marked(marker)
    left_desc = [f"{p}:{b' '.join(cmdline(p))[:80].decode(errors='replace')}" for p in left]
    kill_all(marker)
    if rc == "timeout":
        top.wait()
    err.close()
    recs = records(state, job)
    rexit = [r for r in recs if r.get("kind") == "rank_exit"]
    restarts = [r for r in recs if r.get("kind") == "restart"]
    judg = [r for r in recs if r.get("kind") == "judgment"]
    failures = [r for r in recs if r.get("kind") == "failure"]
    jend = [r for r in recs if r.get("kind") == "job_end"]
    files, lines, torn = check_journals(state, job)
    rrc, rout, rerr = report(state, job)
    rep_lines = [ln.strip() for ln in rout.splitlines() if "ETTR" in ln or "estart" in ln or "ttempt" in ln]
    return {
        "victim": victim, "killed": killed, "note": note, "rc": rc, "wall": wall,
        "rank_exits": [(r.get("attempt"), r.get("rank"), r.get("exit_code"), r.get("cause")) for r in rexit],
        "restarts": len(restarts),
        "judgments": [(r.get("attempt"), r.get("class"), r.get("primary_rank"), r.get("why")) for r in judg],
        "failures": [(r.get("attempt"), r.get("rank"), r.get("failure_kind"), r.get("cause")) for r in failures],
        "job_end": [r.get("exit_code") for r in jend],
        "left": left_desc, "torn": torn, "lines": lines, "report_rc": rrc, "report": rep_lines[:6],
        "panics": panicked(errf),
    }


def fig_local(base):
    d = os.path.join(base, "local")
    os.makedirs(d)
    trainer = write_trainer(d, "ten_s_trainer.py", TEN_S_TRAINER)
    rows = [["kill -9 at 3 s of", "launcher exit", "restart records", "judgment (attempt, class, rank, why)",
             "job_end exit_code", "rank_exit (attempt, rank, code, cause)", "left after 5 s", "torn", "panics", "secs"]]
    extra = []
    for victim, job in (("rank1", "localrank1"), ("launcher", "locallauncher")):
        r = local_case(d, trainer, job, victim)
        rows.append([
            "rank 1's agent" if victim == "rank1" else "the launcher",
            r["rc"], r["restarts"],
            "; ".join(f"{a},{c},{p},{w}" for a, c, p, w in r["judgments"]) or "none",
            ",".join(str(x) for x in r["job_end"]) or "NONE",
            "; ".join(f"{a},{k},{c},{u}" for a, k, c, u in r["rank_exits"]) or "none",
            len(r["left"]), len(r["torn"]), r["panics"], f"{r['wall']:.0f}",
        ])
        extra.append(f"{victim}: killed pid {r['killed']} ({r['note']}); failures {r['failures']}; "
                     f"report rc={r['report_rc']}: {r['report']}")
        if r["left"]:
            extra.append(f"{victim}: left: {r['left']}")
        if r["torn"]:
            extra.append(f"{victim}: torn: {r['torn'][:5]}")
    table("4. local launcher (--ntasks 2 --max-restarts 3, trainer of 100 steps x 0.1 s)", rows)
    for e in extra:
        print("  . " + e)


# ---------------------------------------------------------------- main


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="kill9,malformed,garbage,local")
    p.add_argument("--kill-trials", type=int, default=200, help="kill -9 of the top-level resilio run")
    p.add_argument("--agent-kill-trials", type=int, default=100, help="kill -9 of the rank agent")
    p.add_argument("--trainer-kill-trials", type=int, default=50)
    p.add_argument("--datagrams", type=int, default=100_000)
    p.add_argument("--garbage-mib", type=int, default=52)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = p.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} missing: cargo build --release first")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], stdout=subprocess.PIPE, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "src"], stdout=subprocess.PIPE, text=True).stdout.strip()
    ver = subprocess.run([BIN, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    print(f"commit {commit}{' (src modified)' if dirty else ''}; {ver}; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; "
          f"{os.cpu_count()} cpus; load {os.getloadavg()[0]:.2f}")
    base = tempfile.mkdtemp(prefix="resilio-own-faults-")
    t0 = time.monotonic()
    try:
        only = a.only.split(",")
        if "kill9" in only:
            fig_kill9(base, [("top", a.kill_trials), ("agent", a.agent_kill_trials), ("trainer", a.trainer_kill_trials)])
        if "malformed" in only:
            fig_malformed(base, a.datagrams)
        if "garbage" in only:
            fig_garbage(base, a.garbage_mib)
        if "local" in only:
            fig_local(base)
    finally:
        print(f"\ntotal {time.monotonic() - t0:.0f} s; temp dir {base}{' kept' if a.keep else ' removed'}")
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
