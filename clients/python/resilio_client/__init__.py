"""resilio_client: tell resilio about training progress, and hear its requests.

Standard library only, no build step: put ``clients/python`` on PYTHONPATH
(or ``pip install clients/python``) and::

    import resilio_client as rc

    for step in range(start, total):
        t0 = time.perf_counter()
        loss = train_step()                       # forward + backward, before the optimizer's all-reduce wait if you can
        rc.step(step, loss=loss, compute_s=time.perf_counter() - t0)
        ask = rc.checkpoint_requested()           # the step every rank must save at, or None
        if ask is not None and step >= ask:
            rc.phase("checkpoint")
            save_checkpoint(step)
            rc.checkpoint_done(step)

After a rollback (``[numerical] nan_action`` or ``spike_action =
"rollback"``), ``rc.rollback_step()`` is the checkpoint to load instead of
the latest, and ``rc.skip_step(step)`` is true for the steps whose batches
made the loss diverge::

    start = rc.rollback_step()
    if start is None:
        start = latest_checkpoint_step()
    for step in range(start, total):
        batch = next(data)
        if rc.skip_step(step):
            continue

Every call is a no-op costing well under a microsecond or two when resilio is
absent (no ``RESILIO_SOCKET``), and never raises: a supervisor must never be
the reason training fails. The wire format is docs/progress-protocol.md
(datagrams) and docs/coordinator.md (the control file).
"""

import os
import socket as _socket

__all__ = [
    "active",
    "step",
    "phase",
    "checkpoint_requested",
    "checkpoint_done",
    "send",
    "rollback_step",
    "skip_step",
]

_SOCKET_PATH = os.environ.get("RESILIO_SOCKET") or None
_CONTROL_PATH = os.environ.get("RESILIO_CONTROL") or None


def _rollback_env():
    """(RESILIO_ROLLBACK_STEP, (from, to) of RESILIO_SKIP_STEPS); None where
    absent or malformed."""
    try:
        at = int(os.environ.get("RESILIO_ROLLBACK_STEP", ""))
    except Exception:
        at = None
    skip = None
    try:
        lo, hi = os.environ.get("RESILIO_SKIP_STEPS", "").split("-", 1)
        lo, hi = int(lo), int(hi)
        if 0 <= lo <= hi:
            skip = (lo, hi)
    except Exception:
        pass
    return at, skip


_ROLLBACK_STEP, _SKIP = _rollback_env()
_sock = None
# The control file's identity when last read, and what it asked.
_control_key = None
_asked = None  # (id, step)
_done_step = None


def active():
    """True when running under resilio (a progress socket was given)."""
    return _SOCKET_PATH is not None


def send(message):
    """Send one raw protocol message (``key=value`` pairs). Never blocks, never raises."""
    global _sock
    if _SOCKET_PATH is None:
        return
    try:
        if _sock is None:
            _sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
            _sock.setblocking(False)
        _sock.sendto(message.encode("utf-8", "replace"), _SOCKET_PATH)
    except Exception:
        # resilio gone, queue full, anything: drop the message, keep training.
        pass


def _num(x):
    try:
        x = float(x)
    except Exception:
        return None
    if x != x or x in (float("inf"), float("-inf")):
        return None
    return repr(x)


def step(n, loss=None, compute_s=None, **metrics):
    """Report that step ``n`` finished. ``compute_s``: seconds this rank spent
    computing (not waiting for others); it is what tells a slow rank apart in
    lockstep training. Other keyword arguments are numeric metrics."""
    if _SOCKET_PATH is None:
        return
    try:
        parts = ["step=%d" % int(n)]
        for key, value in (("loss", loss), ("compute_s", compute_s)) + tuple(metrics.items()):
            if value is None:
                continue
            v = _num(value)
            if v is not None and key and "=" not in key and " " not in key:
                parts.append("%s=%s" % (key, v))
        send(" ".join(parts))
    except Exception:
        pass


def phase(name, step=None):
    """Announce a phase.

    Long phases (``checkpoint``, ``save``, ``eval``, ``validation``, and names
    given a limit in ``[stall.phase_timeouts]``) are judged by their own
    timeout, so a long save is not taken for a hang; ``train`` ends one.
    Phases inside a step (``compute``, ``comm``, ``data``, ``forward``,
    ``backward``, ``optimizer``) never extend the step limit: a hang inside
    ``comm`` is still caught. ``phase("compute")`` then ``phase("comm")``
    also measures the step's compute time for straggler detection when you
    do not send ``compute_s`` yourself. Unknown names are judged as inside a
    step (resilio warns once)."""
    if _SOCKET_PATH is None:
        return
    try:
        msg = "phase=%s" % name
        if step is not None:
            msg += " step=%d" % int(step)
        send(msg)
    except Exception:
        pass


def checkpoint_done(step):
    """Confirm that the checkpoint of ``step`` is durable (after the final
    rename or marker file, never before)."""
    global _done_step
    try:
        _done_step = int(step) if _done_step is None else max(_done_step, int(step))
        send("checkpoint_done step=%d" % int(step))
    except Exception:
        pass


def restored(step=None):
    """Say that this run loaded the checkpoint of ``step`` (before its first
    step): a recovery's ``restore`` phase ends here in ``resilio report``."""
    if _SOCKET_PATH is None:
        return
    try:
        send("restored" if step is None else "restored=%d" % int(step))
    except Exception:
        pass


def checkpoint_requested():
    """The step at which resilio asks every rank to save, or None.

    A request stays pending until ``checkpoint_done`` confirms a step at or
    after it. Cheap enough to call every step: one ``stat`` of the control
    file, and a read only when it changed."""
    global _control_key, _asked
    if _CONTROL_PATH is None:
        return None
    try:
        st = os.stat(_CONTROL_PATH)
    except Exception:
        return None if _asked is None or _is_done(_asked[1]) else _asked[1]
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    if key != _control_key:
        _control_key = key
        try:
            with open(_CONTROL_PATH, "r") as f:
                text = f.read(4096)
            fields = dict(
                part.split("=", 1) for part in text.split() if "=" in part
            )
            if text.startswith("checkpoint"):
                _asked = (int(fields.get("id", "0")), int(fields["step"]))
        except Exception:
            pass
    if _asked is None or _is_done(_asked[1]):
        return None
    return _asked[1]


def _is_done(asked_step):
    return _done_step is not None and _done_step >= asked_step


def rollback_step():
    """The step of the checkpoint to restart from after a rollback (the last
    one confirmed before the loss went bad); 0: every checkpoint is from
    after, load none and start from scratch; None: load the latest."""
    return _ROLLBACK_STEP


def skip_step(n):
    """True when step ``n``'s batch is one to skip after a rollback (from the
    first bad report to the finding, ``RESILIO_SKIP_STEPS``)."""
    try:
        return _SKIP is not None and _SKIP[0] <= int(n) <= _SKIP[1]
    except Exception:
        return False
