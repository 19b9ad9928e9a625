"""Cost of the Python client's calls, per call (``python3 benches/client.py``).

Without resilio (no RESILIO_SOCKET) every call returns at once; with it,
``step()`` formats and sends one datagram. Printed next to the cost of a bare
Python function call, which is what "free" means from inside a training loop.
"""

import os
import socket
import sys
import tempfile
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
os.environ.pop("RESILIO_SOCKET", None)
os.environ.pop("RESILIO_CONTROL", None)
import importlib  # noqa: E402

import resilio_client as rc  # noqa: E402

N = 200_000


def per_call(fn, n=N):
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def nothing():
    pass


print("python client, microseconds per call (best of 5 x %d):" % N)
print("  bare python function call          %6.3f" % per_call(nothing))
print("  absent: step(n, loss, compute_s)   %6.3f" % per_call(lambda: rc.step(10, loss=1.0, compute_s=0.1)))
print("  absent: checkpoint_requested()     %6.3f" % per_call(rc.checkpoint_requested))
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "progress.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.setblocking(False)
    control = os.path.join(d, "control")
    with open(control, "w") as f:
        f.write("checkpoint id=1 step=100 reason=operator\n")
    os.environ["RESILIO_SOCKET"] = path
    os.environ["RESILIO_CONTROL"] = control
    rc = importlib.reload(rc)

    def step_and_drain():
        rc.step(10, loss=1.0, compute_s=0.1)
        try:
            rx.recv(4096)
        except BlockingIOError:
            pass

    n = 20_000
    print("  present: step() + receiver recv    %6.3f" % per_call(step_and_drain, n))
    print("  present: checkpoint_requested()    %6.3f" % per_call(rc.checkpoint_requested, n))
