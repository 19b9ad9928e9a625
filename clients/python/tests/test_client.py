"""The Python client's contract, standard library only.

Run with ``python3 -m unittest discover -s clients/python/tests`` (``cargo
test`` does, in tests/agent/client.rs). The module reads RESILIO_SOCKET and
RESILIO_CONTROL at import, so each case sets the environment and reloads it.
"""

import importlib
import os
import socket
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import resilio_client  # noqa: E402


def load(socket_path=None, control_path=None):
    for key, value in (("RESILIO_SOCKET", socket_path), ("RESILIO_CONTROL", control_path)):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if resilio_client._sock is not None:
        resilio_client._sock.close()
    rc = importlib.reload(resilio_client)
    return rc


class Receiver:
    """A datagram socket standing in for resilio's."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "progress.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(2)

    def next(self):
        return self.sock.recv(65536).decode()

    def close(self):
        self.sock.close()


class Absent(unittest.TestCase):
    def test_every_call_is_a_no_op_without_resilio(self):
        rc = load()
        self.assertFalse(rc.active())
        self.assertIsNone(rc.step(1, loss=2.0, compute_s=0.1))
        self.assertIsNone(rc.phase("checkpoint"))
        self.assertIsNone(rc.checkpoint_requested())
        self.assertIsNone(rc.checkpoint_done(1))
        self.assertIsNone(rc.send("step=1"))
        # Nothing was opened.
        self.assertIsNone(rc._sock)

    def test_a_socket_path_nobody_listens_on_never_raises(self):
        with tempfile.TemporaryDirectory() as d:
            rc = load(socket_path=os.path.join(d, "gone.sock"),
                      control_path=os.path.join(d, "no-control"))
            self.assertTrue(rc.active())
            for _ in range(1000):
                rc.step(3, loss=float("nan"), compute_s="x", **{"bad key": 1, "": 2})
            rc.step("not a number")
            rc.phase("checkpoint", step="?")
            rc.checkpoint_done("?")
            self.assertIsNone(rc.checkpoint_requested())


class Present(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.rx = Receiver(self.dir.name)
        self.control = os.path.join(self.dir.name, "control")
        self.rc = load(socket_path=self.rx.path, control_path=self.control)

    def tearDown(self):
        self.rx.close()
        self.dir.cleanup()
        load()

    def test_messages_follow_the_protocol(self):
        rc = self.rc
        rc.step(120, loss=2.31, compute_s=0.41, lr=0.001, **{"bad key": 5})
        self.assertEqual(self.rx.next(), "step=120 loss=2.31 compute_s=0.41 lr=0.001")
        rc.step(121, loss=float("inf"))
        self.assertEqual(self.rx.next(), "step=121")
        rc.phase("checkpoint", 121)
        self.assertEqual(self.rx.next(), "phase=checkpoint step=121")
        rc.checkpoint_done(121)
        self.assertEqual(self.rx.next(), "checkpoint_done step=121")

    def test_a_receiver_that_stops_reading_never_blocks_the_trainer(self):
        # The receiver's queue fills up; sends are dropped, not waited on.
        for n in range(20000):
            self.rc.step(n, loss=1.0)

    def write_control(self, text):
        tmp = self.control + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.control)

    def test_a_checkpoint_request_is_pending_until_done(self):
        rc = self.rc
        self.assertIsNone(rc.checkpoint_requested())
        self.write_control("checkpoint id=1 step=40 reason=operator\n")
        self.assertEqual(rc.checkpoint_requested(), 40)
        self.assertEqual(rc.checkpoint_requested(), 40)
        rc.checkpoint_done(39)
        self.assertEqual(rc.checkpoint_requested(), 40)
        rc.checkpoint_done(40)
        self.assertIsNone(rc.checkpoint_requested())
        self.write_control("checkpoint id=2 step=90 reason=pre_timeout\n")
        self.assertEqual(rc.checkpoint_requested(), 90)

    def test_a_garbled_control_file_is_ignored(self):
        self.write_control("checkpoint id=x step=\x00\n")
        self.assertIsNone(self.rc.checkpoint_requested())
        self.write_control("\xff\xfe garbage")
        self.assertIsNone(self.rc.checkpoint_requested())


class Rollback(unittest.TestCase):
    def tearDown(self):
        for key in ("RESILIO_ROLLBACK_STEP", "RESILIO_SKIP_STEPS"):
            os.environ.pop(key, None)
        load()

    def test_no_rollback_means_the_latest_checkpoint_and_no_skipped_step(self):
        rc = load()
        self.assertIsNone(rc.rollback_step())
        self.assertFalse(any(rc.skip_step(n) for n in range(1000)))

    def test_the_rollbacks_checkpoint_and_the_steps_to_skip(self):
        os.environ["RESILIO_ROLLBACK_STEP"] = "100"
        os.environ["RESILIO_SKIP_STEPS"] = "118-121"
        rc = load()
        self.assertEqual(rc.rollback_step(), 100)
        skipped = [n for n in range(100, 200) if rc.skip_step(n)]
        self.assertEqual(skipped, [118, 119, 120, 121])
        self.assertFalse(rc.skip_step("not a step"))

    def test_malformed_values_are_ignored_and_never_raise(self):
        for at, skip in (("x", "5"), ("", "9-3"), ("-", "a-b"), ("1.5", "-4")):
            os.environ["RESILIO_ROLLBACK_STEP"] = at
            os.environ["RESILIO_SKIP_STEPS"] = skip
            rc = load()
            self.assertIsNone(rc.rollback_step(), at)
            self.assertFalse(any(rc.skip_step(n) for n in range(-10, 20)), skip)


class Callbacks(unittest.TestCase):
    """Both callbacks import without their frameworks and drive the client."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.rx = Receiver(self.dir.name)
        self.control = os.path.join(self.dir.name, "control")
        load(socket_path=self.rx.path, control_path=self.control)
        with open(self.control, "w") as f:
            f.write("checkpoint id=7 step=3 reason=operator\n")

    def tearDown(self):
        self.rx.close()
        self.dir.cleanup()
        load()

    def drain(self):
        out = []
        self.rx.sock.settimeout(0.2)
        try:
            while True:
                out.append(self.rx.next())
        except socket.timeout:
            return out

    def test_lightning_saves_at_the_requested_step(self):
        lightning = importlib.reload(importlib.import_module("resilio_client.lightning"))

        class Trainer:
            global_step = 0
            default_root_dir = self.dir.name
            saved = []

            def save_checkpoint(self, path):
                self.saved.append(path)

        t = Trainer()
        cb = lightning.ResilioCallback()
        for step in range(1, 5):
            t.global_step = step
            cb.on_train_batch_start(t, None, None, step)
            cb.on_train_batch_end(t, None, {"loss": 0.5}, None, step)
        self.assertEqual(t.saved, [os.path.join(self.dir.name, "resilio-step-3.ckpt")])
        sent = self.drain()
        self.assertIn("checkpoint_done step=3", sent)
        self.assertIn("phase=checkpoint step=3", sent)
        self.assertTrue(any(m.startswith("step=4 loss=0.5 compute_s=") for m in sent), sent)

    def test_hf_asks_the_trainer_to_save_and_confirms_on_save(self):
        hf = importlib.reload(importlib.import_module("resilio_client.hf"))

        class State:
            global_step = 0

        class Control:
            should_save = False

        cb = hf.ResilioCallback()
        state, control = State(), Control()
        for step in range(1, 4):
            state.global_step = step
            cb.on_step_begin(None, state, control)
            cb.on_log(None, state, control, logs={"loss": 1.25})
            cb.on_step_end(None, state, control)
        self.assertTrue(control.should_save)
        cb.on_save(None, state, control)
        sent = self.drain()
        self.assertIn("checkpoint_done step=3", sent)
        self.assertTrue(any(m.startswith("step=3 loss=1.25") for m in sent), sent)


if __name__ == "__main__":
    unittest.main()
